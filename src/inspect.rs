//! Read-only inspection of store files and of Kafka's snapshot files.
//!
//! This is what the `inspect-snapshot` tool prints, as a library: the same
//! readers and verifiers recovery uses (there is no second parser), opened
//! read-only through [`ReadOnlyFs`], with no lock taken, so they work on a
//! live store and on a copy of a crashed one. Every function streams its
//! file: memory does not grow with the file's size (only [`dry_run`], which
//! rebuilds the state, holds one entry per key).

use std::io;
use std::path::Path;

use crate::batch::AppendRequest;
use crate::entry::ProducerEntry;
use crate::error::{Corruption, Error, Result};
use crate::fs::{FileSystem, ReadOnlyFs, StdFs};
use crate::id::ProducerId;
use crate::kafka::{self, KafkaProducerEntry};
use crate::recovery::{self, RecoveryMode, RecoveryReport};
use crate::shards::{SHARDS, Shards};
use crate::snapshot;
use crate::wal::segment::{self, End, HeaderError};

/// Calls a progress callback every few thousand items.
struct Ticker<'a> {
    n: u64,
    progress: &'a mut dyn FnMut(u64),
}

impl<'a> Ticker<'a> {
    fn new(progress: &'a mut dyn FnMut(u64)) -> Self {
        Ticker { n: 0, progress }
    }

    /// One more item; reports `value` now and then.
    fn tick(&mut self, value: u64) {
        self.n += 1;
        if self.n.is_multiple_of(4096) {
            (self.progress)(value);
        }
    }
}

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A snapshot of this crate (`<position>.snap`, magic `PSTATSNP`).
    Snapshot,
    /// A log segment of this crate (`<position>.wal`, magic `PSTATWAL`).
    Segment,
    /// An Apache Kafka producer snapshot (`<offset>.snapshot`, version 1).
    KafkaSnapshot,
}

fn open(path: &Path) -> Result<(Box<dyn crate::fs::ReadFile>, u64)> {
    let fs = ReadOnlyFs(StdFs);
    let f = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    Ok((f, len))
}

/// What `path` holds, by its name and then by its first bytes; `None` for
/// anything else (including an empty file).
pub fn detect(path: &Path) -> Result<Option<FileKind>> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let (mut f, len) = open(path)?;
    let mut head = [0u8; 8];
    let n = segment::read_full(&mut f, &mut head).map_err(|e| Error::io("read", path, e))?;
    let head = head.get(..n).unwrap_or_default();
    Ok(
        if head == snapshot::MAGIC || snapshot::parse_name(name).is_some() {
            Some(FileKind::Snapshot)
        } else if head == segment::MAGIC || segment::parse_name(name).is_some() {
            Some(FileKind::Segment)
        } else if kafka::parse_file_name(name).is_some()
            || (head.get(..2) == Some(&[0, 1])
                && len >= kafka::HEADER_LEN as u64
                && (len - 10) % 46 == 0)
        {
            Some(FileKind::KafkaSnapshot)
        } else {
            None
        },
    )
}

/// A snapshot's header, once every byte verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// The log position it covers.
    pub position: u64,
    /// Number of entries.
    pub entries: u64,
    /// File size in bytes.
    pub bytes: u64,
}

/// Streams and verifies a snapshot, handing each entry to `each` (do not
/// trust what `each` saw unless this returns `Ok`). `progress(entries)` is
/// called every few thousand entries.
pub fn snapshot(
    path: &Path,
    mut each: impl FnMut(ProducerId, i32, ProducerEntry),
    progress: &mut dyn FnMut(u64),
) -> Result<SnapshotSummary> {
    let (f, len) = open(path)?;
    let mut t = Ticker::new(progress);
    let h = snapshot::read(
        path,
        io::BufReader::with_capacity(1 << 20, f),
        len,
        |id, p, e| {
            each(id, p, e);
            t.tick(t.n + 1);
            Ok(())
        },
    )?;
    Ok(SnapshotSummary {
        position: h.position,
        entries: h.entries,
        bytes: len,
    })
}

