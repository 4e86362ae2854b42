//! The agent's API against the node's own tasks: an agent configured with no token makes one,
//! keeps it where only its user can read it, and requires it of every call but
//! `/v1/health`. A task of the `exec` driver (a workload user under Landlock) that tries to
//! submit a job, exec into another allocation or read its logs over the loopback API is
//! refused every time and creates nothing; a raw_exec task runs as root, reads the token, and
//! can (the README says so: raw_exec is no containment boundary).

// Real processes on the real clock: these tests start programs and wait in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::{Method, StatusCode};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use wharf_node::api::AllocSummary;
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_state::ClientStatus;

/// What a task tries against the agent at `$AGENT`, one line per attempt: read the token file
/// `$TOKEN_FILE` (`token read`, or `token refused <errno>`), then, with the token if it got
/// one, submit the job `$EVIL` as `$EVIL_ID`, exec into `$VICTIM`'s task `t`, and read its
/// logs; each line says the attempt and the HTTP status it got, then the answer.
const INTRUDER: &str = r#"
import json, os, urllib.error, urllib.request
agent, victim = os.environ["AGENT"], os.environ["VICTIM"]
token = None
try:
    with open(os.environ["TOKEN_FILE"]) as f:
        token = f.read().strip()
    print("token read", flush=True)
except OSError as e:
    print("token refused", e.errno, flush=True)

def call(name, method, path, body=None, kind="application/json"):
    request = urllib.request.Request(agent + path, method=method, data=body)
    request.add_header("Content-Type", kind)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    print(name, status, " ".join(text.split()), flush=True)

call("submit", "POST", "/v1/allocations?id=" + os.environ["EVIL_ID"], os.environ["EVIL"].encode())
command = {"task": "t", "command": ["/bin/sh", "-c", "id -u"]}
call("exec", "POST", "/v1/allocations/" + victim + "/exec", json.dumps(command).encode())
call("logs", "GET", "/v1/allocations/" + victim + "/logs/t")
"#;

/// A job spec (JSON) with one batch task of `driver` running `command` with `env`.
fn job_json(id: &str, driver: &str, command: &[&str], env: &[(&str, &str)]) -> String {
    let env: BTreeMap<&str, &str> = env.iter().copied().collect();
    let mut task = serde_json::json!({
        "name": "t",
        "driver": driver,
        "env": env,
        "config": { "command": command[0], "args": &command[1..] },
    });
    if driver == "exec" {
        task["resources"] = serde_json::json!({ "cpu": 200, "memory": 128 });
    }
    serde_json::json!({
        "job": { "id": id, "type": "batch" },
        "group": { "name": "g", "task": [task] },
    })
    .to_string()
}

/// Submits a JSON job spec as allocation `id`.
async fn submit_json(client: &Client, id: &str, spec: &str) {
    let path = ApiPath::v1(["allocations"]).query("id", id);
    client
        .call(Method::POST, path, Some(("application/json", spec.as_bytes().to_vec())))
        .await
        .unwrap();
}

/// Runs the intruder as a task of `driver`, aimed at `victim`, waits until it has ended, and
/// returns what it printed, one attempt per key: `token`, `submit`, `exec`, `logs`.
async fn intrude(
    agent: &AgentProcess,
    driver: &str,
    victim: &str,
    evil_id: &str,
) -> BTreeMap<String, String> {
    let client = agent.client();
    let token_file = wharf_node::agent_token::path(&agent.data_dir);
    let evil = job_json(evil_id, "raw_exec", &["/bin/sh", "-c", "id -u"], &[]);
    let address = format!("http://{}", agent.address.trim_start_matches("http://"));
    let env = [
        ("AGENT", address.as_str()),
        ("VICTIM", victim),
        ("TOKEN_FILE", token_file.to_str().unwrap()),
        ("EVIL", evil.as_str()),
        ("EVIL_ID", evil_id),
    ];
    let id = format!("intruder-{driver}");
    let spec = job_json(&id, driver, &["python3", "-c", INTRUDER], &env);
    submit_json(&client, &id, &spec).await;
    let done = until(&client, &id, "the intruder ended", |d| d.done).await;
    let path = ApiPath::v1(["allocations", &id, "logs", "t"]);
    let out = String::from_utf8(client.call(Method::GET, &path, None).await.unwrap().to_vec());
    let out = out.unwrap();
    let path = path.query("stream", "stderr");
    let err = client.call(Method::GET, &path, None).await.unwrap();
    assert_eq!(
        done.state.client_status,
        ClientStatus::Complete,
        "the {driver} intruder failed (is python3 installed?): {out}{}",
        String::from_utf8_lossy(&err)
    );
    out.lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(attempt, rest)| (attempt.to_owned(), rest.to_owned()))
        .collect()
}

