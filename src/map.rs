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
//! The hash is fixed (no random seed): the layout and the benchmarks are
//! reproducible, and producer ids are handed out by the broker, not chosen
//! by clients, so hash flooding is not the threat model here.

use hashbrown::HashTable;

use crate::batch::BatchMetadata;
use crate::entry::{Head, ProducerEntry, Window};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::rules::{self, Current};

/// No window: the key only used single-sequence appends.
const NO_WINDOW: u32 = u32::MAX;

/// A key's state inside a slot: the head the rules read, and the index of
/// the key's window in the arena (or `NO_WINDOW`). 12 bytes.
#[derive(Clone, Copy, Debug)]
struct State {
    head: Head,
    win: u32,
}

/// A numeric key's slot: 24 bytes, 4-byte aligned (the producer id is
/// split into two `u32`s so the struct has no padding).
#[derive(Clone, Copy, Debug)]
struct NumSlot {
    pid: [u32; 2],
    partition: i32,
    st: State,
}

#[derive(Clone, Debug)]
struct NamedSlot {
    id: ProducerId,
    partition: i32,
    st: State,
}

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;

/// The hash of a numeric key.
#[inline]
pub(crate) fn hash_numeric(pid: u64, partition: i32) -> u64 {
    // The two multiplies are independent (they overlap in the pipeline);
    // `K2 | 1` is odd, so a partition's term is a bijection of it.
    fold(pid ^ K0, K1) ^ u64::from(partition as u32).wrapping_mul(K2 | 1)
}

/// Little-endian `u64` from up to 8 bytes (shorter slices are zero-extended).
#[inline]
fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = b.len().min(8);
    w[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(w)
}

#[inline(always)]
fn partition_term(partition: i32) -> u64 {
    u64::from(partition as u32).wrapping_mul(K2 | 1)
}

/// The hash of an inline name (its packed words, see `ProducerId`).
#[inline(always)]
fn hash_inline(len: u8, w: [u64; 3], partition: i32) -> u64 {
    fold(w[0] ^ K0, w[1] ^ K1) ^ fold(w[2] ^ K3 ^ u64::from(len), K2) ^ partition_term(partition)
}

/// The hash of a long name: a folded multiply over 16-byte blocks. Long
/// names never compare equal to inline ones, so the two hashes need not agree.
fn hash_long(name: &[u8], partition: i32) -> u64 {
    let mut h = K3 ^ (name.len() as u64);
    for block in name.chunks(16) {
        let (a, b) = block.split_at(block.len().min(8));
        h = fold(word(a) ^ K0 ^ h, word(b) ^ K1);
    }
    h ^ partition_term(partition)
}

/// The hash of any key.
#[inline(always)]
pub(crate) fn hash_key(id: &ProducerId, partition: i32) -> u64 {
    if let Some(n) = id.as_numeric() {
        hash_numeric(n, partition)
    } else if let Some((len, w)) = id.inline_words() {
        hash_inline(len, w, partition)
    } else {
        hash_long(id.shared_name().unwrap_or_default(), partition)
    }
}

/// Whether a named slot holds this (named) id.
#[inline(always)]
fn same_name(slot: &ProducerId, id: &ProducerId) -> bool {
    match (slot.inline_words(), id.inline_words()) {
        // Word by word: comparing the arrays would spill both to the stack.
        (Some((la, a)), Some((lb, b))) => la == lb && a[0] == b[0] && a[1] == b[1] && a[2] == b[2],
        (None, None) => slot.shared_name() == id.shared_name(),
        _ => false,
    }
}

#[inline]
fn split_pid(pid: u64) -> [u32; 2] {
    [pid as u32, (pid >> 32) as u32]
}

#[inline]
fn join_pid(p: [u32; 2]) -> u64 {
    u64::from(p[0]) | (u64::from(p[1]) << 32)
}

impl State {
    fn from_entry(e: &ProducerEntry, windows: &mut Vec<Window>) -> State {
        let win = if e.head.windowed() {
            alloc(windows, e.window)
        } else {
            NO_WINDOW
        };
        State { head: e.head, win }
    }

