//! Transactions: end-transaction markers, what completing one gives, and
//! the per-partition index of open and aborted transactions.
//!
//! Kafka's exactly-once is idempotence plus transactions. A transactional
//! producer's first transactional batch on a partition opens a transaction
//! there (its first offset is remembered); the transaction coordinator ends
//! it with a COMMIT or ABORT marker written into the partition. Consumers
//! reading committed data stop at the *last stable offset*, the first
//! offset of the oldest transaction still open, and skip the records of
//! *aborted* transactions, which the partition lists as (producer, first
//! offset, last offset).
//!
//! Which producer has which transaction open is per-key state (kept by the
//! Kafka-mode engine, see `state.rs`); this module holds what is per
//! partition: the open transactions ordered by first offset (the oldest
//! bounds the last stable offset) and the aborted ones. Only partitions
//! that ever saw a transaction have an entry, so partitions of plain
//! producers cost nothing here.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use crate::id::ProducerId;
use crate::outcome::KafkaError;

/// Commit or abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// The transaction's records become visible to committed readers.
    Commit,
    /// The transaction's records are skipped by committed readers.
    Abort,
}

/// An end-transaction marker (Kafka's control batch with an
/// `EndTransactionMarker` record), as the transaction coordinator writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Marker {
    /// Commit or abort.
    pub kind: MarkerKind,
    /// The epoch of the transaction coordinator that wrote it: a marker from
    /// a coordinator older than the last one seen is a zombie's.
    pub coordinator_epoch: i32,
    /// The log offset of the marker.
    pub offset: i64,
    /// The marker's timestamp (milliseconds): it becomes the producer's
    /// last timestamp, which keeps it from expiring.
    pub timestamp: i64,
}

impl Marker {
    /// A COMMIT marker.
    pub const fn commit(coordinator_epoch: i32, offset: i64, timestamp: i64) -> Self {
        Marker {
            kind: MarkerKind::Commit,
            coordinator_epoch,
            offset,
            timestamp,
        }
    }

    /// An ABORT marker.
    pub const fn abort(coordinator_epoch: i32, offset: i64, timestamp: i64) -> Self {
        Marker {
            kind: MarkerKind::Abort,
            coordinator_epoch,
            offset,
            timestamp,
        }
    }
}

/// A transaction a marker ended (Kafka's `CompletedTxn`, with the last
/// stable offset Kafka computes for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompletedTxn {
    /// The offset of the transaction's first batch on this partition.
    pub first_offset: i64,
    /// The offset of the marker that ended it.
    pub last_offset: i64,
    /// True for an abort.
    pub aborted: bool,
    /// The partition's last stable offset once this transaction is
    /// complete: the first offset of the oldest transaction still open on
    /// the partition, or `last_offset + 1` when none is.
    pub last_stable_offset: i64,
}

/// An aborted transaction, as a consumer reading committed data needs it:
/// the records of `producer_id` from `first_offset` to `last_offset` are
/// skipped (Kafka's `AbortedTxn` of the transaction index).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AbortedTxn {
    /// The producer whose transaction it was.
    pub producer_id: ProducerId,
    /// The transaction's first offset.
    pub first_offset: i64,
    /// The offset of the ABORT marker.
    pub last_offset: i64,
    /// The last stable offset when it completed.
    pub last_stable_offset: i64,
}

/// Kafka's `ProducerStateManager.LATE_TRANSACTION_BUFFER_MS`: how long
/// past the longest transaction timeout a transaction may stay open before
/// it counts as late (5 minutes). A coordinator aborts a transaction when
/// its timeout passes; one still open this long after is one no
/// coordinator is going to end, a *hanging* transaction, and it holds the
/// partition's last stable offset back until an operator aborts it.
pub const LATE_TRANSACTION_BUFFER_MS: i64 = 5 * 60 * 1000;

/// A partition's oldest open transaction, late by Kafka's rule
/// (`ProducerStateManager.hasLateTransaction`): its producer's last
/// timestamp lies more than the longest transaction timeout plus
/// [`LATE_TRANSACTION_BUFFER_MS`] before now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LateTransaction {
    /// The partition whose last stable offset it holds back.
    pub partition: i32,
    /// The producer whose transaction it is.
    pub producer_id: ProducerId,
    /// The transaction's first offset (the partition's first unstable
    /// offset).
    pub first_offset: i64,
    /// The producer's last timestamp (its newest batch or marker), from
    /// which Kafka measures the lateness.
    pub last_timestamp: i64,
}

