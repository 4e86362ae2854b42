//! The node's variables: small named maps of strings (`app/db` -> `{user, password}`) that
//! task templates read with `nomadVar` and `key`, kept in one file of their own.
//!
//! The whole set lives in memory and every change rewrites the file at once (a new file
//! beside it, synced, renamed over it, the directory synced), so a change returns only once
//! durable and a crash leaves the old set or the new one. The file is JSON with a version,
//! mode 0600; one written by a newer wharf is refused. A set of variables is small (they are
//! configuration, bounded by [`MAX_VARIABLE_BYTES`] each), which a file per change serves
//! well; the calls are synchronous, for a blocking thread.
//!
//! A worker of a fleet takes its variables from the fleet: [`VariableFile::sync`] replaces the
//! whole set with the fleet's, and keeps the fleet's index of it so that a copy older than the
//! one held (a push that was overtaken) changes nothing.

use crate::error::StoreError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The version of the file's layout.
pub const VARIABLES_VERSION: u64 = 1;

/// The most a variable's items may hold, names and values together.
pub const MAX_VARIABLE_BYTES: usize = 64 * 1024;

/// The variables of `set` (by path) whose path starts with `prefix`, by path: a set's listing,
/// for whoever holds one.
pub fn under_prefix(set: &BTreeMap<String, Variable>, prefix: &str) -> Vec<Variable> {
    set.range(prefix.to_owned()..)
        .take_while(|(path, _)| path.starts_with(prefix))
        .map(|(_, variable)| variable.clone())
        .collect()
}

/// One variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variable {
    /// Its path, such as `app/db`.
    pub path: String,
    /// Its items.
    pub items: BTreeMap<String, String>,
    /// Moves on every change of the set; this variable's as of its last change.
    pub modify_index: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct FileBody {
    version: u64,
    index: u64,
    variables: BTreeMap<String, Variable>,
    /// The fleet's index of the set last taken from it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source_index: Option<u64>,
    /// The generation of the fleet's set that index counts in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    source_generation: String,
}

/// A whole set of variables as a fleet hands it to its workers: each path's items, and the
/// fleet's index of the set, which grows with every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariableSync {
    /// The fleet's index of this set.
    pub source_index: u64,
    /// Names the set's history: a fleet whose store was replaced starts a new generation,
    /// whose indexes count again from 1, and a worker takes its copies whatever it held.
    #[serde(default)]
    pub generation: String,
    /// Every variable: its path and its items.
    pub variables: BTreeMap<String, BTreeMap<String, String>>,
}

/// The variables, in memory and in their file.
#[derive(Debug)]
pub struct VariableFile {
    path: PathBuf,
    body: Mutex<FileBody>,
}

/// Whether `path` may name a variable: 1 to 128 bytes of `[A-Za-z0-9_.~-]` segments joined by
/// `/`, with no empty, `.` or `..` segment.
pub fn check_variable_path(path: &str) -> Result<(), String> {
    let segments_ok = path.split('/').all(|segment| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.~-".contains(&b))
    });
    if (1..=128).contains(&path.len()) && segments_ok {
        Ok(())
    } else {
        Err(format!(
            "{path:?} must be 1 to 128 bytes of [A-Za-z0-9_.~-] segments separated by single `/`"
        ))
    }
}

fn invalid(path: &str, reason: String) -> StoreError {
    StoreError::InvalidVariable { path: path.to_owned(), reason }
}

/// Whether `items` may be the variable at `path`: a valid path, at least one item, item names
/// that are not empty and hold no `=` or NUL, and no more than [`MAX_VARIABLE_BYTES`] in all.
pub fn check_variable(path: &str, items: &BTreeMap<String, String>) -> Result<(), StoreError> {
    check_variable_path(path).map_err(|reason| invalid(path, reason))?;
    if items.is_empty() {
        return Err(invalid(path, "a variable needs at least one item".into()));
    }
    if let Some(name) = items.keys().find(|name| name.is_empty() || name.contains(['\0', '='])) {
        return Err(invalid(path, format!("item name {name:?} is empty or holds `=` or NUL")));
    }
    let size: usize = items.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_VARIABLE_BYTES {
        return Err(invalid(
            path,
            format!("its items hold {size} bytes, more than the {MAX_VARIABLE_BYTES} allowed"),
        ));
    }
    Ok(())
}

