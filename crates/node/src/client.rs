//! The CLI's HTTP client for the agent's API (and the fleet's, which has the same shape).
//!
//! Paths are [`ApiPath`]s built from segments and query pairs, each percent-encoded, so an id
//! or task name given on the command line stays one segment whatever it holds.

use crate::agent_file::AgentFile;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A path of the API with its query, every part percent-encoded: `/v1/allocations/{id}` is
/// `ApiPath::v1(["allocations", id])`, never text pasted into a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPath(String);

impl ApiPath {
    /// `/v1/` and `segments`, each encoded whole: a `/` or `..` inside one stays inside it.
    pub fn v1<'a>(segments: impl IntoIterator<Item = &'a str>) -> ApiPath {
        let mut path = String::from("/v1");
        for segment in segments {
            path.push('/');
            percent_encode(segment, &mut path);
        }
        ApiPath(path)
    }

    /// Adds `key=value` to the query.
    pub fn query(mut self, key: &str, value: impl fmt::Display) -> ApiPath {
        self.0.push(if self.0.contains('?') { '&' } else { '?' });
        percent_encode(key, &mut self.0);
        self.0.push('=');
        percent_encode(&value.to_string(), &mut self.0);
        self
    }

    /// Adds `key=value` when there is a value.
    pub fn query_opt(self, key: &str, value: Option<impl fmt::Display>) -> ApiPath {
        match value {
            Some(value) => self.query(key, value),
            None => self,
        }
    }

    /// The path and query as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A path written out whole, for fixed paths (`"/v1/health"`): it is sent as it is.
impl From<&str> for ApiPath {
    fn from(path: &str) -> ApiPath {
        ApiPath(path.to_owned())
    }
}

impl From<&String> for ApiPath {
    fn from(path: &String) -> ApiPath {
        ApiPath(path.clone())
    }
}

impl From<&ApiPath> for ApiPath {
    fn from(path: &ApiPath) -> ApiPath {
        path.clone()
    }
}

impl fmt::Display for ApiPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Appends `text` with every byte but the unreserved `A-Za-z0-9-_~` percent-encoded (`.` too,
/// so no segment reads as `.` or `..`).
fn percent_encode(text: &str, out: &mut String) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No agent answers: nothing does at the address, or the data directory the address was
    /// to be read from has none announced.
    #[error("{}", unreachable(address, reason, unannounced_in.as_deref()))]
    Unreachable {
        /// The agent's address (empty when none was announced).
        address: String,
        /// What the connection attempt said, or why no address could be read.
        reason: String,
        /// The data directory whose `agent.json` gave no address, if that was the trouble.
        unannounced_in: Option<PathBuf>,
    },
    /// The agent answered with an error.
    #[error("{message}")]
    Api {
        /// The HTTP status.
        status: StatusCode,
        /// The agent's message.
        message: String,
    },
    /// The answer could not be read.
    #[error("unexpected answer from the agent: {0}")]
    Protocol(String),
    /// The agent's token was to be read from its data directory, and could not be: the
    /// message names the file and why.
    #[error("{0}")]
    Token(String),
}

