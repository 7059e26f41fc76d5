//! The store's naming rule: which file names in a store directory are
//! recovery's, and what each is.
//!
//! One function, [`classify`], used by recovery (to pick the files it
//! reads and removes), by [`kafka::seed_store`](crate::kafka::seed_store)
//! and [`kafka::seed_kafka_store`](crate::kafka::seed_kafka_store) (to
//! refuse a directory that already holds a store) and by
//! [`inspect`](crate::inspect) (so the inspector's verdict is about the
//! files recovery reads, and only those). A name it does not recognise is
//! never read by recovery, whatever its extension or bytes.

use std::path::PathBuf;

use crate::error::Error;
use crate::fs::{EntryKind, FileSystem};
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

/// The refusal of an entry named like a store file that is not a regular
/// file once symbolic links are followed (`kind` as the listing gave it):
/// recovery can neither read it nor pass over it, and the inspector's
/// verdict says the same.
pub(crate) fn not_a_file(fs: &dyn FileSystem, path: PathBuf, kind: Option<EntryKind>) -> Error {
    // Only for the message: whether the name itself is a link.
    let link = fs.is_symlink(&path).unwrap_or(false);
    let what = match (kind, link) {
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
    Error::NotAFile { path, what }
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
