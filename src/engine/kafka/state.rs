//! The Kafka-mode engine: Kafka's verdicts over the compact map, with a
//! side table for the keys the map cannot hold.
//!
//! Most producers are plain idempotent producers: their state is an epoch,
//! a last sequence and a window of consecutive batches, exactly what a
//! 24-byte slot of the compact map (`engine/map.rs`) and its out-of-line window
//! hold. Those keys stay there under [`Semantics::Kafka`] too, and cost
//! what they cost under the strict rules. A key moves to the side table, as a
//! literal copy of Kafka's `ProducerStateEntry`, the first time it needs
//! what the slot has no room for:
//!
//! - a transaction (its first offset) or a marker (the coordinator epoch,
//!   the marker's timestamp, a state with an epoch and no batch);
//! - a window whose batches are not consecutive (a replicated gap or
//!   repeat, or any sequence under the unknown epoch -1);
//! - a negative sequence (replication does not check them).
//!
//! A key lives in exactly one of the two. Keys never move back: a
//! transactional producer stays transactional. The side table is consulted
//! only when it is not empty, so a broker without transactions pays one
//! branch for it.
//!
//! Per partition, [`TxnIndex`] keeps the open transactions (for the last
//! stable offset) and the aborted ones.
//!
//! [`Semantics::Kafka`]: crate::Semantics::Kafka

use crate::batch::{AppendOptions, BatchMetadata, Origin};
use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};
use crate::engine::kafka::rules::{self, KafkaCurrent, VerificationCheck};
use crate::engine::kafka::side::{FullEntry, KafkaProducerState, SideTable};
use crate::engine::kafka::txn::{AbortedTxn, Marker, MarkerKind, MarkerOutcome, TxnIndex};
use crate::engine::kafka::verification::Verifications;
use crate::engine::map::{Ask, Decided, StateMap, hash_key};
use crate::engine::rules::next_sequence;
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

/// Drops every compact key whose newest batch has a timestamp
/// `expiration_ms` or more before `now_ms` (a key whose newest append
/// carried none does not expire); returns how many. Kafka's rule for
/// plain producers, and the strict engine's expiration.
pub(crate) fn expire_compact(map: &mut StateMap, now_ms: i64, expiration_ms: i64) -> usize {
    let before = map.len();
    map.retain(|_, _, e| {
        e.last_batch_timestamp()
            .is_none_or(|ts| now_ms.saturating_sub(ts) < expiration_ms)
    });
    before - map.len()
}

fn regular_current(e: &ProducerEntry) -> KafkaCurrent {
    KafkaCurrent {
        epoch: e.epoch(),
        last_sequence: e.last_sequence(),
        coordinator_epoch: -1,
        txn_open: false,
    }
}

/// The Kafka-mode state beside the compact map.
#[derive(Clone, Debug, Default)]
pub(crate) struct KafkaState {
    full: SideTable,
    txns: TxnIndex,
    /// KIP-890 verification states: in memory only (never logged nor
    /// snapshotted, see `verification.rs`).
    verifying: Verifications,
    /// `transaction.partition.verification.enable=false`: no verification
    /// is started nor required (Kafka's default is on).
    verification_off: bool,
}

