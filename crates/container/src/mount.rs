//! The container's root filesystem: an overlayfs over the image's layers with an upper
//! directory of the task's own, mounted by the driver and unmounted at destroy.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Mounts an overlayfs at `target` with `layers` (lowest first) below `upper` (`work` is
/// overlayfs's scratch, on the same filesystem as `upper`).
pub(crate) fn mount_overlay(
    layers: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> io::Result<()> {
    if layers.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an image without layers"));
    }
    let mut lower = Vec::new();
    for (i, layer) in layers.iter().rev().enumerate() {
        let bytes = layer.as_os_str().as_bytes();
        if bytes.iter().any(|b| matches!(b, b':' | b',' | b'\\')) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "layer path {} holds a character overlayfs options cannot",
                    layer.display()
                ),
            ));
        }
        if i > 0 {
            lower.push(b':');
        }
        lower.extend_from_slice(bytes);
    }
    let mut options = b"lowerdir=".to_vec();
    options.extend_from_slice(&lower);
    options.extend_from_slice(b",upperdir=");
    options.extend_from_slice(upper.as_os_str().as_bytes());
    options.extend_from_slice(b",workdir=");
    options.extend_from_slice(work.as_os_str().as_bytes());
    let options =
        CString::new(options).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let target = c_path(target)?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let done = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Unmounts `target` (detached, so a process that still holds it open does not stop the
/// destroy). Not mounted is fine.
pub(crate) fn unmount(target: &Path) -> io::Result<()> {
    let path = c_path(target)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EINVAL | libc::ENOENT) => Ok(()),
        _ => Err(error),
    }
}

/// Unmounts every mount under `dir` (detached; `dir` itself stays), deepest first and each stacked mount
/// in turn, so that removing `dir` afterwards neither fails on a busy mount point nor reaches
/// through a mount into what it shows. The number of unmounts.
pub fn unmount_all_under(dir: &Path) -> io::Result<usize> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut unmounted = 0;
    // Every pass takes off the top of every stack; a stack is no deeper than the mounts found.
    let mut passes = mounts_under(&dir)?.len();
    loop {
        let mut points = mounts_under(&dir)?;
        if points.is_empty() {
            return Ok(unmounted);
        }
        if passes == 0 {
            let left: Vec<String> = points.iter().map(|p| p.display().to_string()).collect();
            return Err(io::Error::other(format!("still mounted: {}", left.join(", "))));
        }
        passes -= 1;
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        points.dedup();
        for point in points {
            unmount(&point)?;
            unmounted += 1;
        }
    }
}

/// The mount points below `dir`, from `/proc/self/mountinfo`. `dir` itself is left out: a
/// data directory that is a file system of its own (a disk for the agent) stays mounted, so
/// what is removed after is its contents, not the directory it hides.
fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape(point)))
        .filter(|point| point.starts_with(dir) && point != dir)
        .collect())
}

/// Whether `target` is a mount point now (from `/proc/self/mountinfo`).
pub(crate) fn is_mounted(target: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let wanted = target.to_string_lossy();
    info.lines().any(|line| line.split(' ').nth(4).is_some_and(|point| unescape(point) == wanted))
}

fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount_tmpfs(target: &Path) {
        let (source, target, kind) = (c"wharf-test", c_path(target).unwrap(), c"tmpfs");
        // SAFETY: NUL-terminated strings that outlive the call, and no data.
        let code = unsafe {
            libc::mount(source.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, std::ptr::null())
        };
        assert_eq!(code, 0, "mount tmpfs (the tests run as root): {}", io::Error::last_os_error());
    }

    /// A data directory that is a file system of its own keeps it: only what is mounted
    /// below it is taken off.
    #[test]
    fn what_is_mounted_below_goes_and_the_directory_itself_stays_mounted() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        mount_tmpfs(&dir);
        let below = dir.join("allocs/a/root");
        std::fs::create_dir_all(&below).unwrap();
        mount_tmpfs(&below);
        mount_tmpfs(&below);
        assert_eq!(unmount_all_under(&dir).unwrap(), 2, "the stacked mounts below");
        assert!(!is_mounted(&below));
        assert!(is_mounted(&dir), "the directory's own file system stays");
        unmount(&dir).unwrap();
    }
}
