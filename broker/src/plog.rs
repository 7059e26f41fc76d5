//! A partition's log: one segment file of record batches, as Kafka stores
//! them.
//!
//! The file is the concatenation of the produced batches, each with its
//! base offset rewritten to the offset the broker assigned. A batch's own
//! length field (bytes 8..12) frames it, so the file needs no framing of its
//! own, and a fetch serves its bytes unchanged. Offsets are contiguous: each
//! batch starts where the previous one's last record ended plus one.
//!
//! Every append is written with one positioned write and made durable with
//! `fdatasync` before it is acknowledged, one batch at a time, so after a
//! crash only the last batch can be incomplete. Opening scans the file,
//! verifies every batch (length, magic, CRC-32C, offset continuity) and
//! builds the in-memory index. A damaged last batch is a torn tail: its
//! bytes are copied to `<log>.torn-<pos>` (never destroyed) and the log is
//! cut back to the last complete batch. Damage with valid data after it is
//! not a torn write: opening refuses with [`Error::CorruptLog`].
//!
//! Opening also `fdatasync`s the file once. A process killed during an
//! append's `fdatasync` leaves the batch complete in the page cache but
//! perhaps not on disk; the next open finds it, and the producer state then
//! answers the client's retry of it with `DUPLICATE`, an acknowledgement.
//! So whatever recovery finds in the log is made durable before the broker
//! answers anything from it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::batch::{self, BatchHeader, LOG_OVERHEAD};
use crate::error::{Error, Result};

/// Where one batch is in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the batch's first record.
    pub base: i64,
    /// Offset of its last record.
    pub last: i64,
    /// Byte position in the file.
    pub pos: u64,
    /// Size in bytes.
    pub size: u32,
    /// The batch's max timestamp.
    pub max_timestamp: i64,
}

/// Whole batches of a log: where they start and how many bytes they take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    /// Byte position of the first batch.
    pub pos: u64,
    /// Bytes, a whole number of batches.
    pub len: usize,
}

/// What opening cut from a torn tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Where the log now ends (bytes).
    pub pos: u64,
    /// How many bytes were cut.
    pub bytes: u64,
    /// Where the cut bytes were saved.
    pub saved_to: PathBuf,
    /// Why the last batch was incomplete.
    pub reason: String,
}

/// An open partition log.
#[derive(Debug)]
pub struct PartitionLog {
    path: PathBuf,
    file: File,
    len: u64,
    next_offset: i64,
    index: Vec<IndexEntry>,
    /// Called by [`PartitionLog::append`] between its write and its
    /// `fdatasync`, so tests can act while a batch is written but not
    /// durable.
    #[cfg(test)]
    pub(crate) before_sync: Option<SyncHook>,
}

/// A test's callback inside [`PartitionLog::append`].
#[cfg(test)]
pub(crate) struct SyncHook(pub Box<dyn Fn() + Send>);

#[cfg(test)]
impl std::fmt::Debug for SyncHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncHook")
    }
}

/// Reads every complete batch of `file` from the start, calling `each` with
/// its header (base offset as stored). Returns the position of the first
/// byte that is not a valid batch, with the reason if there is one.
fn scan(
    path: &Path,
    file: &mut File,
    len: u64,
    mut each: impl FnMut(&BatchHeader, &[u8], u64) -> Result<()>,
) -> Result<(u64, Option<(batch::BatchError, bool)>)> {
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("seek", path, e))?;
    let mut r = io::BufReader::with_capacity(1 << 20, &mut *file);
    let mut pos = 0u64;
    let mut buf = Vec::new();
    let mut expected = 0i64;
    while pos < len {
        let left = len - pos;
        let head_len = (LOG_OVERHEAD as u64).min(left) as usize;
        buf.resize(head_len, 0);
        r.read_exact(&mut buf)
            .map_err(|e| Error::io("read", path, e))?;
        let size = match batch::claimed_size(&buf) {
            Ok(size) => size,
            // A length that cannot be right: a torn tail only if nothing but
            // zeros follow (a file extended but never written).
            Err(e) => return Ok((pos, Some((e, false)))),
        };
        if size as u64 > left {
            return Ok((
                pos,
                Some((
                    batch::BatchError::Truncated {
                        needed: size,
                        available: left as usize,
                    },
                    true,
                )),
            ));
        }
        buf.resize(size, 0);
        r.read_exact(&mut buf[LOG_OVERHEAD..])
            .map_err(|e| Error::io("read", path, e))?;
        let h = match batch::parse(&buf) {
            Ok(h) => h,
            Err(e) => return Ok((pos, Some((e, pos + size as u64 == len)))),
        };
        if h.base_offset != expected {
            return Err(Error::CorruptLog {
                path: path.to_path_buf(),
                pos,
                reason: format!(
                    "batch at base offset {} where {expected} was expected",
                    h.base_offset
                ),
            });
        }
        expected = h.last_offset(h.base_offset) + 1;
        each(&h, &buf, pos)?;
        pos += size as u64;
    }
    Ok((pos, None))
}

