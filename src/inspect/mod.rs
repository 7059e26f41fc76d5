//! Read-only inspection of store files and of Kafka's snapshot files.
//!
//! This is what the `inspect-snapshot` tool prints, as a library: the same
//! readers and verifiers recovery uses (there is no second parser), and the
//! policy that says what a finding means for the store ([`directory`]: a
//! report with a [`Verdict`] per file and one for the directory), so the
//! tool only renders. Every function reads through the [`FileSystem`] it is
//! given; pass `&ReadOnlyFs(StdFs)` ([`ReadOnlyFs`], [`StdFs`](crate::fs::StdFs))
//! for real files, so that a bug can fail an inspection but never write. No
//! lock is taken, so they work on a live store and on a copy of a crashed
//! one.
//!
//! Memory is bounded by what a file really holds, not by what its header
//! claims: a file is verified before anything it holds is handed out, and
//! a key (or Kafka producer) that appears twice is damage found at its
//! second appearance, so a length that zeros or a hole in a sparse file
//! make plausible costs nothing. Segments are streamed (each record is
//! verified before it is handed out); a snapshot, a Kafka snapshot and the
//! dry run hold one entry per key, as recovery does.
//!
//! # The log's operations are public, on purpose
//!
//! [`segment`] hands out each record's operation as the log's own
//! [`LogOp`] (with [`GroupKind`] and [`RemoveReason`]). They stay public
//! rather than behind a view of the inspector's own, because the point of
//! inspecting a segment is to see exactly what the log holds: a mirror
//! type would be a second description of every record kind, kept in step
//! with the first by hand, and could drift from the bytes it claims to
//! show. The cost is that a change to a log record's fields is an API
//! change too; that change comes with a new format version, golden files
//! and docs/format.md anyway. All three are `#[non_exhaustive]`, so a
//! new record kind or reason is not a breaking change.

mod directory;
mod file;

#[cfg(doc)]
use crate::fs::{FileSystem, ReadOnlyFs};

pub use crate::directory::names::{StoreFile, classify};
// Public on purpose: see the module docs.
pub use crate::wal::op::{GroupKind, LogOp, RemoveReason};
pub use directory::{
    Contents, DirectoryReport, DryRun, Effect, FileReport, Problem, Role, directory,
};
pub use file::{
    FileKind, PartitionSection, RecoveredState, SegmentEnd, SegmentSummary, SnapshotSummary,
    Verdict, decode_snapshot, detect, dry_run, kafka_snapshot, partition_section, segment,
    snapshot,
};
