//! A deliberately simple reference model of the rules, written from the
//! four rules as the crate docs state them, not from the engine: a map of keys to (epoch, last sequence,
//! a list of retained batches, last activity), searched linearly; and the
//! lifecycle as the documentation states it (docs/lifecycle.md): the log
//! clock, expiration, eviction of the least recently active keys, the
//! unknown-producer policy, partition removal.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use producer_state::{
    AppendRequest, BatchMetadata, BatchOutcome, OutOfOrderReason, ProducerEntry, ProducerInfo,
};

pub type Key = (producer_state::ProducerId, i32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    pub epoch: i16,
    pub last: i32,
    /// `None` until the key's first append with metadata: keys that only
    /// use the single-sequence append retain nothing.
    pub retained: Option<Vec<(i32, i32, Option<BatchMetadata>)>>,
    /// The key's last activity: its last batch's timestamp, or the log
    /// clock when its last single-sequence append was accepted.
    pub act: i64,
}

/// The store's fixed 64-bit hash of a key, written from docs/format.md
/// ("The hash of a key"), not from the engine: eviction breaks ties of
/// activity by it.
pub fn key_hash(key: &Key) -> u64 {
    const K: [u64; 4] = [
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ];
    let fold = |a: u64, b: u64| {
        let p = u128::from(a) * u128::from(b);
        (p as u64) ^ ((p >> 64) as u64)
    };
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let (id, partition) = key;
    let p = u64::from(*partition as u32).wrapping_mul(K[2] | 1);
    if let Some(n) = id.as_numeric() {
        return fold(n ^ K[0], K[1]) ^ p;
    }
    let name = id.as_name().unwrap_or_default().as_bytes();
    if name.len() <= 24 {
        let mut b = [0u8; 24];
        b[..name.len()].copy_from_slice(name);
        let w = |i: usize| word(&b[i..i + 8]);
        fold(w(0) ^ K[0], w(8) ^ K[1]) ^ fold(w(16) ^ K[3] ^ name.len() as u64, K[2]) ^ p
    } else {
        let mut h = K[3] ^ name.len() as u64;
        for block in name.chunks(16) {
            let (a, b) = block.split_at(block.len().min(8));
            h = fold(word(a) ^ K[0] ^ h, word(b) ^ K[1]);
        }
        h ^ p
    }
}

/// What the store was opened with, as far as the model cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelConfig {
    pub cap: Option<usize>,
    /// At the cap: refuse new keys instead of evicting.
    pub refuse: bool,
    /// `UnknownProducer::AcceptAny`.
    pub accept_any: bool,
    /// `producer_expiration` in milliseconds (`None`: never).
    pub expiration_ms: Option<i64>,
}

/// One operation of the effective history (what truncation replays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistOp {
    /// An accepted append, the activity it took, whether rule 1 let it in
    /// at a sequence above 0, and the offset truncation compares (its
    /// batch's, else its log position).
    Append {
        r: AppendRequest,
        act: i64,
        any: bool,
        offset: i64,
    },
    /// Keys removed (expired, evicted, a partition removed).
    Remove(Vec<Key>),
    /// Keys imported, and the highest offset they hold.
    Import {
        entries: Vec<(Key, ModelEntry)>,
        high: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub keys: HashMap<Key, ModelEntry>,
    pub config: ModelConfig,
    /// The log clock: the last time a single-sequence append took.
    pub clock: i64,
    /// Keys whose state expired or was evicted.
    pub removed: HashSet<Key>,
    /// The history with what truncations removed left out.
    pub history: Vec<HistOp>,
    /// The log position the next record takes (as the store counts them:
    /// the harness sets it after a sweep, whose records are one per shard).
    pub next_pos: u64,
    /// The highest offset appended, lowered by truncation (-1: none).
    pub high: i64,
    /// Each partition's highest offset (`partition_end_offset` - 1), the
    /// store-wide rule per partition; absent: none.
    pub ends: HashMap<i32, i64>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            keys: HashMap::new(),
            config: ModelConfig::default(),
            clock: 0,
            removed: HashSet::new(),
            history: Vec::new(),
            next_pos: 0,
            high: -1,
            ends: HashMap::new(),
        }
    }
}

