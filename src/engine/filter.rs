//! A compact memory of keys whose state was removed (expired or evicted).
//!
//! A producer whose state expired or was evicted and who then retries (or
//! continues at some sequence above 0) looks exactly like a producer never
//! seen: rule 1 answers `OUT_OF_ORDER` either way. A broker wants to tell
//! the two apart (docs/lifecycle.md says what to answer in each case), and
//! remembering the removed keys themselves would cost what the table saved.
//! So the store keeps a Bloom filter: [`RemovedFilter::contains`] never
//! misses a key among the last removals it remembers, and says "removed"
//! for a key never removed with a small probability.
//!
//! Bounded under endless churn: two generations of [`CAPACITY`] keys each
//! in [`BITS`] bits (1 MiB); when the current one is full the older is
//! cleared and becomes the current. So the filter remembers the last
//! `CAPACITY` to `2 x CAPACITY` removals, in 2 MiB at most (nothing until
//! the first removal), and a lookup's false positive rate stays below
//! about 0.5% (16 bits per key, 5 of them set, all in one 512-bit block
//! so that an insert or a lookup costs one cache miss; the block costs a
//! little accuracy against bits spread over the whole generation).
//!
//! Deterministic: its bits depend only on the keys removed and their order,
//! which the log holds, and a snapshot stores them; the hash of a key is
//! the store's own fixed hash.

#![deny(clippy::indexing_slicing)]

/// Bits per generation: 2^23 (1 MiB).
pub(crate) const BITS_LOG2: u32 = 23;
pub(crate) const BITS: usize = 1 << BITS_LOG2;
pub(crate) const WORDS: usize = BITS / 64;
/// Keys per generation before it rotates.
pub(crate) const CAPACITY: u32 = 1 << 19;
/// Bits set per key.
const HASHES: u64 = 5;

/// One generation: its bits and how many keys it took.
#[derive(Clone, PartialEq, Eq)]
struct Generation {
    words: Vec<u64>,
    count: u32,
}

impl Generation {
    fn empty() -> Generation {
        Generation {
            words: vec![0; WORDS],
            count: 0,
        }
    }
}

/// The filter of removed keys (see the module docs).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct RemovedFilter {
    /// Allocated at the first removal.
    gens: Option<Box<[Generation; 2]>>,
    /// The generation that takes new keys.
    current: u8,
}

impl std::fmt::Debug for RemovedFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.gens {
            None => f.write_str("RemovedFilter(empty)"),
            Some(g) => {
                let [a, b] = &**g;
                write!(
                    f,
                    "RemovedFilter(current {}, counts {} and {})",
                    self.current, a.count, b.count
                )
            }
        }
    }
}

/// Bits of one block: a key's bits all lie in one block of 512 bits (one
/// cache line), so an insert or a lookup costs one cache miss, not one per
/// bit (a blocked Bloom filter).
const BLOCK_LOG2: u32 = 9;

/// The first bit of the block of a key with hash `hash`: its top bits.
#[inline(always)]
fn block_of(hash: u64) -> usize {
    ((hash >> (64 - (BITS_LOG2 - BLOCK_LOG2))) as usize) << BLOCK_LOG2
}

/// The bits of a key with hash `hash` within its block: from a second
/// mix of the hash. The one definition of them, which the filter's bytes
/// in snapshots depend on.
#[inline(always)]
fn bits_in_block(hash: u64) -> impl Iterator<Item = usize> {
    let mut h = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..HASHES).map(move |_| {
        h = h.rotate_left(BLOCK_LOG2);
        h as usize & ((1 << BLOCK_LOG2) - 1)
    })
}

/// The bit positions of a key with hash `hash`: a block chosen by its top
/// bits, and [`bits_in_block`] in it.
#[inline]
fn positions(hash: u64) -> impl Iterator<Item = usize> {
    let block = block_of(hash);
    bits_in_block(hash).map(move |bit| block + bit)
}

/// Sets the bits of the key with hash `hash` ([`positions`]) in
/// `words`: the same bits, with the block borrowed once as an array so
/// that setting each one needs no bounds check (an eviction pass inserts
/// thousands of keys).
#[inline(always)]
fn set_bits(words: &mut [u64], hash: u64) {
    const BLOCK_WORDS: usize = 1 << (BLOCK_LOG2 - 6);
    let first = block_of(hash) / 64;
    let Some(block) = words
        .get_mut(first..first + BLOCK_WORDS)
        .and_then(|b| <&mut [u64; BLOCK_WORDS]>::try_from(b).ok())
    else {
        return;
    };
    for bit in bits_in_block(hash) {
        if let Some(w) = block.get_mut(bit / 64) {
            *w |= 1 << (bit % 64);
        }
    }
}

/// Which generation takes new keys, and each generation's keys taken and
/// bits: a filter as a snapshot stores it.
pub(crate) type Generations<'a> = (u8, [(u32, &'a [u64]); 2]);

/// Keys whose blocks [`RemovedFilter::insert_all`] reads ahead at once.
const WARM_CHUNK: usize = 32;

