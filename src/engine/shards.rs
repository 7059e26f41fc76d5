//! The durable store's state: the engine's map split into shards, each key
//! with its last activity.
//!
//! Shards exist for snapshots, not for locking: a snapshot encodes one
//! shard at a time under the store's lock, so an appender waits at most for
//! one shard's worth of encoding (a 256th of the state) instead of the whole.
//! A key's shard comes from bits of its hash that the hash tables do not use
//! for bucket selection. An expiration sweep works shard by shard too.
//!
//! Each shard also counts its keys per partition, so that a partition's
//! listing or removal reads only the shards that hold some of its keys
//! (for a partition with few producers among many, a few shards instead of
//! the whole state). The counts change only when a key comes or goes.

use hashbrown::HashTable;

use crate::batch::AppendRequest;
use crate::engine::entry::{Head, ProducerEntry, Window};
use crate::engine::hash::HashedKey;
use crate::engine::info::ProducerInfo;
use crate::engine::map::{Activity, Apply, Ask, StateMap};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

pub(crate) const SHARDS: usize = 256;

/// The map of one shard.
pub(crate) type Map = StateMap<Activity>;

/// Keys per partition in one shard.
#[derive(Clone, Debug, Default)]
pub(crate) struct PartitionCounts(HashTable<(i32, u32)>);

#[inline]
fn hash_partition(p: i32) -> u64 {
    u64::from(p as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl PartitionCounts {
    #[inline]
    fn add(&mut self, p: i32) {
        self.add_n(p, 1);
    }

    /// Counts `n` more keys of partition `p`.
    #[inline]
    fn add_n(&mut self, p: i32, n: u32) {
        let h = hash_partition(p);
        match self.0.find_mut(h, |e| e.0 == p) {
            Some(e) => e.1 += n,
            None => {
                self.0.insert_unique(h, (p, n), |e| hash_partition(e.0));
            }
        }
    }

    #[inline]
    fn sub(&mut self, p: i32) {
        if let Ok(mut e) = self.0.find_entry(hash_partition(p), |e| e.0 == p) {
            if e.get().1 <= 1 {
                e.remove();
            } else {
                e.get_mut().1 -= 1;
            }
        }
    }

    fn get(&self, p: i32) -> u32 {
        self.0
            .find(hash_partition(p), |e| e.0 == p)
            .map_or(0, |e| e.1)
    }
}

/// One shard of a [`Shards`], borrowed apart from the others.
pub(crate) struct ShardMut<'a> {
    map: &'a mut Map,
    parts: &'a mut PartitionCounts,
}

impl ShardMut<'_> {
    /// Inserts an entry for a key of this shard that has none; false if
    /// the key exists.
    #[inline]
    pub(crate) fn insert_new(&mut self, k: HashedKey<'_>, e: &ProducerEntry, act: i64) -> bool {
        let new = self.map.insert_new_hashed(k, e, Activity::new(act));
        self.count_new(k.partition, new)
    }

    /// Sets the entry and activity of a key of this shard, replacing what
    /// was there; true if the key is new.
    #[inline]
    pub(crate) fn install(&mut self, k: HashedKey<'_>, e: &ProducerEntry, act: i64) -> bool {
        let new = self.map.insert_hashed(k, e, Activity::new(act));
        self.count_new(k.partition, new)
    }

    /// Classifies and applies an append in this shard, counting a new key;
    /// also says whether the key is new.
    #[inline(always)]
    fn append(
        &mut self,
        hash: u64,
        r: &AppendRequest,
        how: Apply<Activity>,
    ) -> (BatchOutcome, bool) {
        let before = self.map.len();
        let o = self
            .map
            .append_hashed(hash, &r.producer_id, r.partition, Ask::of(r), how);
        let created = self.map.len() != before;
        (o, self.count_new(r.partition, created))
    }

    /// Counts a key of `partition` when `new` says it was just created;
    /// gives `new` back.
    #[inline(always)]
    fn count_new(&mut self, partition: i32, new: bool) -> bool {
        if new {
            self.parts.add(partition);
        }
        new
    }

    /// Removes a key of this shard; false if it had no state.
    #[inline]
    fn remove(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        let removed = self.map.remove_hashed(hash, id, partition);
        if removed {
            self.parts.sub(partition);
        }
        removed
    }
}

