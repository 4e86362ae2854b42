//! A Nomad call sent on to another server of it (the leading replica, a worker's agent) and
//! its answer brought back as it comes: its status, its body's type, Nomad's query headers,
//! and its body streamed (a followed log or the event stream never ends). A refusal comes
//! back as the other server said it, in Nomad's words; one that cannot be reached is a 502.

use crate::client::{Client, ClientError};
use crate::nomad_http::{NomadApiError, NomadResult};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, StatusCode, header};
use axum::response::Response;

/// The headers of an answer passed on.
const PASSED_ON: [&str; 4] = crate::agent_relay::PASSED_ON;

/// The longest the other server may take to start its answer: a blocking query's longest
/// wait, and some. A streamed body (a followed log, the event stream) goes on past it.
const ANSWER_LIMIT: std::time::Duration =
    crate::nomad_http::MAX_WAIT.saturating_add(std::time::Duration::from_secs(30));

/// A call to send on: its method, its target (path and query), its body's type and its body.
struct Call {
    method: axum::http::Method,
    target: String,
    content_type: String,
    body: Vec<u8>,
}

impl Call {
    /// `request` sent on to `path` (or its own path), with its query; a body over `limit`
    /// bytes is refused.
    async fn of(request: Request, path: Option<String>, limit: usize) -> NomadResult<Call> {
        let (parts, body) = request.into_parts();
        let path = path.unwrap_or_else(|| parts.uri.path().to_owned());
        let target = match parts.uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
            NomadApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is larger than {limit} bytes"),
            )
        })?;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_owned();
        Ok(Call { method: parts.method, target, content_type, body: body.to_vec() })
    }
}

/// Sends `request` (its method, query, body and body's type) to `client`'s server, at `path`
/// or the request's own path; `who` names that server in errors. Bodies over `limit` bytes
/// are refused.
pub(super) async fn relay(
    client: &Client,
    who: &str,
    request: Request,
    path: Option<String>,
    limit: usize,
) -> NomadResult<Response> {
    let call = Call::of(request, path, limit).await?;
    let sent =
        client.send(call.method, call.target.as_str(), Some((&call.content_type, call.body)));
    let Ok(answer) = tokio::time::timeout(ANSWER_LIMIT, sent).await else {
        return Err(NomadApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("{who} did not answer within {ANSWER_LIMIT:?}"),
        ));
    };
    match answer {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut response = Response::new(Body::new(body));
            *response.status_mut() = parts.status;
            for name in PASSED_ON {
                if let Some(value) = parts.headers.get(name) {
                    response.headers_mut().insert(HeaderName::from_static(name), value.clone());
                }
            }
            Ok(response)
        }
        Err(ClientError::Api { status, message }) => {
            let said = format!("{status}: ");
            Err(NomadApiError::new(status, message.strip_prefix(&said).unwrap_or(&message)))
        }
        Err(error) => Err(NomadApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{who} does not answer: {error}"),
        )),
    }
}

/// A worker's agent's answer through its relay: the head, then the body still to be read
/// (what keeps the session rides along).
type Relayed = (
    crate::agent_relay::RelayAnswer,
    tokio::io::BufReader<std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>>,
    (std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>, Box<dyn Send + Sync>),
);

/// Makes `call` (with `body`) on a worker's agent through `relay` (`wharf agent-relay` in a
/// session of the worker's SSH connection) and reads the answer's head; `who` names the agent
/// in errors.
async fn call_over_ssh(
    relay: &crate::fleet::wiring::AgentRelay,
    who: &str,
    call: &crate::agent_relay::RelayCall,
    body: &[u8],
) -> NomadResult<Relayed> {
    use crate::agent_relay::read_head;
    use tokio::io::AsyncWriteExt;
    let unreachable = |why: String| {
        NomadApiError::new(StatusCode::BAD_GATEWAY, format!("{who} cannot be reached: {why}"))
    };
    let answered = async {
        let session = relay.open(ANSWER_LIMIT).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut input, output, keep) = (session.input, session.output, session.keep);
        let mut line = serde_json::to_vec(call).map_err(NomadApiError::internal)?;
        line.push(b'\n');
        line.extend_from_slice(body);
        input.write_all(&line).await.map_err(|e| unreachable(e.to_string()))?;
        input.flush().await.map_err(|e| unreachable(e.to_string()))?;
        let mut output = tokio::io::BufReader::new(output);
        let head = read_head(&mut output)
            .await
            .map_err(|e| unreachable(format!("its relay said: {e}")))?;
        Ok((head, output, (input, keep)))
    };
    tokio::time::timeout(ANSWER_LIMIT, answered).await.unwrap_or_else(|_| {
        Err(NomadApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("{who} did not answer within {ANSWER_LIMIT:?}"),
        ))
    })
}

/// Sends `request` (its method, query, body and body's type) to a worker's agent at `path`
/// through `relay`, and streams the answer back; `who` names the agent in errors. Bodies over
/// `limit` bytes are refused.
pub(super) async fn relay_over_ssh(
    relay: &crate::fleet::wiring::AgentRelay,
    who: &str,
    request: Request,
    path: String,
    limit: usize,
) -> NomadResult<Response> {
    use tokio::io::AsyncReadExt;
    let call = Call::of(request, Some(path), limit).await?;
    let relayed = crate::agent_relay::RelayCall {
        method: call.method.to_string(),
        target: call.target,
        content_type: call.content_type,
        body_len: call.body.len(),
    };
    let (head, output, session) = call_over_ssh(relay, who, &relayed, &call.body).await?;
    // The body as it comes; the session (its input and what keeps it) lives as long.
    let body = futures_util::stream::unfold(Some((output, session)), |state| async move {
        let (mut output, session) = state?;
        let mut buffer = vec![0; 16 * 1024];
        match output.read(&mut buffer).await {
            Ok(0) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((Ok(axum::body::Bytes::from(buffer)), Some((output, session))))
            }
            Err(error) => Some((Err(error), None)),
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for name in PASSED_ON {
        if let Some(value) = head.headers.get(name).and_then(|v| v.parse().ok()) {
            response.headers_mut().insert(HeaderName::from_static(name), value);
        }
    }
    Ok(response)
}

/// The JSON a worker's agent answers a GET of `path` with, through `relay`: at most `limit`
/// bytes of it.
pub(super) async fn read_over_ssh(
    relay: &crate::fleet::wiring::AgentRelay,
    who: &str,
    path: &str,
    limit: u64,
) -> NomadResult<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let call = crate::agent_relay::RelayCall {
        method: "GET".into(),
        target: path.to_owned(),
        content_type: "application/json".into(),
        body_len: 0,
    };
    let (head, output, _session) = call_over_ssh(relay, who, &call, &[]).await?;
    let mut body = Vec::new();
    let mut output = output.take(limit.saturating_add(1));
    tokio::time::timeout(ANSWER_LIMIT, output.read_to_end(&mut body))
        .await
        .map_err(|_| NomadApiError::new(StatusCode::GATEWAY_TIMEOUT, format!("{who} stalled")))?
        .map_err(|e| NomadApiError::new(StatusCode::BAD_GATEWAY, format!("{who}: {e}")))?;
    if body.len() as u64 > limit {
        let said = format!("{who} answered {path} with more than {limit} bytes");
        return Err(NomadApiError::new(StatusCode::BAD_GATEWAY, said));
    }
    if head.status != 200 {
        let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
        return Err(NomadApiError::new(status, String::from_utf8_lossy(&body).into_owned()));
    }
    Ok(body)
}
