//! The `wharf` command line as a new user meets it, end to end through the real binary: which
//! allocation an id names, what each failure says, and the exit code it ends with (the
//! README's table).

// Real processes on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::{Method, StatusCode};
use std::process::Output;
use wharf_node::client::{ApiPath, ClientError};
use wharf_state::ClientStatus;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A service whose task prints its allocation id, then runs until stopped.
fn named_service() -> String {
    job("named", "service", &sh_task("t", "echo \"$WHARF_ALLOC_ID\"; exec sleep 1000"))
}

/// With allocations `job-1` and `job-10`, `job-1` names the first for every command: an
/// exact id always wins over a prefix, so no id a user chose can become unreachable. A
/// prefix still works when it matches one id, but only in the CLI: the API takes exact ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_ids_win_over_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    for id in ["job-1", "job-10", "other-7"] {
        let run = cli_in(&agent.data_dir, &["run", "--detach", "-", "--id", id], &named_service());
        assert!(run.status.success(), "{id}: {run:?}");
    }
    for id in ["job-1", "job-10", "other-7"] {
        until(&client, id, "running", |d| d.state.client_status == ClientStatus::Running).await;
    }

    let status = agent.cli(&["alloc", "status", "job-1"]);
    assert!(status.status.success(), "{status:?}");
    assert!(stdout(&status).starts_with("ID       = job-1\n"), "{status:?}");
    let log = agent.data_dir.join("allocs/job-1/t/logs/t.stdout.0");
    eventually("job-1 printed its id", || std::fs::metadata(&log).is_ok_and(|m| m.len() > 0));
    let logs = agent.cli(&["alloc", "logs", "job-1", "t"]);
    assert_eq!((stdout(&logs).as_str(), logs.status.code()), ("job-1\n", Some(0)), "{logs:?}");

    // A prefix of one id names it; a prefix of several names none, and says which.
    let status = agent.cli(&["alloc", "status", "oth"]);
    assert!(stdout(&status).starts_with("ID       = other-7\n"), "{status:?}");
    let ambiguous = agent.cli(&["alloc", "stop", "job"]);
    assert_eq!(ambiguous.status.code(), Some(2), "{ambiguous:?}");
    assert!(stderr(&ambiguous).contains("2 ids start with it (job-1, job-10)"), "{ambiguous:?}");
    let unknown = agent.cli(&["alloc", "status", "nothing"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert!(stderr(&unknown).contains("no allocation \"nothing\" on this node"), "{unknown:?}");

    let stop = agent.cli(&["alloc", "stop", "job-1", "--wait", "20s"]);
    assert_eq!(stdout(&stop), "stopped job-1: complete\n", "{stop:?}");
    for id in ["job-10", "other-7"] {
        let detail = until(&client, id, "listed", |_| true).await;
        assert_eq!(detail.state.client_status, ClientStatus::Running, "{id} was not stopped");
    }

    // The API takes exact ids only.
    match client.call(Method::GET, ApiPath::v1(["allocations", "job-1"]), None).await {
        Ok(_) => {}
        other => panic!("job-1: {other:?}"),
    }
    match client.call(Method::POST, ApiPath::v1(["allocations", "oth", "stop"]), None).await {
        Err(ClientError::Api { status: StatusCode::NOT_FOUND, .. }) => {}
        other => panic!("a prefix through the API: {other:?}"),
    }
    for id in ["job-10", "other-7"] {
        let stop = agent.cli(&["alloc", "stop", id, "--wait", "20s"]);
        assert!(stop.status.success(), "{stop:?}");
    }
}

/// A program's stop names one allocation exactly: with attempt `web` gone and `web__2`
/// running, `alloc stop --exact web` stops nothing and says so, where the prefix a user may
/// type would name `web__2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_stop_never_takes_a_gone_id_for_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let run =
        cli_in(&agent.data_dir, &["run", "--detach", "-", "--id", "web__2"], &named_service());
    assert!(run.status.success(), "{run:?}");
    until(&client, "web__2", "running", |d| d.state.client_status == ClientStatus::Running).await;

    let exact = agent.cli(&["alloc", "stop", "--exact", "--wait", "1s", "web"]);
    assert_eq!(exact.status.code(), Some(2), "{exact:?}");
    assert!(stderr(&exact).contains("no allocation \"web\" on this node"), "{exact:?}");
    let detail = until(&client, "web__2", "listed", |_| true).await;
    assert_eq!(detail.state.client_status, ClientStatus::Running, "web__2 was stopped");

    let stop = agent.cli(&["alloc", "stop", "--exact", "web__2", "--wait", "20s"]);
    assert_eq!(stdout(&stop), "stopped web__2: complete\n", "{stop:?}");
}