fn all_zero(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let n = ((to - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Makes a new directory entry durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync directory", dir, e))
}

impl PartitionLog {
    /// Opens (or creates) the log at `path`, cutting a torn tail, and calls
    /// `each` for every batch in order with its header and bytes.
    pub fn open(
        path: &Path,
        mut each: impl FnMut(&BatchHeader, &[u8]) -> Result<()>,
    ) -> Result<(PartitionLog, Option<TornTail>)> {
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        if !existed && let Some(parent) = path.parent() {
            sync_dir(parent)?;
        }
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len();
        let mut index = Vec::new();
        let (end, bad) = scan(path, &mut file, len, |h, bytes, pos| {
            index.push(IndexEntry {
                base: h.base_offset,
                last: h.last_offset(h.base_offset),
                pos,
                size: h.size as u32,
                max_timestamp: h.max_timestamp,
            });
            each(h, bytes)
        })?;
        let mut torn = None;
        if let Some((reason, at_end)) = bad {
            let is_tail = at_end
                || len - end < LOG_OVERHEAD as u64
                || all_zero(&file, end, len).map_err(|e| Error::io("read", path, e))?;
            if !is_tail {
                return Err(Error::corrupt(path, end, reason));
            }
            torn = Some(Self::cut_tail(path, &file, end, len, reason)?);
        } else if end > 0 {
            // See the module docs: what a killed process left unsynced.
            file.sync_data()
                .map_err(|e| Error::io("fdatasync", path, e))?;
        }
        let next_offset = index.last().map_or(0, |e| e.last + 1);
        Ok((
            PartitionLog {
                path: path.to_path_buf(),
                file,
                len: end,
                next_offset,
                index,
                #[cfg(test)]
                before_sync: None,
            },
            torn,
        ))
    }

    /// Saves bytes `end..len` beside the log, then cuts the log at `end`.
    fn cut_tail(
        path: &Path,
        file: &File,
        end: u64,
        len: u64,
        reason: batch::BatchError,
    ) -> Result<TornTail> {
        let mut tail = vec![0u8; (len - end) as usize];
        file.read_exact_at(&mut tail, end)
            .map_err(|e| Error::io("read", path, e))?;
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".torn-{end}"));
        let saved_to = PathBuf::from(name);
        std::fs::write(&saved_to, &tail)
            .and_then(|()| File::open(&saved_to)?.sync_all())
            .map_err(|e| Error::io("save torn tail", &saved_to, e))?;
        if let Some(parent) = path.parent() {
            sync_dir(parent)?;
        }
        file.set_len(end)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io("truncate torn tail of", path, e))?;
        Ok(TornTail {
            pos: end,
            bytes: len - end,
            saved_to,
            reason: reason.to_string(),
        })
    }

    /// Calls `each` for every batch of the log at `path` in order (used to
    /// rebuild the producer state; the log must have been opened, so its
    /// tail is clean).
    pub fn for_each_batch(
        path: &Path,
        each: impl FnMut(&BatchHeader, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut file = File::open(path).map_err(|e| Error::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len();
        let mut each = each;
        let (end, bad) = scan(path, &mut file, len, |h, bytes, _| each(h, bytes))?;
        match bad {
            None => Ok(()),
            Some((reason, _)) => Err(Error::corrupt(path, end, reason)),
        }
    }

    /// Calls `each` with the header of every batch whose base offset is
    /// above `offset`, in order, reading only those batches (through the
    /// index): how the producer state catches up when a crash left it
    /// behind the log.
    pub fn for_each_batch_after(
        &self,
        offset: i64,
        mut each: impl FnMut(&BatchHeader, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let first = self.index.partition_point(|e| e.base <= offset);
        let mut buf = Vec::new();
        for e in &self.index[first..] {
            buf.resize(e.size as usize, 0);
            self.file
                .read_exact_at(&mut buf, e.pos)
                .map_err(|err| Error::io("read", &self.path, err))?;
            // Verified when the log was opened; verified again because the
            // bytes were read again.
            let h = batch::parse(&buf).map_err(|err| Error::corrupt(&self.path, e.pos, err))?;
            each(&h, &buf)?;
        }
        Ok(())
    }

    /// The offset the next batch gets (the high watermark).
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one verified batch at the next offset and makes it durable
    /// (`fdatasync`). Returns the base offset it got. On an error the log
    /// is unchanged in memory (the file may hold a partial batch, which the
    /// next open cuts as a torn tail) and the caller must stop appending.
    pub fn append(&mut self, bytes: &mut [u8], h: &BatchHeader) -> io::Result<i64> {
        let base = self.next_offset;
        batch::set_base_offset(bytes, base);
        self.file.write_all_at(bytes, self.len)?;
        #[cfg(test)]
        if let Some(hook) = &self.before_sync {
            (hook.0)();
        }
        self.file.sync_data()?;
        self.index.push(IndexEntry {
            base,
            last: h.last_offset(base),
            pos: self.len,
            size: bytes.len() as u32,
            max_timestamp: h.max_timestamp,
        });
        self.len += bytes.len() as u64;
        self.next_offset = h.last_offset(base) + 1;
        Ok(base)
    }

    /// The batches holding `offset` and after it, whole, up to `max_bytes`
    /// (at least one batch, so a large batch is never stuck). Empty at the
    /// end of the log.
    pub fn read(&self, offset: i64, max_bytes: usize) -> io::Result<Vec<u8>> {
        match self.plan(offset, max_bytes, true, self.next_offset) {
            Some(r) => self.read_range(r),
            None => Ok(Vec::new()),
        }
    }

    /// Where the batches holding `offset` and after it lie, whole, up to
    /// `max_bytes` and below offset `upto` (the high watermark, or the last
    /// stable offset for a `read_committed` reader); with `at_least_one`,
    /// the first batch even if it alone is larger. `None` when that is
    /// nothing (the end of the log, or a first batch larger than
    /// `max_bytes` without `at_least_one`).
    pub fn plan(
        &self,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
        upto: i64,
    ) -> Option<ReadRange> {
        let first = self.index.partition_point(|e| e.last < offset);
        let start = self.index.get(first)?;
        let mut total = 0usize;
        for e in self.index.get(first..).unwrap_or_default() {
            if e.base >= upto {
                break;
            }
            let next = total + e.size as usize;
            if next > max_bytes && !(total == 0 && at_least_one) {
                break;
            }
            total = next;
        }
        (total > 0).then_some(ReadRange {
            pos: start.pos,
            len: total,
        })
    }

    /// The bytes of a range [`PartitionLog::plan`] gave (the log only
    /// grows, so they are there).
    pub fn read_range(&self, range: ReadRange) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; range.len];
        self.file.read_exact_at(&mut buf, range.pos)?;
        Ok(buf)
    }

    /// The base offset of the first batch whose max timestamp is at least
    /// `timestamp`, with that timestamp (Kafka answers with the exact
    /// record; batch granularity is enough for this broker).
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Option<(i64, i64)> {
        self.index
            .iter()
            .find(|e| e.max_timestamp >= timestamp)
            .map(|e| (e.base, e.max_timestamp))
    }

    /// The base offset and timestamp of the batch with the largest max
    /// timestamp (ListOffsets' `MAX_TIMESTAMP`).
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        self.index
            .iter()
            .max_by_key(|e| e.max_timestamp)
            .map(|e| (e.base, e.max_timestamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, seq: i32, count: i32) -> Vec<u8> {
        let mut b = vec![0u8; batch::HEADER_LEN];
        b.extend_from_slice(&[9u8; 20]);
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[53..57].copy_from_slice(&seq.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn append(log: &mut PartitionLog, pid: i64, seq: i32, count: i32) -> i64 {
        let mut b = batch(pid, seq, count);
        let h = batch::parse(&b).unwrap();
        log.append(&mut b, &h).unwrap()
    }

    #[test]
    fn offsets_are_assigned_contiguously_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let (mut log, torn) = PartitionLog::open(&path, |_, _| Ok(())).unwrap();
        assert!(torn.is_none());
        assert_eq!(append(&mut log, 1, 0, 3), 0);
        assert_eq!(append(&mut log, 1, 3, 2), 3);
        assert_eq!(log.next_offset(), 5);
        let read = log.read(4, 1).unwrap();
        assert_eq!(batch::parse(&read).unwrap().base_offset, 3);
        drop(log);
        let mut seen = Vec::new();
        let (log, _) = PartitionLog::open(&path, |h, _| {
            seen.push((h.base_offset, h.base_sequence));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [(0, 0), (3, 3)]);
        assert_eq!(log.next_offset(), 5);
        assert!(log.read(5, 1 << 20).unwrap().is_empty());
    }

    #[test]
    fn a_torn_tail_is_saved_and_cut_but_damage_before_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let (mut log, _) = PartitionLog::open(&path, |_, _| Ok(())).unwrap();
        append(&mut log, 1, 0, 1);
        append(&mut log, 1, 1, 1);
        let one = batch(1, 0, 1).len() as u64;
        drop(log);
        // A crash in the middle of the second batch's write.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(one + 30).unwrap();
        let (log, torn) = PartitionLog::open(&path, |_, _| Ok(())).unwrap();
        let torn = torn.expect("torn tail reported");
        assert_eq!((torn.pos, torn.bytes), (one, 30));
        assert_eq!(std::fs::read(&torn.saved_to).unwrap().len(), 30);
        assert_eq!(log.next_offset(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), one);
        drop(log);

        // A flipped bit in the first of two batches: not a torn tail.
        let (mut log, _) = PartitionLog::open(&path, |_, _| Ok(())).unwrap();
        append(&mut log, 1, 1, 1);
        drop(log);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let err = PartitionLog::open(&path, |_, _| Ok(())).unwrap_err();
        assert!(matches!(err, Error::CorruptLog { pos: 0, .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
    }
}
