//! One key's state as the store describes it: the entry the rules use and
//! the key's last activity, which expiration and eviction order by.

use crate::batch::RetainedBatch;
use crate::engine::entry::{Batches, ProducerEntry};
use crate::id::ProducerId;

/// A (producer id, partition) key and its state, as the store's listing
/// ([`ProducerStateStore::producers`](crate::ProducerStateStore::producers),
/// like Kafka's DescribeProducers), a partition export and the inspect
/// tool show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerInfo {
    /// The producer.
    pub producer_id: ProducerId,
    /// The partition.
    pub partition: i32,
    /// Epoch, last sequence and retained batches.
    pub entry: ProducerEntry,
    /// The key's last activity, in milliseconds since the Unix epoch: the
    /// timestamp of its last accepted batch, or the store's clock when it
    /// accepted its last single-sequence append (docs/lifecycle.md).
    pub last_activity: i64,
}

impl ProducerInfo {
    /// The producer's epoch on file.
    pub fn epoch(&self) -> i16 {
        self.entry.epoch()
    }

    /// The last accepted sequence.
    pub fn last_sequence(&self) -> i32 {
        self.entry.last_sequence()
    }

    /// The key's last activity (Kafka's `lastTimestamp`).
    pub fn last_timestamp(&self) -> i64 {
        self.last_activity
    }

    /// The retained batches, oldest first.
    pub fn retained_batches(&self) -> Batches<'_> {
        self.entry.retained_batches()
    }

    /// The newest retained batch, if the key retains any.
    pub fn newest_batch(&self) -> Option<RetainedBatch> {
        self.entry.retained_batches().last()
    }
}
