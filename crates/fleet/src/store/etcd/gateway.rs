//! A thin client of etcd's v3 API through its JSON gateway (`/v3/...` on the client port, in
//! every etcd since 3.4), over HTTP/1.1.
//!
//! The gateway speaks the gRPC API's messages in protobuf's JSON mapping: bytes are base64,
//! 64-bit integers are decimal strings, fields at their zero value are left out. Only the calls
//! the fleet store makes are here: ranges, puts, transactions with create-revision compares,
//! leases (grant, one keep-alive round) and the election service (campaign, leader).
//!
//! Why the gateway and not gRPC: a gRPC client needs etcd's `.proto` files compiled at build
//! time (`protoc`, or a protobuf compiler in Rust) and a gRPC stack (tonic, prost, h2, tower)
//! that nothing else in wharf uses. The gateway needs the HTTP client the workspace already
//! has, and every call the store makes is one request and one answer. docs/ARCHITECTURE.md
//! says more.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The calls that may be sent twice with the effect of one.
const IDEMPOTENT: [&str; 3] = ["/v3/kv/range", "/v3/election/leader", "/v3/lease/keepalive"];

/// Why a call to etcd failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GatewayError {
    /// No member answered: each one's connection failed.
    Unreachable(String),
    /// etcd answered with an error: its gRPC code and message.
    Status { code: i32, message: String },
    /// The answer was not what the API defines.
    Protocol(String),
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayError::Unreachable(why) => write!(f, "no member answers: {why}"),
            GatewayError::Status { code, message } => write!(f, "{message} (code {code})"),
            GatewayError::Protocol(why) => write!(f, "unexpected answer: {why}"),
        }
    }
}

/// A client of one etcd cluster, through any of its members.
pub(crate) struct Gateway {
    /// Each member's base URL, `http://host:port`.
    members: Vec<String>,
    /// The member that answered last: calls go there first.
    preferred: AtomicUsize,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway").field("members", &self.members).finish_non_exhaustive()
    }
}

/// `host:port` or `http://host:port`, as a base URL. HTTPS is not spoken: the store's
/// endpoints are refused at connect if they ask for it.
fn base_url(endpoint: &str) -> Result<String, String> {
    let trimmed = endpoint.trim_end_matches('/');
    if trimmed.starts_with("https://") {
        return Err(format!("{endpoint:?}: TLS to etcd is not supported; use http://"));
    }
    let rest = trimmed.strip_prefix("http://").unwrap_or(trimmed);
    if rest.is_empty() || rest.contains('/') {
        return Err(format!("{endpoint:?} is not host:port or http://host:port"));
    }
    Ok(format!("http://{rest}"))
}

