//! Fetching one artifact: the bytes from an http(s) server or a local file into a part file in
//! the task's directory, hashed and counted as they arrive; then checked and put in place.
//!
//! Bounded: the download by [`Limits::max_download_bytes`] (a `Content-Length` above it is
//! refused before a byte is read) and, with the checks and the unpacking, by
//! [`Limits::timeout`]; the unpacked archive by [`Limits::max_unpacked_bytes`] and
//! [`Limits::max_entries`]. Redirects are followed, up to [`MAX_REDIRECTS`].

use crate::checksum::Hasher;
use crate::error::ArtifactError;
use crate::unpack::{Budget, Kind, Unpacker};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wharf_state::{Artifact, ArtifactMode, Checksum};

/// The most redirects one download follows.
pub const MAX_REDIRECTS: usize = 10;

/// How much an artifact may be, and how long fetching it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes one download may have.
    pub max_download_bytes: u64,
    /// The most bytes an archive may unpack to.
    pub max_unpacked_bytes: u64,
    /// The most entries an archive may have.
    pub max_entries: u64,
    /// The longest fetching, checking and unpacking one artifact may take.
    pub timeout: Duration,
}

impl Default for Limits {
    /// 1 GiB downloads, 4 GiB unpacked, 100,000 entries, 10 minutes.
    fn default() -> Limits {
        Limits {
            max_download_bytes: 1 << 30,
            max_unpacked_bytes: 4 << 30,
            max_entries: 100_000,
            timeout: Duration::from_secs(600),
        }
    }
}

/// Fetches artifacts. One per node: it holds the HTTP client and its connections.
///
/// A local source must be inside the task's allocation directory, or inside one of the
/// directories [`Fetcher::with_local_roots`] allows: a job may not copy the node's files (its
/// keys, the agent's token) into a task that could not read them itself.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    limits: Limits,
    local_roots: Vec<PathBuf>,
}

