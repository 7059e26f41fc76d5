//! Recovery's plan: what the store's history is and which repairs keep
//! the directory in step with it, decided by reading only; and, last, the
//! repairs themselves ([`Plan::repair`]).
//!
//! Deciding apart from writing is what makes a dry run the open it stands
//! for (the same plan, left undone), lets a refused open leave every byte
//! where it was, and keeps every write recovery makes in one place, in an
//! order whose crash safety can be read off [`Plan::repair`] (fjall's
//! reader that truncates while it iterates is the counterexample). The
//! plan learns where the log ends from the replay that applies it
//! ([`Plan::end_log`], [`Plan::cut`]): a scan of its own before replay
//! would read and verify every record twice.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::report::{Damage, RecoveryMode, RecoveryReport, Repair, SkippedSnapshot, SnapshotUsed};
use crate::directory::names::{self, StoreFile, classify, discarded_name, discarded_number};
use crate::engine::shards::Shards;
use crate::error::{Corruption, Error, Result};
use crate::fs::{DirEntry, EntryKind, FileSystem};
use crate::recovery::loader::{Loaded, load_file};
use crate::snapshot;
use crate::snapshot::meta::Meta;
use crate::wal::segment;
use crate::wal::writer::SegmentInfo;

/// A segment and how much of it the history keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Its index in [`Plan::segments`].
    pub seg: usize,
    /// Bytes: its header and valid records.
    pub len: u64,
    /// Appends in those records.
    pub records: u64,
}

/// How the log ends, as replay found it with nothing in the way.
pub(crate) struct LogEnd {
    /// The position after the last record.
    pub next: u64,
    /// The last segment that holds records, and how much of it.
    pub last: Option<Kept>,
    pub tail: Tail,
    /// The store id of the segments replayed.
    pub store_id: Option<u64>,
}

/// What follows the last valid record.
pub(crate) enum Tail {
    /// Nothing.
    Clean,
    /// The segment after `last` (this index), shorter than its header.
    EmptyLast(usize),
    /// Bytes of `last` that were never durable: `bytes` of them, the last
    /// `preallocated` of which are zeros no write reached (a preallocated
    /// segment's room).
    Torn { bytes: u64, preallocated: u64 },
}

/// Where the history stops short of the log, for damage or a record that
/// does not apply.
pub(crate) struct Cut {
    /// The first segment (index) that is not kept whole.
    pub seg: usize,
    /// What is kept of segment `seg`; `None`: nothing.
    pub keep: Option<Kept>,
    /// The log position right after the last good record.
    pub good_end: u64,
    /// The last segment kept whole.
    pub prev: Option<Kept>,
    /// The store id of the segments before the cut.
    pub store_id: Option<u64>,
    pub damage: Damage,
}

/// Where the log goes on after recovery.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Continue {
    /// The position the next append gets.
    pub next: u64,
    /// The segment to append to; `None`: a new one at `next`.
    pub active: Option<Kept>,
    /// The store id of the segments kept.
    pub store_id: Option<u64>,
}

/// What recovery will do: the base it replays from, how far, and the
/// repairs.
pub(crate) struct Plan {
    pub dir: PathBuf,
    mode: RecoveryMode,
    /// The directory's names, and each name salvage gives a piece it moves
    /// aside ([`aside_path`]).
    names: BTreeSet<String>,
    /// First positions of the segments, ascending.
    pub segments: Vec<u64>,
    /// Positions of every snapshot file.
    pub snapshot_files: BTreeSet<u64>,
    /// Those that failed verification.
    damaged: BTreeSet<u64>,
    pub base: Option<SnapshotUsed>,
    skipped: Vec<SkippedSnapshot>,
    /// The position replay starts at: the base snapshot's, or 0.
    pub start: u64,
    /// Where the base snapshot's position lies in its segment, if it
    /// recorded it (version 6).
    pub point: Option<snapshot::LogPoint>,
    /// Bytes of the segments replay reads.
    pub log_bytes: u64,
    /// Replay applies the appends before this position; `None`: the
    /// whole log, until a cut shortens it.
    pub replay_to: Option<u64>,
    pub repairs: Vec<Repair>,
    /// How the log goes on, once decided.
    pub end: Option<Continue>,
    /// What salvage cut the history short for.
    salvage: Option<Damage>,
}

