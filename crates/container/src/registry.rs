//! Pulls over the OCI distribution API: a small client of its own over the workspace's hyper
//! (HTTP/1.1, rustls on ring with the system's roots) rather than `oci-client`, which brings
//! reqwest and a second HTTP stack.
//!
//! What it does: `GET /v2/<repo>/manifests/<tag|digest>` (an index is resolved to this host's
//! platform), then each blob (`GET /v2/<repo>/blobs/<digest>`, redirects followed), each
//! streamed to a file and stored verified by its digest. A `401` with a `Bearer` challenge is
//! answered with an anonymous token from the realm it names, as Docker does for public
//! images. Plain HTTP only for the registries the node lists as insecure.

use crate::digest::{Digest, parse_digest};
use crate::error::ContainerError;
use crate::image::StoredImage;
use crate::import::{check_layer_type, host_platform};
use crate::reference::RegistryRef;
use crate::store::ImageStore;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use oci_spec::image::{ImageIndex, ImageManifest};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// How the node reaches registries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`) reached over plain HTTP.
    pub insecure: Vec<String>,
    /// How long one request may take before an answer starts, and between chunks of a body.
    pub timeout: Option<Duration>,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Pulls `reference` into `store` and returns what was stored (not yet recorded).
pub(crate) async fn pull(
    store: &Arc<ImageStore>,
    text: &str,
    reference: &RegistryRef,
    options: &RegistryOptions,
) -> Result<StoredImage, ContainerError> {
    let session = Session::new(text, reference, options)?;
    let (manifest_digest, bytes) = session.manifest(&reference.reference).await?;
    let mut manifest_bytes = bytes;
    let mut manifest_digest = manifest_digest;
    if let Ok(index) = ImageIndex::from_reader(&manifest_bytes[..])
        && !index.manifests().is_empty()
    {
        let chosen = index
            .manifests()
            .iter()
            .find(|d| {
                d.platform().as_ref().is_none_or(|p| {
                    host_platform(&p.architecture().to_string(), &p.os().to_string())
                })
            })
            .ok_or_else(|| {
                session.bad(format!("no manifest for this host's platform in {manifest_digest}"))
            })?;
        store_bytes(store, &manifest_digest, &manifest_bytes).await?;
        let (digest, bytes) = session.manifest(chosen.digest().as_ref()).await?;
        (manifest_digest, manifest_bytes) = (digest, bytes);
    }
    let manifest = ImageManifest::from_reader(&manifest_bytes[..])
        .map_err(|e| session.bad(format!("manifest {manifest_digest}: {e}")))?;
    store_bytes(store, &manifest_digest, &manifest_bytes).await?;
    let config = parse_digest(text, manifest.config().digest().as_ref())?;
    let mut size = session.blob(store, &config).await?;
    let mut layers = Vec::new();
    for layer in manifest.layers() {
        check_layer_type(text, layer.media_type())?;
        let digest = parse_digest(text, layer.digest().as_ref())?;
        size += session.blob(store, &digest).await?;
        layers.push(digest.to_string());
    }
    Ok(StoredImage {
        reference: text.to_owned(),
        manifest: manifest_digest.to_string(),
        config: config.to_string(),
        layers,
        size,
    })
}

async fn store_bytes(
    store: &Arc<ImageStore>,
    digest: &Digest,
    bytes: &[u8],
) -> Result<u64, ContainerError> {
    let (store, digest, bytes) = (store.clone(), digest.clone(), bytes.to_vec());
    tokio::task::spawn_blocking(move || store.put_blob(&digest, &mut &bytes[..]))
        .await
        .map_err(|e| ContainerError::Pull { reference: String::new(), reason: e.to_string() })?
}

struct Session<'a> {
    text: &'a str,
    reference: &'a RegistryRef,
    base: String,
    client: HttpsClient,
    timeout: Duration,
    token: parking_lot::Mutex<Option<String>>,
}