/// Why a truncation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncateError {
    AboveEnd { end: i64 },
}

/// A new key was refused at the cap (`AtCapacity::Refuse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

fn succ(s: i32) -> i32 {
    if s == i32::MAX { 0 } else { s + 1 }
}

impl Model {
    /// An append with the clock at 0 (the model of the engine alone).
    pub fn append(&mut self, r: &AppendRequest) -> BatchOutcome {
        self.append_at(r, 0)
    }

    /// An append with the store's clock reading `now`, nothing in flight.
    pub fn append_at(&mut self, r: &AppendRequest, now: i64) -> BatchOutcome {
        self.try_append_at(r, now, &HashSet::new())
            .expect("refused at the cap")
    }

    /// An append with the store's clock reading `now`; `in_flight` keys
    /// (of an `append_all` call under `Always`) are never evicted.
    pub fn try_append_at(
        &mut self,
        r: &AppendRequest,
        now: i64,
        in_flight: &HashSet<Key>,
    ) -> Result<BatchOutcome, Refused> {
        let act = r.metadata().map_or(self.clock.max(now), |m| m.timestamp);
        let any = self.config.accept_any;
        let key = (r.producer_id.clone(), r.partition);
        let new_key = !self.keys.contains_key(&key);
        let o = self.apply_rules(r, act, any, |m| m.make_room(&key, in_flight))?;
        if o.is_accepted() {
            let offset = r.metadata().map_or(self.next_pos as i64, |m| m.offset);
            self.history.push(HistOp::Append {
                r: r.clone(),
                act,
                any: new_key && r.first_sequence() != 0,
                offset,
            });
            self.next_pos += 1;
            self.high = self.high.max(offset);
            self.note_end(r.partition, offset);
        }
        Ok(o)
    }

    /// The four rules (rule 1 as `accept_any` says), applied with activity
    /// `act` if accepted; `room` runs before a new key is added.
    fn apply_rules(
        &mut self,
        r: &AppendRequest,
        act: i64,
        accept_any: bool,
        room: impl FnOnce(&mut Model) -> Result<(), Refused>,
    ) -> Result<BatchOutcome, Refused> {
        let key = (r.producer_id.clone(), r.partition);
        let (epoch, first, last, meta) =
            (r.epoch, r.first_sequence(), r.last_sequence(), r.metadata());
        let malformed = if first < 0 || last < 0 {
            Some(OutOfOrderReason::NegativeSequence)
        } else if last < first {
            Some(OutOfOrderReason::LastBeforeFirst)
        } else {
            None
        };
        let ooo = |reason| BatchOutcome::OutOfOrder { reason };
        if !self.keys.contains_key(&key) {
            if let Some(m) = malformed {
                return Ok(ooo(m));
            }
            if first != 0 && !accept_any {
                return Ok(ooo(OutOfOrderReason::UnknownProducer {
                    first_sequence: first,
                }));
            }
            room(self)?;
            let retained = meta.map(|_| vec![(first, last, meta)]);
            self.keys.insert(
                key,
                ModelEntry {
                    epoch,
                    last,
                    retained,
                    act,
                },
            );
            self.accepted(meta, act);
            return Ok(BatchOutcome::Accepted);
        }
        let Some(e) = self.keys.get_mut(&key) else {
            unreachable!()
        };
        if epoch < e.epoch {
            return Ok(BatchOutcome::FencedEpoch {
                current_epoch: e.epoch,
            });
        }
        if let Some(m) = malformed {
            return Ok(ooo(m));
        }
        if epoch > e.epoch {
            if first != 0 {
                return Ok(ooo(OutOfOrderReason::NewEpochNotAtZero {
                    first_sequence: first,
                }));
            }
            let retained = match (&e.retained, meta) {
                (None, None) => None,
                _ => Some(vec![(first, last, meta)]),
            };
            *e = ModelEntry {
                epoch,
                last,
                retained,
                act,
            };
            self.accepted(meta, act);
            return Ok(BatchOutcome::Accepted);
        }
        if first == succ(e.last) {
            e.last = last;
            e.act = act;
            match (&mut e.retained, meta) {
                (Some(v), _) => {
                    v.push((first, last, meta));
                    if v.len() > 5 {
                        v.remove(0);
                    }
                }
                (None, Some(_)) => e.retained = Some(vec![(first, last, meta)]),
                (None, None) => {}
            }
            self.accepted(meta, act);
            return Ok(BatchOutcome::Accepted);
        }
        if let Some(b) = e
            .retained
            .as_ref()
            .and_then(|v| v.iter().find(|b| b.0 == first && b.1 == last))
        {
            return Ok(BatchOutcome::Duplicate { original: b.2 });
        }
        Ok(if first <= e.last {
            if first == last {
                BatchOutcome::Duplicate { original: None }
            } else {
                ooo(OutOfOrderReason::OverlapsAccepted {
                    last_accepted: e.last,
                })
            }
        } else {
            ooo(OutOfOrderReason::Gap {
                expected: succ(e.last),
                first_sequence: first,
            })
        })
    }

