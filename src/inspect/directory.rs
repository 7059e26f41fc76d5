//! A store directory, file by file, and what recovery would make of it:
//! the inspector's policy, so that the tool only renders it.
//!
//! Files are classified by the store's own naming rule
//! ([`classify`](crate::directory::names::classify), which recovery uses): a file
//! recovery does not read never decides the verdict, whatever its
//! extension or bytes. Each store file is verified on its own, recovery is
//! run as a dry run, and each finding gets the [`Effect`] it has on
//! recovery, from which its [`Verdict`] follows. The directory's verdict is
//! the worst of them and of the dry run, so it is never more hopeful than
//! recovery (a refusing dry run is [`Verdict::Refused`]) and never hides
//! damage recovery does not read today (damage in the log a fallback to an
//! older snapshot would need is [`Verdict::Repairable`], not `Ok`).

use std::fmt;
use std::path::{Path, PathBuf};

use super::file::{
    RecoveredState, SegmentEnd, Ticker, Verdict, dry_run, kafka_snapshot, segment, snapshot,
};
use crate::directory::names::{StoreFile, classify};
use crate::error::{Corruption, Error, Result};
use crate::fs::{DirEntry, EntryKind, FileSystem};
use crate::kafka;
use crate::recovery::report::RecoveryReport;

/// What a file in the directory is, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// A log segment (`<position>.wal`).
    Segment,
    /// A snapshot (`<position>.snap`).
    Snapshot,
    /// A temporary snapshot left by an interrupted write (`<position>.snap.tmp`).
    SnapshotTemp,
    /// A preallocated segment left before its rename (`<position>.wal.prep`).
    SegmentTemp,
    /// An Apache Kafka producer snapshot (`<offset>.snapshot`): verified
    /// and shown, but recovery does not read it.
    KafkaSnapshot,
    /// Any other name: recovery does not read it, and neither does the
    /// inspector.
    Other,
}

/// What is wrong with a file.
#[derive(Debug)]
#[non_exhaustive]
pub enum Problem {
    /// It does not verify: [`Error::Corrupt`] (file, byte offset, kind) or
    /// [`Error::UnsupportedVersion`].
    Invalid(Error),
    /// A segment whose last write was torn: the bytes from `offset` on.
    TornTail {
        /// Where the torn bytes start.
        offset: u64,
        /// What is wrong with them.
        kind: Corruption,
    },
    /// A segment with damage at `offset` followed by a valid record at
    /// `later_write`, written when the damage was already durable.
    DamagedMidLog {
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        kind: Corruption,
        /// Where the later record was found.
        later_write: u64,
    },
    /// The log holds no records between the end of the segment before this
    /// one and this segment's first position (a segment is missing or was
    /// cut short at a record boundary).
    Gap {
        /// Where the previous segment's records end.
        expected: u64,
        /// Where this segment's records start.
        found: u64,
    },
    /// A temporary file of a snapshot that never completed.
    Leftover,
}

impl Problem {
    /// The byte offset in the file where the problem starts, if it has one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            Problem::Invalid(Error::Corrupt { offset, .. }) => Some(*offset),
            Problem::Invalid(Error::UnsupportedVersion { .. }) => Some(0),
            Problem::Invalid(_) | Problem::Leftover => None,
            Problem::TornTail { offset, .. } | Problem::DamagedMidLog { offset, .. } => {
                Some(*offset)
            }
            Problem::Gap { .. } => Some(0),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Invalid(Error::Corrupt { kind, .. }) => write!(f, "damaged: {kind}"),
            Problem::Invalid(e @ Error::UnsupportedVersion { .. }) => write!(f, "unsupported: {e}"),
            Problem::Invalid(e) => write!(f, "{e}"),
            Problem::TornTail { kind, .. } => write!(f, "torn tail ({kind})"),
            Problem::DamagedMidLog {
                kind, later_write, ..
            } => write!(
                f,
                "damaged: {kind}; a valid record written after it was durable follows at byte {later_write}"
            ),
            Problem::Gap { expected, found } => write!(
                f,
                "{}",
                Corruption::MissingRecords {
                    expected: *expected,
                    found: *found
                }
            ),
            Problem::Leftover => f.write_str("left over from an interrupted snapshot"),
        }
    }
}