impl Gateway {
    /// A client of the members at `endpoints`. Connections are made on first use.
    pub(crate) fn new(endpoints: &[String], connect_timeout: Duration) -> Result<Gateway, String> {
        if endpoints.is_empty() {
            return Err("no endpoints".into());
        }
        let members = endpoints.iter().map(|e| base_url(e)).collect::<Result<Vec<_>, _>>()?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        // A follower's campaign waits on one connection for as long as another leads: a peer
        // that vanished without a word is noticed by the kernel's keep-alive probes.
        connector.set_keepalive(Some(Duration::from_secs(5)));
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Gateway { members, preferred: AtomicUsize::new(0), http })
    }

    /// Posts `request` to `path` on the preferred member, or on the next ones while a member's
    /// connection fails. An answer, even an error, comes from the member that gave it: a call
    /// that reached a member is never sent again to another.
    async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        path: &str,
        request: &Q,
    ) -> Result<A, GatewayError> {
        let body = Bytes::from(
            serde_json::to_vec(request).map_err(|e| GatewayError::Protocol(e.to_string()))?,
        );
        let first = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for step in 0..self.members.len() {
            let index = (first + step) % self.members.len();
            let member = &self.members[index];
            let send = || {
                let request = Request::builder()
                    .method(Method::POST)
                    .uri(format!("{member}{path}"))
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .map_err(|e| GatewayError::Protocol(e.to_string()))?;
                Ok::<_, GatewayError>(self.http.request(request))
            };
            let mut sent = send()?.await;
            // A connection the member reset after the request went out may or may not have
            // carried it: a read (or a lease's keep-alive) is asked again, once; a write is not,
            // since it may have been applied.
            if let Err(error) = &sent
                && !error.is_connect()
                && IDEMPOTENT.contains(&path)
            {
                tracing::debug!(%member, path, error = %error_chain(error), "asking etcd again");
                sent = send()?.await;
            }
            let answer = match sent {
                Ok(answer) => answer,
                Err(error) if error.is_connect() => {
                    failures.push(format!("{member}: {}", error_chain(&error)));
                    continue;
                }
                Err(error) => {
                    return Err(GatewayError::Unreachable(format!(
                        "{member}: {}",
                        error_chain(&error)
                    )));
                }
            };
            self.preferred.store(index, Ordering::Relaxed);
            let status = answer.status();
            let bytes = answer
                .into_body()
                .collect()
                .await
                .map_err(|e| GatewayError::Unreachable(format!("{member}: {e}")))?
                .to_bytes();
            return decode_answer(status, &bytes);
        }
        Err(GatewayError::Unreachable(failures.join("; ")))
    }

    /// The keys in `[key, range_end)` (or `key` alone), at most `limit` of them (0: all).
    pub(crate) async fn range(
        &self,
        key: &[u8],
        range_end: Option<&[u8]>,
        limit: i64,
    ) -> Result<RangeAnswer, GatewayError> {
        let request = RangeRequest {
            key: Base64(key.to_vec()),
            range_end: range_end.map(|end| Base64(end.to_vec())),
            limit: Int64(limit),
        };
        self.call("/v3/kv/range", &request).await
    }

    /// Stores `value` at `key`, on `lease` if not 0.
    pub(crate) async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<(), GatewayError> {
        let request = PutRequest {
            key: Base64(key.to_vec()),
            value: Base64(value.to_vec()),
            lease: Int64(lease),
        };
        self.call::<_, Ignored>("/v3/kv/put", &request).await.map(drop)
    }

    /// Applies `success` if `key` was created at `create_revision`; says whether it did.
    pub(crate) async fn txn_if_created_at(
        &self,
        key: &[u8],
        create_revision: i64,
        success: Vec<Operation>,
    ) -> Result<bool, GatewayError> {
        let request = TxnRequest {
            compare: vec![Compare {
                key: Base64(key.to_vec()),
                target: "CREATE",
                result: "EQUAL",
                create_revision: Int64(create_revision),
            }],
            success: success.into_iter().map(Operation::into_request).collect(),
        };
        let answer: TxnAnswer = self.call("/v3/kv/txn", &request).await?;
        Ok(answer.succeeded)
    }

    /// A new lease of `ttl`; its id.
    pub(crate) async fn lease_grant(&self, ttl: Duration) -> Result<i64, GatewayError> {
        let request = LeaseGrantRequest { ttl: Int64(ttl.as_secs() as i64) };
        let answer: LeaseGrantAnswer = self.call("/v3/lease/grant", &request).await?;
        if !answer.error.is_empty() {
            return Err(GatewayError::Status { code: 0, message: answer.error });
        }
        Ok(answer.id.0)
    }

    /// Renews lease `id` once; its remaining TTL, which is 0 if it has expired.
    pub(crate) async fn lease_keep_alive(&self, id: i64) -> Result<Duration, GatewayError> {
        // The gRPC call is a stream; through the gateway, a request body with one message is
        // a stream of one, answered by one `result`.
        let answer: StreamResult<LeaseKeepAliveAnswer> =
            self.call("/v3/lease/keepalive", &LeaseId { id: Int64(id) }).await?;
        let result = answer.into_result()?;
        Ok(Duration::from_secs(result.ttl.0.max(0) as u64))
    }

    /// Waits until this lease's candidate leads election `name`, then returns its leader key.
    /// Dropping the future closes the connection, and etcd withdraws the candidate.
    pub(crate) async fn campaign(
        &self,
        name: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<LeaderKey, GatewayError> {
        let request = CampaignRequest {
            name: Base64(name.to_vec()),
            lease: Int64(lease),
            value: Base64(value.to_vec()),
        };
        let answer: CampaignAnswer = self.call("/v3/election/campaign", &request).await?;
        answer.leader.ok_or_else(|| GatewayError::Protocol("a campaign won no leader key".into()))
    }

    /// The current leader's key and value in election `name`, if any.
    pub(crate) async fn leader(&self, name: &[u8]) -> Result<Option<KeyValue>, GatewayError> {
        let request = LeaderRequest { name: Base64(name.to_vec()) };
        match self.call::<_, LeaderAnswer>("/v3/election/leader", &request).await {
            Ok(answer) => Ok(answer.kv),
            // etcd says so as an error (`ErrElectionNoLeader`), not as an empty answer.
            Err(GatewayError::Status { message, .. }) if message.contains("no leader") => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The error's text with its causes: hyper's own says only "client error (Connect)".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An answer's body as `A`, or the error etcd sent instead.
fn decode_answer<A: DeserializeOwned>(status: StatusCode, bytes: &[u8]) -> Result<A, GatewayError> {
    if !status.is_success() {
        return Err(match serde_json::from_slice::<ErrorAnswer>(bytes) {
            Ok(error) => GatewayError::Status {
                code: error.code,
                message: if error.message.is_empty() { error.error } else { error.message },
            },
            Err(_) => GatewayError::Protocol(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            )),
        });
    }
    serde_json::from_slice(bytes).map_err(|e| {
        GatewayError::Protocol(format!(
            "{e}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })
}

/// Bytes, as protobuf's JSON mapping writes them: standard base64.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Base64(pub(crate) Vec<u8>);

impl Serialize for Base64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&BASE64.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Base64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Base64, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        BASE64.decode(text.as_bytes()).map(Base64).map_err(serde::de::Error::custom)
    }
}

/// A 64-bit integer, as protobuf's JSON mapping writes it: a decimal string (a number is
/// accepted too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Int64(pub(crate) i64);

impl Serialize for Int64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Int64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Int64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either<'a> {
            Number(i64),
            Text(#[serde(borrow)] std::borrow::Cow<'a, str>),
        }
        match Either::deserialize(deserializer)? {
            Either::Number(n) => Ok(Int64(n)),
            Either::Text(text) => text.parse().map(Int64).map_err(serde::de::Error::custom),
        }
    }
}

/// An answer whose content the caller does not need.
#[derive(Deserialize)]
struct Ignored {}

/// What the gateway sends instead of an answer.
#[derive(Deserialize)]
struct ErrorAnswer {
    #[serde(default)]
    error: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: i32,
}

/// One message of a streamed answer: a result or an error.
#[derive(Deserialize)]
struct StreamResult<T> {
    result: Option<T>,
    error: Option<ErrorAnswer>,
}

impl<T> StreamResult<T> {
    fn into_result(self) -> Result<T, GatewayError> {
        match (self.result, self.error) {
            (_, Some(error)) => Err(GatewayError::Status {
                code: error.code,
                message: if error.message.is_empty() { error.error } else { error.message },
            }),
            (Some(result), None) => Ok(result),
            (None, None) => Err(GatewayError::Protocol("a stream message with no result".into())),
        }
    }
}

/// A key and its value, as stored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct KeyValue {
    pub(crate) key: Base64,
    pub(crate) create_revision: Int64,
    pub(crate) value: Base64,
    pub(crate) lease: Int64,
}

#[derive(Serialize)]
struct RangeRequest {
    key: Base64,
    #[serde(skip_serializing_if = "Option::is_none")]
    range_end: Option<Base64>,
    limit: Int64,
}

/// The keys a range found.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RangeAnswer {
    pub(crate) kvs: Vec<KeyValue>,
    /// More keys are in the range than the limit let through.
    pub(crate) more: bool,
}

