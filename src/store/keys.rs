//! What the store's one lock guards: the keys the rules see (the committed
//! state, the keys with operations in flight, the pre-images a running
//! snapshot needs), the store-level state beside them, and the log queue
//! that orders their records.
//!
//! One lock for all of it, because the order in which operations are
//! decided must be the order of their records in the log.
//!
//! Under `FsyncPolicy::Always` every change is first *in flight*: its
//! records are queued and the key's speculative state (an entry and its
//! activity, or "removed") is kept in an overlay beside the committed
//! state, which changes only once the records are durable. An append,
//! an eviction, an expiration, a truncation or an import all go this one
//! way, so a request for a key is always classified against what the log
//! will say about it, and a key with records in flight is never expired
//! or evicted from under them. Under the buffered policies a change is
//! applied at once and its records buffered.

use std::collections::HashMap;

use hashbrown::HashTable;

use super::commit::{Host, LogQueue};
use super::order::Order;
use crate::batch::AppendRequest;
use crate::engine::entry::ProducerEntry;
use crate::engine::info::ProducerInfo;
use crate::engine::map::{Activity, Apply};
use crate::engine::rules::{self, UnknownProducer};
use crate::engine::shards::{SHARDS, Shards, WARM_CHUNK, shard_of};
use crate::error::Error;
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::recovery::replay::append_offset;
use crate::snapshot::meta::Meta;
use crate::wal::op::{self, GroupKind, RemoveReason};

/// A key's state as the log will say once everything in flight is
/// durable: its entry and last activity, or `None` (no state).
pub(super) type Spec = Option<(ProducerEntry, i64)>;

/// A key with records in flight (queued or written, not yet durable).
struct Pending {
    hash: u64,
    id: ProducerId,
    partition: i32,
    /// The key's state once everything in flight is applied.
    state: Spec,
    /// Why it has none, if it was removed by an expiration or eviction in
    /// flight (the filter learns it when that is durable).
    removed_as: Option<RemoveReason>,
    /// Position and group of the key's last record in flight.
    pos: u64,
    group: u64,
}

/// A queued change waiting to be applied once durable (`Always`), in log
/// order.
pub(super) enum Queued {
    /// An accepted append: its key's entry and activity once applied, as
    /// submitting it computed.
    Append {
        hash: u64,
        request: AppendRequest,
        entry: ProducerEntry,
        act: i64,
        pos: u64,
    },
    /// A clock record: the log clock from here on.
    Clock(i64),
    /// One removal record and its keys.
    Remove {
        reason: RemoveReason,
        keys: Vec<(u64, ProducerId, i32)>,
        pos: u64,
    },
    /// One key-state record and its keys.
    Set {
        entries: Vec<(u64, ProducerInfo)>,
        pos: u64,
    },
    /// The last member of a group was applied: its effect on the
    /// store-level state.
    GroupDone { kind: GroupKind, arg: i64 },
    /// `Always`, Kafka mode: a key's record at `pos` is durable (the
    /// engine applied it when it was accepted; see `store/txn.rs`).
    KafkaSettle { key: (ProducerId, i32), pos: u64 },
}

/// A snapshot in progress: the position, which shards are encoded, and
/// the store-level state at the position.
pub(super) struct Capture {
    pub(super) position: u64,
    pub(super) done: [bool; SHARDS],
    /// Per shard: keys as they were at `position`, for keys changed since
    /// (`None`: the key did not exist at `position`).
    pub(super) pre: Vec<HashMap<(ProducerId, i32), Spec>>,
    pub(super) meta: Meta,
}

impl Capture {
    /// A snapshot at `position` of a state whose store-level part is
    /// `meta`, no shard encoded yet.
    pub(super) fn new(position: u64, meta: Meta) -> Capture {
        Capture {
            position,
            done: [false; SHARDS],
            pre: (0..SHARDS).map(|_| HashMap::new()).collect(),
            meta,
        }
    }
}

/// What submitting one request came to.
pub(super) enum Submit {
    Done(BatchOutcome),
    /// `Always`: accepted and queued at this position, in this group: wait
    /// for it.
    Queued {
        group: u64,
        pos: u64,
    },
    /// `Always`: the key has records in flight up to this position (in
    /// this group) and the request is not their continuation, or a full
    /// table has no key to evict but keys in flight: wait, then submit
    /// again.
    Wait {
        group: u64,
        pos: u64,
    },
    /// Refused before anything was written.
    Refused(Error),
}

