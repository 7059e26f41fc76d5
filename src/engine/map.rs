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
//! The hash is fixed (no random seed): the layout and the benchmarks are
//! reproducible, and producer ids are handed out by the broker, not chosen
//! by clients, so hash flooding is not the threat model here.

use std::borrow::Cow;
use std::fmt::Debug;

use hashbrown::HashTable;

use crate::batch::BatchMetadata;
use crate::engine::entry::{Head, ProducerEntry, Window};
use crate::engine::rules::{self, Current, UnknownProducer};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

/// No window: the key only used single-sequence appends.
const NO_WINDOW: u32 = u32::MAX;

/// What a slot carries beside the key's state: `()` for the engine, the
/// key's last activity for the store. 4-byte aligned, so a numeric slot
/// has no padding.
pub(crate) trait Extra: Copy + Default + Debug + PartialEq {}

impl Extra for () {}

/// A key's last activity (milliseconds since the Unix epoch): the time
/// expiration and eviction order by. Two `u32`s, so the slot stays
/// 4-byte aligned (32 bytes for a numeric key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Activity([u32; 2]);

impl Activity {
    #[inline]
    pub(crate) fn new(ms: i64) -> Activity {
        let v = ms as u64;
        Activity([v as u32, (v >> 32) as u32])
    }

    #[inline]
    pub(crate) fn ms(self) -> i64 {
        (u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)) as i64
    }
}

impl Extra for Activity {}

/// A key's state inside a slot: the head the rules read, and the index of
/// the key's window in the arena (or `NO_WINDOW`). 12 bytes.
#[derive(Clone, Copy, Debug)]
struct State {
    head: Head,
    win: u32,
}

/// A numeric key's slot: 24 bytes plus the extra, 4-byte aligned (the
/// producer id is split into two `u32`s so the struct has no padding).
#[derive(Clone, Copy, Debug)]
struct NumSlot<X> {
    pid: [u32; 2],
    partition: i32,
    st: State,
    x: X,
}

#[derive(Clone, Debug)]
struct NamedSlot<X> {
    id: ProducerId,
    partition: i32,
    st: State,
    x: X,
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

/// The window arena: windows by index, and the indexes of windows freed
/// by keys that were removed or lost their window, reused first.
#[derive(Clone, Debug, Default)]
struct Arena {
    windows: Vec<Window>,
    free: Vec<u32>,
}

impl Arena {
    #[inline]
    fn alloc(&mut self, w: Window) -> u32 {
        if let Some(i) = self.free.pop() {
            self.windows[i as usize] = w;
            return i;
        }
        let idx = u32::try_from(self.windows.len())
            .ok()
            .filter(|&i| i != NO_WINDOW)
            .expect("more than 2^32 - 1 retry windows in one map");
        self.windows.push(w);
        idx
    }

    #[inline]
    fn release(&mut self, win: u32) {
        if win != NO_WINDOW {
            self.free.push(win);
        }
    }
}

impl State {
    fn from_entry(e: &ProducerEntry, arena: &mut Arena) -> State {
        let win = if e.head.windowed() {
            arena.alloc(e.window)
        } else {
            NO_WINDOW
        };
        State { head: e.head, win }
    }

    fn to_entry(self, arena: &Arena) -> ProducerEntry {
        ProducerEntry {
            head: self.head,
            window: if self.head.windowed() {
                arena.windows[self.win as usize]
            } else {
                Window::EMPTY
            },
        }
    }

    #[inline]
    fn find(&self, arena: &Arena, first: i32, last: i32) -> Option<Option<BatchMetadata>> {
        if self.head.windowed() {
            self.head
                .find(&arena.windows[self.win as usize], first, last)
        } else {
            None
        }
    }

    #[inline(always)]
    fn accept(
        &mut self,
        arena: &mut Arena,
        new_session: bool,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) {
        if self.head.windowed() {
            let w = &mut arena.windows[self.win as usize];
            self.head.push(w, new_session, epoch, first, last, meta);
        } else if meta.is_some() {
            let mut w = Window::EMPTY;
            self.head
                .push(&mut w, new_session, epoch, first, last, meta);
            self.win = arena.alloc(w);
        } else {
            self.head.accept_plain(epoch, last);
        }
    }