impl Plan {
    /// Lists the directory and picks the base: the newest snapshot that
    /// verifies, loaded (the state replay starts from), or the empty
    /// state.
    pub(crate) fn read(
        fs: &dyn FileSystem,
        dir: &Path,
        mode: RecoveryMode,
    ) -> Result<(Plan, (Shards, Meta))> {
        let listing = fs.list(dir).map_err(Error::at("list", dir))?;
        refuse_what_is_not_a_file(fs, dir, &listing)?;
        let mut plan = Plan {
            dir: dir.to_path_buf(),
            mode,
            names: listing.iter().map(|e| e.name.clone()).collect(),
            segments: Vec::new(),
            snapshot_files: BTreeSet::new(),
            damaged: BTreeSet::new(),
            base: None,
            skipped: Vec::new(),
            start: 0,
            point: None,
            log_bytes: 0,
            replay_to: None,
            repairs: Vec::new(),
            end: None,
            salvage: None,
        };
        // The naming rule the inspector shares (`files::classify`).
        for e in &listing {
            match classify(&e.name) {
                Some(StoreFile::SnapshotTemp(_) | StoreFile::SegmentTemp(_)) => {
                    plan.repairs.push(Repair::RemoveTemp {
                        file: dir.join(&e.name),
                    })
                }
                Some(StoreFile::Segment(pos)) => plan.segments.push(pos),
                Some(StoreFile::Snapshot(pos)) => {
                    plan.snapshot_files.insert(pos);
                }
                None => {}
            }
        }
        plan.segments.sort_unstable();
        let shards = plan.pick_base(fs)?;
        let first = plan.segments.iter().rev().find(|&&l| l <= plan.start);
        // What replay reads: from the first segment on, less what a seek
        // into that one skips (when its checks pass; if they fail, the
        // replay's threads were chosen for less than it reads).
        let skipped = match (first, plan.point) {
            (Some(&f), Some(p)) if f < plan.start => u64::from(p.offset),
            _ => 0,
        };
        plan.log_bytes = listing
            .iter()
            .filter(|e| {
                names::parse_segment_name(&e.name).is_some_and(|l| first.is_some_and(|&f| l >= f))
            })
            .map(|e| e.len)
            .sum::<u64>()
            .saturating_sub(skipped);
        Ok((plan, shards))
    }

