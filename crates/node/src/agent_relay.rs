//! One HTTP call to a worker's agent made by a command on the worker (`wharf agent-relay`), for
//! a fleet that reaches the worker only over SSH: the fleet writes the call on the command's
//! standard input and reads the answer, streamed, on its standard output. The command reaches
//! the agent as every runner command does, through its data directory and with the token the
//! agent keeps there, so no agent's token leaves its host.
//!
//! The frames: on standard input, one JSON line ([`RelayCall`]), then exactly `body_len` bytes
//! of body; on standard output, one JSON line ([`RelayAnswer`]), then the answer's body as it
//! comes, until it ends (a followed log ends when the fleet closes the session).

use crate::client::{Client, ClientError};
use hyper::Method;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest first line either side reads.
pub const MAX_HEAD: u64 = 64 * 1024;

/// The answer headers passed on: the body's type and Nomad's query headers.
pub const PASSED_ON: [&str; 4] =
    ["content-type", "x-nomad-index", "x-nomad-knownleader", "x-nomad-lastcontact"];

/// The call, as the fleet sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayCall {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path and query, such as `/v1/client/fs/cat/ID?path=alloc/x`.
    pub target: String,
    /// The body's type.
    pub content_type: String,
    /// How many bytes of body follow the line.
    pub body_len: usize,
}

/// The answer's head, as the command writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayAnswer {
    /// The agent's status, or 502 when the agent could not be reached.
    pub status: u16,
    /// The headers of [`PASSED_ON`] the answer had.
    pub headers: BTreeMap<String, String>,
}

/// Reads one JSON line of at most [`MAX_HEAD`] bytes.
pub async fn read_head<T: serde::de::DeserializeOwned>(
    input: &mut (impl tokio::io::AsyncBufRead + Unpin),
) -> anyhow::Result<T> {
    let mut line = Vec::new();
    (&mut *input).take(MAX_HEAD).read_until(b'\n', &mut line).await?;
    if line.last() != Some(&b'\n') {
        anyhow::bail!(
            "the frame's first line is missing, cut short or longer than {MAX_HEAD} bytes"
        );
    }
    Ok(serde_json::from_slice(&line)?)
}

async fn write_head(
    output: &mut (impl AsyncWrite + Unpin),
    head: &impl Serialize,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(head)?;
    line.push(b'\n');
    output.write_all(&line).await?;
    output.flush().await
}

/// Writes an answer of the relay's own: `status`, with `message` as its body.
async fn answer_text(
    output: &mut (impl AsyncWrite + Unpin),
    status: u16,
    message: &str,
) -> std::io::Result<()> {
    let headers = [("content-type".to_owned(), "text/plain; charset=utf-8".to_owned())];
    write_head(output, &RelayAnswer { status, headers: headers.into() }).await?;
    output.write_all(message.as_bytes()).await?;
    output.flush().await
}

