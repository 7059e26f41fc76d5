//! What a produce request carries.
//!
//! A Kafka produce request is a batch of records: a first and last sequence
//! (first + record count - 1), written at some log offset with a timestamp.
//! The engine keeps the offset and timestamp of recent batches so that a
//! retry can be answered with what the original append returned.

use crate::id::ProducerId;

/// One record batch of a produce request, as the engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Batch {
    /// Sequence number of the batch's first record.
    pub first_sequence: i32,
    /// Sequence number of the batch's last record (first + record count - 1).
    pub last_sequence: i32,
    /// Log offset the batch was (or will be) written at.
    pub offset: i64,
    /// The batch's timestamp (milliseconds since the Unix epoch, by Kafka's convention).
    pub timestamp: i64,
}

impl Batch {
    /// A batch of sequences `first_sequence..=last_sequence` at `offset`.
    pub const fn new(first_sequence: i32, last_sequence: i32, offset: i64, timestamp: i64) -> Self {
        Batch {
            first_sequence,
            last_sequence,
            offset,
            timestamp,
        }
    }

    /// The metadata the engine retains for this batch.
    pub const fn metadata(&self) -> BatchMetadata {
        BatchMetadata {
            offset: self.offset,
            timestamp: self.timestamp,
        }
    }
}

/// What a broker returns for a duplicate: the original batch's log offset
/// and timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchMetadata {
    /// Log offset of the original batch.
    pub offset: i64,
    /// Timestamp of the original batch.
    pub timestamp: i64,
}

/// One of the batches an entry retains to recognise retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RetainedBatch {
    /// First sequence of the batch.
    pub first_sequence: i32,
    /// Last sequence of the batch.
    pub last_sequence: i32,
    /// Offset and timestamp, or `None` for a single-sequence append, which
    /// carries none.
    pub metadata: Option<BatchMetadata>,
}

/// One append, as a value: used by the bulk append of the durable store and
/// by anything that queues appends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// Who is producing.
    pub producer_id: ProducerId,
    /// To which partition.
    pub partition: i32,
    /// The producer's epoch (session).
    pub epoch: i16,
    pub(crate) first: i32,
    pub(crate) last: i32,
    // Invariant: `None` only for single-sequence appends (first == last).
    pub(crate) metadata: Option<BatchMetadata>,
}

impl AppendRequest {
    /// A single-sequence append, exactly like `append(producer_id, partition, epoch, sequence)`.
    pub fn single(
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> Self {
        AppendRequest {
            producer_id: producer_id.into(),
            partition,
            epoch,
            first: sequence,
            last: sequence,
            metadata: None,
        }
    }

    /// A batch-level append.
    pub fn batch(
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
    ) -> Self {
        AppendRequest {
            producer_id: producer_id.into(),
            partition,
            epoch,
            first: batch.first_sequence,
            last: batch.last_sequence,
            metadata: Some(batch.metadata()),
        }
    }

    /// First sequence of the request.
    pub fn first_sequence(&self) -> i32 {
        self.first
    }

    /// Last sequence of the request (equal to the first for a single append).
    pub fn last_sequence(&self) -> i32 {
        self.last
    }

    /// The batch's offset and timestamp; `None` for a single-sequence append.
    pub fn metadata(&self) -> Option<BatchMetadata> {
        self.metadata
    }
}
