//! Checksums of many overlapping ranges of a file at a constant cost each.
//!
//! After damage, recovery searches the rest of a segment for valid
//! records: at every offset that could start one, the checksum of the
//! record it claims to be. Computed directly, each costs its claimed
//! length, up to 64 KiB, and crafted bytes can make every fourth offset a
//! candidate: 16 MiB of them cost 2^38 bytes of CRC. CRC-32C is linear,
//! though: with the CRC of every prefix of the region, the CRC of any
//! range is two lookups and one multiplication in GF(2)\[x\] modulo the
//! polynomial (zlib's `crc32_combine`), and each byte enters the prefixes
//! once. The search is then linear in the segment's size whatever its
//! bytes hold. The arithmetic is in `crc.rs`; this file keeps the
//! prefixes of a segment read through a window.

#![deny(clippy::indexing_slicing)]

use crate::codec::crc::{TABLE, multmodp, zeros_table};

/// Offsets of prefixes kept: more than the longest range asked for.
const RING: usize = 1 << 17;

/// The CRC-32C of every prefix of a run of file bytes, for the last
/// [`RING`] offsets, so that the CRC of a range within them costs O(1).
///
/// A run starts at some file offset `from` (the CRC of the empty prefix
/// there is 0) and is extended forward one byte at a time; asking for a
/// range that starts past its end starts a new run there. Runs never
/// overlap, so each byte of the file is fed at most once.
pub(crate) struct PrefixCrc {
    /// `x^(8n)` for every range length `n` asked for.
    zeros: Vec<u32>,
    /// CRC of the run's bytes before offset `o`, at `ring[o % RING]`.
    ring: Vec<u32>,
    from: u64,
    /// Prefixes are known up to and including this offset.
    to: u64,
    /// The CRC register at `to` (the CRC, inverted).
    reg: u32,
    /// Bytes fed in all, to test the bound.
    pub(crate) fed: u64,
}

impl PrefixCrc {
    /// Ready for ranges up to `max_len` bytes long (at most `RING - 1`).
    pub(crate) fn new(max_len: usize) -> PrefixCrc {
        debug_assert!(max_len < RING);
        PrefixCrc {
            zeros: zeros_table(max_len.min(RING - 1)),
            ring: vec![0; RING],
            from: 0,
            to: 0,
            reg: !0,
            fed: 0,
        }
    }

    fn slot(o: u64) -> usize {
        (o % RING as u64) as usize
    }

    fn known(&self, o: u64) -> Option<u32> {
        (self.from <= o && o <= self.to && self.to - o < RING as u64)
            .then(|| self.ring.get(Self::slot(o)).copied())
            .flatten()
    }

    /// `crc32c_append(seed, range)` for the `len` bytes from file offset
    /// `start`, where `bytes` holds the file from offset `base` on and
    /// covers the range. Ranges asked for must not start before an earlier
    /// one started. `None` if `bytes` does not cover the range or `len` is
    /// longer than [`PrefixCrc::new`] allowed.
    pub(crate) fn crc(
        &mut self,
        seed: u32,
        bytes: &[u8],
        base: u64,
        start: u64,
        len: usize,
    ) -> Option<u32> {
        let end = start.checked_add(len as u64)?;
        let zeros = *self.zeros.get(len)?;
        if start < base || end - base > bytes.len() as u64 {
            return None;
        }
        if self.known(start).is_none() {
            // A new run: nothing before `start` is needed again.
            self.from = start;
            self.to = start;
            self.reg = !0;
            *self.ring.get_mut(Self::slot(start))? = 0;
        }
        if self.to < end {
            let from = usize::try_from(self.to - base).ok()?;
            let upto = usize::try_from(end - base).ok()?;
            let mut reg = self.reg;
            let mut o = self.to;
            for &b in bytes.get(from..upto)? {
                let i = ((reg ^ u32::from(b)) & 0xff) as usize;
                reg = TABLE.get(i).copied().unwrap_or(0) ^ (reg >> 8);
                o += 1;
                *self.ring.get_mut(Self::slot(o))? = !reg;
            }
            self.fed += end - self.to;
            self.reg = reg;
            self.to = end;
        }
        // crc(range) = P(end) ^ shift(P(start)) and
        // crc32c_append(seed, range) = shift(seed) ^ crc(range), where
        // shift multiplies by x^(8 len).
        let (p_start, p_end) = (self.known(start)?, self.known(end)?);
        Some(multmodp(zeros, seed ^ p_start) ^ p_end)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::codec::crc::tests::bytes;

    #[test]
    fn every_range_has_the_crc_of_its_bytes() {
        let data = bytes(300_000, 7);
        let mut p = PrefixCrc::new(70_000);
        let mut x = 99u64;
        let mut start = 0u64;
        while start < 230_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 70_000) as usize;
            let seed = x as u32;
            // The caller's view: bytes from some offset at or before the range.
            let base = start.saturating_sub(x % 100);
            let got = p.crc(seed, &data[base as usize..], base, start, len);
            let want = crc32c::crc32c_append(seed, &data[start as usize..start as usize + len]);
            assert_eq!(got, Some(want), "start {start} len {len}");
            start += 1 + (x >> 20) % 5_000;
        }
        // A range the bytes do not cover, or longer than allowed.
        assert_eq!(p.crc(0, &data[..10], 0, 5, 6), None);
        assert_eq!(p.crc(0, &data, 0, 260_000, 70_001), None);
    }

    #[test]
    fn each_byte_is_fed_once() {
        // Overlapping ranges at every offset: the prefixes grow with the
        // region, not with the sum of the ranges.
        let data = bytes(1 << 20, 3);
        let mut p = PrefixCrc::new(65_580);
        for start in 0..(1u64 << 20) - 65_580 {
            p.crc(1, &data, 0, start, 65_000).unwrap();
        }
        assert!(p.fed <= 1 << 20, "{}", p.fed);
    }
}
