//! The one error type of the crate.
//!
//! Outcomes such as `DUPLICATE` are values, not errors. An [`Error`] means
//! the store could not do what was asked: an IO call failed (and says which
//! call on which path), bytes on disk are damaged (and say where and how),
//! or the store refuses to go on (locked, poisoned). Every message says
//! what happened and, where there is one, what to do.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the durable store and its file formats.
///
/// Match the variants that call for an action and report the rest; every
/// message says what happened and, where there is one, what to do.
///
/// ```
/// use producer_state::{Corruption, Error, ProducerStateStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = ProducerStateStore::open(dir.path())?;
/// match ProducerStateStore::open(dir.path()) {
///     // Another process (or this one) has the store open.
///     Err(Error::Locked { path }) => assert_eq!(path, dir.path()),
///     other => panic!("{other:?}"),
/// }
/// drop(store);
///
/// // Damage names the file, the byte and what is wrong with it.
/// let snapshot = producer_state::ProducerStateManager::new().encode_snapshot(0)?;
/// let mut bytes = snapshot.clone();
/// bytes[20] ^= 1;
/// let err = producer_state::ProducerStateManager::decode_snapshot("copy", &bytes).unwrap_err();
/// assert!(err.is_corruption());
/// if let Error::Corrupt { kind, .. } = &err {
///     assert!(matches!(kind, Corruption::ChecksumMismatch { .. }));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An IO call failed. `op` names the call (`write`, `fsync`, `rename`, ...).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory it was applied to.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// Bytes on disk are damaged or inconsistent.
    #[error("{} is corrupt at byte {offset}: {kind}", file.display())]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// Byte offset of the damage within the file.
        offset: u64,
        /// What is wrong.
        kind: Corruption,
    },
    /// A file was written by a format version this build cannot read.
    #[error("{} has format version {found}; this build reads versions up to {supported}", file.display())]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// The version found in the file.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// Another open store holds the directory (in this process or another).
    #[error("{} is in use by another open store; close that one first", path.display())]
    Locked {
        /// The store directory.
        path: PathBuf,
    },
    /// An earlier write or fsync failed; the store refuses further appends
    /// until it is reopened (a failed fsync must never be retried: the kernel
    /// may already have dropped the dirty pages).
    #[error(
        "the store refuses appends after an earlier failure ({op} {}: {kind}); reopen it to recover from what is on disk",
        path.display()
    )]
    Poisoned {
        /// The operation that failed first (`write`, `fsync`, ...).
        op: &'static str,
        /// The file it was applied to.
        path: PathBuf,
        /// What the operating system said, as a kind (the full error went
        /// to the calls that were waiting on that operation).
        kind: io::ErrorKind,
    },
    /// A bug in this crate: an invariant it relies on did not hold. Nothing
    /// on disk is the cause; please report it with the message.
    #[error("internal error in producer-state (a bug; please report it): {0}")]
    Internal(&'static str),
    /// The store path exists and is not a directory.
    #[error("{} exists and is not a directory", path.display())]
    NotADirectory {
        /// The path given to `open`.
        path: PathBuf,
    },
    /// The path cannot name a store directory (it is empty); refused before
    /// anything is created or locked.
    #[error("{path:?} cannot be a store directory: {reason}")]
    InvalidPath {
        /// The path given.
        path: PathBuf,
        /// Why it cannot be one.
        reason: &'static str,
    },
    /// An entry of the store directory is named like a store file (a log
    /// segment, a snapshot, a temporary snapshot) but is not a regular
    /// file nor a symbolic link to one. Recovery cannot read it, and must
    /// not pass over it: a segment or snapshot left out of recovery would
    /// make the store forget appends it acknowledged, and accept their
    /// retries again. Salvage refuses it too.
    #[error(
        "{} is named like a store file but is {what}; recovery can neither read it nor leave it out: put the file itself (or a symbolic link to it) back under this name, or move the entry out of the store directory",
        path.display()
    )]
    NotAFile {
        /// The entry.
        path: PathBuf,
        /// What it is instead ("a directory", "a symbolic link to nothing", ...).
        what: &'static str,
    },
    /// The options cannot work together.
    #[error("invalid store options: {0}")]
    InvalidOptions(String),
    /// The engine's semantics have no such operation: transactions,
    /// markers, the replication origin and Kafka's snapshot view exist
    /// only under [`Semantics::Kafka`](crate::Semantics::Kafka), and the
    /// crate's own snapshot format only holds a strict engine.
    #[error("{what} is not supported under the {semantics} semantics; {}", semantics_hint(*semantics))]
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// The engine's semantics.
        semantics: crate::semantics::Semantics,
    },

    /// The directory was written under other semantics than the store was
    /// opened with: replaying a Kafka-mode log under the strict rules (or
    /// the reverse) would give other verdicts than the ones it recorded.
    /// Nothing was changed; open it with the semantics it has.
    #[error("{} holds a {stored}-semantics store, and it was opened with Semantics::{}; nothing was changed: open it with the semantics it was written with", path.display(), if *requested == crate::semantics::Semantics::Kafka { "Kafka" } else { "Strict" })]
    SemanticsMismatch {
        /// The file that says so (a segment or snapshot).
        path: PathBuf,
        /// The semantics the directory records.
        stored: crate::semantics::Semantics,
        /// The semantics asked for.
        requested: crate::semantics::Semantics,
    },

    /// A named producer id is longer than the log format can hold.
    #[error("producer id name is {len} bytes; the log holds names of at most {max} bytes")]
    ProducerIdTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The longest name the format holds.
        max: usize,
    },
    /// The table holds `max_producers` keys and the store was opened with
    /// [`AtCapacity::Refuse`](crate::AtCapacity::Refuse): a new key is
    /// refused, nothing is written. Existing keys keep appending; keys
    /// leave by expiration or partition removal.
    #[error(
        "the store holds its maximum of {max} producer keys and refuses new ones (AtCapacity::Refuse); nothing was written: let keys expire, remove a partition, or raise max_producers"
    )]
    TooManyProducers {
        /// The cap (`StoreOptions::max_producers`).
        max: usize,
    },
    /// `truncate_to(offset)` reaches below what the retained snapshots and
    /// log can rebuild; nothing was changed.
    #[error(
        "cannot truncate to offset {offset}: the oldest retained history starts above it, the lowest offset this store can truncate to is {lowest} (keep more snapshots with StoreOptions::keep_snapshots to reach further back); nothing was changed"
    )]
    TruncateBelowHistory {
        /// The offset asked for.
        offset: i64,
        /// The lowest offset truncation can reach now.
        lowest: i64,
    },
    /// `truncate_to(offset)` is above the log's end (one past the highest
    /// offset the store holds); nothing was changed.
    #[error(
        "cannot truncate to offset {offset}: it is above the end of the log, {end} (one past the highest offset appended); nothing was changed"
    )]
    TruncateAboveEnd {
        /// The offset asked for.
        offset: i64,
        /// The log's end.
        end: i64,
    },
    /// `import_partition` found a key the store already holds; nothing was
    /// imported.
    #[error(
        "cannot import: producer {producer_id} already has state for partition {partition} in this store; nothing was imported (remove the partition first if the import is meant to replace it)"
    )]
    ImportConflict {
        /// The producer of the first conflicting key.
        producer_id: ProducerId,
        /// Its partition.
        partition: i32,
    },
    /// `import_partition` was given an export taken under the other
    /// semantics: a strict store has no place for a Kafka partition's
    /// transactions and aborted list, and a strict export has none of what a
    /// Kafka-mode store answers from. Nothing was imported.
    #[error(
        "cannot import partition {partition}: the export was taken under the {exported} semantics and this store has the {store} semantics; nothing was imported (a partition moves only between stores of the same semantics)"
    )]
    ImportSemanticsMismatch {
        /// The exported partition.
        partition: i32,
        /// The semantics of the store the export was taken from.
        exported: crate::semantics::Semantics,
        /// This store's.
        store: crate::semantics::Semantics,
    },
    /// Kafka mode: `import_partition` found the partition with state here
    /// and no key to name (its aborted transactions are still listed).
    /// Nothing was imported.
    #[error(
        "cannot import partition {partition}: this store still lists aborted transactions of it; nothing was imported (remove the partition first if the import is meant to replace it)"
    )]
    ImportPartitionNotEmpty {
        /// The partition.
        partition: i32,
    },
    /// Seeding from Kafka's files was pointed at a directory that already
    /// holds store files: a seed starts a new store and never merges into
    /// one. Nothing was written.
    #[error(
        "{} already holds a store; nothing was written (seed only a new or empty directory)",
        path.display()
    )]
    SeedTargetNotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// Seeding from Kafka's files found one producer twice for one
    /// partition (in two files given for the same partition): which of the
    /// two states is the producer's cannot be told. No store was written.
    #[error(
        "producer {producer_id} appears twice for partition {partition} in the files given; no store was written (give each partition's newest snapshot once)"
    )]
    SeedDuplicateProducer {
        /// Kafka's producer id.
        producer_id: i64,
        /// The partition both files were given for.
        partition: i32,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// `map_err`'s argument for an IO call on `path`: `f().map_err(Error::at("open", path))`.
    pub(crate) fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
        move |e| Error::io(op, path, e)
    }

    pub(crate) fn corrupt(file: impl Into<PathBuf>, offset: u64, kind: Corruption) -> Error {
        Error::Corrupt {
            file: file.into(),
            offset,
            kind,
        }
    }

    /// True for [`Error::Corrupt`] and [`Error::UnsupportedVersion`]: the
    /// bytes on disk, not the machine, are the problem.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. } | Error::UnsupportedVersion { .. }
        )
    }
}