    fn to_entry(self, windows: &[Window]) -> ProducerEntry {
        ProducerEntry {
            head: self.head,
            window: if self.head.windowed() {
                windows[self.win as usize]
            } else {
                Window::EMPTY
            },
        }
    }

    #[inline]
    fn find(&self, windows: &[Window], first: i32, last: i32) -> Option<Option<BatchMetadata>> {
        if self.head.windowed() {
            self.head.find(&windows[self.win as usize], first, last)
        } else {
            None
        }
    }

    #[inline(always)]
    fn accept(
        &mut self,
        windows: &mut Vec<Window>,
        new_session: bool,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) {
        if self.head.windowed() {
            let w = &mut windows[self.win as usize];
            self.head.push(w, new_session, epoch, first, last, meta);
        } else if meta.is_some() {
            let mut w = Window::EMPTY;
            self.head
                .push(&mut w, new_session, epoch, first, last, meta);
            self.win = alloc(windows, w);
        } else {
            self.head.accept_plain(epoch, last);
        }
    }
}

fn alloc(windows: &mut Vec<Window>, w: Window) -> u32 {
    let idx = u32::try_from(windows.len())
        .ok()
        .filter(|&i| i != NO_WINDOW)
        .expect("more than 2^32 - 1 retry windows in one map");
    windows.push(w);
    idx
}

/// Both tables and the window arena.
#[derive(Clone, Debug, Default)]
pub(crate) struct StateMap {
    numeric: HashTable<NumSlot>,
    named: HashTable<NamedSlot>,
    windows: Vec<Window>,
}

/// Classifies `first..=last` against one slot (or its absence) and applies
/// it if accepted. Generic over the two slot kinds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn append_in<S>(
    table: &mut HashTable<S>,
    windows: &mut Vec<Window>,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> &mut State,
    new_slot: impl FnOnce(State) -> S,
    rehash: impl Fn(&S) -> u64,
    epoch: i16,
    first: i32,
    last: i32,
    meta: Option<BatchMetadata>,
) -> BatchOutcome {
    if let Some(slot) = table.find_mut(hash, eq) {
        let st = state(slot);
        let cur = st.head.current();
        let outcome = rules::classify(Some(cur), epoch, first, last, |f, l| st.find(windows, f, l));
        if outcome.is_accepted() {
            st.accept(windows, epoch > cur.epoch, epoch, first, last, meta);
        }
        outcome
    } else {
        let outcome = rules::classify(None, epoch, first, last, |_, _| None);
        if outcome.is_accepted() {
            let entry = ProducerEntry::start(epoch, first, last, meta);
            let st = State::from_entry(&entry, windows);
            table.insert_unique(hash, new_slot(st), rehash);
        }
        outcome
    }
}

/// What a caller's own rules decided for an append to a compact key (see
/// [`StateMap::append_decided`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decided {
    /// Not accepted: nothing changes.
    Rejected,
    /// Accepted, and the compact entry can hold the result: applied in place
    /// (`new_session`: the epoch changed, the window starts over).
    Apply { new_session: bool },
    /// Accepted, but the compact entry cannot hold the result: nothing is
    /// changed here; the caller moves the key elsewhere.
    Elsewhere,
}

/// [`StateMap::append_decided`] for one slot kind.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn append_decided_in<S>(
    table: &mut HashTable<S>,
    windows: &mut Vec<Window>,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> &mut State,
    new_slot: impl FnOnce(State) -> S,
    rehash: impl Fn(&S) -> u64,
    epoch: i16,
    first: i32,
    last: i32,
    meta: Option<BatchMetadata>,
    decide: impl FnOnce(
        Option<(Current, bool)>,
        &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
    ) -> (BatchOutcome, Decided),
) -> (BatchOutcome, Decided) {
    if let Some(slot) = table.find_mut(hash, eq) {
        let st = state(slot);
        let (outcome, decided) = {
            let (st, w): (&State, &Vec<Window>) = (st, windows);
            decide(Some((st.head.current(), st.head.windowed())), &|f, l| {
                st.find(w, f, l)
            })
        };
        if let Decided::Apply { new_session } = decided {
            st.accept(windows, new_session, epoch, first, last, meta);
        }
        (outcome, decided)
    } else {
        let (outcome, decided) = decide(None, &|_, _| None);
        if let Decided::Apply { .. } = decided {
            let entry = ProducerEntry::start(epoch, first, last, meta);
            let st = State::from_entry(&entry, windows);
            table.insert_unique(hash, new_slot(st), rehash);
        }
        (outcome, decided)
    }
}

