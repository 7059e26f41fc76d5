//! CRC-32C arithmetic: the checksum of any range of bytes from the
//! checksums of prefixes, at a constant cost per range.
//!
//! A reader that searches damaged bytes for valid records tests, at every
//! offset, the checksum of the record that offset claims to start.
//! Computed directly, each test costs the claimed length, and crafted
//! bytes can claim a long record at every few offsets: the search is then
//! quadratic in the bytes searched. CRC-32C is linear over GF(2), though:
//! with the CRC of every prefix of the bytes, the CRC of any range is two
//! lookups and a multiplication modulo the polynomial (zlib's
//! `crc32_combine`), and each byte enters the prefixes once.
//!
//! The store's own log search streams a segment through a window and
//! keeps the prefixes of its last 128 KiB (`wal/prefix_crc.rs`, over this
//! arithmetic). [`RangeCrc`] is the same arithmetic over bytes held whole
//! in memory, for logs whose records can be longer than that window: the
//! Raft log of the `producer-state-raft` workspace member uses it.

#![deny(clippy::indexing_slicing)]

/// CRC-32C (Castagnoli), reflected.
const POLY: u32 = 0x82F6_3B78;

/// The byte-at-a-time table of CRC-32C: `TABLE[i]` is `i * x^8` modulo
/// the polynomial (bits reflected), so `v * x^8` is
/// `(v >> 8) ^ TABLE[v & 0xff]`.
pub(crate) static TABLE: [u32; 256] = times_x_table::<256>(8);

/// `NIBBLE[i]` is `i * x^4` for the four lowest bits `i` (bits reflected):
/// `v * x^4` is `(v >> 4) ^ NIBBLE[v & 0xf]`.
static NIBBLE: [u32; 16] = times_x_table::<16>(4);