impl KafkaState {
    /// Classifies a data batch under Kafka's rules and applies it if accepted.
    /// Never inlined: the strict path that branches around it stays as small
    /// as it was.
    #[inline(never)]
    pub(crate) fn append(
        &mut self,
        map: &mut StateMap,
        id: &ProducerId,
        partition: i32,
        ask: Ask,
        options: AppendOptions,
    ) -> BatchOutcome {
        let origin = options.origin();
        // ReplicaManager starts the verification before the append, for a
        // transactional write of a producer without an open transaction on
        // the partition (UnifiedLog.maybeStartTransactionVerification); a
        // verified request went through it. Coordinators verify with
        // NO_SEQUENCE. The broker's clock is not an input of an append: the
        // batch's timestamp stands for it (`start_verification` takes one).
        if options.is_transactional()
            && options.is_verified()
            && origin != Origin::Replication
            && !self.verification_off
            && !self.txn_open(id, partition)
        {
            let sequence = if origin == Origin::Client {
                ask.first
            } else {
                -1
            };
            let now = ask.meta.map_or(-1, |m| m.timestamp);
            self.verifying
                .start(id, partition, sequence, ask.epoch, now);
        }
        let verification = VerificationCheck {
            required: !self.verification_off,
            lowest_sequence: self.verifying.get(id, partition).map(|v| v.lowest_sequence),
        };
        let out = self.place(map, (id, partition), (ask, options), |cur, find| {
            rules::classify_data(
                cur,
                (ask.epoch, ask.first, ask.last),
                options,
                verification,
                find,
            )
        });
        // UnifiedLog.updateProducers: a transactional batch that passed
        // validation ends the verification; a duplicate or a refusal does
        // not (Kafka never gets that far).
        if out.is_accepted() && options.is_transactional() {
            self.verifying.clear(id, partition);
        }
        out
    }

    /// Whether the key has an open transaction (only side-table keys can).
    fn txn_open(&self, id: &ProducerId, partition: i32) -> bool {
        !self.full.is_empty()
            && self
                .full
                .get(id, partition)
                .is_some_and(|e| e.txn_first_offset.is_some())
    }

    /// Kafka's `UnifiedLog.maybeStartTransactionVerification` at `now_ms`:
    /// false (and nothing changes) when the key has an open transaction
    /// or verification is off, else the key's verification state is
    /// created or verified again.
    pub(crate) fn start_verification(
        &mut self,
        id: &ProducerId,
        partition: i32,
        (epoch, sequence): (i16, i32),
        now_ms: i64,
    ) -> bool {
        if self.verification_off || self.txn_open(id, partition) {
            return false;
        }
        self.verifying.start(id, partition, sequence, epoch, now_ms);
        true
    }

    pub(crate) fn verifications(&self) -> &Verifications {
        &self.verifying
    }

    pub(crate) fn verifications_mut(&mut self) -> &mut Verifications {
        &mut self.verifying
    }

    pub(crate) fn set_verification(&mut self, enabled: bool) {
        self.verification_off = !enabled;
    }

    pub(crate) fn verification_enabled(&self) -> bool {
        !self.verification_off
    }

    /// Applies a data batch that was accepted before (a log record being
    /// replayed) without classifying it: exactly the state change
    /// [`KafkaState::append`] made when it accepted the batch, including
    /// where the key lives (compact map or side table).
    pub(crate) fn apply_batch(
        &mut self,
        map: &mut StateMap,
        id: &ProducerId,
        partition: i32,
        ask: Ask,
        transactional: bool,
    ) {
        let options = if transactional {
            AppendOptions::client().transactional().verified()
        } else {
            AppendOptions::client()
        };
        self.place(map, (id, partition), (ask, options), |_, _| {
            BatchOutcome::Accepted
        });
        if transactional {
            self.verifying.clear(id, partition);
        }
    }

