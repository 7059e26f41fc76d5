//! Rebuilding the state from the newest valid snapshot plus log replay.
//!
//! The rules, in order (docs/format.md has the same list):
//!
//! 1. Leftover temporary snapshot files are removed.
//! 2. The newest snapshot whose every byte verifies is loaded; a snapshot
//!    that fails is skipped (and reported) and the next older one is tried.
//!    With none, replay starts from an empty state at position 0.
//! 3. The log is replayed from the snapshot's position: segment after
//!    segment, each record's checksum verified, and each record classified
//!    by the rules against the state before it, which must say ACCEPTED (a
//!    record that does not apply means the log and the snapshot do not
//!    belong together).
//! 4. An incomplete or failing record in the last segment, followed by
//!    nothing but records written while its bytes were not yet durable, is
//!    a torn write from a crash: the segment is cut there and the bytes
//!    dropped are reported. Not if the snapshot covers records from there
//!    on: a snapshot is written only once its log is durable, so the bytes
//!    were durable, and nothing is cut (rule 5).
//! 5. Any other damage (a bad record followed by a record written after it
//!    was durable, damage in an
//!    earlier segment, a missing segment, a snapshot whose log is gone or
//!    that covers more than the log holds) is [`Error::Corrupt`], unless the
//!    store was opened with [`RecoveryMode::Salvage`], which keeps the
//!    longest valid prefix of the history, moves every discarded byte aside
//!    into `*.discarded` files, and reports what it discarded. A file set
//!    aside is never replaced: a later salvage of the same segment picks
//!    the next free name (`<segment>.discarded.1`, `.2`, ...), so running
//!    salvage again never destroys what an earlier one kept.
//!
//! Before any of this, an entry named like a segment, snapshot or
//! temporary snapshot that is not a regular file (symbolic links followed)
//! is [`Error::NotAFile`] in either mode: passing over it could forget
//! acknowledged appends.
//!
//! Recovery decides before it writes. It first reads: the files, the base
//! snapshot, and the log, replayed into the state, which together make a
//! [`plan`] of the history and of the repairs (rules 1, 4 and 5) that bring
//! the directory in step with it. Only then, if the store opens, does it
//! make them. So a refused open leaves every file as it was, a dry run
//! ([`crate::inspect::dry_run`]) is the same plan left undone rather than a
//! second procedure, and every write recovery makes is in one place,
//! where the order that makes it crash-safe can be read.
//!
//! Recovery never panics on any bytes and never invents state: whatever it
//! returns is the state after some prefix of the logged history.
//!
//! The folder holds everything recovery runs: `plan.rs` (the history and
//! its repairs, decided by reading), `replay.rs` (what each log record
//! does, in log order: recovery and truncation share it), `apply.rs`
//! (applying replayed appends on one or two threads), `loader.rs` (a
//! snapshot into a fresh state), `truncate.rs` (the state a truncation
//! computes, through the same replay), `semantics.rs` (which semantics
//! wrote the files) and `report.rs` (what recovery found and did, as
//! values).

pub(crate) mod apply;
pub(crate) mod loader;
mod plan;
pub(crate) mod reach;
pub(crate) mod replay;
pub(crate) mod report;
pub(crate) mod seek;
pub(crate) mod semantics;
pub(crate) mod skim;
pub(crate) mod truncate;

pub use report::{
    Damage, LogSeek, RecoveryMode, RecoveryReport, Repair, Salvage, SkippedSnapshot, SnapshotUsed,
    TornTail,
};

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::engine::shards::Shards;
use crate::error::{Corruption, Error, Result};
use crate::fs::FileSystem;
use crate::recovery::apply::{Failed, Parallel, Sequential, Sink};
use crate::recovery::replay::Replayer;
use crate::snapshot::meta::Meta;
use crate::wal::resume::{Resume, ScanFrom};
use crate::wal::segment::{self, End, HEADER_LEN, HeaderError};
use crate::wal::writer::SegmentInfo;
use plan::{Cut, Kept, LogEnd, Plan, Tail};

/// Bytes of log to replay from which a second thread helps apply them.
const PARALLEL_FROM: u64 = 8 << 20;