/// Whether a removal for this reason is remembered by the removed-key
/// filter (the store forgot the key by its own choice).
fn remembered(reason: RemoveReason) -> bool {
    matches!(reason, RemoveReason::Expired | RemoveReason::Evicted)
}

/// What the lifecycle options say, as the lock's holder needs them.
pub(super) struct Life {
    pub(super) always: bool,
    pub(super) unknown: UnknownProducer,
    pub(super) cap: Option<usize>,
    /// At the cap: refuse new keys instead of evicting.
    pub(super) refuse: bool,
}

impl Life {
    /// Keys one eviction pass removes at a cap of `cap`: a 256th of the
    /// cap, at least one (docs/lifecycle.md).
    pub(super) fn evict_batch(cap: usize) -> usize {
        (cap / SHARDS).max(1)
    }
}

/// Counters of the lifecycle operations since the store was opened.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LifeStats {
    pub(super) expired: u64,
    pub(super) evicted: u64,
    pub(super) partition_removed: u64,
    pub(super) truncations: u64,
    pub(super) truncated_keys: u64,
    pub(super) imported: u64,
}

/// The keys the rules see.
pub(super) struct Keys {
    /// Under `Always`, the state of the durable records; under the
    /// buffered policies, of every record.
    pub(super) shards: Shards,
    /// The store-level state, on the same terms.
    pub(super) meta: Meta,
    /// `Always`: the keys with records in flight.
    overlay: HashTable<Pending>,
    pub(super) capture: Option<Capture>,
    /// Eviction order, when a cap is set.
    pub(super) order: Option<Order>,
    /// `Always`, Kafka mode: keys with a record in flight, and that
    /// record's (group, position). Another operation on such a key waits
    /// until it is durable (see `store/txn.rs`).
    pub(super) kafka_in_flight: HashMap<(ProducerId, i32), (u64, u64)>,
}

impl Keys {
    pub(super) fn new(shards: Shards, meta: Meta, capped: bool) -> Keys {
        Keys {
            shards,
            meta,
            overlay: HashTable::new(),
            capture: None,
            order: capped.then(Order::default),
            kafka_in_flight: HashMap::new(),
        }
    }

