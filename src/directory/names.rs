//! The store's naming rule: every file name and suffix the store, seeding
//! and salvage use, made and parsed here and nowhere else, and which names
//! in a store directory are recovery's.
//!
//! The formats ([`crate::wal`], [`crate::snapshot`]) say what is inside a
//! file; this file says what it is called, below them, so that deciding
//! whether a directory already holds a store does not depend on any
//! format.
//!
//! One function, [`classify`], used by recovery (to pick the files it
//! reads and removes), by [`kafka::seed_store`](crate::kafka::seed_store)
//! and [`kafka::seed_kafka_store`](crate::kafka::seed_kafka_store) (to
//! refuse a directory that already holds a store) and by
//! [`inspect`](crate::inspect) (so the inspector's verdict is about the
//! files recovery reads, and only those). A name it does not recognise is
//! never read by recovery, whatever its extension or bytes.

/// A log segment's extension: `<20 digits>.wal`.
const SEGMENT_EXT: &str = "wal";
/// A snapshot's extension: `<20 digits>.snap`.
const SNAPSHOT_EXT: &str = "snap";
/// Apache Kafka's producer snapshot: `<20 digits>.snapshot`.
const KAFKA_SNAPSHOT_EXT: &str = "snapshot";
/// A snapshot being written, renamed into place once durable.
pub(crate) const SNAPSHOT_TMP_SUFFIX: &str = ".tmp";
/// A preallocated segment being prepared, renamed into place when the log
/// reaches it.
pub(crate) const SEGMENT_PREP_SUFFIX: &str = ".prep";
/// What salvage appends to the name of a file it moves aside.
pub(crate) const DISCARDED: &str = ".discarded";
/// The lock file kept for older builds (the lock itself is on the
/// directory: see [`super`]).
pub(crate) const LOCK_FILE: &str = "LOCK";

/// The file name of the segment whose first record has position `pos`.
pub(crate) fn segment_name(pos: u64) -> String {
    format!("{pos:020}.{SEGMENT_EXT}")
}

/// The position in a segment's file name, if it is one (`<20 digits>.wal`).
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    parse_numbered(name, SEGMENT_EXT)
}

/// The file name of a preallocated segment prepared for position `pos`.
pub(crate) fn segment_prep_name(pos: u64) -> String {
    format!("{}{SEGMENT_PREP_SUFFIX}", segment_name(pos))
}

/// The file name of the snapshot at `position`.
pub(crate) fn snapshot_name(position: u64) -> String {
    format!("{position:020}.{SNAPSHOT_EXT}")
}

/// The position in a snapshot's file name (`<20 digits>.snap`).
pub(crate) fn parse_snapshot_name(name: &str) -> Option<u64> {
    parse_numbered(name, SNAPSHOT_EXT)
}

/// The file name a snapshot at `position` is written under before its
/// rename.
pub(crate) fn snapshot_tmp_name(position: u64) -> String {
    format!("{}{SNAPSHOT_TMP_SUFFIX}", snapshot_name(position))
}

/// The file name of Kafka's producer snapshot covering offsets below
/// `offset`.
pub(crate) fn kafka_snapshot_name(offset: u64) -> String {
    format!("{offset:020}.{KAFKA_SNAPSHOT_EXT}")
}

/// The offset in a Kafka snapshot's file name (`<20 digits>.snapshot`).
pub(crate) fn parse_kafka_snapshot_name(name: &str) -> Option<u64> {
    parse_numbered(name, KAFKA_SNAPSHOT_EXT)
}