    /// Replaces this state with `entry`'s, reusing its window when both
    /// have one and freeing it when the new one has none.
    fn replace(&mut self, entry: &ProducerEntry, arena: &mut Arena) {
        match (self.head.windowed(), entry.head.windowed()) {
            (true, true) => arena.windows[self.win as usize] = entry.window,
            (true, false) => {
                arena.release(self.win);
                self.win = NO_WINDOW;
            }
            (false, true) => self.win = arena.alloc(entry.window),
            (false, false) => {}
        }
        self.head = entry.head;
    }
}

/// How an append is applied: rule 1's policy, and the extra an accepted
/// append leaves in its key's slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Apply<X> {
    pub unknown: UnknownProducer,
    pub x: X,
}

impl Default for Apply<()> {
    fn default() -> Self {
        Apply {
            unknown: UnknownProducer::RequireZero,
            x: (),
        }
    }
}

/// Both tables and the window arena.
#[derive(Clone, Debug, Default)]
pub(crate) struct StateMap<X: Extra = ()> {
    numeric: HashTable<NumSlot<X>>,
    named: HashTable<NamedSlot<X>>,
    arena: Arena,
}

/// Classifies `first..=last` against one slot (or its absence) and applies
/// it if accepted. Generic over the two slot kinds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn append_in<S, X: Extra>(
    table: &mut HashTable<S>,
    arena: &mut Arena,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> (&mut State, &mut X),
    new_slot: impl FnOnce(State, X) -> S,
    rehash: impl Fn(&S) -> u64,
    epoch: i16,
    first: i32,
    last: i32,
    meta: Option<BatchMetadata>,
    how: Apply<X>,
) -> BatchOutcome {
    if let Some(slot) = table.find_mut(hash, eq) {
        let (st, x) = state(slot);
        let cur = st.head.current();
        let outcome = rules::classify(Some(cur), epoch, first, last, |f, l| st.find(arena, f, l));
        if outcome.is_accepted() {
            st.accept(arena, epoch > cur.epoch, epoch, first, last, meta);
            *x = how.x;
        }
        outcome
    } else {
        let outcome = rules::classify_with(None, how.unknown, epoch, first, last, |_, _| None);
        if outcome.is_accepted() {
            let entry = ProducerEntry::start(epoch, first, last, meta);
            let st = State::from_entry(&entry, arena);
            keep_room(table, &rehash);
            table.insert_unique(hash, new_slot(st, how.x), rehash);
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
fn append_decided_in<S, X: Extra>(
    table: &mut HashTable<S>,
    arena: &mut Arena,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> (&mut State, &mut X),
    new_slot: impl FnOnce(State, X) -> S,
    rehash: impl Fn(&S) -> u64,
    epoch: i16,
    first: i32,
    last: i32,
    meta: Option<BatchMetadata>,
    x: X,
    decide: impl FnOnce(
        Option<(Current, bool)>,
        &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
    ) -> (BatchOutcome, Decided),
) -> (BatchOutcome, Decided) {
    if let Some(slot) = table.find_mut(hash, eq) {
        let (st, slot_x) = state(slot);
        let (outcome, decided) = {
            let (st, a): (&State, &Arena) = (st, arena);
            decide(Some((st.head.current(), st.head.windowed())), &|f, l| {
                st.find(a, f, l)
            })
        };
        if let Decided::Apply { new_session } = decided {
            st.accept(arena, new_session, epoch, first, last, meta);
            *slot_x = x;
        }
        (outcome, decided)
    } else {
        let (outcome, decided) = decide(None, &|_, _| None);
        if let Decided::Apply { .. } = decided {
            let entry = ProducerEntry::start(epoch, first, last, meta);
            let st = State::from_entry(&entry, arena);
            keep_room(table, &rehash);
            table.insert_unique(hash, new_slot(st, x), rehash);
        }
        (outcome, decided)
    }
}

impl<X: Extra> StateMap<X> {
    /// Number of keys with state.
    pub(crate) fn len(&self) -> usize {
        self.numeric.len() + self.named.len()
    }

    /// Classifies an append and applies it when accepted.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
        how: Apply<X>,
    ) -> BatchOutcome {
        self.append_hashed(
            hash_key(id, partition),
            id,
            partition,
            epoch,
            first,
            last,
            meta,
            how,
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
        how: Apply<X>,
    ) -> BatchOutcome {
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                append_in(
                    &mut self.numeric,
                    &mut self.arena,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| (&mut s.st, &mut s.x),
                    |st, x| NumSlot {
                        pid: key,
                        partition,
                        st,
                        x,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    epoch,
                    first,
                    last,
                    meta,
                    how,
                )
            }
            None => self.append_named(hash, id, partition, epoch, first, last, meta, how),
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
        how: Apply<X>,
    ) -> BatchOutcome {
        append_in(
            &mut self.named,
            &mut self.arena,
            hash,
            |s| s.partition == partition && same_name(&s.id, id),
            |s| (&mut s.st, &mut s.x),
            |st, x| NamedSlot {
                id: id.clone(),
                partition,
                st,
                x,
            },
            |s| hash_key(&s.id, s.partition),
            epoch,
            first,
            last,
            meta,
            how,
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
        x: X,
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
                    &mut self.arena,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| (&mut s.st, &mut s.x),
                    |st, x| NumSlot {
                        pid: key,
                        partition,
                        st,
                        x,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    epoch,
                    first,
                    last,
                    meta,
                    x,
                    decide,
                )
            }
            None => append_decided_in(
                &mut self.named,
                &mut self.arena,
                hash,
                |s| s.partition == partition && same_name(&s.id, id),
                |s| (&mut s.st, &mut s.x),
                |st, x| NamedSlot {
                    id: id.clone(),
                    partition,
                    st,
                    x,
                },
                |s| hash_key(&s.id, s.partition),
                epoch,
                first,
                last,
                meta,
                x,
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
        self.slot(hash, id, partition).is_some()
    }

    /// A key's state and extra.
    #[inline(always)]
    fn slot(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<(State, X)> {
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                self.numeric
                    .find(hash, |s| s.pid == key && s.partition == partition)
                    .map(|s| (s.st, s.x))
            }
            None => self
                .named
                .find(hash, |s| s.partition == partition && same_name(&s.id, id))
                .map(|s| (s.st, s.x)),
        }
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
    pub(crate) fn insert_hashed(
        &mut self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
        x: X,
    ) -> bool {
        let arena = &mut self.arena;
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                upsert(
                    &mut self.numeric,
                    arena,
                    hash,
                    |s| s.pid == key && s.partition == partition,
                    |s| (&mut s.st, &mut s.x),
                    |st, x| NumSlot {
                        pid: key,
                        partition,
                        st,
                        x,
                    },
                    |s| hash_numeric(join_pid(s.pid), s.partition),
                    entry,
                    x,
                )
            }
            None => upsert(
                &mut self.named,
                arena,
                hash,
                |s| s.partition == partition && same_name(&s.id, id),
                |s| (&mut s.st, &mut s.x),
                |st, x| NamedSlot {
                    id: id.clone(),
                    partition,
                    st,
                    x,
                },
                |s| hash_key(&s.id, s.partition),
                entry,
                x,
            ),
        }
    }

    /// Removes a key (its window is freed for reuse); false if it had no
    /// state.
    pub(crate) fn remove_hashed(&mut self, hash: u64, id: &ProducerId, partition: i32) -> bool {
        let win = match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                match self
                    .numeric
                    .find_entry(hash, |s| s.pid == key && s.partition == partition)
                {
                    Ok(e) => e.remove().0.st.win,
                    Err(_) => return false,
                }
            }
            None => match self
                .named
                .find_entry(hash, |s| s.partition == partition && same_name(&s.id, id))
            {
                Ok(e) => e.remove().0.st.win,
                Err(_) => return false,
            },
        };
        self.arena.release(win);
        true
    }

    /// Makes room for `keys` more keys and `windows` more windows, so that
    /// loading a snapshot never rehashes or moves the arena.
    pub(crate) fn reserve(&mut self, keys: usize, windows: usize) {
        self.numeric
            .reserve(keys, |s| hash_numeric(join_pid(s.pid), s.partition));
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
        hash: u64,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
        x: X,
    ) -> bool {
        self.insert_vacant(hash, Cow::Borrowed(id), partition, x, |arena| {
            State::from_entry(entry, arena)
        })
    }

    /// The one probe of [`StateMap::insert_new_hashed`] and
    /// [`StateMap::load_new`]: inserts the key with the state `st` makes
    /// (called only if the key is absent, with the arena), or returns false
    /// and changes nothing. A borrowed named id is cloned only once the
    /// key is known to be new.
    #[inline(always)]
    fn insert_vacant(
        &mut self,
        hash: u64,
        id: Cow<'_, ProducerId>,
        partition: i32,
        x: X,
        st: impl FnOnce(&mut Arena) -> State,
    ) -> bool {
        let arena = &mut self.arena;
        match id.as_numeric() {
            Some(pid) => {
                let key = split_pid(pid);
                keep_room(&mut self.numeric, |s| {
                    hash_numeric(join_pid(s.pid), s.partition)
                });
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
                            st: st(arena),
                            x,
                        });
                        true
                    }
                }
            }
            None => {
                keep_room(&mut self.named, |s| hash_key(&s.id, s.partition));
                match self.named.entry(
                    hash,
                    |s| s.partition == partition && same_name(&s.id, &id),
                    |s| hash_key(&s.id, s.partition),
                ) {
                    hashbrown::hash_table::Entry::Occupied(_) => false,
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        v.insert(NamedSlot {
                            id: id.into_owned(),
                            partition,
                            st: st(arena),
                            x,
                        });
                        true
                    }
                }
            }
        }
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
        let new = self.insert_vacant(hash, Cow::Owned(id), partition, x, |_| st);
        if !new && win != NO_WINDOW {
            self.arena.windows.pop();
        }
        Ok((new, t))
    }

    /// Removes one key, returning its entry (its window is freed for
    /// reuse).
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
            let id = ProducerId::numeric(join_pid(s.pid));
            let kept = keep(&id, s.partition, &s.st.to_entry(a));
            if !kept {
                freed.push(s.st.win);
            }
            kept
        });
        self.named.retain(|s| {
            let kept = keep(&s.id, s.partition, &s.st.to_entry(a));
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
                ProducerId::numeric(join_pid(s.pid)),
                s.partition,
                s.st.to_entry(a),
                s.x,
            )
        });
        let named = self
            .named
            .iter()
            .map(move |s| (s.id.clone(), s.partition, s.st.to_entry(a), s.x));
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
            let id = ProducerId::numeric(join_pid(s.pid));
            f(&id, s.partition, &s.st.head, window(&s.st), s.x);
        }
        for s in self.named.iter() {
            f(&s.id, s.partition, &s.st.head, window(&s.st), s.x);
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
                f(s.x, hash_numeric(join_pid(s.pid), s.partition));
            }
        }
        for s in self.named.iter() {
            if keep(s.x) {
                f(s.x, hash_key(&s.id, s.partition));
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
            .filter(move |s| hash_numeric(join_pid(s.pid), s.partition) == hash)
            .map(|s| (ProducerId::numeric(join_pid(s.pid)), s.partition, s.x));
        let named = self
            .named
            .iter_hash(hash)
            .filter(move |s| hash_key(&s.id, s.partition) == hash)
            .map(|s| (s.id.clone(), s.partition, s.x));
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
            hash_numeric(join_pid(s.pid), s.partition) == hash
                && take(&ProducerId::numeric(join_pid(s.pid)), s.partition, s.x)
        }) {
            let (s, _) = e.remove();
            self.arena.release(s.st.win);
            removed(ProducerId::numeric(join_pid(s.pid)), s.partition);
            n += 1;
        }
        if self.named.is_empty() {
            return n;
        }
        while let Ok(e) = self.named.find_entry(hash, |s| {
            hash_key(&s.id, s.partition) == hash && take(&s.id, s.partition, s.x)
        }) {
            let (s, _) = e.remove();
            self.arena.release(s.st.win);
            removed(s.id, s.partition);
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
            .map_or(0, |s| s.pid[0] ^ s.st.win)
    }

    /// Every key with its extra.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (ProducerId, i32, X)> + '_ {
        let numeric = self
            .numeric
            .iter()
            .map(|s| (ProducerId::numeric(join_pid(s.pid)), s.partition, s.x));
        let named = self.named.iter().map(|s| (s.id.clone(), s.partition, s.x));
        numeric.chain(named)
    }
}