/// The TLS connector: rustls on ring with the system's roots. Without readable roots, https
/// sources fail at their handshake (and say so) while http and local sources still work.
fn connector() -> Result<HttpsConnector<HttpConnector>, ArtifactError> {
    let provider = || std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = |error: rustls::Error| ArtifactError::Tls { reason: error.to_string() };
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider())
    {
        Ok(builder) => builder,
        Err(error) => {
            tracing::warn!(%error, "https artifacts will fail: no system roots");
            let config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(tls)?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    Ok(builder.https_or_http().enable_http1().build())
}

impl Fetcher {
    /// A fetcher within `limits`. Fails only if TLS cannot be set up at all.
    pub fn new(limits: Limits) -> Result<Fetcher, ArtifactError> {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector()?);
        Ok(Fetcher { client, limits, local_roots: Vec::new() })
    }

    /// Also allows local sources inside `roots` (directories of the node meant for
    /// artifacts).
    pub fn with_local_roots(mut self, roots: impl IntoIterator<Item = PathBuf>) -> Fetcher {
        self.local_roots.extend(roots);
        self
    }

    /// Its limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Fetches `artifact` into `task_dir` (its destination is relative to it); returns where
    /// it was put: the file, or the directory an archive was unpacked into.
    pub async fn fetch(
        &self,
        artifact: &Artifact,
        task_dir: &Path,
    ) -> Result<PathBuf, ArtifactError> {
        let from = artifact.source.clone();
        let spec = |reason: String| ArtifactError::Spec { artifact: from.clone(), reason };
        let checksum =
            artifact.options.checksum.as_deref().map(Checksum::parse).transpose().map_err(spec)?;
        if let Some(problem) = wharf_state::artifact::destination_problem(&artifact.destination) {
            return Err(spec(problem));
        }
        let destination = task_dir.join(artifact.destination.trim_end_matches('/'));
        refuse_links(task_dir, &destination).map_err(spec)?;
        if !artifact.source.starts_with("http://") && !artifact.source.starts_with("https://") {
            self.check_local(&artifact.source, task_dir)?;
        }
        let part = PartFile(task_dir.join(".wharf-artifact.part"));
        let work = async {
            let mut hasher = checksum.as_ref().map(Hasher::for_checksum);
            self.download(&artifact.source, &part.0, &mut hasher).await?;
            if let (Some(hasher), Some(expected)) = (hasher, &checksum) {
                hasher.verify(expected).map_err(|actual| ArtifactError::Checksum {
                    artifact: from.clone(),
                    expected: artifact.options.checksum.clone().unwrap_or_default(),
                    actual: format!("{}:{actual}", kind_name(expected)),
                })?;
            }
            let (part_path, mode, limits) = (part.0.clone(), artifact.mode, self.limits);
            let name = file_name(&artifact.source);
            let source = from.clone();
            tokio::task::spawn_blocking(move || {
                place(&part_path, &name, mode, &destination, limits, &source)
            })
            .await
            .map_err(|e| ArtifactError::Fetch { artifact: from.clone(), reason: e.to_string() })?
        };
        match tokio::time::timeout(self.limits.timeout, work).await {
            Ok(placed) => placed,
            Err(_) => Err(ArtifactError::TimedOut {
                artifact: artifact.source.clone(),
                seconds: self.limits.timeout.as_secs(),
            }),
        }
    }

    /// Refuses a local source outside the allocation's directory (the task directory's
    /// parent) and the allowed roots, links resolved.
    fn check_local(&self, source: &str, task_dir: &Path) -> Result<(), ArtifactError> {
        let fail = |reason: String| ArtifactError::Fetch { artifact: source.to_owned(), reason };
        let path = Path::new(source.strip_prefix("file://").unwrap_or(source));
        let real = std::fs::canonicalize(path).map_err(|e| fail(e.to_string()))?;
        let alloc_dir = task_dir.parent().unwrap_or(task_dir);
        let allowed = std::iter::once(alloc_dir)
            .chain(self.local_roots.iter().map(PathBuf::as_path))
            .filter_map(|root| std::fs::canonicalize(root).ok())
            .any(|root| real.starts_with(root));
        if allowed {
            Ok(())
        } else {
            Err(fail(
                "a local source must be inside the allocation's directory or a directory the \
                 node allows for artifacts"
                    .into(),
            ))
        }
    }

    async fn download(
        &self,
        source: &str,
        part: &Path,
        hasher: &mut Option<Hasher>,
    ) -> Result<(), ArtifactError> {
        let io = |source| ArtifactError::Io { path: part.to_owned(), source };
        let mut out = tokio::fs::File::create(part).await.map_err(io)?;
        let mut sink = Sink {
            out: &mut out,
            hasher,
            written: 0,
            limit: self.limits.max_download_bytes,
            source,
            part,
        };
        if source.starts_with("http://") || source.starts_with("https://") {
            self.download_http(source, &mut sink).await?;
        } else {
            download_file(source, &mut sink).await?;
        }
        out.flush().await.map_err(io)
    }

    async fn download_http(&self, source: &str, sink: &mut Sink<'_>) -> Result<(), ArtifactError> {
        let fail = |reason: String| ArtifactError::Fetch { artifact: source.to_owned(), reason };
        let mut url = source.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("{url:?}: {e}")))?;
            let request = hyper::Request::get(uri)
                .header(hyper::header::USER_AGENT, concat!("wharf/", env!("CARGO_PKG_VERSION")))
                .body(Empty::new())
                .map_err(|e| fail(e.to_string()))?;
            let response = self.client.request(request).await.map_err(|e| fail(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .ok_or_else(|| {
                        fail(format!("the server answered {status} with no location"))
                    })?;
                url = resolve(&url, location);
                continue;
            }
            if !status.is_success() {
                return Err(fail(format!("the server answered {status}")));
            }
            let length = response
                .headers()
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|l| l.to_str().ok()?.parse::<u64>().ok());
            if length.is_some_and(|length| length > sink.limit) {
                return Err(sink.too_large());
            }
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| fail(error_chain(&e)))?;
                if let Ok(data) = frame.into_data() {
                    sink.write(&data).await?;
                }
            }
            return Ok(());
        }
        Err(fail(format!("more than {MAX_REDIRECTS} redirects")))
    }
}

/// Where a download goes: the part file, the hash, the count.
struct Sink<'a> {
    out: &'a mut tokio::fs::File,
    hasher: &'a mut Option<Hasher>,
    written: u64,
    limit: u64,
    source: &'a str,
    part: &'a Path,
}

impl Sink<'_> {
    async fn write(&mut self, bytes: &[u8]) -> Result<(), ArtifactError> {
        self.written += bytes.len() as u64;
        if self.written > self.limit {
            return Err(self.too_large());
        }
        if let Some(hasher) = self.hasher.as_mut() {
            hasher.update(bytes);
        }
        self.out
            .write_all(bytes)
            .await
            .map_err(|source| ArtifactError::Io { path: self.part.to_owned(), source })
    }

    fn too_large(&self) -> ArtifactError {
        ArtifactError::TooLarge { artifact: self.source.to_owned(), limit: self.limit }
    }
}

async fn download_file(source: &str, sink: &mut Sink<'_>) -> Result<(), ArtifactError> {
    let path = source.strip_prefix("file://").unwrap_or(source);
    let fail = |reason: String| ArtifactError::Fetch { artifact: source.to_owned(), reason };
    let mut file = tokio::fs::File::open(path).await.map_err(|e| fail(e.to_string()))?;
    let meta = file.metadata().await.map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file; only files are fetched".into()));
    }
    if meta.len() > sink.limit {
        return Err(sink.too_large());
    }
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer).await.map_err(|e| fail(e.to_string()))?;
        if read == 0 {
            return Ok(());
        }
        sink.write(&buffer[..read]).await?;
    }
}

