//! The checks' network I/O, behind [`Transport`]: connecting for tcp checks, and a request and
//! its status line for http checks.
//!
//! [`TcpTransport`] is the real one: a tiny HTTP/1.1 client on tokio's `TcpStream`. A check
//! needs a status line, not a general client: the request is rendered once
//! ([`crate::check::HttpRequest`]), written in one go with `Connection: close`, and the answer
//! read until its status line; only an answer that does not pass has its body read, to show
//! why, up to [`OUTPUT_LIMIT`]. There is no pooling, no redirects, no TLS and no
//! decompression, so the health crate pulls in no HTTP stack. Time limits are the caller's:
//! the check runner bounds every call with the check's timeout.
//!
//! Tests use `fake::FakeTransport` (feature `fake`), whose answers they script, under a paused clock.

use crate::check::{HttpReply, HttpRequest, OUTPUT_LIMIT, http_status};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_state::CheckStatus;

/// How checks reach services over the network.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Opens a TCP connection to `addr`, then closes it.
    async fn connect(&self, addr: SocketAddr) -> io::Result<()>;

    /// Sends `request` to `addr` and reads the answer's status (and, for an answer that does
    /// not pass, its body).
    async fn http(&self, addr: SocketAddr, request: &HttpRequest) -> io::Result<HttpReply>;
}

/// Checks over real TCP connections.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

/// The most an answer's head (status line and headers) may take before its body.
const HEAD_LIMIT: usize = 16 * 1024;

#[async_trait::async_trait]
impl Transport for TcpTransport {
    async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        TcpStream::connect(addr).await.map(drop)
    }

    async fn http(&self, addr: SocketAddr, request: &HttpRequest) -> io::Result<HttpReply> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request.bytes()).await?;
        // One read usually holds a whole small answer.
        let mut answer = Vec::with_capacity(1024);
        let line_end = loop {
            if let Some(end) = find(&answer, b"\r\n") {
                break end;
            }
            if answer.len() > HEAD_LIMIT || stream.read_buf(&mut answer).await? == 0 {
                return Err(not_http(&answer));
            }
        };
        let (status, reason) = status_line(&answer[..line_end]).ok_or_else(|| not_http(&answer))?;
        let mut reply = HttpReply { status, reason, body: String::new() };
        if http_status(status) == CheckStatus::Passing || !request.has_body() {
            return Ok(reply);
        }
        // Why it did not pass: the body, up to the limit, until the server closes.
        loop {
            let have_body = find(&answer, b"\r\n\r\n").map(|end| answer.len() - end - 4);
            let enough = match (have_body, content_length(&answer)) {
                (Some(have), Some(length)) => have >= length.min(OUTPUT_LIMIT),
                (Some(have), None) => have >= OUTPUT_LIMIT,
                (None, _) => answer.len() > HEAD_LIMIT,
            };
            if enough || stream.read_buf(&mut answer).await? == 0 {
                break;
            }
        }
        reply.body = body_text(&answer);
        Ok(reply)
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

/// The code and reason of `HTTP/1.1 200 OK`.
fn status_line(line: &[u8]) -> Option<(u16, String)> {
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("HTTP/")?;
    let (_version, rest) = rest.split_once(' ')?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if code.len() != 3 {
        return None;
    }
    Some((code.parse().ok()?, reason.trim().to_owned()))
}

/// The answer's Content-Length, once its head is complete.
fn content_length(answer: &[u8]) -> Option<usize> {
    let head = std::str::from_utf8(&answer[..find(answer, b"\r\n\r\n")?]).ok()?;
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
    })
}

/// The body of a complete or cut-off answer as text: chunked bodies de-chunked as far as they
/// came, up to [`OUTPUT_LIMIT`].
fn body_text(answer: &[u8]) -> String {
    let Some(head_end) = find(answer, b"\r\n\r\n") else { return String::new() };
    let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
    let mut body = &answer[head_end + 4..];
    let chunked =
        head.lines().any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
    let mut text = Vec::new();
    if chunked {
        while let Some(size_end) = find(body, b"\r\n") {
            let size = std::str::from_utf8(&body[..size_end])
                .ok()
                .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
            let Some(size) = size.filter(|size| *size > 0) else { break };
            let data = &body[size_end + 2..];
            text.extend_from_slice(&data[..size.min(data.len())]);
            body = data.get(size + 2..).unwrap_or_default();
        }
    } else {
        text.extend_from_slice(body);
    }
    crate::check::limit(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_line(b"HTTP/1.1 200 OK"), Some((200, "OK".into())));
        assert_eq!(status_line(b"HTTP/1.0 404 Not Found"), Some((404, "Not Found".into())));
        assert_eq!(status_line(b"HTTP/1.1 204"), Some((204, String::new())));
        for bad in [&b"SSH-2.0-OpenSSH"[..], b"HTTP/1.1 2000 OK", b"HTTP/1.1 abc", b"\xff\xfe"] {
            assert_eq!(status_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bodies_plain_chunked_and_cut_off() {
        assert_eq!(body_text(b"HTTP/1.1 500 X\r\nContent-Length: 3\r\n\r\nbad"), "bad");
        assert_eq!(
            body_text(b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwhy \r\n3\r\nnot\r\n0\r\n\r\n"),
            "why not"
        );
        assert_eq!(
            body_text(b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ncut"),
            "cut"
        );
        assert_eq!(body_text(b"HTTP/1.1 500 X\r\nServer: y"), "");
        assert_eq!(content_length(b"HTTP/1.1 500 X\r\ncontent-length:  12 \r\n\r\n"), Some(12));
    }
}