impl StateMap {
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
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) -> BatchOutcome {
        self.append_hashed(
            hash_key(id, partition),
            id,
            partition,
            epoch,
            first,
            last,
            meta,
        )
    }

    /// [`StateMap::append`] with the key's hash already computed.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_hashed(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) -> BatchOutcome {
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                append_in(
                    &mut self.numeric,
                    &mut self.windows,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| &mut s.st,
                    |st| NumSlot {
                        pid: key,
                        partition,
                        st,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    epoch,
                    first,
                    last,
                    meta,
                )
            }
            None => self.append_named(hash, id, partition, epoch, first, last, meta),
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn append_named(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) -> BatchOutcome {
        append_in(
            &mut self.named,
            &mut self.windows,
            hash,
            |s| s.partition == partition && same_name(&s.id, id),
            |s| &mut s.st,
            |st| NamedSlot {
                id: id.clone(),
                partition,
                st,
            },
            |s| hash_key(&s.id, s.partition),
            epoch,
            first,
            last,
            meta,
        )
    }

    /// Classifies an append by the caller's rules (`decide` sees the key's
    /// epoch and last sequence, whether it retains batches, and a lookup of
    /// its retained batches) and applies it in place when told to: one
    /// probe, as [`StateMap::append`] does for the seed rules.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_decided(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
        decide: impl FnOnce(
            Option<(Current, bool)>,
            &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
        ) -> (BatchOutcome, Decided),
    ) -> (BatchOutcome, Decided) {
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                append_decided_in(
                    &mut self.numeric,
                    &mut self.windows,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| &mut s.st,
                    |st| NumSlot {
                        pid: key,
                        partition,
                        st,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    epoch,
                    first,
                    last,
                    meta,
                    decide,
                )
            }
            None => append_decided_in(
                &mut self.named,
                &mut self.windows,
                hash,
                |s| s.partition == partition && same_name(&s.id, id),
                |s| &mut s.st,
                |st| NamedSlot {
                    id: id.clone(),
                    partition,
                    st,
                },
                |s| hash_key(&s.id, s.partition),
                epoch,
                first,
                last,
                meta,
                decide,
            ),
        }
    }

    /// The entry of one key.
    pub(crate) fn get(&self, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        self.get_hashed(hash_key(id, partition), id, partition)
    }

    /// Whether a key has state: a lookup that only reads the slot, which
    /// replay runs ahead of the appends to bring their slots into cache.
    #[inline(always)]
    pub(crate) fn contains_hashed(&self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                self.numeric
                    .find(hash, |s| s.pid == key && s.partition == partition)
                    .is_some()
            }
            None => self
                .named
                .find(hash, |s| s.partition == partition && same_name(&s.id, id))
                .is_some(),
        }
    }

    /// [`StateMap::get`] with the key's hash already computed.
    pub(crate) fn get_hashed(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<ProducerEntry> {
        let st = match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                self.numeric
                    .find(hash, |s| s.pid == key && s.partition == partition)
                    .map(|s| s.st)
            }
            None => self
                .named
                .find(hash, |s| s.partition == partition && same_name(&s.id, id))
                .map(|s| s.st),
        }?;
        Some(st.to_entry(&self.windows))
    }

    /// Sets one key's entry, replacing what was there (the durable store
    /// installing what an accepted append computed), with the key's hash
    /// already computed.
    #[inline]
    pub(crate) fn insert_hashed(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
    ) {
        let windows = &mut self.windows;
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                upsert(
                    &mut self.numeric,
                    windows,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| &mut s.st,
                    |st| NumSlot {
                        pid: key,
                        partition,
                        st,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    entry,
                );
            }
            None => upsert(
                &mut self.named,
                windows,
                hash,
                |s| s.partition == partition && same_name(&s.id, id),
                |s| &mut s.st,
                |st| NamedSlot {
                    id: id.clone(),
                    partition,
                    st,
                },
                |s| hash_key(&s.id, s.partition),
                entry,
            ),
        }
    }

    /// Makes room for `keys` more keys and `windows` more windows, so that
    /// loading a snapshot never rehashes or moves the arena.
    pub(crate) fn reserve(&mut self, keys: usize, windows: usize) {
        self.numeric
            .reserve(keys, |s| hash_numeric(join_pid(s.pid), s.partition));
        self.windows.reserve(windows);
    }

    /// Inserts the entry of a key that has none, with its hash already
    /// computed, in one probe of the table; false (and nothing changed) if
    /// the key exists. Loading a snapshot inserts in the order the writer's
    /// table held its keys, so consecutive inserts land in neighbouring
    /// buckets: the table is filled front to back, not at random.
    #[inline]
    pub(crate) fn insert_new_hashed(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
    ) -> bool {
        let windows = &mut self.windows;
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                match self.numeric.entry(
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                ) {
                    hashbrown::hash_table::Entry::Occupied(_) => false,
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        v.insert(NumSlot {
                            pid: key,
                            partition,
                            st: State::from_entry(entry, windows),
                        });
                        true
                    }
                }
            }
            None => match self.named.entry(
                hash,
                |s| s.partition == partition && same_name(&s.id, id),
                |s| hash_key(&s.id, s.partition),
            ) {
                hashbrown::hash_table::Entry::Occupied(_) => false,
                hashbrown::hash_table::Entry::Vacant(v) => {
                    v.insert(NamedSlot {
                        id: id.clone(),
                        partition,
                        st: State::from_entry(entry, windows),
                    });
                    true
                }
            },
        }
    }

    /// Removes one key, returning its entry. Its window, if any, stays in
    /// the arena until the map is dropped (the Kafka-mode engine removes a
    /// key once, when it moves to the transactional side table, or when it
    /// expires).
    pub(crate) fn remove(&mut self, id: &ProducerId, partition: i32) -> Option<ProducerEntry> {
        let hash = hash_key(id, partition);
        let st = match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                self.numeric
                    .find_entry(hash, |s| s.pid == key && s.partition == partition)
                    .ok()
                    .map(|e| e.remove().0.st)
            }
            None => self
                .named
                .find_entry(hash, |s| s.partition == partition && same_name(&s.id, id))
                .ok()
                .map(|e| e.remove().0.st),
        }?;
        Some(st.to_entry(&self.windows))
    }

    /// Keeps only the keys for which `keep` is true (windows of removed keys
    /// stay in the arena, as for [`StateMap::remove`]).
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&ProducerId, i32, &ProducerEntry) -> bool,
    ) {
        let w = &self.windows;
        self.numeric.retain(|s| {
            keep(
                &ProducerId::numeric(join_pid(s.pid)),
                s.partition,
                &s.st.to_entry(w),
            )
        });
        self.named
            .retain(|s| keep(&s.id, s.partition, &s.st.to_entry(w)));
    }

    /// Every key and its entry, numeric keys first, otherwise in no
    /// particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        let w = &self.windows;
        let numeric = self.numeric.iter().map(move |s| {
            (
                ProducerId::numeric(join_pid(s.pid)),
                s.partition,
                s.st.to_entry(w),
            )
        });
        let named = self
            .named
            .iter()
            .map(move |s| (s.id.clone(), s.partition, s.st.to_entry(w)));
        numeric.chain(named)
    }
}