    /// The one place a data batch changes state: `classify` decides (from
    /// the key's state and a lookup of its cached batches), and an accepted
    /// batch is applied where the key lives, moving it to the side table
    /// when the compact entry cannot hold the result.
    fn place(
        &mut self,
        map: &mut StateMap,
        (id, partition): (&ProducerId, i32),
        (ask, options): (Ask, AppendOptions),
        classify: impl FnOnce(
            Option<KafkaCurrent>,
            &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
        ) -> BatchOutcome,
    ) -> BatchOutcome {
        if !self.full.is_empty()
            && let Some(e) = self.full.get_mut(id, partition)
        {
            let out = classify(Some(e.current()), &|f, l| e.find(f, l));
            if out.is_accepted()
                && let Some(opened) = e.add_batch(ask, options)
            {
                self.txns.open(partition, id, opened);
            }
            return out;
        }
        let hash = hash_key(id, partition);
        let (out, decided) = map.append_decided(hash, id, partition, ask, (), |cur, find| {
            let out = classify(
                cur.map(|(c, _)| KafkaCurrent {
                    epoch: c.epoch,
                    last_sequence: c.last_sequence,
                    coordinator_epoch: -1,
                    txn_open: false,
                }),
                find,
            );
            if !out.is_accepted() {
                return (out, Decided::Rejected);
            }
            // What the compact entry holds: no transaction, sequences
            // not below 0, and a window of consecutive batches of one
            // epoch (a new epoch or an empty window starts one over).
            let fits = !options.is_transactional()
                && ask.first >= 0
                && ask.last >= 0
                && cur.is_none_or(|(c, windowed)| {
                    ask.epoch != c.epoch || !windowed || ask.first == next_sequence(c.last_sequence)
                });
            let new_session = cur.is_some_and(|(c, _)| c.epoch != ask.epoch);
            (
                out,
                if fits {
                    Decided::Apply { new_session }
                } else {
                    Decided::Elsewhere
                },
            )
        });
        if decided != Decided::Elsewhere {
            return out;
        }
        let current = map.remove(id, partition);
        let mut full = match current {
            Some(e) => FullEntry::from_regular(&e),
            None => FullEntry::EMPTY,
        };
        if let Some(opened) = full.add_batch(ask, options) {
            self.txns.open(partition, id, opened);
        }
        self.full.insert_new(id.clone(), partition, full);
        out
    }

    /// Classifies an end-transaction marker and applies it if accepted;
    /// with no `origin`, applies it without classifying (a log record being
    /// replayed: it was accepted when it was written).
    pub(crate) fn marker(
        &mut self,
        map: &mut StateMap,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        marker: &Marker,
        origin: Option<Origin>,
    ) -> MarkerOutcome {
        let side = self.full.get(id, partition).map(FullEntry::current);
        let regular = if side.is_some() {
            None
        } else {
            map.get(id, partition)
        };
        let cur = side.or_else(|| regular.as_ref().map(regular_current));
        if let Some(origin) = origin
            && let Some(rejected) =
                rules::classify_marker(cur, epoch, marker.coordinator_epoch, origin)
        {
            return rejected;
        }
        let entry = self
            .full
            .get_or_insert_with(id, partition, || match &regular {
                Some(e) => {
                    map.remove(id, partition);
                    FullEntry::from_regular(e)
                }
                None => FullEntry::EMPTY,
            });
        let completed = entry.txn_first_offset.map(|first| {
            self.txns.complete(
                partition,
                id,
                first,
                marker.offset,
                marker.kind == MarkerKind::Abort,
            )
        });
        entry.apply_marker(epoch, marker);
        // A marker is a transactional (control) batch: it ends the
        // verification too (UnifiedLog.updateProducers).
        self.verifying.clear(id, partition);
        MarkerOutcome::Accepted { completed }
    }

    /// The Kafka view of one key.
    pub(crate) fn state(
        &self,
        map: &StateMap,
        id: &ProducerId,
        partition: i32,
    ) -> Option<KafkaProducerState> {
        match self.full.get(id, partition) {
            Some(e) => Some(e.view()),
            None => map
                .get(id, partition)
                .map(|e| FullEntry::from_regular(&e).view()),
        }
    }

    /// The entry of one key in the crate's terms (approximate for side-table
    /// keys, see [`FullEntry::approximate`]).
    pub(crate) fn get(
        &self,
        map: &StateMap,
        id: &ProducerId,
        partition: i32,
    ) -> Option<ProducerEntry> {
        if !self.full.is_empty()
            && let Some(e) = self.full.get(id, partition)
        {
            return Some(e.approximate());
        }
        map.get(id, partition)
    }

    /// Keys in the side table.
    pub(crate) fn len(&self) -> usize {
        self.full.len()
    }