impl<'a> Session<'a> {
    fn new(
        text: &'a str,
        reference: &'a RegistryRef,
        options: &RegistryOptions,
    ) -> Result<Session<'a>, ContainerError> {
        let insecure = options.insecure.iter().any(|r| r == &reference.registry);
        let scheme = if insecure { "http" } else { "https" };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| ContainerError::Pull {
                reference: text.to_owned(),
                reason: format!("no TLS roots: {e}"),
            })?;
        let connector = if insecure { connector.https_or_http() } else { connector.https_only() };
        let client = Client::builder(TokioExecutor::new()).build(connector.enable_http1().build());
        Ok(Session {
            text,
            reference,
            base: format!("{scheme}://{}/v2/{}", reference.host(), reference.repository),
            client,
            timeout: options.timeout.unwrap_or(Duration::from_secs(60)),
            token: parking_lot::Mutex::new(None),
        })
    }

    fn bad(&self, reason: String) -> ContainerError {
        ContainerError::BadImage { reference: self.text.to_owned(), reason }
    }

    fn failed(&self, reason: impl std::fmt::Display) -> ContainerError {
        ContainerError::Pull { reference: self.text.to_owned(), reason: reason.to_string() }
    }

    /// The manifest `reference` names (a tag or a digest), its digest and bytes; verified when
    /// asked for by digest.
    async fn manifest(&self, reference: &str) -> Result<(Digest, Vec<u8>), ContainerError> {
        let url = format!("{}/manifests/{reference}", self.base);
        let response = self.get(&url, Some(MANIFEST_TYPES)).await?;
        let mut body = Vec::new();
        self.read_body(response, &mut body, 4 << 20).await?;
        let digest = Digest::of(&body);
        if reference.starts_with("sha256:") && digest.to_string() != reference {
            return Err(
                self.bad(format!("the registry's manifest has digest {digest}, not {reference}"))
            );
        }
        Ok((digest, body))
    }

    /// Stores blob `digest` (if the store lacks it), verified; returns its size.
    async fn blob(&self, store: &Arc<ImageStore>, digest: &Digest) -> Result<u64, ContainerError> {
        if store.has_blob(digest) {
            return Ok(std::fs::metadata(store.blob_path(digest)).map(|m| m.len()).unwrap_or(0));
        }
        let url = format!("{}/blobs/{digest}", self.base);
        let response = self.get(&url, None).await?;
        let temp = tempfile_in(store)?;
        let mut file = std::io::BufWriter::new(
            temp.reopen().map_err(ContainerError::io("open", temp.path()))?,
        );
        self.read_body(response, &mut file, u64::MAX).await?;
        file.flush().map_err(ContainerError::io("write", temp.path()))?;
        drop(file);
        let (store, digest) = (store.clone(), digest.clone());
        tokio::task::spawn_blocking(move || {
            let mut content = std::io::BufReader::new(
                temp.reopen().map_err(ContainerError::io("open", temp.path()))?,
            );
            store.put_blob(&digest, &mut content)
        })
        .await
        .map_err(|e| self.failed(e))?
    }

    /// GET with the token if there is one; a 401 with a Bearer challenge fetches a token and
    /// tries once more; redirects are followed (without the token, to another host).
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ContainerError> {
        let mut url = url.to_owned();
        let mut authorized = true;
        let mut challenged = false;
        for _ in 0..6 {
            let mut request = Request::get(&url).header("user-agent", "wharf");
            if let Some(accept) = accept {
                request = request.header("accept", accept);
            }
            if authorized && let Some(token) = self.token.lock().clone() {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let request = request.body(Empty::new()).map_err(|e| self.failed(e))?;
            let response = tokio::time::timeout(self.timeout, self.client.request(request))
                .await
                .map_err(|_| self.failed(format!("{url}: no answer within {:?}", self.timeout)))?
                .map_err(|e| self.failed(format!("{url}: {}", root_cause(&e))))?;
            match response.status() {
                status if status.is_success() => return Ok(response),
                status if status.is_redirection() => {
                    let location = response
                        .headers()
                        .get("location")
                        .and_then(|l| l.to_str().ok())
                        .ok_or_else(|| {
                            self.failed(format!("{url}: a redirect without a location"))
                        })?;
                    let next = if location.starts_with('/') {
                        let origin: String =
                            url.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
                        format!("{origin}{location}")
                    } else {
                        location.to_owned()
                    };
                    authorized = same_origin(&url, &next);
                    url = next;
                }
                StatusCode::UNAUTHORIZED if !challenged => {
                    challenged = true;
                    let challenge = response
                        .headers()
                        .get("www-authenticate")
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let token = self.token_for(&challenge).await?;
                    *self.token.lock() = Some(token);
                }
                StatusCode::NOT_FOUND => {
                    return Err(ContainerError::ImageNotFound {
                        reference: self.text.to_owned(),
                        reason: format!("{url}: 404 from the registry"),
                    });
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return Err(self.bad(format!(
                        "{url}: {} (only anonymous pulls are supported)",
                        response.status()
                    )));
                }
                status => return Err(self.failed(format!("{url}: {status}"))),
            }
        }
        Err(self.failed(format!("{url}: too many redirects")))
    }

    /// An anonymous token for a `Bearer realm=...,service=...,scope=...` challenge.
    async fn token_for(&self, challenge: &str) -> Result<String, ContainerError> {
        let params = parse_challenge(challenge).ok_or_else(|| {
            self.bad(format!(
                "the registry asks for credentials this client cannot give ({challenge:?})"
            ))
        })?;
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| self.bad("a Bearer challenge without a realm".into()))?;
        let mut url = realm;
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for key in ["service", "scope"] {
            let value =
                params.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).or_else(|| {
                    (key == "scope")
                        .then(|| format!("repository:{}:pull", self.reference.repository))
                });
            if let Some(value) = value {
                url.push(sep);
                url.push_str(key);
                url.push('=');
                url.push_str(&percent_encode(&value));
                sep = '&';
            }
        }
        let request = Request::get(&url)
            .header("user-agent", "wharf")
            .body(Empty::new())
            .map_err(|e| self.failed(e))?;
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| self.failed(format!("{url}: no answer within {:?}", self.timeout)))?
            .map_err(|e| self.failed(format!("{url}: {}", root_cause(&e))))?;
        if !response.status().is_success() {
            return Err(self.bad(format!("the token service {url} answered {}", response.status())));
        }
        let mut body = Vec::new();
        self.read_body(response, &mut body, 1 << 20).await?;
        let answer: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| self.bad(format!("token answer: {e}")))?;
        answer
            .get("token")
            .or_else(|| answer.get("access_token"))
            .and_then(|t| t.as_str())
            .map(str::to_owned)
            .ok_or_else(|| self.bad("the token service's answer holds no token".into()))
    }

    async fn read_body(
        &self,
        response: hyper::Response<hyper::body::Incoming>,
        into: &mut (dyn Write + Send),
        limit: u64,
    ) -> Result<(), ContainerError> {
        let mut body = response.into_body();
        let mut read = 0u64;
        loop {
            let frame = match tokio::time::timeout(self.timeout, body.frame()).await {
                Err(_) => {
                    return Err(
                        self.failed(format!("the registry stopped sending for {:?}", self.timeout))
                    );
                }
                Ok(None) => return Ok(()),
                Ok(Some(frame)) => frame.map_err(|e| self.failed(root_cause(&e)))?,
            };
            if let Ok(data) = frame.into_data() {
                read += data.len() as u64;
                if read > limit {
                    return Err(self.bad(format!("an answer over {limit} bytes")));
                }
                into.write_all(&data).map_err(|e| self.failed(format!("writing: {e}")))?;
            }
        }
    }
}

