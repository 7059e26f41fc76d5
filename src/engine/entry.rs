//! One key's state, and the retry window it keeps.
//!
//! Like Kafka (`NUM_BATCHES_TO_RETAIN = 5`), an entry retains the last five
//! accepted batches of its current epoch so a retry of any of them can be
//! answered with the original offset and timestamp.
//!
//! The layout is chosen for a broker holding millions of keys, where every
//! append to a random key is a cache miss:
//!
//! - The [`Head`] (epoch, last sequence, window bookkeeping; 8 bytes) lives
//!   in the hash table slot, so classifying an append reads nothing else.
//! - The [`Window`] (100 bytes) lives out of line and an accepted append
//!   only *stores* into it: the ring position, the count and which batches
//!   carry metadata are in the head, so a push needs no load from the window
//!   and does not wait for its cache line.
//! - Batches of one epoch are consecutive (each starts at the previous one's
//!   last + 1), so the window keeps, per batch, the last sequence of the
//!   batch *before* it; first sequences are derived, and the newest batch's
//!   last sequence is the head's. 64-bit offsets and timestamps are pairs of
//!   `u32`, for 4-byte alignment without padding.
//!
//! Keys that only ever use the single-sequence `append` have no window at
//! all: there is no offset or timestamp to keep, and rule 4 answers their
//! retries from the last sequence alone.

use std::fmt;

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::engine::rules::{Current, next_sequence};

/// How many accepted batches an entry retains per key (Kafka's `NUM_BATCHES_TO_RETAIN`).
pub const RETAINED_BATCHES: usize = 5;
const N: usize = RETAINED_BATCHES;

/// Epoch, last sequence and window bookkeeping of one key: what the rules
/// read, kept inside the hash table slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub epoch: i16,
    /// Ring state: 0 = no retained batches (no window); 1..=4 = that many
    /// batches, the next one goes to slot `ring`; 5..=9 = five batches, the
    /// next one goes to (overwrites) slot `ring - 5`.
    ring: u8,
    /// Bit i set: ring slot i has metadata.
    mask: u8,
    pub last: i32,
}

/// One ring slot of a window: 20 bytes, so a push stores into one cache line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RingSlot {
    /// The last sequence of the batch before this one.
    prev: i32,
    offset: [u32; 2],
    timestamp: [u32; 2],
}

/// The out-of-line part of a retry window; meaningful only with its [`Head`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    slots: [RingSlot; N],
}

impl Window {
    pub(crate) const EMPTY: Window = Window {
        slots: [RingSlot {
            prev: 0,
            offset: [0; 2],
            timestamp: [0; 2],
        }; N],
    };
}

#[inline]
fn split(v: i64) -> [u32; 2] {
    let v = v as u64;
    [v as u32, (v >> 32) as u32]
}

#[inline]
fn join(v: [u32; 2]) -> i64 {
    (u64::from(v[0]) | (u64::from(v[1]) << 32)) as i64
}

impl Head {
    /// A key's head right after its first accepted append, without a window.
    #[inline]
    pub(crate) fn new(epoch: i16, last: i32) -> Head {
        Head {
            epoch,
            ring: 0,
            mask: 0,
            last,
        }
    }

