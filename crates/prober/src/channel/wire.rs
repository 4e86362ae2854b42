//! The probe channel's wire format, spoken by [`ChannelExecutor`](super::ChannelExecutor) and
//! by the runner's channel server on the worker (`wharf probe-channel`).
//!
//! The server starts with one greeting line, [`GREETING`]. Then each request is one line,
//! `<seq> <deadline_ms> <stdin_len> <args>`, followed by `stdin_len` bytes of standard input;
//! `args` are the runner's arguments as the command mode would put them after the program
//! (plain or single-quoted words). Each answer is one line, `<seq> exit <status> <stdout_len>
//! <stderr_len>` (`status` is `-` for a command killed by a signal) followed by the two
//! outputs, or `<seq> unsupported` for a request the server does not answer itself (the client
//! then runs the command in a session of its own). Answers may come in any order; `seq` pairs
//! them with their requests. Lengths are bounded, so a confused peer is a broken channel, never
//! an allocation without bound.

use crate::executor::Output;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The first line a channel server prints: its protocol and version.
pub const GREETING: &str = "wharf-probe-channel 1";

/// The longest header line either side accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// The most standard input a request carries, and the most output an answer carries per stream.
pub const MAX_PAYLOAD: usize = 16 << 20;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The stream ended at a frame boundary.
    #[error("the channel closed")]
    Closed,
    /// Reading or writing failed.
    #[error("the channel failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not a frame.
    #[error("the channel sent {0}")]
    Garbled(String),
}

/// One request: the runner's arguments, their standard input and their deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Pairs the answer with the request.
    pub seq: u64,
    /// How long the server gives the request.
    pub deadline: Duration,
    /// The runner's arguments, as the command line has them.
    pub args: String,
    /// Standard input.
    pub stdin: Vec<u8>,
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The request ran, with this output.
    Exit(Output),
    /// The server does not run this request itself.
    Unsupported,
}

/// Reads one header line (without its newline); `Closed` at a clean end of stream.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<String, WireError> {
    let mut line = Vec::new();
    let read = (&mut *reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await?;
    if read == 0 {
        return Err(WireError::Closed);
    }
    if line.pop() != Some(b'\n') {
        return Err(WireError::Garbled(format!("a line over {MAX_LINE} bytes, or cut short")));
    }
    String::from_utf8(line).map_err(|_| WireError::Garbled("a line that is not UTF-8".into()))
}

async fn read_payload(
    reader: &mut (impl AsyncBufRead + Unpin),
    len: usize,
) -> Result<Vec<u8>, WireError> {
    let mut payload = vec![0; len];
    reader.read_exact(&mut payload).await?;
    Ok(payload)
}

fn number<T: std::str::FromStr>(field: Option<&str>, what: &str) -> Result<T, WireError> {
    field
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| WireError::Garbled(format!("no {what} where one was due")))
}

fn length(field: Option<&str>, what: &str) -> Result<usize, WireError> {
    let len: usize = number(field, what)?;
    if len > MAX_PAYLOAD {
        return Err(WireError::Garbled(format!("a {what} of {len} bytes (at most {MAX_PAYLOAD})")));
    }
    Ok(len)
}