/// The state and the log as recovery leaves them.
pub(crate) struct Recovered {
    pub shards: Shards,
    /// The store-level state (log clock, highest offset, removed keys).
    pub meta: Meta,
    pub next_position: u64,
    pub segments: Vec<SegmentInfo>,
    /// The last segment to continue, as (bytes, records); `None`: start a
    /// new segment at `next_position`.
    pub active: Option<(u64, u64)>,
    /// The store id of the log's segments (`None`: no segment of version
    /// 3 or later was replayed).
    pub store_id: Option<u64>,
    /// Positions of the snapshots on disk that were not found damaged.
    pub snapshots: Vec<u64>,
    /// Positions of every snapshot file on disk.
    pub snapshot_files: BTreeSet<u64>,
    /// How far a partition's truncation must read, as far as the records
    /// replayed tell.
    pub reach: reach::Reach,
    pub report: RecoveryReport,
}

/// Where a replay of the plan stopped.
enum Stop {
    /// At the plan's `replay_to`.
    Reached,
    /// At the end of the log.
    End(LogEnd),
    /// At damage; the state holds every append before it.
    Damage(Box<Cut>),
    /// At an append that did not apply. The state may hold appends past the
    /// cut: of its record, or (`None`: a parallel replay, which cannot say
    /// where it failed) of other shards.
    DoesNotApply(Option<Box<Cut>>),
}

/// Recovers the store in `dir`: the plan, replayed, then repaired.
pub(crate) fn recover(fs: &dyn FileSystem, dir: &Path, mode: RecoveryMode) -> Result<Recovered> {
    let started = Instant::now();
    let (plan, mut rec) = recover_inner(fs, dir, mode)?;
    plan.repair(fs)?;
    rec.report.duration = started.elapsed();
    Ok(rec)
}

/// Recovery that writes nothing: the plan, replayed, and not repaired. The
/// report lists the repairs an open would make.
pub(crate) fn recover_dry(
    fs: &dyn FileSystem,
    dir: &Path,
    mode: RecoveryMode,
) -> Result<Recovered> {
    let started = Instant::now();
    let (_, mut rec) = recover_inner(fs, dir, mode)?;
    rec.report.dry_run = true;
    rec.report.duration = started.elapsed();
    Ok(rec)
}

/// Plans recovery and replays the plan into the state, writing nothing.
fn recover_inner(fs: &dyn FileSystem, dir: &Path, mode: RecoveryMode) -> Result<(Plan, Recovered)> {
    let (mut plan, (mut shards, mut meta)) = Plan::read(fs, dir, mode)?;
    // A Kafka-mode log replays into a Kafka-mode engine, from the base
    // snapshot's or from an empty one (docs/transactions.md).
    let kafka = matches!(
        semantics::stored(fs, dir)?,
        Some((crate::semantics::Semantics::Kafka, _))
    );
    let kafka_base = |meta: &mut Meta| {
        if kafka && meta.kafka.is_none() {
            meta.kafka = Some(Box::new(
                crate::engine::ProducerStateManager::with_semantics(
                    crate::semantics::Semantics::Kafka,
                ),
            ));
        }
    };
    kafka_base(&mut meta);
    // A long log is replayed on two threads if the machine has them. If a
    // record does not apply, that replay cannot say where the history
    // stops: replay again from the same base, sequentially, which can.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut threads = if plan.log_bytes >= PARALLEL_FROM && cores > 1 {
        2
    } else {
        1
    };
    let (progress, replayer) = loop {
        let mut progress = Progress::default();
        let mut replayer = Replayer::new(meta, None).tracking(plan.start);
        let stop = if threads == 2 {
            std::thread::scope(|scope| {
                let mut sink = Parallel::new(scope, &mut shards, false);
                replay(fs, &plan, &mut sink, &mut replayer, &mut progress)
            })?
        } else {
            let mut sink = Sequential::new(&mut shards);
            replay(fs, &plan, &mut sink, &mut replayer, &mut progress)?
        };
        let applied = replayer;
        let cut_before = plan.end.is_some();
        match stop {
            Stop::Reached if cut_before => break (progress, applied),
            Stop::Reached => return Err(internal()),
            _ if cut_before => return Err(internal()),
            Stop::End(end) => {
                plan.end_log(fs, end)?;
                break (progress, applied);
            }
            Stop::Damage(cut) => {
                plan.cut(fs, *cut)?;
                break (progress, applied);
            }
            // A record that does not apply shortens the plan to before its
            // record; the state holds more, so replay it again.
            Stop::DoesNotApply(Some(cut)) => plan.cut(fs, *cut)?,
            Stop::DoesNotApply(None) if threads == 2 => {}
            Stop::DoesNotApply(None) => return Err(internal()),
        }
        threads = 1;
        (shards, meta) = plan.base_state(fs)?;
        kafka_base(&mut meta);
    };
    let mut report = plan.report();
    report.segments_read = progress.segments_read;
    report.segments_skipped = progress.segments_skipped;
    report.records_read_not_replayed = progress.read_not_replayed;
    report.seek = progress.seek;
    report.clean_shutdown = progress.clean_shutdown;
    report.records_replayed = replayer.positions;
    report.replay_threads = threads;
    report.keys = shards.len() + replayer.meta.kafka.as_ref().map_or(0, |k| k.len());
    let (segments, active) = plan.kept_segments();
    let reach = replayer
        .reach
        .unwrap_or_else(|| reach::Reach::new(report.next_position));
    let rec = Recovered {
        shards,
        meta: replayer.meta,
        next_position: report.next_position,
        segments,
        active,
        store_id: plan.end.and_then(|e| e.store_id),
        snapshots: plan.valid_snapshots(),
        snapshot_files: plan.snapshot_files.clone(),
        reach,
        report,
    };
    Ok((plan, rec))
}