    /// A single-sequence append accepted at `act` moves the log clock
    /// (replays for truncation move it too: harmless, the clock only grows
    /// with the harness's).
    fn accepted(&mut self, meta: Option<BatchMetadata>, act: i64) {
        if meta.is_none() {
            self.clock = self.clock.max(act);
        }
    }

    /// One `append_all` call with the clock at `now`, as the store answers
    /// it. Under `Always` (`durable`) the keys the call accepted or evicted
    /// are in flight until something makes the call wait for them: a
    /// request for such a key that it does not accept, or a full table
    /// with nothing else to evict.
    pub fn append_all_at(
        &mut self,
        reqs: &[AppendRequest],
        now: i64,
        durable: bool,
    ) -> Vec<Result<BatchOutcome, Refused>> {
        self.append_all_trace(reqs, now, durable).0
    }

    /// [`Model::append_all_at`], and the states the log passes through:
    /// after each request's eviction (its removal record is written before
    /// its append's), then after the request; a crash may leave any of
    /// them.
    pub fn append_all_trace(
        &mut self,
        reqs: &[AppendRequest],
        now: i64,
        durable: bool,
    ) -> (Vec<Result<BatchOutcome, Refused>>, Vec<Vec<Model>>) {
        let mut in_flight: HashSet<Key> = HashSet::new();
        let mut out = Vec::new();
        let mut trace = Vec::new();
        for r in reqs {
            let key = (r.producer_id.clone(), r.partition);
            if durable {
                let accepted = self
                    .clone()
                    .try_append_at(r, now, &in_flight)
                    .is_ok_and(|o| o.is_accepted());
                let waits = if accepted {
                    self.would_wait_for_room(&key, &in_flight)
                } else {
                    in_flight.contains(&key)
                };
                if waits {
                    in_flight.clear();
                }
            }
            let before = self.clone();
            let o = self.try_append_at(r, now, &in_flight);
            let evicted: Vec<Key> = before
                .keys
                .keys()
                .filter(|k| !self.keys.contains_key(*k))
                .cloned()
                .collect();
            let mut states = Vec::new();
            if !evicted.is_empty() {
                // The removal record, without the append after it.
                let mut e = before.clone();
                for k in &evicted {
                    e.keys.remove(k);
                    e.removed.insert(k.clone());
                }
                e.history.push(HistOp::Remove(evicted.clone()));
                e.next_pos += 1;
                states.push(e);
            }
            states.push(self.clone());
            trace.push(states);
            if durable && o.is_ok_and(|o| o.is_accepted()) {
                in_flight.insert(key);
                // The keys it evicted have their removal in flight.
                in_flight.extend(evicted);
            }
            out.push(o);
        }
        (out, trace)
    }

    /// Whether a new key would find a full table with only keys in flight
    /// to evict (the store then waits for them).
    fn would_wait_for_room(&self, key: &Key, in_flight: &HashSet<Key>) -> bool {
        let full = self.config.cap.is_some_and(|cap| self.keys.len() >= cap);
        full && !self.config.refuse
            && !self.keys.contains_key(key)
            && self.keys.keys().all(|k| k == key || in_flight.contains(k))
    }

