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
//! Recovery never panics on any bytes and never invents state: whatever it
//! returns is the state after some prefix of the logged history.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::apply::{Parallel, Rec, Sequential, Sink};
use crate::error::{Corruption, Error, Result};
use crate::files::{StoreFile, classify};
use crate::fs::{EntryKind, FileSystem};
use crate::map::hash_key;
use crate::shards::Shards;
use crate::snapshot;
use crate::wal::segment::{self, End, HEADER_LEN, HeaderError};
use crate::wal::writer::SegmentInfo;

/// Bytes of log to replay from which a second thread helps apply them.
const PARALLEL_FROM: u64 = 8 << 20;

/// What recovery does with damage other than a torn tail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Refuse: damage anywhere but a torn tail is [`Error::Corrupt`]. The default.
    #[default]
    Strict,
    /// Keep the longest valid prefix of the history; move what is discarded
    /// aside (`<file>.discarded`, or `<file>.discarded.<n>` if an earlier
    /// salvage left that name taken) and report it. For an operator who has
    /// decided that losing the damaged suffix is better than not starting.
    Salvage,
}

/// The snapshot recovery started from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotUsed {
    /// Its path.
    pub file: PathBuf,
    /// The log position it covers (records before it are in the snapshot).
    pub position: u64,
    /// Number of keys it holds.
    pub entries: u64,
}

/// A snapshot that failed verification and was passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedSnapshot {
    /// Its path.
    pub file: PathBuf,
    /// Why it was skipped.
    pub reason: String,
}

/// The torn end of the log that recovery cut off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment that was cut.
    pub file: PathBuf,
    /// Where it was cut.
    pub offset: u64,
    /// How many bytes were dropped.
    pub bytes: u64,
}

/// What salvage discarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Salvage {
    /// The damage that stopped replay.
    pub cause: String,
    /// Where each discarded file (or file tail) went: the new files, named
    /// `<file>.discarded` or `<file>.discarded.<n>` after the file they came
    /// from, in log order.
    pub discarded: Vec<PathBuf>,
    /// Bytes moved aside.
    pub bytes: u64,
}

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The snapshot used, if any.
    pub snapshot: Option<SnapshotUsed>,
    /// Newer snapshots that failed verification, newest first.
    pub skipped_snapshots: Vec<SkippedSnapshot>,
    /// Segments read.
    pub segments_read: usize,
    /// Log records replayed on top of the snapshot.
    pub records_replayed: u64,
    /// Threads that applied them: 2 when a long log (8 MiB or more) was
    /// replayed with a helper thread, else 1 (also when a record that did
    /// not apply sent recovery back to a sequential replay).
    pub replay_threads: usize,
    /// The torn tail cut off the last segment, if there was one.
    pub torn_tail: Option<TornTail>,
    /// How the store was last shut down: `Some(true)` if the log ends with
    /// the close marker a clean close writes, `Some(false)` if it does not
    /// (a crash, a kill, or a process that never closed the store),
    /// `None` if it cannot tell (a new store, or a log whose last segment
    /// is of a version before 3, which has no markers). What a marker can
    /// and cannot prove is in docs/format.md.
    pub clean_shutdown: Option<bool>,
    /// Files removed: leftover temporary snapshots, a segment whose
    /// creation was cut off before its header was complete.
    pub files_removed: Vec<PathBuf>,
    /// What salvage discarded (only with [`RecoveryMode::Salvage`]).
    pub salvage: Option<Salvage>,
    /// Keys in the recovered state.
    pub keys: usize,
    /// The log position the next accepted append gets.
    pub next_position: u64,
    /// How long recovery took.
    pub duration: Duration,
    /// True for a dry run ([`crate::inspect::dry_run`]): what this report
    /// lists as removed or truncated would be, but nothing was written.
    pub dry_run: bool,
}

