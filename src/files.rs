//! The store's naming rule: which file names in a store directory are
//! recovery's, and what each is.
//!
//! One function, [`classify`], used by recovery (to pick the files it
//! reads and removes), by [`kafka::seed_store`](crate::kafka::seed_store)
//! (to refuse a directory that already holds a store) and by
//! [`inspect`](crate::inspect) (so the inspector's verdict is about the
//! files recovery reads, and only those). A name it does not recognise is
//! never read by recovery, whatever its extension or bytes.

use crate::snapshot;
use crate::wal::segment;

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
    if let Some(stem) = name.strip_suffix(snapshot::TMP_SUFFIX) {
        return snapshot::parse_name(stem).map(StoreFile::SnapshotTemp);
    }
    if let Some(stem) = name.strip_suffix(crate::wal::writer::PREP_SUFFIX) {
        return segment::parse_name(stem).map(StoreFile::SegmentTemp);
    }
    segment::parse_name(name)
        .map(StoreFile::Segment)
        .or_else(|| snapshot::parse_name(name).map(StoreFile::Snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stores_own_names_are_store_files() {
        assert_eq!(
            classify(&segment::file_name(9)),
            Some(StoreFile::Segment(9))
        );
        assert_eq!(
            classify(&snapshot::file_name(9)),
            Some(StoreFile::Snapshot(9))
        );
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
}
