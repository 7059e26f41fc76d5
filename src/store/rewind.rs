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
use super::commit::LogQueue;
use crate::engine::info::ProducerInfo;
use crate::engine::map::hash_key;
use crate::engine::shards::{SHARDS, Shards};
use crate::error::{Error, Result};
use crate::id::ProducerId;
use crate::recovery::reach::Placed;
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
        self.rewind(None, offset)
    }

    /// [`ProducerStateStore::truncate_to`] for one partition: rolls
    /// `partition`'s state back to what it would be had only its appends
    /// with an offset below `offset` been made, and leaves every other
    /// partition as it is. For a store that holds the state of many
    /// partition logs, each with offsets of its own (a broker's), when one
    /// of those logs is cut back: an unclean shutdown, a follower's
    /// divergence from its leader. The same rule as the store-wide form,
    /// restricted to the partition (docs/lifecycle.md): durable and
    /// crash-atomic when it returns (one logged group, of that partition's
    /// keys only). Afterwards [`ProducerStateStore::partition_end_offset`]
    /// is `offset`.
    ///
    /// Its base is the newest retained snapshot in which the partition's
    /// end lies below `offset`, which other partitions' appends do not
    /// move; the log after it is replayed for this partition alone.
    /// Appenders wait while it runs.
    ///
    /// ```
    /// use producer_state::{Batch, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// store.append_batch(1u64, 0, 0, Batch::new(0, 4, 100, 1))?; // partition 0: 100..=104
    /// store.append_batch(1u64, 0, 0, Batch::new(5, 9, 105, 2))?; // 105..=109
    /// store.append_batch(1u64, 1, 0, Batch::new(0, 9, 500, 3))?; // partition 1: a batch at 500
    /// // Partition 0's log is cut back to offset 105; partition 1 is untouched.
    /// store.truncate_partition_to(0, 105)?;
    /// assert_eq!(store.partition_end_offset(0), 105);
    /// assert_eq!(store.get(1u64, 0).map(|e| e.last_sequence()), Some(4));
    /// assert_eq!(store.get(1u64, 1).map(|e| e.last_sequence()), Some(9));
    /// assert_eq!(store.partition_end_offset(1), 501);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::truncate_to`], with the partition's end in
    /// place of the store's: [`Error::TruncateAboveEnd`] if `offset` is
    /// above [`ProducerStateStore::partition_end_offset`];
    /// [`Error::TruncateBelowHistory`] if no retained snapshot (nor a log
    /// kept from position 0) has the partition's end below it.
    pub fn truncate_partition_to(&self, partition: i32, offset: i64) -> Result<()> {
        self.rewind(Some(partition), offset)
    }

    /// One past the highest offset appended to `partition` (a batch's
    /// offset, as given to [`Batch::new`](crate::Batch::new); a marker's; a
    /// single-sequence append's position), lowered to
    /// `offset` by `truncate_partition_to(partition, offset)` or by a
    /// store-wide [`ProducerStateStore::truncate_to`] below it; raised by an
    /// import; 0 for a partition never appended to or removed. Like Kafka's
    /// log end offset of that partition, as far as the state has seen it: a
    /// broker whose partition log runs ahead of it replays the log from
    /// here. Expiration does not lower it. Under `Always`, the state of
    /// durable appends.
    ///
    /// After opening a store whose newest snapshot was written before
    /// snapshot format version 5 (which did not record it), the end of a
    /// partition is at first derived from the offsets its keys hold: a lower
    /// bound, which a later append raises (docs/lifecycle.md).
    pub fn partition_end_offset(&self, partition: i32) -> i64 {
        self.shared
            .lock_state()
            .keys
            .meta
            .ends
            .get(partition)
            .saturating_add(1)
    }

    fn rewind(&self, only: Option<i32>, offset: i64) -> Result<()> {
        let due = std::sync::atomic::AtomicBool::new(false);
        let result = self.truncate(only, offset, &due);
        // A snapshot asked for while the book was held is taken now (it
        // needs the book).
        if due.load(std::sync::atomic::Ordering::Relaxed) {
            self.shared.snapshot_due();
        }
        result
    }

    fn truncate(
        &self,
        only: Option<i32>,
        offset: i64,
        due: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
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
        let high = match only {
            Some(p) => st.keys.meta.ends.get(p),
            None => st.keys.meta.high,
        };
        let end = high.saturating_add(1);
        if offset > end {
            return Err(Error::TruncateAboveEnd { offset, end });
        }
        if offset == end {
            // Nothing at or above it: the state is already that.
            return Ok(());
        }
        let fs = shared.opts.fs.as_ref();
        // Nothing is in flight: every record lies in the bytes written.
        let (segments, written) = shared.log.writer().written();
        let from_zero = segments.first() == Some(&0);
        let base = match truncate::pick_base(fs, &shared.dir, &book.valid, from_zero, offset, only)?
        {
            Ok(b) => b,
            Err(lowest) => {
                // With no base at all, only the end itself can be reached.
                let lowest = lowest.min(end);
                return Err(Error::TruncateBelowHistory { offset, lowest });
            }
        };
        let (replay_to, units) = reads(&st.log, (only, shared.opts.skim), offset, base.position);
        let history = truncate::History {
            fs,
            dir: &shared.dir,
            base: &base,
            segments: &segments,
            last_len: written,
            end: replay_to,
            units: units.as_deref(),
            skimmed: Default::default(),
        };
        let telemetry = shared.log.telemetry();
        let failed = |e: &Error| telemetry.skim_failed(only.unwrap_or(-1), e);
        if shared.kafka {
            let cut = rebuilt(&history, failed, |h| {
                truncate::truncated_kafka(h, offset, only)
            })?;
            st.life_stats.skimmed_truncations += u64::from(history.skimmed.get());
            let pos = st.log_kafka_truncation(offset, &cut, only)?;
            drop(book);
            return finish(shared, st, pos, only);
        }
        let cut = rebuilt(&history, failed, |h| {
            truncate::truncated_state(h, offset, only)
        })?;
        st.life_stats.skimmed_truncations += u64::from(history.skimmed.get());

        let (removed, set) = difference(&st.keys.shards, &cut, only);
        st.life_stats.truncations += 1;
        st.life_stats.truncated_keys += (removed.len() + set.len()) as u64;
        let kind = match only {
            Some(partition) => GroupKind::TruncatePartition { partition },
            None => GroupKind::Truncate,
        };
        let pos = st.log_group(
            (kind, offset, None),
            (RemoveReason::Truncated, removed),
            set,
        );
        drop(book);
        finish(shared, st, pos, only)
    }
}