/// What an end-transaction marker comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MarkerOutcome {
    /// Written: the producer's transaction, if one was open, is complete
    /// (`None` for a marker that ends no transaction, which Kafka accepts
    /// too and skips for the last stable offset).
    Accepted {
        /// The transaction it ended.
        completed: Option<CompletedTxn>,
    },
    /// The marker's producer epoch is older than the one on file.
    FencedEpoch {
        /// The epoch on file.
        current_epoch: i16,
    },
    /// The marker comes from a coordinator older than the one that wrote
    /// the producer's last marker (Kafka's
    /// `TransactionCoordinatorFencedException`).
    CoordinatorFenced {
        /// The coordinator epoch on file.
        current_coordinator_epoch: i32,
    },
}

impl MarkerOutcome {
    /// True for [`MarkerOutcome::Accepted`].
    pub const fn is_accepted(&self) -> bool {
        matches!(self, MarkerOutcome::Accepted { .. })
    }

    /// The Kafka error a broker answers this outcome with (`None`: accepted).
    pub const fn kafka_error(&self) -> Option<KafkaError> {
        match self {
            MarkerOutcome::Accepted { .. } => None,
            MarkerOutcome::FencedEpoch { .. } => Some(KafkaError::InvalidProducerEpoch),
            MarkerOutcome::CoordinatorFenced { .. } => {
                Some(KafkaError::TransactionCoordinatorFenced)
            }
        }
    }
}

impl fmt::Display for MarkerOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MarkerOutcome::Accepted { completed: None } => {
                f.write_str("ACCEPTED (no open transaction)")
            }
            MarkerOutcome::Accepted { completed: Some(c) } => write!(
                f,
                "ACCEPTED ({} of the transaction {}..={}, last stable offset {})",
                if c.aborted { "abort" } else { "commit" },
                c.first_offset,
                c.last_offset,
                c.last_stable_offset
            ),
            MarkerOutcome::FencedEpoch { current_epoch } => {
                write!(f, "FENCED_EPOCH (current epoch {current_epoch})")
            }
            MarkerOutcome::CoordinatorFenced {
                current_coordinator_epoch,
            } => write!(
                f,
                "COORDINATOR_FENCED (current coordinator epoch {current_coordinator_epoch})"
            ),
        }
    }
}

/// One partition's transactions.
#[derive(Clone, Debug, Default)]
struct PartitionTxns {
    /// Open transactions by (first offset, producer): a producer has at
    /// most one transaction open on a partition, so the pair is unique,
    /// and two producers given the same first offset (offsets come from
    /// the caller) both stay listed. Closing one is a single lookup.
    open: BTreeSet<(i64, ProducerId)>,
    /// Aborted transactions in the order their markers came.
    aborted: Vec<AbortedTxn>,
}

/// The index's hasher: its keys are partition numbers, which one
/// multiply spreads well. std's SipHash, built for keys an attacker
/// chooses, cost a marker two to three hashes of ~100 instructions each.
#[derive(Clone, Copy, Debug, Default)]
struct PartitionHash(u64);

impl Hasher for PartitionHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_i32(&mut self, v: i32) {
        self.0 = (self.0 ^ u64::from(v as u32)).wrapping_mul(MIX);
    }
}

/// An odd constant (2^64 / golden ratio): multiplying by it is a
/// bijection that moves low bits into the high ones the table's tags use.
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// Open and aborted transactions of every partition that has had one.
#[derive(Clone, Debug, Default)]
pub(crate) struct TxnIndex {
    partitions: HashMap<i32, PartitionTxns, BuildHasherDefault<PartitionHash>>,
}

impl TxnIndex {
    /// Records that `producer_id` opened a transaction at `first_offset`.
    pub(crate) fn open(&mut self, partition: i32, producer_id: &ProducerId, first_offset: i64) {
        self.partitions
            .entry(partition)
            .or_default()
            .open
            .insert((first_offset, producer_id.clone()));
    }