    fn overlay_find(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<&Pending> {
        self.overlay
            .find(hash, |p| p.partition == partition && p.id == *id)
    }

    /// Whether the key has records in flight.
    pub(super) fn in_flight(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.overlay_find(hash, id, partition).is_some()
    }

    /// The key's committed state.
    pub(super) fn committed(&self, hash: u64, id: &ProducerId, partition: i32) -> Spec {
        self.shards.get_full(hash, id, partition)
    }

    /// The key's speculative state, and its last record in flight (group,
    /// position) if it has one.
    pub(super) fn spec(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> (Spec, Option<(u64, u64)>) {
        match self.overlay_find(hash, id, partition) {
            Some(p) => (p.state, Some((p.group, p.pos))),
            None => (self.committed(hash, id, partition), None),
        }
    }

    /// Whether the key's state is being removed by an expiration or
    /// eviction in flight.
    pub(super) fn removed_in_flight(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.overlay_find(hash, id, partition)
            .is_some_and(|p| p.state.is_none() && p.removed_as.is_some())
    }

    /// Every key of `partition` in the speculative state: committed keys
    /// not being removed, and keys created in flight. Reads only the
    /// shards that hold committed keys of it.
    pub(super) fn spec_keys_of_partition(&self, partition: i32) -> Vec<(u64, ProducerId, i32)> {
        let mut out = Vec::new();
        for s in 0..SHARDS {
            if self.shards.partition_count(s, partition) == 0 {
                continue;
            }
            for (id, p, _) in self.shards.shard(s).keys() {
                if p != partition {
                    continue;
                }
                let h = crate::engine::map::hash_key(&id, p);
                match self.overlay_find(h, &id, p) {
                    Some(pending) if pending.state.is_none() => {}
                    _ => out.push((h, id, p)),
                }
            }
        }
        for p in self.overlay.iter() {
            if p.partition == partition
                && p.state.is_some()
                && !self.shards.contains(p.hash, &p.id, p.partition)
            {
                out.push((p.hash, p.id.clone(), p.partition));
            }
        }
        out
    }

    /// Notes a key's speculative state after a record at `pos` in `group`.
    /// `key` is the key's hash, id and partition; `at` the record's
    /// position and group.
    fn set_spec(
        &mut self,
        (hash, id, partition): (u64, &ProducerId, i32),
        state: Spec,
        removed_as: Option<RemoveReason>,
        (pos, group): (u64, u64),
    ) {
        match self
            .overlay
            .find_mut(hash, |p| p.partition == partition && p.id == *id)
        {
            Some(p) => {
                p.state = state;
                p.removed_as = removed_as;
                p.pos = pos;
                p.group = group;
            }
            None => {
                self.overlay.insert_unique(
                    hash,
                    Pending {
                        hash,
                        id: id.clone(),
                        partition,
                        state,
                        removed_as,
                        pos,
                        group,
                    },
                    |p| p.hash,
                );
            }
        }
    }

    /// Forgets a key's in-flight state once its record at `pos` is applied
    /// (unless a later record of it is in flight).
    fn settle(&mut self, hash: u64, id: &ProducerId, partition: i32, pos: u64) {
        if let Ok(entry) = self
            .overlay
            .find_entry(hash, |p| p.partition == partition && p.id == *id)
            && entry.get().pos == pos
        {
            entry.remove();
        }
    }

    /// Saves the state of a key about to change if a snapshot needs it as
    /// it was at the snapshot's position.
    pub(super) fn save_pre_image(&mut self, hash: u64, id: &ProducerId, partition: i32, pos: u64) {
        let Some(c) = &mut self.capture else { return };
        let s = shard_of(hash);
        if c.done[s] || pos < c.position {
            return;
        }
        let shards = &self.shards;
        c.pre[s]
            .entry((id.clone(), partition))
            .or_insert_with(|| shards.get_full(hash, id, partition));
    }

    /// Sets a key's committed state; true if the key is new.
    pub(super) fn install(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
        act: i64,
    ) -> bool {
        let new = self.shards.install(hash, id, partition, entry, act);
        if let Some(o) = &mut self.order {
            o.note(act, hash);
        }
        new
    }

    /// Removes a key from the committed state; an expired or evicted key
    /// is remembered by the filter.
    pub(super) fn remove(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        reason: RemoveReason,
    ) -> bool {
        if remembered(reason) {
            self.meta.filter.insert(hash);
        }
        self.forget(hash, id, partition)
    }

    /// Removes a key from the committed state, the filter left to the
    /// caller. The eviction order finds out at its next eviction (no key
    /// has the rank it listed).
    fn forget(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.shards.remove(hash, id, partition)
    }

    /// Buffered policies: classifies and applies an append at once; also
    /// says whether it created the key.
    #[inline]
    fn append_now(
        &mut self,
        hash: u64,
        r: &AppendRequest,
        how: Apply<Activity>,
    ) -> (BatchOutcome, bool) {
        let (o, created) = self.shards.append(hash, r, how);
        if o.is_accepted()
            && let Some(order) = &mut self.order
        {
            order.note(how.x.ms(), hash);
        }
        (o, created)
    }

    /// What a group's completion does to the store-level state.
    fn group_done(&mut self, kind: GroupKind, arg: i64) {
        match kind {
            GroupKind::Truncate => self.meta.high = arg.saturating_sub(1),
            GroupKind::Import => self.meta.high = self.meta.high.max(arg),
            GroupKind::RemovePartition => {}
        }
    }

    /// `Always`: installs a durable group in the committed state, in log
    /// order, each change as submitting it computed. An append's entry was
    /// classified against the key's in-flight state, which is what the
    /// committed state has become once every record before it is applied:
    /// a request that does not continue a key's records in flight waits
    /// until they are durable.
    fn apply_durable(&mut self, group: Vec<Queued>) {
        for q in group {
            match q {
                Queued::Append {
                    hash,
                    request: r,
                    entry,
                    act,
                    pos,
                } => {
                    self.save_pre_image(hash, &r.producer_id, r.partition, pos);
                    self.install(hash, &r.producer_id, r.partition, &entry, act);
                    self.meta.high = self.meta.high.max(append_offset(&r, pos));
                    self.settle(hash, &r.producer_id, r.partition, pos);
                }
                Queued::Clock(ms) => self.meta.clock = ms,
                Queued::Remove { reason, keys, pos } => {
                    for (hash, id, p) in keys {
                        self.save_pre_image(hash, &id, p, pos);
                        self.remove(hash, &id, p, reason);
                        self.settle(hash, &id, p, pos);
                    }
                }
                Queued::Set { entries, pos } => {
                    for (hash, i) in entries {
                        self.save_pre_image(hash, &i.producer_id, i.partition, pos);
                        self.install(hash, &i.producer_id, i.partition, &i.entry, i.last_activity);
                        self.settle(hash, &i.producer_id, i.partition, pos);
                    }
                }
                Queued::GroupDone { kind, arg } => self.group_done(kind, arg),
                Queued::KafkaSettle { key, pos } => {
                    if self
                        .kafka_in_flight
                        .get(&key)
                        .is_some_and(|&(_, p)| p == pos)
                    {
                        self.kafka_in_flight.remove(&key);
                    }
                }
            }
        }
    }
}

/// Classifies `r` against `base` (the key's entry, if it has one): the
/// entry once `r` is applied if it is accepted, else the outcome.
#[inline]
pub(super) fn next_entry(
    base: Option<ProducerEntry>,
    r: &AppendRequest,
    unknown: UnknownProducer,
) -> std::result::Result<ProducerEntry, BatchOutcome> {
    let outcome = rules::classify_with(
        base.map(|e| e.current()),
        unknown,
        r.epoch,
        r.first,
        r.last,
        |f, l| base.and_then(|e| e.find(f, l)),
    );
    if !outcome.is_accepted() {
        return Err(outcome);
    }
    Ok(match base {
        Some(mut e) => {
            e.accept(r.epoch > e.epoch(), r.epoch, r.first, r.last, r.metadata);
            e
        }
        None => ProducerEntry::start(r.epoch, r.first, r.last, r.metadata),
    })
}

/// Everything behind the store's lock.
pub(super) struct State {
    pub(super) keys: Keys,
    pub(super) log: LogQueue<Queued>,
    /// Positions and bytes of log since the last snapshot.
    pub(super) since_snapshot: (u64, u64),
    /// The automatic snapshot thresholds (positions, bytes).
    pub(super) snapshot_every: (Option<u64>, Option<u64>),
    /// A threshold was crossed and the snapshot has not started yet.
    pub(super) snapshot_requested: bool,
    pub(super) snapshots_written: u64,
    /// The log clock once every record queued is applied.
    pub(super) spec_clock: i64,
    /// Keys with state once every record queued is applied.
    pub(super) spec_len: usize,
    pub(super) life: Life,
    pub(super) life_stats: LifeStats,
    /// Appends answered accepted, duplicate, out of order, fenced (in
    /// [`AppendOutcome`](crate::AppendOutcome) order), counted where they
    /// are decided: under this lock, for nothing. Under `Always` an
    /// accepted append is counted when its record is durable (it is
    /// answered `ACCEPTED` exactly then).
    pub(super) answered: [u64; 4],
}

impl State {
    pub(super) fn new(keys: Keys, log: LogQueue<Queued>, life: Life) -> State {
        State {
            spec_clock: keys.meta.clock,
            spec_len: keys.shards.len(),
            keys,
            log,
            since_snapshot: (0, 0),
            snapshot_every: (None, None),
            snapshot_requested: false,
            snapshots_written: 0,
            life,
            life_stats: LifeStats::default(),
            answered: [0; 4],
        }
    }

    /// Counts what was just queued toward the snapshot thresholds.
    pub(super) fn counted(&mut self, bytes_before: usize, positions: u64) {
        self.since_snapshot.0 += positions;
        self.since_snapshot.1 += (self.log.buffered() - bytes_before) as u64;
    }

    fn enqueue_record(&mut self, r: &AppendRequest) -> u64 {
        let before = self.log.buffered();
        let pos = self.log.push(r);
        self.counted(before, 1);
        pos
    }

    /// The time an append takes as its key's activity: its batch's
    /// timestamp, or the log clock, which a reading `now` moves forward.
    #[inline]
    fn activity(&self, r: &AppendRequest, now: i64) -> i64 {
        r.metadata.map_or(self.spec_clock.max(now), |m| m.timestamp)
    }

    /// Logs the clock before an accepted single-sequence append at `act`
    /// if it moved.
    #[inline]
    fn log_clock(&mut self, r: &AppendRequest, act: i64) {
        if r.metadata.is_some() || act == self.spec_clock {
            return;
        }
        let before = self.log.buffered();
        self.log.push_op(|b| {
            op::encode_clock(b, act);
            (0, ())
        });
        self.counted(before, 0);
        self.spec_clock = act;
        if self.life.always {
            self.log.queue(Queued::Clock(act));
        } else {
            self.keys.meta.clock = act;
        }
    }

    /// Logs the marker that lets replay accept an append for a key without
    /// state at a sequence other than 0.
    fn log_accepted_unknown(&mut self) {
        let before = self.log.buffered();
        self.log.push_op(|b| {
            op::encode_accepted_unknown(b);
            (0, ())
        });
        self.counted(before, 0);
    }

    /// `Always`: classifies against the in-flight state if the key has one,
    /// else the committed state; makes room for a new key at the cap;
    /// queues an accepted request (after its clock record, if the clock
    /// moved).
    pub(super) fn submit_durable(&mut self, hash: u64, r: &AppendRequest, now: i64) -> Submit {
        let (base, in_flight) = self.keys.spec(hash, &r.producer_id, r.partition);
        let entry = match next_entry(base.map(|(e, _)| e), r, self.life.unknown) {
            Ok(e) => e,
            Err(outcome) => {
                return match in_flight {
                    Some((group, pos)) => Submit::Wait { group, pos },
                    None => {
                        self.answered[outcome.outcome() as usize] += 1;
                        Submit::Done(outcome)
                    }
                };
            }
        };
        let new_key = base.is_none();
        if new_key && let Err(s) = self.make_room(hash, r) {
            return s;
        }
        let act = self.activity(r, now);
        self.log_clock(r, act);
        if new_key && r.first != 0 {
            self.log_accepted_unknown();
        }
        let pos = self.enqueue_record(r);
        let group = self.log.group();
        self.log.queue(Queued::Append {
            hash,
            request: r.clone(),
            entry,
            act,
            pos,
        });
        self.keys.set_spec(
            (hash, &r.producer_id, r.partition),
            Some((entry, act)),
            None,
            (pos, group),
        );
        self.spec_len += usize::from(new_key);
        Submit::Queued { group, pos }
    }

    /// Buffered policies: classify, apply and queue the record at once.
    #[inline]
    pub(super) fn submit_buffered(
        &mut self,
        hash: u64,
        r: &AppendRequest,
        now: i64,
    ) -> Result<BatchOutcome, Error> {
        if self.life.cap.is_some_and(|cap| self.spec_len >= cap)
            && !self.keys.shards.contains(hash, &r.producer_id, r.partition)
        {
            // A new key in a full table: rule 1 alone decides.
            if let Err(outcome) = next_entry(None, r, self.life.unknown) {
                return Ok(outcome);
            }
            if let Err(s) = self.make_room(hash, r) {
                return match s {
                    Submit::Refused(e) => Err(e),
                    _ => Err(Error::Internal("a buffered append waited for room")),
                };
            }
        }
        let pos = self.log.next_position();
        if self.keys.capture.is_some() {
            // If the append is rejected, the pre-image equals the current
            // entry, which is harmless.
            self.keys
                .save_pre_image(hash, &r.producer_id, r.partition, pos);
        }
        let act = self.activity(r, now);
        let how = Apply {
            unknown: self.life.unknown,
            x: Activity::new(act),
        };
        let (outcome, new_key) = self.keys.append_now(hash, r, how);
        self.answered[outcome.outcome() as usize] += 1;
        if outcome.is_accepted() {
            self.log_clock(r, act);
            if new_key && r.first != 0 {
                self.log_accepted_unknown();
            }
            let pos = self.enqueue_record(r);
            self.keys.meta.high = self.keys.meta.high.max(append_offset(r, pos));
            self.spec_len += usize::from(new_key);
        }
        Ok(outcome)
    }

    /// Before a new key is added: at the cap, evicts the least recently
    /// active keys (none of them `r`'s, none with records in flight) or
    /// refuses. `Err` is what the submit comes to instead.
    fn make_room(&mut self, hash: u64, r: &AppendRequest) -> Result<(), Submit> {
        let Some(cap) = self.life.cap else {
            return Ok(());
        };
        if self.spec_len < cap {
            return Ok(());
        }
        if self.life.refuse {
            return Err(Submit::Refused(Error::TooManyProducers { max: cap }));
        }
        // A pass evicts a batch; more if the cap was lowered since the
        // table filled.
        let n = Life::evict_batch(cap).max(self.spec_len + 1 - cap);
        let mut order = self.keys.order.take().unwrap_or_default();
        // Buffered, and no snapshot needing the victims' states as they
        // were: removed from the table as they are found (their records
        // and the filter follow in `log_removal`).
        let at_once = !self.life.always && self.keys.capture.is_none();
        let Keys {
            shards, overlay, ..
        } = &mut self.keys;
        let excluded = |h: u64, id: &ProducerId, p: i32| {
            (h == hash && *id == r.producer_id && p == r.partition)
                || (!overlay.is_empty()
                    && overlay
                        .find(h, |q| q.partition == p && q.id == *id)
                        .is_some())
        };
        let victims = if at_once {
            order.remove_victims(shards, n, excluded)
        } else {
            order.victims(shards, n, excluded)
        };
        self.keys.order = Some(order);
        if victims.is_empty() {
            // Every key is in flight: wait for them.
            return Err(match self.log.last_queued() {
                Some((group, pos)) => Submit::Wait { group, pos },
                None => Submit::Refused(Error::Internal(
                    "a full table has no key to evict and none in flight",
                )),
            });
        }
        self.life_stats.evicted += victims.len() as u64;
        self.log_removal_of(RemoveReason::Evicted, victims, at_once);
        Ok(())
    }

    /// Logs the removal of `keys` (a record per 64 KiB of keys) and
    /// applies it: at once (buffered policies) or once durable (`Always`,
    /// the keys' speculative states removed meanwhile). Returns the last
    /// record's position.
    pub(super) fn log_removal(
        &mut self,
        reason: RemoveReason,
        keys: Vec<(u64, ProducerId, i32)>,
    ) -> u64 {
        self.log_removal_of(reason, keys, false)
    }

    /// [`State::log_removal`]; `removed`: the buffered policies only, the
    /// keys are already gone from the table (`Order::remove_victims`), and
    /// no snapshot is capturing.
    fn log_removal_of(
        &mut self,
        reason: RemoveReason,
        keys: Vec<(u64, ProducerId, i32)>,
        removed: bool,
    ) -> u64 {
        let before = self.log.buffered();
        let (first, counts) = self.log.push_op(|b| {
            let c = op::encode_removes(b, reason, keys.iter().map(|(_, id, p)| (id, *p)));
            (c.len() as u64, c)
        });
        self.counted(before, counts.len() as u64);
        let group = self.log.group();
        let mut keys = keys.into_iter();
        let mut pos = first;
        for (i, n) in counts.iter().enumerate() {
            pos = first + i as u64;
            let chunk: Vec<_> = keys.by_ref().take(*n).collect();
            if self.life.always {
                for (hash, id, p) in &chunk {
                    let removed_as = (!reason.in_group()).then_some(reason);
                    self.keys
                        .set_spec((*hash, id, *p), None, removed_as, (pos, group));
                }
                self.spec_len -= chunk.len();
                self.log.queue(Queued::Remove {
                    reason,
                    keys: chunk,
                    pos,
                });
            } else {
                // The filter first, in a loop of its own: its blocks' cache
                // misses overlap, where between two table removals they
                // would not.
                if remembered(reason) {
                    self.keys
                        .meta
                        .filter
                        .insert_all(chunk.iter().map(|(hash, _, _)| *hash));
                }
                if removed {
                    self.spec_len -= chunk.len();
                    continue;
                }
                let mut hashes = [0u64; WARM_CHUNK];
                for part in chunk.chunks(WARM_CHUNK) {
                    // Bring their slots in first: their cache misses
                    // overlap (see `Shards::warm_hashes`).
                    for (h, (hash, _, _)) in hashes.iter_mut().zip(part) {
                        *h = *hash;
                    }
                    self.keys
                        .shards
                        .warm_hashes(hashes.get(..part.len()).unwrap_or_default());
                    for (hash, id, p) in part {
                        self.keys.save_pre_image(*hash, id, *p, pos);
                        if self.keys.forget(*hash, id, *p) {
                            self.spec_len -= 1;
                        }
                    }
                }
            }
        }
        pos
    }

    /// Logs key states (a record per 64 KiB) and applies them, like
    /// [`State::log_removal`].
    pub(super) fn log_sets(&mut self, entries: Vec<(u64, ProducerInfo)>) -> u64 {
        let before = self.log.buffered();
        let (first, counts) = self.log.push_op(|b| {
            let c = op::encode_sets(b, entries.iter().map(|(_, i)| i));
            (c.len() as u64, c)
        });
        self.counted(before, counts.len() as u64);
        let group = self.log.group();
        let mut entries = entries.into_iter();
        let mut pos = first;
        for (i, n) in counts.iter().enumerate() {
            pos = first + i as u64;
            let chunk: Vec<_> = entries.by_ref().take(*n).collect();
            if self.life.always {
                for (hash, info) in &chunk {
                    let (was, _) = self.keys.spec(*hash, &info.producer_id, info.partition);
                    self.spec_len += usize::from(was.is_none());
                    let state = Some((info.entry, info.last_activity));
                    self.keys.set_spec(
                        (*hash, &info.producer_id, info.partition),
                        state,
                        None,
                        (pos, group),
                    );
                }
                self.log.queue(Queued::Set {
                    entries: chunk,
                    pos,
                });
            } else {
                for (hash, info) in &chunk {
                    self.keys
                        .save_pre_image(*hash, &info.producer_id, info.partition, pos);
                    let new = self.keys.install(
                        *hash,
                        &info.producer_id,
                        info.partition,
                        &info.entry,
                        info.last_activity,
                    );
                    self.spec_len += usize::from(new);
                }
            }
        }
        pos
    }

    /// Logs an atomic group: the group record, then what `members` logs
    /// (removals and key states, `count` records of them), then the
    /// group's own effect. All of it is queued under this one lock hold,
    /// so it is written in one write. Returns the last position.
    pub(super) fn log_group(
        &mut self,
        kind: GroupKind,
        arg: i64,
        removals: (RemoveReason, Vec<(u64, ProducerId, i32)>),
        sets: Vec<(u64, ProducerInfo)>,
    ) -> u64 {
        // How many records the members take: encode them once to count.
        let mut scratch = Vec::new();
        let (reason, removed) = removals;
        let members = op::encode_removes(
            &mut scratch,
            reason,
            removed.iter().map(|(_, id, p)| (id, *p)),
        )
        .len()
            + op::encode_sets(&mut scratch, sets.iter().map(|(_, i)| i)).len();
        let before = self.log.buffered();
        let (mut last, ()) = self.log.push_op(|b| {
            op::encode_group(b, kind, members as u32, arg);
            (1, ())
        });
        self.counted(before, 1);
        if !removed.is_empty() {
            last = self.log_removal(reason, removed);
        }
        if !sets.is_empty() {
            last = self.log_sets(sets);
        }
        if self.life.always {
            self.log.queue(Queued::GroupDone { kind, arg });
        } else {
            self.keys.group_done(kind, arg);
        }
        last
    }

    /// True (once) when an automatic snapshot threshold has been crossed.
    pub(super) fn note_snapshot_due(&mut self) -> bool {
        let (records, bytes) = self.since_snapshot;
        let (every_records, every_bytes) = self.snapshot_every;
        let due =
            every_records.is_some_and(|n| records >= n) || every_bytes.is_some_and(|n| bytes >= n);
        if due && !self.snapshot_requested && self.log.failed().is_none() {
            self.snapshot_requested = true;
            return true;
        }
        false
    }
}

impl Host for State {
    type Item = Queued;

    #[inline]
    fn log(&mut self) -> &mut LogQueue<Queued> {
        &mut self.log
    }

    fn apply_durable(&mut self, items: Vec<Queued>) {
        let appends = items
            .iter()
            .filter(|q| matches!(q, Queued::Append { .. }))
            .count();
        self.answered[0] += appends as u64;
        self.keys.apply_durable(items);
    }

    fn discard_in_flight(&mut self) {
        self.keys.overlay.clear();
        self.keys.kafka_in_flight.clear();
        self.spec_len = self.keys.shards.len();
        self.spec_clock = self.keys.meta.clock;
    }

    fn after_group(&mut self) -> bool {
        self.note_snapshot_due()
    }

    fn removed_keys(&self) -> (u64, u64) {
        (self.life_stats.expired, self.life_stats.evicted)
    }

    fn live_keys(&self) -> usize {
        self.keys.shards.len()
    }
}