/// `wharf` run with `args` and no agent address from the environment.
fn wharf(args: &[&str]) -> Output {
    wharf_fed(args, b"")
}

/// [`wharf`] with `stdin` on its standard input.
fn wharf_fed(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = std::process::Command::new(WHARF)
        .args(args)
        .env_remove("WHARF_ADDR")
        .env_remove("WHARF_DATA_DIR")
        .env_remove("WHARF_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Every API error is JSON with an `error` text, whatever went wrong: a query parameter the
/// endpoint does not know or cannot read, a path or method the API does not have, a path
/// segment that is not UTF-8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_error_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let run = cli_in(&agent.data_dir, &["run", "--detach", "-", "--id", "e1"], &named_service());
    assert!(run.status.success(), "{run:?}");
    let cases: &[(&str, &str, u16, &str)] = &[
        ("GET", "/v1/allocations/e1/logs/t?bogus=1", 400, "unknown field `bogus`"),
        ("GET", "/v1/allocations/e1/logs/t?tail=many", 400, "tail"),
        ("GET", "/v1/allocations/e1?colour=red", 400, "unknown field `colour`"),
        ("GET", "/v1/allocations/e1?wait=soon", 400, "wait: invalid duration \"soon\""),
        ("POST", "/v1/allocations?bogus=1", 400, "unknown field `bogus`"),
        ("DELETE", "/v1/allocations", 405, "DELETE is not a method this path takes"),
        ("GET", "/v1/allocations/e1/stop", 405, "GET is not a method this path takes"),
        ("GET", "/v1/nothing", 404, "no such endpoint"),
        ("GET", "/v1/allocations/%FF", 400, "UTF-8"),
        ("GET", "/v1/allocations/e", 404, "no allocation \"e\" on this node"),
    ];
    for (method, target, status, phrase) in cases {
        let answer = raw_request(&agent.address, method, target);
        assert_eq!(answer.status, *status, "{method} {target}: {answer:?}");
        assert_eq!(answer.content_type, "application/json", "{method} {target}: {answer:?}");
        let body: serde_json::Value = serde_json::from_str(&answer.body)
            .unwrap_or_else(|e| panic!("{method} {target}: {e}: {answer:?}"));
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(phrase), "{method} {target}: {error:?} lacks {phrase:?}");
    }
    let stop = agent.cli(&["alloc", "stop", "e1", "--wait", "20s"]);
    assert!(stop.status.success(), "{stop:?}");
}

