//! The HTTP client under the EC2 instance set: hyper over HTTP or HTTPS (rustls on ring, the
//! system's roots), every request bounded by a deadline.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The request could not be sent or its answer not read.
    #[error("{0}")]
    Transport(String),
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// A client with a per-request deadline.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    deadline: Duration,
}

impl Http {
    /// A client whose requests (connect, send, read the answer) take at most `deadline`.
    pub(crate) fn new(deadline: Duration) -> Result<Http, String> {
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(deadline));
        connector.set_nodelay(true);
        let provider = rustls::crypto::ring::default_provider();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(std::sync::Arc::new(provider))
            .map_err(|e| format!("cannot load the system's TLS roots: {e}"))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Http { client, deadline })
    }

    /// Sends `request` and reads the whole answer.
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let exchange = async {
            let answer = self.client.request(request).await.map_err(|e| chain(&e))?;
            let status = answer.status();
            let body = answer.into_body().collect().await.map_err(|e| chain(&e))?.to_bytes();
            Ok::<_, String>((status, body))
        };
        match tokio::time::timeout(self.deadline, exchange).await {
            Ok(result) => result.map_err(HttpError::Transport),
            Err(_) => Err(HttpError::Timeout(self.deadline)),
        }
    }
}

/// The error's text with its causes: hyper's own says only "client error (Connect)".
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