async fn listed_ids(client: &Client) -> Vec<String> {
    let listed: Vec<AllocSummary> =
        client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    let mut ids: Vec<String> = listed.into_iter().map(|a| a.id).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_task_cannot_use_the_agent_and_a_raw_exec_task_can() {
    let dir = tempfile::tempdir().unwrap();
    // Workload users reach their directories by absolute paths.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let client = agent.client();
    let victim = submit(
        &client,
        &job("victim", "service", &sh_task("t", "echo victim-output; exec sleep 1000")),
    )
    .await
    .unwrap();
    until(&client, &victim, "running", |d| d.state.client_status == ClientStatus::Running).await;
    let log = agent.data_dir.join(format!("allocs/{victim}/t/logs/t.stdout.0"));
    eventually("the victim wrote its log", || std::fs::metadata(&log).is_ok_and(|m| m.len() > 0));

    // A workload user under Landlock: the token file is out of its reach, and without the
    // token every call is a 401.
    let contained = intrude(&agent, "exec", &victim, "evil-from-exec").await;
    let refused = |attempt: &str| contained.get(attempt).map(String::as_str).unwrap_or("");
    assert_eq!(refused("token"), "refused 13", "EACCES: {contained:?}");
    for attempt in ["submit", "exec", "logs"] {
        assert!(refused(attempt).starts_with("401 "), "{attempt}: {contained:?}");
        assert!(!refused(attempt).contains("victim-output"), "{attempt}: {contained:?}");
    }
    let mut want = vec!["intruder-exec".to_owned(), victim.clone()];
    want.sort();
    assert_eq!(listed_ids(&client).await, want, "the exec task created nothing");

    // The token is its user's alone: a regular file, mode 0600, of root (the agent's user).
    let token_file = wharf_node::agent_token::path(&agent.data_dir);
    let meta = std::fs::symlink_metadata(&token_file).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0), "{}", token_file.display());
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), agent.token);

    // A raw_exec task is root: it reads the token, and the agent does what it asks.
    let root = intrude(&agent, "raw_exec", &victim, "evil-from-raw-exec").await;
    let answer = |attempt: &str| root.get(attempt).map(String::as_str).unwrap_or("");
    assert_eq!(answer("token"), "read", "{root:?}");
    assert!(answer("submit").starts_with("201 "), "{root:?}");
    assert!(answer("exec").starts_with("200 "), "{root:?}");
    assert!(answer("exec").contains(r#""stdout":"0\n""#), "it ran as root: {root:?}");
    assert!(answer("logs").starts_with("200 victim-output"), "{root:?}");
    let evil =
        until(&client, "evil-from-raw-exec", "the job a raw_exec task submitted ran", |d| d.done)
            .await;
    assert_eq!(evil.state.client_status, ClientStatus::Complete, "{evil:?}");

    let stop = agent.cli(&["alloc", "stop", &victim, "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
}

/// Every endpoint but `/v1/health` needs the token: none is a 401, a wrong one a 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_requires_the_token_on_every_call_but_health() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let id = submit(&agent.client(), &job("j", "service", &sh_task("t", "exec sleep 1000")))
        .await
        .unwrap();
    let calls: &[(Method, String)] = &[
        (Method::GET, "/v1/allocations".into()),
        (Method::POST, "/v1/allocations".into()),
        (Method::GET, format!("/v1/allocations/{id}")),
        (Method::POST, format!("/v1/allocations/{id}/stop")),
        (Method::POST, format!("/v1/allocations/{id}/restart")),
        (Method::POST, format!("/v1/allocations/{id}/signal")),
        (Method::POST, format!("/v1/allocations/{id}/exec")),
        (Method::GET, format!("/v1/allocations/{id}/logs/t")),
        (Method::GET, format!("/v1/allocations/{id}/stats")),
        (Method::GET, "/v1/node".into()),
        (Method::GET, "/v1/services".into()),
        (Method::GET, "/v1/probe".into()),
        (Method::GET, "/v1/metrics".into()),
        (Method::GET, "/v1/var/app/db".into()),
        (Method::PUT, "/v1/var/app/db".into()),
        (Method::DELETE, "/v1/var/app/db".into()),
        (Method::GET, "/v1/vars".into()),
    ];
    for (token, status) in
        [(None, StatusCode::UNAUTHORIZED), (Some("wrong-token-wrong-token"), StatusCode::FORBIDDEN)]
    {
        let client = Client::new(&agent.address, token.map(str::to_owned));
        for (method, path) in calls {
            match client.call(method.clone(), path, None).await {
                Err(ClientError::Api { status: got, message }) => {
                    assert_eq!(got, status, "{method} {path} with {token:?}: {message}")
                }
                other => panic!("{method} {path} with {token:?}: {other:?}"),
            }
        }
        let health: serde_json::Value = client.json(Method::GET, "/v1/health", None).await.unwrap();
        assert_eq!(health["status"], "ok", "health needs no token: {health}");
    }
    let detail = until(&agent.client(), &id, "running", |d| {
        d.done || d.state.client_status == ClientStatus::Running
    })
    .await;
    assert!(!detail.done, "nothing stopped it: {detail:?}");
    let stop = agent.cli(&["alloc", "stop", &id, "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
}

/// `wharf` run with `args` as user `uid` (root if `None`), with `env` and no agent settings
/// from this process's environment.
fn wharf_as(uid: Option<u32>, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut command = Command::new(WHARF);
    command
        .args(args)
        .env_remove("WHARF_ADDR")
        .env_remove("WHARF_DATA_DIR")
        .env_remove("WHARF_TOKEN")
        .envs(env.iter().copied());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command.output().unwrap()
}

/// The token is made once and kept: the agent started again requires the same one, and the
/// CLI finds it through the data directory. A token given (flag, then environment) wins over
/// the file; a user who cannot read the file is told which file; with no token at all, what
/// to do. A configured token wins over the file, which the agent then removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_the_token_through_the_data_directory() {
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = AgentProcess::start_with_its_own_token(dir.path(), "");
    let first_token = agent.token.clone();
    let (data_dir, config) = agent.kill9();
    let agent = AgentProcess::launch(data_dir.clone(), config);
    assert_eq!(agent.token, first_token, "a later start reuses the token");
    agent.client().call(Method::GET, "/v1/allocations", None).await.unwrap();

    let data = data_dir.to_str().unwrap();
    let listed = wharf_as(None, &[], &["--data-dir", data, "alloc", "list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "[]", "{listed:?}");
    let listed = wharf_as(None, &[("WHARF_DATA_DIR", data)], &["alloc", "list", "--json"]);
    assert!(listed.status.success(), "{listed:?}");

    let stderr =
        |output: &std::process::Output| String::from_utf8_lossy(&output.stderr).into_owned();
    for (env, args, case) in [
        (&[][..], &["--token", "wrong-token-wrong-token"][..], "the flag"),
        (&[("WHARF_TOKEN", "wrong-token-wrong-token")][..], &[][..], "the environment"),
    ] {
        let args = [args, &["--data-dir", data, "alloc", "list"]].concat();
        let refused = wharf_as(None, env, &args);
        assert_eq!(refused.status.code(), Some(3), "{case}: {refused:?}");
        assert_eq!(stderr(&refused), "wharf: the token is not valid\n", "{case} wins");
    }

    let nobody = wharf_as(Some(NOBODY), &[], &["--data-dir", data, "alloc", "list"]);
    assert_eq!(nobody.status.code(), Some(3), "{nobody:?}");
    let file = wharf_node::agent_token::path(&data_dir).display().to_string();
    assert!(
        stderr(&nobody).starts_with(&format!("wharf: cannot read the agent's token {file}: ")),
        "{nobody:?}"
    );
    assert!(stderr(&nobody).contains("only the agent's user can read it"), "{nobody:?}");

    let address = agent.address.as_str();
    let none = wharf_as(None, &[], &["--address", address, "alloc", "list"]);
    assert_eq!(none.status.code(), Some(3), "{none:?}");
    assert!(stderr(&none).contains("this server requires a token"), "{none:?}");
    assert!(stderr(&none).contains("give the agent's token with --token or WHARF_TOKEN"));
    let (data_dir, config) = agent.kill9();

    // Configured, a token wins, and the file goes: no client presents the old one.
    assert!(wharf_node::agent_token::path(&data_dir).exists());
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("token = {TOKEN:?}\n{text}")).unwrap();
    let agent = AgentProcess::launch(data_dir.clone(), config);
    assert_eq!(agent.token, TOKEN);
    assert!(!wharf_node::agent_token::path(&data_dir).exists(), "the made token is gone");
    agent.client().call(Method::GET, "/v1/allocations", None).await.unwrap();
    let old = Client::new(&agent.address, Some(first_token));
    match old.call(Method::GET, "/v1/allocations", None).await {
        Err(ClientError::Api { status, .. }) => assert_eq!(status, StatusCode::FORBIDDEN),
        other => panic!("the made token after a configured one: {other:?}"),
    }
}