impl ShardMut<'_> {
    /// [`StateMap::load_new`] in this shard, with the key's activity:
    /// inserts a key decoded straight into the shard's window arena. The
    /// key is not counted in its partition: the caller counts a run of
    /// keys of one partition at once ([`ShardMut::count_loaded`]; a
    /// snapshot's block mostly holds long runs, and a count is a probe).
    #[inline]
    pub(crate) fn load_new<T, E>(
        &mut self,
        decode: impl FnOnce(&mut Window) -> Result<(u64, ProducerId, i32, Head, i64, T), E>,
    ) -> Result<(bool, T), E> {
        self.map.load_new(|w| {
            decode(w).map(|(hash, id, partition, head, act, t)| {
                (hash, id, partition, head, Activity::new(act), t)
            })
        })
    }

    /// Counts `n` keys of partition `p` inserted by
    /// [`ShardMut::load_new`].
    #[inline]
    pub(crate) fn count_loaded(&mut self, p: i32, n: u32) {
        if n > 0 {
            self.parts.add_n(p, n);
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Shards {
    maps: Vec<Map>,
    parts: Vec<PartitionCounts>,
}

impl Default for Shards {
    fn default() -> Self {
        Shards {
            maps: (0..SHARDS).map(|_| Map::default()).collect(),
            parts: (0..SHARDS).map(|_| PartitionCounts::default()).collect(),
        }
    }
}

/// The shard of a key with hash `hash`.
#[inline]
pub(crate) fn shard_of(hash: u64) -> usize {
    ((hash >> 40) as usize) % SHARDS
}

/// Looks every key of `keys` (hash, request) up in `contains` once, so
/// that the loop that then applies them finds their slots in cache. For
/// keys spread over a table larger than the caches, each lookup is two
/// dependent cache misses; a loop that only looks up keeps many of them in
/// flight at once, where the apply loop, with more work per key, keeps
/// few. Measured on 1M random keys: about a quarter off each append.
#[inline]
pub(crate) fn warm<'r>(
    keys: impl Iterator<Item = (u64, &'r AppendRequest)>,
    contains: impl Fn(u64, &AppendRequest) -> bool,
) {
    let found = keys.filter(|&(hash, r)| contains(hash, r)).count();
    std::hint::black_box(found);
}

/// Keys whose slots [`Shards::warm_hashes`] looks up at once: enough
/// to keep the core's outstanding misses busy, few enough that the slots
/// are still in L1 when the loop after it reads them.
pub(crate) const WARM_CHUNK: usize = 32;

impl Shards {
    /// Classifies an append and applies it (with its activity) if
    /// accepted; also says whether it created the key.
    #[inline]
    pub(crate) fn append(
        &mut self,
        hash: u64,
        r: &AppendRequest,
        how: Apply<Activity>,
    ) -> (BatchOutcome, bool) {
        self.shard_mut(hash).append(hash, r, how)
    }

    pub(crate) fn get(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        self.map(hash).get_hashed(hash, id, partition)
    }

    /// A key's entry and last activity.
    pub(crate) fn get_full(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<(ProducerEntry, i64)> {
        self.map(hash)
            .get_full(hash, id, partition)
            .map(|(e, a)| (e, a.ms()))
    }

    /// A key's last activity.
    #[cfg(test)]
    pub(crate) fn activity(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<i64> {
        self.get_full(hash, id, partition).map(|(_, a)| a)
    }

    /// Inserts an entry for a key that has none; false if the key exists.
    #[inline]
    pub(crate) fn insert_new(&mut self, k: HashedKey<'_>, e: &ProducerEntry, act: i64) -> bool {
        self.shard_mut(k.hash).insert_new(k, e, act)
    }

    /// Sets the entry and activity of a key, replacing what was there;
    /// true if the key is new.
    #[inline]
    pub(crate) fn install(&mut self, k: HashedKey<'_>, e: &ProducerEntry, act: i64) -> bool {
        self.shard_mut(k.hash).install(k, e, act)
    }

    /// Every shard apart, in order, so that threads can fill different
    /// shards at once (loading a snapshot).
    pub(crate) fn shards_mut(&mut self) -> impl Iterator<Item = ShardMut<'_>> {
        self.maps
            .iter_mut()
            .zip(self.parts.iter_mut())
            .map(|(map, parts)| ShardMut { map, parts })
    }

    /// A state with room for `keys` keys, `windows` of them with a
    /// window, spread evenly over the shards (plus a margin for the
    /// spread), so that loading them neither rehashes a table nor moves a
    /// window arena.
    pub(crate) fn with_capacity(keys: u64, windows: u64) -> Shards {
        let per = |n: u64| {
            let n = usize::try_from(n).unwrap_or(usize::MAX) / SHARDS;
            // A shard's share varies by a few standard deviations (sqrt n).
            n + n.isqrt() * 4 + 16
        };
        let mut s = Shards::default();
        for m in &mut s.maps {
            m.reserve(per(keys), per(windows));
        }
        s
    }

    /// Removes the keys with hash `hash` that `take` accepts (see
    /// [`StateMap::remove_with_hash`]), pushing each onto `out`.
    #[inline]
    pub(crate) fn remove_with_hash(
        &mut self,
        hash: u64,
        take: impl Fn(&ProducerId, i32, Activity) -> bool,
        out: &mut Vec<(u64, ProducerId, i32)>,
    ) -> usize {
        let s = shard_of(hash);
        let parts = &mut self.parts[s];
        self.maps[s].remove_with_hash(hash, take, |id, p| {
            parts.sub(p);
            out.push((hash, id, p));
        })
    }

    /// Brings the slots of the (numeric) keys with these hashes into
    /// cache: first every key's control bytes, then every slot. A lookup
    /// reads the slot only once its control bytes are in, and a loop of
    /// lookups, whose branches depend on what they read, keeps only a few
    /// of these misses in flight; here each pass is a run of independent
    /// loads. Called on at most [`WARM_CHUNK`] hashes at a time.
    pub(crate) fn warm_hashes(&self, hashes: &[u64]) {
        let mut buckets = [None; WARM_CHUNK];
        for (b, &h) in buckets.iter_mut().zip(hashes) {
            *b = self.map(h).probe(h);
        }
        let mut sum = 0u32;
        for (b, &h) in buckets.iter().zip(hashes) {
            if let Some(b) = *b {
                sum = sum.wrapping_add(self.map(h).touch(b));
            }
        }
        std::hint::black_box(sum);
    }

    pub(crate) fn len(&self) -> usize {
        self.maps.iter().map(Map::len).sum()
    }

    pub(crate) fn shard(&self, i: usize) -> &Map {
        &self.maps[i]
    }

    /// How many keys of `partition` shard `i` holds.
    pub(crate) fn partition_count(&self, i: usize, partition: i32) -> u32 {
        self.parts[i].get(partition)
    }

    /// Every key of shard `i` with its state.
    pub(crate) fn infos(&self, i: usize) -> impl Iterator<Item = ProducerInfo> + '_ {
        self.maps[i]
            .iter_full()
            .map(|(producer_id, partition, entry, a)| ProducerInfo {
                producer_id,
                partition,
                entry,
                last_activity: a.ms(),
            })
    }

    /// The shards below `at` and the rest, to work on from two threads.
    pub(crate) fn split_mut(&mut self, at: usize) -> (ShardsPart<'_>, ShardsPart<'_>) {
        let at = at.min(SHARDS);
        let (low, high) = self.maps.split_at_mut(at);
        let (plow, phigh) = self.parts.split_at_mut(at);
        (
            ShardsPart {
                maps: low,
                parts: plow,
                first: 0,
            },
            ShardsPart {
                maps: high,
                parts: phigh,
                first: at,
            },
        )
    }
}

/// A contiguous range of shards, borrowed from [`Shards::split_mut`].
pub(crate) struct ShardsPart<'a> {
    maps: &'a mut [Map],
    parts: &'a mut [PartitionCounts],
    first: usize,
}

/// Shards a key's hash leads into: the whole [`Shards`] or a
/// [`ShardsPart`]. What replay does to one key is written once, over the
/// shard that holds it.
pub(crate) trait KeyTarget {
    /// The shard of the key with hash `hash`.
    fn shard_mut(&mut self, hash: u64) -> ShardMut<'_>;

    /// The map of the shard of the key with hash `hash`.
    fn map(&self, hash: u64) -> &Map;

    /// Classifies an append and applies it (with its activity) if
    /// accepted.
    #[inline]
    fn apply(&mut self, hash: u64, r: &AppendRequest, how: Apply<Activity>) -> BatchOutcome {
        self.shard_mut(hash).append(hash, r, how).0
    }

    /// Sets a key's entry and activity, replacing what was there.
    fn install_info(&mut self, hash: u64, i: &ProducerInfo) {
        let k = HashedKey::hashed(hash, &i.producer_id, i.partition);
        self.shard_mut(hash).install(k, &i.entry, i.last_activity);
    }

    /// Removes a key; false if it had no state.
    fn remove(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.shard_mut(hash).remove(hash, id, partition)
    }

    /// See [`StateMap::contains_hashed`].
    #[inline(always)]
    fn contains(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.map(hash).contains_hashed(hash, id, partition)
    }
}

impl KeyTarget for Shards {
    #[inline(always)]
    fn shard_mut(&mut self, hash: u64) -> ShardMut<'_> {
        let s = shard_of(hash);
        ShardMut {
            map: &mut self.maps[s],
            parts: &mut self.parts[s],
        }
    }

    #[inline(always)]
    fn map(&self, hash: u64) -> &Map {
        &self.maps[shard_of(hash)]
    }
}

