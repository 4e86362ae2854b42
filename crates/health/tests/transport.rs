//! The real transport against real sockets on 127.0.0.1: Nomad's `TestChecker_Do_HTTP`,
//! `TestChecker_Do_HTTP_extras` and `TestChecker_Do_TCP` cases, through wharf's tiny client.

// A test server on real threads and the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;
use wharf_health::check::{HttpRequest, OUTPUT_LIMIT, judge_http};
use wharf_health::{TcpTransport, Transport};
use wharf_state::CheckStatus;

/// Every wait on the test server; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(10);

/// A request as the server received it: its head (request line and headers), its body, and
/// which connection (counted from 1) it came on.
#[derive(Debug)]
struct Received {
    head: String,
    body: String,
    connection: usize,
}

/// Serves on 127.0.0.1 until the test ends, answering by path like Nomad's test handler,
/// several requests per connection (HTTP/1.1), and sends every request it gets on the
/// returned channel.
fn server() -> (SocketAddr, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        for (index, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let sent = sent.clone();
            std::thread::spawn(move || serve(stream, index + 1, &sent));
        }
    });
    (addr, received)
}

/// Answers requests on one connection until the client closes it or an answer closes it.
fn serve(mut stream: TcpStream, connection: usize, sent: &mpsc::Sender<Received>) {
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => data.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while data.len() < head_end + 4 + length {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => data.extend_from_slice(&buf[..n]),
            }
        }
        let body = String::from_utf8_lossy(&data[head_end + 4..head_end + 4 + length]).into_owned();
        data.drain(..head_end + 4 + length);
        let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
        let _ = sent.send(Received { head, body, connection });
        let long = "a".repeat(OUTPUT_LIMIT + 5);
        let (status, text, then_close) = match target.as_str() {
            "/fail" => ("500 Internal Server Error", "500 problem".to_owned(), false),
            "/hang" => {
                std::thread::sleep(Duration::from_secs(2));
                ("200 OK", "too slow".to_owned(), true)
            }
            "/long-fail" => ("500 Internal Server Error", long, false),
            "/long-not-fail" => ("201 Created", long, false),
            "/huge" => ("200 OK", "b".repeat(200 * 1024), false),
            "/chunked" => {
                let _ = stream.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nnot r\r\n4\r\neady\r\n0\r\n\r\n",
                );
                continue;
            }
            "/http10" => {
                // As python's http.server: HTTP/1.0, no length, the end of the body is the close.
                let _ =
                    stream.write_all(b"HTTP/1.0 500 Oops\r\nServer: SimpleHTTP\r\n\r\nold server");
                return;
            }
            "/drop-after" => ("200 OK", "ok".to_owned(), true),
            t if t.starts_with("/query-param") && !t.contains('?') => {
                ("400 Bad Request", "400 bad request".to_owned(), false)
            }
            _ => ("200 OK", "200 ok".to_owned(), false),
        };
        let _ = write!(stream, "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{text}", text.len());
        if then_close {
            // Closed without saying so, as a server closes an idle connection.
            return;
        }
    }
}

fn request(method: &str, path: &str, addr: SocketAddr) -> HttpRequest {
    HttpRequest::new(method, path, &addr.to_string(), &BTreeMap::new(), None)
}

async fn check(
    transport: &TcpTransport,
    addr: SocketAddr,
    request: &HttpRequest,
) -> (CheckStatus, String, u16) {
    let reply = tokio::time::timeout(LIMIT, transport.http(addr, request)).await.unwrap().unwrap();
    let (status, output) = judge_http(request, &reply);
    (status, output, reply.status)
}

/// `TestChecker_Do_HTTP`: statuses, outputs (truncated to the limit), query strings, and a
/// service that does not answer in time.
#[tokio::test]
async fn do_http() {
    let (addr, _requests) = server();
    let transport = TcpTransport::new();
    let ok = check(&transport, addr, &request("GET", "/", addr)).await;
    assert_eq!(ok, (CheckStatus::Passing, "HTTP GET /: 200 OK".into(), 200));
    let fail = check(&transport, addr, &request("GET", "/fail", addr)).await;
    assert_eq!(
        fail,
        (
            CheckStatus::Critical,
            "HTTP GET /fail: 500 Internal Server Error\n500 problem".into(),
            500
        )
    );
    let long_fail = check(&transport, addr, &request("GET", "/long-fail", addr)).await;
    assert_eq!((long_fail.0, long_fail.1.len()), (CheckStatus::Critical, OUTPUT_LIMIT));
    let long_ok = check(&transport, addr, &request("GET", "/long-not-fail", addr)).await;
    assert_eq!(long_ok, (CheckStatus::Passing, "HTTP GET /long-not-fail: 201 Created".into(), 201));
    let query = check(&transport, addr, &request("GET", "/query-param?a=b", addr)).await;
    assert_eq!(query.0, CheckStatus::Passing, "the query is sent as written");
    let chunked = check(&transport, addr, &request("GET", "/chunked", addr)).await;
    assert_eq!(chunked.1, "HTTP GET /chunked: 503 Service Unavailable\nnot ready");
    // "hang": the check's timeout ends the wait.
    let hang = tokio::time::timeout(
        Duration::from_millis(100),
        transport.http(addr, &request("GET", "/hang", addr)),
    )
    .await;
    assert!(hang.is_err(), "no answer within the timeout");
}

