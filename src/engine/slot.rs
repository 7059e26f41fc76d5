//! One slot of the compact map's tables, and the table operations written
//! once for both slot kinds: a numeric key's 24-byte slot (plus its extra)
//! and a named key's, the window arena they point into, and how an append
//! is classified and applied against a slot (see `map.rs` for the layout's
//! reasons).

use std::fmt::Debug;

use hashbrown::HashTable;

use crate::batch::{AppendRequest, BatchMetadata};
use crate::engine::entry::{Head, ProducerEntry, Window};
use crate::engine::hash::{hash_key, hash_numeric};
use crate::engine::rules::{self, Current, UnknownProducer};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;

/// No window: the key only used single-sequence appends.
pub(super) const NO_WINDOW: u32 = u32::MAX;

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
pub(super) struct State {
    pub(super) head: Head,
    pub(super) win: u32,
}

/// One slot of a table: a key of one kind (`K`, see [`SlotKey`]), its
/// partition, its state and its extra.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeySlot<K, X> {
    pub(super) key: K,
    pub(super) partition: i32,
    pub(super) st: State,
    pub(super) x: X,
}

/// A numeric key's slot: 24 bytes plus the extra, 4-byte aligned (the
/// producer id is split into two `u32`s so the struct has no padding).
pub(super) type NumSlot<X> = KeySlot<[u32; 2], X>;

/// A named key's slot.
pub(super) type NamedSlot<X> = KeySlot<ProducerId, X>;

/// Whether a named slot holds this (named) id.
#[inline(always)]
pub(super) fn same_name(slot: &ProducerId, id: &ProducerId) -> bool {
    match (slot.inline_words(), id.inline_words()) {
        // Word by word: comparing the arrays would spill both to the stack.
        (Some((la, a)), Some((lb, b))) => la == lb && a[0] == b[0] && a[1] == b[1] && a[2] == b[2],
        (None, None) => slot.shared_name() == id.shared_name(),
        _ => false,
    }
}

#[inline]
pub(super) fn split_pid(pid: u64) -> [u32; 2] {
    [pid as u32, (pid >> 32) as u32]
}

#[inline]
pub(super) fn join_pid(p: [u32; 2]) -> u64 {
    u64::from(p[0]) | (u64::from(p[1]) << 32)
}

/// The window arena: windows by index, and the indexes of windows freed
/// by keys that were removed or lost their window, reused first.
#[derive(Clone, Debug, Default)]
pub(super) struct Arena {
    pub(super) windows: Vec<Window>,
    pub(super) free: Vec<u32>,
}

impl Arena {
    #[inline]
    pub(super) fn alloc(&mut self, w: Window) -> u32 {
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
    pub(super) fn release(&mut self, win: u32) {
        if win != NO_WINDOW {
            self.free.push(win);
        }
    }
}

impl State {
    pub(super) fn from_entry(e: &ProducerEntry, arena: &mut Arena) -> State {
        let win = if e.head.windowed() {
            arena.alloc(e.window)
        } else {
            NO_WINDOW
        };
        State { head: e.head, win }
    }

