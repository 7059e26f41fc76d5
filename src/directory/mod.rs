//! The store directory: which paths can be one, the lock that keeps a
//! second store out of it, and (in [`names`]) what every file in it is
//! called.
//!
//! A path is checked before anything is created or locked: the empty path
//! is refused ([`Error::InvalidPath`]; it would otherwise resolve to the
//! working directory for some calls and to nothing for others, and leave a
//! `LOCK` file behind), and so is a path that exists and is not a
//! directory ([`Error::NotADirectory`]).
//!
//! The lock is an exclusive lock on the directory itself (`flock` on a
//! read-only handle of it, through [`FileSystem::try_lock`]), held for as
//! long as the store is open. A lock on a file in the directory is not
//! enough: deleting or replacing the file lets a second store lock a new
//! one, and two writers then overwrite each other's acknowledged records.
//! A directory cannot be swapped that way: one that is deleted or renamed
//! takes its files with it, so a store opened under the old name then
//! works on other files. The `LOCK` file is still created
//! and locked too, after the directory, so that an older build (which
//! locks only that file) and this one still keep each other out.
//!
//! The lock needs a file system on which `flock` works on a directory:
//! any local one, but not NFS, where Linux emulates `flock` with `fcntl`
//! locks that need a handle open for writing. There the open fails with
//! the IO error ([`Error::Io`], op `lock`) rather than run without
//! exclusion.

pub(crate) mod names;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fs::{EntryKind, FileSystem, LockGuard};
use names::LOCK_FILE;

/// Refuses a path that cannot be a store directory; says whether it
/// exists. Touches nothing.
pub(crate) fn check(fs: &dyn FileSystem, dir: &Path) -> Result<bool> {
    if dir.as_os_str().is_empty() {
        return Err(Error::InvalidPath {
            path: dir.to_path_buf(),
            reason: "the path is empty (use \".\" for the working directory)",
        });
    }
    match fs.kind(dir).map_err(|e| Error::io("stat", dir, e))? {
        Some(EntryKind::Dir) => Ok(true),
        Some(_) => Err(Error::NotADirectory {
            path: dir.to_path_buf(),
        }),
        None => Ok(false),
    }
}

/// Both locks, released together when dropped.
struct Held(#[allow(dead_code)] Vec<Box<dyn LockGuard>>);

impl LockGuard for Held {}

/// Checks `dir`, creates it if missing and takes its lock: the directory
/// first, then the `LOCK` file. [`Error::Locked`] if another store (or
/// another seeding) holds either.
pub(crate) fn lock(fs: &dyn FileSystem, dir: &Path) -> Result<Box<dyn LockGuard>> {
    if !check(fs, dir)? {
        fs.create_dir_all(dir)
            .map_err(|e| Error::io("create directory", dir, e))?;
    }
    let mut held = Vec::with_capacity(2);
    let lock_file = dir.join(LOCK_FILE);
    for path in [dir, lock_file.as_path()] {
        let guard = fs
            .try_lock(path)
            .map_err(|e| Error::io("lock", path, e))?
            .ok_or_else(|| Error::Locked {
                path: dir.to_path_buf(),
            })?;
        held.push(guard);
    }
    Ok(Box::new(Held(held)))
}

/// The refusal of an entry named like a store file that is not a regular
/// file once symbolic links are followed (`kind` as the listing gave it):
/// recovery can neither read it nor pass over it, and the inspector's
/// verdict says the same.
pub(crate) fn not_a_file(fs: &dyn FileSystem, path: PathBuf, kind: Option<EntryKind>) -> Error {
    // Only for the message: whether the name itself is a link.
    let link = fs.is_symlink(&path).unwrap_or(false);
    let what = match (kind, link) {
        (None, _) => {
            "a symbolic link to nothing (dangling, looping, or to a target that cannot be examined)"
        }
        (Some(EntryKind::Dir), false) => "a directory",
        (Some(EntryKind::Dir), true) => "a symbolic link to a directory",
        (Some(_), false) => "not a regular file (a fifo, a socket or a device)",
        (Some(_), true) => {
            "a symbolic link to something that is not a regular file (a fifo, a socket or a device)"
        }
    };
    Error::NotAFile { path, what }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::SimFs;

    #[test]
    fn the_empty_path_is_refused_without_a_file_system_call() {
        let fs = SimFs::new();
        let before = fs.ops();
        let err = lock(&fs, Path::new("")).err().unwrap();
        assert!(matches!(err, Error::InvalidPath { .. }), "{err}");
        assert_eq!(fs.ops(), before);
        assert!(fs.files().is_empty());
    }

    #[test]
    fn the_directory_is_locked_and_the_lock_file_too() {
        let fs = SimFs::new();
        let dir = Path::new("/s");
        let held = lock(&fs, dir).unwrap();
        assert!(fs.try_lock(dir).unwrap().is_none());
        assert!(fs.try_lock(&dir.join(LOCK_FILE)).unwrap().is_none());
        assert!(matches!(lock(&fs, dir), Err(Error::Locked { .. })));
        drop(held);
        // Either lock held elsewhere keeps a store out.
        for path in [dir.to_path_buf(), dir.join(LOCK_FILE)] {
            let other = fs.try_lock(&path).unwrap().unwrap();
            assert!(matches!(lock(&fs, dir), Err(Error::Locked { .. })));
            drop(other);
        }
        lock(&fs, dir).unwrap();
    }
}
