//! What happens to keys as a whole, rather than to one append: expiration
//! by the caller's clock, a partition removed or moved to another engine
//! (export and import), one key forgotten.
//!
//! Each operation means the same under both semantics; under
//! [`Semantics::Kafka`] it also carries or drops the side table's
//! producers and the partition's transactions.

use super::ProducerStateManager;
use crate::engine::info::ProducerInfo;
use crate::engine::kafka::state::expire_compact;
use crate::engine::map::hash_key;
use crate::error::{Error, Result};
use crate::export::{KafkaPart, PartitionExport};
use crate::id::ProducerId;
#[cfg(doc)]
use crate::semantics::Semantics;
use crate::snapshot;

impl ProducerStateManager {
    /// Forgets every producer whose last activity is `expiration_ms` or
    /// more before `now_ms` (Kafka's `removeExpiredProducers`, its
    /// `producer.id.expiration.ms` one day by default), and returns how
    /// many keys were forgotten. An expired key has no state: its next
    /// append is classified as a new producer's (rule 1 under
    /// [`Semantics::Seed`]; under [`Semantics::Kafka`] accepted at any
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
    /// refusal (as before seed-mode expiration existed) is not a breaking
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

    /// The producer state of `partition` (each key with its whole retry
    /// window), for a partition that moves to another engine or store
    /// ([`ProducerStateManager::import_partition`],
    /// [`ProducerStateStore::import_partition`](crate::ProducerStateStore::import_partition),
    /// [`PartitionExport::to_bytes`](crate::PartitionExport::to_bytes) for
    /// the wire). The engine keeps no clock: each key's last activity is
    /// its newest batch's timestamp, 0 for a key without one (as in
    /// [`ProducerStateManager::encode_snapshot`]).
    ///
    /// # Errors
    ///
    /// Under [`Semantics::Kafka`] the export also holds the producers the
    /// side table keeps (coordinator epochs, open transactions) and the
    /// partition's aborted transactions (a version-2 export).
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for an engine that cannot
    /// export.
    pub fn export_partition(&self, partition: i32) -> Result<PartitionExport> {
        let entries = self
            .map
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .map(|(producer_id, partition, entry)| ProducerInfo {
                last_activity: snapshot::legacy_activity(&entry),
                producer_id,
                partition,
                entry,
            })
            .collect();
        Ok(match self.kafka.as_deref() {
            None => PartitionExport::new(partition, entries),
            Some(k) => {
                let (side, aborted) = k.partition_side(partition);
                PartitionExport::new_kafka(partition, entries, KafkaPart { side, aborted })
            }
        })
    }

    /// Refuses an import the engine cannot take: an export of the other
    /// semantics; under the seed rules a key the engine holds; under
    /// [`Semantics::Kafka`] any state of the partition (a key, or aborted
    /// transactions: the partition's aborted list and last stable offset
    /// come from one log, and two cannot be merged).
    pub(crate) fn check_import(&self, export: &PartitionExport) -> Result<()> {
        let partition = export.partition();
        if export.semantics() != self.semantics() {
            return Err(Error::ImportSemanticsMismatch {
                partition,
                exported: export.semantics(),
                store: self.semantics(),
            });
        }
        if self.kafka.is_some() {
            if let Some(id) = self.kafka_keys_of(partition).into_iter().min() {
                return Err(Error::ImportConflict {
                    producer_id: id,
                    partition,
                });
            }
            if !self.aborted_transactions(partition).is_empty() {
                return Err(Error::ImportPartitionNotEmpty { partition });
            }
            return Ok(());
        }
        if let Some(i) = export
            .iter()
            .find(|i| self.get(i.producer_id.clone(), i.partition).is_some())
        {
            return Err(Error::ImportConflict {
                producer_id: i.producer_id.clone(),
                partition: i.partition,
            });
        }
        Ok(())
    }

    /// Adds the keys of `export` (a partition moved here) and returns how
    /// many: a producer retrying against its new home gets `DUPLICATE`
    /// with the original offset, as it would have from the old one. Last
    /// activities are not kept (the engine has none; see
    /// [`ProducerStateManager::expire_producers`]).
    ///
    /// ```
    /// use producer_state::{Batch, BatchOutcome, ProducerStateManager};
    ///
    /// let (mut old, mut new) = (ProducerStateManager::new(), ProducerStateManager::new());
    /// let batch = Batch::new(0, 9, 1000, 1_700_000_000_000);
    /// old.append_batch(42u64, 3, 0, batch);
    /// assert_eq!(new.import_partition(&old.export_partition(3)?)?, 1);
    /// assert_eq!(
    ///     new.append_batch(42u64, 3, 0, batch),
    ///     BatchOutcome::Duplicate { original: Some(batch.metadata()) }
    /// );
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Nothing is imported on an error.
    /// [`Error::ImportSemanticsMismatch`] for an export taken under the
    /// other semantics; [`Error::ImportConflict`] if a key of the export
    /// already has state here (under [`Semantics::Kafka`]: if any key of
    /// the partition has; remove the partition first if the import is meant
    /// to replace it); [`Error::ImportPartitionNotEmpty`] under
    /// [`Semantics::Kafka`] if aborted transactions of the partition are
    /// listed here.
    pub fn import_partition(&mut self, export: &PartitionExport) -> Result<usize> {
        self.check_import(export)?;
        if let (Some(k), Some(part)) = (self.kafka.as_deref_mut(), export.kafka_part()) {
            let p = export.partition();
            for (id, e) in &part.side {
                // The partition has no key here (checked above).
                k.insert_side(id.clone(), p, e.clone());
            }
            if !part.aborted.is_empty() {
                k.txns_mut().set_aborted(p, part.aborted.clone());
            }
        }
        for i in export.iter() {
            let h = hash_key(&i.producer_id, i.partition);
            // Each key once (the export's reader refuses repeats), and
            // none here (checked above): every insert is new.
            self.map
                .insert_new_hashed(h, &i.producer_id, i.partition, &i.entry, ());
        }
        Ok(export.len())
    }
}
