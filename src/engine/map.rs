//! The in-memory state map, laid out for millions of keys.
//!
//! A broker keeps one entry per (producer id, partition), so the bytes per
//! key decide how many producers fit in memory. A numeric key is one 24-byte
//! slot inside the hash table itself: producer id, partition, the entry's
//! [`Head`] (epoch, last sequence, window bookkeeping) and the index of the
//! key's retry window in a side arena. At 1M keys hashbrown's table has 2M
//! buckets, so a key costs about 2.1 x 25 = 52 bytes, plus 100 bytes for a
//! window when it has one. Classifying an append reads the slot only, and
//! accepting one only stores into the window, so a windowed key costs no
//! second dependent cache miss. Named keys live in a second table, so
//! numeric keys never pay for names.
//!
//! A slot may carry a small per-key extra (`X`): nothing for the in-memory
//! engine (its slot stays 24 bytes), the key's last activity for the
//! durable store (8 bytes, a 32-byte slot: about 17 bytes more per key at
//! 1M keys). Windows freed by removed keys are reused, and a table whose
//! removed keys' tombstones use up its room is rebuilt at its size rather
//! than grown, so a table whose keys come and go (expiration, eviction)
//! keeps the memory of the keys it holds.
//!
//! The slot kinds, the arena and the table operations written once for
//! both kinds are in `slot.rs`; the key's fixed hash in `hash.rs`.

use std::fmt::Debug;

use hashbrown::HashTable;

use crate::engine::entry::{Head, ProducerEntry, Window};
use crate::engine::hash::HashedKey;
pub(crate) use crate::engine::hash::{hash_key, hash_numeric};
pub(crate) use crate::engine::slot::{Activity, Apply, Ask, Decide, Decided, Extra};
use crate::engine::slot::{
    Arena, NO_WINDOW, NamedSlot, NumSlot, State, append_decided_in, append_in, insert_vacant_in,
    join_pid, split_pid, take_slot, upsert,
};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

/// Runs `$body` on the table of the key's kind, with `$table` bound to it
/// and `$key` to the key in that kind's terms
/// ([`SlotKey::Ref`](crate::engine::slot::SlotKey::Ref) and the partition):
/// the one dispatch between numeric and named keys, so each operation is
/// written once, generic over [`SlotKey`](crate::engine::slot::SlotKey).
macro_rules! by_kind {
    ($map:ident, $id:expr, $partition:expr, |$table:ident, $key:ident| $body:expr) => {
        match $id.as_numeric() {
            Some(pid) => {
                let $key = (split_pid(pid), $partition);
                let $table = &mut $map.numeric;
                $body
            }
            None => {
                let $key = ($id, $partition);
                let $table = &mut $map.named;
                $body
            }
        }
    };
    (ref $map:ident, $id:expr, $partition:expr, |$table:ident, $key:ident| $body:expr) => {
        match $id.as_numeric() {
            Some(pid) => {
                let $key = (split_pid(pid), $partition);
                let $table = &$map.numeric;
                $body
            }
            None => {
                let $key = ($id, $partition);
                let $table = &$map.named;
                $body
            }
        }
    };
}

/// Both tables and the window arena.
#[derive(Clone, Debug, Default)]
pub(crate) struct StateMap<X: Extra = ()> {
    numeric: HashTable<NumSlot<X>>,
    named: HashTable<NamedSlot<X>>,
    arena: Arena,
}

impl<X: Extra> StateMap<X> {
    /// Number of keys with state.
    pub(crate) fn len(&self) -> usize {
        self.numeric.len() + self.named.len()
    }

    /// Classifies an append and applies it when accepted.
    #[inline(always)]
    pub(crate) fn append(
        &mut self,
        id: &ProducerId,
        partition: i32,
        ask: Ask,
        how: Apply<X>,
    ) -> BatchOutcome {
        self.append_hashed(hash_key(id, partition), id, partition, ask, how)
    }

