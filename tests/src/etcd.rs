//! A real etcd server for the fleet's tests: Debian's `etcd-server` (`/usr/bin/etcd`, or the
//! `etcd` on `PATH`), started on 127.0.0.1 at free ports with a data directory of its own, and
//! killed when dropped. Without etcd, [`Etcd::start`] fails with what to install.

// This fixture's job is to start and stop a program, and to wait (bounded) for it.
#![allow(clippy::disallowed_methods)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// A running etcd with one member.
#[derive(Debug)]
pub struct Etcd {
    child: Child,
    client_port: u16,
    dir: tempfile::TempDir,
}

/// Where the etcd binary is, or what to install.
pub fn binary() -> Result<PathBuf, String> {
    let installed = PathBuf::from("/usr/bin/etcd");
    if installed.exists() {
        return Ok(installed);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|path| path.exists())
        .ok_or_else(|| {
            "etcd is not installed: `apt-get install etcd-server` (the fleet's etcd tests run a \
             real etcd on 127.0.0.1)"
                .to_owned()
        })
}

/// A port nobody listens on now, on 127.0.0.1.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

impl Etcd {
    /// Starts etcd and waits at most `limit` until it accepts clients.
    pub fn start(limit: Duration) -> Result<Etcd, String> {
        let etcd = binary()?;
        let dir = tempfile::tempdir().map_err(|e| format!("no scratch directory: {e}"))?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).map_err(|e| e.to_string())?;
        let child = Command::new(&etcd)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", etcd.display()))?;
        let mut etcd = Etcd { child, client_port, dir };
        let deadline = Instant::now() + limit;
        loop {
            if TcpStream::connect(("127.0.0.1", client_port)).is_ok() {
                return Ok(etcd);
            }
            if let Ok(Some(status)) = etcd.child.try_wait() {
                return Err(format!("etcd exited with {status}: {}", etcd.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("etcd did not listen within {limit:?}: {}", etcd.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its client endpoint, `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Calls etcd's v3 JSON gateway directly, as an operator's tool would (not through the
    /// store under test): posts `body` to `path` (`/v3/kv/put`, ...) and returns the answer.
    pub fn call(&self, path: &str, body: &serde_json::Value) -> Result<serde_json::Value, String> {
        let body = body.to_string();
        let mut stream = TcpStream::connect(("127.0.0.1", self.client_port))
            .map_err(|e| format!("cannot reach etcd: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|e| format!("etcd's answer: {e}"))?;
        let (head, content) =
            answer.split_once("\r\n\r\n").ok_or_else(|| format!("not HTTP: {answer}"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{path}: {head}: {content}"));
        }
        // A streamed answer may come chunked: the JSON is the one line that starts with `{`.
        let json = content.lines().find(|l| l.starts_with('{')).unwrap_or(content);
        serde_json::from_str(json).map_err(|e| format!("{path}: {e}: {content}"))
    }

    /// Stores `value` at `key`, bypassing every store.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let body = serde_json::json!({ "key": BASE64.encode(key), "value": BASE64.encode(value) });
        self.call("/v3/kv/put", &body).map(drop)
    }

    /// Deletes `key`, bypassing every store.
    pub fn delete(&self, key: &[u8]) -> Result<(), String> {
        self.call("/v3/kv/deleterange", &serde_json::json!({ "key": BASE64.encode(key) })).map(drop)
    }

    /// Every key that starts with `prefix`, with its value.
    pub fn list(&self, prefix: &str) -> Result<Vec<KeyValue>, String> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().ok_or("an empty prefix")? += 1;
        let body =
            serde_json::json!({ "key": BASE64.encode(prefix), "range_end": BASE64.encode(end) });
        let answer = self.call("/v3/kv/range", &body)?;
        let decode = |v: &serde_json::Value| {
            BASE64.decode(v.as_str().unwrap_or_default()).map_err(|e| e.to_string())
        };
        answer["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter().map(|kv| Ok((decode(&kv["key"])?, decode(&kv["value"])?))).collect()
            })
            .unwrap_or(Ok(Vec::new()))
    }

    /// The lease `key` is on (a decimal string, as etcd writes ids), if it exists and has one.
    pub fn lease_of(&self, key: &str) -> Result<Option<String>, String> {
        let answer =
            self.call("/v3/kv/range", &serde_json::json!({ "key": BASE64.encode(key) }))?;
        Ok(answer["kvs"][0]["lease"].as_str().map(str::to_owned))
    }

    /// Ends lease `id` (a decimal string, as etcd writes ids) and deletes every key on it.
    pub fn revoke(&self, id: &str) -> Result<(), String> {
        self.call("/v3/lease/revoke", &serde_json::json!({ "ID": id })).map(drop)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
