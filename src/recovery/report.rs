//! What recovery found and did, as values.
//!
//! An embedder reads this from [`ProducerStateStore::recovery_report`]
//! after an open, and the inspect tool prints a dry run's. Both may act on
//! it (alert on a salvage, tell which snapshot was passed over and why),
//! so damage is kept typed: the file, the byte and the [`Corruption`], the
//! same fields [`Error::Corrupt`] has, never a sentence to parse. The
//! repairs are listed as the steps recovery takes, in order, so that what
//! a dry run would do and what an open did read the same.
//!
//! [`ProducerStateStore::recovery_report`]: crate::ProducerStateStore::recovery_report

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Corruption, Error};
use crate::wal::resume::SeekFallback;

/// What recovery does with damage other than a torn tail.
#[non_exhaustive]
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
#[non_exhaustive]
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
///
/// Its [`Display`](fmt::Display) is the message of the
/// [`Error::Corrupt`] that verification returned.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedSnapshot {
    /// Its path.
    pub file: PathBuf,
    /// Byte offset of the damage within it.
    pub offset: u64,
    /// What is wrong.
    pub kind: Corruption,
}

impl fmt::Display for SkippedSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        corrupt(f, &self.file, self.offset, &self.kind)
    }
}

/// Damaged bytes, as a value a report can hold: where they are and what is
/// wrong, the fields of [`Error::Corrupt`] (whose message its
/// [`Display`](fmt::Display) prints).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The damaged file (for a snapshot that needs log the directory does
    /// not have, the snapshot; with no snapshot, the directory or the
    /// first segment).
    pub file: PathBuf,
    /// Byte offset of the damage within the file.
    pub offset: u64,
    /// What is wrong.
    pub kind: Corruption,
}

impl Damage {
    pub(crate) fn new(file: impl Into<PathBuf>, offset: u64, kind: Corruption) -> Damage {
        Damage {
            file: file.into(),
            offset,
            kind,
        }
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        corrupt(f, &self.file, self.offset, &self.kind)
    }
}

impl From<Damage> for Error {
    fn from(d: Damage) -> Error {
        Error::Corrupt {
            file: d.file,
            offset: d.offset,
            kind: d.kind,
        }
    }
}

/// The message of [`Error::Corrupt`], for the values that hold its fields.
fn corrupt(
    f: &mut fmt::Formatter<'_>,
    file: &std::path::Path,
    offset: u64,
    kind: &Corruption,
) -> fmt::Result {
    write!(f, "{} is corrupt at byte {offset}: {kind}", file.display())
}

/// The torn end of the log that recovery cut off.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment that was cut.
    pub file: PathBuf,
    /// Where it was cut.
    pub offset: u64,
    /// How many bytes were dropped.
    pub bytes: u64,
    /// Of those, the zeros at the end of a preallocated segment that no
    /// write reached: room it was given, not torn records. The torn write
    /// itself is `bytes - preallocated`. 0 for a segment that grows by
    /// appends.
    pub preallocated: u64,
}

/// What salvage discarded.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Salvage {
    /// The damage that stopped replay.
    pub cause: Damage,
    /// Where each discarded file (or file tail) went: the new files, named
    /// `<file>.discarded` or `<file>.discarded.<n>` after the file they came
    /// from, in log order.
    pub discarded: Vec<PathBuf>,
    /// Bytes moved aside.
    pub bytes: u64,
}

