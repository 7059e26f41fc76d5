//! `truncate_to(offset)`: the state rolled back to the history with every
//! append at or above an offset removed (Kafka's `truncateAndReload`).
//!
//! Computed, then logged as its difference: the truncated state is rebuilt
//! from a retained snapshot whose appends all lie below the offset and the
//! log replayed without what is cut ([`crate::recovery::truncate`]); the keys whose
//! state differs from the live state are then set or removed by one atomic
//! group, whose group record carries the offset (recovery replays the
//! group as it is; a later truncation reaching below it passes over it).
//! So a crash leaves the state before or after, never between, and
//! recovery never recomputes anything.
//!
//! The store is held still while it runs: the snapshot book (no snapshot
//! or retention meanwhile), then everything made durable, then the state
//! lock for the computation, so appenders wait for it (a truncation is
//! what a follower does when leadership changes, while it takes no
//! produce requests).

use super::ProducerStateStore;
use crate::engine::info::ProducerInfo;
use crate::engine::map::hash_key;
use crate::engine::shards::SHARDS;
use crate::error::{Error, Result};
use crate::recovery::truncate;
use crate::wal::op::{GroupKind, RemoveReason};

impl ProducerStateStore {
    /// Rolls the state back to what it would be had only the appends with
    /// a log offset below `offset` been made (a batch's offset; a
    /// single-sequence append, which carries none, counts at its log
    /// position): keys whose every append is at or above it lose their
    /// state, others go back to their older batches and epoch. Expirations,
    /// evictions and partition removals stay as they were; an import is
    /// undone whole if its highest offset is at or above `offset`; an
    /// append that no longer applies once an earlier one is removed is
    /// removed too. Durable and crash-atomic when it returns (one logged
    /// group; a snapshot follows). docs/lifecycle.md has the whole rule.
    ///
    /// Appenders wait while it runs: it reads the base snapshot and the
    /// log after it, about what recovery reads.
    ///
    /// ```
    /// use producer_state::{Batch, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// store.append_batch(1u64, 0, 0, Batch::new(0, 4, 100, 1))?; // offsets 100..=104
    /// store.append_batch(1u64, 0, 0, Batch::new(5, 9, 105, 2))?; // 105..=109
    /// // The partition's log is cut back to offset 105 (a leader change):
    /// // the second batch never happened, and may come again.
    /// store.truncate_to(105)?;
    /// assert_eq!(store.get(1u64, 0).map(|e| e.last_sequence()), Some(4));
    /// assert!(store.append_batch(1u64, 0, 0, Batch::new(5, 9, 105, 3))?.is_accepted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Nothing is changed on an error.
    /// [`Error::TruncateAboveEnd`] if `offset` is above one past the
    /// highest offset appended; [`Error::TruncateBelowHistory`] if no
    /// retained snapshot (nor a log kept from position 0) reaches it (keep
    /// more snapshots: [`StoreOptions::keep_snapshots`](crate::StoreOptions::keep_snapshots));
    /// [`Error::Io`], [`Error::Corrupt`] if reading or writing fails,
    /// [`Error::Poisoned`] after an earlier failure.
    pub fn truncate_to(&self, offset: i64) -> Result<()> {
        let due = std::sync::atomic::AtomicBool::new(false);
        let result = self.truncate(offset, &due);
        // A snapshot asked for while the book was held is taken now (it
        // needs the book).
        if due.load(std::sync::atomic::Ordering::Relaxed) {
            self.shared.snapshot_due();
        }
        result
    }

    fn truncate(&self, offset: i64, due: &std::sync::atomic::AtomicBool) -> Result<()> {
        let shared = &*self.shared;
        let book = shared.snapshots.hold();
        // Nothing in flight: every record durable, nobody writing.
        let mut st = loop {
            shared
                .log
                .sync(|| due.store(true, std::sync::atomic::Ordering::Relaxed))?;
            let st = shared.lock_state();
            if let Some(f) = st.log.failed() {
                return Err(f.error_for(None));
            }
            if st.log.last_queued().is_none() {
                break st;
            }
        };
        let end = st.keys.meta.high.saturating_add(1);
        if offset > end {
            return Err(Error::TruncateAboveEnd { offset, end });
        }
        if offset == end {
            // Nothing at or above it: the state is already that.
            return Ok(());
        }
        let fs = shared.opts.fs.as_ref();
        let segments = shared.log.writer().segments();
        let from_zero = segments.first() == Some(&0);
        let base = match truncate::pick_base(fs, &shared.dir, &book.valid, from_zero, offset)? {
            Ok(b) => b,
            Err(lowest) => {
                // With no base at all, only the end itself can be reached.
                let lowest = lowest.min(end);
                return Err(Error::TruncateBelowHistory { offset, lowest });
            }
        };
        let next = st.log.next_position();
        if shared.kafka {
            let cut = truncate::truncated_kafka(fs, &shared.dir, &base, &segments, next, offset)?;
            let pos = st.log_kafka_truncation(offset, &cut)?;
            drop(book);
            shared.finish_op(st, pos)?;
            if !shared.is_always() {
                shared.sync()?;
            }
            shared.snapshot_due();
            return Ok(());
        }
        let cut = truncate::truncated_state(fs, &shared.dir, &base, &segments, next, offset)?;

        // The difference, shard by shard.
        let mut removed = Vec::new();
        let mut set = Vec::new();
        for i in 0..SHARDS {
            let live = st.keys.shards.shard(i);
            for (id, p, entry, act) in live.iter_full() {
                let h = hash_key(&id, p);
                match cut.get_full(h, &id, p) {
                    None => removed.push((h, id, p)),
                    Some((e, a)) if e != entry || a != act.ms() => set.push((
                        h,
                        ProducerInfo {
                            producer_id: id,
                            partition: p,
                            entry: e,
                            last_activity: a,
                        },
                    )),
                    Some(_) => {}
                }
            }
            for info in cut.infos(i) {
                let h = hash_key(&info.producer_id, info.partition);
                if !live.contains_hashed(h, &info.producer_id, info.partition) {
                    set.push((h, info));
                }
            }
        }
        st.life_stats.truncations += 1;
        st.life_stats.truncated_keys += (removed.len() + set.len()) as u64;
        let pos = st.log_group(
            GroupKind::Truncate,
            offset,
            (RemoveReason::Truncated, removed),
            set,
        );
        // Queued under the lock: what follows is ordinary group commit,
        // which may start a snapshot (it takes the book).
        drop(book);
        shared.finish_op(st, pos)?;
        if !shared.is_always() {
            shared.sync()?;
        }
        // A snapshot after it: the next truncation's base, and recovery
        // need not replay the group.
        shared.snapshot_due();
        Ok(())
    }
}