fn tempfile_in(store: &ImageStore) -> Result<TempFile, ContainerError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = store.root().join("tmp").join(format!("download.{}.{n}", std::process::id()));
    std::fs::File::create(&path).map_err(ContainerError::io("create", &path))?;
    Ok(TempFile(path))
}

/// A download's file, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn path(&self) -> &std::path::Path {
        &self.0
    }

    fn reopen(&self) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new().read(true).write(true).open(&self.0)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn same_origin(a: &str, b: &str) -> bool {
    let origin = |u: &str| u.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
    origin(a) == origin(b)
}

fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The parameters of a `Bearer k="v",k2="v2"` challenge.
pub(crate) fn parse_challenge(header: &str) -> Option<Vec<(String, String)>> {
    let rest =
        header.trim().strip_prefix("Bearer ").or_else(|| header.trim().strip_prefix("bearer "))?;
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let value: String = if chars.peek() == Some(&'"') {
            chars.next();
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
            value
        } else {
            chars.by_ref().take_while(|c| *c != ',').collect()
        };
        params.push((key.trim().to_owned(), value));
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed() {
        let params = parse_challenge(r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:library/busybox:pull""#).unwrap();
        assert_eq!(
            params,
            [
                ("realm".to_owned(), "https://auth.example/token".to_owned()),
                ("service".to_owned(), "registry.example".to_owned()),
                ("scope".to_owned(), "repository:library/busybox:pull".to_owned()),
            ]
        );
        assert!(parse_challenge(r#"Basic realm="x""#).is_none());
        assert_eq!(percent_encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }
}
