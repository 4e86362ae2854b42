//! What the end-to-end tests of the `wharf` binary share: an agent process with its own data
//! dir and port, the CLI run against it, job specs, and bounded waits.

// Real processes on the real clock: these helpers start programs and wait in real time.
#![allow(clippy::disallowed_methods)]
// Each test binary uses its own part of this module.
#![allow(dead_code, unreachable_pub)]

use hyper::Method;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use wharf_node::api::AllocDetail;
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_tests::announce::spawn_announcing;
use wharf_tests::proc_stat::ProcStat;

pub const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait in these tests; reaching it means something hung.
pub const LIMIT: Duration = Duration::from_secs(30);
/// The token agents started with [`AgentProcess::start`] are configured with.
pub const TOKEN: &str = "e2e-secret-token-0123456789";

/// An agent process with its own data dir. Dropped, it takes its tasks with it (`wharf wipe`),
/// so that no test leaves processes, ports or cgroups to the next; [`AgentProcess::kill9`] and
/// [`AgentProcess::terminate`] leave the tasks running for an agent started again on the dir.
pub struct AgentProcess {
    pub child: Child,
    pub address: String,
    pub data_dir: PathBuf,
    pub config: PathBuf,
    /// The token its API requires: [`TOKEN`], or the one it made and keeps in its data dir.
    pub token: String,
    keep_tasks: bool,
}

impl AgentProcess {
    /// An agent configured with [`TOKEN`].
    pub fn start(dir: &Path, extra_config: &str) -> AgentProcess {
        let (data_dir, config) = write_config(dir, &format!("token = {TOKEN:?}\n{extra_config}"));
        AgentProcess::launch(data_dir, config)
    }

    /// An agent configured with no token: it makes its own and keeps it in its data dir.
    pub fn start_with_its_own_token(dir: &Path, extra_config: &str) -> AgentProcess {
        let (data_dir, config) = write_config(dir, extra_config);
        AgentProcess::launch(data_dir, config)
    }

    pub fn launch(data_dir: PathBuf, config: PathBuf) -> AgentProcess {
        AgentProcess::launch_with(data_dir, config, None, None)
    }

    /// [`AgentProcess::start`] for an agent that runs as the user and group `uid` (which
    /// needs `dir` to be its own), with its log written to `log`.
    pub fn start_as(dir: &Path, extra_config: &str, uid: u32, log: &Path) -> AgentProcess {
        let (data_dir, config) = write_config(dir, &format!("token = {TOKEN:?}\n{extra_config}"));
        AgentProcess::launch_with(data_dir, config, Some(uid), Some(log))
    }

    fn launch_with(
        data_dir: PathBuf,
        config: PathBuf,
        uid: Option<u32>,
        log: Option<&Path>,
    ) -> AgentProcess {
        use std::os::unix::process::CommandExt;
        shim_beside_wharf();
        let mut command = Command::new(WHARF);
        command.args(["agent", "--config", config.to_str().unwrap()]);
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let (child, address) = spawn_announcing(&mut command, "agent ready", LIMIT, log).unwrap();
        // An agent keeps a token file only when it is configured with none.
        let token = wharf_node::agent_token::read(&data_dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| TOKEN.to_owned());
        AgentProcess { child, address, data_dir, config, token, keep_tasks: false }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.address, Some(self.token.clone()))
    }

    pub fn kill9(mut self) -> (PathBuf, PathBuf) {
        self.keep_tasks = true;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        (self.data_dir.clone(), self.config.clone())
    }

    /// Stops the agent with SIGTERM, which leaves its tasks running; they are wiped when this
    /// value is dropped, after the test has looked at what the agent left.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        wharf_tests::announce::terminate(&mut self.child, LIMIT).unwrap()
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(WHARF)
            .args(["--address", &self.address, "--token", &self.token])
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs `wharf` with `args` against this agent, and gives up (failing the test) after
    /// [`LIMIT`]: for commands that would hang if the agent did.
    pub fn cli_within(&self, args: &[&str]) -> std::process::Output {
        let mut child = Command::new(WHARF)
            .args(["--address", &self.address, "--token", &self.token])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + LIMIT;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("wharf {args:?} hung: {:?}", child.wait_with_output());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().unwrap()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.keep_tasks && self.data_dir.exists() {
            let _ = Command::new(WHARF).arg("wipe").arg("--data-dir").arg(&self.data_dir).output();
        }
    }
}

