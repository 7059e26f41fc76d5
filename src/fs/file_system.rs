//! The seam itself: the [`FileSystem`] trait the store reaches the disk
//! through, the file handles it gives out, and [`ReadOnlyFs`], a view of
//! another file system that refuses every write.

use std::fmt;
use std::io;
use std::path::Path;

/// What a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Something else (a socket, a device, ...).
    Other,
}

/// An entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The file name (not the full path).
    pub name: String,
    /// Its length in bytes if it is a file (0 otherwise).
    pub len: u64,
    /// What the name leads to, symbolic links followed: a link to a
    /// regular file is [`EntryKind::File`], with that file's length.
    /// `None` for a link that leads nowhere (dangling, a loop, or a target
    /// that cannot be examined).
    pub kind: Option<EntryKind>,
}

/// The operations the store needs from a file system.
///
/// # Errors
///
/// Every method returns the operating system's error for its call as it
/// is; the store adds the operation and the path when it passes one on
/// ([`Error::Io`](crate::Error::Io)). An implementation must not retry a
/// failed `sync_data` or `sync_dir` and then report success: the store
/// treats a failed fsync as losing whatever it covered.
#[allow(clippy::missing_errors_doc)] // the section above covers every method
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Creates a directory and its parents if missing.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// What `path` is, or `None` if it does not exist.
    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>>;
    /// Every entry directly inside `dir`, whatever it is (see
    /// [`DirEntry::kind`]; names that are not UTF-8 are skipped). The
    /// caller decides what it may ignore: recovery refuses an entry named
    /// like a store file that is not a regular file rather than pass over
    /// it.
    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>>;
    /// True if `path` itself is a symbolic link (false if it is anything
    /// else or does not exist). A file system without links keeps the
    /// default.
    fn is_symlink(&self, path: &Path) -> io::Result<bool> {
        let _ = path;
        Ok(false)
    }
    /// Opens a file for sequential reading.
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;
    /// Creates a file that must not exist yet, for writing.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;
    /// Opens an existing file for appending at its end.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path`: a directory itself, or a file
    /// (created if needed). `Ok(None)` if someone else holds it, in this
    /// process or another. Dropping the guard releases it. The store locks
    /// its directory, which, unlike a file in it, cannot be deleted or
    /// replaced from under the lock.
    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>>;
}

/// A file opened for reading. Errors as [`FileSystem`]'s.
#[allow(clippy::missing_errors_doc)] // the OS error of each call
pub trait ReadFile: io::Read + Send {
    /// The file's length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// True when the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Moves the read position `n` bytes forward without reading them
    /// (recovery seeks past the records a snapshot covers). The default
    /// reads and drops them; a file system that can seek overrides it. A
    /// position past the end is allowed: reads there return nothing.
    fn skip(&mut self, n: u64) -> io::Result<()> {
        io::copy(&mut io::Read::take(self, n), &mut io::sink())?;
        Ok(())
    }
}

/// A file opened for writing. Errors as [`FileSystem`]'s.
#[allow(clippy::missing_errors_doc)] // the OS error of each call
pub trait WriteFile: Send {
    /// Writes all of `buf` at the current end of the file.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (used to fill in a header last).
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Writes `len` zero bytes at `offset` with real writes (not a hole,
    /// not `fallocate`: a preallocated log segment must hold blocks that
    /// are allocated *and* written, so that overwriting them later and
    /// `fdatasync`ing commits no file-system metadata).
    fn write_zeros(&mut self, offset: u64, len: u64) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write_all_at(offset + done, zeros.get(..n as usize).unwrap_or_default())?;
            done += n;
        }
        Ok(())
    }
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Truncates or extends the file to `len` bytes; later writes go to the new end.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Another handle to the same file, for an fsync that must not wait for
    /// this handle's user (`dup`).
    fn try_clone(&self) -> io::Result<Box<dyn WriteFile>>;
}

/// Holds a lock until dropped.
pub trait LockGuard: Send + Sync {}

/// A read-only view of another file system: reads pass through, every
/// operation that would change something fails with `PermissionDenied`.
/// The inspector reads through it, so a bug can fail an inspection but
/// never damage what is inspected.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOnlyFs<F>(pub F);

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "read-only view: nothing may be written",
    )
}

impl<F: FileSystem> FileSystem for ReadOnlyFs<F> {
    fn create_dir_all(&self, _: &Path) -> io::Result<()> {
        Err(read_only())
    }
    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        self.0.kind(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        self.0.list(dir)
    }
    fn is_symlink(&self, path: &Path) -> io::Result<bool> {
        self.0.is_symlink(path)
    }
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        self.0.open_read(path)
    }
    fn create_new(&self, _: &Path) -> io::Result<Box<dyn WriteFile>> {
        Err(read_only())
    }
    fn open_append(&self, _: &Path) -> io::Result<Box<dyn WriteFile>> {
        Err(read_only())
    }
    fn rename(&self, _: &Path, _: &Path) -> io::Result<()> {
        Err(read_only())
    }
    fn remove_file(&self, _: &Path) -> io::Result<()> {
        Err(read_only())
    }
    fn sync_dir(&self, _: &Path) -> io::Result<()> {
        Err(read_only())
    }
    fn try_lock(&self, _: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        Err(read_only())
    }
}
