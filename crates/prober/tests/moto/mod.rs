//! A real `moto_server` (EC2's Query API, offline) on 127.0.0.1, and a fault-injecting proxy in
//! front of it that answers chosen calls with EC2's XML error body and records every call.
//!
//! moto is found at `$WHARF_MOTO_SERVER`, or in the venv `.ci/run` makes under
//! `target/moto`; without it, [`Moto::start`] fails saying how to install it.

// This fixture's job is to start and stop a program, and to wait (bounded) for it.
#![allow(clippy::disallowed_methods, dead_code, unreachable_pub)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The moto release `.ci/run` installs.
pub const MOTO_PIN: &str = "moto[server,ec2]==5.1.18";

/// Where moto_server is, or how to install it.
pub fn moto_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("WHARF_MOTO_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or(root.join("target"));
    let venv = target.join("moto/bin/moto_server");
    if venv.exists() {
        return Ok(venv);
    }
    Err(format!(
        "moto_server is not installed at {}: run `python3 -m venv target/moto && \
         target/moto/bin/pip install '{MOTO_PIN}'` (as .ci/run does; Debian needs python3-venv), \
         or point WHARF_MOTO_SERVER at a moto_server",
        venv.display()
    ))
}

/// A running moto_server, killed when dropped.
#[derive(Debug)]
pub struct Moto {
    child: Option<Child>,
    pub port: u16,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
    listener.local_addr().unwrap().port()
}