impl RecoveryReport {
    /// Bytes of torn tail dropped (0 if none).
    pub fn torn_bytes_dropped(&self) -> u64 {
        self.torn_tail.as_ref().map_or(0, |t| t.bytes)
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.snapshot {
            Some(s) => writeln!(
                f,
                "snapshot: {} (position {}, {} keys)",
                s.file.display(),
                s.position,
                s.entries
            )?,
            None => writeln!(f, "snapshot: none (replay from position 0)")?,
        }
        for s in &self.skipped_snapshots {
            writeln!(f, "skipped snapshot: {} ({})", s.file.display(), s.reason)?;
        }
        writeln!(
            f,
            "replayed: {} records from {} segment(s) on {} thread(s)",
            self.records_replayed,
            self.segments_read,
            self.replay_threads.max(1)
        )?;
        match &self.torn_tail {
            Some(t) => writeln!(
                f,
                "torn tail: {} bytes dropped from {} at byte {}",
                t.bytes,
                t.file.display(),
                t.offset
            )?,
            None => writeln!(f, "torn tail: none")?,
        }
        let shutdown = match self.clean_shutdown {
            Some(true) => "clean",
            Some(false) => "unclean",
            None => "unknown",
        };
        writeln!(f, "previous shutdown: {shutdown}")?;
        for p in &self.files_removed {
            writeln!(f, "removed: {}", p.display())?;
        }
        if let Some(s) = &self.salvage {
            writeln!(f, "salvage: {} ({} bytes moved aside)", s.cause, s.bytes)?;
            for p in &s.discarded {
                writeln!(f, "  discarded: {}", p.display())?;
            }
        }
        write!(
            f,
            "state: {} keys, next position {}, recovered in {:.1} ms",
            self.keys,
            self.next_position,
            self.duration.as_secs_f64() * 1e3
        )
    }
}

/// The state and the log as recovery leaves them.
pub(crate) struct Recovered {
    pub shards: Shards,
    pub next_lsn: u64,
    pub segments: Vec<SegmentInfo>,
    /// The last segment to continue, as (bytes, records); `None`: start a
    /// new segment at `next_lsn`.
    pub active: Option<(u64, u64)>,
    /// The store id of the log's segments (`None`: no segment of version
    /// 3 or later was replayed).
    pub store_id: Option<u64>,
    /// Positions of the snapshots on disk that were not found damaged.
    pub snapshots: Vec<u64>,
    /// Positions of every snapshot file on disk.
    pub snapshot_files: BTreeSet<u64>,
    pub report: RecoveryReport,
}

/// Where replay had to stop, for salvage.
struct Cut {
    /// The first segment (index) that is not kept whole.
    seg: usize,
    /// What to keep of segment `seg`: (bytes, records); `None`: nothing.
    keep: Option<(u64, u64)>,
    /// The log position right after the last good record.
    good_end: u64,
    /// The last segment kept whole, as (index, bytes, records).
    prev: Option<(usize, u64, u64)>,
    /// The store id of the segments before the cut.
    store_id: Option<u64>,
    error: Error,
}

/// Why replay stopped early: damage (salvageable), an error that ends
/// recovery (IO, a file of an unknown version), a record
/// that did not apply during a parallel replay (replay again,
/// sequentially, to find it), or an append that did not apply after others
/// of its record had (replay again and stop before the record).
enum Stop {
    Damage(Box<Cut>),
    Io(Error),
    Retry,
    RetryBefore(u64, Corruption),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Io(e)
    }
}

struct Replayed {
    next_lsn: u64,
    store_id: Option<u64>,
    /// Index (into the segment list) and (bytes, records) of the segment to continue.
    active: Option<(usize, u64, u64)>,
}

fn io_at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(op, path, e)
}

/// Loads and verifies a snapshot into a fresh state.
pub(crate) fn load_snapshot(
    fs: &dyn FileSystem,
    path: &Path,
) -> Result<(snapshot::Header, Shards)> {
    let file = fs.open_read(path).map_err(io_at("open", path))?;
    let len = file.len().map_err(io_at("stat", path))?;
    crate::loader::load(path, file, len)
}

pub(crate) fn recover(fs: &dyn FileSystem, dir: &Path, mode: RecoveryMode) -> Result<Recovered> {
    recover_inner(fs, dir, mode, false)
}

/// Recovery that writes nothing: what it would remove or truncate is
/// reported, not done; damage is an error even in salvage mode.
pub(crate) fn recover_dry(
    fs: &dyn FileSystem,
    dir: &Path,
    mode: RecoveryMode,
) -> Result<Recovered> {
    recover_inner(fs, dir, mode, true)
}