    pub(super) fn to_entry(self, arena: &Arena) -> ProducerEntry {
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
    pub(super) fn find(
        &self,
        arena: &Arena,
        first: i32,
        last: i32,
    ) -> Option<Option<BatchMetadata>> {
        if self.head.windowed() {
            self.head
                .find(&arena.windows[self.win as usize], first, last)
        } else {
            None
        }
    }

    #[inline(always)]
    pub(super) fn accept(
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
    pub(super) fn replace(&mut self, entry: &ProducerEntry, arena: &mut Arena) {
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

/// What an append asks of its key: the epoch, the sequences and, for a
/// batch, its offset and timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub epoch: i16,
    pub first: i32,
    pub last: i32,
    pub meta: Option<BatchMetadata>,
}

impl Ask {
    /// A single-sequence append: a batch of one record without metadata.
    #[inline(always)]
    pub(crate) fn single(epoch: i16, sequence: i32) -> Ask {
        Ask {
            epoch,
            first: sequence,
            last: sequence,
            meta: None,
        }
    }

    /// A batch with its offset and timestamp.
    #[inline(always)]
    pub(crate) fn batch(epoch: i16, batch: &crate::batch::Batch) -> Ask {
        Ask {
            epoch,
            first: batch.first_sequence,
            last: batch.last_sequence,
            meta: Some(batch.metadata()),
        }
    }

    /// An append of `first..=last` (tests build every shape with it).
    #[cfg(test)]
    pub(crate) fn new(epoch: i16, first: i32, last: i32, meta: Option<BatchMetadata>) -> Ask {
        Ask {
            epoch,
            first,
            last,
            meta,
        }
    }

    /// What `r` asks.
    #[inline(always)]
    pub(crate) fn of(r: &AppendRequest) -> Ask {
        Ask {
            epoch: r.epoch,
            first: r.first,
            last: r.last,
            meta: r.metadata,
        }
    }
}

/// A slot's key kind (a split numeric id, or a name), as the table
/// operations written once for both kinds need it: how to tell a slot's
/// key, own a key to make a slot, and hash a slot's key again when the
/// table is rebuilt.
pub(super) trait SlotKey: Sized {
    /// A key in this kind's terms, as a lookup names it.
    type Ref<'a>: Copy;
    /// Whether a slot of this key and `partition` holds `key`.
    fn holds(&self, partition: i32, key: (Self::Ref<'_>, i32)) -> bool;
    fn own(key: Self::Ref<'_>) -> Self;
    fn rehash(&self, partition: i32) -> u64;
}

impl SlotKey for [u32; 2] {
    type Ref<'a> = [u32; 2];
    #[inline(always)]
    fn holds(&self, partition: i32, (pid, p): (Self::Ref<'_>, i32)) -> bool {
        *self == pid && partition == p
    }
    #[inline(always)]
    fn own(pid: Self::Ref<'_>) -> Self {
        pid
    }
    #[inline(always)]
    fn rehash(&self, partition: i32) -> u64 {
        hash_numeric(join_pid(*self), partition)
    }
}

impl SlotKey for ProducerId {
    type Ref<'a> = &'a ProducerId;
    #[inline(always)]
    fn holds(&self, partition: i32, (id, p): (Self::Ref<'_>, i32)) -> bool {
        partition == p && same_name(self, id)
    }
    #[inline(always)]
    fn own(id: Self::Ref<'_>) -> Self {
        id.clone()
    }
    #[inline(always)]
    fn rehash(&self, partition: i32) -> u64 {
        hash_key(self, partition)
    }
}

/// A key with its partition, in its kind's terms.
pub(super) type Key<'a, K> = (<K as SlotKey>::Ref<'a>, i32);

impl<K: SlotKey, X> KeySlot<K, X> {
    /// Whether this slot holds `key`.
    #[inline(always)]
    pub(super) fn is(&self, key: Key<'_, K>) -> bool {
        self.key.holds(self.partition, key)
    }

    #[inline(always)]
    fn make((key, partition): Key<'_, K>, st: State, x: X) -> Self {
        KeySlot {
            key: K::own(key),
            partition,
            st,
            x,
        }
    }

    #[inline(always)]
    fn rehash(&self) -> u64 {
        self.key.rehash(self.partition)
    }
}

/// Removes the slot of `key`, giving back its state (its window is the
/// caller's to release).
#[inline]
pub(super) fn take_slot<K: SlotKey, X>(
    table: &mut HashTable<KeySlot<K, X>>,
    hash: u64,
    key: Key<'_, K>,
) -> Option<State> {
    let (slot, _) = table.find_entry(hash, |s| s.is(key)).ok()?.remove();
    Some(slot.st)
}

/// Inserts a slot for `key`, which has none, keeping the table's room.
#[inline(always)]
pub(super) fn insert_new_slot<K: SlotKey, X>(
    table: &mut HashTable<KeySlot<K, X>>,
    hash: u64,
    key: Key<'_, K>,
    st: State,
    x: X,
) {
    keep_room(table, KeySlot::rehash);
    table.insert_unique(hash, KeySlot::make(key, st, x), KeySlot::rehash);
}

/// Inserts `key` with the state `st` makes (called only if the key is
/// absent, with the arena) in one probe, or returns false and changes
/// nothing.
#[inline(always)]
pub(super) fn insert_vacant_in<K: SlotKey, X>(
    table: &mut HashTable<KeySlot<K, X>>,
    arena: &mut Arena,
    hash: u64,
    key: Key<'_, K>,
    (x, st): (X, impl FnOnce(&mut Arena) -> State),
) -> bool {
    keep_room(table, KeySlot::rehash);
    match table.entry(hash, |s| s.is(key), KeySlot::rehash) {
        hashbrown::hash_table::Entry::Occupied(_) => false,
        hashbrown::hash_table::Entry::Vacant(v) => {
            v.insert(KeySlot::make(key, st(arena), x));
            true
        }
    }
}

/// Classifies an append against one slot (or its absence) and applies it
/// if accepted. Generic over the two slot kinds.
#[inline(always)]
pub(super) fn append_in<K: SlotKey, X: Extra>(
    table: &mut HashTable<KeySlot<K, X>>,
    arena: &mut Arena,
    hash: u64,
    key: Key<'_, K>,
    ask: Ask,
    how: Apply<X>,
) -> BatchOutcome {
    if let Some(slot) = table.find_mut(hash, |s| s.is(key)) {
        let KeySlot { st, x, .. } = slot;
        let cur = st.head.current();
        let outcome = rules::classify(Some(cur), ask.epoch, ask.first, ask.last, |f, l| {
            st.find(arena, f, l)
        });
        if outcome.is_accepted() {
            st.accept(
                arena,
                ask.epoch > cur.epoch,
                ask.epoch,
                ask.first,
                ask.last,
                ask.meta,
            );
            *x = how.x;
        }
        outcome
    } else {
        let outcome =
            rules::classify_with(None, how.unknown, ask.epoch, ask.first, ask.last, |_, _| {
                None
            });
        if outcome.is_accepted() {
            let st = State::from_entry(
                &ProducerEntry::start(ask.epoch, ask.first, ask.last, ask.meta),
                arena,
            );
            insert_new_slot(table, hash, key, st, how.x);
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

/// What decides an append for [`StateMap::append_decided`]: it sees the
/// key's current state and whether it retains batches (`None`: no state),
/// and a lookup of its retained batches.
pub(crate) trait Decide:
    FnOnce(
    Option<(Current, bool)>,
    &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
) -> (BatchOutcome, Decided)
{
}

impl<F> Decide for F where
    F: FnOnce(
        Option<(Current, bool)>,
        &dyn Fn(i32, i32) -> Option<Option<BatchMetadata>>,
    ) -> (BatchOutcome, Decided)
{
}

/// [`StateMap::append_decided`] for one slot kind.
#[inline(always)]
pub(super) fn append_decided_in<K: SlotKey, X: Extra>(
    table: &mut HashTable<KeySlot<K, X>>,
    arena: &mut Arena,
    hash: u64,
    key: Key<'_, K>,
    (ask, x): (Ask, X),
    decide: impl Decide,
) -> (BatchOutcome, Decided) {
    if let Some(slot) = table.find_mut(hash, |s| s.is(key)) {
        let KeySlot { st, x: slot_x, .. } = slot;
        let (outcome, decided) = {
            let (st, a): (&State, &Arena) = (st, arena);
            decide(Some((st.head.current(), st.head.windowed())), &|f, l| {
                st.find(a, f, l)
            })
        };
        if let Decided::Apply { new_session } = decided {
            st.accept(arena, new_session, ask.epoch, ask.first, ask.last, ask.meta);
            *slot_x = x;
        }
        (outcome, decided)
    } else {
        let (outcome, decided) = decide(None, &|_, _| None);
        if let Decided::Apply { .. } = decided {
            let st = State::from_entry(
                &ProducerEntry::start(ask.epoch, ask.first, ask.last, ask.meta),
                arena,
            );
            insert_new_slot(table, hash, key, st, x);
        }
        (outcome, decided)
    }
}

/// Sets one slot's state to `entry`, creating the slot if needed; true if
/// it was created.
pub(super) fn upsert<K: SlotKey, X: Extra>(
    table: &mut HashTable<KeySlot<K, X>>,
    arena: &mut Arena,
    hash: u64,
    key: Key<'_, K>,
    entry: &ProducerEntry,
    x: X,
) -> bool {
    if let Some(slot) = table.find_mut(hash, |s| s.is(key)) {
        let KeySlot { st, x: sx, .. } = slot;
        st.replace(entry, arena);
        *sx = x;
        false
    } else {
        let st = State::from_entry(entry, arena);
        insert_new_slot(table, hash, key, st, x);
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
pub(super) fn keep_room<S>(table: &mut HashTable<S>, rehash: impl Fn(&S) -> u64) {
    if table.len() == table.capacity() {
        rebuild(table, rehash);
    }
}

#[cold]
#[inline(never)]
pub(super) fn rebuild<S>(table: &mut HashTable<S>, rehash: impl Fn(&S) -> u64) {
    let mut fresh = HashTable::with_capacity(table.len() + 1);
    for s in table.drain() {
        fresh.insert_unique(rehash(&s), s, &rehash);
    }
    *table = fresh;
}