/// Sets one slot's state to `entry`, creating the slot if needed.
#[allow(clippy::too_many_arguments)]
fn upsert<S>(
    table: &mut HashTable<S>,
    windows: &mut Vec<Window>,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> &mut State,
    new_slot: impl FnOnce(State) -> S,
    rehash: impl Fn(&S) -> u64,
    entry: &ProducerEntry,
) {
    if let Some(slot) = table.find_mut(hash, eq) {
        let st = state(slot);
        *st = replace(*st, entry, windows);
    } else {
        let st = State::from_entry(entry, windows);
        table.insert_unique(hash, new_slot(st), rehash);
    }
}

/// Replaces a slot's state with `entry`, reusing its window when it has one.
fn replace(old: State, entry: &ProducerEntry, windows: &mut Vec<Window>) -> State {
    match (old.head.windowed(), entry.head.windowed()) {
        (true, true) => {
            windows[old.win as usize] = entry.window;
            State {
                head: entry.head,
                win: old.win,
            }
        }
        // A window no longer referenced stays in the arena until the map is
        // dropped. That happens only while loading: the durable store also
        // replaces entries, with the entry an accepted append leads to, and
        // an accepted append never turns a windowed entry plain.
        _ => State::from_entry(entry, windows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::AppendOutcome;

    #[test]
    fn slots_are_as_small_as_designed() {
        assert_eq!(std::mem::size_of::<NumSlot>(), 24);
        assert_eq!(std::mem::align_of::<NumSlot>(), 4);
        assert_eq!(std::mem::size_of::<State>(), 12);
    }

    #[test]
    fn numeric_and_named_keys_are_independent() {
        let mut m = StateMap::default();
        let n = ProducerId::from(7u64);
        let s = ProducerId::from("7");
        assert!(m.append(&n, 0, 0, 0, 0, None).is_accepted());
        assert_eq!(
            m.append(&s, 0, 0, 1, 1, None).outcome(),
            AppendOutcome::OutOfOrder
        );
        assert!(m.append(&s, 0, 0, 0, 0, None).is_accepted());
        assert!(m.append(&n, 0, 0, 1, 1, None).is_accepted());
        assert_eq!(m.get(&n, 0).map(|e| e.last_sequence()), Some(1));
        assert_eq!(m.get(&s, 0).map(|e| e.last_sequence()), Some(0));
        assert_eq!(m.get(&n, 1), None);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn a_plain_key_gets_a_window_with_its_first_batch() {
        let mut m = StateMap::default();
        let id = ProducerId::from(1u64);
        let meta = Some(BatchMetadata {
            offset: 10,
            timestamp: 20,
        });
        assert!(m.append(&id, 3, 0, 0, 0, None).is_accepted());
        assert!(m.append(&id, 3, 0, 1, 4, meta).is_accepted());
        let e = m.get(&id, 3).unwrap();
        assert_eq!(e.last_sequence(), 4);
        assert_eq!(e.retained_batches().len(), 1);
        assert_eq!(
            m.append(&id, 3, 0, 1, 4, None),
            BatchOutcome::Duplicate { original: meta }
        );
        // A single append on a windowed key is retained without metadata.
        assert!(m.append(&id, 3, 0, 5, 5, None).is_accepted());
        assert_eq!(m.get(&id, 3).unwrap().retained_batches().len(), 2);
        // A new session drops the old epoch's batches.
        assert!(m.append(&id, 3, 1, 0, 0, None).is_accepted());
        let e = m.get(&id, 3).unwrap();
        assert_eq!((e.epoch(), e.last_sequence()), (1, 0));
        assert_eq!(e.retained_batches().collect::<Vec<_>>().len(), 1);
    }

    #[test]
    fn insert_new_adds_only_absent_keys_and_iter_sees_everything() {
        let mut m = StateMap::default();
        for pid in 0..1000u64 {
            assert!(
                m.append(&ProducerId::from(pid), (pid % 7) as i32, 0, 0, 0, None)
                    .is_accepted()
            );
        }
        let e = ProducerEntry::from_parts(9, 77, &[]).unwrap();
        let insert = |m: &mut StateMap, id: ProducerId, p: i32| {
            m.insert_new_hashed(hash_key(&id, p), &id, p, &e)
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