/// Writes an agent's config in `dir`, its data directory `dir/data`; returns both paths.
fn write_config(dir: &Path, extra_config: &str) -> (PathBuf, PathBuf) {
    let data_dir = dir.join("data");
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nbind = \"127.0.0.1:0\"\n{extra_config}",
            data_dir.display().to_string()
        ),
    )
    .unwrap();
    (data_dir, config)
}

/// raw_exec starts tasks under `wharf-shim`, which wharf-exec builds beside `wharf`.
pub fn shim_beside_wharf() {
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(
        shim.exists(),
        "{} is missing: build the whole workspace (`cargo build`, or `cargo test --workspace`) so wharf-exec's shim sits beside wharf",
        shim.display()
    );
}

/// Polls `check` until it holds, within the bound.
pub fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + LIMIT;
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub async fn submit(client: &Client, spec: &str) -> Result<String, ClientError> {
    let bytes = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.as_bytes().to_vec())))
        .await?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    Ok(value["id"].as_str().unwrap().to_owned())
}

/// Waits (with the API's blocking query) until the allocation's state satisfies `done`.
pub async fn until(
    client: &Client,
    id: &str,
    what: &str,
    done: impl Fn(&AllocDetail) -> bool,
) -> AllocDetail {
    // The last state seen, for the message of a wait that times out.
    let last = std::sync::Mutex::new(None);
    let wait = async {
        let mut version = String::new();
        loop {
            let path =
                ApiPath::v1(["allocations", id]).query("after", &version).query("wait", "5s");
            let detail: AllocDetail = client.json(Method::GET, path, None).await.unwrap();
            if done(&detail) {
                return detail;
            }
            version = detail.version.clone();
            *last.lock().unwrap() = Some(detail);
        }
    };
    match tokio::time::timeout(LIMIT, wait).await {
        Ok(detail) => detail,
        Err(_) => {
            panic!("never {what}; last seen: {:?}", last.lock().unwrap().as_ref().map(|d| &d.state))
        }
    }
}

pub fn job(id: &str, kind: &str, tasks: &str) -> String {
    format!("[job]\nid = \"{id}\"\ntype = \"{kind}\"\n[group]\nname = \"g\"\n{tasks}")
}

pub fn sh_task(name: &str, script: &str) -> String {
    format!(
        "[[group.task]]\nname = \"{name}\"\ndriver = \"raw_exec\"\nconfig = {{ command = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

pub fn alive(pid: i32) -> bool {
    // A zombie is not alive for our purposes.
    ProcStat::of(pid).is_some_and(|stat| !stat.is_dead())
}

/// Waits (within the bound) until `path` holds a whole pid line, as a task's `echo $$ > pid`
/// writes it, and returns the pid. Reading as soon as the file exists races the shell's write.
pub fn read_pid(path: &Path) -> i32 {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never held a pid: {text:?}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs the CLI with `stdin`, reaching the agent through its data directory.
pub fn cli_in(data_dir: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(WHARF)
        .args(["--token", TOKEN])
        .args(args)
        .env("WHARF_DATA_DIR", data_dir)
        .env_remove("WHARF_ADDR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// An answer as it came over the wire.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// Sends `method target` (the path and query exactly as given, nothing encoded) to the agent at
/// `address` with the test token, and reads the whole answer: for what a typed client would
/// never send.
pub fn raw_request(address: &str, method: &str, target: &str) -> RawAnswer {
    use std::io::{Read, Write};
    let address = address.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_owned))
        .unwrap_or_default();
    RawAnswer { status, content_type, body: body.to_owned() }
}