    /// Drops `producer_id`'s open transaction at `first_offset`, if listed.
    fn close(&mut self, partition: i32, producer_id: &ProducerId, first_offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.open.remove(&(first_offset, producer_id.clone()));
        }
    }

    /// Completes `producer_id`'s transaction opened at `first_offset` with a
    /// marker at `marker_offset`, and lists it if aborted.
    pub(crate) fn complete(
        &mut self,
        partition: i32,
        producer_id: &ProducerId,
        first_offset: i64,
        marker_offset: i64,
        aborted: bool,
    ) -> CompletedTxn {
        self.close(partition, producer_id, first_offset);
        // Kafka: the first offset of the oldest open transaction of another
        // producer, else the marker's offset + 1.
        let last_stable_offset = self
            .first_unstable_offset(partition)
            .unwrap_or(marker_offset.saturating_add(1));
        if aborted {
            self.partitions
                .entry(partition)
                .or_default()
                .aborted
                .push(AbortedTxn {
                    producer_id: producer_id.clone(),
                    first_offset,
                    last_offset: marker_offset,
                    last_stable_offset,
                });
        }
        CompletedTxn {
            first_offset,
            last_offset: marker_offset,
            aborted,
            last_stable_offset,
        }
    }

    /// Forgets an open transaction without completing it (its producer
    /// expired or was replaced by a reload).
    pub(crate) fn forget_open(
        &mut self,
        partition: i32,
        producer_id: &ProducerId,
        first_offset: i64,
    ) {
        self.close(partition, producer_id, first_offset);
    }

    /// The first offset of the oldest open transaction of the partition.
    pub(crate) fn first_unstable_offset(&self, partition: i32) -> Option<i64> {
        self.partitions
            .get(&partition)
            .and_then(|p| p.open.first().map(|k| k.0))
    }

    /// The aborted transactions of the partition, in marker order.
    pub(crate) fn aborted(&self, partition: i32) -> &[AbortedTxn] {
        self.partitions
            .get(&partition)
            .map_or(&[], |p| p.aborted.as_slice())
    }

    /// Drops the aborted transactions whose marker is below `offset`.
    pub(crate) fn forget_aborted_before(&mut self, partition: i32, offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.aborted.retain(|t| t.last_offset >= offset);
        }
    }

    /// Every partition with aborted transactions, and its list.
    pub(crate) fn aborted_lists(&self) -> impl Iterator<Item = (i32, &[AbortedTxn])> + '_ {
        self.partitions
            .iter()
            .filter(|(_, t)| !t.aborted.is_empty())
            .map(|(p, t)| (*p, t.aborted.as_slice()))
    }

    /// Every partition with an open transaction, and its oldest one: the
    /// producer and the first offset.
    pub(crate) fn oldest_open(&self) -> impl Iterator<Item = (i32, &ProducerId, i64)> + '_ {
        self.partitions
            .iter()
            .filter_map(|(p, t)| t.open.first().map(|(f, id)| (*p, id, *f)))
    }

    /// Sets a partition's aborted list (read from a snapshot).
    pub(crate) fn set_aborted(&mut self, partition: i32, list: Vec<AbortedTxn>) {
        self.partitions.entry(partition).or_default().aborted = list;
    }

    /// Forgets every partition's transactions but `partition`'s.
    pub(crate) fn retain_partition(&mut self, partition: i32) {
        self.partitions.retain(|&p, _| p == partition);
    }

    /// Forgets the partition's open and aborted transactions (the
    /// partition was removed).
    pub(crate) fn remove_partition(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    /// How many transactions are open, over all partitions.
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        self.partitions.values().map(|p| p.open.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_stable_offset_is_the_oldest_open_transaction_of_another_producer() {
        // Kafka's testLastStableOffsetCompletedTxn: three producers open
        // transactions at S, S + 25, S + 57.
        let s = 992_342;
        let (p1, p2, p3) = (
            ProducerId::from(1u64),
            ProducerId::from(2u64),
            ProducerId::from(3u64),
        );
        let mut t = TxnIndex::default();
        t.open(0, &p1, s);
        t.open(0, &p2, s + 25);
        t.open(0, &p3, s + 57);
        assert_eq!(t.first_unstable_offset(0), Some(s));
        assert_eq!(
            t.complete(0, &p1, s, s + 60, false).last_stable_offset,
            s + 25
        );
        assert_eq!(
            t.complete(0, &p3, s + 57, s + 61, true).last_stable_offset,
            s + 25
        );
        let last = t.complete(0, &p2, s + 25, s + 62, false);
        assert_eq!(last.last_stable_offset, s + 63);
        assert_eq!(t.first_unstable_offset(0), None);
        assert_eq!(t.aborted(0).len(), 1);
        assert_eq!(t.aborted(0)[0].first_offset, s + 57);
        assert_eq!(t.aborted(1), &[]);
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn equal_first_offsets_of_two_producers_are_both_kept() {
        let (a, b) = (ProducerId::from(1u64), ProducerId::from(2u64));
        let mut t = TxnIndex::default();
        t.open(3, &a, 10);
        t.open(3, &b, 10);
        t.complete(3, &a, 10, 11, true);
        assert_eq!(t.first_unstable_offset(3), Some(10));
        t.forget_open(3, &b, 10);
        assert_eq!(t.first_unstable_offset(3), None);
        t.forget_aborted_before(3, 11);
        assert_eq!(t.aborted(3).len(), 1);
        t.forget_aborted_before(3, 12);
        assert!(t.aborted(3).is_empty());
    }
}