/// Commits a truncation's group (last position `pos`), queued under the
/// lock `st` with the snapshot book let go: what follows is ordinary group
/// commit, which may start a snapshot (it takes the book).
fn finish(
    shared: &super::Shared,
    st: std::sync::MutexGuard<'_, super::state::State>,
    pos: u64,
    only: Option<i32>,
) -> Result<()> {
    shared.finish_op(st, pos)?;
    if !shared.is_always() {
        shared.sync()?;
    }
    snapshot_after(shared, only);
    Ok(())
}

/// What `rebuild` makes of `h`; when reading a partition's records where
/// they were placed fails (`failed` is told why), what it makes of the
/// log read from the base instead, which finds real damage again.
fn rebuilt<T>(
    h: &truncate::History<'_>,
    failed: impl FnOnce(&Error),
    rebuild: impl Fn(&truncate::History<'_>) -> Result<T>,
) -> Result<T> {
    match rebuild(h) {
        Err(e) if h.units.is_some() => {
            failed(&e);
            rebuild(&h.reading_the_log())
        }
        r => r,
    }
}

/// Where a replay from `base` for a truncation to `offset` stops (at
/// most the log's end), and for a partition's (`only`; with `skim`, where
/// its records are read from) where its records lie, if known. A
/// partition's replay stops after the last record that can change its
/// result: its own appends below `offset`, and records of other kinds
/// (recovery::reach).
fn reads<T>(
    log: &LogQueue<T>,
    (only, skim): (Option<i32>, bool),
    offset: i64,
    base: u64,
) -> (u64, Option<Vec<Placed>>) {
    let end = log.next_position();
    match only {
        Some(p) => {
            let stop = log.reach().stop(p, offset, base).min(end);
            (
                stop,
                skim.then(|| log.units(p, (base, stop, offset))).flatten(),
            )
        }
        None => (end, None),
    }
}

/// Keys to remove (hash, id, partition) and keys to set (hash, state).
type Difference = (Vec<(u64, ProducerId, i32)>, Vec<(u64, ProducerInfo)>);

/// Asks for the snapshot that follows a store-wide truncation: the next
/// truncation's base, and recovery need not replay the group. A
/// partition's truncation asks for none. A snapshot copies every
/// partition's state, so its cost is the store's, and a run of partition
/// truncations (a broker whose crash cut many partition logs) would each
/// wait for the one before; and retention would drop the older snapshots
/// that the other partitions' truncations need as bases. Recovery
/// replays the partition's group; the next automatic snapshot covers it.
fn snapshot_after(shared: &super::Shared, only: Option<i32>) {
    if only.is_none() {
        shared.snapshot_due();
    }
}

/// What turns the `live` keys into `cut`'s, for the keys of partition
/// `only` (of every partition without): the keys to remove and the keys
/// to set, shard by shard.
fn difference(live: &Shards, cut: &Shards, only: Option<i32>) -> Difference {
    let mut removed = Vec::new();
    let mut set = Vec::new();
    let mine = |p: i32| only.is_none_or(|o| o == p);
    for i in 0..SHARDS {
        let live = live.shard(i);
        for (id, p, entry, act) in live.iter_full().filter(|k| mine(k.1)) {
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
        for info in cut.infos(i).filter(|i| mine(i.partition)) {
            let h = hash_key(&info.producer_id, info.partition);
            if !live.contains_hashed(h, &info.producer_id, info.partition) {
                set.push((h, info));
            }
        }
    }
    (removed, set)
}