/// A client of one agent.
#[derive(Debug, Clone)]
pub struct Client {
    address: String,
    /// The data directory that announced no agent, and why, when that is known before trying.
    unannounced: Option<(PathBuf, String)>,
    token: Option<String>,
    /// Why the token kept in the agent's data directory could not be read, if it could not:
    /// every call fails as [`ClientError::Token`], saying so.
    token_unreadable: Option<String>,
    /// The token file looked for and not found, for the message of a 401.
    token_absent: Option<PathBuf>,
    /// The server it talks to, as a 401's message names it: `agent`, `fleet`.
    server: &'static str,
    /// The fleet leader's term its requests carry (`X-Wharf-Fleet-Term`), if any.
    fleet_term: Option<u64>,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    /// A client of the agent at `address` (`http://127.0.0.1:4747` or `127.0.0.1:4747`).
    pub fn new(address: &str, token: Option<String>) -> Client {
        let address = if address.contains("://") {
            address.trim_end_matches('/').to_owned()
        } else {
            format!("http://{address}")
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Client {
            address,
            unannounced: None,
            token,
            token_unreadable: None,
            token_absent: None,
            server: crate::api_token::AGENT.server,
            fleet_term: None,
            http,
        }
    }

    /// The same client, its requests carrying a fleet leader's term (see `wharf_node::fence`).
    pub fn with_fleet_term(mut self, term: Option<u64>) -> Client {
        self.fleet_term = term;
        self
    }

    /// The client of the agent whose data directory is `data_dir`: at the address it announced
    /// there (`agent.json`), presenting `token`, or else the token the agent keeps there
    /// ([`crate::agent_token`]).
    pub fn of_data_dir(data_dir: &Path, token: Option<String>) -> Client {
        let client = match AgentFile::read(data_dir) {
            Ok(Some(file)) => Client::new(&file.address, token),
            Ok(None) => Client::unannounced(
                data_dir,
                format!("there is no {}", AgentFile::path(data_dir).display()),
            ),
            Err(reason) => Client::unannounced(data_dir, reason),
        };
        client.with_token_of(data_dir)
    }

    /// This client, presenting the token the agent of `data_dir` keeps there unless it was
    /// given one. A token file that cannot be read (only the agent's user may) fails every
    /// call, naming the file; no file at all leaves the client without a token.
    pub fn with_token_of(self, data_dir: &Path) -> Client {
        self.with_token_in(crate::api_token::AGENT, data_dir)
    }

    /// This client, presenting the token kept in `file` of the server whose data directory is
    /// `data_dir` (an agent's, a fleet's) unless it was given one; as
    /// [`Client::with_token_of`].
    pub fn with_token_in(mut self, file: crate::api_token::TokenFile, data_dir: &Path) -> Client {
        self.server = file.server;
        if self.token.is_some() {
            return self;
        }
        match file.read(data_dir) {
            Ok(Some(token)) => self.token = Some(token),
            Ok(None) => self.token_absent = Some(file.path(data_dir)),
            Err(e) => self.token_unreadable = Some(e.to_string()),
        }
        self
    }

    /// A client of the agent of `data_dir`, which has announced no address (`reason` says
    /// why): every call fails as [`ClientError::Unreachable`], saying so.
    pub fn unannounced(data_dir: &Path, reason: String) -> Client {
        Client { unannounced: Some((data_dir.to_owned(), reason)), ..Client::new("", None) }
    }

    /// The agent's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends a request and returns the response, failing on an error status.
    pub async fn send(
        &self,
        method: Method,
        path: impl Into<ApiPath>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let path = path.into();
        if let Some((data_dir, reason)) = &self.unannounced {
            return Err(ClientError::Unreachable {
                address: String::new(),
                reason: reason.clone(),
                unannounced_in: Some(data_dir.clone()),
            });
        }
        if let Some(reason) = &self.token_unreadable {
            return Err(ClientError::Token(reason.clone()));
        }
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.address));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(term) = self.fleet_term {
            request = request.header(crate::fence::HEADER, term);
        }
        let (content_type, bytes) = body.unwrap_or(("application/json", Vec::new()));
        let request = request
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.http.request(request).await.map_err(|e| ClientError::Unreachable {
            address: self.address.clone(),
            reason: root_cause(&e),
            unannounced_in: None,
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let bytes = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| format!("{status}: {}", String::from_utf8_lossy(&bytes)));
        let message = match status {
            StatusCode::UNAUTHORIZED if self.token.is_none() => self.no_token_hint(message),
            _ => message,
        };
        Err(ClientError::Api { status, message })
    }

    /// What a user refused for want of a token can do about it.
    fn no_token_hint(&self, message: String) -> String {
        let looked = match &self.token_absent {
            Some(path) => format!(" (there is no {})", path.display()),
            None => String::new(),
        };
        let server = self.server;
        format!(
            "{message}; give the {server}'s token with --token or WHARF_TOKEN, or the {server}'s \
             data directory with --data-dir to read the token it keeps there{looked}"
        )
    }

    /// Sends a request and reads the whole answer.
    pub async fn call(
        &self,
        method: Method,
        path: impl Into<ApiPath>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Bytes, ClientError> {
        let response = self.send(method, path, body).await?;
        response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// A JSON request with a JSON answer.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: impl Into<ApiPath>,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
        let bytes = self.call(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Whether an agent answers (if it answers with an error, it is there): the error that
    /// says why not, if none does.
    pub async fn reach(&self) -> Result<(), ClientError> {
        match self.call(Method::GET, "/v1/health", None).await {
            Err(e @ ClientError::Unreachable { .. }) => Err(e),
            _ => Ok(()),
        }
    }
}

/// What [`ClientError::Unreachable`] says.
fn unreachable(address: &str, reason: &str, unannounced_in: Option<&Path>) -> String {
    match unannounced_in {
        Some(dir) => format!(
            "no wharf agent has announced its address in {dir}: {reason}; start one with \
             `wharf agent --data-dir {dir}`, or give the address with --address",
            dir = dir.display()
        ),
        None => {
            format!("no wharf agent answers at {address} ({reason}); start one with `wharf agent`")
        }
    }
}

fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_encode_each_segment_and_query_value() {
        let cases: &[(ApiPath, &str)] = &[
            (ApiPath::v1(["allocations"]), "/v1/allocations"),
            (ApiPath::v1(["allocations", "job-1", "stop"]), "/v1/allocations/job-1/stop"),
            (
                ApiPath::v1(["allocations", "../../v1/metrics"]),
                "/v1/allocations/%2E%2E%2F%2E%2E%2Fv1%2Fmetrics",
            ),
            (ApiPath::v1(["allocations", ".."]), "/v1/allocations/%2E%2E"),
            (
                ApiPath::v1(["allocations", "a", "logs", "web task?x=1#y"]),
                "/v1/allocations/a/logs/web%20task%3Fx%3D1%23y",
            ),
            (ApiPath::v1(["workers", "wörker"]), "/v1/workers/w%C3%B6rker"),
            (
                ApiPath::v1(["allocations"]).query("id", "a&b=c").query("wait", "1.5s"),
                "/v1/allocations?id=a%26b%3Dc&wait=1%2E5s",
            ),
            (
                ApiPath::v1(["x"]).query_opt("tail", Some(5)).query_opt("offset", None::<u64>),
                "/v1/x?tail=5",
            ),
        ];
        for (path, want) in cases {
            assert_eq!(path.as_str(), *want);
            assert!(path.as_str().parse::<hyper::Uri>().is_ok(), "{path} is a valid URI");
        }
    }
}
