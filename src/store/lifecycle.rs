//! The producer lifecycle on the store: expiration sweeps, the listing of
//! a partition's producers, partition removal, and what the filter of
//! removed keys says.
//!
//! Every operation here that changes state goes through the same path as
//! an append (see [`super::keys`]): decided under the store's lock, its
//! records queued in log order, applied once durable under `Always` (the
//! keys' speculative states meanwhile in the overlay, so an append racing
//! it is classified against what the log will say), at once under the
//! buffered policies; a snapshot being encoded gets the keys' pre-images.

use std::time::Duration;

use super::txn::{KafkaAnswer, KafkaOp};
use super::{ProducerStateStore, Shared};
use crate::engine::info::ProducerInfo;
use crate::engine::map::hash_key;
use crate::engine::shards::SHARDS;
use crate::error::Result;
use crate::id::ProducerId;
use crate::wal::op::{GroupKind, RemoveReason};

impl Shared {
    /// After a lifecycle operation queued its records (the last at `pos`):
    /// under `Always` commits them and waits until they are durable, under
    /// the buffered policies hands them on as an append does.
    pub(super) fn finish_op(
        &self,
        st: std::sync::MutexGuard<'_, super::State>,
        pos: u64,
    ) -> Result<()> {
        if self.is_always() {
            let group = st.log.group();
            self.commit(st);
            self.await_durable(group, pos)
        } else {
            self.after_buffered(st);
            Ok(())
        }
    }

    /// One expiration sweep with the clock's reading now: shard by shard,
    /// each under the lock alone, the keys whose last activity is at least
    /// `expiration` old and that have no records in flight are removed
    /// (one logged removal per shard, more for a shard of over 64 KiB of
    /// keys), and between two shards the appenders that queued for the
    /// lock take it first (under `Always`, once the shard before is
    /// durable). Returns how many; under `Always` once they are
    /// durable.
    pub(super) fn expire(&self, expiration: Duration) -> Result<usize> {
        let now = self.opts.clock.now_ms();
        let exp = i64::try_from(expiration.as_millis()).unwrap_or(i64::MAX);
        if self.kafka {
            // One engine under one lock: one pass, one logged removal
            // (docs/lifecycle.md, "Kafka mode").
            let op = KafkaOp::Expire {
                now_ms: now,
                expiration_ms: exp,
            };
            return Ok(match self.kafka_run(op)? {
                KafkaAnswer::Removed(n) => n,
                _ => 0,
            });
        }
        // now - activity >= expiration, without overflow.
        let cutoff = now.saturating_sub(exp);
        let mut total = 0;
        let mut last = None;
        for s in 0..SHARDS {
            if s > 0 {
                self.log.let_waiters_in();
            }
            if let Some((group, pos)) = last.take() {
                // Under `Always`, one shard's removals in the log at a
                // time: a group commit never carries many shards of them,
                // so an append that joins one waits about one fsync.
                self.await_durable(group, pos)?;
            }
            let mut st = self.lock_to_write(true)?;
            let keys = &st.keys;
            let gone: Vec<(u64, ProducerId, i32)> = keys
                .shards
                .shard(s)
                .keys()
                .filter(|(_, _, a)| a.ms() <= cutoff)
                .map(|(id, p, _)| (hash_key(&id, p), id, p))
                .filter(|(h, id, p)| !keys.in_flight(*h, id, *p))
                .collect();
            if gone.is_empty() {
                continue;
            }
            total += gone.len();
            st.life_stats.expired += gone.len() as u64;
            let pos = st.log_removal(RemoveReason::Expired, gone);
            if self.is_always() {
                last = Some((st.log.group(), pos));
                self.commit(st);
            } else {
                self.after_buffered(st);
            }
        }
        if let Some((group, pos)) = last {
            self.await_durable(group, pos)?;
        }
        Ok(total)
    }
}

impl ProducerStateStore {
    /// Runs an expiration sweep now (see
    /// [`StoreOptions::producer_expiration`](crate::StoreOptions::producer_expiration))
    /// and returns how many keys expired; 0 without an expiration. Under
    /// `FsyncPolicy::Always` the removals are durable when it returns. The
    /// sweep holds the store's lock for one shard (a 256th of the state) at
    /// a time, so appenders pause for that long at most; a key with an
    /// append in flight is not expired.
    ///
    /// # Errors
    ///
    /// [`Error::Io`](crate::Error::Io) if writing the removals failed (the
    /// store is then poisoned), [`Error::Poisoned`](crate::Error::Poisoned)
    /// after an earlier failure.
    pub fn expire_now(&self) -> Result<usize> {
        match self.shared.opts.expiration {
            Some(exp) => self.shared.expire(exp),
            None => Ok(0),
        }
    }

