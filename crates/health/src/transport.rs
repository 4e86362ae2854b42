//! The checks' network I/O, behind [`Transport`]: connecting for tcp checks, and a request and
//! its answer for http checks.
//!
//! [`TcpTransport`] is the real one: a tiny HTTP/1.1 client on tokio's `TcpStream`. A check
//! needs a status, not a general client: the request is rendered once
//! ([`crate::check::HttpRequest`]) and written in one go; the answer is read as far as its
//! framing (`Content-Length`, chunked) says, so that the connection can carry the next run, as
//! Nomad's pooled client does. A few idle connections per address are kept for
//! [`IDLE_TIMEOUT`]; a kept connection the server has closed meanwhile is replaced by a new
//! one, once. A thousand checks a second then cost a write and a read each, not a TCP
//! handshake and teardown. Only an answer that does not pass keeps its body, to show why,
//! up to [`OUTPUT_LIMIT`]. There are no redirects, no TLS and no decompression, so the health
//! crate pulls in no HTTP stack. Time limits are the caller's: the check runner bounds every
//! call with the check's timeout, and a call cut short drops its connection.
//!
//! Tests use `fake::FakeTransport` (feature `fake`), whose answers they script, under a
//! paused clock.

use crate::check::{HttpReply, HttpRequest, OUTPUT_LIMIT, http_status};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use wharf_state::CheckStatus;

/// How checks reach services over the network.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Opens a TCP connection to `addr`, then closes it.
    async fn connect(&self, addr: SocketAddr) -> io::Result<()>;

    /// Sends `request` to `addr` and reads the answer (whose body is kept only when the
    /// answer does not pass).
    async fn http(&self, addr: SocketAddr, request: &HttpRequest) -> io::Result<HttpReply>;
}

/// How long an idle connection is kept for the next run.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per address.
const MAX_IDLE_PER_ADDR: usize = 2;
/// The most an answer's head (status line and headers) may take before its body.
const HEAD_LIMIT: usize = 16 * 1024;
/// Bodies up to this size are read whole, so that their connection can be used again.
const REUSE_BODY_LIMIT: usize = 64 * 1024;

/// Checks over real TCP connections.
#[derive(Debug, Default)]
pub struct TcpTransport {
    idle: Mutex<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>>,
}

impl TcpTransport {
    /// A transport with no connection yet.
    pub fn new() -> TcpTransport {
        TcpTransport::default()
    }

    /// An idle connection to `addr`, if one was kept and has not been idle too long.
    fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.idle.lock();
        let kept = idle.get_mut(&addr)?;
        while let Some((stream, since)) = kept.pop() {
            if since.elapsed() < IDLE_TIMEOUT {
                return Some(stream);
            }
        }
        None
    }

    /// Keeps `stream` for the next run to `addr`, and drops connections idle too long.
    fn keep(&self, addr: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.lock();
        idle.retain(|_, kept| {
            kept.retain(|(_, since)| since.elapsed() < IDLE_TIMEOUT);
            !kept.is_empty()
        });
        let kept = idle.entry(addr).or_default();
        if kept.len() < MAX_IDLE_PER_ADDR {
            kept.push((stream, Instant::now()));
        }
    }

    /// How many idle connections are kept, to all addresses.
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().values().map(Vec::len).sum()
    }
}

#[async_trait::async_trait]
impl Transport for TcpTransport {
    async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        TcpStream::connect(addr).await.map(drop)
    }

    async fn http(&self, addr: SocketAddr, request: &HttpRequest) -> io::Result<HttpReply> {
        if let Some(mut stream) = self.take(addr) {
            match exchange(&mut stream, request).await {
                Ok(answer) => return Ok(self.done(addr, stream, answer)),
                // The server closed the kept connection before answering: a new one.
                Err(Failed { error: _, answered: false }) => {}
                Err(Failed { error, answered: true }) => return Err(error),
            }
        }
        let mut stream = TcpStream::connect(addr).await?;
        match exchange(&mut stream, request).await {
            Ok(answer) => Ok(self.done(addr, stream, answer)),
            Err(failed) => Err(failed.error),
        }
    }
}

impl TcpTransport {
    fn done(
        &self,
        addr: SocketAddr,
        stream: TcpStream,
        (reply, reusable): (HttpReply, bool),
    ) -> HttpReply {
        if reusable {
            self.keep(addr, stream);
        }
        reply
    }
}

