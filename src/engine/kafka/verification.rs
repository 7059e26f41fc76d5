//! KIP-890's verification state: what a Kafka broker remembers about a
//! producer between verifying a transactional write with the transaction
//! coordinator and appending it (Kafka's `VerificationStateEntry`, trunk
//! 1eb7644349cb).
//!
//! Why it is its own state, beside the producer entries: it lives and dies
//! by other rules than they do, and it changes verdicts.
//!
//! - Created when a transactional write of a producer without an open
//!   transaction on the partition is verified (`UnifiedLog.
//!   maybeStartTransactionVerification`, called by `ReplicaManager` for the
//!   first batch's base sequence of a produce request, and by the group
//!   coordinators with `NO_SEQUENCE`, -1). A second verification keeps the
//!   creation time, and the lowest sequence of the newest epoch
//!   (`maybeUpdateLowestSequenceAndEpoch`).
//! - While it exists, a client data batch of the producer (transactional or
//!   not) whose first sequence is above the lowest sequence is refused as
//!   out of order (`ProducerAppendInfo.checkSequence`), so a retried lower
//!   sequence cannot be overtaken by a higher one.
//! - Cleared by any transactional batch or marker of the producer that
//!   passes validation (`UnifiedLog.updateProducers`), whatever its origin.
//!   A verified batch that is a duplicate of a cached batch, or that is
//!   refused, clears nothing: the entry outlives it, and the rule meets the
//!   producer's later batches.
//! - Expired by `removeExpiredProducers` once `producer.id.expiration.ms`
//!   has passed since its creation, independently of the producer's entry.
//! - Kept in memory only: Kafka's producer snapshot has no place for it, so
//!   a broker restart forgets it. A truncation (`truncateAndReload`,
//!   `truncateFullyAndStartAt`) leaves it alone; deleting the partition
//!   drops it with the partition's whole state.
//!
//! The durable store follows: it never logs nor snapshots this state
//! (docs/format.md), and a reopen starts without it, as a restarted broker
//! does.

use std::collections::HashMap;

use crate::id::ProducerId;

/// One producer's verification state on one partition: Kafka's
/// `VerificationStateEntry` (without its guard, which only pairs a
/// coordinator's answer with the request that asked: see
/// [`AppendOptions::verified`](crate::AppendOptions::verified)).
///
/// ```
/// use producer_state::{AppendOptions, Batch, BatchOutcome, Marker, Origin};
/// use producer_state::{ProducerStateManager, Semantics};
///
/// let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
/// let txn = AppendOptions::client().transactional().verified();
/// assert!(mgr.append_with(7u64, 0, 0, Batch::new(0, 1, 10, 1_000), txn)?.is_accepted());
/// mgr.append_marker(7u64, 0, 0, Marker::commit(0, 12, 1_001), Origin::Coordinator)?;
/// // A verified retry of the committed batch is a duplicate: it appends
/// // nothing, so the verification it started stays.
/// let retry = mgr.append_with(7u64, 0, 0, Batch::new(0, 1, 13, 1_002), txn)?;
/// assert!(matches!(retry, BatchOutcome::Duplicate { .. }));
/// let v = mgr.verification_state(7u64, 0).unwrap();
/// assert_eq!((v.lowest_sequence, v.epoch, v.timestamp), (0, 0, 1_002));
/// // The producer's next batch starts above it: out of order.
/// let next = mgr.append_with(7u64, 0, 0, Batch::new(2, 2, 13, 1_003), AppendOptions::client())?;
/// assert!(!next.is_accepted());
/// # Ok::<(), producer_state::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct VerificationState {
    /// When the verification started (ms): the entry expires
    /// `producer.id.expiration.ms` after it. Later verifications keep it.
    pub timestamp: i64,
    /// The lowest sequence verified at [`VerificationState::epoch`]: a
    /// client batch starting above it is refused while the state exists.
    pub lowest_sequence: i32,
    /// The newest producer epoch verified.
    pub epoch: i16,
}

impl VerificationState {
    /// A state as a verification makes it (tests and callers that restore
    /// one, see
    /// [`ProducerStateManager::restore_verification_states`](crate::ProducerStateManager::restore_verification_states)).
    pub const fn new(timestamp: i64, lowest_sequence: i32, epoch: i16) -> Self {
        VerificationState {
            timestamp,
            lowest_sequence,
            epoch,
        }
    }

