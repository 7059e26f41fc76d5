//! `--producer` and `--partition`: which keys and records are shown, and
//! the other options that say what a view shows.

use producer_state::ProducerId;

/// Filters by producer and partition.
pub(crate) struct Filter {
    pub(crate) producer: Option<ProducerId>,
    /// The `--producer` argument as a Kafka id (an `i64`, may be negative).
    pub(crate) kafka_producer: Option<Option<i64>>,
    pub(crate) partition: Option<i32>,
}

impl Filter {
    pub(crate) fn keeps_partition(&self, partition: Option<i32>) -> bool {
        self.partition
            .is_none_or(|q| partition.is_none_or(|p| p == q))
    }

    pub(crate) fn keeps(&self, id: &ProducerId, partition: Option<i32>) -> bool {
        self.producer.as_ref().is_none_or(|p| p == id) && self.keeps_partition(partition)
    }

    pub(crate) fn keeps_kafka(&self, id: i64, partition: Option<i32>) -> bool {
        self.kafka_producer.is_none_or(|p| p == Some(id)) && self.keeps_partition(partition)
    }
}

/// What to show: the keys and records the filter keeps, whether to list
/// them at all (`--verify` lists nothing), and how many at most
/// (`--limit`).
pub(crate) struct Show<'a> {
    pub(crate) filter: &'a Filter,
    pub(crate) list: bool,
    pub(crate) limit: Option<usize>,
    /// The time at which a transaction is late or not (`--now`, else the
    /// clock), in milliseconds since the epoch.
    pub(crate) now_ms: i64,
    /// `--transaction-max-timeout-ms` (Kafka's `transaction.max.timeout.ms`).
    pub(crate) max_transaction_timeout_ms: i64,
}