/// A replay that did not go as the plan said it would: a bug.
fn internal() -> Error {
    Error::Internal("a replay of recovery's plan did not end where the plan does")
}

/// What a replay read, for the report.
#[derive(Default)]
struct Progress {
    segments_read: usize,
    /// Segments wholly below the plan's start, not read.
    segments_skipped: usize,
    /// See [`RecoveryReport::clean_shutdown`]: set once the last segment
    /// is read.
    clean_shutdown: Option<bool>,
    /// See [`RecoveryReport::records_read_not_replayed`].
    read_not_replayed: u64,
    /// See [`RecoveryReport::seek`].
    seek: Option<LogSeek>,
}

/// Replays the plan's log into `sink`: from its start to its `replay_to`
/// or, before a cut, to wherever the log ends or stops being the history.
fn replay(
    fs: &dyn FileSystem,
    plan: &Plan,
    sink: &mut dyn Sink,
    replayer: &mut Replayer,
    progress: &mut Progress,
) -> Result<Stop> {
    let (start, segments) = (plan.start, &plan.segments);
    let Some(first_idx) = segments.iter().rposition(|&l| l <= start) else {
        return Ok(no_segment_holds_the_start(plan));
    };
    // Segments before `first_idx` end at or below the start (the next
    // one's name says so): none of their records is replayed, so none is
    // read. Their names show the log below the start has no hole; their
    // bytes matter only to a fallback to an older snapshot, which this
    // replay is not.
    progress.segments_skipped = first_idx;
    let last_idx = segments.len() - 1;
    let mut at = Reading {
        idx: first_idx,
        named: 0,
        path: PathBuf::new(),
        expected: segments.get(first_idx).copied().unwrap_or(start),
        last: None,
        store_id: None,
    };
    for (idx, &named) in segments.iter().enumerate().skip(first_idx) {
        (at.idx, at.named, at.path) = (idx, named, plan.segment_path(idx));
        if named != at.expected {
            let expected = at.expected;
            let kind = Corruption::MissingRecords {
                expected,
                found: named,
            };
            return Ok(at.damage(None, Damage::new(&at.path, 0, kind)));
        }
        progress.segments_read += 1;
        let mut from = ScanFrom {
            resume: None,
            bounded_room_after_close: idx == last_idx,
            only_partition: None,
            stop_at: None,
        };
        if idx == first_idx {
            from.resume = seek_in_first(fs, plan, &at, progress)?;
        }
        let scan = match read_segment(fs, plan, &at, from, sink, replayer, progress)? {
            ControlFlow::Continue(scan) => scan,
            ControlFlow::Break(stop) => return Ok(stop),
        };
        let keep = at.kept(scan.valid_len, scan.records);
        match scan.end {
            End::Clean => {}
            // The snapshot covers records from the damage on: a snapshot
            // is written only once the log it covers is durable, so the
            // damaged bytes were durable and are not a torn write. Refuse
            // before cutting anything (salvage moves the rest aside).
            End::Torn { offset, .. } if idx == last_idx && named + scan.records < start => {
                let ends_in = Some((at.path.clone(), offset));
                let damage = plan.beyond(named + scan.records, ends_in);
                return Ok(at.damage(keep, damage));
            }
            End::Torn { offset, .. } if idx == last_idx => {
                let bytes = scan.file_len - offset;
                let preallocated = scan.room.min(bytes);
                return Ok(Stop::End(LogEnd {
                    next: named + scan.records,
                    last: keep,
                    tail: Tail::Torn {
                        bytes,
                        preallocated,
                    },
                    store_id: at.store_id.or(scan.store),
                }));
            }
            End::Torn { offset, kind } => {
                return Ok(at.damage(keep, Damage::new(&at.path, offset, kind)));
            }
            End::MidLog { offset, kind, .. } => {
                let kind = match kind {
                    k @ Corruption::MisplacedRecord { .. } => k,
                    _ => Corruption::DamagedMidLog,
                };
                return Ok(at.damage(keep, Damage::new(&at.path, offset, kind)));
            }
        }
        at.store_id = at.store_id.or(scan.store);
        at.expected = named + scan.records;
        at.last = keep;
    }
    let (next, last, tail, store_id) = (at.expected, at.last, Tail::Clean, at.store_id);
    Ok(Stop::End(LogEnd {
        next,
        last,
        tail,
        store_id,
    }))
}