impl Moto {
    /// The moto_server of this test process, started on first use (waiting at most 30 s until
    /// it answers) and shared by its tests, each of which keeps to instances of its own tags.
    /// It dies with the process: the kernel kills it when the thread that started it, which
    /// lives as long as the process, ends.
    pub fn shared() -> &'static Moto {
        static SHARED: std::sync::OnceLock<Moto> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let (started, port) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let moto = Moto::start();
                let _ = started.send(moto.port);
                // Keeps moto (and its parent-death signal) alive until the process exits.
                loop {
                    std::thread::park();
                }
            });
            let port = port.recv().expect("moto_server did not start (see the panic above)");
            Moto { child: None, port }
        })
    }

    fn start() -> Moto {
        use std::os::unix::process::CommandExt as _;
        let binary = moto_server().unwrap_or_else(|problem| panic!("{problem}"));
        let port = free_port();
        let mut command = Command::new(&binary);
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child =
            command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut moto = Moto { child: Some(child), port };
        let started = Instant::now();
        loop {
            if raw_call(port, "DescribeRegions", &[]).is_ok() {
                return moto;
            }
            if let Some(Ok(Some(status))) = moto.child.as_mut().map(Child::try_wait) {
                panic!("moto_server exited at start: {status}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "moto_server did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Calls `action` directly (unsigned: moto does not check signatures) and returns the
    /// answer's body; panics on an HTTP error.
    pub fn call(&self, action: &str, params: &[(&str, &str)]) -> String {
        raw_call(self.port, action, params).unwrap_or_else(|e| panic!("{action}: {e}"))
    }

    /// A VPC and a subnet of `cidr` in it (`10.231.0.0/16` and the subnet's range); the
    /// subnet's id.
    pub fn subnet(&self, vpc_cidr: &str, cidr: &str) -> String {
        let vpc = self.call("CreateVpc", &[("CidrBlock", vpc_cidr)]);
        let vpc_id = between(&vpc, "<vpcId>", "</vpcId>");
        let subnet = self.call("CreateSubnet", &[("VpcId", &vpc_id), ("CidrBlock", cidr)]);
        between(&subnet, "<subnetId>", "</subnetId>")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The text between the first `start` and the `end` after it.
pub fn between(text: &str, start: &str, end: &str) -> String {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start} in {text}")) + start.len();
    let to = text[from..].find(end).unwrap_or_else(|| panic!("no {end} in {text}")) + from;
    text[from..to].to_owned()
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A form body's parameters, decoded.
pub fn form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn raw_call(port: u16, action: &str, params: &[(&str, &str)]) -> Result<String, String> {
    let mut body = format!("Action={action}&Version=2016-11-15");
    for (k, v) in params {
        body.push_str(&format!("&{}={}", encode(k), encode(v)));
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=AKIDTEST/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let status = answer.split_whitespace().nth(1).unwrap_or("?").to_owned();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    if status != "200" {
        return Err(format!("HTTP {status}: {body}"));
    }
    Ok(body)
}

/// A fault to answer with: EC2's error body for calls of `action` (and, if set, into `subnet`),
/// `times` times (`None`: every time).
#[derive(Debug, Clone)]
pub struct Fault {
    pub action: String,
    pub subnet: Option<String>,
    pub instance_type: Option<String>,
    pub times: Option<usize>,
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl Fault {
    pub fn new(action: &str, code: &str, message: &str) -> Fault {
        Fault {
            action: action.into(),
            subnet: None,
            instance_type: None,
            times: None,
            status: if code == "RequestLimitExceeded" || code == "Throttling" { 503 } else { 400 },
            code: code.into(),
            message: message.into(),
        }
    }

    pub fn in_subnet(mut self, subnet: &str) -> Fault {
        self.subnet = Some(subnet.into());
        self
    }

    pub fn for_type(mut self, provider_type: &str) -> Fault {
        self.instance_type = Some(provider_type.into());
        self
    }

    pub fn times(mut self, n: usize) -> Fault {
        self.times = Some(n);
        self
    }
}

/// One call the proxy saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub action: String,
    pub params: Vec<(String, String)>,
    /// The error code it was answered with, if a fault.
    pub fault: Option<String>,
    /// moto's answer, if forwarded.
    pub answer: String,
    pub at: tokio::time::Instant,
}

impl Seen {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// The fault-injecting proxy in front of moto.
#[derive(Debug, Clone)]
pub struct Proxy {
    pub port: u16,
    faults: Arc<Mutex<Vec<Fault>>>,
    /// Parameters added to forwarded calls of an action: (action, name, value).
    added: Arc<Mutex<Vec<(String, String, String)>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Proxy {
    /// A proxy on 127.0.0.1 forwarding to moto at `upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy =
            Proxy { port, faults: Arc::default(), added: Arc::default(), seen: Arc::default() };
        let serving = proxy.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let proxy = serving.clone();
                tokio::spawn(async move { proxy.serve(stream, upstream).await });
            }
        });
        proxy
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn inject(&self, fault: Fault) {
        self.faults.lock().unwrap().push(fault);
    }

    /// Adds `name=value` to every forwarded call of `action` (the test choosing what the cloud
    /// assigns, such as an instance's private address).
    pub fn add_param(&self, action: &str, name: &str, value: &str) {
        self.added.lock().unwrap().push((action.into(), name.into(), value.into()));
    }

    pub fn clear_faults(&self) {
        self.faults.lock().unwrap().clear();
    }

    /// Every call so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The calls of `action` so far.
    pub fn calls(&self, action: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.action == action).collect()
    }

    fn fault_for(&self, action: &str, params: &[(String, String)]) -> Option<Fault> {
        let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let mut faults = self.faults.lock().unwrap();
        let index = faults.iter().position(|f| {
            f.action == action
                && f.times != Some(0)
                && (f.subnet.is_none() || f.subnet == param("NetworkInterface.1.SubnetId"))
                && (f.instance_type.is_none() || f.instance_type == param("InstanceType"))
        })?;
        let fault = &mut faults[index];
        if let Some(times) = fault.times.as_mut() {
            *times -= 1;
        }
        Some(fault.clone())
    }

    async fn serve(&self, mut stream: tokio::net::TcpStream, upstream: u16) {
        let Some((head, body)) = read_request(&mut stream).await else { return };
        let params = form(&body);
        let action =
            params.iter().find(|(k, _)| k == "Action").map(|(_, v)| v.clone()).unwrap_or_default();
        let at = tokio::time::Instant::now();
        if let Some(fault) = self.fault_for(&action, &params) {
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code>\
                 <Message>{}</Message></Error></Errors><RequestID>fault-injected</RequestID></Response>",
                fault.code, fault.message
            );
            let answer = format!(
                "HTTP/1.1 {} Fault\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                fault.status,
                xml.len()
            );
            self.seen.lock().unwrap().push(Seen {
                action,
                params,
                fault: Some(fault.code),
                answer: xml,
                at,
            });
            let _ = stream.write_all(answer.as_bytes()).await;
            return;
        }
        // Forward with the connection closed after one exchange, and relay moto's answer.
        let mut body = body;
        for (_, name, value) in self.added.lock().unwrap().iter().filter(|(a, _, _)| *a == action) {
            body.push_str(&format!("&{}={}", encode(name), encode(value)));
        }
        let mut request = String::new();
        for line in head.lines() {
            let lower = line.to_ascii_lowercase();
            if !lower.starts_with("connection:")
                && !lower.starts_with("content-length:")
                && !line.is_empty()
            {
                request.push_str(line);
                request.push_str("\r\n");
            }
        }
        request.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()));
        request.push_str(&body);
        let Ok(mut moto) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
            return;
        };
        if moto.write_all(request.as_bytes()).await.is_err() {
            return;
        }
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(20), moto.read_to_end(&mut answer)).await;
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        let mut relayed = text.clone();
        if !text.to_ascii_lowercase().contains("\r\nconnection: close") {
            relayed = text.replacen("\r\n", "\r\nConnection: close\r\n", 1);
        }
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        self.seen.lock().unwrap().push(Seen { action, params, fault: None, answer: body, at });
        let _ = stream.write_all(relayed.as_bytes()).await;
    }
}

/// One HTTP request's head and body (by Content-Length).
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, String::from_utf8_lossy(&body).into_owned()))
}