/// Reads the server's greeting and checks it.
pub async fn read_greeting(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<(), WireError> {
    let line = read_line(reader).await?;
    if line == GREETING {
        Ok(())
    } else {
        let shown: String = line.chars().take(80).collect();
        Err(WireError::Garbled(format!("{shown:?} where {GREETING:?} was due")))
    }
}

/// Reads one request.
pub async fn read_request(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<Request, WireError> {
    let line = read_line(reader).await?;
    let mut fields = line.splitn(4, ' ');
    let seq = number(fields.next(), "request number")?;
    let deadline = Duration::from_millis(number(fields.next(), "deadline")?);
    let stdin_len = length(fields.next(), "standard input")?;
    let args = fields.next().unwrap_or_default().to_owned();
    let stdin = read_payload(reader, stdin_len).await?;
    Ok(Request { seq, deadline, args, stdin })
}

/// Writes one request (and flushes).
pub async fn write_request(
    writer: &mut (impl AsyncWrite + Unpin),
    request: &Request,
) -> Result<(), WireError> {
    if request.args.contains('\n') || request.stdin.len() > MAX_PAYLOAD {
        return Err(WireError::Garbled("a request that does not fit a frame".into()));
    }
    let millis = u64::try_from(request.deadline.as_millis()).unwrap_or(u64::MAX);
    let header = format!("{} {} {} {}\n", request.seq, millis, request.stdin.len(), request.args);
    let mut frame = header.into_bytes();
    frame.extend_from_slice(&request.stdin);
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one answer, with the number of the request it answers.
pub async fn read_answer(
    reader: &mut (impl AsyncBufRead + Unpin),
) -> Result<(u64, Answer), WireError> {
    let line = read_line(reader).await?;
    let mut fields = line.split(' ');
    let seq = number(fields.next(), "request number")?;
    match fields.next() {
        Some("unsupported") => Ok((seq, Answer::Unsupported)),
        Some("exit") => {
            let status = match fields.next() {
                Some("-") => None,
                field => Some(number(field, "exit status")?),
            };
            let stdout_len = length(fields.next(), "standard output")?;
            let stderr_len = length(fields.next(), "standard error")?;
            let stdout = read_payload(reader, stdout_len).await?;
            let stderr = read_payload(reader, stderr_len).await?;
            Ok((seq, Answer::Exit(Output { stdout, stderr, status })))
        }
        other => Err(WireError::Garbled(format!("an answer of kind {other:?}"))),
    }
}

/// The bytes of one answer, written at once by a server answering several requests together.
pub fn answer_frame(seq: u64, answer: &Answer) -> Vec<u8> {
    match answer {
        Answer::Unsupported => format!("{seq} unsupported\n").into_bytes(),
        Answer::Exit(output) => {
            let cut = |b: &[u8]| b[..b.len().min(MAX_PAYLOAD)].to_vec();
            let (stdout, stderr) = (cut(&output.stdout), cut(&output.stderr));
            let status = output.status.map_or_else(|| "-".to_owned(), |s| s.to_string());
            let mut frame =
                format!("{seq} exit {status} {} {}\n", stdout.len(), stderr.len()).into_bytes();
            frame.extend_from_slice(&stdout);
            frame.extend_from_slice(&stderr);
            frame
        }
    }
}

/// The words of `args` as a shell would take them, for words of plain characters and
/// single-quoted parts (what [`quote`](crate::quote) makes, and what
/// [`ChannelExecutor`](super::ChannelExecutor) sends), one space apart; `None` for anything
/// else, which is left to a shell.
pub fn words(args: &str) -> Option<Vec<String>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    let mut words = Vec::new();
    if args.is_empty() {
        return Some(words);
    }
    let mut chars = args.chars();
    let mut word = String::new();
    let mut started = false;
    loop {
        match chars.next() {
            None | Some(' ') if !started => return None,
            None => {
                words.push(std::mem::take(&mut word));
                return Some(words);
            }
            Some(' ') => {
                words.push(std::mem::take(&mut word));
                started = false;
            }
            Some('\'') => {
                started = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            Some(c) if plain(c) => {
                started = true;
                word.push(c);
            }
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn frames_round_trip() {
        let request = Request {
            seq: 7,
            deadline: Duration::from_millis(20_000),
            args: "--fleet-term 3 run --detach - --id 'job-1'".into(),
            stdin: b"[job]\nid = \"x\"\n".to_vec(),
        };
        let mut bytes = Vec::new();
        write_request(&mut bytes, &request).await.unwrap();
        let mut reader = BufReader::new(&bytes[..]);
        assert_eq!(read_request(&mut reader).await.unwrap(), request);
        assert!(matches!(read_request(&mut reader).await, Err(WireError::Closed)));

        let answers = [
            (
                1,
                Answer::Exit(Output {
                    stdout: b"a\nb\n".to_vec(),
                    stderr: b"w".to_vec(),
                    status: Some(3),
                }),
            ),
            (2, Answer::Unsupported),
            (3, Answer::Exit(Output { stdout: Vec::new(), stderr: Vec::new(), status: None })),
        ];
        let bytes: Vec<u8> = answers.iter().flat_map(|(seq, a)| answer_frame(*seq, a)).collect();
        let mut reader = BufReader::new(&bytes[..]);
        for expected in &answers {
            assert_eq!(&read_answer(&mut reader).await.unwrap(), expected);
        }
    }

    #[tokio::test]
    async fn garbage_is_refused_with_what_it_was() {
        let cases: &[(&[u8], &str)] = &[
            (b"x exit 0 0 0\n", "no request number"),
            (b"1 exit 0 99999999999 0\n", "a standard output of 99999999999 bytes"),
            (b"1 maybe\n", "an answer of kind Some(\"maybe\")"),
            (b"1 exit 0 5 0\nab", "early eof"),
        ];
        for (bytes, expected) in cases {
            let error = read_answer(&mut BufReader::new(*bytes)).await.unwrap_err().to_string();
            assert!(error.contains(expected), "{error} for {bytes:?}");
        }
        let long = vec![b'x'; MAX_LINE + 10];
        let error = read_answer(&mut BufReader::new(&long[..])).await.unwrap_err().to_string();
        assert!(error.contains("a line over"), "{error}");
        let error = read_greeting(&mut BufReader::new(&b"SSH-2.0 hello\n"[..])).await.unwrap_err();
        assert!(error.to_string().contains("where \"wharf-probe-channel 1\" was due"), "{error}");
    }

    #[test]
    fn words_take_off_single_quotes_and_refuse_the_rest() {
        assert_eq!(
            words("--data-dir '/a b/c' alloc list --probe").unwrap(),
            ["--data-dir", "/a b/c", "alloc", "list", "--probe"]
        );
        assert_eq!(words("").unwrap(), Vec::<String>::new());
        assert_eq!(words("'' x'y'z").unwrap(), ["", "xyz"]);
        for refused in ["a  b", "a ", " a", "$(x)", "'it'\\''s'", "a;b", "\"x\"", "'open"] {
            assert_eq!(words(refused), None, "{refused}");
        }
    }
}
