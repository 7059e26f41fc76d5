//! Truncation's state: what the history is with every append at or above
//! an offset removed, rebuilt from a retained snapshot and the log.
//!
//! The base is a snapshot whose store section says every append it holds
//! lies below the offset (its `high` is below it), or the empty state if
//! the log still starts at position 0. From there the log is replayed as
//! [`crate::recovery::replay`] says for a target offset: appends at or above it, and
//! earlier truncations and imports that reach at or above it, are passed
//! over; an append that no longer applies is dropped. The store then logs
//! the difference between that state and its own as one atomic group
//! (`store::rewind`).
//!
//! This reads only what a durable, recovered log holds: the store calls it
//! with every record durable and nothing in flight, so any damage found is
//! an error, never a cut. A partition's replay passes over the other
//! partitions' single-partition records by their framing and checksum,
//! without decoding them (`ScanFrom::only_partition`): nothing of them
//! reaches the state it rebuilds, and its cost follows the partition's
//! records.
//!
//! The same replay builds a Kafka-mode snapshot's state
//! ([`kafka_state_at`]): the state at the snapshot's position, from the
//! newest snapshot below it and the log, on the snapshot's thread, while
//! appenders go on (copying the live engine under the store's lock would
//! stop them for as long as the copy takes).

use std::path::{Path, PathBuf};

use crate::directory::names;
use crate::engine::shards::Shards;
use crate::error::{Corruption, Error, Result};
use crate::fs::FileSystem;
use crate::recovery::apply::{Parallel, Sequential, Sink};
use crate::recovery::loader::load_file_of;
use crate::recovery::reach::Placed;
use crate::recovery::replay::Replayer;
use crate::recovery::seek;
use crate::recovery::skim;
use crate::snapshot;
use crate::snapshot::meta::Meta;
use crate::wal::resume::ScanFrom;
use crate::wal::segment::{self, End, HeaderError};

/// Bytes of log from which two threads apply the replay (as recovery).
const PARALLEL_FROM: u64 = 8 << 20;

/// Where a truncation's replay starts.
pub(crate) struct Base {
    /// The snapshot, or `None`: the empty state at position 0.
    pub snapshot: Option<PathBuf>,
    pub position: u64,
}

/// The lowest offset a truncation from each possible base can reach, and
/// the base to use for `offset`: the newest snapshot (of `snapshots`,
/// positions) whose `high` is below `offset` (with `partition`, that
/// partition's end, if the snapshot records it exactly), else position 0
/// if the log starts there. `Err(lowest)` when none can: the lowest offset
/// any base can reach.
pub(crate) fn pick_base(
    fs: &dyn FileSystem,
    dir: &Path,
    snapshots: &[u64],
    log_from_zero: bool,
    offset: i64,
    partition: Option<i32>,
) -> Result<std::result::Result<Base, i64>> {
    let mut lowest = i64::MAX;
    for &pos in snapshots.iter().rev() {
        let path = dir.join(names::snapshot_name(pos));
        let meta = snapshot::read_meta(fs, &path)?;
        let high = match partition {
            Some(p) if meta.ends.exact() => meta.ends.get(p),
            _ => meta.high,
        };
        lowest = lowest.min(high.saturating_add(1));
        if high < offset {
            return Ok(Ok(Base {
                snapshot: Some(path),
                position: pos,
            }));
        }
    }
    if log_from_zero {
        // The empty state holds no append: it reaches every offset above -1.
        lowest = lowest.min(0);
        if offset >= 0 {
            return Ok(Ok(Base {
                snapshot: None,
                position: 0,
            }));
        }
    }
    Ok(Err(lowest))
}

/// What a replay reads: the directory (through `fs`), the base it starts
/// from, and the live log's segments (first positions, ascending) up to
/// position `end`. Of the last segment only the first `last_len` bytes are
/// read: what was written when the list was taken (the log may go on
/// meanwhile).
pub(crate) struct History<'a> {
    pub(crate) fs: &'a dyn FileSystem,
    pub(crate) dir: &'a Path,
    pub(crate) base: &'a Base,
    pub(crate) segments: &'a [u64],
    pub(crate) last_len: u64,
    pub(crate) end: u64,
    /// Where the records a partition's replay reads lie, if known
    /// ([`crate::recovery::reach::Reach::units`]): it reads them alone.
    pub(crate) units: Option<&'a [Placed]>,
    /// Set when the replay read the units alone.
    pub(crate) skimmed: std::cell::Cell<bool>,
}

impl History<'_> {
    /// The same history, read from the log (not where the units say).
    pub(crate) fn reading_the_log(&self) -> History<'_> {
        History {
            units: None,
            skimmed: Default::default(),
            ..*self
        }
    }
}