    /// Loads the newest snapshot that verifies, noting those that do not.
    fn pick_base(&mut self, fs: &dyn FileSystem) -> Result<(Shards, Meta)> {
        for &pos in self.snapshot_files.iter().rev() {
            let path = self.dir.join(names::snapshot_name(pos));
            let loaded = load_file(fs, &path).and_then(|l| {
                let h = l.header;
                if h.position == pos {
                    Ok((h, l.shards, l.meta))
                } else {
                    let kind = Corruption::NameMismatch {
                        named: pos,
                        header: h.position,
                    };
                    Err(Error::corrupt(&path, 16, kind))
                }
            });
            match loaded {
                Ok((h, shards, meta)) => {
                    self.start = h.position;
                    self.point = h.point;
                    self.base = Some(SnapshotUsed {
                        file: path,
                        position: h.position,
                        entries: h.entries,
                    });
                    return Ok((shards, meta));
                }
                // A newer build's file is not damage: never skip it (a
                // fallback would write over its history). Nor is an IO
                // error.
                Err(Error::Corrupt { offset, kind, .. }) => {
                    self.damaged.insert(pos);
                    self.skipped.push(SkippedSnapshot {
                        file: path,
                        offset,
                        kind,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok((Shards::default(), Meta::default()))
    }

    /// The state replay starts from, again: the base snapshot, or nothing.
    pub(crate) fn base_state(&self, fs: &dyn FileSystem) -> Result<(Shards, Meta)> {
        Ok(match &self.base {
            Some(s) => {
                let Loaded { shards, meta, .. } = load_file(fs, &s.file)?;
                (shards, meta)
            }
            None => (Shards::default(), Meta::default()),
        })
    }

    pub(crate) fn segment_path(&self, seg: usize) -> PathBuf {
        let pos = self.segments.get(seg).copied().unwrap_or_default();
        self.dir.join(names::segment_name(pos))
    }

    /// The log replay needs is gone: no segment starts at or before the
    /// base's position. Reported at the snapshot that needs the log; with
    /// none, at the first segment, whose header says where the log begins.
    pub(crate) fn log_gone(&self) -> Cut {
        let (file, offset) = match (&self.base, self.segments.first()) {
            (Some(s), _) => (s.file.clone(), snapshot::POSITION_AT),
            (None, Some(_)) => (self.segment_path(0), segment::POSITION_AT),
            (None, None) => (self.dir.clone(), segment::POSITION_AT),
        };
        let kind = Corruption::LogGone {
            needed: self.start,
            oldest: self.segments.first().copied(),
        };
        Cut {
            seg: 0,
            keep: None,
            good_end: self.start,
            prev: None,
            store_id: None,
            damage: Damage::new(file, offset, kind),
        }
    }

    /// The base snapshot covers more than the log holds, which ends at
    /// `log_end` (in this segment, at this byte): a snapshot is written
    /// only once the log it covers is durable, so log it covers is damaged
    /// or missing. Reported where the snapshot states its position.
    pub(crate) fn beyond(&self, log_end: u64, ends_in: Option<(PathBuf, u64)>) -> Damage {
        let kind = Corruption::SnapshotBeyondLog {
            snapshot: self.start,
            log_end,
            ends_in,
        };
        let file = self
            .base
            .as_ref()
            .map_or(self.dir.clone(), |s| s.file.clone());
        Damage::new(file, snapshot::POSITION_AT, kind)
    }

    /// Replay found how the log ends: the repairs that end needs (cut a
    /// torn tail, remove a segment cut off at its creation), or a cut if
    /// the base snapshot covers more than the log holds.
    pub(crate) fn end_log(&mut self, fs: &dyn FileSystem, end: LogEnd) -> Result<()> {
        if let Tail::EmptyLast(seg) = end.tail {
            let file = self.segment_path(seg);
            self.repairs.push(Repair::RemoveEmptySegment { file });
        }
        if self.start > end.next {
            let ends_in = end.last.map(|k| (self.segment_path(k.seg), k.len));
            let cut = Cut {
                seg: self.segments.len(),
                keep: None,
                good_end: self.start,
                prev: None,
                store_id: end.store_id,
                damage: self.beyond(end.next, ends_in),
            };
            return self.cut(fs, cut);
        }
        let mut active = end.last;
        match end.tail {
            Tail::Clean => {}
            // The log ends where the segment before it ended; the writer
            // starts a new one there.
            Tail::EmptyLast(_) => active = None,
            Tail::Torn {
                bytes,
                preallocated,
            } => {
                if let Some(last) = end.last {
                    let file = self.segment_path(last.seg);
                    let len = last.len;
                    self.repairs.push(Repair::Truncate {
                        file,
                        len,
                        bytes,
                        preallocated,
                    });
                }
            }
        }
        self.end = Some(Continue {
            next: end.next,
            active,
            store_id: end.store_id,
        });
        Ok(())
    }

    /// The history stops at `cut`: an error in strict mode; in salvage,
    /// everything from the cut on is moved aside, and replay goes no
    /// further than the cut.
    pub(crate) fn cut(&mut self, fs: &dyn FileSystem, cut: Cut) -> Result<()> {
        if self.mode == RecoveryMode::Strict {
            return Err(cut.damage.into());
        }
        let mut active = cut.prev;
        for idx in cut.seg..self.segments.len() {
            let file = self.segment_path(idx);
            let name = names::segment_name(self.segments.get(idx).copied().unwrap_or_default());
            let to = aside_path(fs, &self.dir, &name, &mut self.names)?;
            let len = fs
                .open_read(&file)
                .and_then(|f| f.len())
                .map_err(Error::at("stat", &file))?;
            let from = match cut.keep.filter(|_| idx == cut.seg) {
                Some(keep) => {
                    active = Some(keep);
                    keep.len
                }
                None => 0,
            };
            let bytes = len.saturating_sub(from);
            self.repairs.push(Repair::MoveAside {
                file,
                from,
                to,
                bytes,
            });
        }
        // Never continue below the snapshot's position: if the good log
        // ends before it, a new segment starts at it.
        if cut.good_end < self.start {
            active = None;
        }
        self.replay_to = Some(cut.good_end);
        self.salvage = Some(cut.damage);
        self.end = Some(Continue {
            next: cut.good_end.max(self.start),
            active,
            store_id: cut.store_id,
        });
        Ok(())
    }

    /// The report's view of the plan (the counts of replay left to fill).
    pub(crate) fn report(&self) -> RecoveryReport {
        let mut r = RecoveryReport {
            snapshot: self.base.clone(),
            skipped_snapshots: self.skipped.clone(),
            next_position: self.end.map_or(self.start, |e| e.next),
            ..RecoveryReport::default()
        };
        r.set_repairs(self.repairs.clone(), self.salvage.clone());
        r
    }

    /// The segments the log keeps, and the one it continues with its
    /// (bytes, records).
    pub(crate) fn kept_segments(&self) -> (Vec<SegmentInfo>, Option<(u64, u64)>) {
        let info = |&first_position: &u64| SegmentInfo { first_position };
        match self.end.and_then(|e| e.active) {
            Some(k) => (
                self.segments
                    .get(..=k.seg)
                    .unwrap_or_default()
                    .iter()
                    .map(info)
                    .collect(),
                Some((k.len, k.records)),
            ),
            None => {
                // Every segment that is left and lies before the next
                // position stays; a new one starts at the next position.
                let gone: BTreeSet<&Path> = self
                    .repairs
                    .iter()
                    .filter_map(|r| match r {
                        Repair::RemoveEmptySegment { file }
                        | Repair::MoveAside { file, from: 0, .. } => Some(file.as_path()),
                        _ => None,
                    })
                    .collect();
                let next = self.end.map_or(self.start, |e| e.next);
                let kept = (0..self.segments.len())
                    .filter(|&i| {
                        self.segments.get(i).is_some_and(|&l| l < next)
                            && !gone.contains(self.segment_path(i).as_path())
                    })
                    .filter_map(|i| self.segments.get(i).map(info))
                    .collect();
                (kept, None)
            }
        }
    }

    /// Positions of the snapshots that were not found damaged.
    pub(crate) fn valid_snapshots(&self) -> Vec<u64> {
        self.snapshot_files
            .iter()
            .copied()
            .filter(|p| !self.damaged.contains(p))
            .collect()
    }

    /// Makes the repairs, in order.
    ///
    /// Directory changes (removals, renames) are made durable before the
    /// next change to a file's bytes and at the end, so a crash never keeps
    /// a later repair and loses an earlier one. Nothing moved aside ever
    /// replaces a file: each piece has a name no file had when the plan was
    /// made, and is refused if one has it now. The copy of a damaged tail
    /// is durable, name included, before the segment is cut, so a crash
    /// leaves every byte in the segment or in the copy (a crash between
    /// the two leaves both: the next salvage sets the tail aside again,
    /// under the next name).
    pub(crate) fn repair(&self, fs: &dyn FileSystem) -> Result<()> {
        let dir = &self.dir;
        let sync_dir = || fs.sync_dir(dir).map_err(Error::at("fsync directory", dir));
        let mut unsynced = false;
        for r in &self.repairs {
            match r {
                Repair::RemoveTemp { file } | Repair::RemoveEmptySegment { file } => {
                    fs.remove_file(file).map_err(Error::at("remove", file))?;
                    unsynced = true;
                }
                Repair::Truncate { file, len, .. } => {
                    if std::mem::take(&mut unsynced) {
                        sync_dir()?;
                    }
                    truncate(fs, file, *len)?;
                }
                Repair::MoveAside {
                    file, from: 0, to, ..
                } => {
                    if fs.kind(to).map_err(Error::at("stat", to))?.is_some() {
                        return Err(taken(to));
                    }
                    fs.rename(file, to).map_err(Error::at("rename", file))?;
                    unsynced = true;
                }
                Repair::MoveAside { file, from, to, .. } => {
                    // Copy the damaged rest aside, then cut the segment.
                    copy_tail(fs, file, *from, to)?;
                    sync_dir()?;
                    unsynced = false;
                    truncate(fs, file, *from)?;
                }
            }
        }
        if unsynced || self.salvage.is_some() {
            sync_dir()?;
        }
        Ok(())
    }
}

fn truncate(fs: &dyn FileSystem, file: &Path, len: u64) -> Result<()> {
    let mut f = fs.open_append(file).map_err(Error::at("open", file))?;
    f.set_len(len).map_err(Error::at("truncate", file))?;
    f.sync_data().map_err(Error::at("fsync", file))
}

fn taken(path: &Path) -> Error {
    Error::io(
        "name",
        path,
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "every name for a discarded piece of this file is taken",
        ),
    )
}

/// Refuses an entry named like a store file that is not a regular file
/// (symbolic links followed): passing over a segment or a snapshot would
/// forget acknowledged appends, so recovery reads such a name or stops.
/// Checked before recovery decides anything, in every mode.
fn refuse_what_is_not_a_file(fs: &dyn FileSystem, dir: &Path, listing: &[DirEntry]) -> Result<()> {
    let Some(e) = listing
        .iter()
        .find(|e| e.kind != Some(EntryKind::File) && classify(&e.name).is_some())
    else {
        return Ok(());
    };
    Err(crate::directory::not_a_file(fs, dir.join(&e.name), e.kind))
}

/// A name for what salvage moves aside from `file` that no file has:
/// `<file>.discarded` if no earlier piece of `file` is there, else
/// `<file>.discarded.<n>` with n one more than the highest in use, so that
/// the numbers follow the order of the salvages. `in_use` holds the
/// directory's names (and gets the one chosen); a name found taken
/// (something the listing does not show) is passed over.
pub(crate) fn aside_path(
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
        let name = discarded_name(file, k);
        let path = dir.join(&name);
        if !in_use.contains(&name) && fs.kind(&path).map_err(Error::at("stat", &path))?.is_none() {
            in_use.insert(name);
            return Ok(path);
        }
        n = k.checked_add(1);
    }
    Err(taken(&dir.join(discarded_name(file, 0))))
}

/// Copies `from` on of `src` into the new file `dst` and makes it durable.
fn copy_tail(fs: &dyn FileSystem, src: &Path, from: u64, dst: &Path) -> Result<()> {
    let mut f = fs.open_read(src).map_err(Error::at("open", src))?;
    let skipped = std::io::copy(&mut (&mut f).take(from), &mut std::io::sink())
        .map_err(Error::at("read", src))?;
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
    let mut out = fs.create_new(dst).map_err(Error::at("create", dst))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(Error::at("read", src))?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            break;
        };
        out.write_all(chunk).map_err(Error::at("write", dst))?;
    }
    out.sync_data().map_err(Error::at("fsync", dst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::names::DISCARDED;
    use crate::fs::SimFs;

    #[test]
    fn names_set_aside_are_fresh_ordered_and_never_store_files() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/s");
        fs.create_dir_all(&dir).unwrap();
        let seg = names::segment_name(66);
        let mut in_use: BTreeSet<String> = [
            seg.clone(),
            format!("{seg}.discarded.2"),
            format!("{seg}.discarded.x"),
            format!("{}.discarded.7", names::segment_name(6)),
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
        let first = aside_path(&fs, &dir, &names::segment_name(9), &mut empty).unwrap();
        assert_eq!(
            first,
            dir.join(format!("{}.discarded", names::segment_name(9)))
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
            assert_eq!(names::parse_segment_name(name), None, "{name}");
            assert_eq!(names::parse_snapshot_name(name), None, "{name}");
            assert!(!name.ends_with(names::SNAPSHOT_TMP_SUFFIX), "{name}");
        }
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded")), Some(0));
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded.")), None);
        assert_eq!(discarded_number(&seg, &format!("{seg}.discarded.+1")), None);
        assert_eq!(discarded_number(&seg, &format!("{seg}.discardedx")), None);
    }
}