fn recover_inner(
    fs: &dyn FileSystem,
    dir: &Path,
    mode: RecoveryMode,
    dry: bool,
) -> Result<Recovered> {
    let started = Instant::now();
    let mut report = RecoveryReport {
        dry_run: dry,
        ..RecoveryReport::default()
    };
    let listing = fs.list(dir).map_err(io_at("list", dir))?;
    refuse_what_is_not_a_file(fs, dir, &listing)?;

    let mut segments: Vec<u64> = Vec::new();
    let mut snapshot_files = BTreeSet::new();
    // The naming rule the inspector shares (`files::classify`).
    for e in &listing {
        match classify(&e.name) {
            Some(StoreFile::SnapshotTemp(_) | StoreFile::SegmentTemp(_)) => {
                let p = dir.join(&e.name);
                if !dry {
                    fs.remove_file(&p).map_err(io_at("remove", &p))?;
                }
                report.files_removed.push(p);
            }
            Some(StoreFile::Segment(lsn)) => segments.push(lsn),
            Some(StoreFile::Snapshot(pos)) => {
                snapshot_files.insert(pos);
            }
            None => {}
        }
    }
    segments.sort_unstable();
    if !report.files_removed.is_empty() && !dry {
        fs.sync_dir(dir).map_err(io_at("fsync directory", dir))?;
    }

    // The newest snapshot that verifies.
    let mut base = None;
    let mut damaged = BTreeSet::new();
    for &pos in snapshot_files.iter().rev() {
        let path = dir.join(snapshot::file_name(pos));
        let loaded = load_snapshot(fs, &path).and_then(|(h, shards)| {
            if h.position == pos {
                Ok((h, shards))
            } else {
                Err(Error::corrupt(
                    &path,
                    16,
                    Corruption::NameMismatch {
                        named: pos,
                        header: h.position,
                    },
                ))
            }
        });
        match loaded {
            Ok((h, shards)) => {
                report.snapshot = Some(SnapshotUsed {
                    file: path,
                    position: h.position,
                    entries: h.entries,
                });
                base = Some((h.position, shards));
                break;
            }
            // A newer build's file is not damage: never skip it (a
            // fallback would write over its history).
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            Err(e) if e.is_corruption() => {
                damaged.insert(pos);
                report.skipped_snapshots.push(SkippedSnapshot {
                    file: path,
                    reason: e.to_string(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    let (start, mut shards) = base.unwrap_or((0, Shards::default()));

    // A long log is replayed on two threads if the machine has them. If a
    // record does not apply, that replay cannot say where the history
    // stops: replay again from the same base, sequentially, which can.
    let first = segments.iter().rev().find(|&&l| l <= start).copied();
    let to_replay: u64 = listing
        .iter()
        .filter(|e| segment::parse_name(&e.name).is_some_and(|l| first.is_some_and(|f| l >= f)))
        .map(|e| e.len)
        .sum();
    let parallel = to_replay >= PARALLEL_FROM
        && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    // The report before replay, for a replay again.
    let unreplayed = report.clone();
    let mut result = if parallel {
        let mut r = report.clone();
        let out = std::thread::scope(|scope| {
            let mut sink = Parallel::new(scope, &mut shards);
            replay(fs, dir, &segments, start, &mut sink, &mut r, dry)
        });
        if !matches!(out, Err(Stop::Retry)) {
            report = r;
            report.replay_threads = 2;
        }
        out
    } else {
        Err(Stop::Retry)
    };
    if matches!(result, Err(Stop::Retry)) {
        report.replay_threads = 1;
        if parallel {
            shards = fresh_base(fs, &report)?;
        }
        result = replay(
            fs,
            dir,
            &segments,
            start,
            &mut Sequential::new(&mut shards),
            &mut report,
            dry,
        );
    }
    // An append that did not apply after others of its record had: the
    // state may not keep part of a record, so replay again and stop
    // before it.
    if let Err(Stop::RetryBefore(position, kind)) = result {
        report = unreplayed;
        report.replay_threads = 1;
        shards = fresh_base(fs, &report)?;
        result = replay(
            fs,
            dir,
            &segments,
            start,
            &mut Sequential::stopping_before(&mut shards, position, kind),
            &mut report,
            dry,
        );
    }
    let replayed = match result {
        Ok(r) => r,
        Err(Stop::Retry) | Err(Stop::RetryBefore(..)) => {
            return Err(Error::Internal("a sequential replay asked to be retried"));
        }
        Err(Stop::Io(e)) => return Err(e),
        Err(Stop::Damage(cut)) => match mode {
            RecoveryMode::Salvage if !dry => salvage(fs, dir, &segments, start, *cut, &mut report)?,
            _ => return Err(cut.error),
        },
    };

    let (segments, active) = match replayed.active {
        Some((idx, len, records)) => (
            segments
                .get(..=idx)
                .unwrap_or_default()
                .iter()
                .map(|&first_lsn| SegmentInfo { first_lsn })
                .collect(),
            Some((len, records)),
        ),
        None => {
            // Every segment that still exists and lies before the next
            // position stays; a new one starts at the next position.
            let kept = segments
                .iter()
                .filter(|&&l| l < replayed.next_lsn)
                .filter(|&&l| {
                    fs.kind(&dir.join(segment::file_name(l)))
                        .ok()
                        .flatten()
                        .is_some()
                })
                .map(|&first_lsn| SegmentInfo { first_lsn })
                .collect();
            (kept, None)
        }
    };
    report.keys = shards.len();
    report.next_position = replayed.next_lsn;
    report.duration = started.elapsed();
    Ok(Recovered {
        shards,
        next_lsn: replayed.next_lsn,
        segments,
        active,
        store_id: replayed.store_id,
        snapshots: snapshot_files
            .iter()
            .copied()
            .filter(|p| !damaged.contains(p))
            .collect(),
        snapshot_files,
        report,
    })
}

/// Refuses an entry named like a store file that is not a regular file
/// (symbolic links followed): passing over a segment or a snapshot would
/// forget acknowledged appends, so recovery reads such a name or stops.
/// Checked before recovery changes anything, in every mode.
fn refuse_what_is_not_a_file(
    fs: &dyn FileSystem,
    dir: &Path,
    listing: &[crate::fs::DirEntry],
) -> Result<()> {
    let Some(e) = listing
        .iter()
        .find(|e| e.kind != Some(EntryKind::File) && classify(&e.name).is_some())
    else {
        return Ok(());
    };
    let path = dir.join(&e.name);
    // Only for the message: whether the name itself is a link.
    let link = fs.is_symlink(&path).unwrap_or(false);
    let what = match (e.kind, link) {
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
    Err(Error::NotAFile { path, what })
}

/// The state replay starts from: the snapshot the report names, or nothing.
fn fresh_base(fs: &dyn FileSystem, report: &RecoveryReport) -> Result<Shards> {
    Ok(match &report.snapshot {
        Some(s) => load_snapshot(fs, &s.file)?.1,
        None => Shards::default(),
    })
}

/// Replays the log from `start`.
#[allow(clippy::too_many_arguments)]
fn replay(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &[u64],
    start: u64,
    sink: &mut dyn Sink,
    report: &mut RecoveryReport,
    dry: bool,
) -> std::result::Result<Replayed, Stop> {
    // The snapshot replay starts from, and where in it its position is
    // stored: what decides that the log is too short for it.
    let snapshot_file = report.snapshot.as_ref().map(|s| s.file.clone());
    let beyond = |log_end, ends_in| {
        Error::corrupt(
            snapshot_file.clone().unwrap_or_else(|| dir.to_path_buf()),
            snapshot::POSITION_AT,
            Corruption::SnapshotBeyondLog {
                snapshot: start,
                log_end,
                ends_in,
            },
        )
    };
    let Some(first_idx) = segments.iter().rposition(|&l| l <= start) else {
        if segments.is_empty() && start == 0 {
            return Ok(Replayed {
                next_lsn: 0,
                store_id: None,
                active: None,
            });
        }
        return Err(Stop::Damage(Box::new(Cut {
            seg: 0,
            keep: None,
            good_end: start,
            prev: None,
            // The snapshot that needs the log; with none, the first
            // segment, whose header says where the log begins.
            store_id: None,
            error: Error::corrupt(
                match (&snapshot_file, segments.first()) {
                    (Some(f), _) => f.clone(),
                    (None, Some(&l)) => dir.join(segment::file_name(l)),
                    (None, None) => dir.to_path_buf(),
                },
                if snapshot_file.is_some() {
                    snapshot::POSITION_AT
                } else {
                    segment::POSITION_AT
                },
                Corruption::LogGone {
                    needed: start,
                    oldest: segments.first().copied(),
                },
            ),
        })));
    };
    let last_idx = segments.len() - 1;
    let mut expected = segments.get(first_idx).copied().unwrap_or(start);
    let mut active: Option<(usize, u64, u64)> = None;
    // The segment and byte the log's valid records end at, so far.
    let mut ends_in: Option<(PathBuf, u64)> = None;
    // The store id of the first segment replayed of version 3 or later;
    // every later one must have it.
    let mut store_id: Option<u64> = None;
    for (idx, &named) in segments.iter().enumerate().skip(first_idx) {
        let path = dir.join(segment::file_name(named));
        let cut = |keep: Option<(u64, u64)>, error| {
            let good_end = keep.map_or(expected, |(_, records)| named + records);
            Err(Stop::Damage(Box::new(Cut {
                seg: idx,
                keep,
                good_end,
                prev: active,
                store_id,
                error,
            })))
        };
        if named != expected {
            return cut(
                None,
                Error::corrupt(
                    &path,
                    0,
                    Corruption::MissingRecords {
                        expected,
                        found: named,
                    },
                ),
            );
        }
        let file = fs
            .open_read(&path)
            .map_err(|e| Stop::Io(Error::io("open", &path, e)))?;
        let len = file
            .len()
            .map_err(|e| Stop::Io(Error::io("stat", &path, e)))?;
        report.segments_read += 1;
        let name_mismatch =
            |header| Error::corrupt(&path, 12, Corruption::NameMismatch { named, header });
        // A segment whose header disagrees with its name is not the log's,
        // nor is one of another store: refuse it before any of its records
        // is applied (salvage moves it aside whole).
        let foreign = |h: &segment::Header| match (store_id, h.store) {
            _ if h.first_lsn != named => Err(name_mismatch(h.first_lsn)),
            (Some(expected), Some(found)) if expected != found => Err(Error::corrupt(
                &path,
                20,
                Corruption::ForeignSegment { expected, found },
            )),
            _ => Ok(()),
        };
        let mut scanned = segment::scan(
            &path,
            std::io::BufReader::with_capacity(1 << 20, file),
            len,
            foreign,
            |lsn, at, nth, r| {
                if lsn >= start {
                    let rec = Rec {
                        lsn,
                        at,
                        nth,
                        hash: hash_key(&r.producer_id, r.partition),
                        request: r.clone(),
                    };
                    sink.push(rec, &path)?;
                }
                Ok(())
            },
        );
        if scanned.is_ok()
            && let Err(e) = sink.drain(&path)
        {
            if !sink.exact() {
                return Err(Stop::Retry);
            }
            scanned = Err(HeaderError::Bad(e));
        }
        report.records_replayed = sink.applied();
        let scan = match scanned {
            Ok(s) => s,
            Err(HeaderError::Short(_)) if idx == last_idx => {
                // A segment whose creation was cut off: it holds no record.
                if !dry {
                    fs.remove_file(&path)
                        .map_err(|e| Stop::Io(Error::io("remove", &path, e)))?;
                    fs.sync_dir(dir)
                        .map_err(|e| Stop::Io(Error::io("fsync directory", dir, e)))?;
                }
                report.files_removed.push(path);
                report.clean_shutdown = Some(false);
                // The log ends where the segment before it ended; the
                // snapshot is checked against that below.
                active = None;
                break;
            }
            Err(HeaderError::Short(n)) => {
                return cut(
                    None,
                    Error::corrupt(&path, 0, crate::codec::truncated(HEADER_LEN, n)),
                );
            }
            // Not damage: salvage must not move a newer build's log aside.
            Err(HeaderError::Bad(e @ Error::UnsupportedVersion { .. })) => {
                return Err(Stop::Io(e));
            }
            Err(HeaderError::Bad(e)) if e.is_corruption() => {
                if let Some((position, kind)) = sink.retry_before() {
                    return Err(Stop::RetryBefore(position, kind));
                }
                let keep = sink.failed_at().map(|(at, lsn)| (at, lsn - named));
                return cut(keep, e);
            }
            Err(HeaderError::Bad(e)) => return Err(Stop::Io(e)),
        };
        let keep = Some((scan.valid_len, scan.records));
        if idx == last_idx {
            report.clean_shutdown = match scan.end {
                End::Clean if scan.version >= 3 => Some(scan.closed),
                End::Clean => None,
                _ => Some(false),
            };
        }
        match scan.end {
            End::Clean => {}
            // The snapshot covers records from the damage on: a snapshot
            // is written only once the log it covers is durable, so the
            // damaged bytes were durable and are not a torn write. Refuse
            // before cutting anything (salvage moves the rest aside).
            End::Torn { offset, .. } if idx == last_idx && named + scan.records < start => {
                return cut(
                    keep,
                    beyond(named + scan.records, Some((path.clone(), offset))),
                );
            }
            End::Torn { offset, .. } if idx == last_idx => {
                if !dry {
                    let mut f = fs
                        .open_append(&path)
                        .map_err(|e| Stop::Io(Error::io("open", &path, e)))?;
                    f.set_len(offset)
                        .map_err(|e| Stop::Io(Error::io("truncate", &path, e)))?;
                    f.sync_data()
                        .map_err(|e| Stop::Io(Error::io("fsync", &path, e)))?;
                }
                report.torn_tail = Some(TornTail {
                    file: path.clone(),
                    offset,
                    bytes: scan.file_len - offset,
                });
            }
            End::Torn { offset, kind } => return cut(keep, Error::corrupt(&path, offset, kind)),
            End::MidLog { offset, kind, .. } => {
                let kind = match kind {
                    k @ Corruption::MisplacedRecord { .. } => k,
                    _ => Corruption::DamagedMidLog,
                };
                return cut(keep, Error::corrupt(&path, offset, kind));
            }
        }
        store_id = store_id.or(scan.store);
        expected = named + scan.records;
        active = Some((idx, scan.valid_len, scan.records));
        ends_in = Some((path, scan.valid_len));
    }
    if start > expected {
        return Err(Stop::Damage(Box::new(Cut {
            seg: segments.len(),
            keep: None,
            good_end: start,
            prev: None,
            store_id,
            error: beyond(expected, ends_in),
        })));
    }
    Ok(Replayed {
        next_lsn: expected,
        store_id,
        active,
    })
}

/// What salvage appends to the name of a file it moves aside.
const DISCARDED: &str = ".discarded";

/// The number of a name salvage gave a piece of `file`:
/// `<file>.discarded` is 0, `<file>.discarded.<n>` is n; `None` for any
/// other name.
fn discarded_number(file: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(file)?.strip_prefix(DISCARDED)?;
    if rest.is_empty() {
        return Some(0);
    }
    let digits = rest.strip_prefix('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A name for what salvage moves aside from `file` that no file has:
/// `<file>.discarded` if no earlier piece of `file` is there, else
/// `<file>.discarded.<n>` with n one more than the highest in use, so that
/// the numbers follow the order of the salvages. `in_use` holds the
/// directory's names (and gets the one chosen); a name found taken
/// (something the listing does not show) is passed over.
fn aside_path(
    fs: &dyn FileSystem,
    dir: &Path,
    file: &str,
    in_use: &mut BTreeSet<String>,
) -> Result<PathBuf> {
    let highest = in_use
        .iter()
        .filter_map(|name| discarded_number(file, name))
        .max();
    let mut n = highest.map_or(Some(0), |h| h.checked_add(1));
    while let Some(k) = n {
        let name = if k == 0 {
            format!("{file}{DISCARDED}")
        } else {
            format!("{file}{DISCARDED}.{k}")
        };
        let path = dir.join(&name);
        if !in_use.contains(&name) && fs.kind(&path).map_err(io_at("stat", &path))?.is_none() {
            in_use.insert(name);
            return Ok(path);
        }
        n = k.checked_add(1);
    }
    let path = dir.join(format!("{file}{DISCARDED}"));
    Err(Error::io(
        "name",
        &path,
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "every name for a discarded piece of this file is taken",
        ),
    ))
}

/// Copies `from` on of `src` into the new file `dst` and makes it durable.
/// Returns the bytes copied.
fn copy_tail(fs: &dyn FileSystem, src: &Path, from: u64, dst: &Path) -> Result<u64> {
    let mut f = fs.open_read(src).map_err(io_at("open", src))?;
    let skipped = std::io::copy(&mut (&mut f).take(from), &mut std::io::sink())
        .map_err(io_at("read", src))?;
    if skipped != from {
        return Err(Error::io(
            "read",
            src,
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the segment is shorter than replay found it",
            ),
        ));
    }
    let mut out = fs.create_new(dst).map_err(io_at("create", dst))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io_at("read", src))?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            break;
        };
        out.write_all(chunk).map_err(io_at("write", dst))?;
        copied += n as u64;
    }
    out.sync_data().map_err(io_at("fsync", dst))?;
    Ok(copied)
}

/// Moves everything from the cut on aside and reports it. The state is
/// what replay applied before the cut.
///
/// Nothing moved aside ever replaces a file: each piece gets a name no file
/// has ([`aside_path`]), so a second salvage keeps what the first one set
/// aside. The copy of a damaged tail is durable, name included, before the
/// segment is cut, so a crash leaves every byte in the segment or in the
/// copy (a crash between the two leaves both: the next salvage sets the
/// tail aside again, under the next name).
fn salvage(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &[u64],
    start: u64,
    cut: Cut,
    report: &mut RecoveryReport,
) -> Result<Replayed> {
    let mut discarded = Vec::new();
    let mut bytes = 0u64;
    let mut active = cut.prev;
    let mut in_use: BTreeSet<String> = fs
        .list(dir)
        .map_err(io_at("list", dir))?
        .into_iter()
        .map(|e| e.name)
        .collect();
    for (idx, &lsn) in segments.iter().enumerate().skip(cut.seg) {
        let name = segment::file_name(lsn);
        let path = dir.join(&name);
        let aside = aside_path(fs, dir, &name, &mut in_use)?;
        match cut.keep.filter(|_| idx == cut.seg) {
            Some((len, records)) => {
                // Copy the damaged rest aside, then cut the segment.
                bytes += copy_tail(fs, &path, len, &aside)?;
                fs.sync_dir(dir).map_err(io_at("fsync directory", dir))?;
                let mut w = fs.open_append(&path).map_err(io_at("open", &path))?;
                w.set_len(len).map_err(io_at("truncate", &path))?;
                w.sync_data().map_err(io_at("fsync", &path))?;
                active = Some((idx, len, records));
            }
            None => {
                bytes += fs
                    .open_read(&path)
                    .and_then(|f| f.len())
                    .map_err(io_at("stat", &path))?;
                fs.rename(&path, &aside).map_err(io_at("rename", &path))?;
            }
        }
        discarded.push(aside);
    }
    fs.sync_dir(dir).map_err(io_at("fsync directory", dir))?;
    // Never continue below the snapshot's position: if the good log ends
    // before it, a new segment starts at it.
    if cut.good_end < start {
        active = None;
    }
    report.salvage = Some(Salvage {
        cause: cut.error.to_string(),
        discarded,
        bytes,
    });
    Ok(Replayed {
        next_lsn: cut.good_end.max(start),
        store_id: cut.store_id,
        active,
    })
}

use std::io::Read as _;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::AppendRequest;
    use crate::fs::SimFs;
    use crate::wal::record::{encode, seal};

    /// A store directory holding one segment of `n` single-sequence appends
    /// over 1,000 keys, key `i % 1000` at sequence `i / 1000`, except that
    /// append `bad` (if any) skips a sequence: it does not apply. Written
    /// in 64 KiB groups, `packed` as the store writes them (many appends
    /// per record), else one append per record. Returns the offset and the
    /// first position of the record holding `bad`.
    fn log(n: u64, bad: Option<u64>, packed: bool) -> (SimFs, PathBuf, u64, u64) {
        let fs = SimFs::new();
        let dir = PathBuf::from("/s");
        fs.create_dir_all(&dir).unwrap();
        let mut bytes = segment::header(
            0,
            segment::Ids { store: 1, salt: 2 },
            segment::APPENDED_VERSION,
        );
        let seed = crate::wal::record::seed(&bytes[12..36]);
        let (mut bad_offset, mut bad_record) = (0, 0);
        let mut group = Vec::new();
        let mut open = usize::MAX;
        let mut record_start = 0;
        for i in 0..n {
            let seq = (i / 1000) as i32 + i32::from(Some(i) == bad);
            if !packed {
                open = usize::MAX;
            }
            let before = open;
            encode(
                &mut group,
                &mut open,
                &AppendRequest::single(i % 1000, 0, 0, seq),
            );
            if open != before || !packed {
                record_start = i;
            }
            if Some(i) == bad {
                bad_offset = (bytes.len() + open) as u64;
                bad_record = record_start;
            }
            if group.len() >= 64 << 10 || i + 1 == n {
                seal(&mut group, seed, bytes.len() as u64, 0);
                bytes.append(&mut group);
                // As `RecordBuf::take`: the next group starts a record.
                open = usize::MAX;
            }
        }
        let path = dir.join(segment::file_name(0));
        let mut f = fs.create_new(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(&dir).unwrap();
        (fs, dir, bad_offset, bad_record)
    }

    #[test]
    fn names_set_aside_are_fresh_ordered_and_never_store_files() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/s");
        fs.create_dir_all(&dir).unwrap();
        let seg = segment::file_name(66);
        let mut in_use: BTreeSet<String> = [
            seg.clone(),
            format!("{seg}.discarded.2"),
            format!("{seg}.discarded.x"),
            format!("{}.discarded.7", segment::file_name(6)),
        ]
        .into_iter()
        .collect();
        // After the highest number in use for this file (others do not
        // count), even with `.discarded` itself free.
        let next = |in_use: &mut BTreeSet<String>| {
            aside_path(&fs, &dir, &seg, in_use)
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        };
        assert_eq!(next(&mut in_use), format!("{seg}.discarded.3"));
        assert_eq!(next(&mut in_use), format!("{seg}.discarded.4"));
        // A name the listing missed but that exists is passed over.
        fs.overwrite(&dir.join(format!("{seg}.discarded.5")), b"x");
        assert_eq!(next(&mut in_use), format!("{seg}.discarded.6"));
        let mut empty = BTreeSet::new();
        let first = aside_path(&fs, &dir, &segment::file_name(9), &mut empty).unwrap();
        assert_eq!(
            first,
            dir.join(format!("{}.discarded", segment::file_name(9)))
        );
        // A number that cannot grow is an error, not a replaced file.
        let mut full: BTreeSet<String> = [format!("{seg}.discarded.{}", u64::MAX)].into();
        assert!(aside_path(&fs, &dir, &seg, &mut full).is_err());
        // None of these names is taken for a segment, a snapshot or a
        // leftover temporary snapshot by the listing's rules.
        for name in in_use
            .iter()
            .chain(&empty)
            .filter(|n| n.contains(DISCARDED))
        {
            assert_eq!(segment::parse_name(name), None, "{name}");
            assert_eq!(snapshot::parse_name(name), None, "{name}");
            assert!(!name.ends_with(snapshot::TMP_SUFFIX), "{name}");
        }
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded")), Some(0));
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded.")), None);
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded.+1")), None);
        assert_eq!(discarded_number(&seg, &format!("{seg}.discardedx")), None);
    }

    #[test]
    fn a_directory_named_like_a_store_file_is_refused_in_every_mode() {
        for name in ["00000000000000000001.wal", "00000000000000000001.snap"] {
            let (fs, dir, _, _) = log(10, None, false);
            fs.create_dir_all(&dir.join(name)).unwrap();
            for mode in [RecoveryMode::Strict, RecoveryMode::Salvage] {
                match recover(&fs, &dir, mode) {
                    Err(Error::NotAFile { path, what }) => {
                        assert_eq!(path, dir.join(name));
                        assert_eq!(what, "a directory");
                    }
                    other => panic!("{name} {mode:?}: {:?}", other.map(|r| r.report)),
                }
            }
            // Other names are left alone.
            let (fs, dir, _, _) = log(10, None, false);
            fs.create_dir_all(&dir.join(format!("{name}.old"))).unwrap();
            assert_eq!(
                recover(&fs, &dir, RecoveryMode::Strict).unwrap().next_lsn,
                10
            );
        }
    }

    #[test]
    fn a_long_log_replays_on_two_threads_to_the_same_state() {
        // 500k appends in records of about 3,600: 9 MB, above the parallel
        // threshold.
        let (fs, dir, _, _) = log(500_000, None, true);
        let r = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(r.report.replay_threads, cores.min(2));
        assert_eq!(r.report.records_replayed, 500_000);
        assert_eq!(r.next_lsn, 500_000);
        assert_eq!(r.shards.len(), 1000);
        for k in [0u64, 1, 500, 999] {
            let id = crate::ProducerId::from(k);
            let e = r.shards.get(hash_key(&id, 0), &id, 0).unwrap();
            assert_eq!(e.last_sequence(), 499);
        }
    }

    #[test]
    fn a_record_that_does_not_apply_is_found_exactly_after_a_parallel_replay() {
        // The parallel replay applies records past the bad one on other
        // shards; recovery must still name the bad record and salvage
        // exactly the history before it. Packed, the bad append is in the
        // middle of a record, which salvage drops whole: the state never
        // holds part of a record the log no longer has.
        let bad = 300_123;
        for packed in [false, true] {
            let (fs, dir, offset, record) =
                log(if packed { 500_000 } else { 320_000 }, Some(bad), packed);
            assert_eq!(record == bad, !packed);
            match recover(&fs, &dir, RecoveryMode::Strict) {
                Err(Error::Corrupt {
                    offset: o, kind, ..
                }) => {
                    assert_eq!(o, offset);
                    assert!(
                        matches!(kind, Corruption::RecordDoesNotApply { position, .. } if position == bad),
                        "{kind:?}"
                    );
                }
                other => panic!("{:?}", other.map(|r| r.report)),
            }
            let r = recover(&fs, &dir, RecoveryMode::Salvage).unwrap();
            assert_eq!(r.report.replay_threads, 1, "found by the sequential replay");
            assert_eq!(r.next_lsn, record);
            assert_eq!(r.report.records_replayed, record);
            assert_eq!(r.active.map(|(len, _)| len), Some(offset));
            for k in 0..1000u64 {
                let id = crate::ProducerId::from(k);
                let last = r
                    .shards
                    .get(hash_key(&id, 0), &id, 0)
                    .unwrap()
                    .last_sequence();
                // Key k's last append before `record` is the largest i < record with i % 1000 == k.
                let want = ((record - 1 - (record - 1 + 1000 - k) % 1000) / 1000) as i32;
                assert_eq!(last, want, "key {k}");
            }
            // Opening the salvaged log again agrees.
            let again = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
            assert_eq!(again.next_lsn, record);
        }
    }
}
