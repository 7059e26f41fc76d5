//! Each partition's end: the highest offset of any append of that
//! partition in the history, which `end_offset(partition)` reports and a
//! partition's truncation starts from (the store-level state of version 5).
//!
//! One store may hold many partitions, each the state of one partition
//! log, and those logs have offsets of their own: a broker whose partition
//! log is cut back (an unclean shutdown, a follower's divergence) must
//! take that one partition's state back without touching the others, and
//! must know, per partition, which offset the state has reached. The
//! store-wide highest offset ([`super::meta::Meta::high`]) is the largest
//! of these, and answers neither question.
//!
//! The rule: an append (a batch's offset, a single-sequence append's
//! position) or a marker raises its partition's end; a truncation of the
//! partition to `offset` sets it to `offset - 1`; a truncation of the
//! whole store to `offset` lowers every end above `offset - 1` to it; an
//! import raises it to the import's highest offset; removing the partition
//! forgets it (-1, as a partition never seen). Expiration and eviction
//! leave it as it is.
//!
//! A state loaded from a snapshot older than version 5 did not record
//! them: each partition's end is then derived from the offsets its keys
//! still hold ([`Ends::derived`]), a lower bound (an expired key's offsets,
//! a marker's offset are not held by any key), and marked so: a lower bound
//! is never used to pick a truncation's base (the store-wide highest offset
//! is, as before), and the mark is written into later snapshots.

use std::collections::HashMap;

use crate::codec::{Dec, Put};
use crate::error::Corruption;

/// The partitions' ends (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ends {
    /// Partition to its highest offset; a partition absent has none (-1).
    ends: HashMap<i32, i64>,
    /// Derived from an older snapshot's keys: each end is a lower bound.
    lower_bounds: bool,
}

impl Ends {
    /// Ends derived from the offsets a loaded state's keys hold: lower
    /// bounds (see the module docs).
    pub(crate) fn derived(held: impl IntoIterator<Item = (i32, i64)>) -> Ends {
        let mut e = Ends {
            ends: HashMap::new(),
            lower_bounds: true,
        };
        for (p, o) in held {
            e.note(p, o);
        }
        e
    }

    /// The highest offset of `partition` (-1: none).
    pub(crate) fn get(&self, partition: i32) -> i64 {
        self.ends.get(&partition).copied().unwrap_or(-1)
    }

    /// Whether each end is exact, not a lower bound from an older snapshot.
    pub(crate) fn exact(&self) -> bool {
        !self.lower_bounds
    }

    /// An append or a marker of `partition` at `offset` (a negative
    /// offset raises nothing: an end is at least 0, or absent).
    #[inline]
    pub(crate) fn note(&mut self, partition: i32, offset: i64) {
        if offset < 0 {
            return;
        }
        let e = self.ends.entry(partition).or_insert(offset);
        if offset > *e {
            *e = offset;
        }
    }

    /// The partition was truncated to `offset`.
    pub(crate) fn cut(&mut self, partition: i32, offset: i64) {
        let end = offset.saturating_sub(1);
        if end < 0 {
            self.ends.remove(&partition);
        } else {
            self.ends.insert(partition, end);
        }
    }

    /// The whole store was truncated to `offset`.
    pub(crate) fn cut_all(&mut self, offset: i64) {
        let end = offset.saturating_sub(1);
        self.ends.retain(|_, e| {
            *e = (*e).min(end);
            *e >= 0
        });
    }

    /// The partition's state was removed.
    pub(crate) fn remove(&mut self, partition: i32) {
        self.ends.remove(&partition);
    }

    /// The partitions with an end, and their ends, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i32, i64)> + '_ {
        self.ends.iter().map(|(p, e)| (*p, *e))
    }

    /// Appends the encoding: `u8` 1 if the ends are lower bounds (else 0),
    /// `u32` count, then each `i32` partition, `i64` end, by ascending
    /// partition.
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) {
        buf.put_u8(u8::from(self.lower_bounds));
        let mut sorted: Vec<(i32, i64)> = self.iter().collect();
        sorted.sort_unstable();
        buf.put_u32(sorted.len() as u32);
        for (p, e) in sorted {
            buf.put_i32(p);
            buf.put_i64(e);
        }
    }

    /// Decodes what [`Ends::encode`] wrote. The count is bounded by the
    /// bytes left before anything is allocated; partitions must ascend,
    /// each end be at least 0.
    pub(crate) fn decode(d: &mut Dec<'_>) -> Result<Ends, Corruption> {
        let short = || Corruption::BadField("partition ends (too short)");
        let lower_bounds = match d.u8().ok_or_else(short)? {
            0 => false,
            1 => true,
            _ => return Err(Corruption::BadField("partition ends (flag)")),
        };
        let count = d.u32().ok_or_else(short)? as usize;
        if count > d.remaining() / 12 {
            return Err(Corruption::BadField("partition ends (count)"));
        }
        let mut ends = HashMap::with_capacity(count);
        let mut last = None;
        for _ in 0..count {
            let p = d.i32().ok_or_else(short)?;
            let e = d.i64().ok_or_else(short)?;
            if last.is_some_and(|l| p <= l) || e < 0 {
                return Err(Corruption::BadField("partition ends (order or value)"));
            }
            last = Some(p);
            ends.insert(p, e);
        }
        Ok(Ends { ends, lower_bounds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let mut e = Ends::default();
        assert_eq!(e.get(0), -1);
        e.note(0, 10);
        e.note(0, 4);
        e.note(1, 7);
        assert_eq!((e.get(0), e.get(1)), (10, 7));
        e.cut(0, 5);
        assert_eq!(e.get(0), 4);
        e.cut_all(6);
        assert_eq!((e.get(0), e.get(1)), (4, 5));
        e.cut(1, 0);
        assert_eq!(e.get(1), -1);
        e.remove(0);
        assert_eq!(e.get(0), -1);
        assert!(e.exact());
    }

    #[test]
    fn round_trip_and_bad_bytes() {
        let mut e = Ends::derived([(3, 9), (-1, 0), (2, 100)]);
        e.note(7, 1);
        let mut buf = Vec::new();
        e.encode(&mut buf);
        let back = Ends::decode(&mut Dec::new(&buf)).unwrap();
        assert_eq!(back, e);
        assert!(!back.exact());
        // A count larger than the bytes there is refused before allocating.
        let mut huge = vec![0u8];
        huge.put_u32(u32::MAX);
        assert!(Ends::decode(&mut Dec::new(&huge)).is_err());
        // Partitions out of order, a negative end, a bad flag.
        for bad in [
            {
                let mut b = vec![0u8];
                b.put_u32(2);
                b.put_i32(5);
                b.put_i64(1);
                b.put_i32(5);
                b.put_i64(1);
                b
            },
            {
                let mut b = vec![0u8];
                b.put_u32(1);
                b.put_i32(5);
                b.put_i64(-1);
                b
            },
            vec![2u8, 0, 0, 0, 0],
        ] {
            assert!(Ends::decode(&mut Dec::new(&bad)).is_err());
        }
    }
}