/// A data directory where no agent announced itself, a damaged announcement, an address where
/// nothing answers: each is said once, plainly, with what to do. An empty WHARF_ADDR is no
/// address.
#[test]
fn no_agent_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let list = wharf(&["--data-dir", &data, "alloc", "list"]);
    assert_eq!(list.status.code(), Some(3), "{list:?}");
    assert_eq!(
        stderr(&list),
        format!(
            "wharf: no wharf agent has announced its address in {data}: there is no \
             {data}/agent.json; start one with `wharf agent --data-dir {data}`, or give the \
             address with --address\n"
        )
    );
    // An empty variable counts as unset.
    let empty = std::process::Command::new(WHARF)
        .args(["--data-dir", &data, "alloc", "list"])
        .env("WHARF_ADDR", "")
        .env("WHARF_TOKEN", "")
        .output()
        .unwrap();
    assert_eq!(stderr(&empty), stderr(&list), "{empty:?}");
    std::fs::write(dir.path().join("agent.json"), "{").unwrap();
    let damaged = wharf(&["--data-dir", &data, "alloc", "status", "x"]);
    assert_eq!(damaged.status.code(), Some(3), "{damaged:?}");
    assert!(
        stderr(&damaged).starts_with(&format!(
            "wharf: no wharf agent has announced its address in {data}: {data}/agent.json is \
             not an agent file: "
        )),
        "{damaged:?}"
    );
    let refused = wharf(&["--address", "127.0.0.1:9", "alloc", "list"]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let text = stderr(&refused);
    assert!(text.starts_with("wharf: no wharf agent answers at http://127.0.0.1:9 ("), "{text}");
    assert!(text.ends_with("; start one with `wharf agent`\n"), "{text}");
    assert_eq!(text.matches("refused").count(), 1, "said once: {text}");
}