/// Reads one call from `input`, makes it with `client`, and writes the answer to `output`,
/// its body as it comes, until it ends or `input` does (the fleet closed the session: a
/// followed log is not followed for no one). A call this cannot make (a body over `limit`
/// bytes, no method, a target that is not a path) is answered with the reason.
pub async fn serve(
    client: &Client,
    input: impl AsyncRead + Unpin,
    mut output: impl AsyncWrite + Unpin,
    limit: usize,
) -> anyhow::Result<()> {
    let mut input = BufReader::new(input);
    let call: RelayCall = read_head(&mut input).await?;
    if call.body_len > limit {
        let said =
            format!("the request body has {} bytes, more than the {limit} allowed", call.body_len);
        return Ok(answer_text(&mut output, 413, &said).await?);
    }
    let mut body = vec![0; call.body_len];
    input.read_exact(&mut body).await?;
    let Ok(method) = Method::from_bytes(call.method.as_bytes()) else {
        let said = format!("{:?} is not an HTTP method", call.method);
        return Ok(answer_text(&mut output, 400, &said).await?);
    };
    // The agent's address is put in front of it: only a path keeps the call on this host.
    if !call.target.starts_with('/') {
        let said = format!("{:?} is not a path", call.target);
        return Ok(answer_text(&mut output, 400, &said).await?);
    }
    let answer =
        client.send(method, call.target.as_str(), Some((call.content_type.as_str(), body))).await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(ClientError::Api { status, message }) => {
            let said = format!("{status}: ");
            let message = message.strip_prefix(&said).unwrap_or(&message);
            return Ok(answer_text(&mut output, status.as_u16(), message).await?);
        }
        Err(error) => {
            let said = format!("the agent does not answer: {error}");
            return Ok(answer_text(&mut output, 502, &said).await?);
        }
    };
    let (parts, mut body) = answer.into_parts();
    let headers = PASSED_ON
        .iter()
        .filter_map(|name| {
            let value = parts.headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect();
    write_head(&mut output, &RelayAnswer { status: parts.status.as_u16(), headers }).await?;
    let streamed = async {
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            if let Ok(data) = frame?.into_data() {
                output.write_all(&data).await?;
                output.flush().await?;
            }
        }
        anyhow::Ok(())
    };
    let closed = async {
        let mut rest = [0u8; 256];
        while matches!(input.read(&mut rest).await, Ok(read) if read > 0) {}
    };
    tokio::select! {
        streamed = streamed => streamed,
        () = closed => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the relay answers a call it cannot make, without reaching any agent.
    async fn answered(call: &str) -> (RelayAnswer, String) {
        let client = Client::new("127.0.0.1:9", None);
        let mut output = Vec::new();
        serve(&client, call.as_bytes(), &mut output, 16).await.unwrap();
        let mut reader = BufReader::new(output.as_slice());
        let head: RelayAnswer = read_head(&mut reader).await.unwrap();
        let mut body = String::new();
        reader.read_to_string(&mut body).await.unwrap();
        (head, body)
    }

    #[tokio::test]
    async fn a_call_the_relay_cannot_make_is_answered_with_the_reason() {
        let call = |method: &str, target: &str, body_len: usize| {
            let call = RelayCall {
                method: method.into(),
                target: target.into(),
                content_type: "application/json".into(),
                body_len,
            };
            format!("{}\n{}", serde_json::to_string(&call).unwrap(), "x".repeat(body_len.min(16)))
        };
        let (head, body) = answered(&call("GET", "/v1/x", 17)).await;
        assert_eq!(head.status, 413, "{body}");
        assert!(body.contains("17 bytes"), "{body}");
        let (head, body) = answered(&call("G T", "/v1/x", 0)).await;
        assert_eq!(head.status, 400, "{body}");
        let (head, body) = answered(&call("GET", "@elsewhere/v1/x", 0)).await;
        assert_eq!((head.status, body.contains("not a path")), (400, true), "{body}");
        let (head, body) = answered(&call("GET", "/v1/x", 0)).await;
        assert_eq!(head.status, 502, "no agent at 127.0.0.1:9: {body}");
        let client = Client::new("127.0.0.1:9", None);
        let error = serve(&client, &b"not json\n"[..], Vec::new(), 16).await.unwrap_err();
        assert!(error.to_string().contains("expected"), "{error}");
    }

    /// A first line is read up to [`MAX_HEAD`] bytes and no further: one that is longer, or
    /// that the peer cut short, is refused with the bound named, and what follows it is left
    /// unread.
    #[tokio::test]
    async fn a_first_line_longer_than_the_bound_or_cut_short_is_refused() {
        let call = RelayCall {
            method: "GET".into(),
            target: format!("/v1/{}", "x".repeat(MAX_HEAD as usize)),
            content_type: String::new(),
            body_len: 0,
        };
        let mut long = serde_json::to_vec(&call).unwrap();
        long.extend_from_slice(b"\nafter");
        let mut reader = BufReader::new(long.as_slice());
        let error = read_head::<RelayCall>(&mut reader).await.unwrap_err().to_string();
        assert!(error.contains(&format!("longer than {MAX_HEAD} bytes")), "{error}");
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest.len(), long.len() - MAX_HEAD as usize, "read past the bound");

        let cut = br#"{"method":"GET","target":"/v1/x""#;
        let error = read_head::<RelayCall>(&mut BufReader::new(&cut[..])).await.unwrap_err();
        assert!(error.to_string().contains("cut short"), "{error}");

        // A line of exactly the bound, its newline included, is read.
        let mut exact = serde_json::to_vec(&RelayCall { target: "/v1/".into(), ..call }).unwrap();
        let pad = MAX_HEAD as usize - exact.len() - 1;
        exact.splice(exact.len() - 1..exact.len() - 1, std::iter::repeat_n(b' ', pad));
        exact.push(b'\n');
        assert_eq!(exact.len() as u64, MAX_HEAD);
        let head: RelayCall = read_head(&mut BufReader::new(exact.as_slice())).await.unwrap();
        assert_eq!(head.target, "/v1/");
    }
}
