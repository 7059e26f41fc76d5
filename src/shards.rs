//! The durable store's state: the engine's map split into shards.
//!
//! Shards exist for snapshots, not for locking: a snapshot encodes one
//! shard at a time under the store's lock, so an appender waits at most for
//! one shard's worth of encoding (a 256th of the state) instead of the whole.
//! A key's shard comes from bits of its hash that the hash tables do not use
//! for bucket selection.

use crate::batch::AppendRequest;
use crate::entry::ProducerEntry;
use crate::id::ProducerId;
use crate::map::{StateMap, hash_key};
use crate::outcome::BatchOutcome;

pub(crate) const SHARDS: usize = 256;

#[derive(Clone, Debug)]
pub(crate) struct Shards {
    maps: Vec<StateMap>,
}

impl Default for Shards {
    fn default() -> Self {
        Shards {
            maps: (0..SHARDS).map(|_| StateMap::default()).collect(),
        }
    }
}

/// The shard of a key with hash `hash`.
#[inline]
pub(crate) fn shard_of(hash: u64) -> usize {
    ((hash >> 40) as usize) % SHARDS
}

#[inline(always)]
fn append_to(map: &mut StateMap, hash: u64, r: &AppendRequest) -> BatchOutcome {
    map.append_hashed(
        hash,
        &r.producer_id,
        r.partition,
        r.epoch,
        r.first,
        r.last,
        r.metadata,
    )
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

impl Shards {
    #[inline]
    fn map(&self, hash: u64) -> &StateMap {
        &self.maps[shard_of(hash)]
    }

    /// Classifies an append and applies it if accepted.
    #[inline]
    pub(crate) fn append(&mut self, hash: u64, r: &AppendRequest) -> BatchOutcome {
        append_to(&mut self.maps[shard_of(hash)], hash, r)
    }

    /// See [`StateMap::contains_hashed`].
    #[inline(always)]
    pub(crate) fn contains(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.map(hash).contains_hashed(hash, id, partition)
    }

    pub(crate) fn get(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        self.map(hash).get_hashed(hash, id, partition)
    }

    /// Inserts an entry for a key that has none; false if the key exists.
    pub(crate) fn insert_new(
        &mut self,
        id: &ProducerId,
        partition: i32,
        e: &ProducerEntry,
    ) -> bool {
        let hash = hash_key(id, partition);
        self.maps[shard_of(hash)].insert_new_hashed(hash, id, partition, e)
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

    /// Sets the entry of the key with hash `hash`, replacing what was there.
    #[inline]
    pub(crate) fn install(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        e: &ProducerEntry,
    ) {
        self.maps[shard_of(hash)].insert_hashed(hash, id, partition, e);
    }

    pub(crate) fn len(&self) -> usize {
        self.maps.iter().map(StateMap::len).sum()
    }

    pub(crate) fn shard(&self, i: usize) -> &StateMap {
        &self.maps[i]
    }

    /// The shards below `at` and the rest, to work on from two threads.
    pub(crate) fn split_mut(&mut self, at: usize) -> (ShardsPart<'_>, ShardsPart<'_>) {
        let (low, high) = self.maps.split_at_mut(at.min(SHARDS));
        (
            ShardsPart {
                maps: low,
                first: 0,
            },
            ShardsPart {
                maps: high,
                first: at.min(SHARDS),
            },
        )
    }
}

/// A contiguous range of shards, borrowed from [`Shards::split_mut`].
pub(crate) struct ShardsPart<'a> {
    maps: &'a mut [StateMap],
    first: usize,
}

impl ShardsPart<'_> {
    /// Whether the key with hash `hash` lives in this part.
    #[inline]
    pub(crate) fn owns(&self, hash: u64) -> bool {
        (self.first..self.first + self.maps.len()).contains(&shard_of(hash))
    }

    /// [`Shards::append`] for a key this part owns.
    #[inline]
    pub(crate) fn append(&mut self, hash: u64, r: &AppendRequest) -> BatchOutcome {
        append_to(&mut self.maps[shard_of(hash) - self.first], hash, r)
    }

    /// [`Shards::contains`] for a key this part owns.
    #[inline]
    pub(crate) fn contains(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.maps[shard_of(hash) - self.first].contains_hashed(hash, id, partition)
    }
}