    /// Before `key` gets state: at the cap, evict a 256th of the cap (at
    /// least one, and enough to get below the cap), the least recently
    /// active first (activity, then the key's hash, then id, then
    /// partition), never `key` nor a key in flight; or refuse.
    fn make_room(&mut self, key: &Key, in_flight: &HashSet<Key>) -> Result<(), Refused> {
        let Some(cap) = self.config.cap else {
            return Ok(());
        };
        if self.keys.len() < cap {
            return Ok(());
        }
        if self.config.refuse {
            return Err(Refused);
        }
        let n = (cap / 256).max(1).max(self.keys.len() + 1 - cap);
        let mut order: Vec<(i64, u64, Key)> = self
            .keys
            .iter()
            .filter(|(k, _)| *k != key && !in_flight.contains(*k))
            .map(|(k, e)| (e.act, key_hash(k), k.clone()))
            .collect();
        order.sort();
        let victims: Vec<Key> = order.into_iter().take(n).map(|(_, _, k)| k).collect();
        if !victims.is_empty() {
            for k in &victims {
                self.keys.remove(k);
                self.removed.insert(k.clone());
            }
            self.history.push(HistOp::Remove(victims));
            self.next_pos += 1;
        }
        Ok(())
    }

    /// An expiration sweep with the clock at `now`: returns how many keys
    /// expired.
    pub fn expire(&mut self, now: i64) -> usize {
        let Some(exp) = self.config.expiration_ms else {
            return 0;
        };
        let cutoff = now.saturating_sub(exp);
        let gone: Vec<Key> = self
            .keys
            .iter()
            .filter(|(_, e)| e.act <= cutoff)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.keys.remove(k);
            self.removed.insert(k.clone());
        }
        if !gone.is_empty() {
            self.history.push(HistOp::Remove(gone.clone()));
        }
        gone.len()
    }

    /// Removes a partition's keys: returns how many. (One group record and
    /// one removal record: the model's keys are few.)
    pub fn remove_partition(&mut self, partition: i32) -> usize {
        let gone: Vec<Key> = self
            .keys
            .keys()
            .filter(|(_, p)| *p == partition)
            .cloned()
            .collect();
        for k in &gone {
            self.keys.remove(k);
        }
        let had_end = self.ends.remove(&partition).is_some();
        if !gone.is_empty() {
            self.history.push(HistOp::Remove(gone.clone()));
            self.next_pos += 2;
        } else if had_end {
            // Its end goes too: a group of no member.
            self.next_pos += 1;
        }
        gone.len()
    }

    fn note_end(&mut self, partition: i32, offset: i64) {
        if offset >= 0 {
            let e = self.ends.entry(partition).or_insert(offset);
            *e = (*e).max(offset);
        }
    }

    /// One past the partition's highest offset (0: none).
    pub fn partition_end(&self, partition: i32) -> i64 {
        self.ends.get(&partition).map_or(0, |e| e + 1)
    }

    /// `truncate_to(offset)`: the state of the history without the appends
    /// at or above `offset` (and imports whose highest offset is), appends
    /// that no longer apply dropped, removals as they were. Returns how
    /// many keys changed. (Whether a retained snapshot reaches that far is
    /// the store's to say: the harness asks it.)
    pub fn truncate(&mut self, offset: i64) -> Result<usize, TruncateError> {
        let end = self.high.saturating_add(1);
        if offset > end {
            return Err(TruncateError::AboveEnd { end });
        }
        if offset == end {
            return Ok(0);
        }
        self.ends.retain(|_, e| {
            *e = (*e).min(offset - 1);
            *e >= 0
        });
        self.high = offset - 1;
        self.rewind(None, offset)
    }

    /// `truncate_partition_to(partition, offset)`: [`Model::truncate`] for
    /// the appends and imports of one partition; the others keep theirs.
    pub fn truncate_partition(
        &mut self,
        partition: i32,
        offset: i64,
    ) -> Result<usize, TruncateError> {
        let end = self.partition_end(partition);
        if offset > end {
            return Err(TruncateError::AboveEnd { end });
        }
        if offset == end {
            return Ok(0);
        }
        if offset > 0 {
            self.ends.insert(partition, offset - 1);
        } else {
            self.ends.remove(&partition);
        }
        self.rewind(Some(partition), offset)
    }

    /// The history without the appends (and imports) at or above `offset`,
    /// of partition `only` or of all, replayed; returns the keys changed.
    fn rewind(&mut self, only: Option<i32>, offset: i64) -> Result<usize, TruncateError> {
        let mine = |p: i32| only.is_none_or(|o| o == p);
        self.history.retain(|op| match op {
            HistOp::Append { offset: o, r, .. } => *o < offset || !mine(r.partition),
            HistOp::Import { high, entries } => {
                *high < offset || !entries.first().is_some_and(|((_, p), _)| mine(*p))
            }
            HistOp::Remove(_) => true,
        });
        let mut fresh = Model {
            config: self.config,
            ..Model::default()
        };
        for op in &self.history {
            match op {
                HistOp::Append { r, act, any, .. } => {
                    let _ = fresh.apply_rules(r, *act, *any, |_| Ok(()));
                }
                HistOp::Remove(keys) => {
                    for k in keys {
                        fresh.keys.remove(k);
                    }
                }
                HistOp::Import { entries, .. } => {
                    for (k, e) in entries {
                        fresh.keys.insert(k.clone(), e.clone());
                    }
                }
            }
        }
        // Another partition's keys are what they were (its history is).
        fresh.keys.retain(|(_, p), _| mine(*p));
        for (k, e) in &self.keys {
            if !mine(k.1) {
                fresh.keys.insert(k.clone(), e.clone());
            }
        }
        let mut changed = 0;
        let (mut removed, mut set) = (false, false);
        for (k, e) in &self.keys {
            match fresh.keys.get(k) {
                None => (changed, removed) = (changed + 1, true),
                Some(f) if f != e => (changed, set) = (changed + 1, true),
                Some(_) => {}
            }
        }
        for k in fresh.keys.keys() {
            if !self.keys.contains_key(k) {
                (changed, set) = (changed + 1, true);
            }
        }
        self.keys = fresh.keys;
        self.next_pos += 1 + u64::from(removed) + u64::from(set);
        Ok(changed)
    }

    /// Imports keys (of another store's partition): their highest batch
    /// offset (of any retained batch: offsets in a window need not grow)
    /// is what truncation undoes the import at.
    pub fn import(&mut self, entries: Vec<(Key, ModelEntry)>) {
        let high = entries
            .iter()
            .filter_map(|(_, e)| e.retained.as_ref())
            .flatten()
            .filter_map(|b| b.2)
            .map(|m| m.offset)
            .max()
            .unwrap_or(-1);
        for (k, e) in &entries {
            self.keys.insert(k.clone(), e.clone());
        }
        if let Some(((_, p), _)) = entries.first()
            && high >= 0
        {
            self.note_end(*p, high);
        }
        self.history.push(HistOp::Import { entries, high });
        self.next_pos += 2;
        self.high = self.high.max(high);
    }

    pub fn entry(&self, key: &Key) -> Option<&ModelEntry> {
        self.keys.get(key)
    }
}

/// True when the engine's entry says exactly what the model's does.
pub fn same_entry(engine: &ProducerEntry, model: &ModelEntry) -> bool {
    let retained: Vec<_> = engine
        .retained_batches()
        .map(|b| (b.first_sequence, b.last_sequence, b.metadata))
        .collect();
    engine.epoch() == model.epoch
        && engine.last_sequence() == model.last
        && retained == model.retained.clone().unwrap_or_default()
}

/// True when the store's description of a key says what the model's
/// entry does, activity included.
pub fn same_info(info: &ProducerInfo, model: &ModelEntry) -> bool {
    same_entry(&info.entry, model) && info.last_activity == model.act
}