/// A damaged store stops the agent with one message that names the file and the flag that
/// moves it aside; with that flag, the agent starts empty and keeps the damaged file.
#[test]
fn a_damaged_store_names_the_file_and_the_way_out_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let store = data.join("state.redb");
    std::fs::write(&store, "this is not a database\n").unwrap();
    let data_arg = data.display().to_string();
    let refused = wharf(&["--data-dir", &data_arg, "agent", "--address", "127.0.0.1:0"]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let text = stderr(&refused);
    let message: Vec<&str> = text.lines().filter(|l| l.starts_with("wharf: ")).collect();
    assert_eq!(message.len(), 1, "{text}");
    let message = message[0];
    assert!(
        message.starts_with(&format!("wharf: the state store {} is damaged (", store.display()))
    );
    assert_eq!(message.matches(&store.display().to_string()).count(), 1, "{message}");
    assert_eq!(message.matches("is damaged").count(), 1, "{message}");
    assert!(message.contains("start the agent again with --reset-state to move it aside"));
    assert_eq!(std::fs::read(&store).unwrap(), b"this is not a database\n", "left as it was");

    shim_beside_wharf();
    let (mut child, _) = wharf_tests::announce::spawn_announcing(
        std::process::Command::new(WHARF).args([
            "--data-dir",
            &data_arg,
            "agent",
            "--address",
            "127.0.0.1:0",
            "--reset-state",
        ]),
        "agent ready",
        LIMIT,
        None,
    )
    .unwrap();
    let aside: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("state.redb.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(data.join(&aside[0])).unwrap(), b"this is not a database\n");
    assert!(wharf_tests::announce::terminate(&mut child, LIMIT).unwrap().success());
}

/// Exit codes, command by command, as the README's table says: 2 for what the user got
/// wrong (a spec file missing, unreadable or not UTF-8, named with the line and column of the
/// bad bytes; a bad flag; an id that names nothing), 3 for an agent that cannot be reached or
/// refuses, 1 for what was done but did not end as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_mean_what_the_readme_says() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml").display().to_string();
    let not_utf8 = dir.path().join("latin1.toml");
    std::fs::write(&not_utf8, b"[job]\nid = \"caf\xe9\"\n").unwrap();
    let not_utf8 = not_utf8.display().to_string();
    let a_dir = dir.path().display().to_string();
    let nowhere = ["--address", "127.0.0.1:9"];
    let cases: Vec<(Vec<&str>, u8, String)> = vec![
        (vec!["validate", &missing], 2, format!("cannot read the job spec {missing}: ")),
        (vec!["validate", &a_dir], 2, format!("cannot read the job spec {a_dir}: ")),
        (
            vec!["validate", &not_utf8],
            2,
            format!("the job spec {not_utf8} is not UTF-8 text: bad bytes at line 2, column 10"),
        ),
        ([&nowhere[..], &["run", &missing]].concat(), 2, format!("{missing}: ")),
        ([&nowhere[..], &["run", &not_utf8, "--detach"]].concat(), 2, "line 2".into()),
        ([&nowhere[..], &["fleet", "submit", &missing]].concat(), 2, missing.clone()),
        (vec!["alloc", "frobnicate"], 2, "unrecognized subcommand".into()),
        (vec!["agent", "--config", &missing], 2, format!("cannot read {missing}")),
        (vec!["agent", "--address", "nowhere"], 2, "--address: the agent cannot listen".into()),
        ([&nowhere[..], &["alloc", "list"]].concat(), 3, "no wharf agent answers".into()),
    ];
    for (args, code, phrase) in &cases {
        let output = wharf(args);
        assert_eq!(output.status.code(), Some(i32::from(*code)), "{args:?}: {output:?}");
        assert!(stderr(&output).contains(phrase.as_str()), "{args:?}: {phrase:?} in {output:?}");
    }
    let piped = wharf_fed(&[&nowhere[..], &["run", "--detach", "-"]].concat(), b"[job]\xff\n");
    assert_eq!(piped.status.code(), Some(2), "{piped:?}");
    assert!(
        stderr(&piped).contains(
            "the job spec standard input is not UTF-8 text: bad bytes at line 1, column 6"
        ),
        "{piped:?}"
    );

    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let stubborn = job(
        "stubborn",
        "service",
        &format!(
            "{}kill_timeout = \"5s\"\nkill_signal = \"SIGTERM\"\n",
            sh_task("t", "trap '' TERM; echo up; while true; do sleep 0.1; done")
        ),
    );
    let run = cli_in(&agent.data_dir, &["run", "--detach", "-", "--id", "stubborn"], &stubborn);
    assert!(run.status.success(), "{run:?}");
    until(&client, "stubborn", "running", |d| d.state.client_status == ClientStatus::Running).await;
    let log = agent.data_dir.join("allocs/stubborn/t/logs/t.stdout.0");
    eventually("the trap is set", || std::fs::metadata(&log).is_ok_and(|m| m.len() > 0));
    let with_token = |args: &[&str], token: &str| {
        std::process::Command::new(WHARF)
            .args(["--address", &agent.address, "--token", token])
            .args(args)
            .output()
            .unwrap()
    };
    let cases: Vec<(Vec<&str>, &str, u8, &str)> = vec![
        (vec!["alloc", "list"], "wrong-token-wrong-token", 3, "the token is not valid"),
        (vec!["alloc", "status", "nothing"], TOKEN, 2, "no allocation \"nothing\""),
        (vec!["alloc", "logs", "stubborn", "nope"], TOKEN, 2, "has no task \"nope\""),
        (vec!["alloc", "signal", "stubborn", "SIGNOPE"], TOKEN, 2, "signal"),
        (vec!["alloc", "stop", "stubborn", "--wait", "soon"], TOKEN, 2, "invalid duration"),
        (vec!["alloc", "exec", "stubborn", "t", "--", "/bin/true"], TOKEN, 0, ""),
        (
            vec!["alloc", "exec", "stubborn", "t", "--", "/bin/sh", "-c", "exit 4"],
            TOKEN,
            1,
            "the command exited with code 4",
        ),
        // SIGTERM is ignored: it stops only at its 5s kill timeout.
        (
            vec!["alloc", "stop", "stubborn", "--wait", "100ms"],
            TOKEN,
            1,
            "stubborn is still stopping after 100ms",
        ),
    ];
    for (args, token, code, phrase) in &cases {
        let output = with_token(args, token);
        assert_eq!(output.status.code(), Some(i32::from(*code)), "{args:?}: {output:?}");
        assert!(stderr(&output).contains(phrase), "{args:?}: {phrase:?} in {output:?}");
    }
    let detail = until(&client, "stubborn", "stopped", |d| d.done).await;
    assert_eq!(detail.state.client_status, ClientStatus::Complete);
}