/// Removes the part file however the fetch ends.
struct PartFile(PathBuf);

impl Drop for PartFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn kind_name(checksum: &Checksum) -> &'static str {
    match checksum {
        Checksum::Sha256(_) => "sha256",
        Checksum::Md5(_) => "md5",
    }
}

/// The source's file name: the last part of its path, without a query or fragment.
fn file_name(source: &str) -> String {
    let path = source.split(['?', '#']).next().unwrap_or(source);
    let name = path.rsplit('/').next().unwrap_or("");
    if name.is_empty() || name == "." || name == ".." { "artifact".into() } else { name.into() }
}

/// `location` against the URL it was answered to: absolute, or absolute-path.
fn resolve(base: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_owned();
    }
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let origin_end = base[after_scheme..].find('/').map_or(base.len(), |i| after_scheme + i);
    if location.starts_with('/') {
        format!("{}{location}", &base[..origin_end])
    } else {
        let dir_end = base.rfind('/').filter(|&i| i >= origin_end).map_or(base.len(), |i| i + 1);
        let prefix = &base[..dir_end];
        if prefix.ends_with('/') {
            format!("{prefix}{location}")
        } else {
            format!("{prefix}/{location}")
        }
    }
}

/// An error with its causes, as hyper's errors say little on their own.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// Refuses a destination reached through a link: each part below the task's directory that
/// exists must be a real directory (or, last, a file to replace).
fn refuse_links(task_dir: &Path, destination: &Path) -> Result<(), String> {
    let relative = destination.strip_prefix(task_dir).unwrap_or(destination);
    let mut path = task_dir.to_owned();
    for part in relative.components() {
        path.push(part);
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && meta.file_type().is_symlink()
        {
            return Err(format!(
                "{} is a link; artifacts are not written through links",
                path.display()
            ));
        }
    }
    Ok(())
}

/// Puts the checked download in place as `mode` says.
fn place(
    part: &Path,
    name: &str,
    mode: ArtifactMode,
    destination: &Path,
    limits: Limits,
    source: &str,
) -> Result<PathBuf, ArtifactError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ArtifactError::Io { path, source }
    };
    let archive = |reason: String| ArtifactError::Archive { artifact: source.to_owned(), reason };
    let budget = Budget { bytes: limits.max_unpacked_bytes, entries: limits.max_entries };
    let kind = Kind::of(name);
    match (mode, kind) {
        (ArtifactMode::File, Some(Kind::Gz)) => {
            let parent = destination.parent().unwrap_or(destination);
            std::fs::create_dir_all(parent).map_err(io(parent))?;
            let file_name = destination.file_name().and_then(|n| n.to_str()).unwrap_or("artifact");
            Unpacker::new(parent, budget)
                .unpack(Kind::Gz, part, &format!("{file_name}.gz"))
                .map_err(archive)?;
            Ok(destination.to_owned())
        }
        (ArtifactMode::File, _) => {
            let parent = destination.parent().unwrap_or(destination);
            std::fs::create_dir_all(parent).map_err(io(parent))?;
            std::fs::rename(part, destination).map_err(io(destination))?;
            set_mode(destination, 0o644)?;
            Ok(destination.to_owned())
        }
        (ArtifactMode::Dir, None) => Err(archive(format!(
            "mode \"dir\" needs an archive (.tar, .tar.gz, .tgz, .zip or .gz), not {name:?}"
        ))),
        (_, Some(kind)) => {
            std::fs::create_dir_all(destination).map_err(io(destination))?;
            Unpacker::new(destination, budget).unpack(kind, part, name).map_err(archive)?;
            Ok(destination.to_owned())
        }
        (ArtifactMode::Any, None) => {
            std::fs::create_dir_all(destination).map_err(io(destination))?;
            let target = destination.join(name);
            if std::fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&target).map_err(io(&target))?;
            }
            std::fs::rename(part, &target).map_err(io(&target))?;
            set_mode(&target, 0o644)?;
            Ok(target)
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ArtifactError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|source| ArtifactError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_and_redirects() {
        assert_eq!(file_name("https://h/a/b/app.tar.gz?x=1#f"), "app.tar.gz");
        assert_eq!(file_name("/srv/app.zip"), "app.zip");
        assert_eq!(file_name("https://h/"), "artifact");
        assert_eq!(resolve("http://h:1/a/b", "/c"), "http://h:1/c");
        assert_eq!(resolve("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(resolve("http://h:1/a/b", "https://o/x"), "https://o/x");
        assert_eq!(resolve("http://h:1", "c"), "http://h:1/c");
    }
}