/// The state of the history with every append at or above `offset`
/// removed: the base replayed through the log of `h`. With `only`, that
/// partition's keys alone are rebuilt (the others' are the base's).
pub(crate) fn truncated_state(h: &History<'_>, offset: i64, only: Option<i32>) -> Result<Shards> {
    let History { fs, dir, base, .. } = *h;
    let (mut shards, meta, point) = match &base.snapshot {
        Some(path) => {
            let l = load_file_of(fs, path, only)?;
            (l.shards, l.meta, l.header.point)
        }
        None => (Shards::default(), Meta::default(), None),
    };
    let start = base.position;
    let segs = segments_from(dir, h.segments, start)?;
    let mut replayer = replayer(meta, offset, only);
    if skimmed(
        h,
        segs,
        only,
        &mut replayer,
        &mut Sequential::dropping(&mut shards),
    )? {
        return Ok(shards);
    }
    // The bytes of the segments the replay reads, for the choice of one
    // or two threads.
    let bytes: u64 = read_by(segs, h.end)
        .iter()
        .map(|&s| {
            let p = dir.join(names::segment_name(s));
            fs.open_read(&p).and_then(|f| f.len()).unwrap_or(0)
        })
        .sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let log = Log {
        segments: segs,
        last_len: h.last_len,
        point,
    };
    if bytes >= PARALLEL_FROM && cores > 1 {
        std::thread::scope(|scope| {
            let mut sink = Parallel::new(scope, &mut shards, true);
            replay(fs, dir, log, start, h.end, &mut replayer, &mut sink)
        })?;
    } else {
        let mut sink = Sequential::dropping(&mut shards);
        replay(fs, dir, log, start, h.end, &mut replayer, &mut sink)?;
    }
    Ok(shards)
}

/// Truncation's replayer: of the whole store, or of partition `only`.
fn replayer(meta: Meta, offset: i64, only: Option<i32>) -> Replayer {
    match only {
        Some(p) => Replayer::for_partition(meta, offset, p),
        None => Replayer::new(meta, Some(offset)),
    }
}

/// The segments replay reads from `start`: from the last one that begins
/// at or before it; the log is gone if none does.
fn segments_from<'a>(dir: &Path, segments: &'a [u64], start: u64) -> Result<&'a [u64]> {
    let first = segments.iter().rposition(|&s| s <= start).ok_or_else(|| {
        let kind = Corruption::LogGone {
            needed: start,
            oldest: segments.first().copied(),
        };
        Error::corrupt(dir, 0, kind)
    })?;
    Ok(segments.get(first..).unwrap_or_default())
}

/// A partition's replay (`only`) of the records of `h` where its units
/// say, from `segments` (those from the base on), into `replayer` and
/// `sink`; false, with nothing replayed, when there are no units or the
/// records cannot be read by them: the caller then reads the log.
fn skimmed(
    h: &History<'_>,
    segments: &[u64],
    only: Option<i32>,
    replayer: &mut Replayer,
    sink: &mut dyn Sink,
) -> Result<bool> {
    let Some(units) = h.units.filter(|_| only.is_some()) else {
        return Ok(false);
    };
    let log = (segments, h.last_len);
    let done = skim::replay_units(h.fs, h.dir, log, units, h.end, replayer, sink)?;
    h.skimmed.set(done);
    Ok(done)
}

/// Of `segments` (first positions, ascending, the first holding the
/// replay's start), those a replay that stops at `end` reads: the ones
/// holding a position below it, and always the first.
fn read_by(segments: &[u64], end: u64) -> &[u64] {
    let needed = segments.iter().take_while(|&&s| s < end).count();
    segments.get(..needed.max(1)).unwrap_or(segments)
}

/// A Kafka-mode store's state with every batch and marker at or above
/// `offset` removed (Kafka's `truncateAndReload`: the producers, their
/// open transactions and the aborted list as of the log below it): the
/// base's engine replayed through the log of `h` as
/// [`crate::recovery::replay`] says for a target offset. With `only`, that
/// partition alone is rebuilt.
pub(crate) fn truncated_kafka(
    h: &History<'_>,
    offset: i64,
    only: Option<i32>,
) -> Result<crate::engine::ProducerStateManager> {
    kafka_replayed(h, only, |meta| replayer(meta, offset, only))
}

/// The Kafka-mode state at the end of `h`: the base's engine with the log
/// replayed up to it, never classified (as recovery replays it). Every
/// record below the end must be durable.
pub(crate) fn kafka_state_at(h: &History<'_>) -> Result<crate::engine::ProducerStateManager> {
    kafka_replayed(h, None, |meta| Replayer::new(meta, None))
}

