//! The order in which Kafka's broker writes the entries of a producer
//! snapshot: the iteration order of a Java `HashMap<Long, _>`.
//!
//! Kafka's `ProducerStateManager` keeps its producers in a
//! `java.util.HashMap` keyed by producer id and writes a snapshot by
//! iterating it, so the entries of a `.snapshot` file come in that map's
//! bucket order. Reproducing it is what lets a file read into a store and
//! exported again come out byte for byte as Kafka wrote it
//! (tests/fixtures/kafka/small). The rules, as `java.util.HashMap` (JDK 8
//! on) applies them to a map filled by `put` from empty:
//!
//! - the hash of a `Long` `v` is `h = (int)(v ^ (v >>> 32))`, spread as
//!   `h ^ (h >>> 16)`; the bucket is the spread hash `& (capacity - 1)`;
//! - the table starts at capacity 16 and doubles whenever the size exceeds
//!   0.75 x capacity, and also when a bucket of a table smaller than 64
//!   would hold a ninth entry (`treeifyBin` resizes instead of building a
//!   tree there);
//! - iteration goes bucket by bucket; inside a bucket, in insertion order
//!   (a resize splits a bucket keeping the relative order).
//!
//! What this cannot know is the map's history: the entries are taken as
//! inserted in ascending producer id order (Kafka allocates ids in
//! ascending blocks, and a map reloaded from a snapshot is filled in the
//! file's order, which inside a bucket is again insertion order), into a
//! table that never held more producers than it holds now. A Kafka map
//! whose table grew for producers that later expired (a `HashMap` never
//! shrinks), whose producers first appeared out of id order within one
//! bucket, or with a bucket of nine or more producers in a table of 64 or
//! more (Java then keeps a red-black tree, whose iteration order this does
//! not model) can iterate otherwise: such files hold the same entries in
//! another order, and compare equal as sets (docs/format.md says why
//! Kafka reads both to the same producers).
//!
//! tests/fixtures/kafka/hashmap-order.txt holds iteration orders that
//! `java.util.HashMap` itself produced, which the tests compare with.

use crate::engine::kafka::entry::KafkaProducerEntry;

/// Java's initial `HashMap` capacity.
const INITIAL_CAPACITY: usize = 16;
/// Below this capacity a crowded bucket doubles the table (Java's
/// `MIN_TREEIFY_CAPACITY`).
const MIN_TREEIFY_CAPACITY: usize = 64;
/// A bucket that would hold more than this many entries is "crowded"
/// (Java's `TREEIFY_THRESHOLD` is 8: the ninth entry triggers it).
const TREEIFY_THRESHOLD: usize = 8;

/// `Long.hashCode(v)` spread as `HashMap.hash` does.
pub(crate) fn spread_hash(producer_id: i64) -> u32 {
    let v = producer_id as u64;
    let h = (v ^ (v >> 32)) as u32;
    h ^ (h >> 16)
}

fn bucket(producer_id: i64, capacity: usize) -> usize {
    spread_hash(producer_id) as usize & (capacity - 1)
}

/// The capacity of a `HashMap` after `put` of `ids`, in this order, from
/// empty (see the module docs).
pub(crate) fn capacity(ids: &[i64]) -> usize {
    let mut cap = INITIAL_CAPACITY;
    let mut counts = vec![0usize; cap];
    let recount = |cap: usize, inserted: &[i64]| {
        let mut c = vec![0usize; cap];
        for &id in inserted {
            if let Some(n) = c.get_mut(bucket(id, cap)) {
                *n += 1;
            }
        }
        c
    };
    for (i, &id) in ids.iter().enumerate() {
        let size = i + 1;
        let b = bucket(id, cap);
        let before = counts.get(b).copied().unwrap_or(0);
        if let Some(n) = counts.get_mut(b) {
            *n += 1;
        }
        if before >= TREEIFY_THRESHOLD && cap < MIN_TREEIFY_CAPACITY {
            cap *= 2;
            counts = recount(cap, ids.get(..size).unwrap_or_default());
        }
        if size > cap / 4 * 3 {
            cap *= 2;
            counts = recount(cap, ids.get(..size).unwrap_or_default());
        }
    }
    cap
}

/// Reorders `entries` as Kafka's broker writes them: the iteration order of
/// a Java `HashMap<Long, _>` filled in ascending producer id order (see the
/// module docs for what that assumes). Entries with the same producer id
/// keep their relative order (a snapshot never has two).
///
/// ```
/// use producer_state::kafka::{self, KafkaProducerEntry};
///
/// let e = |producer_id| KafkaProducerEntry {
///     producer_id, epoch: 0, last_sequence: 0, last_offset: 0, offset_delta: 0,
///     timestamp: 0, coordinator_epoch: -1, current_txn_first_offset: -1,
/// };
/// // 2^53 + 1 hashes to bucket 1 of 16, so it comes second.
/// let mut v: Vec<_> = [1003, 1000, 9_007_199_254_740_993, 0].map(e).to_vec();
/// kafka::sort_in_kafka_order(&mut v);
/// let ids: Vec<i64> = v.iter().map(|e| e.producer_id).collect();
/// assert_eq!(ids, [0, 9_007_199_254_740_993, 1000, 1003]);
/// ```
pub fn sort_in_kafka_order(entries: &mut [KafkaProducerEntry]) {
    entries.sort_by_key(|e| e.producer_id);
    let ids: Vec<i64> = entries.iter().map(|e| e.producer_id).collect();
    let cap = capacity(&ids);
    // Stable: inside a bucket, ascending id (the insertion order).
    entries.sort_by_key(|e| bucket(e.producer_id, cap));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_hash_is_javas() {
        // Values computed by hand from the definition.
        assert_eq!(spread_hash(0), 0);
        assert_eq!(spread_hash(1000), 1000);
        assert_eq!(spread_hash(9_007_199_254_740_993), 0x0020_0021);
        // -1: v ^ (v >>> 32) = 0xffffffff_00000000 -> (int) 0; spread 0.
        assert_eq!(spread_hash(-1), 0);
        assert_eq!(spread_hash(1 << 32), 1);
    }

    #[test]
    fn the_table_grows_at_three_quarters_and_for_a_crowded_small_table() {
        let seq: Vec<i64> = (0..12).collect();
        assert_eq!(capacity(&seq), 16);
        let seq: Vec<i64> = (0..13).collect();
        assert_eq!(capacity(&seq), 32);
        let seq: Vec<i64> = (0..97).collect();
        assert_eq!(capacity(&seq), 256);
        // Eight ids in bucket 0 of 16: no resize; a ninth doubles to 32
        // (bucket 0 keeps 0, 32, 64, ...: 5 of them), nothing more.
        let crowd: Vec<i64> = (0..8).map(|i| i * 16).collect();
        assert_eq!(capacity(&crowd), 16);
        let crowd: Vec<i64> = (0..9).map(|i| i * 16).collect();
        assert_eq!(capacity(&crowd), 32);
        // Multiples of 64 share bucket 0 at 16 and 32: the ninth doubles
        // to 32, the tenth to 64; from 64 on Java builds a tree instead.
        let crowd: Vec<i64> = (0..10).map(|i| i * 64).collect();
        assert_eq!(capacity(&crowd), 64);
        let crowd: Vec<i64> = (0..20).map(|i| i * 64).collect();
        assert_eq!(capacity(&crowd), 64);
        assert_eq!(capacity(&[]), 16);
    }
}
