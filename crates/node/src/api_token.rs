//! The secret a wharf API requires when none is configured, kept in its server's data
//! directory: the agent's in `<data_dir>/agent-token` ([`AGENT`]), the fleet's in
//! `<data_dir>/fleet-token` ([`FLEET`]). One mechanism for both.
//!
//! At its first start a server with no `token` (in its file, `--token` or `WHARF_TOKEN`) makes
//! a random one and keeps it here, readable by its own user alone (mode 0600); later starts
//! take it back, so clients keep working across restarts. A configured token wins, and the
//! file is then removed, so a client that reads it never presents a token the server refuses.
//!
//! The CLI, reaching a server through its data directory (`--data-dir`, `WHARF_DATA_DIR`, or
//! the default one), reads the token here. Only the server's user (root, as a rule) can: a
//! workload user's task cannot, and gets no further than a 401. A raw_exec task runs as root,
//! and can.
//!
//! Every open is made without following a link, and the file is written whole (a temporary
//! file, then a rename), so a reader never sees half a token and a link planted in its place is
//! never written through.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Whose token a file keeps: its name in the server's data directory, and the server's name
/// for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenFile {
    /// The file's name in the data directory.
    pub file_name: &'static str,
    /// The server whose token it is, as messages name it: `agent`, `fleet`.
    pub server: &'static str,
}

/// The agent's token file.
pub const AGENT: TokenFile = TokenFile { file_name: "agent-token", server: "agent" };

/// The fleet's token file.
pub const FLEET: TokenFile = TokenFile { file_name: "fleet-token", server: "fleet" };

/// The fewest characters a token may have (a configured one too).
pub const MIN_LEN: usize = 16;

/// The largest token file read, in bytes: a token is a line, not a document.
const MAX_BYTES: u64 = 4096;

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// It could not be opened, read, written or made.
    #[error("cannot {action} the {server}'s token {path}: {source}{hint}", hint = access_hint(server, source))]
    Io {
        /// Whose token: `agent`, `fleet`.
        server: &'static str,
        /// What was being done: "read", "write", "create".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is there, but not as its server keeps it.
    #[error("the {server}'s token {path} {problem}; remove it, and the {server} makes a new one")]
    Unfit {
        /// Whose token: `agent`, `fleet`.
        server: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The system gave no randomness to make a token from.
    #[error("cannot make a token for the {server}: the system gave no random bytes: {detail}")]
    NoEntropy {
        /// Whose token: `agent`, `fleet`.
        server: &'static str,
        /// What the system said.
        detail: String,
    },
}

/// What to do about a permission error: the file is the server user's alone, by design.
fn access_hint(server: &str, source: &std::io::Error) -> String {
    if source.kind() == std::io::ErrorKind::PermissionDenied {
        format!(
            " (only the {server}'s user can read it: run this as that user, root as a rule, or \
             give the token with --token or WHARF_TOKEN)"
        )
    } else {
        String::new()
    }
}

impl TokenFile {
    /// The token file of the server whose data directory is `data_dir`.
    pub fn path(&self, data_dir: &Path) -> PathBuf {
        data_dir.join(self.file_name)
    }

    fn io(&self, action: &'static str, path: PathBuf, source: std::io::Error) -> TokenFileError {
        TokenFileError::Io { server: self.server, action, path, source }
    }

    /// The server's token from `data_dir`, made and kept there at the first start. The file
    /// must be a regular file of the server's user that no other user can read or write.
    pub fn load_or_create(&self, data_dir: &Path) -> Result<String, TokenFileError> {
        let path = self.path(data_dir);
        match open_no_follow(&path) {
            Ok(file) => self.read_checked(file, &path, true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.create(data_dir),
            Err(source) => Err(self.io("read", path, source)),
        }
    }

    /// The token kept in `data_dir`, as a client reads it: `Ok(None)` if there is none.
    pub fn read(&self, data_dir: &Path) -> Result<Option<String>, TokenFileError> {
        let path = self.path(data_dir);
        match open_no_follow(&path) {
            Ok(file) => self.read_checked(file, &path, false).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(self.io("read", path, source)),
        }
    }

    /// Removes the file (a configured token is in force); nothing if there is none.
    pub fn remove(&self, data_dir: &Path) -> Result<(), TokenFileError> {
        let path = self.path(data_dir);
        // Unlinking removes a link itself, never what it points to.
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(self.io("remove", path, source)),
        }
    }

    /// Reads the token from an open file, checking what it is; `own` (the server) also
    /// requires it to be its user's and no one else's.
    fn read_checked(
        &self,
        file: std::fs::File,
        path: &Path,
        own: bool,
    ) -> Result<String, TokenFileError> {
        let server = self.server;
        let unfit =
            |problem: String| TokenFileError::Unfit { server, path: path.to_owned(), problem };
        let io = |source| self.io("read", path.to_owned(), source);
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(unfit("is not a regular file".into()));
        }
        if own {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            if meta.uid() != uid {
                return Err(unfit(format!(
                    "belongs to user {}, not to the {server}'s ({uid})",
                    meta.uid()
                )));
            }
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(unfit(format!("is open to other users (mode {mode:04o}, not 0600)")));
            }
        }
        let mut text = String::new();
        file.take(MAX_BYTES).read_to_string(&mut text).map_err(|source| match source.kind() {
            std::io::ErrorKind::InvalidData => unfit("is not UTF-8 text".into()),
            _ => io(source),
        })?;
        let token = text.trim_end_matches(['\n', '\r']).to_owned();
        check(&token).map_err(|problem| unfit(format!("holds no usable token ({problem})")))?;
        Ok(token)
    }

    /// Makes a new token and writes it whole into `data_dir`, readable by this user alone.
    fn create(&self, data_dir: &Path) -> Result<String, TokenFileError> {
        let path = self.path(data_dir);
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| TokenFileError::NoEntropy {
            server: self.server,
            detail: e.to_string(),
        })?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let temp = data_dir.join(format!(".{}.{}", self.file_name, std::process::id()));
        let io = |action, source| self.io(action, path.clone(), source);
        // A temporary file an earlier start left (the pid may be reused) goes first; unlinking
        // never follows a link.
        match std::fs::remove_file(&temp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("create", e)),
            _ => {}
        }
        let written = (|| {
            // `create_new` (O_CREAT | O_EXCL) never opens through a link, nor an existing file.
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&temp)?;
            // Whatever the umask made of the mode, the file is 0600: readable by its user.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            file.write_all(format!("{token}\n").as_bytes())?;
            file.sync_all()?;
            // A rename replaces whatever is at the path (a link too), never writing through it.
            std::fs::rename(&temp, &path)?;
            std::fs::File::open(data_dir)?.sync_all()
        })();
        if let Err(source) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(io("write", source));
        }
        tracing::info!(path = %path.display(), server = self.server, "made a new API token");
        Ok(token)
    }
}

