//! Partition moves: a partition's producer state exported from one store
//! and imported into another (a reassignment), with every key's retry
//! window and activity, so retries keep their answers.
//!
//! An import is one atomic group (all of its keys or none after a crash)
//! whose group record carries the highest batch offset the state holds:
//! truncation treats the import as one append at that offset (docs/
//! lifecycle.md). Keys the store already holds are a conflict, refused
//! before anything is written; at `max_producers` the import evicts (its
//! evictions logged before the group) or is refused.
//!
//! Under `Semantics::Kafka` the export also carries the side table (open
//! transactions, coordinator epochs) and the aborted list, and the import
//! is the same kind of group with the members a Kafka-mode truncation
//! writes: partition-state records (kind 21, the first resetting the
//! partition, which has no state: an import into a partition with any is
//! refused) and key-state records for the compact keys, applied to the
//! live engine through replay's own function. A store refuses an export
//! of the other semantics before anything is written.

use super::ProducerStateStore;
use crate::engine::ProducerStateManager;
use crate::engine::map::hash_key;
use crate::engine::shards::SHARDS;
use crate::error::{Error, Result};
use crate::semantics::Semantics;
use crate::snapshot::export::PartitionExport;
use crate::wal::op::{GroupKind, RemoveReason};

impl ProducerStateStore {
    /// The producer state of `partition`, every key with its retry window
    /// and last activity, to import into another store
    /// ([`ProducerStateStore::import_partition`]) or send as bytes
    /// ([`PartitionExport::to_bytes`]). Read under the store's lock, once
    /// everything appended so far is durable; appends racing it may or may
    /// not be in it: stop appending to the partition first (its leadership
    /// has moved). The keys stay here: remove them with
    /// [`ProducerStateStore::remove_partition`] once the move is done.
    ///
    /// Under `Semantics::Kafka` the export holds the partition as Kafka
    /// keeps it: every producer's coordinator epoch and open transaction
    /// too, and the partition's aborted transactions (a version-2 export,
    /// docs/format.md); only a Kafka-mode store imports it.
    ///
    /// ```
    /// use producer_state::{Batch, BatchOutcome, PartitionExport, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let old = ProducerStateStore::open(dir.path().join("old"))?;
    /// let new = ProducerStateStore::open(dir.path().join("new"))?;
    /// let batch = Batch::new(0, 9, 1000, 1_700_000_000_000);
    /// old.append_batch(42u64, 3, 0, batch)?;
    /// // Partition 3 moves: its state travels as bytes to its new home...
    /// let bytes = old.export_partition(3)?.to_bytes();
    /// assert_eq!(new.import_partition(&PartitionExport::from_bytes(&bytes)?)?, 1);
    /// old.remove_partition(3)?;
    /// // ...where a producer's retry is still recognised.
    /// assert!(matches!(new.append_batch(42u64, 3, 0, batch)?, BatchOutcome::Duplicate { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if making the log durable failed,
    /// [`Error::Poisoned`] after an earlier failure.
    pub fn export_partition(&self, partition: i32) -> Result<PartitionExport> {
        self.shared.sync()?;
        let st = self.shared.lock_state();
        if let Some(engine) = st.keys.meta.kafka.as_deref() {
            return engine.export_partition(partition);
        }
        let mut entries = Vec::new();
        for s in 0..SHARDS {
            if st.keys.shards.partition_count(s, partition) > 0 {
                entries.extend(st.keys.shards.infos(s).filter(|i| i.partition == partition));
            }
        }
        Ok(PartitionExport::new(partition, entries))
    }