/// Sets one slot's state to `entry`, creating the slot if needed; true if
/// it was created.
#[allow(clippy::too_many_arguments)]
fn upsert<S, X: Extra>(
    table: &mut HashTable<S>,
    arena: &mut Arena,
    hash: u64,
    eq: impl FnMut(&S) -> bool,
    state: impl Fn(&mut S) -> (&mut State, &mut X),
    new_slot: impl FnOnce(State, X) -> S,
    rehash: impl Fn(&S) -> u64,
    entry: &ProducerEntry,
    x: X,
) -> bool {
    if let Some(slot) = table.find_mut(hash, eq) {
        let (st, sx) = state(slot);
        st.replace(entry, arena);
        *sx = x;
        false
    } else {
        let st = State::from_entry(entry, arena);
        keep_room(table, &rehash);
        table.insert_unique(hash, new_slot(st, x), rehash);
        true
    }
}

/// Before inserting a new key: when the table has no room left, rebuilds
/// it sized for its live keys instead of letting it grow. A table whose
/// keys come and go (expiration, eviction) collects tombstones, which use
/// up its room while the live keys stay as many; hashbrown then grows it
/// to twice the buckets as soon as the live keys fill more than half of
/// its capacity, so a store churning at a cap of 1M keys would end with
/// the table of 2M. Rebuilt, it keeps its size (and a table of fewer live
/// keys shrinks); when the live keys do fill it, the new table is the one
/// hashbrown would have grown to. A rebuild moves each key once and comes
/// after as many inserts as the table had room for, so it costs less than
/// one move per insert.
#[inline(always)]
fn keep_room<S>(table: &mut HashTable<S>, rehash: impl Fn(&S) -> u64) {
    if table.len() == table.capacity() {
        rebuild(table, rehash);
    }
}

