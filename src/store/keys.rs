//! The keys behind the store's one lock: the committed state the rules
//! see, the keys with operations in flight, the pre-images a running
//! snapshot needs, and the store-level state beside them. How a change is
//! decided and queued against them is `state.rs`.
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

use super::order::Order;
use crate::batch::AppendRequest;
use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::info::ProducerInfo;
use crate::engine::map::{Activity, Apply};
use crate::engine::rules::{self, UnknownProducer};
use crate::engine::shards::{KeyTarget, SHARDS, Shards, shard_of};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::recovery::replay::append_offset;
use crate::snapshot::meta::Meta;
use crate::wal::op::{GroupKind, RemoveReason};

/// A key's state as the log will say once everything in flight is
/// durable: its entry and last activity, or `None` (no state).
pub(super) type Spec = Option<(ProducerEntry, i64)>;

/// A key with records in flight (queued or written, not yet durable).
pub(super) struct Pending {
    pub(super) hash: u64,
    pub(super) id: ProducerId,
    pub(super) partition: i32,
    /// The key's state once everything in flight is applied.
    pub(super) state: Spec,
    /// Why it has none, if it was removed by an expiration or eviction in
    /// flight (the filter learns it when that is durable).
    pub(super) removed_as: Option<RemoveReason>,
    /// Position and group of the key's last record in flight.
    pub(super) pos: u64,
    pub(super) group: u64,
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
    GroupDone {
        kind: GroupKind,
        arg: i64,
        partition: Option<i32>,
    },
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

/// The keys the rules see.
pub(super) struct Keys {
    /// Under `Always`, the state of the durable records; under the
    /// buffered policies, of every record.
    pub(super) shards: Shards,
    /// The store-level state, on the same terms.
    pub(super) meta: Meta,
    /// `Always`: the keys with records in flight.
    pub(super) overlay: HashTable<Pending>,
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

    pub(super) fn overlay_find(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<&Pending> {
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
    pub(super) fn set_spec(
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
    pub(super) fn settle(&mut self, hash: u64, id: &ProducerId, partition: i32, pos: u64) {
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
    pub(super) fn install(&mut self, k: HashedKey<'_>, entry: &ProducerEntry, act: i64) -> bool {
        let new = self.shards.install(k, entry, act);
        if let Some(o) = &mut self.order {
            o.note(act, k.hash);
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
    pub(super) fn forget(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.shards.remove(hash, id, partition)
    }

    /// Buffered policies: classifies and applies an append at once; also
    /// says whether it created the key.
    #[inline]
    pub(super) fn append_now(
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

    /// What a group's completion does to the store-level state (as
    /// replay does it); `partition`: an import's.
    pub(super) fn group_done(&mut self, kind: GroupKind, arg: i64, partition: Option<i32>) {
        crate::recovery::replay::group_done(&mut self.meta, kind, arg, partition);
    }

    /// `Always`: installs a durable group in the committed state, in log
    /// order, each change as submitting it computed. An append's entry was
    /// classified against the key's in-flight state, which is what the
    /// committed state has become once every record before it is applied:
    /// a request that does not continue a key's records in flight waits
    /// until they are durable.
    pub(super) fn apply_durable(&mut self, group: Vec<Queued>) {
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
                    self.install(
                        HashedKey::hashed(hash, &r.producer_id, r.partition),
                        &entry,
                        act,
                    );
                    let offset = append_offset(&r, pos);
                    self.meta.high = self.meta.high.max(offset);
                    self.meta.ends.note(r.partition, offset);
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
                        let k = HashedKey::hashed(hash, &i.producer_id, i.partition);
                        self.install(k, &i.entry, i.last_activity);
                        self.settle(hash, &i.producer_id, i.partition, pos);
                    }
                }
                Queued::GroupDone {
                    kind,
                    arg,
                    partition,
                } => self.group_done(kind, arg, partition),
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

/// Whether a removal for this reason is remembered by the removed-key
/// filter (the store forgot the key by its own choice).
pub(super) fn remembered(reason: RemoveReason) -> bool {
    matches!(reason, RemoveReason::Expired | RemoveReason::Evicted)
}