    /// Adds the keys of an exported partition, as they were in the store
    /// they come from, and returns how many. Logged as one atomic group:
    /// a crash leaves all of them or none. Under `FsyncPolicy::Always`
    /// durable when it returns.
    ///
    /// Under `Semantics::Kafka` the producers' open transactions are open
    /// here (a marker completes them), their coordinator epochs fence as
    /// they did, and the aborted list and last stable offset are the
    /// export's.
    ///
    /// ```
    /// use producer_state::{Error, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let a = ProducerStateStore::open(dir.path().join("a"))?;
    /// let b = ProducerStateStore::open(dir.path().join("b"))?;
    /// a.append(1u64, 5, 0, 0)?;
    /// b.append(1u64, 5, 0, 0)?;
    /// // A key the importing store already has is a conflict: nothing is imported.
    /// let export = a.export_partition(5)?;
    /// assert!(matches!(b.import_partition(&export), Err(Error::ImportConflict { .. })));
    /// b.remove_partition(5)?;
    /// assert_eq!(b.import_partition(&export)?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Nothing is imported on an error.
    /// [`Error::ImportSemanticsMismatch`] for an export of a store of the
    /// other semantics; [`Error::ImportConflict`] if this store already
    /// has state for one of the keys (under `Semantics::Kafka`: for any key
    /// of the partition), [`Error::ImportPartitionNotEmpty`] under
    /// `Semantics::Kafka` if it lists aborted transactions of the
    /// partition (remove the partition first if the import is meant to
    /// replace it);
    /// [`Error::TooManyProducers`] if the keys do not fit under
    /// `max_producers` (with [`AtCapacity::Refuse`](crate::AtCapacity::Refuse),
    /// or more keys than the cap); [`Error::Io`], [`Error::Poisoned`] as
    /// for appends.
    pub fn import_partition(&self, export: &PartitionExport) -> Result<usize> {
        let shared = &*self.shared;
        let store = self.semantics();
        if export.semantics() != store {
            return Err(Error::ImportSemanticsMismatch {
                partition: export.partition(),
                exported: export.semantics(),
                store,
            });
        }
        let mut st = shared.lock_to_write(false)?;
        if shared.kafka {
            return self.import_kafka(st, export);
        }
        if export.is_empty() {
            return Ok(0);
        }
        let mut sets = Vec::with_capacity(export.len());
        for info in export.iter() {
            let h = hash_key(&info.producer_id, info.partition);
            if st
                .keys
                .spec(h, &info.producer_id, info.partition)
                .0
                .is_some()
            {
                return Err(Error::ImportConflict {
                    producer_id: info.producer_id.clone(),
                    partition: info.partition,
                });
            }
            sets.push((h, info.clone()));
        }
        let n = sets.len();
        if let Some(cap) = st.life.cap {
            let over = (st.spec_len + n).saturating_sub(cap);
            if over > 0 {
                if st.life.refuse || n > cap {
                    return Err(Error::TooManyProducers { max: cap });
                }
                let mut order = st.keys.order.take().unwrap_or_default();
                let keys = &st.keys;
                let victims =
                    order.victims(&keys.shards, over, |h, id, p| keys.in_flight(h, id, p));
                st.keys.order = Some(order);
                st.life_stats.evicted += victims.len() as u64;
                if !victims.is_empty() {
                    st.log_removal(RemoveReason::Evicted, victims);
                }
            }
        }
        st.life_stats.imported += n as u64;
        let pos = st.log_group(
            (
                GroupKind::Import,
                export.high_offset(),
                Some(export.partition()),
            ),
            (RemoveReason::Truncated, Vec::new()),
            sets,
        );
        shared.finish_op(st, pos)?;
        Ok(n)
    }

    /// [`ProducerStateStore::import_partition`] under `Semantics::Kafka`
    /// (see the module docs).
    fn import_kafka(
        &self,
        mut st: std::sync::MutexGuard<'_, super::State>,
        export: &PartitionExport,
    ) -> Result<usize> {
        let engine = st.keys.meta.kafka.as_deref().ok_or(Error::Internal(
            "a Kafka-mode store has no Kafka-mode state",
        ))?;
        engine.check_import(export)?;
        if export.is_empty() {
            return Ok(0);
        }
        // The records that set an empty partition to the export's state:
        // what a truncation writes for a partition, made by an engine that
        // holds only the export.
        let partition = export.partition();
        let mut moved = ProducerStateManager::with_semantics(Semantics::Kafka);
        let n = moved.import_partition(export)?;
        let ops = crate::wal::txn_op::kafka_partition_ops(&moved, partition)?;
        let high = export.high_offset();
        let pos = st.log_kafka_group(GroupKind::Import, high, &ops, Some(partition))?;
        st.life_stats.imported += n as u64;
        self.shared.finish_op(st, pos)?;
        Ok(n)
    }
}