impl RemovedFilter {
    /// Remembers the keys with these hashes, in order, as
    /// [`RemovedFilter::insert`] one after the other would. Each insert is
    /// a cache miss (the generation, 1 MiB, does not stay in a core's
    /// cache beside the table), and a loop of inserts keeps few of them in
    /// flight; so a chunk's blocks are read first, in a loop of loads
    /// alone, and then set.
    pub(crate) fn insert_all(&mut self, hashes: impl Iterator<Item = u64>) {
        let mut chunk = [0u64; WARM_CHUNK];
        let mut hashes = hashes.peekable();
        while hashes.peek().is_some() {
            let mut len = 0;
            for (slot, h) in chunk.iter_mut().zip(hashes.by_ref()) {
                *slot = h;
                len += 1;
            }
            let part = chunk.get(..len).unwrap_or_default();
            if let Some(g) = self
                .gens
                .as_ref()
                .and_then(|g| g.get(usize::from(self.current & 1)))
            {
                let sum = part.iter().fold(0u64, |acc, &h| {
                    acc ^ g.words.get(block_of(h) / 64).copied().unwrap_or(0)
                });
                std::hint::black_box(sum);
            }
            for &h in part {
                self.insert(h);
            }
        }
    }

    /// Remembers the key with hash `hash`.
    pub(crate) fn insert(&mut self, hash: u64) {
        let gens = self
            .gens
            .get_or_insert_with(|| Box::new([Generation::empty(), Generation::empty()]));
        let mut cur = usize::from(self.current & 1);
        if gens.get(cur).is_some_and(|g| g.count >= CAPACITY) {
            cur ^= 1;
            self.current = cur as u8;
            if let Some(g) = gens.get_mut(cur) {
                g.words.fill(0);
                g.count = 0;
            }
        }
        if let Some(g) = gens.get_mut(cur) {
            set_bits(&mut g.words, hash);
            g.count += 1;
        }
    }

    /// True if the key with hash `hash` was probably removed (never false
    /// for a key among the removals remembered).
    pub(crate) fn contains(&self, hash: u64) -> bool {
        let Some(gens) = &self.gens else {
            return false;
        };
        gens.iter().any(|g| {
            g.count > 0
                && positions(hash).all(|p| {
                    g.words
                        .get(p / 64)
                        .is_some_and(|w| w & (1 << (p % 64)) != 0)
                })
        })
    }

    /// The generations as (keys taken, bits), with the one that takes new
    /// keys; `None` before the first removal. What a snapshot stores.
    pub(crate) fn generations(&self) -> Option<Generations<'_>> {
        let [a, b] = &**self.gens.as_ref()?;
        Some((self.current, [(a.count, &a.words), (b.count, &b.words)]))
    }

    /// A filter of two generations as a snapshot stored them (checked by
    /// the reader: `current` is 0 or 1, each count at most [`CAPACITY`],
    /// each generation [`WORDS`] words).
    pub(crate) fn from_generations(current: u8, gens: [(u32, Vec<u64>); 2]) -> RemovedFilter {
        let [(ca, wa), (cb, wb)] = gens;
        RemovedFilter {
            gens: Some(Box::new([
                Generation {
                    words: wa,
                    count: ca,
                },
                Generation {
                    words: wb,
                    count: cb,
                },
            ])),
            current,
        }
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::engine::map::hash_key;
    use crate::id::ProducerId;

    fn h(k: u64) -> u64 {
        hash_key(&ProducerId::numeric(k), (k % 7) as i32)
    }

    #[test]
    fn an_insert_sets_exactly_the_bits_of_its_positions() {
        // `set_bits` must set the bits `positions` (which lookups read)
        // names: the filter's bytes are in snapshots.
        for k in 0..2_000u64 {
            let hash = h(k) ^ k.rotate_left(17);
            let mut words = vec![0u64; WORDS];
            set_bits(&mut words, hash);
            let mut want = vec![0u64; WORDS];
            for p in positions(hash) {
                want[p / 64] |= 1 << (p % 64);
            }
            assert_eq!(words, want, "key {k}");
        }
    }

    #[test]
    fn removed_keys_are_remembered_and_others_rarely_match() {
        let mut f = RemovedFilter::default();
        assert!(!f.contains(h(1)));
        for k in 0..100_000 {
            f.insert(h(k));
        }
        assert!((0..100_000).all(|k| f.contains(h(k))));
        let false_positives = (1_000_000..1_100_000).filter(|&k| f.contains(h(k))).count();
        assert!(false_positives < 100, "{false_positives} of 100,000");
    }

    #[test]
    fn the_filter_rotates_and_forgets_the_oldest_generation() {
        let mut f = RemovedFilter::default();
        let n = u64::from(CAPACITY);
        for k in 0..3 * n {
            f.insert(h(k));
        }
        // The last 2 x CAPACITY keys are remembered; the first are gone
        // (but for false positives).
        assert!((n..3 * n).step_by(97).all(|k| f.contains(h(k))));
        let remembered = (0..n).step_by(97).filter(|&k| f.contains(h(k))).count();
        assert!(remembered < 100, "{remembered}");
        let fp = (10 * n..10 * n + 100_000)
            .filter(|&k| f.contains(h(k)))
            .count();
        assert!(fp < 500, "{fp} false positives of 100,000 when full");
    }

    #[test]
    fn insert_all_is_insert_one_after_the_other_across_a_rotation() {
        let hashes: Vec<u64> = (0..CAPACITY as u64 + 1_000)
            .map(|k| hash_key(&ProducerId::numeric(k), 0))
            .collect();
        let (mut one, mut all) = (RemovedFilter::default(), RemovedFilter::default());
        // A chunk that ends part-way, then the rest through the rotation.
        for &h in &hashes {
            one.insert(h);
        }
        all.insert_all(hashes.iter().take(45).copied());
        all.insert_all(hashes.iter().skip(45).copied());
        assert_eq!(one, all);
        assert_eq!(all.current, 1, "it rotated");
    }
}