    /// Side-table keys as crate entries.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        self.full
            .iter()
            .map(|(id, p, e)| (id.clone(), p, e.approximate()))
    }

    /// The side-table keys, in no particular order (a snapshot's Kafka
    /// section).
    pub(crate) fn side(&self) -> impl Iterator<Item = (&ProducerId, i32, &FullEntry)> + '_ {
        self.full.iter()
    }

    /// Whether a key is in the side table.
    pub(crate) fn in_side(&self, id: &ProducerId, partition: i32) -> bool {
        !self.full.is_empty() && self.full.contains(id, partition)
    }

    /// Adds a side-table key read from a snapshot (its open transaction,
    /// if any, is open again); false if the key is there already.
    pub(crate) fn insert_side(&mut self, id: ProducerId, partition: i32, e: FullEntry) -> bool {
        if self.full.contains(&id, partition) {
            return false;
        }
        if let Some(first) = e.txn_first_offset {
            self.txns.open(partition, &id, first);
        }
        self.full.insert_new(id, partition, e);
        true
    }

    pub(crate) fn txns(&self) -> &TxnIndex {
        &self.txns
    }

    pub(crate) fn txns_mut(&mut self) -> &mut TxnIndex {
        &mut self.txns
    }

    /// Kafka's `removeExpiredProducers`: drops every key without an open
    /// transaction whose last timestamp is `expiration_ms` or more before
    /// `now_ms`. A compact key whose newest batch carries no timestamp
    /// (single-sequence appends carry none) does not expire.
    pub(crate) fn expire(&mut self, map: &mut StateMap, now_ms: i64, expiration_ms: i64) -> usize {
        let expired = |ts: i64| now_ms.saturating_sub(ts) >= expiration_ms;
        let before = self.full.len();
        let compact = expire_compact(map, now_ms, expiration_ms);
        self.full
            .retain(|_, _, e| e.txn_first_offset.is_some() || !expired(e.last_timestamp));
        self.verifying.expire(now_ms, expiration_ms);
        compact + before - self.full.len()
    }

    /// The keys [`KafkaState::expire`] would drop now, without dropping
    /// them: the store logs them first, then removes each with
    /// [`KafkaState::remove_key`] (replay removes the logged keys, never
    /// decides again).
    pub(crate) fn expired_keys(
        &self,
        map: &StateMap,
        now_ms: i64,
        expiration_ms: i64,
    ) -> Vec<(ProducerId, i32)> {
        let expired = |ts: i64| now_ms.saturating_sub(ts) >= expiration_ms;
        let mut out: Vec<(ProducerId, i32)> = map
            .iter()
            .filter(|(_, _, e)| e.last_batch_timestamp().is_some_and(expired))
            .map(|(id, p, _)| (id, p))
            .collect();
        out.extend(
            self.full
                .iter()
                .filter(|(_, _, e)| e.txn_first_offset.is_none() && expired(e.last_timestamp))
                .map(|(id, p, _)| (id.clone(), p)),
        );
        out
    }

    /// Forgets one key, in the map or the side table (an open transaction
    /// of it is forgotten too: it is no longer open); false without state.
    pub(crate) fn remove_key(
        &mut self,
        map: &mut StateMap,
        id: &ProducerId,
        partition: i32,
    ) -> bool {
        if map.remove(id, partition).is_some() {
            return true;
        }
        if self.full.is_empty() {
            return false;
        }
        match self.full.remove(id, partition) {
            Some(e) => {
                if let Some(first) = e.txn_first_offset {
                    self.txns.forget_open(partition, id, first);
                }
                true
            }
            None => false,
        }
    }

    /// True if every side-table key and aborted list is of `partition`.
    pub(crate) fn only_partition(&self, partition: i32) -> bool {
        self.full.iter().all(|(_, p, _)| p == partition)
            && self.txns.aborted_lists().all(|(p, _)| p == partition)
    }

    /// Adds another state's side-table keys (a key already here is kept)
    /// and appends its aborted lists to this one's.
    pub(crate) fn absorb(&mut self, other: KafkaState) {
        for k in other.full.0 {
            self.insert_side(k.id, k.partition, k.entry);
        }
        for (p, list) in other.txns.aborted_lists() {
            let mut all = self.txns.aborted(p).to_vec();
            all.extend_from_slice(list);
            self.txns.set_aborted(p, all);
        }
    }

    /// The side-table keys of `partition`, sorted by id, and its aborted
    /// list.
    pub(crate) fn partition_side(
        &self,
        partition: i32,
    ) -> (Vec<(ProducerId, FullEntry)>, Vec<AbortedTxn>) {
        let mut side: Vec<(ProducerId, FullEntry)> = self
            .full
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .map(|(id, _, e)| (id.clone(), e.clone()))
            .collect();
        side.sort_by(|a, b| a.0.cmp(&b.0));
        (side, self.txns.aborted(partition).to_vec())
    }

    /// Every partition with a side-table key or an aborted list.
    pub(crate) fn partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.full
            .iter()
            .map(|(_, p, _)| p)
            .chain(self.txns.aborted_lists().map(|(p, _)| p))
    }

    /// The keys of `partition`, map and side table, in no particular order.
    pub(crate) fn keys_of(&self, map: &StateMap, partition: i32) -> Vec<ProducerId> {
        let mut out = map.ids_of(partition);
        out.extend(
            self.full
                .iter()
                .filter(|(_, p, _)| *p == partition)
                .map(|(id, _, _)| id.clone()),
        );
        out
    }

    /// Forgets every partition but `partition`: its side-table keys and its
    /// transaction index stay (a partition's truncation base).
    pub(crate) fn retain_partition(&mut self, partition: i32) {
        self.full.retain(|_, p, _| p == partition);
        self.txns.retain_partition(partition);
    }

    /// Forgets every side-table key of `partition` and the partition's
    /// transaction index (open and aborted transactions); the caller
    /// removes its compact keys. Verification states stay: a truncation
    /// resets a partition this way, and Kafka's keeps them
    /// ([`Verifications::remove_partition`] drops them with a deleted
    /// partition).
    pub(crate) fn remove_partition(&mut self, partition: i32) {
        self.full.retain(|_, p, _| p != partition);
        self.txns.remove_partition(partition);
    }

    /// The partition's producers as Kafka's snapshot holds them. Named
    /// producer ids and ids above `i64::MAX` have no place in Kafka's format
    /// and are left out.
    pub(crate) fn snapshot_entries(
        &self,
        map: &StateMap,
        partition: i32,
    ) -> Vec<KafkaProducerEntry> {
        let regular = map
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .filter_map(|(id, _, e)| {
                let pid = i64::try_from(id.as_numeric()?).ok()?;
                Some(FullEntry::from_regular(&e).to_kafka(pid))
            });
        let full = self
            .full
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .filter_map(|(id, _, e)| Some(e.to_kafka(i64::try_from(id.as_numeric()?).ok()?)));
        regular.chain(full).collect()
    }

    /// Replaces the partition's producers with a Kafka snapshot's entries,
    /// as Kafka's `truncateAndReload` does: each keeps only its newest
    /// batch, open transactions are open again. Returns the entries that
    /// cannot be loaded (a negative producer id).
    pub(crate) fn load(
        &mut self,
        map: &mut StateMap,
        partition: i32,
        entries: &[KafkaProducerEntry],
    ) -> Vec<(i64, Unrepresentable)> {
        map.retain(|_, p, _| p != partition);
        let txns = &mut self.txns;
        self.full.retain(|id, p, e| {
            if p == partition
                && let Some(first) = e.txn_first_offset
            {
                txns.forget_open(partition, id, first);
            }
            p != partition
        });
        let mut skipped = Vec::new();
        for k in entries {
            if let Err(why) = self.insert_kafka(map, partition, k) {
                skipped.push((k.producer_id, why));
            }
        }
        skipped
    }

    /// Adds one entry of a Kafka snapshot to the partition, as Kafka's
    /// `readSnapshot` makes it (only its newest batch; an open transaction
    /// is open again): into the compact map when it fits there (a plain
    /// producer), else into the side table with its coordinator epoch,
    /// timestamp and transaction. `Ok(false)`, changing nothing, if the key
    /// has state already.
    ///
    /// # Errors
    ///
    /// [`Unrepresentable::NegativeProducerId`] for a negative producer id.
    pub(crate) fn insert_kafka(
        &mut self,
        map: &mut StateMap,
        partition: i32,
        k: &KafkaProducerEntry,
    ) -> Result<bool, Unrepresentable> {
        let Ok(pid) = u64::try_from(k.producer_id) else {
            return Err(Unrepresentable::NegativeProducerId);
        };
        let id = ProducerId::numeric(pid);
        if self.in_side(&id, partition) || map.get(&id, partition).is_some() {
            return Ok(false);
        }
        let full = FullEntry::from_kafka(k);
        match full.as_regular() {
            Some(e) => {
                map.insert_hashed(HashedKey::new(&id, partition), &e, ());
            }
            None => {
                if let Some(first) = full.txn_first_offset {
                    self.txns.open(partition, &id, first);
                }
                self.full.insert_new(id, partition, full);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(offset: i64) -> Option<BatchMetadata> {
        Some(BatchMetadata {
            offset,
            timestamp: 100 + offset,
        })
    }

    /// An empty compact map and side state.
    fn empty() -> (StateMap, KafkaState) {
        (StateMap::default(), KafkaState::default())
    }

    /// A batch of `id` on partition 0 at epoch 0: sequences
    /// `first..=last` at offset `off`.
    fn batch(
        k: &mut KafkaState,
        map: &mut StateMap,
        id: &ProducerId,
        (first, last, off): (i32, i32, i64),
        options: AppendOptions,
    ) -> BatchOutcome {
        k.append(map, id, 0, Ask::new(0, first, last, meta(off)), options)
    }

    #[test]
    fn plain_producers_stay_in_the_map_and_transactional_ones_move() {
        let (mut map, mut k) = empty();
        let id = ProducerId::from(1u64);
        let c = AppendOptions::client();
        assert!(batch(&mut k, &mut map, &id, (5, 6, 0), c).is_accepted());
        assert!(batch(&mut k, &mut map, &id, (7, 7, 2), c).is_accepted());
        assert_eq!((map.len(), k.len()), (1, 0));
        let t = c.transactional().verified();
        assert!(batch(&mut k, &mut map, &id, (8, 8, 3), t).is_accepted());
        assert_eq!((map.len(), k.len()), (0, 1));
        let s = k.state(&map, &id, 0).unwrap();
        assert_eq!(s.current_txn_first_offset, Some(3));
        assert_eq!(s.batches.len(), 3, "the window moved with the key");
        assert_eq!(k.txns().first_unstable_offset(0), Some(3));
    }

    #[test]
    fn a_replicated_gap_moves_the_key_and_keeps_the_window_exact() {
        let (mut map, mut k) = empty();
        let id = ProducerId::from(13u64);
        let r = AppendOptions::replication();
        for (f, off) in [(0, 72), (5, 73), (5, 74)] {
            assert!(batch(&mut k, &mut map, &id, (f, f, off), r).is_accepted());
        }
        let c = AppendOptions::client();
        assert!(batch(&mut k, &mut map, &id, (6, 6, 75), c).is_accepted());
        assert_eq!(
            batch(&mut k, &mut map, &id, (5, 5, 99), c),
            BatchOutcome::Duplicate { original: meta(73) }
        );
        let seqs: Vec<_> = k
            .state(&map, &id, 0)
            .unwrap()
            .batches
            .iter()
            .map(|b| b.first_sequence)
            .collect();
        assert_eq!(seqs, [0, 5, 5, 6]);
    }

    #[test]
    fn snapshot_entries_round_trip_through_load() {
        let (mut map, mut k) = empty();
        let c = AppendOptions::client();
        let t = c.transactional().verified();
        let (a, b) = (ProducerId::from(1u64), ProducerId::from(2u64));
        k.append(&mut map, &a, 4, Ask::new(0, 0, 3, meta(0)), c);
        k.append(&mut map, &b, 4, Ask::new(2, 0, 0, meta(4)), t);
        let mut entries = k.snapshot_entries(&map, 4);
        entries.sort();
        let (mut map2, mut k2) = empty();
        assert!(k2.load(&mut map2, 4, &entries).is_empty());
        let mut again = k2.snapshot_entries(&map2, 4);
        again.sort();
        assert_eq!(again, entries);
        assert_eq!(k2.txns().first_unstable_offset(4), Some(4));
        assert_eq!((map2.len(), k2.len()), (1, 1));
    }
}
