//! Which keys a full table evicts: the least recently active.
//!
//! The order is total and depends on the state alone: a key's last
//! activity, then its producer id, then its partition (ids compare as
//! [`ProducerId`] does: numbers before names). So the victims of an
//! eviction are exactly determined by the state, whatever structure finds
//! them, and a store that recovered picks the same ones as one that never
//! stopped. (Replay does not pick at all: the log names the victims.)
//!
//! Finding them without a scan of the whole table per eviction, and
//! without a linked list through every slot (16 bytes more per key, about
//! 35 with the table's spare room): each shard keeps a sorted list of its
//! [`CANDIDATES`] least active keys, built by one scan of the shard, and a
//! bound: every key of the shard at or below the bound is in the list. An
//! eviction merges the shards' list heads. An entry whose key has since
//! been touched (its activity changed) or removed is stale and passed
//! over (a list is checked entry by entry only once a key of its shard
//! was touched or removed otherwise than by eviction: under churn, where
//! new keys come and the least active go, never); a key whose new
//! activity falls at or below its shard's bound (a batch with an old
//! timestamp, a clock set back) makes the list unusable, and the next
//! eviction rebuilds it. Under steady churn a shard's list lasts many
//! evictions: at 1M keys a rebuild scans about 4,000 keys' activities for
//! 256 victims (it finds the 256th least activity first, then builds only
//! the keys at or below it).
//!
//! Keys with records in flight are never victims: the caller excludes them.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::id::ProducerId;
use crate::map::{Activity, hash_key};
use crate::shards::{SHARDS, Shards};

/// Keys a shard's list holds when it is built.
const CANDIDATES: usize = 256;

/// Hashes a key's hash (already well mixed) to itself.
#[derive(Default)]
struct HashIsKey(u64);

impl Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A key in eviction order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cand {
    pub act: i64,
    pub id: ProducerId,
    pub partition: i32,
}

/// Whether (act, id, partition) sorts at or before `c`.
fn at_or_before(act: i64, id: &ProducerId, partition: i32, c: &Cand) -> bool {
    match act.cmp(&c.act) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => (id, partition) <= (&c.id, c.partition),
    }
}

#[derive(Default)]
struct ShardOrder {
    cands: VecDeque<Cand>,
    /// Every key of the shard at or before this is in `cands` (`None`
    /// with `built`: every key of the shard is).
    bound: Option<Cand>,
    built: bool,
    /// A key of the shard was touched or removed since the list was
    /// built: an entry may be stale, check each against the state.
    stale: bool,
}

impl ShardOrder {
    /// Lists the shard's least active keys, leaving out those `skip`
    /// says (victims already taken, keys in flight: these come back
    /// through [`Order::note`] when their records apply).
    fn rebuild(&mut self, map: &crate::shards::Map, skip: impl Fn(&ProducerId, i32) -> bool) {
        // First the activity at or below which the list's keys lie: the
        // CANDIDATES-th least of all (the skipped keys too, so the list may
        // come out shorter, which is fine), from the activities alone: no
        // key is built or compared for the thousands that do not qualify.
        let mut limit = i64::MAX;
        if map.len() > CANDIDATES {
            let mut acts: Vec<i64> = map.extras().map(Activity::ms).collect();
            let (_, nth, _) = acts.select_nth_unstable(CANDIDATES - 1);
            limit = *nth;
        }
        let collect = |limit: i64| -> Vec<Cand> {
            map.keys()
                .filter(|(id, partition, a)| a.ms() <= limit && !skip(id, *partition))
                .map(|(id, partition, a): (ProducerId, i32, Activity)| Cand {
                    act: a.ms(),
                    id,
                    partition,
                })
                .collect()
        };
        let mut all = collect(limit);
        if all.is_empty() && limit < i64::MAX {
            // Every key at or below it is skipped: list from all of them.
            limit = i64::MAX;
            all = collect(limit);
        }
        if limit < i64::MAX || all.len() > CANDIDATES {
            // Every key of the shard at or before the last listed one is
            // listed (or skipped).
            all.sort_unstable();
            all.truncate(CANDIDATES);
            self.bound = all.last().cloned();
        } else {
            all.sort_unstable();
            self.bound = None;
        }
        self.cands = all.into();
        self.built = true;
        self.stale = false;
    }
}

/// The eviction order of the whole state (see the module docs).
pub(crate) struct Order {
    shards: Vec<ShardOrder>,
}

impl Default for Order {
    fn default() -> Self {
        Order {
            shards: (0..SHARDS).map(|_| ShardOrder::default()).collect(),
        }
    }
}

impl Order {
    /// A key of shard `shard` now has activity `act`: it was created
    /// (`created`), or appended to or set.
    #[inline]
    pub(crate) fn note(
        &mut self,
        shard: usize,
        act: i64,
        id: &ProducerId,
        partition: i32,
        created: bool,
    ) {
        let Some(o) = self.shards.get_mut(shard) else {
            return;
        };
        if !o.built {
            return;
        }
        let inside = match &o.bound {
            None => true,
            Some(b) => at_or_before(act, id, partition, b),
        };
        if inside {
            o.built = false;
            o.cands.clear();
        } else if !created {
            // It may be in the list with its old activity.
            o.stale = true;
        }
    }

    /// A key of shard `shard` was removed otherwise than by an eviction
    /// this order chose: its entry, if it has one, is stale.
    #[inline]
    pub(crate) fn removed(&mut self, shard: usize) {
        if let Some(o) = self.shards.get_mut(shard) {
            o.stale = true;
        }
    }