/// Whether `token` can be one: long enough, and only printable ASCII without spaces, so it
/// goes in an HTTP header unchanged. The error says what is wrong.
pub fn check(token: &str) -> Result<(), String> {
    if token.len() < MIN_LEN {
        return Err(format!("use at least {MIN_LEN} characters"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("use printable ASCII characters only, without spaces".into());
    }
    Ok(())
}

/// Opens `path` for reading, refusing a link (`O_NOFOLLOW`) and never waiting on a FIFO
/// (`O_NONBLOCK`; a regular file reads the same with it).
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_then_kept_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(AGENT.read(dir.path()).unwrap(), None);
        let token = AGENT.load_or_create(dir.path()).unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        let meta = std::fs::symlink_metadata(AGENT.path(dir.path())).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(AGENT.load_or_create(dir.path()).unwrap(), token, "a later start reuses it");
        assert_eq!(AGENT.read(dir.path()).unwrap().as_deref(), Some(token.as_str()));
        let other = tempfile::tempdir().unwrap();
        assert_ne!(AGENT.load_or_create(other.path()).unwrap(), token, "each agent has its own");
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // The fleet's token is a file of its own beside it, the same way.
        let fleet = FLEET.load_or_create(dir.path()).unwrap();
        assert_ne!(fleet, token);
        assert_eq!(FLEET.path(dir.path()), dir.path().join("fleet-token"));
        assert_eq!(FLEET.read(dir.path()).unwrap().as_deref(), Some(fleet.as_str()));
        assert_eq!(AGENT.read(dir.path()).unwrap().as_deref(), Some(token.as_str()));
        std::fs::set_permissions(FLEET.path(dir.path()), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let err = FLEET.load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("the fleet's token "), "{err}");
        assert!(err.contains("remove it, and the fleet makes a new one"), "{err}");
        FLEET.remove(dir.path()).unwrap();
        AGENT.remove(dir.path()).unwrap();
        assert_eq!(AGENT.read(dir.path()).unwrap(), None);
        AGENT.remove(dir.path()).unwrap();
    }

    #[test]
    fn a_link_a_loose_file_or_a_bad_token_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = AGENT.path(dir.path());
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "0123456789abcdef0123\n").unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        for err in
            [AGENT.load_or_create(dir.path()).unwrap_err(), AGENT.read(dir.path()).unwrap_err()]
        {
            let text = err.to_string();
            assert!(text.contains(&file.display().to_string()), "{text}");
        }
        std::fs::remove_file(&file).unwrap();

        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AGENT.load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is open to other users (mode 0644, not 0600)"), "{err}");
        assert!(err.contains("remove it, and the agent makes a new one"), "{err}");
        // A client reads what it is allowed to read.
        assert_eq!(AGENT.read(dir.path()).unwrap().as_deref(), Some("0123456789abcdef0123"));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&file, "short\n").unwrap();
        let err = AGENT.load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("holds no usable token (use at least 16 characters)"), "{err}");
        std::fs::write(&file, "has a space in it, sadly\n").unwrap();
        let err = AGENT.read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("printable ASCII"), "{err}");

        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let err = AGENT.load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }

    #[test]
    fn a_link_in_place_of_the_temporary_file_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let temp = dir.path().join(format!(".{}.{}", AGENT.file_name, std::process::id()));
        std::os::unix::fs::symlink(&victim, &temp).unwrap();
        let token = AGENT.load_or_create(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(AGENT.read(dir.path()).unwrap(), Some(token));
        assert!(std::fs::symlink_metadata(&temp).is_err(), "the link is gone");
    }
}
