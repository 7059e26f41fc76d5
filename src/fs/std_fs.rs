//! The real file system, through `std::fs`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::file_system::{DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, WriteFile};

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdFs;

struct StdRead(File);
struct StdWrite(File);
struct StdLock(#[allow(dead_code)] File);

impl io::Read for StdRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl ReadFile for StdRead {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn skip(&mut self, n: u64) -> io::Result<()> {
        let n = i64::try_from(n).map_err(|_| io::Error::other("a skip past 2^63 bytes"))?;
        self.0.seek(SeekFrom::Current(n)).map(|_| ())
    }
}

impl WriteFile for StdWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)?;
        self.0.seek(SeekFrom::Start(len)).map(|_| ())
    }
    fn try_clone(&self) -> io::Result<Box<dyn WriteFile>> {
        Ok(Box::new(StdWrite(self.0.try_clone()?)))
    }
}

impl LockGuard for StdLock {}

impl FileSystem for StdFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        match fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(Some(EntryKind::File)),
            Ok(m) if m.is_dir() => Ok(Some(EntryKind::Dir)),
            Ok(_) => Ok(Some(EntryKind::Other)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            // The entry's own type, then, for a link, what it leads to:
            // a link to a segment is that segment, never something to skip.
            let own = match entry.file_type() {
                Ok(t) => t,
                // Removed since the directory was read.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let meta = if own.is_symlink() {
                fs::metadata(entry.path()).ok()
            } else {
                match entry.metadata() {
                    Ok(m) => Some(m),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            };
            let kind = meta.as_ref().map(|m| {
                if m.is_file() {
                    EntryKind::File
                } else if m.is_dir() {
                    EntryKind::Dir
                } else {
                    EntryKind::Other
                }
            });
            let len = meta.filter(|m| m.is_file()).map_or(0, |m| m.len());
            out.push(DirEntry { name, len, kind });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn is_symlink(&self, path: &Path) -> io::Result<bool> {
        match fs::symlink_metadata(path) {
            Ok(m) => Ok(m.file_type().is_symlink()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(StdRead(File::open(path)?)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(StdWrite(f)))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let mut f = OpenOptions::new().write(true).open(path)?;
        f.seek(SeekFrom::End(0))?;
        Ok(Box::new(StdWrite(f)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
        {
            // A directory is locked through a read-only handle (`flock`
            // does not care how the handle was opened).
            Err(e) if e.kind() == io::ErrorKind::IsADirectory => File::open(path)?,
            other => other?,
        };
        match f.try_lock() {
            Ok(()) => Ok(Some(Box::new(StdLock(f)))),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }
}