/// What a file means to recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Effect {
    /// It verifies.
    None,
    /// Recovery does not read it (not a store file name); whatever is wrong
    /// with it does not count.
    Ignored,
    /// Recovery repairs it: cuts the torn tail, removes the leftover file or
    /// the segment whose creation was cut off.
    Repaired,
    /// A damaged snapshot recovery passes over, falling back to an older
    /// one (or to the log from position 0).
    Skipped,
    /// Damage recovery does not read now (it starts from a newer
    /// snapshot), but a fallback to an older snapshot would need: if the
    /// newer snapshot is lost or damaged, recovery refuses.
    NeededByFallback,
    /// Recovery refuses to open the store because of it.
    Refuses,
    /// A Kafka snapshot, in a directory of Kafka snapshots, that does not
    /// verify.
    Damaged,
}

impl Effect {
    /// The verdict that follows.
    pub fn verdict(self) -> Verdict {
        match self {
            Effect::None | Effect::Ignored => Verdict::Ok,
            Effect::Repaired | Effect::Skipped | Effect::NeededByFallback => Verdict::Repairable,
            Effect::Refuses | Effect::Damaged => Verdict::Refused,
        }
    }
}

/// One file of the directory.
#[derive(Debug)]
#[non_exhaustive]
pub struct FileReport {
    /// Its name in the directory.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// Its length in bytes.
    pub bytes: u64,
    /// A segment: of its `bytes`, the zeros of a preallocated segment's
    /// room that no write reached ([`SegmentSummary::preallocated_bytes`]);
    /// 0 for any other file.
    ///
    /// [`SegmentSummary::preallocated_bytes`]: super::SegmentSummary::preallocated_bytes
    pub preallocated: u64,
    /// What it is, by its name.
    pub role: Role,
    /// Snapshot: the position it covers; segment: its first position (from
    /// the header if it verifies, else from the name); Kafka: the offset in
    /// its name.
    pub position: Option<u64>,
    /// Segment: one past the position of its last valid record.
    pub end_position: Option<u64>,
    /// Entries (snapshot, Kafka) or valid records (segment).
    pub entries: Option<u64>,
    /// What is wrong with it, if anything.
    pub problem: Option<Problem>,
    /// What that means to recovery.
    pub effect: Effect,
}

impl FileReport {
    /// The file's verdict.
    pub fn verdict(&self) -> Verdict {
        self.effect.verdict()
    }
}

/// What the directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Contents {
    /// A store: at least one file with the store's naming rule.
    Store,
    /// No store file, but Kafka snapshots (a Kafka partition directory).
    KafkaSnapshots,
    /// Neither: not a producer-state directory.
    Nothing,
}

/// What opening the store would do.
#[derive(Debug)]
#[non_exhaustive]
pub enum DryRun {
    /// Not run: the directory holds no store.
    NotRun,
    /// It would open, after what the report lists, to this state.
    Opens {
        /// What recovery would find and do.
        report: Box<RecoveryReport>,
        /// The state it would rebuild.
        state: RecoveredState,
    },
    /// It would refuse with this error.
    Refuses(Error),
}

/// A directory, file by file, and its verdict.
#[derive(Debug)]
#[non_exhaustive]
pub struct DirectoryReport {
    /// The directory.
    pub dir: PathBuf,
    /// What it holds.
    pub contents: Contents,
    /// Every file the file system lists in it, by name.
    pub files: Vec<FileReport>,
    /// What opening it would do.
    pub recovery: DryRun,
    /// The worst of the files' verdicts and the dry run's.
    pub verdict: Verdict,
}