/// What is wrong with damaged bytes.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// The file does not start with the expected magic bytes.
    BadMagic,
    /// A stored checksum does not match the bytes it covers.
    ChecksumMismatch {
        /// The checksum stored in the file.
        stored: u32,
        /// The checksum of the bytes as read.
        computed: u32,
    },
    /// The file ends inside a structure that needs more bytes.
    Truncated {
        /// Bytes the structure needs from the offset.
        needed: u64,
        /// Bytes the file has from the offset.
        available: u64,
    },
    /// A length field is outside what the format allows.
    BadLength(u64),
    /// A record or entry kind byte this format does not define.
    BadKind(u8),
    /// A field holds a value the format does not allow.
    BadField(&'static str),
    /// Bytes follow the end of a structure that must end the file.
    TrailingBytes(u64),
    /// The header's entry count disagrees with the entries found.
    CountMismatch {
        /// The count the header states.
        stated: u64,
        /// The entries actually present.
        found: u64,
    },
    /// A record is damaged and a valid record follows it that was written
    /// when the damaged bytes were already durable: not a torn tail but
    /// damage in the middle of the log.
    DamagedMidLog,
    /// The log skips records: a segment is missing between two others.
    MissingRecords {
        /// The position the next record should have had.
        expected: u64,
        /// The position the next segment starts at.
        found: u64,
    },
    /// The snapshot needs log records that are no longer on disk.
    LogGone {
        /// The first position replay needs.
        needed: u64,
        /// The first position the log still has (None: no log at all).
        oldest: Option<u64>,
    },
    /// A snapshot covers more of the log than the log holds.
    SnapshotBeyondLog {
        /// The snapshot's position.
        snapshot: u64,
        /// The log position the log ends at.
        log_end: u64,
        /// The segment and the byte its valid records end at (damage
        /// there, or the end of the file); `None` if no segment was read.
        ends_in: Option<(PathBuf, u64)>,
    },
    /// A logged transition is not an accepted append of the state before it:
    /// the log and the snapshot do not belong together.
    RecordDoesNotApply {
        /// Log position of the record.
        position: u64,
        /// What the rules said instead of ACCEPTED.
        outcome: BatchOutcome,
    },
    /// A key appears twice in one snapshot.
    DuplicateKey,
    /// A file name and its header disagree.
    NameMismatch {
        /// The value encoded in the file name.
        named: u64,
        /// The value in the header.
        header: u64,
    },
    /// A valid record of the segment that was written at another offset:
    /// records before it are missing, or it was moved or repeated. A crash
    /// never moves bytes, so this is damage wherever it is found.
    MisplacedRecord {
        /// The offset the record was written at (it states it).
        written_at: u64,
    },
    /// A segment belongs to another store: its store id differs from that
    /// of the segments replayed before it.
    ForeignSegment {
        /// The store id of the log so far.
        expected: u64,
        /// The store id in this segment's header.
        found: u64,
    },
    /// The records end inside an atomic group (version 5): its last
    /// records are missing.
    IncompleteGroup,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadMagic => f.write_str("bad magic bytes (not a file of this kind)"),
            Corruption::ChecksumMismatch { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            Corruption::Truncated { needed, available } => write!(
                f,
                "truncated: {needed} bytes needed, {available} present"
            ),
            Corruption::BadLength(n) => write!(f, "length {n} is outside the format's limits"),
            Corruption::BadKind(k) => write!(f, "unknown kind byte {k:#04x}"),
            Corruption::BadField(what) => write!(f, "invalid {what}"),
            Corruption::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the end"),
            Corruption::CountMismatch { stated, found } => {
                write!(f, "header states {stated} entries, found {found}")
            }
            Corruption::DamagedMidLog => f.write_str(
                "a damaged record is followed by a valid record written after it was durable (damage in the middle of the log, not a torn tail)",
            ),
            Corruption::MissingRecords { expected, found } => write!(
                f,
                "records missing: expected position {expected}, next segment starts at {found}"
            ),
            Corruption::LogGone { needed, oldest } => match oldest {
                Some(o) => write!(
                    f,
                    "replay must start at position {needed} but the log begins at {o}"
                ),
                None => write!(f, "replay must start at position {needed} but there is no log"),
            },
            Corruption::SnapshotBeyondLog {
                snapshot,
                log_end,
                ends_in,
            } => {
                write!(
                    f,
                    "snapshot covers the log up to position {snapshot} but the log ends at position {log_end}"
                )?;
                if let Some((file, offset)) = ends_in {
                    write!(f, ", at byte {offset} of {}", file.display())?;
                }
                f.write_str(
                    " (a snapshot is written only once the log it covers is durable: log records it covers are damaged or missing)",
                )
            }
            Corruption::RecordDoesNotApply { position, outcome } => write!(
                f,
                "log record at position {position} is not an accepted append of the state before it ({outcome})"
            ),
            Corruption::DuplicateKey => f.write_str("a key appears twice"),
            Corruption::NameMismatch { named, header } => write!(
                f,
                "file name says {named} but the header says {header}"
            ),
            Corruption::MisplacedRecord { written_at } => write!(
                f,
                "a valid record written at offset {written_at} is found elsewhere (records before it are missing, or it was moved or repeated)"
            ),
            Corruption::ForeignSegment { expected, found } => write!(
                f,
                "the segment belongs to store {found:#018x}, not to this log's store {expected:#018x}"
            ),
            Corruption::IncompleteGroup => f.write_str(
                "the records end inside an atomic group (its last records are missing: a write cut short)",
            ),
        }
    }
}

/// What [`Error::Unsupported`] advises: the other semantics.
fn semantics_hint(semantics: crate::semantics::Semantics) -> &'static str {
    match semantics {
        crate::semantics::Semantics::Strict => "create the engine with Semantics::Kafka to use it",
        _ => "it needs an engine with Semantics::Strict",
    }
}
