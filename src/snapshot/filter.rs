//! The removed-key filter's bytes in a snapshot's store section
//! (docs/format.md, "The removed-key filter"). The filter itself, and what
//! its bits mean, is the engine's (`engine/filter.rs`).

#![deny(clippy::indexing_slicing)]

use crate::codec::{Dec, Put};
use crate::engine::filter::{BITS, CAPACITY, RemovedFilter, WORDS};
use crate::error::Corruption;

/// Appends the filter's bytes: a generation whose set bits take less room
/// as a list of indexes than as a bitmap is stored as the list.
pub(crate) fn encode(filter: &RemovedFilter, buf: &mut Vec<u8>) {
    let Some((current, gens)) = filter.generations() else {
        buf.put_u8(0);
        return;
    };
    buf.put_u8(1);
    buf.put_u8(current);
    for (count, words) in gens {
        buf.put_u32(count);
        let set: usize = words.iter().map(|w| w.count_ones() as usize).sum();
        if set * 4 < WORDS * 8 {
            buf.put_u8(0);
            buf.put_u32(set as u32);
            for (i, &w) in words.iter().enumerate() {
                let mut w = w;
                while w != 0 {
                    let b = w.trailing_zeros();
                    buf.put_u32((i * 64) as u32 + b);
                    w &= w - 1;
                }
            }
        } else {
            buf.put_u8(1);
            for &w in words {
                buf.put_u64(w);
            }
        }
    }
}

/// Decodes what [`encode`] wrote.
pub(crate) fn decode(d: &mut Dec<'_>) -> Result<RemovedFilter, Corruption> {
    let short = || Corruption::BadField("removed-key filter (too short)");
    match d.u8().ok_or_else(short)? {
        0 => return Ok(RemovedFilter::default()),
        1 => {}
        _ => return Err(Corruption::BadField("removed-key filter flag")),
    }
    let current = d.u8().ok_or_else(short)?;
    if current > 1 {
        return Err(Corruption::BadField("removed-key filter generation"));
    }
    let mut gens = [(0, Vec::new()), (0, Vec::new())];
    for (count, words) in gens.iter_mut() {
        *count = d.u32().ok_or_else(short)?;
        if *count > CAPACITY {
            return Err(Corruption::BadField("removed-key filter count"));
        }
        *words = vec![0u64; WORDS];
        match d.u8().ok_or_else(short)? {
            0 => {
                let n = d.u32().ok_or_else(short)? as usize;
                let mut prev: Option<u32> = None;
                for _ in 0..n {
                    let b = d.u32().ok_or_else(short)?;
                    if b as usize >= BITS || prev.is_some_and(|p| b <= p) {
                        return Err(Corruption::BadField("removed-key filter bit index"));
                    }
                    prev = Some(b);
                    if let Some(w) = words.get_mut(b as usize / 64) {
                        *w |= 1 << (b % 64);
                    }
                }
            }
            1 => {
                for w in words.iter_mut() {
                    *w = d.u64().ok_or_else(short)?;
                }
            }
            _ => return Err(Corruption::BadField("removed-key filter encoding")),
        }
    }
    Ok(RemovedFilter::from_generations(current, gens))
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

    fn round_trip(f: &RemovedFilter) -> RemovedFilter {
        let mut b = Vec::new();
        encode(f, &mut b);
        let mut d = Dec::new(&b);
        let g = decode(&mut d).unwrap();
        assert_eq!(d.remaining(), 0);
        g
    }

    #[test]
    fn sparse_generations_are_lists_and_dense_ones_bitmaps_and_both_round_trip() {
        assert!(round_trip(&RemovedFilter::default()) == RemovedFilter::default());
        let mut f = RemovedFilter::default();
        for k in 0..100_000 {
            f.insert(h(k));
        }
        // Sparse: a list of indexes, far below the 2 MiB of the bitmaps.
        let mut b = Vec::new();
        encode(&f, &mut b);
        assert!(b.len() < 2_100_000 && b.len() > 100_000 * 4, "{}", b.len());
        assert!(round_trip(&f) == f);
        // Dense, after a rotation.
        for k in 0..3 * u64::from(CAPACITY) {
            f.insert(h(k));
        }
        let mut b = Vec::new();
        encode(&f, &mut b);
        assert!(b.len() >= 2 * WORDS * 8, "{}", b.len());
        assert!(round_trip(&f) == f, "a dense generation round-trips");
    }

    #[test]
    fn bad_bytes_are_corruption_never_a_panic() {
        let mut f = RemovedFilter::default();
        for k in 0..50 {
            f.insert(h(k));
        }
        let mut b = Vec::new();
        encode(&f, &mut b);
        for cut in 0..b.len() {
            assert!(decode(&mut Dec::new(&b[..cut])).is_err());
        }
        // Indexes out of order.
        let mut bad = b.clone();
        let first = 1 + 1 + 4 + 1 + 4;
        bad.swap(first, first + 4);
        bad.swap(first + 1, first + 5);
        bad.swap(first + 2, first + 6);
        bad.swap(first + 3, first + 7);
        assert!(decode(&mut Dec::new(&bad)).is_err());
        assert_eq!(
            decode(&mut Dec::new(&[2])),
            Err(Corruption::BadField("removed-key filter flag"))
        );
    }
}