#[derive(Serialize)]
struct PutRequest {
    key: Base64,
    value: Base64,
    lease: Int64,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Operation {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

impl Operation {
    fn into_request(self) -> RequestOp {
        match self {
            Operation::Put { key, value } => RequestOp {
                request_put: Some(PutRequest {
                    key: Base64(key),
                    value: Base64(value),
                    lease: Int64(0),
                }),
                request_delete_range: None,
            },
            Operation::Delete { key } => RequestOp {
                request_put: None,
                request_delete_range: Some(DeleteRequest { key: Base64(key) }),
            },
        }
    }
}

#[derive(Serialize)]
struct RequestOp {
    #[serde(skip_serializing_if = "Option::is_none")]
    request_put: Option<PutRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_delete_range: Option<DeleteRequest>,
}

#[derive(Serialize)]
struct DeleteRequest {
    key: Base64,
}

#[derive(Serialize)]
struct Compare {
    key: Base64,
    target: &'static str,
    result: &'static str,
    create_revision: Int64,
}

#[derive(Serialize)]
struct TxnRequest {
    compare: Vec<Compare>,
    success: Vec<RequestOp>,
}

#[derive(Deserialize)]
struct TxnAnswer {
    #[serde(default)]
    succeeded: bool,
}

#[derive(Serialize)]
struct LeaseGrantRequest {
    #[serde(rename = "TTL")]
    ttl: Int64,
}

#[derive(Deserialize)]
struct LeaseGrantAnswer {
    #[serde(rename = "ID", default)]
    id: Int64,
    #[serde(default)]
    error: String,
}

#[derive(Serialize)]
struct LeaseId {
    #[serde(rename = "ID")]
    id: Int64,
}

#[derive(Deserialize)]
struct LeaseKeepAliveAnswer {
    #[serde(rename = "TTL", default)]
    ttl: Int64,
}

#[derive(Serialize)]
struct CampaignRequest {
    name: Base64,
    lease: Int64,
    value: Base64,
}

/// A leader's key in an election: its name, and the revision it was created at (its term).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LeaderKey {
    pub(crate) key: Base64,
    pub(crate) rev: Int64,
    pub(crate) lease: Int64,
}

#[derive(Deserialize)]
struct CampaignAnswer {
    leader: Option<LeaderKey>,
}

#[derive(Serialize)]
struct LeaderRequest {
    name: Base64,
}

#[derive(Deserialize)]
struct LeaderAnswer {
    kv: Option<KeyValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_base_urls() {
        assert_eq!(base_url("127.0.0.1:2379").unwrap(), "http://127.0.0.1:2379");
        assert_eq!(base_url("http://etcd:2379/").unwrap(), "http://etcd:2379");
        assert!(base_url("https://etcd:2379").unwrap_err().contains("TLS"));
        assert!(base_url("http://etcd:2379/v3").is_err());
        assert!(base_url("").is_err());
    }