/// The base's Kafka engine (an empty one at position 0; with `only`, of
/// that partition alone) with the log of `h` replayed into it by the
/// replayer `make` builds around it.
fn kafka_replayed(
    h: &History<'_>,
    only: Option<i32>,
    make: impl FnOnce(Meta) -> Replayer,
) -> Result<crate::engine::ProducerStateManager> {
    let History { fs, dir, base, .. } = *h;
    let (mut meta, point) = match &base.snapshot {
        Some(path) => {
            let l = load_file_of(fs, path, only)?;
            (l.meta, l.header.point)
        }
        None => (Meta::default(), None),
    };
    if meta.kafka.is_none() {
        meta.kafka = Some(Box::new(
            crate::engine::ProducerStateManager::with_semantics(crate::semantics::Semantics::Kafka),
        ));
    }
    let log = Log {
        segments: segments_from(dir, h.segments, base.position)?,
        last_len: h.last_len,
        point,
    };
    let mut replayer = make(meta);
    // Kafka-mode records go to the engine, never to the sink.
    let mut shards = Shards::default();
    let mut sink = Sequential::dropping(&mut shards);
    if !skimmed(h, log.segments, only, &mut replayer, &mut sink)? {
        replay(fs, dir, log, base.position, h.end, &mut replayer, &mut sink)?;
    }
    replayer
        .meta
        .kafka
        .map(|k| *k)
        .ok_or(Error::Internal("a Kafka-mode replay lost its engine"))
}

/// The segments a replay reads (first positions, ascending), how many
/// bytes of the last one (what was written when the list was taken: the
/// log may go on meanwhile, and a write in progress is not a record; the
/// zeros of a preallocated segment's room are not read either), and where
/// the base snapshot's position lies in the first one, if it recorded it.
struct Log<'a> {
    segments: &'a [u64],
    last_len: u64,
    point: Option<snapshot::LogPoint>,
}

/// Replays `log` from position `start` to `end` into `sink`; the scan
/// stops at `end` (outside a group), which may lie before the log's end.
fn replay(
    fs: &dyn FileSystem,
    dir: &Path,
    log: Log<'_>,
    start: u64,
    end: u64,
    replayer: &mut Replayer,
    sink: &mut dyn Sink,
) -> Result<()> {
    let segments = read_by(log.segments, end);
    let mut expected = segments.first().copied().unwrap_or(start);
    for (i, &named) in segments.iter().enumerate() {
        let path = dir.join(names::segment_name(named));
        if named != expected {
            let kind = Corruption::MissingRecords {
                expected,
                found: named,
            };
            return Err(Error::corrupt(&path, 0, kind));
        }
        let file = fs
            .open_read(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let mut len = file.len().map_err(|e| Error::io("stat", &path, e))?;
        if Some(&named) == log.segments.last() {
            len = len.min(log.last_len);
        }
        let mut from = ScanFrom {
            only_partition: replayer.only(),
            stop_at: Some(end),
            ..ScanFrom::default()
        };
        // The base snapshot's records of the first segment are not read
        // when it recorded where they end and a record (or the end) is
        // there, as recovery does (docs/format.md, Recovering, step 3).
        if let Some(p) = log.point.filter(|_| i == 0 && named < start) {
            from.resume = seek::checked(fs, &path, p, start - named, Some(len))?.1;
        }
        let scan = segment::scan_file(
            &path,
            file,
            len,
            from,
            |h| {
                if h.first_position == named {
                    Ok(())
                } else {
                    let kind = Corruption::NameMismatch {
                        named,
                        header: h.first_position,
                    };
                    Err(Error::corrupt(&path, segment::POSITION_AT, kind))
                }
            },
            |pos, at, nth, op| {
                // Nothing lies at or past `end` but operations that take no
                // position (a clock record after the last append).
                if pos >= start && (pos < end || !op.takes_position()) {
                    replayer.op(pos, at, nth, op, |rec| sink.push(rec, &path))?;
                }
                Ok(())
            },
        );
        sink.drain(&path)?;
        let scan = match scan {
            Ok(s) => s,
            Err(HeaderError::Bad(e)) => return Err(e),
            Err(HeaderError::Short(n)) => {
                return Err(Error::corrupt(
                    &path,
                    0,
                    crate::codec::truncated(segment::HEADER_LEN, n),
                ));
            }
        };
        match scan.end {
            End::Clean => {}
            End::Torn { offset, kind } | End::MidLog { offset, kind, .. } => {
                return Err(Error::corrupt(&path, offset, kind));
            }
        }
        expected = named + scan.records;
    }
    if expected < end {
        let kind = Corruption::MissingRecords {
            expected: end,
            found: expected,
        };
        return Err(Error::corrupt(dir, 0, kind));
    }
    Ok(())
}
