//! One producer as Apache Kafka's producer snapshot stores it, and why an
//! entry may have no place in the strict rules' state.
//!
//! These are the engine's terms for Kafka's state (the Kafka-mode engine
//! builds its side table from them and gives them back), so they live
//! here, below the engine; [`crate::kafka`] reads and writes them as
//! Kafka's file bytes and re-exports both.

use std::fmt;

/// One producer as Kafka's snapshot stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaProducerEntry {
    /// The producer id (`-1` is Kafka's "no producer").
    pub producer_id: i64,
    /// The producer epoch.
    pub epoch: i16,
    /// Last sequence of the producer's last batch (`-1`: none).
    pub last_sequence: i32,
    /// Log offset of that batch's last record (`-1`: no batch).
    pub last_offset: i64,
    /// `last_offset` minus the batch's first offset.
    pub offset_delta: i32,
    /// Timestamp of the producer's last batch or transaction marker (ms).
    pub timestamp: i64,
    /// Epoch of the transaction coordinator of the last marker (`-1`: none).
    pub coordinator_epoch: i32,
    /// First offset of the producer's open transaction (`-1`: none).
    pub current_txn_first_offset: i64,
}

/// Why a Kafka entry has no equivalent in this crate's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unrepresentable {
    /// A negative producer id (Kafka's `NO_PRODUCER_ID` is -1).
    NegativeProducerId,
    /// No batch and no sequence: a producer Kafka knows only from
    /// transaction markers. The strict rules have no state without a
    /// sequence (a key without state accepts only sequence 0, as Kafka
    /// would here); [`seed_kafka_store`](crate::kafka::seed_kafka_store)
    /// keeps such producers.
    NoSequence,
}

impl fmt::Display for Unrepresentable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unrepresentable::NegativeProducerId => "negative producer id",
            Unrepresentable::NoSequence => {
                "no batch and no sequence (known only from transaction markers)"
            }
        })
    }
}
