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

/// Reads one call from `input`, makes it with `client`, and writes the answer to `output`,
/// its body as it comes. Bodies over `limit` bytes are refused.
pub async fn serve(
    client: &Client,
    input: impl AsyncRead + Unpin,
    mut output: impl AsyncWrite + Unpin,
    limit: usize,
) -> anyhow::Result<()> {
    let mut input = BufReader::new(input);
    let call: RelayCall = read_head(&mut input).await?;
    if call.body_len > limit {
        anyhow::bail!("the call's body has {} bytes, more than the {limit} allowed", call.body_len);
    }
    let mut body = vec![0; call.body_len];
    input.read_exact(&mut body).await?;
    let method = Method::from_bytes(call.method.as_bytes())
        .map_err(|_| anyhow::anyhow!("{:?} is not an HTTP method", call.method))?;
    let text = |status: u16, message: String| {
        let headers = [("content-type".to_owned(), "text/plain; charset=utf-8".to_owned())];
        (RelayAnswer { status, headers: headers.into() }, message)
    };
    let answer =
        client.send(method, call.target.as_str(), Some((call.content_type.as_str(), body))).await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(ClientError::Api { status, message }) => {
            let said = format!("{status}: ");
            let (head, body) =
                text(status.as_u16(), message.strip_prefix(&said).unwrap_or(&message).to_owned());
            write_head(&mut output, &head).await?;
            output.write_all(body.as_bytes()).await?;
            return Ok(output.flush().await?);
        }
        Err(error) => {
            let (head, body) = text(502, format!("the agent does not answer: {error}"));
            write_head(&mut output, &head).await?;
            output.write_all(body.as_bytes()).await?;
            return Ok(output.flush().await?);
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
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(data) = frame?.into_data() {
            output.write_all(&data).await?;
            output.flush().await?;
        }
    }
    Ok(())
}
