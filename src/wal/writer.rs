//! Writes sealed groups of records to the active segment and rolls to a new
//! segment when it is full.
//!
//! A group (everything one leader writes at once) never spans two segments,
//! so the segment size is a soft limit. A new segment is created, its header
//! written and fsync'ed, and the directory fsync'ed before any record goes
//! into it; the segment it replaces is fsync'ed first, so every segment but
//! the last is complete on disk.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record;
use super::segment::{self, HEADER_LEN};
use crate::error::{Error, Result};
use crate::fs::{FileSystem, WriteFile};

/// The most bytes a segment holds (header included), so that a record's
/// distance from the durable end fits its `u32` field.
pub(crate) const MAX_SEGMENT_BYTES: u64 = u32::MAX as u64;

/// What an fsync through [`LogWriter::sync_handle`] covers.
pub(crate) struct SyncToken {
    pub path: PathBuf,
    first_lsn: u64,
    len: u64,
}

/// One segment on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentInfo {
    pub first_lsn: u64,
}

pub(crate) struct LogWriter {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    file: Box<dyn WriteFile>,
    path: PathBuf,
    first_lsn: u64,
    len: u64,
    /// Bytes of the active segment known to be durable (fsync'ed). Every
    /// record states how far past this it was written; see
    /// [`record::seal`].
    synced: u64,
    records: u64,
    segment_size: u64,
    /// Every live segment, oldest first; the last is the active one.
    segments: Vec<SegmentInfo>,
    /// A write failed (its operation and kind): the file's end is
    /// unknown, nothing more is written.
    broken: Option<(&'static str, io::ErrorKind)>,
    /// The active segment has an older format version: roll before writing.
    roll_first: bool,
}

impl LogWriter {
    /// Starts a new segment whose first record will have position `lsn`.
    pub(crate) fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        lsn: u64,
        segment_size: u64,
        mut segments: Vec<SegmentInfo>,
    ) -> Result<LogWriter> {
        let (file, path) = new_segment(fs.as_ref(), dir, lsn)?;
        segments.push(SegmentInfo { first_lsn: lsn });
        Ok(LogWriter {
            fs,
            dir: dir.to_path_buf(),
            file,
            path,
            first_lsn: lsn,
            len: HEADER_LEN as u64,
            synced: HEADER_LEN as u64,
            records: 0,
            segment_size,
            segments,
            broken: None,
            roll_first: false,
        })
    }