    #[test]
    fn integers_and_bytes_read_as_the_gateway_writes_them() {
        let kv: KeyValue = serde_json::from_str(
            r#"{"key":"L2E=","create_revision":"7","mod_revision":"9","version":"1","value":"eA=="}"#,
        )
        .unwrap();
        assert_eq!(kv.key.0, b"/a");
        assert_eq!(kv.create_revision, Int64(7));
        assert_eq!(kv.value.0, b"x");
        assert_eq!(kv.lease, Int64(0), "a field at zero is left out");
        let answer: RangeAnswer = serde_json::from_str(r#"{"header":{"revision":"2"}}"#).unwrap();
        assert!(answer.kvs.is_empty() && !answer.more);
        assert_eq!(serde_json::to_string(&Int64(-3)).unwrap(), r#""-3""#);
        assert!(serde_json::from_str::<KeyValue>(r#"{"key":"***"}"#).is_err());
    }

    #[test]
    fn errors_carry_etcds_message() {
        let error = decode_answer::<Ignored>(
            StatusCode::INTERNAL_SERVER_ERROR,
            br#"{"error":"election: no leader","message":"election: no leader","code":2}"#,
        )
        .err()
        .unwrap();
        assert_eq!(error, GatewayError::Status { code: 2, message: "election: no leader".into() });
        let error = decode_answer::<Ignored>(StatusCode::BAD_GATEWAY, b"<html>").err().unwrap();
        assert!(matches!(error, GatewayError::Protocol(text) if text.contains("502")));
    }
}