/// Where replay starts in the first segment it reads, `at` (the one that
/// holds the plan's start): at the base snapshot's log point if it
/// recorded one inside this segment and the point's checks pass (noted in
/// `progress` either way), else at the first record (`None`).
fn seek_in_first(
    fs: &dyn FileSystem,
    plan: &Plan,
    at: &Reading,
    progress: &mut Progress,
) -> Result<Option<Resume>> {
    let Some(point) = plan.point.filter(|_| at.named < plan.start) else {
        return Ok(None);
    };
    let (seek, resume) = seek::checked(fs, &at.path, point, plan.start - at.named, None)?;
    progress.seek = Some(seek);
    Ok(resume)
}

/// No segment starts at or before the plan's start: an empty log (a new
/// store), or the log the base snapshot needs is gone.
fn no_segment_holds_the_start(plan: &Plan) -> Stop {
    if plan.segments.is_empty() && plan.start == 0 {
        let (next, last, tail, store_id) = (0, None, Tail::Clean, None);
        return Stop::End(LogEnd {
            next,
            last,
            tail,
            store_id,
        });
    }
    Stop::Damage(Box::new(plan.log_gone()))
}

/// The segment replay is reading, and the log before it.
struct Reading {
    /// Its index in the plan's segments.
    idx: usize,
    /// The position its name gives.
    named: u64,
    path: PathBuf,
    /// The position the log before it ends at.
    expected: u64,
    /// The last segment read whole before it, and what the history keeps
    /// of it.
    last: Option<Kept>,
    /// The store id of the first segment replayed of version 3 or later;
    /// every later one must have it.
    store_id: Option<u64>,
}

impl Reading {
    fn kept(&self, len: u64, records: u64) -> Option<Kept> {
        let seg = self.idx;
        Some(Kept { seg, len, records })
    }

    /// The history stops in this segment, keeping `keep` of it.
    fn cut(&self, keep: Option<Kept>, damage: Damage) -> Box<Cut> {
        let good_end = keep.map_or(self.expected, |k| self.named + k.records);
        Box::new(Cut {
            seg: self.idx,
            keep,
            good_end,
            prev: self.last,
            store_id: self.store_id,
            damage,
        })
    }

    fn damage(&self, keep: Option<Kept>, damage: Damage) -> Stop {
        Stop::Damage(self.cut(keep, damage))
    }
}