/// `<20 digits>.<ext>` -> the number.
fn parse_numbered(name: &str, ext: &str) -> Option<u64> {
    let (digits, e) = name.split_once('.')?;
    if e != ext || digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name salvage gives the `k`-th piece it moves aside from `file`:
/// `<file>.discarded`, then `<file>.discarded.<k>`.
pub(crate) fn discarded_name(file: &str, k: u64) -> String {
    if k == 0 {
        format!("{file}{DISCARDED}")
    } else {
        format!("{file}{DISCARDED}.{k}")
    }
}

/// The number of a name salvage gave a piece of `file`:
/// `<file>.discarded` is 0, `<file>.discarded.<n>` is n; `None` for any
/// other name.
pub(crate) fn discarded_number(file: &str, name: &str) -> Option<u64> {
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

/// A file that is part of a store, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum StoreFile {
    /// `<20 digits>.wal`: a log segment whose first record has this position.
    Segment(u64),
    /// `<20 digits>.snap`: a snapshot covering the log before this position.
    Snapshot(u64),
    /// `<20 digits>.snap.tmp`: left by a snapshot that was cut off before
    /// its rename; recovery removes it.
    SnapshotTemp(u64),
    /// `<20 digits>.wal.prep`: a preallocated segment being prepared
    /// while the segment starting at this position is written, not yet
    /// renamed into place; recovery removes it.
    SegmentTemp(u64),
}

/// What a file name is to the store: `None` for every name recovery does
/// not read (Kafka's `<offset>.snapshot`, `notes.snap`, `LOCK`, files
/// salvage moved aside, ...).
///
/// ```
/// use producer_state::inspect::{StoreFile, classify};
/// assert_eq!(classify("00000000000000000042.wal"), Some(StoreFile::Segment(42)));
/// assert_eq!(classify("00000000000000000007.snap.tmp"), Some(StoreFile::SnapshotTemp(7)));
/// assert_eq!(classify("00000000000000000007.wal.prep"), Some(StoreFile::SegmentTemp(7)));
/// assert_eq!(classify("notes.snap"), None);
/// assert_eq!(classify("00000000000000000001.snapshot"), None);
/// ```
pub fn classify(name: &str) -> Option<StoreFile> {
    if let Some(stem) = name.strip_suffix(SNAPSHOT_TMP_SUFFIX) {
        return parse_snapshot_name(stem).map(StoreFile::SnapshotTemp);
    }
    if let Some(stem) = name.strip_suffix(SEGMENT_PREP_SUFFIX) {
        return parse_segment_name(stem).map(StoreFile::SegmentTemp);
    }
    parse_segment_name(name)
        .map(StoreFile::Segment)
        .or_else(|| parse_snapshot_name(name).map(StoreFile::Snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stores_own_names_are_store_files() {
        assert_eq!(classify(&segment_name(9)), Some(StoreFile::Segment(9)));
        assert_eq!(classify(&snapshot_name(9)), Some(StoreFile::Snapshot(9)));
        assert_eq!(
            classify("00000000000000000009.wal.prep"),
            Some(StoreFile::SegmentTemp(9))
        );
        for other in [
            "notes.snap",
            "x.wal",
            "00000000000000000001.snapshot",
            "00000000000000000001.wal.discarded",
            "0000000000000000001.wal",
            "000000000000000000001.wal",
            "LOCK",
            "notes.snap.tmp",
            "notes.wal.prep",
            "00000000000000000001.snap.prep",
            "",
        ] {
            assert_eq!(classify(other), None, "{other}");
        }
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(segment_name(42), "00000000000000000042.wal");
        assert_eq!(parse_segment_name(&segment_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_segment_name("0000000000000000042.wal"), None);
        assert_eq!(parse_segment_name("00000000000000000042.snap"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.wal"), None);
        assert_eq!(parse_snapshot_name(&snapshot_name(9)), Some(9));
        assert_eq!(parse_snapshot_name(&snapshot_tmp_name(9)), None);
        assert_eq!(parse_snapshot_name("00000000000000000009.wal"), None);
        assert_eq!(kafka_snapshot_name(41), "00000000000000000041.snapshot");
        assert_eq!(
            parse_kafka_snapshot_name(&kafka_snapshot_name(41)),
            Some(41)
        );
        assert_eq!(parse_kafka_snapshot_name(&snapshot_name(41)), None);
        assert_eq!(segment_prep_name(7), "00000000000000000007.wal.prep");
        assert_eq!(
            discarded_number("a.wal", &discarded_name("a.wal", 0)),
            Some(0)
        );
        assert_eq!(
            discarded_number("a.wal", &discarded_name("a.wal", 12)),
            Some(12)
        );
    }
}
