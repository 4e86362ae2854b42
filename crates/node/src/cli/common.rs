//! What every subcommand of the `wharf` command line shares: the exit codes and the errors
//! that choose them ([`exit_code`]), how an error reads ([`describe`]), the global flags as
//! the subcommands apply them, logging, the node's configuration as the flags change it, the
//! `--address` a server listens on, and reading a job spec.
//!
//! Every subcommand, the agent's (`cli::*`) and the fleet's (`fleet::cli::*`), imports its
//! pieces from here and nothing from the module that dispatches to it, so no two CLI files
//! refer to each other. [`crate::serve`] takes its `UsageError` from here too.

// A command line's output is its interface.
#![allow(clippy::print_stderr)]

use crate::client::ClientError;
use crate::config::NodeConfig;
use std::path::Path;

/// Exit code: the allocation failed or was lost.
pub const EXIT_ALLOC_FAILED: u8 = 1;
/// Exit code: bad usage or an invalid job spec.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the agent could not be reached or refused.
pub const EXIT_AGENT: u8 = 3;
/// Exit code: interrupted twice.
pub const EXIT_INTERRUPTED: u8 = 130;

/// The user asked for something that cannot be done as asked (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// What was asked was done, but did not end as hoped (exit 1): the command failed, the
/// allocation has not stopped in time.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotDone(pub(crate) String);

/// A job spec file that cannot be read as text (exit 2).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpecFileError {
    /// Missing, unreadable, a directory.
    #[error("cannot read the job spec {file}: {source}")]
    Read {
        /// The file, or "standard input".
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// Bytes that are not UTF-8.
    #[error("the job spec {file} is not UTF-8 text: bad bytes at line {line}, column {column}")]
    NotUtf8 {
        /// The file, or "standard input".
        file: String,
        /// The line of the first bad byte, from 1.
        line: usize,
        /// Its column, in characters from 1.
        column: usize,
    },
}

/// The exit code for `error`: the first cause in its chain that says.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            return match client {
                ClientError::Api { status, .. }
                    if status.is_client_error()
                        && *status != hyper::StatusCode::UNAUTHORIZED
                        && *status != hyper::StatusCode::FORBIDDEN =>
                {
                    EXIT_USAGE
                }
                _ => EXIT_AGENT,
            };
        }
        if cause.is::<NotDone>() {
            return EXIT_ALLOC_FAILED;
        }
        if cause.is::<UsageError>()
            || cause.is::<SpecFileError>()
            || cause.is::<crate::config::ConfigError>()
            || cause.is::<wharf_state::SpecError>()
            || cause.is::<wharf_state::InvalidAllocId>()
            || cause.is::<wharf_state::duration::DurationError>()
        {
            return EXIT_USAGE;
        }
    }
    EXIT_AGENT
}

/// `error` and its causes in one line, each said once: a cause whose text the message
/// already holds (most of ours name their source inline) is not repeated.
pub fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// The global flags (or their environment variables) as the subcommands apply them: a server
/// (`wharf agent`, `wharf fleet`) takes them over its configuration file, the commands that
/// talk to one find it and its token with them.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalFlags<'a> {
    /// `--address`: where a server listens, over `bind`.
    pub address: Option<&'a str>,
    /// `--data-dir`: a server's files, over `data_dir`.
    pub data_dir: Option<&'a Path>,
    /// `--token`: what a server's API requires, over `token`; what the commands present.
    pub token: Option<&'a str>,
    /// `--json`: JSON output (for a server: JSON log lines).
    pub json: bool,
}

/// Logs to stderr, as text or JSON lines, at the levels `RUST_LOG` asks for (`info`, or
/// `wharf_fleet=debug,info`: a level per target, as a prefix of the module path), `info`
/// without it.
pub(crate) fn init_logs(json: bool) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let default = || Targets::new().with_default(LevelFilter::INFO);
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => text.parse::<Targets>().unwrap_or_else(|error| {
            eprintln!("RUST_LOG={text:?} is not a list of target=level: {error}; logging at info");
            default()
        }),
        _ => default(),
    };
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = tracing_subscriber::registry().with(filter);
    if json {
        logs.with(layer.json()).init();
    } else {
        logs.with(layer).init();
    }
}

/// The node configuration from `--config` (or defaults), with `--data-dir` applied.
pub(crate) fn node_config(
    config: Option<&Path>,
    data_dir: Option<&Path>,
) -> anyhow::Result<NodeConfig> {
    let mut config = match config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    if let Some(data_dir) = data_dir {
        config.data_dir = data_dir.to_owned();
    }
    Ok(config)
}

/// The address `--address` asks the agent (or the fleet) to listen on: `127.0.0.1:4747`, or
/// the same as a URL (`http://127.0.0.1:4747`), as the other commands take it.
pub(crate) fn listen_address(text: &str) -> Result<std::net::SocketAddr, UsageError> {
    let bare = text.strip_prefix("http://").unwrap_or(text).trim_end_matches('/');
    bare.parse().map_err(|_| {
        UsageError(format!(
            "--address: the agent cannot listen on {text:?}; give an IP address and port, such \
             as 127.0.0.1:4747 (port 0: one the system picks)"
        ))
    })
}

/// Reads and checks a job spec; `-` is standard input (JSON if it starts with `{`).
pub(crate) fn read_spec(file: &Path) -> anyhow::Result<wharf_state::Job> {
    let text = read_text(file)?;
    parse_spec(file, &text)
}

/// A job spec given as the bytes of standard input, read by someone else (the probe channel
/// reads a start's standard input from its own stream): as `read_spec` takes `-`.
pub(crate) fn spec_of_stdin(bytes: Vec<u8>) -> anyhow::Result<wharf_state::Job> {
    let file = Path::new("-");
    let text = String::from_utf8(bytes)
        .map_err(|e| not_utf8(spec_name(file), e.as_bytes(), e.utf8_error()))?;
    parse_spec(file, &text)
}