    /// [`StateMap::append`] with the key's hash already computed.
    #[inline(always)]
    pub(crate) fn append_hashed(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        ask: Ask,
        how: Apply<X>,
    ) -> BatchOutcome {
        by_kind!(self, id, partition, |table, key| append_in(
            table,
            &mut self.arena,
            hash,
            key,
            ask,
            how
        ))
    }

    /// Classifies an append by the caller's rules (`decide` sees the key's
    /// epoch and last sequence, whether it retains batches, and a lookup of
    /// its retained batches) and applies it in place, leaving `x` in the
    /// slot, when told to: one probe, as [`StateMap::append`] does for the
    /// strict rules.
    #[inline]
    pub(crate) fn append_decided(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        ask: Ask,
        x: X,
        decide: impl Decide,
    ) -> (BatchOutcome, Decided) {
        by_kind!(self, id, partition, |table, key| append_decided_in(
            table,
            &mut self.arena,
            hash,
            key,
            (ask, x),
            decide
        ))
    }

    /// The entry of one key.
    pub(crate) fn get(&self, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        self.get_hashed(hash_key(id, partition), id, partition)
    }

    /// Whether a key has state: a lookup that only reads the slot, which
    /// replay runs ahead of the appends to bring their slots into cache.
    #[inline(always)]
    pub(crate) fn contains_hashed(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        self.slot(hash, id, partition).is_some()
    }

