//! The file-system seam: every byte the store reads or writes goes through
//! a [`FileSystem`] trait object.
//!
//! The seam exists so that crash safety can be proved rather than argued:
//! [`SimFs`] keeps what was *written* apart from what is *durable* (file
//! data and directory entries are durable only after `sync_data` or
//! `sync_dir`), can fail any chosen operation, and can produce the image a
//! crash would leave behind, optionally with the unsynced tail torn. The
//! store is the same code over [`StdFs`] and over [`SimFs`].
//!
//! Downstream crash-recovery suites can use `SimFs` the same way the crate's
//! own tests do: open a store on it with
//! [`StoreOptions::file_system`](crate::StoreOptions::file_system).
//!
//! The trait and its handles are in `file_system.rs`, the two file systems
//! in `std_fs.rs` and `sim.rs` (with `sim_node.rs`, one simulated file);
//! `background_sync.rs` runs the fsyncs of a
//! file being written on a thread of its own. This layer knows nothing of
//! the store's files: their names are `directory/`'s, their bytes the
//! formats'.

use std::io::{self, Read};
use std::path::Path;

pub(crate) mod background_sync;
mod file_system;
mod sim;
mod sim_node;
mod std_fs;

pub use file_system::{
    DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, ReadOnlyFs, WriteFile,
};

/// Bytes a deletion frees per step (see [`remove_gradually`]).
const REMOVE_STEP: u64 = 8 << 20;

/// Deletes a file that nothing needs any more, freeing its blocks a few
/// MiB at a time: the file is cut down step by step, each step fsync'ed,
/// then removed. Freeing tens of MiB in one go makes the file system's
/// next journal commit long (with the `discard` mount option it trims
/// every freed block in that commit), and a log fsync waiting for that
/// commit stalls its appenders: 13 to 60 ms measured here, against under 7
/// ms with no deletion. A crash part-way leaves the file shorter, which is
/// harmless for the obsolete snapshots and segments this deletes: nothing
/// reads them (a later retention deletes what is left).
///
/// A symbolic link is only unlinked: the file it leads to lies outside the
/// store's directory and is not the store's to cut down (cutting it would
/// leave a damaged file there, not free it; removing the link frees
/// nothing anyway).
pub(crate) fn remove_gradually(fs: &dyn FileSystem, path: &Path) -> io::Result<()> {
    if fs.is_symlink(path)? {
        return fs.remove_file(path);
    }
    let len = fs.open_read(path)?.len()?;
    if len > REMOVE_STEP {
        let mut f = fs.open_append(path)?;
        let mut left = len;
        while left > REMOVE_STEP {
            left -= REMOVE_STEP;
            f.set_len(left)?;
            f.sync_data()?;
        }
    }
    fs.remove_file(path)
}

pub use sim::{Fault, SimFs};
pub use sim_node::Unsynced;
pub use std_fs::StdFs;

/// Reads until `buf` is full or the reader ends; returns the bytes read.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(buf.get_mut(n..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_file_is_removed_in_steps_and_a_crash_leaves_a_prefix_or_nothing() {
        let path = Path::new("/d/old.wal");
        let original: Vec<u8> = (0..(20u64 << 20)).map(|i| (i % 251) as u8).collect();
        let setup = || {
            let fs = SimFs::new();
            fs.create_dir_all(Path::new("/d")).unwrap();
            let mut f = fs.create_new(path).unwrap();
            f.write_all(&original).unwrap();
            f.sync_data().unwrap();
            fs.sync_dir(Path::new("/d")).unwrap();
            fs
        };
        // 20 MiB in steps of 8: cut to 12, to 4 (each fsync'ed), remove.
        let fs = setup();
        let before = fs.ops();
        remove_gradually(&fs, path).unwrap();
        assert_eq!(fs.ops() - before, 5);
        assert!(fs.read_file(path).is_none());
        for n in 0..5 {
            let fs = setup();
            fs.set_fault(fs.ops() + n, Fault::Crash);
            assert!(remove_gradually(&fs, path).is_err());
            for mode in [Unsynced::Drop, Unsynced::Keep] {
                if let Some(left) = fs.crash_image(mode).read_file(path) {
                    assert!(original.starts_with(&left), "op {n} {mode:?}");
                }
            }
        }
        // A symbolic link is unlinked; the file it leads to keeps every byte.
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere.wal");
        let link = d.path().join("00000000000000000000.wal");
        let f = std::fs::File::create(&target).unwrap();
        f.set_len(20 << 20).unwrap();
        drop(f);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(StdFs.is_symlink(&link).unwrap());
        assert!(!StdFs.is_symlink(&target).unwrap());
        remove_gradually(&StdFs, &link).unwrap();
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert_eq!(std::fs::metadata(&target).unwrap().len(), 20 << 20);
        // A small file is simply removed.
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        fs.create_new(path).unwrap().write_all(b"tiny").unwrap();
        let before = fs.ops();
        remove_gradually(&fs, path).unwrap();
        assert_eq!(fs.ops() - before, 1);
    }
}