impl VariableFile {
    /// Opens the file at `path`, or starts an empty set there if it does not exist.
    pub fn open(path: impl Into<PathBuf>) -> Result<VariableFile, StoreError> {
        let path = path.into();
        let body = match std::fs::read(&path) {
            Ok(bytes) => {
                let body: FileBody =
                    serde_json::from_slice(&bytes).map_err(|e| StoreError::Storage {
                        path: path.clone(),
                        operation: "reading the variables",
                        source: Box::new(e),
                    })?;
                if body.version > VARIABLES_VERSION {
                    return Err(StoreError::NewerSchema {
                        path,
                        found: body.version,
                        supported: VARIABLES_VERSION,
                    });
                }
                body
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                FileBody { version: VARIABLES_VERSION, ..FileBody::default() }
            }
            Err(source) => return Err(StoreError::Open { path, source }),
        };
        Ok(VariableFile { path, body: Mutex::new(body) })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The variable at `path`.
    pub fn get(&self, path: &str) -> Option<Variable> {
        self.body.lock().variables.get(path).cloned()
    }

    /// Every variable whose path starts with `prefix`, by path.
    pub fn list(&self, prefix: &str) -> Vec<Variable> {
        under_prefix(&self.body.lock().variables, prefix)
    }

    /// Sets the variable at `path` to `items`; returns it once the file holds it.
    pub fn put(&self, path: &str, items: BTreeMap<String, String>) -> Result<Variable, StoreError> {
        check_variable(path, &items)?;
        self.change(|body| {
            let variable = Variable { path: path.to_owned(), items, modify_index: body.index };
            body.variables.insert(path.to_owned(), variable.clone());
            variable
        })
    }

    /// Removes the variable at `path`; returns whether there was one.
    pub fn delete(&self, path: &str) -> Result<bool, StoreError> {
        if self.get(path).is_none() {
            return Ok(false);
        }
        self.change(|body| body.variables.remove(path).is_some())
    }

    /// Replaces the whole set with a fleet's `sync`, unless the set already is that copy or a
    /// later one (its `source_index` no greater than the one held): then nothing changes and
    /// the answer is `false`. A variable whose items are unchanged keeps its modify index.
    /// Every variable is checked first; one that is invalid refuses the whole copy.
    pub fn sync(&self, sync: VariableSync) -> Result<bool, StoreError> {
        for (path, items) in &sync.variables {
            check_variable(path, items)?;
        }
        // Checked under the same lock as the write: of two copies that arrive together, the
        // older cannot land last.
        let mut body = self.body.lock();
        let held = body.source_generation == sync.generation
            && body.source_index.is_some_and(|held| held >= sync.source_index);
        if held {
            return Ok(false);
        }
        self.apply(&mut body, |body| {
            let index = body.index;
            let old = std::mem::take(&mut body.variables);
            body.variables = sync
                .variables
                .into_iter()
                .map(|(path, items)| {
                    let modify_index = match old.get(&path) {
                        Some(kept) if kept.items == items => kept.modify_index,
                        _ => index,
                    };
                    (path.clone(), Variable { path, items, modify_index })
                })
                .collect();
            body.source_index = Some(sync.source_index);
            body.source_generation = sync.generation;
        })?;
        Ok(true)
    }

    /// The fleet's index of the set last taken from it ([`VariableFile::sync`]), if any.
    pub fn source_index(&self) -> Option<u64> {
        self.body.lock().source_index
    }

    /// Applies `change` to a copy of the set, writes it, and keeps it once written.
    fn change<T>(&self, change: impl FnOnce(&mut FileBody) -> T) -> Result<T, StoreError> {
        let mut body = self.body.lock();
        self.apply(&mut body, change)
    }

    /// [`VariableFile::change`], with the set's lock held by the caller.
    fn apply<T>(
        &self,
        body: &mut FileBody,
        change: impl FnOnce(&mut FileBody) -> T,
    ) -> Result<T, StoreError> {
        let mut next = FileBody {
            version: VARIABLES_VERSION,
            index: body.index + 1,
            variables: body.variables.clone(),
            source_index: body.source_index,
            source_generation: body.source_generation.clone(),
        };
        let result = change(&mut next);
        self.write(&next)?;
        *body = next;
        Ok(result)
    }

    fn write(&self, body: &FileBody) -> Result<(), StoreError> {
        let storage = |operation: &'static str| {
            let path = self.path.clone();
            move |e: std::io::Error| StoreError::Storage { path, operation, source: Box::new(e) }
        };
        let bytes = serde_json::to_vec_pretty(body)
            .map_err(|source| StoreError::Encode { what: "variables".into(), source })?;
        let mut temp = self.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)
            .map_err(storage("create"))?;
        file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(storage("write"))?;
        std::fs::rename(&temp, &self.path).map_err(storage("rename"))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(storage("sync"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn variables_survive_a_reopen_and_list_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("variables.json");
        let vars = VariableFile::open(&path).unwrap();
        vars.put("app/db", items(&[("user", "ann")])).unwrap();
        vars.put("app/web", items(&[("port", "80")])).unwrap();
        vars.put("other", items(&[("x", "1")])).unwrap();
        assert!(vars.delete("other").unwrap());
        assert!(!vars.delete("other").unwrap());
        drop(vars);
        let vars = VariableFile::open(&path).unwrap();
        assert_eq!(vars.get("app/db").unwrap().items["user"], "ann");
        let listed: Vec<String> = vars.list("app/").into_iter().map(|v| v.path).collect();
        assert_eq!(listed, ["app/db", "app/web"]);
        assert!(vars.get("other").is_none());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn bad_paths_items_and_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let vars = VariableFile::open(dir.path().join("v.json")).unwrap();
        for path in ["", "/a", "a/", "a//b", "a/../b", "a b", &"x".repeat(129)] {
            let error = vars.put(path, items(&[("k", "v")])).unwrap_err();
            assert!(matches!(error, StoreError::InvalidVariable { .. }), "{path}: {error}");
        }
        assert!(vars.put("a", BTreeMap::new()).is_err());
        assert!(vars.put("a", items(&[("", "v")])).is_err());
        let big = "v".repeat(MAX_VARIABLE_BYTES + 1);
        assert!(vars.put("a", items(&[("k", &big)])).is_err());
        assert!(vars.list("").is_empty(), "nothing refused was kept");

        std::fs::write(dir.path().join("bad.json"), "{").unwrap();
        assert!(matches!(
            VariableFile::open(dir.path().join("bad.json")),
            Err(StoreError::Storage { .. })
        ));
        std::fs::write(dir.path().join("new.json"), r#"{"version":99,"index":0,"variables":{}}"#)
            .unwrap();
        assert!(matches!(
            VariableFile::open(dir.path().join("new.json")),
            Err(StoreError::NewerSchema { .. })
        ));
    }

    #[test]
    fn a_fleets_copy_replaces_the_set_once_and_an_older_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("variables.json");
        let vars = VariableFile::open(&path).unwrap();
        vars.put("local/only", items(&[("x", "1")])).unwrap();
        vars.put("app/db", items(&[("user", "ann")])).unwrap();
        let kept_index = vars.get("app/db").unwrap().modify_index;
        let copy = |index: u64, pairs: &[(&str, &[(&str, &str)])]| VariableSync {
            source_index: index,
            generation: "first".into(),
            variables: pairs.iter().map(|(p, i)| ((*p).to_owned(), items(i))).collect(),
        };
        let fleets = copy(5, &[("app/db", &[("user", "ann")]), ("app/web", &[("port", "80")])]);
        assert!(vars.sync(fleets.clone()).unwrap());
        let paths: Vec<String> = vars.list("").into_iter().map(|v| v.path).collect();
        assert_eq!(paths, ["app/db", "app/web"], "the fleet's set, whole");
        assert_eq!(vars.get("app/db").unwrap().modify_index, kept_index, "unchanged, same index");
        assert!(!vars.sync(fleets).unwrap(), "the same copy again");
        assert!(!vars.sync(copy(4, &[("stale", &[("k", "v")])])).unwrap(), "an older copy");
        assert!(vars.get("stale").is_none());
        let bad = copy(9, &[("ok", &[("k", "v")]), ("a//b", &[("k", "v")])]);
        assert!(matches!(vars.sync(bad), Err(StoreError::InvalidVariable { .. })));
        assert!(vars.get("ok").is_none(), "an invalid copy is refused whole");
        drop(vars);
        let vars = VariableFile::open(&path).unwrap();
        assert_eq!(vars.source_index(), Some(5), "the copy's index is kept with it");
        assert_eq!(vars.get("app/web").unwrap().items["port"], "80");
        // A fleet whose store was replaced counts again from 1, in a generation of its own.
        let renewed =
            VariableSync { generation: "second".into(), ..copy(1, &[("new", &[("k", "v")])]) };
        assert!(vars.sync(renewed).unwrap(), "a new generation is taken whatever its index");
        assert_eq!(vars.list("").len(), 1);
    }
}