/// An exchange that failed, and whether any of the answer had arrived.
struct Failed {
    error: io::Error,
    answered: bool,
}

impl Failed {
    fn new(error: io::Error, answer: &[u8]) -> Failed {
        Failed { error, answered: !answer.is_empty() }
    }
}

/// Writes `request` and reads its answer; says whether the connection can carry another.
async fn exchange(
    stream: &mut TcpStream,
    request: &HttpRequest,
) -> Result<(HttpReply, bool), Failed> {
    let mut answer = Vec::with_capacity(1024);
    stream.write_all(request.bytes()).await.map_err(|e| Failed::new(e, &answer))?;
    let head_end = loop {
        if let Some(end) = find(&answer, b"\r\n\r\n") {
            break end + 4;
        }
        // What does not start as an answer is told as soon as its first line is in.
        let first_line = find(&answer, b"\r\n").map(|end| std::str::from_utf8(&answer[..end]));
        let not_an_answer = matches!(first_line, Some(Err(_)))
            || matches!(first_line, Some(Ok(line)) if status_line(line).is_none());
        if answer.len() > HEAD_LIMIT || not_an_answer {
            return Err(Failed::new(not_http(&answer), &answer));
        }
        match stream.read_buf(&mut answer).await {
            Ok(0) if answer.is_empty() => {
                let closed =
                    io::Error::new(io::ErrorKind::UnexpectedEof, "closed without answering");
                return Err(Failed::new(closed, &answer));
            }
            Ok(0) => return Err(Failed::new(not_http(&answer), &answer)),
            Ok(_) => {}
            Err(error) => return Err(Failed::new(error, &answer)),
        }
    };
    let head =
        Head::parse(&answer[..head_end]).ok_or_else(|| Failed::new(not_http(&answer), &answer))?;
    let passing = http_status(head.status) == CheckStatus::Passing;
    let framing = head.framing(request.has_body());
    // Read the body as far as the framing says, to use the connection again; past the reuse
    // limit (or with no framing) only what the output needs, and the connection is dropped.
    let (body, complete) = loop {
        let body = &answer[head_end..];
        // Broken chunking ends the read; the connection is not kept.
        let (data, complete, broken) = match framing {
            Framing::Empty => (Vec::new(), true, false),
            Framing::Length(length) => {
                (body[..body.len().min(length)].to_vec(), body.len() >= length, false)
            }
            Framing::Chunked => match dechunk(body) {
                Some((data, complete)) => (data, complete, false),
                None => (Vec::new(), false, true),
            },
            Framing::UntilClose => (body.to_vec(), false, false),
        };
        let over = body.len() > REUSE_BODY_LIMIT || matches!(framing, Framing::UntilClose);
        if complete || broken || (over && (passing || data.len() >= OUTPUT_LIMIT)) {
            break (data, complete);
        }
        match stream.read_buf(&mut answer).await {
            Ok(0) => break (data, false),
            Ok(_) => {}
            Err(error) => return Err(Failed::new(error, &answer)),
        }
    };
    let reply = HttpReply {
        status: head.status,
        reason: head.reason,
        body: if passing {
            String::new()
        } else {
            crate::check::limit(String::from_utf8_lossy(&body).into_owned())
        },
    };
    Ok((reply, complete && head.keep_alive))
}

/// How an answer's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// It has none.
    Empty,
    /// After this many bytes.
    Length(usize),
    /// With its last chunk.
    Chunked,
    /// When the server closes the connection.
    UntilClose,
}

/// The parts of an answer's head a check uses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    status: u16,
    reason: String,
    content_length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
}