/// A change recovery makes to the store directory. Recovery decides every
/// one of them before it makes the first, and makes them in the order it
/// lists them ([`RecoveryReport::repairs`]); a dry run lists them and
/// makes none.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repair {
    /// Remove a temporary snapshot, left by a snapshot cut off before its
    /// rename.
    RemoveTemp {
        /// The file.
        file: PathBuf,
    },
    /// Remove the last segment, whose creation was cut off before its
    /// header was complete: it holds no record.
    RemoveEmptySegment {
        /// The segment.
        file: PathBuf,
    },
    /// Cut the torn tail off the last segment: bytes that were never
    /// durable, so no append in them was acknowledged.
    Truncate {
        /// The segment.
        file: PathBuf,
        /// The length it keeps: the end of its last valid record.
        len: u64,
        /// The bytes dropped.
        bytes: u64,
        /// Of those, the zeros of a preallocated segment's room after the
        /// torn bytes (see [`TornTail::preallocated`]).
        preallocated: u64,
    },
    /// Salvage: move the bytes of `file` from `from` on aside into the new
    /// file `to`. From 0 the whole file is renamed; otherwise its tail is
    /// copied to `to`, made durable, and then cut off `file`.
    MoveAside {
        /// The segment.
        file: PathBuf,
        /// The first byte moved (0: the whole file).
        from: u64,
        /// Where the bytes go: a name no file has.
        to: PathBuf,
        /// The bytes moved.
        bytes: u64,
    },
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repair::RemoveTemp { file } => {
                write!(
                    f,
                    "remove {} (a leftover temporary snapshot)",
                    file.display()
                )
            }
            Repair::RemoveEmptySegment { file } => write!(
                f,
                "remove {} (a segment whose creation was cut off: it holds no record)",
                file.display()
            ),
            Repair::Truncate {
                file,
                len,
                bytes,
                preallocated: 0,
            } => write!(
                f,
                "truncate {} to {len} bytes ({bytes} bytes of torn tail)",
                file.display()
            ),
            Repair::Truncate {
                file,
                len,
                bytes,
                preallocated,
            } => write!(
                f,
                "truncate {} to {len} bytes ({} bytes of torn tail, then {preallocated} bytes of preallocated room)",
                file.display(),
                bytes - preallocated
            ),
            Repair::MoveAside {
                file,
                from: 0,
                to,
                bytes,
            } => write!(
                f,
                "move {} aside to {} ({bytes} bytes)",
                file.display(),
                to.display()
            ),
            Repair::MoveAside {
                file,
                from,
                to,
                bytes,
            } => write!(
                f,
                "move {bytes} bytes of {} from byte {from} on aside to {}, then cut it there",
                file.display(),
                to.display()
            ),
        }
    }
}

/// Where replay started reading the segment that holds the snapshot's
/// position. A snapshot of version 6 records the byte offset of the first
/// record it does not cover; replay seeks there instead of reading the
/// records below it, after checking that the segment is the one the
/// snapshot was taken with and that a record (or the end of the records)
/// lies there. docs/format.md (Recovering, step 3) has the rule.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSeek {
    /// The segment holding the snapshot's position.
    pub segment: PathBuf,
    /// The byte offset the snapshot recorded.
    pub offset: u64,
    /// Records of the segment below the snapshot's position that were not
    /// read (0 after a fallback).
    pub records_not_read: u64,
    /// Why the recorded offset was not used, if it was not: the segment was
    /// then read from its first record, as for a snapshot of version 5.
    pub fallback: Option<SeekFallback>,
}