/// Refuses a segment whose header disagrees with its name (it is not the
/// log's) or names another store, before any of its records is applied
/// (salvage moves it aside whole).
fn check_belongs(path: &Path, at: &Reading, h: &segment::Header) -> Result<()> {
    let named = at.named;
    match (at.store_id, h.store) {
        _ if h.first_position != named => {
            let kind = Corruption::NameMismatch {
                named,
                header: h.first_position,
            };
            Err(Error::corrupt(path, segment::POSITION_AT, kind))
        }
        (Some(expected), Some(found)) if expected != found => {
            let kind = Corruption::ForeignSegment { expected, found };
            Err(Error::corrupt(path, 20, kind))
        }
        _ => Ok(()),
    }
}

/// Scans one segment into `sink`, applying its records from the plan's
/// start on: how its records end, or where replay stops in it (a record
/// that does not apply, the plan's end, a header that is not this
/// segment's).
fn read_segment(
    fs: &dyn FileSystem,
    plan: &Plan,
    at: &Reading,
    from: ScanFrom,
    sink: &mut dyn Sink,
    replayer: &mut Replayer,
    progress: &mut Progress,
) -> Result<ControlFlow<Stop, segment::Scan>> {
    let (path, named) = (&at.path, at.named);
    let is_last = at.idx + 1 == plan.segments.len();
    let file = fs.open_read(path).map_err(Error::at("open", path))?;
    let len = file.len().map_err(Error::at("stat", path))?;
    let foreign = |h: &segment::Header| check_belongs(path, at, h);
    let mut reached = false;
    let mut not_replayed = 0;
    let mut scanned = segment::scan_file(path, file, len, from, foreign, |pos, offset, nth, op| {
        if op.takes_position() && plan.replay_to.is_some_and(|to| pos >= to) {
            // Not damage: the error only stops the scan.
            reached = true;
            return Err(Error::corrupt(
                path,
                offset,
                Corruption::BadField("end of plan"),
            ));
        }
        // An operation that takes no position applies to what follows it:
        // one at the start position is part of the replay.
        if pos >= plan.start {
            replayer.op(pos, offset, nth, op, |rec| sink.push(rec, path))?;
        } else if op.takes_position() {
            not_replayed += 1;
        }
        Ok(())
    });
    progress.read_not_replayed += not_replayed;
    if (scanned.is_ok() || reached)
        && let Err(e) = sink.drain(path)
    {
        scanned = Err(HeaderError::Bad(e));
    }
    let stop = match sink.take_failure() {
        Some(Failed::At {
            at: offset,
            first,
            damage,
        }) => {
            let keep = at.kept(offset, first.saturating_sub(named));
            Stop::DoesNotApply(Some(at.cut(keep, damage)))
        }
        Some(Failed::Somewhere) => Stop::DoesNotApply(None),
        None if reached => Stop::Reached,
        None => match scanned {
            Ok(scan) => {
                if is_last {
                    progress.clean_shutdown = match scan.end {
                        End::Clean if scan.version >= 3 => Some(scan.closed),
                        End::Clean => None,
                        _ => Some(false),
                    };
                }
                return Ok(ControlFlow::Continue(scan));
            }
            // A segment whose creation was cut off: it holds no record.
            Err(HeaderError::Short(_)) if is_last => {
                progress.clean_shutdown = Some(false);
                let (next, last, tail) = (at.expected, at.last, Tail::EmptyLast(at.idx));
                let store_id = at.store_id;
                Stop::End(LogEnd {
                    next,
                    last,
                    tail,
                    store_id,
                })
            }
            Err(HeaderError::Short(n)) => {
                let kind = crate::codec::truncated(HEADER_LEN, n);
                at.damage(None, Damage::new(path, 0, kind))
            }
            Err(HeaderError::Bad(Error::Corrupt { file, offset, kind })) => {
                at.damage(None, Damage { file, offset, kind })
            }
            // Not damage (salvage must not move a newer build's log aside),
            // or an IO error.
            Err(HeaderError::Bad(e)) => return Err(e),
        },
    };
    Ok(ControlFlow::Break(stop))
}

#[cfg(test)]
mod tests;