    /// A key's state and extra.
    #[inline(always)]
    fn slot(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<(State, X)> {
        by_kind!(ref self, id, partition, |table, key| table
            .find(hash, |s| s.is(key))
            .map(|s| (s.st, s.x)))
    }

    /// [`StateMap::get`] with the key's hash already computed.
    pub(crate) fn get_hashed(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<ProducerEntry> {
        self.get_full(hash, id, partition).map(|(e, _)| e)
    }

    /// A key's entry and extra, with its hash already computed.
    pub(crate) fn get_full(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<(ProducerEntry, X)> {
        let (st, x) = self.slot(hash, id, partition)?;
        Some((st.to_entry(&self.arena), x))
    }

    /// Sets one key's entry and extra, replacing what was there (the
    /// durable store installing what an accepted append computed), with
    /// the key's hash already computed. True if the key is new.
    #[inline]
    pub(crate) fn insert_hashed(&mut self, k: HashedKey<'_>, entry: &ProducerEntry, x: X) -> bool {
        by_kind!(self, k.id, k.partition, |table, key| upsert(
            table,
            &mut self.arena,
            k.hash,
            key,
            entry,
            x
        ))
    }

    /// Removes a key (its window is freed for reuse); false if it had no
    /// state.
    pub(crate) fn remove_hashed(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        let Some(st) = by_kind!(self, id, partition, |table, key| take_slot(
            table, hash, key
        )) else {
            return false;
        };
        self.arena.release(st.win);
        true
    }

    /// Makes room for `keys` more keys and `windows` more windows, so that
    /// loading a snapshot never rehashes or moves the arena.
    pub(crate) fn reserve(&mut self, keys: usize, windows: usize) {
        self.numeric
            .reserve(keys, |s| hash_numeric(join_pid(s.key), s.partition));
        self.arena.windows.reserve(windows);
    }

    /// Inserts the entry of a key that has none, with its hash already
    /// computed, in one probe of the table; false (and nothing changed) if
    /// the key exists. Loading a snapshot inserts in the order the writer's
    /// table held its keys, so consecutive inserts land in neighbouring
    /// buckets: the table is filled front to back, not at random.
    #[inline]
    pub(crate) fn insert_new_hashed(
        &mut self,
        k: HashedKey<'_>,
        entry: &ProducerEntry,
        x: X,
    ) -> bool {
        self.insert_vacant(k, x, |arena| State::from_entry(entry, arena))
    }

    /// The one probe of [`StateMap::insert_new_hashed`] and
    /// [`StateMap::load_new`]: inserts the key with the state `st` makes
    /// (called only if the key is absent, with the arena), or returns false
    /// and changes nothing (a named id is cloned only once the key is known
    /// to be new).
    #[inline(always)]
    fn insert_vacant(
        &mut self,
        k: HashedKey<'_>,
        x: X,
        st: impl FnOnce(&mut Arena) -> State,
    ) -> bool {
        by_kind!(self, k.id, k.partition, |table, key| insert_vacant_in(
            table,
            &mut self.arena,
            k.hash,
            key,
            (x, st)
        ))
    }

    /// Inserts a key that `decode` reads with its window written straight
    /// into a fresh slot of the arena (loading a snapshot: an entry decoded
    /// on the stack was copied twice on its way there, 112 bytes a key).
    /// `decode` gets [`Window::EMPTY`] and returns the key's hash, key,
    /// head and extra, and a value passed back; the slot is given back if
    /// the key has no window, is already in the map (`false`, nothing
    /// else changed) or `decode` fails.
    #[inline]
    pub(crate) fn load_new<T, E>(
        &mut self,
        decode: impl FnOnce(&mut Window) -> Result<(u64, ProducerId, i32, Head, X, T), E>,
    ) -> Result<(bool, T), E> {
        let windows = &mut self.arena.windows;
        let slot = u32::try_from(windows.len())
            .ok()
            .filter(|&i| i != NO_WINDOW)
            .expect("more than 2^32 - 1 retry windows in one map");
        windows.push(Window::EMPTY);
        let decoded = match windows.last_mut() {
            Some(w) => decode(w),
            None => unreachable!("a window was just pushed"),
        };
        let (hash, id, partition, head, x, t) = match decoded {
            Ok(d) => d,
            Err(e) => {
                windows.pop();
                return Err(e);
            }
        };
        let win = if head.windowed() {
            slot
        } else {
            windows.pop();
            NO_WINDOW
        };
        let st = State { head, win };
        let new = self.insert_vacant(HashedKey::hashed(hash, &id, partition), x, |_| st);
        if !new && win != NO_WINDOW {
            self.arena.windows.pop();
        }
        Ok((new, t))
    }

    /// Removes one key, returning its entry (its window is freed for
    /// reuse).
    pub(crate) fn remove(&mut self, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        let hash = hash_key(id, partition);
        let st = by_kind!(self, id, partition, |table, key| take_slot(
            table, hash, key
        ))?;
        let entry = st.to_entry(&self.arena);
        self.arena.release(st.win);
        Some(entry)
    }

    /// Keeps only the keys for which `keep` is true (the windows of the
    /// others are freed for reuse).
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&ProducerId, i32, &ProducerEntry) -> bool,
    ) {
        let a = &self.arena;
        let mut freed = Vec::new();
        self.numeric.retain(|s| {
            let id = ProducerId::numeric(join_pid(s.key));
            let kept = keep(&id, s.partition, &s.st.to_entry(a));
            if !kept {
                freed.push(s.st.win);
            }
            kept
        });
        self.named.retain(|s| {
            let kept = keep(&s.key, s.partition, &s.st.to_entry(a));
            if !kept {
                freed.push(s.st.win);
            }
            kept
        });
        for win in freed {
            self.arena.release(win);
        }
    }

    /// Every key and its entry, numeric keys first, otherwise in no
    /// particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        self.iter_full().map(|(id, p, e, _)| (id, p, e))
    }

