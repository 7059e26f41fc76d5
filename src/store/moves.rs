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

use super::ProducerStateStore;
use crate::error::{Error, Result};
use crate::export::PartitionExport;
use crate::map::hash_key;
use crate::shards::SHARDS;
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
    /// # Errors
    ///
    /// [`Error::Io`] if making the log durable failed,
    /// [`Error::Poisoned`] after an earlier failure.
    pub fn export_partition(&self, partition: i32) -> Result<PartitionExport> {
        self.refuse_in_kafka_mode("export_partition")?;
        self.shared.sync()?;
        let st = self.shared.lock_state();
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
    /// # Errors
    ///
    /// Nothing is imported on an error. [`Error::ImportConflict`] if this
    /// store already has state for one of the keys (remove the partition
    /// first if the import is meant to replace it);
    /// [`Error::TooManyProducers`] if the keys do not fit under
    /// `max_producers` (with [`AtCapacity::Refuse`](crate::AtCapacity::Refuse),
    /// or more keys than the cap); [`Error::Io`], [`Error::Poisoned`] as
    /// for appends.
    pub fn import_partition(&self, export: &PartitionExport) -> Result<usize> {
        self.refuse_in_kafka_mode("import_partition")?;
        let shared = &*self.shared;
        let mut st = shared.lock_to_write(false)?;
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
            GroupKind::Import,
            export.high_offset(),
            (RemoveReason::Truncated, Vec::new()),
            sets,
        );
        shared.finish_op(st, pos)?;
        Ok(n)
    }
}