#[cold]
#[inline(never)]
fn rebuild<S>(table: &mut HashTable<S>, rehash: impl Fn(&S) -> u64) {
    let mut fresh = HashTable::with_capacity(table.len() + 1);
    for s in table.drain() {
        fresh.insert_unique(rehash(&s), s, &rehash);
    }
    *table = fresh;
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let h = hash_key(&id(k), 0);
            assert!(m.insert_hashed(h, &id(k), 0, &e, Activity::new(k as i64)));
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
            m.append(&n, 0, 0, 0, 0, None, Apply::default())
                .is_accepted()
        );
        assert_eq!(
            m.append(&s, 0, 0, 1, 1, None, Apply::default()).outcome(),
            AppendOutcome::OutOfOrder
        );
        assert!(
            m.append(&s, 0, 0, 0, 0, None, Apply::default())
                .is_accepted()
        );
        assert!(
            m.append(&n, 0, 0, 1, 1, None, Apply::default())
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
            m.append(&id, 3, 0, 0, 0, None, Apply::default())
                .is_accepted()
        );
        assert!(
            m.append(&id, 3, 0, 1, 4, meta, Apply::default())
                .is_accepted()
        );
        let e = m.get(&id, 3).unwrap();
        assert_eq!(e.last_sequence(), 4);
        assert_eq!(e.retained_batches().len(), 1);
        assert_eq!(
            m.append(&id, 3, 0, 1, 4, None, Apply::default()),
            BatchOutcome::Duplicate { original: meta }
        );
        // A single append on a windowed key is retained without metadata.
        assert!(
            m.append(&id, 3, 0, 5, 5, None, Apply::default())
                .is_accepted()
        );
        assert_eq!(m.get(&id, 3).unwrap().retained_batches().len(), 2);
        // A new session drops the old epoch's batches.
        assert!(
            m.append(&id, 3, 1, 0, 0, None, Apply::default())
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
                    0,
                    0,
                    0,
                    None,
                    Apply::default()
                )
                .is_accepted()
            );
        }
        let e = ProducerEntry::from_parts(9, 77, &[]).unwrap();
        let insert = |m: &mut StateMap, id: ProducerId, p: i32| {
            m.insert_new_hashed(hash_key(&id, p), &id, p, &e, ())
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