    /// Builds a key's head and fills `window` from its retained batches
    /// given newest first, as snapshots from version 2 store them (the
    /// inverse of [`Head::newest_first`]): batch `k` ends where batch
    /// `k - 1` began (batch 0 at `last`) and spans `span(k)` sequences past
    /// its first; bit `k` of `has_meta` says it has metadata, and `meta(j)`
    /// is the `j`-th metadata of those that have it, newest first. Fills
    /// the window in the order [`ProducerEntry::from_parts`] would leave
    /// it. `None` if a batch would start below 0, a batch without metadata
    /// has more than one sequence, `last` is negative, or `n` exceeds
    /// [`RETAINED_BATCHES`].
    ///
    /// When every batch has metadata (a producer of batches: the common
    /// case) batch `k` takes `meta(k)` and no batch needs the span check
    /// of a batch without metadata: a loop without a branch per batch.
    ///
    /// The window lies where the caller keeps it (a snapshot's load
    /// decodes straight into the map's arena: an entry built on the stack
    /// and returned was copied twice on its way there) and must be
    /// [`Window::EMPTY`]; `span` and `meta` are each asked once per batch,
    /// in order (a decoder reads its deltas as it goes).
    #[inline(always)]
    pub(crate) fn fill_newest_first(
        epoch: i16,
        last: i32,
        n: usize,
        has_meta: u8,
        window: &mut Window,
        mut span: impl FnMut(usize) -> u32,
        mut meta: impl FnMut(usize) -> (i64, i64),
    ) -> Option<Head> {
        if last < 0 || n > N {
            return None;
        }
        let mut head = Head {
            epoch,
            ring: n as u8,
            mask: 0,
            last,
        };
        let all = (1u8 << n) - 1;
        let mut batch_last = last;
        if has_meta == all {
            head.mask = all;
            let mut bad = false;
            for (k, slot) in window.slots.iter_mut().take(n).rev().enumerate() {
                // Batch k (newest first) lies in ring slot n - 1 - k.
                let s = span(k);
                let (o, t) = meta(k);
                bad |= i64::from(s) > i64::from(batch_last);
                let p = batch_last.wrapping_sub(s as i32).wrapping_sub(1);
                // The previous batch's last sequence (the inverse of
                // `next_sequence`); for the oldest, what `push` keeps.
                batch_last = if p < 0 && k + 1 < n { i32::MAX } else { p };
                slot.prev = batch_last;
                slot.offset = split(o);
                slot.timestamp = split(t);
            }
            return (!bad).then_some(head);
        }
        let mut j = 0;
        for (k, slot) in window.slots.iter_mut().take(n).rev().enumerate() {
            let s = span(k);
            let has = has_meta >> k & 1 != 0;
            if i64::from(s) > i64::from(batch_last) || (!has && s != 0) {
                return None;
            }
            let p = (batch_last - s as i32).wrapping_sub(1);
            batch_last = if p < 0 && k + 1 < n { i32::MAX } else { p };
            slot.prev = batch_last;
            if has {
                let (o, t) = meta(j);
                slot.offset = split(o);
                slot.timestamp = split(t);
                head.mask |= 1 << (n - 1 - k);
                j += 1;
            }
        }
        Some(head)
    }

    /// True when the key retains batches (it has a window).
    #[inline]
    pub(crate) fn windowed(&self) -> bool {
        self.ring != 0
    }

    #[inline]
    fn count(&self) -> usize {
        usize::from(self.ring.min(N as u8))
    }

    /// The ring slot the next batch goes to.
    #[inline]
    fn pos(&self) -> usize {
        usize::from(if self.ring < N as u8 {
            self.ring
        } else {
            self.ring - N as u8
        })
    }

    /// The retained batches newest first, as snapshots encode them (the
    /// inverse of [`Head::fill_newest_first`]): how many, each
    /// one's span (last - first sequence), the metadata mask (bit k: batch
    /// k has metadata) and the metadata of those that have it, newest
    /// first, packed (as many as the mask has bits). Read straight from
    /// the ring, without building the batches; the window by reference
    /// (a snapshot reads it where it lies, in the map's arena).
    #[inline]
    pub(crate) fn newest_first(&self, window: &Window) -> (usize, [u32; N], u8, [(i64, i64); N]) {
        let n = self.count();
        let pos = self.pos();
        let mut spans = [0u32; N];
        let mut mask = 0u8;
        let mut metas = [(0i64, 0i64); N];
        let mut m = 0;
        let mut last = self.last;
        // Ring slots from the newest (just before `pos`) backwards.
        let mut i = if pos == 0 { N - 1 } else { pos - 1 };
        // The slots in use are 0..n (the ring wraps only when full): when
        // every one has metadata, batch k's is `metas[k]`, no branch.
        let all = (1u8 << n) - 1;
        if self.mask == all {
            for ((span, meta), _) in spans.iter_mut().zip(&mut metas).zip(0..n) {
                let slot = &window.slots[i];
                *span = last.wrapping_sub(next_sequence(slot.prev)) as u32;
                last = slot.prev;
                *meta = (join(slot.offset), join(slot.timestamp));
                i = if i == 0 { N - 1 } else { i - 1 };
            }
            return (n, spans, all, metas);
        }
        for (k, span) in spans.iter_mut().enumerate().take(n) {
            let slot = &window.slots[i];
            *span = last.wrapping_sub(next_sequence(slot.prev)) as u32;
            last = slot.prev;
            if self.mask & (1 << i) != 0 {
                mask |= 1 << k;
                metas[m] = (join(slot.offset), join(slot.timestamp));
                m += 1;
            }
            i = if i == 0 { N - 1 } else { i - 1 };
        }
        (n, spans, mask, metas)
    }