    /// [`StateMap::iter`] with each key's extra.
    pub(crate) fn iter_full(
        &self,
    ) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry, X)> + '_ {
        let a = &self.arena;
        let numeric = self.numeric.iter().map(move |s| {
            (
                ProducerId::numeric(join_pid(s.key)),
                s.partition,
                s.st.to_entry(a),
                s.x,
            )
        });
        let named = self
            .named
            .iter()
            .map(move |s| (s.key.clone(), s.partition, s.st.to_entry(a), s.x));
        numeric.chain(named)
    }

    /// Every key with its head and window by reference (in the arena,
    /// not copied out: what a snapshot encodes; an entry's copy was a
    /// `memcpy` call per key) and its extra.
    #[inline]
    pub(crate) fn for_each_raw(&self, mut f: impl FnMut(&ProducerId, i32, &Head, &Window, X)) {
        let a = &self.arena;
        let window = |st: &State| {
            if st.head.windowed() {
                a.windows.get(st.win as usize).unwrap_or(&Window::EMPTY)
            } else {
                &Window::EMPTY
            }
        };
        for s in self.numeric.iter() {
            let id = ProducerId::numeric(join_pid(s.key));
            f(&id, s.partition, &s.st.head, window(&s.st), s.x);
        }
        for s in self.named.iter() {
            f(&s.key, s.partition, &s.st.head, window(&s.st), s.x);
        }
    }

    /// Hands `f` every key's extra with the key's hash, of the keys whose
    /// extra `keep` accepts, without building ids or entries: what the
    /// eviction order ranks keys by (one pass over the slots; the hash, for
    /// a numeric key one multiply, computed for the kept keys alone). Plain
    /// loops rather than a chain of iterator adapters collected into a
    /// vector: about a third of the instructions a list rebuild took.
    #[inline]
    pub(crate) fn for_each_extra_hashed(
        &self,
        keep: impl Fn(X) -> bool,
        mut f: impl FnMut(X, u64),
    ) {
        for s in self.numeric.iter() {
            if keep(s.x) {
                f(s.x, hash_numeric(join_pid(s.key), s.partition));
            }
        }
        for s in self.named.iter() {
            if keep(s.x) {
                f(s.x, hash_key(&s.key, s.partition));
            }
        }
    }

    /// The keys whose hash is `hash`, with their extras, numeric keys
    /// first: usually one or none (more only for keys that share a 64-bit
    /// hash). One probe of each table, as a lookup.
    pub(crate) fn keys_with_hash(
        &self,
        hash: u64,
    ) -> impl Iterator<Item = (ProducerId, i32, X)> + '_ {
        let numeric = self
            .numeric
            .iter_hash(hash)
            .filter(move |s| hash_numeric(join_pid(s.key), s.partition) == hash)
            .map(|s| (ProducerId::numeric(join_pid(s.key)), s.partition, s.x));
        let named = self
            .named
            .iter_hash(hash)
            .filter(move |s| hash_key(&s.key, s.partition) == hash)
            .map(|s| (s.key.clone(), s.partition, s.x));
        numeric.chain(named)
    }

    /// Removes every key whose hash is `hash` and whose extra and key
    /// `take` accepts, handing each to `removed`, numeric keys first (their
    /// windows are freed for reuse); returns how many went. One probe of a
    /// table per key found and one that finds none: the eviction of a
    /// victim known by its hash and activity, where looking it up
    /// ([`StateMap::keys_with_hash`]) and then removing it by key would
    /// probe twice and build the key twice.
    pub(crate) fn remove_with_hash(
        &mut self,
        hash: u64,
        take: impl Fn(&ProducerId, i32, X) -> bool,
        mut removed: impl FnMut(ProducerId, i32),
    ) -> usize {
        let mut n = 0;
        while let Ok(e) = self.numeric.find_entry(hash, |s| {
            hash_numeric(join_pid(s.key), s.partition) == hash
                && take(&ProducerId::numeric(join_pid(s.key)), s.partition, s.x)
        }) {
            let (s, _) = e.remove();
            self.arena.release(s.st.win);
            removed(ProducerId::numeric(join_pid(s.key)), s.partition);
            n += 1;
        }
        if self.named.is_empty() {
            return n;
        }
        while let Ok(e) = self.named.find_entry(hash, |s| {
            hash_key(&s.key, s.partition) == hash && take(&s.key, s.partition, s.x)
        }) {
            let (s, _) = e.remove();
            self.arena.release(s.st.win);
            removed(s.key, s.partition);
            n += 1;
        }
        n
    }

    /// The first bucket of the numeric table whose control byte matches
    /// `hash`: the control bytes of a lookup, without its slot. With
    /// [`StateMap::touch`], a lookup split in two so that a loop over many
    /// keys keeps many cache misses in flight (`Shards::warm_hashes`).
    #[inline(always)]
    pub(crate) fn probe(&self, hash: u64) -> Option<usize> {
        // An equality that reads nothing: the slot stays out of it.
        self.numeric.find_bucket_index(hash, |_| true)
    }

    /// Reads the numeric slot at `bucket`, if any: the second half of a
    /// split lookup. Both ends of it: a 32-byte slot is not aligned to 32
    /// bytes (the table's allocation is aligned to 16), so half of them
    /// straddle two cache lines.
    #[inline(always)]
    pub(crate) fn touch(&self, bucket: usize) -> u32 {
        self.numeric
            .get_bucket(bucket)
            .map_or(0, |s| s.key[0] ^ s.st.win)
    }

    /// The ids of `partition`'s keys, numeric first: one pass over the
    /// slots that builds nothing for another partition's key (a
    /// partition's view in a store of many).
    pub(crate) fn ids_of(&self, partition: i32) -> Vec<ProducerId> {
        let numeric = self
            .numeric
            .iter()
            .filter(|s| s.partition == partition)
            .map(|s| ProducerId::numeric(join_pid(s.key)));
        let named = self
            .named
            .iter()
            .filter(|s| s.partition == partition)
            .map(|s| s.key.clone());
        numeric.chain(named).collect()
    }

    /// Every key with its extra.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (ProducerId, i32, X)> + '_ {
        let numeric = self
            .numeric
            .iter()
            .map(|s| (ProducerId::numeric(join_pid(s.key)), s.partition, s.x));
        let named = self.named.iter().map(|s| (s.key.clone(), s.partition, s.x));
        numeric.chain(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::batch::BatchMetadata;
    use crate::outcome::AppendOutcome;

    #[test]
    fn slots_are_as_small_as_designed() {
        assert_eq!(std::mem::size_of::<NumSlot<()>>(), 24);
        assert_eq!(std::mem::align_of::<NumSlot<()>>(), 4);
        assert_eq!(std::mem::size_of::<NumSlot<Activity>>(), 32);
        assert_eq!(std::mem::align_of::<NumSlot<Activity>>(), 4);
        assert_eq!(std::mem::size_of::<State>(), 12);
    }

    #[test]
    fn a_table_whose_keys_come_and_go_keeps_its_size() {
        // 3,900 live keys (just over half of the 8,192-bucket table's
        // capacity, as a shard of a store capped at 1M keys), replaced one
        // by one 100,000 times: the erased keys' tombstones use up the
        // table's room; hashbrown alone would double it, the rebuild keeps
        // it (and the keys).
        let mut m: StateMap<Activity> = StateMap::default();
        let e = ProducerEntry::start(0, 0, 0, None);
        let id = |k: u64| ProducerId::from(k);
        let put = |m: &mut StateMap<Activity>, k: u64| {
            assert!(m.insert_hashed(HashedKey::new(&id(k), 0), &e, Activity::new(k as i64)));
        };
        for k in 0..3_900 {
            put(&mut m, k);
        }
        let size = m.numeric.allocation_size();
        for k in 3_900..103_900u64 {
            let old = k - 3_900;
            assert!(m.remove_hashed(hash_key(&id(old), 0), &id(old), 0));
            put(&mut m, k);
            assert!(m.numeric.allocation_size() <= size, "grew at {k}");
        }
        assert_eq!(m.len(), 3_900);
        for k in 100_000..103_900u64 {
            assert_eq!(m.get(&id(k), 0), Some(e));
        }
        // Live keys that do fill it still grow it.
        for k in 200_000..210_000 {
            put(&mut m, k);
        }
        assert!(m.numeric.allocation_size() > size);
        assert_eq!(m.len(), 13_900);
    }

    #[test]
    fn numeric_and_named_keys_are_independent() {
        let mut m: StateMap = StateMap::default();
        let n = ProducerId::from(7u64);
        let s = ProducerId::from("7");
        assert!(
            m.append(&n, 0, Ask::single(0, 0), Apply::default())
                .is_accepted()
        );
        assert_eq!(
            m.append(&s, 0, Ask::single(0, 1), Apply::default())
                .outcome(),
            AppendOutcome::OutOfOrder
        );
        assert!(
            m.append(&s, 0, Ask::single(0, 0), Apply::default())
                .is_accepted()
        );
        assert!(
            m.append(&n, 0, Ask::single(0, 1), Apply::default())
                .is_accepted()
        );
        assert_eq!(m.get(&n, 0).map(|e| e.last_sequence()), Some(1));
        assert_eq!(m.get(&s, 0).map(|e| e.last_sequence()), Some(0));
        assert_eq!(m.get(&n, 1), None);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn a_plain_key_gets_a_window_with_its_first_batch() {
        let mut m: StateMap = StateMap::default();
        let id = ProducerId::from(1u64);
        let meta = Some(BatchMetadata {
            offset: 10,
            timestamp: 20,
        });
        assert!(
            m.append(&id, 3, Ask::single(0, 0), Apply::default())
                .is_accepted()
        );
        assert!(
            m.append(
                &id,
                3,
                Ask {
                    epoch: 0,
                    first: 1,
                    last: 4,
                    meta
                },
                Apply::default()
            )
            .is_accepted()
        );
        let e = m.get(&id, 3).unwrap();
        assert_eq!(e.last_sequence(), 4);
        assert_eq!(e.retained_batches().len(), 1);
        assert_eq!(
            m.append(&id, 3, Ask::new(0, 1, 4, None), Apply::default()),
            BatchOutcome::Duplicate { original: meta }
        );
        // A single append on a windowed key is retained without metadata.
        assert!(
            m.append(&id, 3, Ask::single(0, 5), Apply::default())
                .is_accepted()
        );
        assert_eq!(m.get(&id, 3).unwrap().retained_batches().len(), 2);
        // A new session drops the old epoch's batches.
        assert!(
            m.append(&id, 3, Ask::single(1, 0), Apply::default())
                .is_accepted()
        );
        let e = m.get(&id, 3).unwrap();
        assert_eq!((e.epoch(), e.last_sequence()), (1, 0));
        assert_eq!(e.retained_batches().collect::<Vec<_>>().len(), 1);
    }

    #[test]
    fn insert_new_adds_only_absent_keys_and_iter_sees_everything() {
        let mut m: StateMap = StateMap::default();
        for pid in 0..1000u64 {
            assert!(
                m.append(
                    &ProducerId::from(pid),
                    (pid % 7) as i32,
                    Ask::single(0, 0),
                    Apply::default()
                )
                .is_accepted()
            );
        }
        let e = ProducerEntry::from_parts(9, 77, &[]).unwrap();
        let insert = |m: &mut StateMap, id: ProducerId, p: i32| {
            m.insert_new_hashed(HashedKey::new(&id, p), &e, ())
        };
        let before = m.get(&ProducerId::from(5u64), 5);
        assert!(!insert(&mut m, ProducerId::from(5u64), 5), "the key exists");
        assert_eq!(m.get(&ProducerId::from(5u64), 5), before);
        assert!(insert(&mut m, ProducerId::from(5u64), 6));
        assert!(insert(&mut m, ProducerId::from("new"), 1));
        assert!(!insert(&mut m, ProducerId::from("new"), 1));
        assert_eq!(m.get(&ProducerId::from(5u64), 6), Some(e));
        assert_eq!(m.len(), 1002);
        assert_eq!(m.iter().count(), 1002);
        assert_eq!(m.iter().filter(|(_, _, x)| *x == e).count(), 2);
    }
}