/// What recovery found and did.
///
/// ```
/// use producer_state::ProducerStateStore;
///
/// let dir = tempfile::tempdir()?;
/// let store = ProducerStateStore::open(dir.path())?;
/// store.append("p1", 0, 0, 0)?;
/// store.append("p1", 0, 0, 1)?;
/// store.close()?;
///
/// let store = ProducerStateStore::open(dir.path())?;
/// let report = store.recovery_report();
/// assert_eq!((report.records_replayed, report.keys), (2, 1));
/// assert!(report.torn_tail.is_none() && report.skipped_snapshots.is_empty());
/// assert_eq!(report.clean_shutdown, Some(true));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The snapshot used, if any.
    pub snapshot: Option<SnapshotUsed>,
    /// Newer snapshots that failed verification, newest first.
    pub skipped_snapshots: Vec<SkippedSnapshot>,
    /// Segments read.
    pub segments_read: usize,
    /// Segments not read because they lie wholly below the snapshot's
    /// position (the next segment's name is at or below it): replay needs
    /// none of their records, and their names alone show the log has no
    /// hole. A fallback to an older snapshot would read them.
    pub segments_skipped: usize,
    /// Log records replayed on top of the snapshot.
    pub records_replayed: u64,
    /// Records read (their checksums verified, their bytes decoded) that
    /// the snapshot already covers, so not replayed: those of the segment
    /// holding the snapshot's position that lie below it, unless replay
    /// could seek past them ([`seek`](Self::seek)). 0 is the goal.
    pub records_read_not_replayed: u64,
    /// Where replay started in the segment holding the snapshot's
    /// position, when the snapshot recorded it (version 6) and the
    /// position lies after that segment's first record.
    pub seek: Option<LogSeek>,
    /// Threads that applied them: 2 when a long log (8 MiB or more) was
    /// replayed with a helper thread, else 1 (also when a record that did
    /// not apply sent recovery back to a sequential replay).
    pub replay_threads: usize,
    /// The torn tail cut off the last segment, if there was one (the
    /// [`Repair::Truncate`] of [`repairs`](Self::repairs)).
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
    /// What salvage discarded (only with
    /// [`RecoveryMode::Salvage`](crate::RecoveryMode::Salvage)).
    pub salvage: Option<Salvage>,
    /// Every change made to the directory, in the order made: the steps
    /// behind [`torn_tail`](Self::torn_tail),
    /// [`files_removed`](Self::files_removed) and
    /// [`salvage`](Self::salvage). For a dry run, the changes an open
    /// would make.
    pub repairs: Vec<Repair>,
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

    /// The report's view of `repairs`: what each field says of them.
    pub(crate) fn set_repairs(&mut self, repairs: Vec<Repair>, cause: Option<Damage>) {
        for r in &repairs {
            match r {
                Repair::RemoveTemp { file } | Repair::RemoveEmptySegment { file } => {
                    self.files_removed.push(file.clone());
                }
                Repair::Truncate {
                    file,
                    len,
                    bytes,
                    preallocated,
                } => {
                    self.torn_tail = Some(TornTail {
                        file: file.clone(),
                        offset: *len,
                        bytes: *bytes,
                        preallocated: *preallocated,
                    });
                }
                Repair::MoveAside { .. } => {}
            }
        }
        self.salvage = cause.map(|cause| {
            let moved = repairs.iter().filter_map(|r| match r {
                Repair::MoveAside { to, bytes, .. } => Some((to, *bytes)),
                _ => None,
            });
            Salvage {
                cause,
                discarded: moved.clone().map(|(to, _)| to.clone()).collect(),
                bytes: moved.map(|(_, b)| b).sum(),
            }
        });
        self.repairs = repairs;
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
            writeln!(f, "skipped snapshot: {} ({s})", s.file.display())?;
        }
        writeln!(
            f,
            "replayed: {} records from {} segment(s) on {} thread(s)",
            self.records_replayed,
            self.segments_read,
            self.replay_threads.max(1)
        )?;
        writeln!(
            f,
            "not read: {} segment(s) wholly below the snapshot's position",
            self.segments_skipped
        )?;
        if let Some(s) = &self.seek {
            match s.fallback {
                None => writeln!(
                    f,
                    "seek: {} at byte {} ({} records below it not read)",
                    s.segment.display(),
                    s.offset,
                    s.records_not_read
                )?,
                Some(why) => writeln!(
                    f,
                    "seek: not taken in {} at byte {} ({why}): read from its first record",
                    s.segment.display(),
                    s.offset
                )?,
            }
        }
        if self.records_read_not_replayed > 0 {
            writeln!(
                f,
                "read, not replayed: {} records the snapshot covers",
                self.records_read_not_replayed
            )?;
        }
        match &self.torn_tail {
            Some(t) if t.preallocated > 0 => writeln!(
                f,
                "torn tail: {} bytes dropped from {} at byte {} (and {} bytes of preallocated room after them)",
                t.bytes - t.preallocated,
                t.file.display(),
                t.offset,
                t.preallocated
            )?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_damage_prints_what_the_error_it_stands_for_prints() {
        let d = Damage::new("/s/x.snap", 9, Corruption::DuplicateKey);
        let skipped = SkippedSnapshot {
            file: d.file.clone(),
            offset: d.offset,
            kind: d.kind.clone(),
        };
        let e = Error::from(d.clone());
        assert_eq!(d.to_string(), e.to_string());
        assert_eq!(skipped.to_string(), e.to_string());
    }

    #[test]
    fn the_fields_of_a_report_follow_its_repairs() {
        let mut r = RecoveryReport::default();
        let repairs = vec![
            Repair::RemoveTemp {
                file: "/s/a.snap.tmp".into(),
            },
            Repair::MoveAside {
                file: "/s/b.wal".into(),
                from: 100,
                to: "/s/b.wal.discarded".into(),
                bytes: 7,
            },
            Repair::MoveAside {
                file: "/s/c.wal".into(),
                from: 0,
                to: "/s/c.wal.discarded.1".into(),
                bytes: 30,
            },
        ];
        let cause = Damage::new("/s/b.wal", 100, Corruption::DamagedMidLog);
        r.set_repairs(repairs.clone(), Some(cause.clone()));
        assert_eq!(r.repairs, repairs);
        assert_eq!(r.files_removed, vec![PathBuf::from("/s/a.snap.tmp")]);
        assert_eq!(r.torn_tail, None);
        let s = r.salvage.unwrap();
        assert_eq!(s.cause, cause);
        assert_eq!(s.bytes, 37);
        assert_eq!(
            s.discarded,
            vec![
                PathBuf::from("/s/b.wal.discarded"),
                PathBuf::from("/s/c.wal.discarded.1")
            ]
        );
    }
}