    #[inline]
    pub(crate) fn current(&self) -> Current {
        Current {
            epoch: self.epoch,
            last_sequence: self.last,
        }
    }

    /// Applies an accepted append to a key that has no window and does not
    /// need one (no metadata): only the epoch and last sequence change.
    #[inline]
    pub(crate) fn accept_plain(&mut self, epoch: i16, last: i32) {
        self.epoch = epoch;
        self.last = last;
    }

    /// Applies an accepted append to a windowed key (or one becoming
    /// windowed): stores into `window`, never loads from it.
    #[inline(always)]
    pub(crate) fn push(
        &mut self,
        window: &mut Window,
        new_session: bool,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) {
        let ring = if new_session { 0 } else { self.ring };
        let pos = if ring < N as u8 { ring } else { ring - N as u8 };
        let slot = &mut window.slots[usize::from(pos)];
        // The previous batch's last sequence; for a fresh window only the
        // derived first sequence matters, and next(first - 1) == first.
        slot.prev = if ring == 0 {
            first.wrapping_sub(1)
        } else {
            self.last
        };
        let mask = if ring == 0 { 0 } else { self.mask };
        self.mask = match meta {
            Some(m) => {
                slot.offset = split(m.offset);
                slot.timestamp = split(m.timestamp);
                mask | 1 << pos
            }
            None => mask & !(1 << pos),
        };
        self.ring = if ring < 2 * N as u8 - 1 {
            ring + 1
        } else {
            N as u8
        };
        self.epoch = epoch;
        self.last = last;
    }

    /// The retained batches, oldest first.
    pub(crate) fn batches<'a>(&self, window: &'a Window) -> Batches<'a> {
        Batches {
            window,
            head: *self,
            i: 0,
            count: self.count(),
        }
    }

    /// The metadata of the retained batch with exactly these sequences.
    #[inline]
    pub(crate) fn find(
        &self,
        window: &Window,
        first: i32,
        last: i32,
    ) -> Option<Option<BatchMetadata>> {
        self.batches(window)
            .find(|b| b.first_sequence == first && b.last_sequence == last)
            .map(|b| b.metadata)
    }
}

/// Iterator over an entry's retained batches, oldest first.
#[derive(Clone, Debug)]
pub struct Batches<'a> {
    window: &'a Window,
    head: Head,
    i: usize,
    count: usize,
}

