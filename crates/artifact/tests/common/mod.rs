//! What the artifact tests share: a small HTTP server on 127.0.0.1 serving what a test puts in
//! it, counting requests, and builders of tar, gzip and zip archives (including the malformed
//! and malicious ones a real tool would refuse to make).

#![allow(dead_code)] // Each test binary uses a part.

use flate2::Compression;
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server answers for one path.
#[derive(Debug, Clone)]
pub(crate) enum Route {
    Body(Vec<u8>),
    Status(u16),
    Redirect(String),
    /// Accepts the request and never answers.
    Hang,
    /// Claims a length, sends only part of it, closes.
    Truncated {
        claimed: usize,
        sent: Vec<u8>,
    },
}

#[derive(Clone)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl Server {
    pub(crate) async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let server = Server {
            addr: listener.local_addr().unwrap(),
            routes: Arc::default(),
            hits: Arc::default(),
        };
        let serving = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = serving.clone();
                tokio::spawn(async move { server.answer(stream).await });
            }
        });
        server
    }

    pub(crate) fn route(&self, path: &str, route: Route) {
        self.routes.lock().unwrap().insert(path.to_owned(), route);
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn answer(&self, mut stream: tokio::net::TcpStream) {
        let mut request = Vec::new();
        let mut buffer = [0; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
        let text = String::from_utf8_lossy(&request);
        let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
        *self.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
        let route = self.routes.lock().unwrap().get(&path).cloned().unwrap_or(Route::Status(404));
        let head = |status: &str, extra: &str, len: usize| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n{extra}\r\n"
            )
        };
        let (head, body) = match route {
            Route::Body(body) => (head("200 OK", "", body.len()), body),
            Route::Status(code) => (head(&format!("{code} Status"), "", 0), Vec::new()),
            Route::Redirect(to) => {
                (head("302 Found", &format!("Location: {to}\r\n"), 0), Vec::new())
            }
            Route::Hang => {
                std::future::pending::<()>().await;
                return;
            }
            Route::Truncated { claimed, sent } => (head("200 OK", "", claimed), sent),
        };
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(&body).await;
        let _ = stream.shutdown().await;
    }
}

/// One entry of a test archive.
pub(crate) enum Entry<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
}

/// A tar archive of `entries`, names written as given (even `..` and absolute ones).
pub(crate) fn tar(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        let (name, kind, data, mode, link): (&str, tar::EntryType, &[u8], u32, Option<&str>) =
            match entry {
                Entry::File(name, data, mode) => (name, tar::EntryType::Regular, data, *mode, None),
                Entry::Dir(name) => (name, tar::EntryType::Directory, b"", 0o755, None),
                Entry::Symlink(name, to) => (name, tar::EntryType::Symlink, b"", 0o777, Some(to)),
                Entry::HardLink(name, to) => (name, tar::EntryType::Link, b"", 0o644, Some(to)),
            };
        let raw = header.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A zip archive of `entries` (files deflated, modes and links as a unix zip writes them).
pub(crate) fn zip(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut directory = Vec::new();
    for entry in entries {
        let (name, data, mode, deflate): (&str, &[u8], u32, bool) = match entry {
            Entry::File(name, data, mode) => (name, data, 0o100_000 | mode, true),
            Entry::Dir(name) => (name, b"", 0o040_755, false),
            Entry::Symlink(name, to) => (name, to.as_bytes(), 0o120_777, false),
            Entry::HardLink(..) => panic!("zip has no hard links"),
        };
        let stored = if deflate {
            let mut encoder =
                flate2::write::DeflateEncoder::new(Vec::new(), Compression::default());
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        } else {
            data.to_vec()
        };
        let mut crc = flate2::Crc::new();
        crc.update(data);
        let offset = out.len() as u32;
        let method: u16 = if deflate { 8 } else { 0 };
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&method.to_le_bytes());
            v.extend_from_slice(&[0; 4]); // time, date
            v.extend_from_slice(&crc.sum().to_le_bytes());
            v.extend_from_slice(&(stored.len() as u32).to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(b"PK\x03\x04");
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&stored);
        directory.extend_from_slice(b"PK\x01\x02");
        directory.extend_from_slice(&[20, 3]); // made by: unix
        common(&mut directory);
        directory.extend_from_slice(&[0; 6]); // comment, disk, internal attributes
        directory.extend_from_slice(&(mode << 16).to_le_bytes());
        directory.extend_from_slice(&offset.to_le_bytes());
        directory.extend_from_slice(name.as_bytes());
    }
    let directory_offset = out.len() as u32;
    out.extend_from_slice(&directory);
    out.extend_from_slice(b"PK\x05\x06");
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
    out.extend_from_slice(&directory_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