/// `wharf agent --address` sets where it listens, over `bind` in its file and over
/// WHARF_ADDR; WHARF_ADDR over the file; and `wharf agent --help` says so.
#[test]
fn agent_address_flag_environment_and_file() {
    shim_beside_wharf();
    let dir = tempfile::tempdir().unwrap();
    // A port that is taken: the agent fails if it still listens where the file says.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!("data_dir = {:?}\nbind = \"{taken}\"\n", dir.path().join("data").display()),
    )
    .unwrap();
    let config = config.display().to_string();
    let start = |env: Option<&str>, args: &[&str]| {
        let mut command = std::process::Command::new(WHARF);
        command.args(["agent", "--config", &config]).args(args).env_remove("WHARF_ADDR");
        if let Some(address) = env {
            command.env("WHARF_ADDR", address);
        }
        wharf_tests::announce::spawn_announcing(&mut command, "agent ready", LIMIT, None)
    };
    // Port 0 everywhere but the file: the agent listens on a port the system picks, unless
    // the file's taken address wins.
    let cases: &[(Option<&str>, &[&str], &str)] = &[
        (None, &["--address", "127.0.0.1:0"], "the flag"),
        (None, &["--address", "http://127.0.0.1:0/"], "the flag as a URL"),
        (Some("127.0.0.1:0"), &[], "the environment"),
        (Some(&taken.to_string()), &["--address", "127.0.0.1:0"], "the flag over the environment"),
    ];
    for (env, args, case) in cases {
        let (mut child, address) = start(*env, args).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(address.starts_with("127.0.0.1:"), "{case}: {address}");
        assert_ne!(address, taken.to_string(), "{case}");
        assert!(wharf_tests::announce::terminate(&mut child, LIMIT).unwrap().success());
    }
    let from_file = start(None, &[]).map(|(mut child, _)| {
        let _ = wharf_tests::announce::terminate(&mut child, LIMIT);
    });
    let refused = from_file.expect_err("the file's address is taken");
    assert!(refused.contains(&format!("cannot listen on {taken}")), "{refused}");

    let help = wharf(&["agent", "--help"]);
    let help = stdout(&help);
    for phrase in [
        "a flag overrides its environment variable",
        "which overrides the --config file, which overrides the defaults",
        "where `agent` listens",
    ] {
        assert!(help.replace('\n', " ").contains(phrase), "{phrase:?} in {help}");
    }
}