    /// Continues the last of `segments`, which holds `records` records in
    /// `len` bytes (recovery has already cut any torn tail). fsyncs it
    /// first: recovery read those records, maybe from the page cache of a
    /// process that crashed, and new records must not follow bytes that are
    /// not durable without saying so. A segment of an older format version
    /// is not written to: the next group starts a new segment (or, if it
    /// holds no record, it is replaced by a new one).
    pub(crate) fn resume(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        mut segments: Vec<SegmentInfo>,
        len: u64,
        records: u64,
        segment_size: u64,
    ) -> Result<LogWriter> {
        let last = segments
            .last()
            .copied()
            .ok_or_else(|| Error::InvalidOptions("no segment to resume".into()))?;
        let path = dir.join(segment::file_name(last.first_lsn));
        let version = read_version(fs.as_ref(), &path)?;
        if version != segment::VERSION && records == 0 {
            fs.remove_file(&path)
                .map_err(|e| Error::io("remove", &path, e))?;
            segments.pop();
            return LogWriter::create(fs, dir, last.first_lsn, segment_size, segments);
        }
        let mut file = fs
            .open_append(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        file.sync_data().map_err(|e| Error::io("fsync", &path, e))?;
        Ok(LogWriter {
            fs,
            dir: dir.to_path_buf(),
            file,
            path,
            first_lsn: last.first_lsn,
            len,
            synced: len,
            records,
            segment_size,
            segments,
            broken: None,
            roll_first: version != segment::VERSION,
        })
    }

    /// Position of the next record.
    pub(crate) fn next_lsn(&self) -> u64 {
        self.first_lsn + self.records
    }

    /// Writes one group of `count` records encoded by [`record::encode`],
    /// the first of which has position `lsn`; rolls first if the active
    /// segment is full. Does not fsync (see [`LogWriter::sync`]).
    pub(crate) fn write(&mut self, buf: &mut [u8], lsn: u64, count: u64) -> Result<()> {
        // A group that does not continue the log exactly (an earlier write
        // failed) must not be written: its records would get wrong positions.
        if let Some((op, kind)) = self.broken {
            return Err(Error::Poisoned {
                op,
                path: self.path.clone(),
                kind,
            });
        }
        if lsn != self.next_lsn() {
            return Err(Error::Internal(
                "a group of records does not continue the log",
            ));
        }
        let result = self.write_group(buf, lsn, count);
        if let Err(e) = &result {
            self.broken = Some(match e {
                Error::Io { op, source, .. } => (*op, source.kind()),
                _ => ("write", io::ErrorKind::Other),
            });
        }
        result
    }

    fn write_group(&mut self, buf: &mut [u8], lsn: u64, count: u64) -> Result<()> {
        let end = self.len + buf.len() as u64;
        if self.records > 0
            && (self.roll_first || self.len >= self.segment_size || end > MAX_SEGMENT_BYTES)
        {
            self.roll(lsn)?;
        }
        if HEADER_LEN as u64 + buf.len() as u64 > MAX_SEGMENT_BYTES {
            return Err(Error::io(
                "write",
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} bytes of records in one group: a segment holds at most {MAX_SEGMENT_BYTES}",
                        buf.len()
                    ),
                ),
            ));
        }
        // Below MAX_SEGMENT_BYTES, so every distance fits a u32.
        let unsynced = u32::try_from(self.len - self.synced).unwrap_or(u32::MAX);
        record::seal(buf, self.first_lsn, unsynced);
        self.file
            .write_all(buf)
            .map_err(|e| Error::io("write", &self.path, e))?;
        self.len += buf.len() as u64;
        self.records += count;
        Ok(())
    }

    /// A handle of the active segment to fsync it without holding the
    /// writer (its own file descriptor); give the [`SyncToken`] back to
    /// [`LogWriter::synced`] once that fsync has succeeded.
    pub(crate) fn sync_handle(&self) -> Result<(Box<dyn WriteFile>, SyncToken)> {
        let h = self
            .file
            .try_clone()
            .map_err(|e| Error::io("duplicate handle", &self.path, e))?;
        Ok((
            h,
            SyncToken {
                path: self.path.clone(),
                first_lsn: self.first_lsn,
                len: self.len,
            },
        ))
    }

    /// Notes that an fsync through [`LogWriter::sync_handle`] succeeded:
    /// the bytes written before it are durable.
    pub(crate) fn synced(&mut self, token: &SyncToken) {
        if token.first_lsn == self.first_lsn {
            self.synced = self.synced.max(token.len);
        }
    }

    /// fsyncs the active segment.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("fsync", &self.path, e))?;
        self.synced = self.len;
        Ok(())
    }

    fn roll(&mut self, lsn: u64) -> Result<()> {
        self.sync()?;
        let (file, path) = new_segment(self.fs.as_ref(), &self.dir, lsn)?;
        self.file = file;
        self.path = path;
        self.first_lsn = lsn;
        self.len = HEADER_LEN as u64;
        self.synced = HEADER_LEN as u64;
        self.records = 0;
        self.roll_first = false;
        self.segments.push(SegmentInfo { first_lsn: lsn });
        Ok(())
    }

    /// Forgets the segments whose records all lie before `position` (never
    /// the active one) and returns their paths, for the caller to delete
    /// without holding the writer.
    pub(crate) fn detach_before(&mut self, position: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        while self.segments.len() > 1
            && self
                .segments
                .get(1)
                .is_some_and(|s| s.first_lsn <= position)
        {
            let s = self.segments.remove(0);
            gone.push(self.dir.join(segment::file_name(s.first_lsn)));
        }
        gone
    }
}

/// The format version in the header of the segment at `path` (recovery
/// has validated it).
fn read_version(fs: &dyn FileSystem, path: &Path) -> Result<u16> {
    let mut head = [0u8; HEADER_LEN];
    let mut f = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let n = segment::read_full(&mut f, &mut head).map_err(|e| Error::io("read", path, e))?;
    match segment::parse_header(path, head.get(..n).unwrap_or_default()) {
        Ok((_, version)) => Ok(version),
        Err(segment::HeaderError::Bad(e)) => Err(e),
        Err(segment::HeaderError::Short(got)) => Err(Error::corrupt(
            path,
            got as u64,
            crate::codec::truncated(HEADER_LEN, got),
        )),
    }
}

fn new_segment(fs: &dyn FileSystem, dir: &Path, lsn: u64) -> Result<(Box<dyn WriteFile>, PathBuf)> {
    let path = dir.join(segment::file_name(lsn));
    let mut file = fs
        .create_new(&path)
        .map_err(|e| Error::io("create", &path, e))?;
    file.write_all(&segment::header(lsn))
        .map_err(|e| Error::io("write", &path, e))?;
    file.sync_data().map_err(|e| Error::io("fsync", &path, e))?;
    fs.sync_dir(dir)
        .map_err(|e| Error::io("fsync directory", dir, e))?;
    Ok((file, path))
}
