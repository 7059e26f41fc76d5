//! What happens to keys as a whole, rather than to one append: expiration
//! by the caller's clock, a partition removed or moved to another engine
//! (export and import), one key forgotten.
//!
//! Each operation means the same under both semantics; under
//! [`Semantics::Kafka`] it also carries or drops the side table's
//! producers and the partition's transactions.

use super::ProducerStateManager;
use crate::engine::kafka::state::expire_compact;
use crate::error::Result;
use crate::id::ProducerId;
#[cfg(doc)]
use crate::semantics::Semantics;

impl ProducerStateManager {
    /// Forgets every producer whose last activity is `expiration_ms` or
    /// more before `now_ms` (Kafka's `removeExpiredProducers`, its
    /// `producer.id.expiration.ms` one day by default), and returns how
    /// many keys were forgotten. An expired key has no state: its next
    /// append is classified as a new producer's (rule 1 under
    /// [`Semantics::Strict`]; under [`Semantics::Kafka`] accepted at any
    /// sequence).
    ///
    /// The engine keeps no clock, so a key's last activity is the
    /// timestamp of its newest retained batch (and, under
    /// [`Semantics::Kafka`], of its last marker). **A key whose newest
    /// append carried no timestamp (a single-sequence
    /// [`append`](ProducerStateManager::append)) never expires here**: the
    /// engine does not know when it was made. (The durable store stamps
    /// such appends with its clock and expires them; docs/lifecycle.md.)
    /// Under [`Semantics::Kafka`] a producer with an open transaction
    /// does not expire either, as in Kafka.
    ///
    /// The time is the caller's: the same state and the same arguments
    /// forget the same keys on any machine, so replicas that apply the
    /// same call stay equal (what `producer-state-raft` does).
    ///
    /// ```
    /// use producer_state::{Batch, ProducerStateManager};
    ///
    /// let day = 86_400_000;
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append_batch(1u64, 0, 0, Batch::new(0, 4, 100, 1_000));
    /// mgr.append_batch(2u64, 0, 0, Batch::new(0, 4, 105, 5_000));
    /// mgr.append(3u64, 0, 0, 0); // no timestamp: never expires here
    /// assert_eq!(mgr.expire_producers(1_000 + day, day)?, 1);
    /// assert!(mgr.get(1u64, 0).is_none() && mgr.get(2u64, 0).is_some());
    /// assert_eq!(mgr.expire_producers(i64::MAX, day)?, 1);
    /// assert_eq!(mgr.len(), 1);
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None today under either semantics; the `Result` stays so that a
    /// refusal (as before strict-mode expiration existed) is not a breaking
    /// change.
    pub fn expire_producers(&mut self, now_ms: i64, expiration_ms: i64) -> Result<usize> {
        match &mut self.kafka {
            Some(k) => Ok(k.expire(&mut self.map, now_ms, expiration_ms)),
            None => Ok(expire_compact(&mut self.map, now_ms, expiration_ms)),
        }
    }

    /// Forgets every key of `partition` and returns how many there were:
    /// the partition has moved away or been deleted. Under
    /// [`Semantics::Kafka`] its transactions go too: the open ones (its
    /// last stable offset is the log end again) and the aborted ones.
    ///
    /// ```
    /// use producer_state::ProducerStateManager;
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(1u64, 0, 0, 0);
    /// mgr.append(2u64, 0, 0, 0);
    /// mgr.append(1u64, 1, 0, 0);
    /// assert_eq!(mgr.remove_partition(0), 2);
    /// assert_eq!(mgr.remove_partition(0), 0);
    /// assert_eq!(mgr.len(), 1);
    /// ```
    pub fn remove_partition(&mut self, partition: i32) -> usize {
        let removed = self.reset_partition(partition);
        if let Some(k) = &mut self.kafka {
            // Deleted with the partition (Kafka's state of a partition goes
            // whole); a truncation's reset keeps them (`reset_partition`).
            k.verifications_mut().remove_partition(partition);
        }
        removed
    }

    /// Forgets every key of `partition` and its transactions, but not its
    /// KIP-890 verification states: what a truncation does before it
    /// loads the partition's state again (Kafka's `truncateAndReload`
    /// leaves them alone).
    pub(crate) fn reset_partition(&mut self, partition: i32) -> usize {
        let before = self.len();
        self.map.retain(|_, p, _| p != partition);
        if let Some(k) = &mut self.kafka {
            k.remove_partition(partition);
        }
        before - self.len()
    }

    /// Forgets one key and says whether it had state (under
    /// [`Semantics::Kafka`] an open transaction of it is no longer open):
    /// what a durable store's logged expiration does to one key, for a
    /// caller that keeps its own engine in step with such a log.
    ///
    /// ```
    /// use producer_state::ProducerStateManager;
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(1u64, 0, 0, 0);
    /// assert!(mgr.remove_producer(1u64, 0));
    /// assert!(!mgr.remove_producer(1u64, 0));
    /// assert!(mgr.is_empty());
    /// ```
    pub fn remove_producer(&mut self, producer_id: impl Into<ProducerId>, partition: i32) -> bool {
        self.remove_kafka_key(&producer_id.into(), partition)
    }
}
