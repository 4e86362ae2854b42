//! The CLI's HTTP client for the agent's API.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers at the address.
    #[error("no wharf agent answers at {address} ({reason}); start one with `wharf agent`")]
    Unreachable {
        /// The agent's address.
        address: String,
        /// What the connection attempt said.
        reason: String,
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
}

/// A client of one agent.
#[derive(Debug, Clone)]
pub struct Client {
    address: String,
    /// Why no agent can be reached, when that is known before trying.
    absent: Option<String>,
    token: Option<String>,
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
        Client { address, absent: None, token, http }
    }

    /// A client of an agent known not to be there (`reason` says why); every call fails as
    /// [`ClientError::Unreachable`].
    pub fn absent(address: &str, reason: String) -> Client {
        Client { absent: Some(reason), ..Client::new(address, None) }
    }

    /// The agent's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends a request and returns the response, failing on an error status.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        if let Some(reason) = &self.absent {
            return Err(ClientError::Unreachable {
                address: self.address.clone(),
                reason: reason.clone(),
            });
        }
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.address));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let (content_type, bytes) = body.unwrap_or(("application/json", Vec::new()));
        let request = request
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.http.request(request).await.map_err(|e| ClientError::Unreachable {
            address: self.address.clone(),
            reason: root_cause(&e),
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
        Err(ClientError::Api { status, message })
    }

    /// Sends a request and reads the whole answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
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
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
        let bytes = self.call(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Whether an agent answers.
    pub async fn reachable(&self) -> bool {
        !matches!(
            self.call(Method::GET, "/v1/health", None).await,
            Err(ClientError::Unreachable { .. })
        )
    }
}

fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