impl Head {
    /// Reads a head: the status line and the headers, up to and with the empty line.
    fn parse(head: &[u8]) -> Option<Head> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let (version, status, reason) = status_line(lines.next()?)?;
        let (mut content_length, mut chunked, mut close, mut keep) = (None, false, false, false);
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':')?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = Some(value.parse().ok()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                let value = value.to_ascii_lowercase();
                close |= value.contains("close");
                keep |= value.contains("keep-alive");
            }
        }
        let keep_alive = !close && (version == "1.1" || keep);
        Some(Head { status, reason, content_length, chunked, keep_alive })
    }

    fn framing(&self, request_has_body: bool) -> Framing {
        if !request_has_body || matches!(self.status, 204 | 304) {
            Framing::Empty
        } else if self.chunked {
            Framing::Chunked
        } else if let Some(length) = self.content_length {
            Framing::Length(length)
        } else {
            Framing::UntilClose
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn not_http(answer: &[u8]) -> io::Error {
    let start: String =
        String::from_utf8_lossy(&answer[..answer.len().min(64)]).escape_debug().collect();
    io::Error::new(io::ErrorKind::InvalidData, format!("not an HTTP answer: \"{start}\""))
}

/// The version, code and reason of `HTTP/1.1 200 OK`.
fn status_line(line: &str) -> Option<(&str, u16, String)> {
    let rest = line.strip_prefix("HTTP/")?;
    let (version, rest) = rest.split_once(' ')?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if code.len() != 3 || (100..200).contains(&code.parse::<u16>().ok()?) {
        // A 1xx answer is not the final one, which a check has no use waiting for.
        return None;
    }
    Some((version, code.parse().ok()?, reason.trim().to_owned()))
}

/// A chunked body as far as it came: its data, and whether the last chunk (and the trailer's
/// end) arrived. None if the framing is broken.
fn dechunk(mut body: &[u8]) -> Option<(Vec<u8>, bool)> {
    let mut data = Vec::new();
    loop {
        let Some(line_end) = find(body, b"\r\n") else { return Some((data, false)) };
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        let after = &body[line_end + 2..];
        if size == 0 {
            let ended = after.starts_with(b"\r\n") || find(after, b"\r\n\r\n").is_some();
            return Some((data, ended));
        }
        if after.len() < size + 2 {
            data.extend_from_slice(&after[..after.len().min(size)]);
            return Some((data, false));
        }
        data.extend_from_slice(&after[..size]);
        if &after[size..size + 2] != b"\r\n" {
            return None;
        }
        body = &after[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_line("HTTP/1.1 200 OK"), Some(("1.1", 200, "OK".into())));
        assert_eq!(status_line("HTTP/1.0 404 Not Found"), Some(("1.0", 404, "Not Found".into())));
        assert_eq!(status_line("HTTP/1.1 204"), Some(("1.1", 204, String::new())));
        for bad in ["SSH-2.0-OpenSSH", "HTTP/1.1 2000 OK", "HTTP/1.1 abc", "HTTP/1.1 100 Continue"]
        {
            assert_eq!(status_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn heads_say_how_bodies_end_and_whether_connections_stay() {
        let head = |text: &str| Head::parse(text.as_bytes()).unwrap();
        let ok = head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n");
        assert_eq!((ok.framing(true), ok.keep_alive), (Framing::Length(2), true));
        assert_eq!(ok.framing(false), Framing::Empty, "a HEAD answer has no body");
        let close = head("HTTP/1.1 500 X\r\nconnection: Close\r\ncontent-length:  12 \r\n\r\n");
        assert_eq!((close.framing(true), close.keep_alive), (Framing::Length(12), false));
        let old = head("HTTP/1.0 200 OK\r\nServer: SimpleHTTP/0.6\r\n\r\n");
        assert_eq!((old.framing(true), old.keep_alive), (Framing::UntilClose, false));
        let old_kept =
            head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n");
        assert!(old_kept.keep_alive);
        let chunked = head("HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(chunked.framing(true), Framing::Chunked);
        assert_eq!(head("HTTP/1.1 204 No Content\r\n\r\n").framing(true), Framing::Empty);
        assert!(Head::parse(b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n").is_none());
    }

    #[test]
    fn chunked_bodies_as_far_as_they_came() {
        assert_eq!(
            dechunk(b"4\r\nwhy \r\n3\r\nnot\r\n0\r\n\r\n"),
            Some((b"why not".to_vec(), true))
        );
        assert_eq!(
            dechunk(b"4;ext=1\r\nwhy \r\n0\r\nTrailer: x\r\n\r\n"),
            Some((b"why ".to_vec(), true))
        );
        assert_eq!(dechunk(b"9\r\ncut"), Some((b"cut".to_vec(), false)));
        assert_eq!(
            dechunk(b"3\r\nabc\r\n0\r\n"),
            Some((b"abc".to_vec(), false)),
            "the trailer's end is missing"
        );
        assert_eq!(dechunk(b"zz\r\n"), None);
        assert_eq!(dechunk(b"3\r\nabcXY"), None);
    }
}
