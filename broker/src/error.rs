//! The broker's errors: what failed, on which file, and why.

use std::io;
use std::path::PathBuf;

use crate::batch::BatchError;

/// Something the broker could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A partition log holds a damaged batch that is not a torn tail (more
    /// data follows it), so cutting it would destroy acknowledged data.
    #[error(
        "partition log {} is damaged at byte {pos}: {reason}; the broker does not cut \
         a log before data that follows the damage: move the file away or repair it",
        path.display()
    )]
    CorruptLog {
        /// The log file.
        path: PathBuf,
        /// Byte position of the damaged batch.
        pos: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The topic catalog is damaged.
    #[error("topic catalog {} is damaged: {reason}; move it away to rebuild it from the partition directories", path.display())]
    CorruptCatalog {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Creating a topic would pass `max.partitions`.
    #[error(
        "creating topic {topic} with {partitions} partitions would pass max.partitions ({max}): \
         {held} are held"
    )]
    TooManyPartitions {
        /// The topic.
        topic: String,
        /// Its partitions.
        partitions: i32,
        /// Partitions the broker holds.
        held: usize,
        /// The limit.
        max: usize,
    },
    /// The producer id file is damaged.
    #[error("producer id file {} is damaged: {reason}", path.display())]
    CorruptProducerIds {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The producer state store refused to open or to append.
    #[error("producer state of {partition}: {source}")]
    State {
        /// `topic-partition`.
        partition: String,
        /// The store's error.
        source: producer_state::Error,
    },
    /// A batch in the log was not accepted when the producer state was
    /// rebuilt from it: the log itself breaks the sequence rules.
    #[error(
        "rebuilding the producer state of {partition} from its log: the batch at offset \
         {offset} was {outcome}, but every batch in a log was accepted once"
    )]
    Rebuild {
        /// `topic-partition`.
        partition: String,
        /// The batch's offset.
        offset: i64,
        /// What the rebuilt store answered.
        outcome: String,
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

    pub(crate) fn corrupt(path: impl Into<PathBuf>, pos: u64, reason: BatchError) -> Error {
        Error::CorruptLog {
            path: path.into(),
            pos,
            reason: reason.to_string(),
        }
    }
}

/// The broker's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