/// A task that swaps its log files for links (to a file it wants the agent to read for it),
/// or plants a FIFO among them, gets a clear refusal from the API and from `wharf alloc
/// logs`, never the file's content and never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_files_are_read_without_following_links() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "top secret\n").unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    // (allocation, what its task plants, whether it is on stderr, the file, what it is)
    let plants = [
        ("stderr-link", "ln -sf \"$SECRET\" t.stderr.0", true, "t.stderr.0", "a symbolic link"),
        ("older-link", "ln -s \"$SECRET\" t.stdout.1", false, "t.stdout.1", "a symbolic link"),
        ("fifo", "mkfifo t.stdout.1", false, "t.stdout.1", "a FIFO"),
    ];
    for (id, plant, ..) in &plants {
        let script = format!(
            "echo out; echo err >&2; cd \"$WHARF_TASK_DIR/logs\" && {plant} && \
             touch \"$WHARF_TASK_DIR/planted\"; exec sleep 1000"
        );
        let task = format!("{}env = {{ SECRET = {:?} }}\n", sh_task("t", &script), secret);
        let spec = job(id, "service", &task);
        let run = cli_in(&agent.data_dir, &["run", "--detach", "-", "--id", id], &spec);
        assert!(run.status.success(), "{id}: {run:?}");
    }
    for (id, _, on_stderr, file, what) in &plants {
        let planted = agent.data_dir.join(format!("allocs/{id}/t/planted"));
        eventually("the task planted its file", || planted.exists());
        let mut args = vec!["alloc", "logs", id, "t"];
        if *on_stderr {
            args.push("--stderr");
        }
        let want = format!(
            "refusing to read {file} in the log directory of task \"t\": it is {what}; a task's \
             log files must be regular files in its log directory"
        );
        for follow in [false, true] {
            let mut args = args.clone();
            if follow {
                args.push("--follow");
            }
            let logs = agent.cli_within(&args);
            assert_eq!(logs.status.code(), Some(3), "{args:?}: {logs:?}");
            assert_eq!(stdout(&logs), "", "{args:?}: nothing is printed");
            assert_eq!(stderr(&logs), format!("wharf: {want}\n"), "{args:?}");
        }
        let stream = if *on_stderr { "stderr" } else { "stdout" };
        let path = ApiPath::v1(["allocations", id, "logs", "t"]).query("stream", stream);
        match client.call(Method::GET, path, None).await {
            Err(ClientError::Api { status: StatusCode::FORBIDDEN, message }) => {
                assert_eq!(message, want)
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    // The streams left alone still read.
    let logs = agent.cli(&["alloc", "logs", "stderr-link", "t"]);
    assert_eq!((stdout(&logs).as_str(), logs.status.code()), ("out\n", Some(0)), "{logs:?}");
    for (id, ..) in &plants {
        let stop = agent.cli(&["alloc", "stop", id, "--wait", "20s"]);
        assert!(stop.status.success(), "{stop:?}");
    }
}

/// A job id that could name a path is refused by `wharf validate`, by `wharf run` and by the
/// API, with the field named; nothing is started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_ids_that_could_name_a_path_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    for id in ["../../escape-job", "a/b", "..", "tab\there"] {
        let spec = job(id, "batch", &sh_task("t", "true")).replace("\t", "\\t");
        let file = dir.path().join("job.toml");
        std::fs::write(&file, &spec).unwrap();
        let validate = wharf(&["validate", file.to_str().unwrap()]);
        assert_eq!(validate.status.code(), Some(2), "{id:?}: {validate:?}");
        assert!(stderr(&validate).contains("job.id: "), "{id:?}: {validate:?}");
        let run = cli_in(&agent.data_dir, &["run", "--detach", "-"], &spec);
        assert_eq!(run.status.code(), Some(2), "{id:?}: {run:?}");
        assert!(stderr(&run).contains("job.id: "), "{id:?}: {run:?}");
        let submitted = client
            .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into_bytes())))
            .await;
        match submitted {
            Err(ClientError::Api { status: StatusCode::UNPROCESSABLE_ENTITY, message }) => {
                assert!(message.contains("job.id: "), "{id:?}: {message}")
            }
            other => panic!("{id:?}: {other:?}"),
        }
    }
    let listed = agent.cli(&["alloc", "list", "--json"]);
    assert_eq!(stdout(&listed).trim(), "[]", "nothing was started");
}

/// Durations in what people read are written as they would write them ("1.039s", "1m0s"),
/// each one the same text the spec parser reads back: here the restart delay and the policy's
/// interval in `wharf run`'s events.
#[test]
fn durations_read_as_people_write_them() {
    shim_beside_wharf();
    let dir = tempfile::tempdir().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let data = dir.path().join("data").display().to_string();
    let failing = examples.join("failing.toml").display().to_string();
    let run = wharf(&["--address", "127.0.0.1:9", "--data-dir", &data, "run", &failing]);
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    let text = stdout(&run);
    let delays: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split("; restarting in ").nth(1))
        .map(str::trim_end)
        .collect();
    assert_eq!(delays.len(), 2, "{text}");
    for delay in delays {
        let parsed = wharf_state::duration::parse(delay).unwrap();
        assert_eq!(wharf_state::duration::format(parsed), delay, "written as parsed");
        let (whole, fraction) = delay.trim_end_matches('s').split_once('.').unwrap_or((delay, ""));
        assert!(whole == "1" || delay == "1s", "1s plus jitter of at most 25%: {delay}");
        assert!(fraction.len() <= 3, "to the millisecond, as the timer keeps it: {delay}");
    }
    assert!(text.contains("Exceeded allowed attempts 2 in interval 1m0s"), "{text}");
    // The embedded agent ran in --data-dir, not in the current directory.
    assert!(dir.path().join("data/state.redb").exists());
}