/// Inspects a store directory (or a directory of Kafka snapshots): lists it
/// through `fs` (the same listing recovery uses), verifies every store file
/// and Kafka snapshot in it, runs recovery as a dry run (nothing written,
/// no lock taken) and gives each file and the directory a [`Verdict`].
/// `progress(files)` is called every few thousand files.
///
/// # Errors
///
/// [`Error::Io`] if the directory cannot be listed or a store file cannot
/// be read (damage is never an error here: it is in the report).
pub fn directory(
    fs: &dyn FileSystem,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<DirectoryReport> {
    let listing = fs.list(dir).map_err(|e| Error::io("list", dir, e))?;
    let mut t = Ticker::new(progress);
    let mut files = Vec::with_capacity(listing.len());
    for (i, entry) in listing.iter().enumerate() {
        t.tick(i as u64);
        files.push(check(fs, dir, entry)?);
    }
    mark_gaps(&mut files);
    let contents = if files.iter().any(|f| {
        matches!(
            f.role,
            Role::Segment | Role::Snapshot | Role::SnapshotTemp | Role::SegmentTemp
        )
    }) {
        Contents::Store
    } else if files.iter().any(|f| f.role == Role::KafkaSnapshot) {
        Contents::KafkaSnapshots
    } else {
        Contents::Nothing
    };
    let recovery = match contents {
        Contents::Store => match dry_run(fs, dir) {
            Ok((report, state)) => DryRun::Opens {
                report: Box::new(report),
                state,
            },
            Err(e @ Error::Io { .. }) => return Err(e),
            Err(e) => DryRun::Refuses(e),
        },
        _ => DryRun::NotRun,
    };
    let last_segment = files.iter().rposition(|f| f.role == Role::Segment);
    for (i, f) in files.iter_mut().enumerate() {
        f.effect = effect(f, contents, &recovery, Some(i) == last_segment);
    }
    let worst = files.iter().map(FileReport::verdict).max();
    let verdict = match (&contents, &recovery) {
        (Contents::Nothing, _) | (_, DryRun::Refuses(_)) => Verdict::Refused,
        _ => worst.unwrap_or(Verdict::Ok),
    };
    Ok(DirectoryReport {
        dir: dir.to_path_buf(),
        contents,
        files,
        recovery,
        verdict,
    })
}

/// Verifies one file on its own; its effect is decided later.
fn check(fs: &dyn FileSystem, dir: &Path, entry: &DirEntry) -> Result<FileReport> {
    let name = entry.name.as_str();
    let path = dir.join(name);
    let mut r = FileReport {
        name: name.to_string(),
        path,
        bytes: entry.len,
        preallocated: 0,
        role: Role::Other,
        position: None,
        end_position: None,
        entries: None,
        problem: None,
        effect: Effect::None,
    };
    let quiet = &mut |_| {};
    let damage = |e: Error| match e {
        e @ Error::Io { .. } => Err(e),
        e => Ok(Some(Problem::Invalid(e))),
    };
    let store_file = classify(name);
    if let Some(f) = store_file
        && entry.kind != Some(EntryKind::File)
    {
        // Named like a store file, but recovery can neither read it nor
        // pass over it (symbolic links are followed: this is what a link
        // leads to), so it refuses; so does the verdict.
        r.role = match f {
            StoreFile::Segment(_) => Role::Segment,
            StoreFile::Snapshot(_) => Role::Snapshot,
            _ => Role::SnapshotTemp,
        };
        r.problem = Some(Problem::Invalid(crate::directory::not_a_file(
            fs,
            r.path.clone(),
            entry.kind,
        )));
        return Ok(r);
    }
    match store_file {
        Some(StoreFile::SnapshotTemp(_)) => {
            r.role = Role::SnapshotTemp;
            r.problem = Some(Problem::Leftover);
        }
        Some(StoreFile::SegmentTemp(_)) => {
            r.role = Role::SegmentTemp;
            r.problem = Some(Problem::Leftover);
        }
        Some(StoreFile::Snapshot(named)) => {
            r.role = Role::Snapshot;
            r.position = Some(named);
            match snapshot(fs, &r.path, quiet) {
                // As recovery: a header that disagrees with the name.
                Ok((s, _)) if s.position != named => {
                    r.problem = Some(Problem::Invalid(Error::corrupt(
                        &r.path,
                        16,
                        Corruption::NameMismatch {
                            named,
                            header: s.position,
                        },
                    )));
                }
                Ok((s, _)) => r.entries = Some(s.entries),
                Err(e) => r.problem = damage(e)?,
            }
        }
        Some(StoreFile::Segment(named)) => check_segment(fs, &mut r, named)?,
        None => {
            if let Some(offset) = kafka::parse_file_name(name) {
                r.role = Role::KafkaSnapshot;
                r.position = Some(offset);
                // Not the store's: even an IO error is only shown.
                match kafka_snapshot(fs, &r.path, quiet) {
                    Ok(entries) => r.entries = Some(entries.len() as u64),
                    Err(e) => r.problem = Some(Problem::Invalid(e)),
                }
            }
        }
    }
    Ok(r)
}

/// [`check`] of a segment: scanned as recovery scans it, its positions and
/// how its records end.
fn check_segment(fs: &dyn FileSystem, r: &mut FileReport, named: u64) -> Result<()> {
    r.role = Role::Segment;
    r.position = Some(named);
    match segment(fs, &r.path, |_, _, _| {}, &mut |_| {}) {
        Ok(s) => {
            r.end_position = Some(s.first_position + s.records);
            r.entries = Some(s.records);
            r.position = Some(s.first_position);
            r.preallocated = s.preallocated_bytes;
            r.problem = match s.end {
                _ if s.first_position != named => Some(Problem::Invalid(Error::corrupt(
                    &r.path,
                    12,
                    Corruption::NameMismatch {
                        named,
                        header: s.first_position,
                    },
                ))),
                SegmentEnd::Clean => None,
                SegmentEnd::TornTail { offset, kind } => Some(Problem::TornTail { offset, kind }),
                SegmentEnd::Damaged {
                    offset,
                    kind,
                    later_write,
                } => Some(Problem::DamagedMidLog {
                    offset,
                    kind,
                    later_write,
                }),
            };
        }
        Err(e @ Error::Io { .. }) => return Err(e),
        Err(e) => r.problem = Some(Problem::Invalid(e)),
    }
    Ok(())
}

/// Marks a segment that does not start where the clean segment before it
/// ends (a missing segment, or one cut at a record boundary).
fn mark_gaps(files: &mut [FileReport]) {
    let mut prev_end: Option<u64> = None;
    for f in files.iter_mut().filter(|f| f.role == Role::Segment) {
        if let (Some(expected), Some(found), None) = (prev_end, f.position, &f.problem)
            && expected != found
        {
            f.problem = Some(Problem::Gap { expected, found });
        }
        prev_end = match f.problem {
            None => f.end_position,
            Some(_) => None,
        };
    }
}

/// The file the dry run's refusal names, if it names one.
fn refused_file(recovery: &DryRun) -> Option<&Path> {
    match recovery {
        DryRun::Refuses(Error::Corrupt { file, .. } | Error::UnsupportedVersion { file, .. }) => {
            Some(file)
        }
        _ => None,
    }
}

fn effect(f: &mut FileReport, contents: Contents, recovery: &DryRun, last_segment: bool) -> Effect {
    match (f.role, contents) {
        (Role::Other, _) => return Effect::Ignored,
        (Role::KafkaSnapshot, Contents::KafkaSnapshots) => {
            return if f.problem.is_some() {
                Effect::Damaged
            } else {
                Effect::None
            };
        }
        (Role::KafkaSnapshot, _) => return Effect::Ignored,
        _ => {}
    }
    let refused = refused_file(recovery) == Some(f.path.as_path());
    if refused {
        // A refusal the file check did not see (a record that does not
        // apply, say) is the file's problem too.
        if f.problem.is_none()
            && let DryRun::Refuses(Error::Corrupt { file, offset, kind }) = recovery
        {
            f.problem = Some(Problem::Invalid(Error::corrupt(
                file,
                *offset,
                kind.clone(),
            )));
        }
        return Effect::Refuses;
    }
    let Some(problem) = &f.problem else {
        return Effect::None;
    };
    let report = match recovery {
        DryRun::Opens { report, .. } => Some(report.as_ref()),
        _ => None,
    };
    let removed = report.is_some_and(|r| r.files_removed.contains(&f.path));
    match (f.role, problem) {
        (Role::SnapshotTemp | Role::SegmentTemp, _) => Effect::Repaired,
        (Role::Snapshot, _)
            if report.is_some_and(|r| r.skipped_snapshots.iter().any(|s| s.file == f.path)) =>
        {
            Effect::Skipped
        }
        (Role::Segment, Problem::TornTail { .. })
            if report.map_or(last_segment, |r| {
                r.torn_tail.as_ref().is_some_and(|t| t.file == f.path)
            }) =>
        {
            Effect::Repaired
        }
        (Role::Segment, _) if removed => Effect::Repaired,
        _ => Effect::NeededByFallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::names;
    use crate::fs::{ReadOnlyFs, SimFs};
    use crate::{ProducerStateStore, StoreOptions};
    use std::sync::Arc;

    /// A closed store on a simulated disk: small segments, two snapshots.
    fn store() -> (SimFs, PathBuf) {
        let fs = SimFs::new();
        let dir = PathBuf::from("/s");
        let st = ProducerStateStore::open_with(
            &dir,
            StoreOptions::default()
                .file_system(Arc::new(fs.clone()))
                .segment_size(1024)
                .snapshot_every_records(Some(60))
                .background_snapshots(false),
        )
        .unwrap();
        for i in 0..150 {
            st.append(i % 7, 0, 0, (i / 7) as i32).unwrap();
        }
        st.close().unwrap();
        (fs, dir)
    }

    fn inspect(fs: &SimFs, dir: &Path) -> DirectoryReport {
        directory(&ReadOnlyFs(fs.clone()), dir, &mut |_| {}).unwrap()
    }

    fn file<'a>(r: &'a DirectoryReport, name: &str) -> &'a FileReport {
        r.files.iter().find(|f| f.name == name).unwrap()
    }

    #[test]
    fn files_recovery_does_not_read_are_listed_and_ignored() {
        let (fs, dir) = store();
        let clean = inspect(&fs, &dir);
        assert_eq!(
            (clean.contents, clean.verdict),
            (Contents::Store, Verdict::Ok)
        );
        assert!(matches!(clean.recovery, DryRun::Opens { .. }));
        assert!(
            clean
                .files
                .iter()
                .filter(|f| f.role != Role::Other)
                .all(|f| f.effect == Effect::None && f.problem.is_none())
        );
        for name in ["notes.snap", "00000000000000000001.snapshot", "x.wal"] {
            fs.overwrite(&dir.join(name), b"\0\x01 not what the name says");
        }
        let r = inspect(&fs, &dir);
        assert_eq!(r.verdict, Verdict::Ok);
        let kafka = file(&r, "00000000000000000001.snapshot");
        assert_eq!(
            (kafka.role, kafka.effect),
            (Role::KafkaSnapshot, Effect::Ignored)
        );
        assert!(kafka.problem.is_some(), "checked and shown, not counted");
        let notes = file(&r, "notes.snap");
        assert_eq!((notes.role, notes.effect), (Role::Other, Effect::Ignored));
        assert!(notes.problem.is_none(), "not read at all");
    }

    #[test]
    fn a_leftover_is_repaired_and_a_hole_a_fallback_needs_is_not_ok() {
        let (fs, dir) = store();
        let tmp = format!("{}{}", names::snapshot_name(3), names::SNAPSHOT_TMP_SUFFIX);
        fs.overwrite(&dir.join(&tmp), b"half");
        let r = inspect(&fs, &dir);
        assert_eq!(r.verdict, Verdict::Repairable);
        assert_eq!(file(&r, &tmp).effect, Effect::Repaired);

        // Remove the segment before the one the newest snapshot starts in.
        let (fs, dir) = store();
        let clean = inspect(&fs, &dir);
        let newest = clean
            .files
            .iter()
            .filter(|f| f.role == Role::Snapshot)
            .filter_map(|f| f.position)
            .max()
            .unwrap();
        let segs: Vec<&FileReport> = clean
            .files
            .iter()
            .filter(|f| f.role == Role::Segment)
            .collect();
        let at = segs
            .iter()
            .rposition(|f| f.position.unwrap() <= newest)
            .unwrap();
        assert!(at >= 2, "{segs:?}");
        let (gone, after) = (segs[at - 2].path.clone(), segs[at - 1].name.clone());
        fs.delete(&gone);
        let r = inspect(&fs, &dir);
        assert!(
            matches!(r.recovery, DryRun::Opens { .. }),
            "recovery does not need it now"
        );
        assert_eq!(r.verdict, Verdict::Repairable);
        let f = file(&r, &after);
        assert!(matches!(f.problem, Some(Problem::Gap { .. })), "{f:?}");
        assert_eq!(f.effect, Effect::NeededByFallback);
    }
}