/// How a segment's records end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Every byte is a valid record.
    Clean,
    /// The last write was torn by a crash: recovery would cut the segment at
    /// `offset` (if it is the store's last segment).
    TornTail {
        /// Where the torn bytes start.
        offset: u64,
        /// What is wrong with them.
        kind: Corruption,
    },
    /// Damage at `offset` is followed by a valid record at `later_write`,
    /// written when the damaged bytes were already durable: recovery would
    /// refuse.
    Damaged {
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        kind: Corruption,
        /// Where that valid record was found.
        later_write: u64,
    },
}

/// What a segment holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Position of its first record.
    pub first_position: u64,
    /// Its format version (docs/format.md).
    pub version: u16,
    /// Valid appends before any damage.
    pub records: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// Bytes of header and valid records.
    pub valid_bytes: u64,
    /// How the records end.
    pub end: SegmentEnd,
}

/// Streams a segment, handing each append of each valid record (position,
/// byte offset of the record, request) to `each`, and says how its records
/// end. An error only for a damaged or truncated header, or IO.
/// `progress(bytes)` is called every few thousand appends.
pub fn segment(
    path: &Path,
    mut each: impl FnMut(u64, u64, &AppendRequest),
    progress: &mut dyn FnMut(u64),
) -> Result<SegmentSummary> {
    let (f, len) = open(path)?;
    let mut t = Ticker::new(progress);
    let scan = segment::scan(
        path,
        io::BufReader::with_capacity(1 << 20, f),
        len,
        |_| Ok(()),
        |lsn, at, _, r| {
            each(lsn, at, r);
            t.tick(at);
            Ok(())
        },
    );
    let s = match scan {
        Ok(s) => s,
        Err(HeaderError::Short(got)) => {
            return Err(Error::corrupt(
                path,
                got as u64,
                crate::codec::truncated(segment::HEADER_LEN, got),
            ));
        }
        Err(HeaderError::Bad(e)) => return Err(e),
    };
    Ok(SegmentSummary {
        first_position: s.first_lsn,
        version: s.version,
        records: s.records,
        bytes: s.file_len,
        valid_bytes: s.valid_len,
        end: match s.end {
            End::Clean => SegmentEnd::Clean,
            End::Torn { offset, kind } => SegmentEnd::TornTail { offset, kind },
            End::MidLog {
                offset,
                kind,
                later,
            } => SegmentEnd::Damaged {
                offset,
                kind,
                later_write: later,
            },
        },
    })
}

/// Streams and verifies a Kafka snapshot (see [`kafka::read`]), handing each
/// entry to `each`. Returns the number of entries.
pub fn kafka_snapshot(
    path: &Path,
    mut each: impl FnMut(KafkaProducerEntry),
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    let (f, len) = open(path)?;
    let mut t = Ticker::new(progress);
    kafka::read(path, io::BufReader::with_capacity(1 << 20, f), len, |e| {
        each(e);
        t.tick(t.n + 1);
        Ok(())
    })
}

/// The state recovery would rebuild.
#[derive(Clone, Debug)]
pub struct RecoveredState(Shards);

impl RecoveredState {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key and its entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        (0..SHARDS).flat_map(move |i| self.0.shard(i).iter())
    }
}

/// What opening a store directory would do, found without writing a byte
/// or taking the lock: recovery run in strict mode on a read-only view.
/// `Ok((report, state))`: it would open, after doing what the report lists
/// (truncating a torn tail, removing leftover files); `Err`: it would refuse
/// with this error.
pub fn dry_run(dir: &Path) -> Result<(RecoveryReport, RecoveredState)> {
    let fs = ReadOnlyFs(StdFs);
    let rec = recovery::recover_dry(&fs, dir, RecoveryMode::Strict)?;
    Ok((rec.report, RecoveredState(rec.shards)))
}