impl Iterator for Batches<'_> {
    type Item = RetainedBatch;

    fn next(&mut self) -> Option<RetainedBatch> {
        if self.i >= self.count {
            return None;
        }
        let i = (self.head.pos() + N - self.count + self.i) % N;
        let slot = &self.window.slots[i];
        let last_sequence = if self.i + 1 == self.count {
            self.head.last
        } else {
            self.window.slots[(i + 1) % N].prev
        };
        let b = RetainedBatch {
            first_sequence: next_sequence(slot.prev),
            last_sequence,
            metadata: (self.head.mask & (1 << i) != 0).then(|| BatchMetadata {
                offset: join(slot.offset),
                timestamp: join(slot.timestamp),
            }),
        };
        self.i += 1;
        Some(b)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.count - self.i.min(self.count);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches<'_> {}

/// The state of one (producer id, partition) key: its epoch, its last
/// accepted sequence, and the batches it retains to answer retries.
#[derive(Clone, Copy)]
pub struct ProducerEntry {
    pub(crate) head: Head,
    pub(crate) window: Window,
}

impl ProducerEntry {
    /// The entry right after an append accepted with no prior state.
    pub(crate) fn start(epoch: i16, first: i32, last: i32, meta: Option<BatchMetadata>) -> Self {
        let mut e = ProducerEntry {
            head: Head::new(epoch, last),
            window: Window::EMPTY,
        };
        if meta.is_some() {
            e.head.push(&mut e.window, true, epoch, first, last, meta);
        }
        e
    }

    /// Builds an entry from its parts (decoding a snapshot). `None` if the
    /// parts are inconsistent: a negative last sequence, more than
    /// [`RETAINED_BATCHES`] batches, or retained batches that are malformed,
    /// not consecutive, or do not end at `last`.
    pub(crate) fn from_parts(epoch: i16, last: i32, batches: &[RetainedBatch]) -> Option<Self> {
        if last < 0 || batches.len() > N {
            return None;
        }
        let mut e = ProducerEntry {
            head: Head::new(epoch, last),
            window: Window::EMPTY,
        };
        let mut prev_last = None;
        for b in batches {
            let well_formed = b.first_sequence >= 0
                && b.last_sequence >= b.first_sequence
                && (b.metadata.is_some() || b.first_sequence == b.last_sequence);
            let consecutive = prev_last.is_none_or(|p| b.first_sequence == next_sequence(p));
            if !well_formed || !consecutive {
                return None;
            }
            let fresh = prev_last.is_none();
            e.head.push(
                &mut e.window,
                fresh,
                epoch,
                b.first_sequence,
                b.last_sequence,
                b.metadata,
            );
            prev_last = Some(b.last_sequence);
        }
        if prev_last.is_some_and(|p| p != last) {
            return None;
        }
        e.head.last = last;
        Some(e)
    }

    /// The epoch (producer session) on file.
    pub fn epoch(&self) -> i16 {
        self.head.epoch
    }

    /// The last accepted sequence.
    pub fn last_sequence(&self) -> i32 {
        self.head.last
    }

    /// The retained batches, oldest first: at most [`RETAINED_BATCHES`], all
    /// of the current epoch. Empty for keys that only used the
    /// single-sequence `append`.
    pub fn retained_batches(&self) -> Batches<'_> {
        self.head.batches(&self.window)
    }

    /// The timestamp of the newest retained batch: `None` when that batch
    /// carries no metadata (a single-sequence append) or none is
    /// retained. Kafka's `lastTimestamp` of a plain producer, and what
    /// the engine's expiration judges a key by: a key whose newest append
    /// carried no timestamp never expires there, whatever older batches
    /// say (see [`ProducerEntry::activity_without_clock`] for the other
    /// rule).
    pub(crate) fn last_batch_timestamp(&self) -> Option<i64> {
        self.retained_batches()
            .last()
            .and_then(|b| b.metadata)
            .map(|m| m.timestamp)
    }

    /// The activity stated for a key where no clock recorded one: the
    /// newest timestamp any retained batch carries, looking past batches
    /// without metadata, else 0. A snapshot of version 1 or 2 (which kept
    /// no activity) is read with it, and the in-memory engine (which keeps
    /// no clock) reports and writes it. It differs from
    /// [`ProducerEntry::last_batch_timestamp`] for a key whose newest
    /// batch has no metadata and an older one has: this gives the older
    /// one's time, that gives none. Both are kept as they are because
    /// snapshot bytes and recovered states depend on each.
    pub(crate) fn activity_without_clock(&self) -> i64 {
        self.retained_batches()
            .filter_map(|b| b.metadata)
            .last()
            .map_or(0, |m| m.timestamp)
    }

    #[inline]
    pub(crate) fn current(&self) -> Current {
        self.head.current()
    }

    #[inline]
    pub(crate) fn find(&self, first: i32, last: i32) -> Option<Option<BatchMetadata>> {
        self.head.find(&self.window, first, last)
    }

    /// Applies an accepted append. `new_session`: rules 1 or 3 accepted it.
    pub(crate) fn accept(
        &mut self,
        new_session: bool,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) {
        if self.head.windowed() || meta.is_some() {
            self.head
                .push(&mut self.window, new_session, epoch, first, last, meta);
        } else {
            self.head.accept_plain(epoch, last);
        }
    }
}

impl PartialEq for ProducerEntry {
    /// Entries are equal when they say the same: epoch, last sequence and
    /// retained batches (not the ring's internal rotation).
    fn eq(&self, other: &Self) -> bool {
        self.head.epoch == other.head.epoch
            && self.head.last == other.head.last
            && self.retained_batches().eq(other.retained_batches())
    }
}

impl Eq for ProducerEntry {}