    /// The next `n` victims in eviction order among the keys of `shards`
    /// that `excluded` does not rule out, least active first (fewer if
    /// the state holds fewer).
    pub(crate) fn victims(
        &mut self,
        shards: &Shards,
        n: usize,
        excluded: impl Fn(u64, &ProducerId, i32) -> bool,
    ) -> Vec<(u64, ProducerId, i32)> {
        let mut out: Vec<(u64, ProducerId, i32)> = Vec::new();
        if n == 0 {
            return out;
        }
        // The victims taken, by hash (confirmed against `out` on a match).
        let mut chosen: HashSet<u64, BuildHasherDefault<HashIsKey>> =
            HashSet::with_capacity_and_hasher(n.min(1 << 16), BuildHasherDefault::default());
        let mut heap = BinaryHeap::new();
        for (i, o) in self.shards.iter_mut().enumerate() {
            if shards.shard(i).len() == 0 {
                continue;
            }
            if !o.built || (o.cands.is_empty() && o.bound.is_some()) {
                o.rebuild(shards.shard(i), |id, p| excluded(hash_key(id, p), id, p));
            }
            if let Some(c) = o.cands.front() {
                heap.push(Reverse((c.clone(), i)));
            }
        }
        while out.len() < n {
            let Some(Reverse((c, i))) = heap.pop() else {
                break;
            };
            let Some(o) = self.shards.get_mut(i) else {
                break;
            };
            o.cands.pop_front();
            let hash = hash_key(&c.id, c.partition);
            let current = !o.stale || shards.activity(hash, &c.id, c.partition) == Some(c.act);
            if current && !excluded(hash, &c.id, c.partition) {
                chosen.insert(hash);
                out.push((hash, c.id, c.partition));
            }
            if o.cands.is_empty() && o.bound.is_some() {
                // The victims taken are still in the shard (they are
                // removed after this call): passed over, like keys in
                // flight.
                o.rebuild(shards.shard(i), |id, p| {
                    let h = hash_key(id, p);
                    let taken = chosen.contains(&h)
                        && out
                            .iter()
                            .any(|(oh, oid, op)| *oh == h && oid == id && *op == p);
                    taken || excluded(h, id, p)
                });
            }
            if let Some(f) = o.cands.front() {
                heap.push(Reverse((f.clone(), i)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::ProducerEntry;

    fn state(keys: &[(u64, i64)]) -> Shards {
        let mut s = Shards::default();
        let e = ProducerEntry::start(0, 0, 0, None);
        for &(k, act) in keys {
            let id = ProducerId::numeric(k);
            s.install(hash_key(&id, 0), &id, 0, &e, act);
        }
        s
    }

    /// The `n` least active keys, by sorting everything.
    fn expected(s: &Shards, n: usize, skip: &[u64]) -> Vec<u64> {
        let mut all: Vec<Cand> = (0..SHARDS)
            .flat_map(|i| {
                s.shard(i).keys().map(|(id, partition, a)| Cand {
                    act: a.ms(),
                    id,
                    partition,
                })
            })
            .filter(|c| !skip.contains(&c.id.as_numeric().unwrap_or(0)))
            .collect();
        all.sort();
        all.into_iter()
            .take(n)
            .map(|c| c.id.as_numeric().unwrap_or(0))
            .collect()
    }

    fn ids(v: &[(u64, ProducerId, i32)]) -> Vec<u64> {
        v.iter()
            .map(|(_, id, _)| id.as_numeric().unwrap_or(0))
            .collect()
    }

    #[test]
    fn victims_are_the_least_active_in_order_across_rebuilds() {
        // 100k keys, activities with many ties: the order falls back to ids.
        let keys: Vec<(u64, i64)> = (0..100_000u64)
            .map(|k| (k, ((k * 7919) % 5000) as i64))
            .collect();
        let mut s = state(&keys);
        let mut order = Order::default();
        for round in 0..40 {
            let want = expected(&s, 700, &[]);
            let got = order.victims(&s, 700, |_, _, _| false);
            assert_eq!(ids(&got), want, "round {round}");
            for (h, id, p) in got {
                assert!(s.remove(h, &id, p));
            }
        }
        assert_eq!(s.len(), 100_000 - 40 * 700);
    }

    #[test]
    fn touched_keys_and_excluded_keys_are_passed_over_and_old_activity_rebuilds() {
        let keys: Vec<(u64, i64)> = (0..5_000u64).map(|k| (k, k as i64)).collect();
        let mut s = state(&keys);
        let mut order = Order::default();
        // Build the lists (key 0 is in flight: passed over), then touch
        // the least active keys (newer).
        let first = order.victims(&s, 1, |_, id, _| id.as_numeric() == Some(0));
        assert_eq!(ids(&first), vec![1]);
        let e = ProducerEntry::start(0, 0, 1, None);
        for k in [0, 2, 3, 4, 5, 6, 7, 8, 9] {
            let id = ProducerId::numeric(k);
            let h = hash_key(&id, 0);
            s.install(h, &id, 0, &e, 100_000 + k as i64);
            order.note(
                crate::shards::shard_of(h),
                100_000 + k as i64,
                &id,
                0,
                false,
            );
        }
        let got = order.victims(&s, 5, |_, id, _| id.as_numeric() == Some(12));
        assert_eq!(ids(&got), vec![10, 11, 13, 14, 15]);
        // A key set back in time goes first: its shard's list is rebuilt.
        let id = ProducerId::numeric(4_999);
        let h = hash_key(&id, 0);
        s.install(h, &id, 0, &e, -1);
        order.note(crate::shards::shard_of(h), -1, &id, 0, false);
        assert_eq!(ids(&order.victims(&s, 1, |_, _, _| false)), vec![4_999]);
        assert_eq!(expected(&s, 1, &[]), vec![4_999]);
    }
}