/// `TestChecker_Do_HTTP_extras`: the method, headers, Host and body are sent as the check
/// says; a HEAD answer is not waited on for a body.
#[tokio::test]
async fn do_http_extras() {
    let (addr, requests) = server();
    let transport = TcpTransport::new();
    // (method, headers, body)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        ("GET", vec![], None),
        ("Get", vec![], None),
        ("HEAD", vec![], None),
        (
            "GET",
            vec![("X-My-Header", "hello"), ("Authorization", "Basic ZWxhc3RpYzpjaGFuZ2VtZQ==")],
            None,
        ),
        ("GET", vec![("User-Agent", "my-custom-agent")], None),
        ("GET", vec![("Host", "hello")], None),
        ("POST", vec![], Some("some payload")),
    ];
    for (method, headers, body) in cases {
        let header: BTreeMap<String, Vec<String>> =
            headers.iter().map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()])).collect();
        let request = HttpRequest::new(method, "/", &addr.to_string(), &header, body);
        let (status, _, code) = check(&transport, addr, &request).await;
        assert_eq!((status, code), (CheckStatus::Passing, 200), "{method} {headers:?}");
        let got = requests.recv_timeout(LIMIT).unwrap();
        assert!(got.head.starts_with(&format!("{method} / HTTP/1.1\r\n")), "{}", got.head);
        for (name, value) in &headers {
            assert!(got.head.contains(&format!("\r\n{name}: {value}")), "{name} in {}", got.head);
        }
        let host = headers
            .iter()
            .find(|(n, _)| *n == "Host")
            .map_or(addr.to_string(), |(_, v)| (*v).to_owned());
        assert_eq!(got.head.matches("\r\nHost: ").count(), 1, "{}", got.head);
        assert!(got.head.contains(&format!("\r\nHost: {host}")), "{}", got.head);
        let agents = got.head.matches("\r\nUser-Agent: ").count();
        assert_eq!(agents, 1, "one User-Agent, the check's own if it sets one: {}", got.head);
        assert_eq!(got.body, body.unwrap_or_default());
    }
}

/// `TestChecker_Do_TCP`: a listening port passes, a closed one is refused.
#[tokio::test]
async fn do_tcp() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap();
    tokio::time::timeout(LIMIT, TcpTransport::new().connect(open)).await.unwrap().unwrap();
    drop(listener);
    let closed = tokio::time::timeout(LIMIT, TcpTransport::new().connect(open)).await.unwrap();
    assert_eq!(closed.unwrap_err().kind(), std::io::ErrorKind::ConnectionRefused);
}

/// Something that is not an HTTP server answers: the check says so instead of guessing.
#[tokio::test]
async fn not_http() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            // Read what the check sent first, so the close is a plain one, not a reset.
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
        }
    });
    let error =
        tokio::time::timeout(LIMIT, TcpTransport::new().http(addr, &request("GET", "/", addr)))
            .await
            .unwrap()
            .unwrap_err();
    assert_eq!(error.to_string(), r#"not an HTTP answer: "SSH-2.0-OpenSSH_9.6\r\n""#);
}

/// Nomad's checker keeps connections (a pooled client); so does wharf's: runs after the first
/// go over the same connection, and an answer cut short or closed is not kept.
#[tokio::test]
async fn kept_connections_carry_the_next_runs() {
    let (addr, requests) = server();
    let transport = TcpTransport::new();
    for _ in 0..10 {
        assert_eq!(
            check(&transport, addr, &request("GET", "/", addr)).await.0,
            CheckStatus::Passing
        );
        assert_eq!(
            check(&transport, addr, &request("GET", "/fail", addr)).await.0,
            CheckStatus::Critical
        );
    }
    let connections: Vec<usize> =
        (0..20).map(|_| requests.recv_timeout(LIMIT).unwrap().connection).collect();
    assert_eq!(connections, [1; 20], "one connection for every run");
    assert_eq!(transport.idle_connections(), 1);

    // A body too large to read whole is not read whole: the connection is dropped instead.
    assert_eq!(
        check(&transport, addr, &request("GET", "/huge", addr)).await.0,
        CheckStatus::Passing
    );
    assert_eq!(transport.idle_connections(), 0);
    // An HTTP/1.0 server closes after answering: its body is read to the close, nothing kept.
    let old = check(&transport, addr, &request("GET", "/http10", addr)).await;
    assert_eq!(old.1, "HTTP GET /http10: 500 Oops\nold server");
    assert_eq!(transport.idle_connections(), 0);
}

/// A kept connection the server closed while it was idle is replaced by a new one, once, and
/// the run does not fail for it.
#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced() {
    let (addr, requests) = server();
    let transport = TcpTransport::new();
    assert_eq!(
        check(&transport, addr, &request("GET", "/drop-after", addr)).await.0,
        CheckStatus::Passing
    );
    assert_eq!(transport.idle_connections(), 1, "kept: nothing said it would close");
    assert_eq!(check(&transport, addr, &request("GET", "/", addr)).await.0, CheckStatus::Passing);
    let connections: Vec<usize> =
        (0..2).map(|_| requests.recv_timeout(LIMIT).unwrap().connection).collect();
    assert_eq!(connections, [1, 2]);
}