    /// The producers of one partition, like Kafka's DescribeProducers
    /// (KIP-664): each key's producer id, epoch, last sequence, last
    /// activity and retained batches, sorted by producer id. Reads only
    /// the shards that hold keys of the partition, one at a time under the
    /// lock (consistent within a shard). Under `Always` the state of
    /// durable appends, as [`ProducerStateStore::get`].
    pub fn producers(&self, partition: i32) -> Vec<ProducerInfo> {
        if self.shared.kafka {
            return self
                .kafka_producers(partition)
                .into_iter()
                .filter_map(|(id, _)| self.describe(id, partition))
                .collect();
        }
        let mut out = Vec::new();
        for s in 0..SHARDS {
            let st = self.shared.lock_state();
            if st.keys.shards.partition_count(s, partition) == 0 {
                continue;
            }
            out.extend(st.keys.shards.infos(s).filter(|i| i.partition == partition));
        }
        out.sort_by(|a, b| a.producer_id.cmp(&b.producer_id));
        out
    }

    /// One key's state with its last activity, if it has state (see
    /// [`ProducerStateStore::get`]).
    pub fn describe(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<ProducerInfo> {
        let producer_id = producer_id.into();
        let st = self.shared.lock_state();
        if let Some(k) = st.keys.meta.kafka.as_deref() {
            let entry = k.get(producer_id.clone(), partition)?;
            let last_activity = k
                .kafka_state(producer_id.clone(), partition)?
                .last_timestamp;
            return Some(ProducerInfo {
                producer_id,
                partition,
                entry,
                last_activity,
            });
        }
        let (entry, last_activity) =
            st.keys
                .committed(hash_key(&producer_id, partition), &producer_id, partition)?;
        Some(ProducerInfo {
            producer_id,
            partition,
            entry,
            last_activity,
        })
    }

    /// Whether the key's state was probably removed by an expiration or an
    /// eviction: what tells a producer whose state the store forgot from
    /// one it never saw, for a key that has no state (docs/lifecycle.md
    /// says what a broker should answer in each case). Never false for a
    /// key among the last 524,288 to 1,048,576 removals; true for a key
    /// never removed with a probability under about 0.5%. Partition
    /// removals and truncations are not counted: the key was not forgotten
    /// by this store's choice.
    pub fn was_removed(&self, producer_id: impl Into<ProducerId>, partition: i32) -> bool {
        let id = producer_id.into();
        let hash = hash_key(&id, partition);
        let st = self.shared.lock_state();
        st.keys.removed_in_flight(hash, &id, partition) || st.keys.meta.filter.contains(hash)
    }

    /// Removes every key of `partition` (the partition moved away, or was
    /// deleted) and returns how many. Logged as one atomic group: a crash
    /// leaves all of them or none. Under `FsyncPolicy::Always` durable when
    /// it returns. Keys with appends in flight are removed after those
    /// appends. Holds the store's lock while it collects the keys, reading
    /// only the shards that hold keys of the partition.
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::expire_now`].
    pub fn remove_partition(&self, partition: i32) -> Result<usize> {
        let shared = &*self.shared;
        if shared.kafka {
            return Ok(
                match shared.kafka_run(KafkaOp::RemovePartition { partition })? {
                    KafkaAnswer::Removed(n) => n,
                    _ => 0,
                },
            );
        }
        let mut st = shared.lock_to_write(false)?;
        let keys = st.keys.spec_keys_of_partition(partition);
        // A partition with an end but no key left (its keys expired) is
        // removed too: its end goes with it.
        if keys.is_empty() && st.keys.meta.ends.get(partition) < 0 {
            return Ok(0);
        }
        let n = keys.len();
        st.life_stats.partition_removed += n as u64;
        let pos = st.log_group(
            (GroupKind::RemovePartition, i64::from(partition), None),
            (RemoveReason::PartitionRemoved, keys),
            Vec::new(),
        );
        shared.finish_op(st, pos)?;
        Ok(n)
    }
}