impl fmt::Debug for ProducerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerEntry")
            .field("epoch", &self.head.epoch)
            .field("last_sequence", &self.head.last)
            .field("retained", &self.retained_batches().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(offset: i64) -> Option<BatchMetadata> {
        Some(BatchMetadata {
            offset,
            timestamp: -offset,
        })
    }

    fn seqs(e: &ProducerEntry) -> Vec<(i32, i32)> {
        e.retained_batches()
            .map(|b| (b.first_sequence, b.last_sequence))
            .collect()
    }

    #[test]
    fn sizes_are_as_designed() {
        assert_eq!(std::mem::size_of::<Window>(), 100);
        assert_eq!(std::mem::align_of::<Window>(), 4);
        assert_eq!(std::mem::size_of::<Head>(), 8);
    }

    #[test]
    fn the_window_keeps_the_last_five_consecutive_batches() {
        let mut e = ProducerEntry::start(0, 0, 2, meta(100));
        for (i, last) in [4, 5, 9, 10, 14, 20].into_iter().enumerate() {
            let m = if i == 2 { None } else { meta(200 + i as i64) };
            let first = next_sequence(e.last_sequence());
            e.accept(false, 0, first, last, m);
        }
        assert_eq!(seqs(&e), vec![(5, 5), (6, 9), (10, 10), (11, 14), (15, 20)]);
        assert_eq!(e.last_sequence(), 20);
        assert_eq!(e.find(6, 9), Some(None));
        assert_eq!(e.find(10, 10), Some(meta(203)));
        assert_eq!(e.find(15, 20), Some(meta(205)));
        assert_eq!(e.find(0, 2), None);
        assert_eq!(e.find(6, 8), None);
        assert_eq!(e.retained_batches().len(), 5);
        // A new session starts the window over.
        e.accept(true, 1, 0, 3, meta(7));
        assert_eq!(seqs(&e), vec![(0, 3)]);
        assert_eq!(e.epoch(), 1);
    }

    #[test]
    fn offsets_and_timestamps_survive_the_split_at_every_extreme() {
        for v in [0, 1, -1, i64::MIN, i64::MAX, 1 << 32, (1 << 32) - 1] {
            let m = Some(BatchMetadata {
                offset: v,
                timestamp: !v,
            });
            let e = ProducerEntry::start(0, 0, 3, m);
            assert_eq!(e.find(0, 3), Some(m));
        }
    }

    #[test]
    fn windows_wrap_with_the_sequence() {
        let mut e = ProducerEntry::start(0, 0, i32::MAX - 2, None);
        e.accept(false, 0, i32::MAX - 1, i32::MAX, meta(1));
        e.accept(false, 0, 0, 3, meta(2));
        assert_eq!(seqs(&e), vec![(i32::MAX - 1, i32::MAX), (0, 3)]);
        assert_eq!(e.find(i32::MAX - 1, i32::MAX), Some(meta(1)));
    }

    #[test]
    fn from_parts_round_trips_and_rejects_inconsistent_entries() {
        let b = |f, l, m| RetainedBatch {
            first_sequence: f,
            last_sequence: l,
            metadata: m,
        };
        let good = [b(0, 2, meta(1)), b(3, 3, None), b(4, 5, meta(2))];
        let e = ProducerEntry::from_parts(0, 5, &good).unwrap();
        assert_eq!(e.retained_batches().collect::<Vec<_>>(), good);
        assert!(ProducerEntry::from_parts(0, 5, &[b(0, 2, meta(1)), b(4, 5, meta(2))]).is_none());
        assert!(ProducerEntry::from_parts(0, 6, &good).is_none());
        assert!(ProducerEntry::from_parts(0, 5, &[b(0, 5, None)]).is_none());
        assert!(ProducerEntry::from_parts(0, 5, &[b(5, 4, meta(1))]).is_none());
        assert!(ProducerEntry::from_parts(0, -1, &[]).is_none());
        assert!(ProducerEntry::from_parts(0, 5, &[b(5, 5, None); 6]).is_none());
        let plain = ProducerEntry::from_parts(3, 9, &[]).unwrap();
        assert_eq!(
            (
                plain.epoch(),
                plain.last_sequence(),
                plain.retained_batches().len()
            ),
            (3, 9, 0)
        );
    }

    #[test]
    fn the_two_timestamp_rules_differ_only_past_a_batch_without_metadata() {
        let with = |ts| {
            Some(BatchMetadata {
                offset: 0,
                timestamp: ts,
            })
        };
        // Newest batch with metadata: both rules give its time.
        let mut e = ProducerEntry::start(0, 0, 4, with(100));
        e.accept(false, 0, 5, 9, with(200));
        assert_eq!(e.last_batch_timestamp(), Some(200));
        assert_eq!(e.activity_without_clock(), 200);
        // A single-sequence append (no metadata) after it: the newest
        // batch has no time, so expiration has none to judge by, while the
        // activity stated without a clock is still the older batch's.
        e.accept(false, 0, 10, 10, None);
        assert_eq!(e.last_batch_timestamp(), None);
        assert_eq!(e.activity_without_clock(), 200);
        // No batch with metadata at all.
        let plain = ProducerEntry::start(0, 0, 0, None);
        assert_eq!(plain.last_batch_timestamp(), None);
        assert_eq!(plain.activity_without_clock(), 0);
    }
}
