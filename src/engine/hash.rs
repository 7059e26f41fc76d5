//! The fixed hash of a key: one multiply-fold for a numeric id, word
//! folds for an inline name, 16-byte blocks for a long one. No random
//! seed: the table's layout and the benchmarks are reproducible, and
//! producer ids are handed out by the broker, not chosen by clients, so
//! hash flooding is not the threat model here. Snapshots group keys by
//! shard with it, so it is part of what a file's order depends on.

use crate::id::ProducerId;

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

/// A key with its hash already computed: what the map and the shards take
/// to insert or install a key, so that a caller that hashed the key once
/// (to find its shard, or to warm its slot) does not hash it again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HashedKey<'a> {
    pub(crate) hash: u64,
    pub(crate) id: &'a ProducerId,
    pub(crate) partition: i32,
}

impl<'a> HashedKey<'a> {
    /// The key `(id, partition)`, hashed with [`hash_key`].
    #[inline(always)]
    pub(crate) fn new(id: &'a ProducerId, partition: i32) -> HashedKey<'a> {
        HashedKey {
            hash: hash_key(id, partition),
            id,
            partition,
        }
    }

    /// The key `(id, partition)` with its hash `hash`, computed before.
    #[inline(always)]
    pub(crate) fn hashed(hash: u64, id: &'a ProducerId, partition: i32) -> HashedKey<'a> {
        HashedKey {
            hash,
            id,
            partition,
        }
    }
}