fn parse_spec(file: &Path, text: &str) -> anyhow::Result<wharf_state::Job> {
    let stdin = file == Path::new("-");
    let json = if stdin {
        text.trim_start().starts_with('{')
    } else {
        file.extension().is_some_and(|e| e == "json")
    };
    let parsed = if json {
        wharf_state::spec::parse_json(text)
    } else {
        wharf_state::spec::parse_toml(text)
    };
    parsed.map_err(|e| {
        anyhow::Error::new(e).context(format!("{} is not a valid job spec", spec_name(file)))
    })
}

/// How messages name a job spec file.
fn spec_name(file: &Path) -> String {
    if file == Path::new("-") { "standard input".to_owned() } else { file.display().to_string() }
}

/// The text of a job spec file (`-`: standard input), or what keeps it from being read.
fn read_text(file: &Path) -> Result<String, SpecFileError> {
    let name = spec_name(file);
    let bytes = if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes).map(|_| bytes)
    } else {
        std::fs::read(file)
    };
    let bytes = bytes.map_err(|source| SpecFileError::Read { file: name.clone(), source })?;
    String::from_utf8(bytes).map_err(|e| not_utf8(name, e.as_bytes(), e.utf8_error()))
}

/// Where in `bytes` the first byte that is not UTF-8 is, as a person finds it in an editor.
fn not_utf8(file: String, bytes: &[u8], error: std::str::Utf8Error) -> SpecFileError {
    let valid = &bytes[..error.valid_up_to()];
    // Valid UTF-8 up to there, so the line and column count characters.
    let before = std::str::from_utf8(valid).unwrap_or_default();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    SpecFileError::NotUtf8 {
        file,
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn api(status: StatusCode) -> anyhow::Error {
        ClientError::Api { status, message: "refused".into() }.into()
    }

    /// Which exit code each kind of failure ends with (the README's table): the first cause
    /// in the chain that says decides, whatever context was added around it.
    #[test]
    fn exit_code_table() {
        let usage = || anyhow::Error::new(UsageError("bad".into()));
        let table: Vec<(&str, anyhow::Error, u8)> = vec![
            ("a usage error", usage(), EXIT_USAGE),
            ("a usage error under context", usage().context("while running"), EXIT_USAGE),
            ("not done", NotDone("still stopping".into()).into(), EXIT_ALLOC_FAILED),
            (
                "an unreadable spec file",
                SpecFileError::NotUtf8 { file: "job.toml".into(), line: 1, column: 2 }.into(),
                EXIT_USAGE,
            ),
            ("a bad id", wharf_state::check_alloc_id("../x").unwrap_err().into(), EXIT_USAGE),
            (
                "a bad duration",
                wharf_state::duration::parse("soon").unwrap_err().into(),
                EXIT_USAGE,
            ),
            ("the agent calls it wrong (400)", api(StatusCode::BAD_REQUEST), EXIT_USAGE),
            ("the agent knows no such thing (404)", api(StatusCode::NOT_FOUND), EXIT_USAGE),
            ("the agent wants a token (401)", api(StatusCode::UNAUTHORIZED), EXIT_AGENT),
            ("the agent refuses the token (403)", api(StatusCode::FORBIDDEN), EXIT_AGENT),
            ("the agent failed (500)", api(StatusCode::INTERNAL_SERVER_ERROR), EXIT_AGENT),
            ("anything else", anyhow::anyhow!("the disk is on fire"), EXIT_AGENT),
        ];
        for (case, error, code) in table {
            assert_eq!(exit_code(&error), code, "{case}: {error:#}");
        }
    }

    #[test]
    fn a_cause_the_message_already_holds_is_said_once() {
        let io = std::io::Error::other("no such file");
        let error = anyhow::Error::new(io).context("cannot read x: no such file").context("run");
        assert_eq!(describe(&error), "run: cannot read x: no such file");
    }

    /// What `--address` accepts for a server to listen on.
    #[test]
    fn listen_address_table() {
        let table = [
            ("127.0.0.1:4747", Some("127.0.0.1:4747")),
            ("http://127.0.0.1:4747", Some("127.0.0.1:4747")),
            ("http://127.0.0.1:4747/", Some("127.0.0.1:4747")),
            ("[::1]:0", Some("[::1]:0")),
            ("localhost:4747", None),
            ("127.0.0.1", None),
            ("", None),
        ];
        for (text, expected) in table {
            let got = listen_address(text).map(|a| a.to_string());
            match expected {
                Some(address) => assert_eq!(got.as_deref().ok(), Some(address), "{text:?}"),
                None => assert!(
                    got.as_ref().is_err_and(|e| e.0.contains(&format!("{text:?}"))),
                    "{text:?}: {got:?}"
                ),
            }
        }
    }

    /// The first byte that is not UTF-8 is named by line and column, counted in characters.
    #[test]
    fn not_utf8_names_line_and_column() {
        let table: [(&[u8], usize, usize); 4] = [
            (b"\xff", 1, 1),
            (b"ab\xff", 1, 3),
            (b"a\nb\n\xc3\xa9x\xff", 3, 3),
            (b"job = 1\n  \xfe", 2, 3),
        ];
        for (bytes, line, column) in table {
            let error = std::str::from_utf8(bytes).unwrap_err();
            match not_utf8("spec".into(), bytes, error) {
                SpecFileError::NotUtf8 { line: l, column: c, .. } => {
                    assert_eq!((l, c), (line, column), "{bytes:?}")
                }
                other => panic!("{bytes:?}: {other}"),
            }
        }
    }
}
