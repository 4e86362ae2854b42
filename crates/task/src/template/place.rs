//! Where a template's destination (or source) lies once its `${VAR}` references are resolved:
//! inside the task's directory or the allocation's shared one, never outside, and reached
//! through those directories without following a link.

use crate::env;
use crate::hooks::TaskDirs;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use wharf_isolate::dirs::OpenDir;

/// A file below one of the task's directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placed {
    /// The directory the agent opens by its own path: the task's or the allocation's.
    pub(crate) root: PathBuf,
    /// The file's path below it, with no `..` and no `.`.
    pub(crate) relative: PathBuf,
}

impl Placed {
    /// The file's full path, for messages and for the task.
    pub(crate) fn path(&self) -> PathBuf {
        self.root.join(&self.relative)
    }

    /// Reads the file, following no link below the root.
    pub(crate) fn read(&self) -> Result<Vec<u8>, wharf_isolate::IsolateError> {
        OpenDir::open(&self.root)?.read_file(&self.relative)
    }

    /// Replaces the file with `contents` and `mode`, making missing directories on the way,
    /// following no link below the root. The file and the directories made are the root's
    /// owner's: the task's workload user once an isolating driver has handed it the task
    /// directory, so that a private file (`perms = "600"`) is still the task's to read.
    pub(crate) fn write(
        &self,
        contents: &[u8],
        mode: u32,
    ) -> Result<(), wharf_isolate::IsolateError> {
        use std::os::unix::fs::MetadataExt;
        let root = OpenDir::open(&self.root)?;
        let meta = root.metadata()?;
        let owner = (meta.uid(), meta.gid());
        let name = self.relative.file_name().map(OsString::from).unwrap_or_default();
        let parent = match self.relative.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => {
                let mut made = PathBuf::new();
                for component in parent.components() {
                    made.push(component);
                    let existed = root.open_dir(&made).is_ok();
                    let dir = root.make_dir(&made, 0o755)?;
                    if !existed {
                        dir.set_owner(owner.0, owner.1)?;
                    }
                }
                root.open_dir(parent)?
            }
            _ => root,
        };
        parent.write_file_owned(&name, contents, mode, Some(owner))
    }
}

/// Resolves `written` (a template's `destination` or `source`) against the task's environment
/// and directories. Relative paths are the task directory's; absolute ones must lie in the task
/// directory or the allocation's shared directory.
pub(crate) fn place(
    written: &str,
    task_env: &BTreeMap<String, String>,
    dirs: &TaskDirs,
) -> Result<Placed, String> {
    let resolved = env::interpolate(written, &|name| task_env.get(name).cloned());
    let path = Path::new(&resolved);
    let escapes = || format!("{written:?} ({resolved}) escapes the task's directories");
    let (root, rest) = if path.is_absolute() {
        let normal = normalize(path).ok_or_else(escapes)?;
        // The task's directory first: the shared one is not inside it, nor it inside that.
        [&dirs.task_dir, &dirs.alloc_dir]
            .into_iter()
            .find_map(|root| {
                normal.strip_prefix(root).ok().map(|rest| (root.clone(), rest.to_owned()))
            })
            .ok_or_else(escapes)?
    } else {
        (dirs.task_dir.clone(), normalize(path).ok_or_else(escapes)?)
    };
    if rest.as_os_str().is_empty() {
        return Err(format!("{written:?} ({resolved}) names a directory, not a file"));
    }
    Ok(Placed { root, relative: rest })
}

/// `path` with `.` dropped and `..` applied; None if `..` climbs above its start.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> TaskDirs {
        TaskDirs::new(Path::new("/data/allocs/a1"), "web")
    }

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("WHARF_TASK_DIR".to_owned(), "/data/allocs/a1/web".to_owned()),
            ("WHARF_SECRETS_DIR".to_owned(), "/data/allocs/a1/web/secrets".to_owned()),
            ("WHARF_ALLOC_DIR".to_owned(), "/data/allocs/a1/alloc".to_owned()),
            ("UP".to_owned(), "../".to_owned()),
        ])
    }

    #[test]
    fn destinations_resolve_inside_the_task_or_alloc_directory() {
        let ok = [
            ("local/app.conf", "/data/allocs/a1/web", "local/app.conf"),
            ("${WHARF_SECRETS_DIR}/token", "/data/allocs/a1/web", "secrets/token"),
            ("${WHARF_ALLOC_DIR}/shared.txt", "/data/allocs/a1/alloc", "shared.txt"),
            ("a/./b/../c", "/data/allocs/a1/web", "a/c"),
        ];
        for (written, root, relative) in ok {
            let placed = place(written, &env(), &dirs()).unwrap();
            assert_eq!(
                placed,
                Placed { root: root.into(), relative: relative.into() },
                "{written}"
            );
        }
        for escaping in
            ["../x", "${UP}${UP}etc/passwd", "/etc/passwd", "${WHARF_TASK_DIR}/../../x", "local/.."]
        {
            assert!(place(escaping, &env(), &dirs()).is_err(), "{escaping}");
        }
    }

    #[test]
    fn a_written_file_and_the_directories_made_for_it_are_the_task_directory_owners() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let task = tempfile::tempdir().unwrap();
        std::fs::create_dir(task.path().join("logs")).unwrap();
        std::os::unix::fs::chown(task.path(), Some(4242), Some(4343)).unwrap();
        let at = |relative: &str| Placed { root: task.path().into(), relative: relative.into() };
        at("conf/app/secret.conf").write(b"x", 0o600).unwrap();
        at("logs/rendered").write(b"y", 0o644).unwrap();
        let meta = |relative: &str| std::fs::metadata(task.path().join(relative)).unwrap();
        for made in ["conf", "conf/app", "conf/app/secret.conf", "logs/rendered"] {
            assert_eq!((meta(made).uid(), meta(made).gid()), (4242, 4343), "{made}");
        }
        assert_eq!(meta("conf/app/secret.conf").permissions().mode() & 0o7777, 0o600);
        assert_eq!(meta("logs").uid(), 0, "a directory that was there keeps its owner");
    }
}