/// `[i * x^k for i in 0..N]`, the table of a `k`-bit step.
#[allow(clippy::indexing_slicing)] // evaluated at compile time: a bad index fails the build
const fn times_x_table<const N: usize>(k: u32) -> [u32; N] {
    let mut t = [0u32; N];
    let mut i = 0;
    while i < N {
        let mut c = i as u32;
        let mut j = 0;
        while j < k {
            c = times_x(c);
            j += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// `v * x` modulo the polynomial (bits reflected: bit 31 is `x^0`).
const fn times_x(v: u32) -> u32 {
    if v & 1 != 0 { (v >> 1) ^ POLY } else { v >> 1 }
}

/// `v * x^8` modulo the polynomial: one step of the byte-wise CRC.
fn times_x8(v: u32) -> u32 {
    (v >> 8) ^ TABLE.get((v & 0xff) as usize).copied().unwrap_or(0)
}

/// `a * b` modulo the polynomial, bits reflected (zlib's `multmodp`).
///
/// Four bits of `a` at a time (Horner's rule from its highest-degree
/// nibble), with `b` times every polynomial of degree below 4 tabled
/// first: 8 steps without data-dependent branches, where a bit at a time
/// takes up to 32 steps with a branch each.
pub(crate) fn multmodp(a: u32, b: u32) -> u32 {
    // by[n] = b * n(x), where bit 3 of n is x^0 and bit 0 is x^3: the
    // order of a nibble of `a`, whose highest bit is its lowest degree.
    let (b8, b4) = (b, times_x(b));
    let b2 = times_x(b4);
    let b1 = times_x(b2);
    let (b6, b10, b12) = (b4 ^ b2, b8 ^ b2, b8 ^ b4);
    let b14 = b12 ^ b2;
    let by = [
        0,
        b1,
        b2,
        b2 ^ b1,
        b4,
        b4 ^ b1,
        b6,
        b6 ^ b1,
        b8,
        b8 ^ b1,
        b10,
        b10 ^ b1,
        b12,
        b12 ^ b1,
        b14,
        b14 ^ b1,
    ];
    // Bits 3..0 of `a` hold x^28..x^31, bits 31..28 x^0..x^3: from the
    // highest degree down, acc = acc * x^4 + nibble * b.
    let mut acc = 0u32;
    for shift in (0..32).step_by(4) {
        let nibble = ((a >> shift) & 0xf) as usize;
        let times_x4 = (acc >> 4) ^ NIBBLE.get((acc & 0xf) as usize).copied().unwrap_or(0);
        acc = times_x4 ^ by.get(nibble).copied().unwrap_or(0);
    }
    acc
}

/// `x^(8n)` modulo the polynomial for every `n` up to `max`: the operator
/// that appends `n` zero bytes to a CRC.
pub(crate) fn zeros_table(max: usize) -> Vec<u32> {
    let mut t = Vec::with_capacity(max + 1);
    let mut k = 1u32 << 31; // x^0
    for _ in 0..=max {
        t.push(k);
        k = times_x8(k);
    }
    t
}

/// The CRC-32C of a prefix, extended by one byte: the CRC register is the
/// inverted CRC.
pub(crate) fn extend(crc: u32, byte: u8) -> u32 {
    let reg = !crc;
    !((reg >> 8)
        ^ TABLE
            .get(((reg ^ u32::from(byte)) & 0xff) as usize)
            .copied()
            .unwrap_or(0))
}

/// Multiplication by one constant `k`, a byte of the operand at a time:
/// `v * k` is the sum of `k` times each byte of `v` in its place, four
/// lookups (4 KiB of tables per constant).
struct Times([[u32; 256]; 4]);

impl Times {
    fn new(k: u32) -> Times {
        // k * x^d for every degree d; bit 31 - d of an operand is its x^d.
        let mut k_times = [0u32; 32];
        let mut kd = k;
        for slot in &mut k_times {
            *slot = kd;
            kd = times_x(kd);
        }
        let mut t = [[0u32; 256]; 4];
        for (j, table) in t.iter_mut().enumerate() {
            // Bit b of byte j of an operand is its x^(31 - 8j - b).
            for v in 1..256usize {
                let low = v.trailing_zeros() as usize;
                let rest = table.get(v & (v - 1)).copied().unwrap_or(0);
                let term = k_times.get(31 - 8 * j - low).copied().unwrap_or(0);
                if let Some(slot) = table.get_mut(v) {
                    *slot = rest ^ term;
                }
            }
        }
        Times(t)
    }

    // Each index is a byte, below the tables' 256 entries.
    #[allow(clippy::indexing_slicing)]
    fn mul(&self, v: u32) -> u32 {
        let [t0, t1, t2, t3] = &self.0;
        t0[(v & 0xff) as usize]
            ^ t1[((v >> 8) & 0xff) as usize]
            ^ t2[((v >> 16) & 0xff) as usize]
            ^ t3[(v >> 24) as usize]
    }
}

/// `Times` for `x^(8 * step * i)`, for every `i` below `n`.
fn powers(step: usize, n: usize) -> Vec<Times> {
    let x8step = zeros_table(step).last().copied().unwrap_or(0);
    let mut k = 1u32 << 31; // x^0
    (0..n)
        .map(|_| {
            let t = Times::new(k);
            k = multmodp(k, x8step);
            t
        })
        .collect()
}

/// The CRC-32C of any range of one byte buffer, each in O(1), after one
/// pass over the buffer.
///
/// For a search through damaged bytes held in memory: a candidate record
/// at every offset, each checked at a constant cost whatever length it
/// claims, so the search is linear in the buffer's size (module docs).
/// Shifting a CRC by a range's length is three multiplications by
/// constants (one per byte of the length below 2^16, and its rest), each
/// four table lookups. Costs 4 bytes of memory per byte of the buffer,
/// plus 4 KiB of tables per constant: 2 MiB for a buffer of 64 KiB or
/// more, and 64 KiB more per 16 MiB of it.
///
/// ```
/// use producer_state::crc::RangeCrc;
///
/// let bytes = b"header, then a record, then more";
/// let crcs = RangeCrc::new(bytes);
/// let seed = crc32c::crc32c(b"a seed");
/// assert_eq!(
///     crcs.crc_append(seed, 8, 13),
///     Some(crc32c::crc32c_append(seed, &bytes[8..21]))
/// );
/// assert_eq!(crcs.crc_append(seed, 30, 3), None); // past the end
/// ```
pub struct RangeCrc {
    /// The CRC of the buffer's first `o` bytes, at `prefixes[o]`.
    prefixes: Vec<u32>,
    /// Times `x^(8n)`, `x^(8 * 2^8 * n)` and `x^(8 * 2^16 * n)`, for every
    /// `n` that a range within the buffer needs.
    shifts: [Vec<Times>; 3],
}

impl RangeCrc {
    /// The prefixes of `bytes`: one pass, each byte fed once.
    pub fn new(bytes: &[u8]) -> RangeCrc {
        let mut prefixes = Vec::with_capacity(bytes.len() + 1);
        let mut crc = 0;
        prefixes.push(crc);
        for &b in bytes {
            crc = extend(crc, b);
            prefixes.push(crc);
        }
        let n = bytes.len();
        let shifts = [
            powers(1, n.min(255) + 1),
            powers(1 << 8, (n >> 8).min(255) + 1),
            powers(1 << 16, (n >> 16) + 1),
        ];
        RangeCrc { prefixes, shifts }
    }

    /// `crc32c::crc32c_append(seed, &bytes[start..start + len])` for the
    /// buffer given to [`RangeCrc::new`], in O(1); `None` if the range is
    /// not within it.
    pub fn crc_append(&self, seed: u32, start: usize, len: usize) -> Option<u32> {
        let end = start.checked_add(len)?;
        let (p_start, p_end) = (*self.prefixes.get(start)?, *self.prefixes.get(end)?);
        // crc(range) = P(end) ^ shift(P(start)) and
        // crc32c_append(seed, range) = shift(seed) ^ crc(range), where
        // shift multiplies by x^(8 len).
        let mut v = seed ^ p_start;
        let [low, mid, high] = &self.shifts;
        v = low.get(len & 0xff)?.mul(v);
        if len >> 8 != 0 {
            v = mid.get((len >> 8) & 0xff)?.mul(v);
        }
        if len >> 16 != 0 {
            v = high.get(len >> 16)?.mul(v);
        }
        Some(v ^ p_end)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;

    /// `n` pseudo-random bytes (xorshift from `x`), for tests of CRCs.
    pub(crate) fn bytes(n: usize, mut x: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A bit at a time: the definition the nibble-wise product must match.
    fn multmodp_bitwise(a: u32, mut b: u32) -> u32 {
        let mut p = 0;
        for i in 0..32 {
            if a & (1 << (31 - i)) != 0 {
                p ^= b;
            }
            b = times_x(b);
        }
        p
    }

    #[test]
    fn the_product_is_the_bitwise_product_and_shifting_is_crc32c_combine() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (a, b) = (x as u32, (x >> 32) as u32);
            assert_eq!(multmodp(a, b), multmodp_bitwise(a, b), "{a:#x} * {b:#x}");
        }
        for (a, b) in [(0, 7), (7, 0), (1 << 31, 0xdead_beef), (u32::MAX, u32::MAX)] {
            assert_eq!(multmodp(a, b), multmodp_bitwise(a, b));
        }
        let z = zeros_table(1000);
        for (i, &n) in [0usize, 1, 7, 64, 999].iter().enumerate() {
            let c = 0x1234_5678u32.rotate_left(i as u32 * 5);
            assert_eq!(multmodp(z[n], c), crc32c::crc32c_combine(c, 0, n), "{n}");
        }
    }

    #[test]
    fn every_range_has_the_crc_of_its_bytes() {
        // Longer than two of the low table's spans, so ranges use the high
        // table too.
        let data = bytes(300_000, 11);
        let crcs = RangeCrc::new(&data);
        let mut x = 5u64;
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = (x % data.len() as u64) as usize;
            let len = ((x >> 24) % (data.len() - start + 1) as u64) as usize;
            let seed = (x >> 40) as u32;
            assert_eq!(
                crcs.crc_append(seed, start, len),
                Some(crc32c::crc32c_append(seed, &data[start..start + len])),
                "start {start} len {len}"
            );
        }
        // The ends: the whole buffer, an empty range at its end, and
        // ranges at the boundaries of the shift tables.
        for (start, len) in [
            (0, data.len()),
            (data.len(), 0),
            (0, 255),
            (0, 256),
            (3, 65_535),
            (0, 65_536),
            (1, 131_072),
        ] {
            assert_eq!(
                crcs.crc_append(9, start, len),
                Some(crc32c::crc32c_append(9, &data[start..start + len]))
            );
        }
        assert_eq!(crcs.crc_append(0, data.len(), 1), None);
        assert_eq!(crcs.crc_append(0, 1, data.len()), None);
        assert_eq!(crcs.crc_append(0, usize::MAX, 2), None);
        let empty = RangeCrc::new(&[]);
        assert_eq!(empty.crc_append(3, 0, 0), Some(3));
        assert_eq!(empty.crc_append(3, 0, 1), None);
    }
}