    /// Kafka's `maybeUpdateLowestSequenceAndEpoch`: a lower sequence of the
    /// same epoch lowers the bound; a higher epoch replaces both (its
    /// sequences start over). A lower epoch changes nothing.
    fn verify_again(&mut self, sequence: i32, epoch: i16) {
        if epoch == self.epoch && sequence < self.lowest_sequence {
            self.lowest_sequence = sequence;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            self.lowest_sequence = sequence;
        }
    }
}

/// Every key's verification state (Kafka keeps one map per partition; here
/// one map keyed by producer and partition). Empty for a broker without
/// transactions, which then pays one `is_empty` per append.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verifications(HashMap<(ProducerId, i32), VerificationState>);

impl Verifications {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Kafka's `maybeCreateVerificationStateEntry`: creates the key's state
    /// at `now_ms` or verifies it again.
    pub(crate) fn start(
        &mut self,
        id: &ProducerId,
        partition: i32,
        sequence: i32,
        epoch: i16,
        now_ms: i64,
    ) {
        self.0
            .entry((id.clone(), partition))
            .and_modify(|v| v.verify_again(sequence, epoch))
            .or_insert(VerificationState::new(now_ms, sequence, epoch));
    }

    pub(crate) fn get(&self, id: &ProducerId, partition: i32) -> Option<VerificationState> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get(&(id.clone(), partition)).copied()
    }

    /// Kafka's `clearVerificationStateEntry`.
    pub(crate) fn clear(&mut self, id: &ProducerId, partition: i32) {
        if !self.0.is_empty() {
            self.0.remove(&(id.clone(), partition));
        }
    }

    /// The verification half of Kafka's `removeExpiredProducers`: drops
    /// every state created `expiration_ms` or more before `now_ms`;
    /// returns how many.
    pub(crate) fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.0.len();
        self.0
            .retain(|_, v| now_ms.saturating_sub(v.timestamp) < expiration_ms);
        before - self.0.len()
    }

    /// Drops the partition's states (the partition was deleted or moved).
    pub(crate) fn remove_partition(&mut self, partition: i32) {
        self.0.retain(|(_, p), _| *p != partition);
    }

    /// Drops every state (a restart).
    pub(crate) fn clear_all(&mut self) {
        self.0.clear();
    }

    /// Sets the key's state, replacing any.
    pub(crate) fn set(&mut self, id: ProducerId, partition: i32, state: VerificationState) {
        self.0.insert((id, partition), state);
    }

    /// Every state, sorted by key.
    pub(crate) fn sorted(&self) -> Vec<(ProducerId, i32, VerificationState)> {
        let mut all: Vec<_> = self
            .0
            .iter()
            .map(|((id, p), v)| (id.clone(), *p, *v))
            .collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_verification_keeps_the_lowest_sequence_of_the_newest_epoch() {
        // VerificationStateEntry.maybeUpdateLowestSequenceAndEpoch (trunk
        // 1eb7644349cb, lines 76-83).
        let mut v = VerificationState::new(5, 7, 1);
        v.verify_again(9, 1);
        assert_eq!((v.lowest_sequence, v.epoch), (7, 1), "higher: kept");
        v.verify_again(3, 1);
        assert_eq!((v.lowest_sequence, v.epoch), (3, 1), "lower: lowered");
        v.verify_again(0, 0);
        assert_eq!((v.lowest_sequence, v.epoch), (3, 1), "older epoch: ignored");
        v.verify_again(12, 2);
        assert_eq!((v.lowest_sequence, v.epoch), (12, 2), "newer epoch: reset");
        assert_eq!(v.timestamp, 5, "the creation time stays");
    }

    #[test]
    fn states_expire_from_their_creation_and_go_with_their_partition() {
        let (a, b) = (ProducerId::from(1u64), ProducerId::from(2u64));
        let mut all = Verifications::default();
        all.start(&a, 0, 4, 0, 100);
        all.start(&a, 0, 2, 0, 900); // verified again later: still born at 100
        all.start(&b, 1, 0, 0, 500);
        assert_eq!(all.get(&a, 0), Some(VerificationState::new(100, 2, 0)));
        assert_eq!(all.expire(1_099, 1_000), 0);
        assert_eq!(all.expire(1_100, 1_000), 1);
        assert_eq!(all.get(&a, 0), None);
        all.start(&a, 1, 0, 0, 600);
        all.remove_partition(1);
        assert!(all.is_empty());
        all.start(&a, 0, 0, 0, 0);
        all.clear(&a, 0);
        assert_eq!(all.get(&a, 0), None);
    }
}
