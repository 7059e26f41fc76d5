//! A record's framing, shared by every record kind: the header (CRC,
//! length, offset in the segment, distance from the durable end, kind),
//! the CRC seed of a segment, and the seal that fills in a record's offset,
//! distance and CRC once its place is known. The payloads are the kinds'
//! own ([`super::record`], [`super::op`], [`super::txn_op`]); they build on
//! this file, and [`super::record::decode`] dispatches to them.

#![deny(clippy::indexing_slicing)]

use crate::codec::{set_u32, u32_at};

/// Record header of the version this crate writes (3): CRC, length,
/// offset in the segment, distance from the durable end, kind.
pub(crate) const HEADER: usize = 17;
/// Where the fields of a version-3 header are.
pub(super) const AT_LEN: usize = 4;
pub(super) const AT_OFFSET: usize = 8;
const AT_UNSYNCED: usize = 12;
pub(super) const AT_KIND: usize = 16;
/// The longest name a record holds (its length is a `u16`).
pub(crate) const MAX_NAME: usize = u16::MAX as usize;
/// The shortest record of any version: a version-3 close marker.
pub(crate) const MIN_LEN: usize = HEADER;

/// Writes `v` at `at` in a fixed-size record (constant offsets: no checks
/// remain after inlining).
#[inline(always)]
pub(super) fn put<const N: usize>(rec: &mut [u8], at: usize, v: [u8; N]) {
    if let Some(d) = rec.get_mut(at..at + N) {
        d.copy_from_slice(&v);
    }
}

/// The CRC seed of a segment: the CRC-32C of its salt bytes (version 3:
/// its first position, store id and segment salt, header bytes 12..36;
/// before: its first position).
pub(crate) fn seed(salt: &[u8]) -> u32 {
    crc32c::crc32c(salt)
}

/// The CRC of a record: CRC-32C continued from the segment's seed over
/// everything after the CRC field (length, offset, distance, kind, payload).
pub(super) fn crc(seed: u32, record: &[u8]) -> u32 {
    crc32c::crc32c_append(seed, record.get(CRC_FROM..).unwrap_or_default())
}

/// Fills in the offset, the distance from the durable end and the CRC of
/// every record in `buf`, one write's worth of records encoded by
/// [`encode`](super::record::encode), for a segment whose CRC seed is `seed`, written at offset
/// `base` of the segment. `unsynced` is how many bytes of the segment
/// before `buf` were not known to be durable when the write was issued: a
/// record at `at` in `buf` is `unsynced + at` bytes past the durable end.
/// The caller keeps `base + buf.len()` below `u32::MAX` (segments are
/// smaller).
pub(crate) fn seal(buf: &mut [u8], seed: u32, base: u64, unsynced: u32) {
    let mut at = 0;
    while let Some(len) = u32_at(buf, at + AT_LEN) {
        let len = len as usize;
        // `encode` never writes a shorter record; stop rather than loop.
        debug_assert!(len >= MIN_LEN, "record of {len} bytes at {at}");
        if len < MIN_LEN {
            break;
        }
        set_u32(buf, at + AT_OFFSET, (base + at as u64) as u32);
        set_u32(buf, at + AT_UNSYNCED, unsynced.saturating_add(at as u32));
        let c = buf.get(at..at + len).map(|r| crc(seed, r)).unwrap_or(0);
        set_u32(buf, at, c);
        at += len;
    }
}

/// Where the bytes a record's CRC covers begin: everything after the CRC
/// field, up to the record's length (see [`crc`]).
pub(crate) const CRC_FROM: usize = 4;

/// The CRC stored at the start of a record.
pub(crate) fn stored_crc(bytes: &[u8]) -> Option<u32> {
    u32_at(bytes, 0)
}