impl ShardsPart<'_> {
    /// Whether the key with hash `hash` lives in this part.
    #[inline]
    pub(crate) fn owns(&self, hash: u64) -> bool {
        (self.first..self.first + self.maps.len()).contains(&shard_of(hash))
    }
}

impl KeyTarget for ShardsPart<'_> {
    #[inline(always)]
    fn shard_mut(&mut self, hash: u64) -> ShardMut<'_> {
        let s = shard_of(hash) - self.first;
        ShardMut {
            map: &mut self.maps[s],
            parts: &mut self.parts[s],
        }
    }

    #[inline(always)]
    fn map(&self, hash: u64) -> &Map {
        &self.maps[shard_of(hash) - self.first]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::hash::hash_key;
    use crate::engine::rules::UnknownProducer;

    #[test]
    fn partition_counts_follow_keys_coming_and_going() {
        let mut s = Shards::default();
        let how = Apply {
            unknown: UnknownProducer::RequireZero,
            x: Activity::new(5),
        };
        for k in 0..2000u64 {
            let r = AppendRequest::single(k, (k % 3) as i32, 0, 0);
            let (o, created) = s.append(hash_key(&r.producer_id, r.partition), &r, how);
            assert!(o.is_accepted() && created);
            // A second append changes no count.
            let r = AppendRequest::single(k, (k % 3) as i32, 0, 1);
            let (o, created) = s.append(hash_key(&r.producer_id, r.partition), &r, how);
            assert!(o.is_accepted() && !created);
        }
        let count = |s: &Shards, p| (0..SHARDS).map(|i| s.partition_count(i, p)).sum::<u32>();
        assert_eq!((count(&s, 0), count(&s, 1), count(&s, 2)), (667, 667, 666));
        for k in (0..2000u64).step_by(3) {
            let id = ProducerId::numeric(k);
            assert!(s.remove(hash_key(&id, 0), &id, 0));
            assert!(!s.remove(hash_key(&id, 0), &id, 0));
        }
        assert_eq!(count(&s, 0), 0);
        let id = ProducerId::named("n");
        let e = ProducerEntry::start(0, 0, 0, None);
        s.install(HashedKey::new(&id, 9), &e, 1);
        s.install(HashedKey::new(&id, 9), &e, 2);
        assert_eq!(count(&s, 9), 1);
        assert_eq!(s.activity(hash_key(&id, 9), &id, 9), Some(2));
        assert_eq!(s.len(), 1334);
        // The shards that hold none of a partition say so.
        assert!((0..SHARDS).filter(|&i| s.partition_count(i, 9) > 0).count() == 1);
    }
}
