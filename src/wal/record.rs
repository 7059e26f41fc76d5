//! One log record: the accepted append it makes durable.

#![deny(clippy::indexing_slicing)]

use crate::batch::{AppendRequest, BatchMetadata};
use crate::codec::{Dec, Put, set_u32, u32_at};
use crate::error::Corruption;
use crate::id::ProducerId;

/// Record header: CRC, length, distance from the durable end, kind.
pub(crate) const HEADER: usize = 13;
const KIND_NUMERIC_SINGLE: u8 = 1;
const KIND_NUMERIC_BATCH: u8 = 2;
const KIND_NAMED_SINGLE: u8 = 3;
const KIND_NAMED_BATCH: u8 = 4;
/// Payload after the id: partition, epoch, sequence (single) ...
const SINGLE_TAIL: usize = 4 + 2 + 4;
/// ... or partition, epoch, first, last, offset, timestamp (batch).
const BATCH_TAIL: usize = 4 + 2 + 4 + 4 + 8 + 8;
/// The longest name a record holds.
pub(crate) const MAX_NAME: usize = u16::MAX as usize;
/// The shortest and longest records.
pub(crate) const MIN_LEN: usize = HEADER + 2 + SINGLE_TAIL;
pub(crate) const MAX_LEN: usize = HEADER + 2 + MAX_NAME + BATCH_TAIL;

/// Appends the record of an accepted request, with the CRC and the
/// distance from the durable end left zero: [`seal`] fills them in once
/// the segment is known.
/// The caller has checked that a name fits ([`MAX_NAME`]).
#[inline]
pub(crate) fn encode(buf: &mut Vec<u8>, r: &AppendRequest) {
    // The common record, a single-sequence append of a numeric id, is
    // assembled in a fixed array and appended with one copy: this runs
    // under the store's lock for every accepted append.
    if let (Some(id), None) = (r.producer_id.as_numeric(), r.metadata) {
        let mut rec = [0u8; NUMERIC_SINGLE_LEN];
        put(&mut rec, 4, (NUMERIC_SINGLE_LEN as u32).to_le_bytes());
        put(&mut rec, 12, [KIND_NUMERIC_SINGLE]);
        put(&mut rec, 13, id.to_le_bytes());
        put(&mut rec, 21, r.partition.to_le_bytes());
        put(&mut rec, 25, r.epoch.to_le_bytes());
        put(&mut rec, 27, r.first.to_le_bytes());
        buf.extend_from_slice(&rec);
        return;
    }
    let start = buf.len();
    buf.put_u32(0); // crc
    buf.put_u32(0); // length, set below
    buf.put_u32(0); // distance from the durable end
    let kind = match (r.producer_id.as_numeric(), r.metadata.is_some()) {
        (Some(_), false) => KIND_NUMERIC_SINGLE,
        (Some(_), true) => KIND_NUMERIC_BATCH,
        (None, false) => KIND_NAMED_SINGLE,
        (None, true) => KIND_NAMED_BATCH,
    };
    buf.put_u8(kind);
    match r.producer_id.as_numeric() {
        Some(n) => buf.put_u64(n),
        None => {
            let name = r.producer_id.name_bytes().unwrap_or_default();
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
        }
    }
    buf.put_i32(r.partition);
    buf.put_i16(r.epoch);
    match r.metadata {
        None => buf.put_i32(r.first),
        Some(m) => {
            buf.put_i32(r.first);
            buf.put_i32(r.last);
            buf.put_i64(m.offset);
            buf.put_i64(m.timestamp);
        }
    }
    let len = (buf.len() - start) as u32;
    set_u32(buf, start + 4, len);
}

/// The length of a single-sequence record of a numeric id.
const NUMERIC_SINGLE_LEN: usize = HEADER + 8 + SINGLE_TAIL;

/// Writes `v` at `at` in a fixed-size record (constant offsets: no checks
/// remain after inlining).
#[inline(always)]
fn put<const N: usize>(rec: &mut [u8], at: usize, v: [u8; N]) {
    if let Some(d) = rec.get_mut(at..at + N) {
        d.copy_from_slice(&v);
    }
}

/// The CRC seed of a segment: the CRC-32C of its salt (its first position).
pub(crate) fn seed(salt: u64) -> u32 {
    crc32c::crc32c(&salt.to_le_bytes())
}

/// The CRC of a record: CRC-32C continued from the segment's seed over
/// everything after the CRC field (length, distance, kind, payload).
fn crc(seed: u32, record: &[u8]) -> u32 {
    crc32c::crc32c_append(seed, record.get(4..).unwrap_or_default())
}

/// Fills in the distance from the durable end and the CRC of every record
/// in `buf`, one write's worth of records encoded by [`encode`], for a
/// segment with `salt`. `unsynced` is how many bytes of the segment before
/// `buf` were not known to be durable when the write was issued: a record
/// at `at` in `buf` is `unsynced + at` bytes past the durable end. The
/// caller keeps that below `u32::MAX` (segments are smaller).
pub(crate) fn seal(buf: &mut [u8], salt: u64, unsynced: u32) {
    let seed = seed(salt);
    let mut at = 0;
    while let Some(len) = u32_at(buf, at + 4) {
        let len = len as usize;
        set_u32(buf, at + 8, unsynced.saturating_add(at as u32));
        let c = buf.get(at..at + len).map(|r| crc(seed, r)).unwrap_or(0);
        set_u32(buf, at, c);
        at += len;
    }
}

/// Why a record could not be read at some offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// Fewer bytes remain than the record needs.
    Incomplete(Corruption),
    /// The bytes are not a valid record.
    Invalid(Corruption),
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub request: AppendRequest,
    pub len: usize,
    /// Bytes from the segment's durable end, when this record was written,
    /// to this record.
    pub since_durable: u32,
}

/// Decodes the record at the start of `bytes` (which may hold more), in a
/// segment whose CRC seed is `seed` (see [`seed`]).
pub(crate) fn decode(bytes: &[u8], seed: u32) -> Result<Decoded, Bad> {
    let avail = bytes.len();
    if avail < HEADER {
        return Err(Bad::Incomplete(crate::codec::truncated(HEADER, avail)));
    }
    let len = u32_at(bytes, 4).unwrap_or(0) as usize;
    if !(MIN_LEN..=MAX_LEN).contains(&len) {
        return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
    }
    let Some(rec) = bytes.get(..len) else {
        return Err(Bad::Incomplete(crate::codec::truncated(len, avail)));
    };
    let stored = u32_at(rec, 0).unwrap_or(0);
    let computed = crc(seed, rec);
    if stored != computed {
        return Err(Bad::Invalid(Corruption::ChecksumMismatch {
            stored,
            computed,
        }));
    }
    let mut d = Dec::new(rec);
    d.bytes(8);
    let since_durable = d.u32().unwrap_or(0);
    let kind = d.u8().unwrap_or(0);
    let request = decode_payload(kind, &mut d).map_err(Bad::Invalid)?;
    if d.remaining() != 0 {
        return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
    }
    Ok(Decoded {
        request,
        len,
        since_durable,
    })
}

fn decode_payload(kind: u8, d: &mut Dec<'_>) -> Result<AppendRequest, Corruption> {
    let short = Corruption::BadLength(d.remaining() as u64);
    let id = match kind {
        KIND_NUMERIC_SINGLE | KIND_NUMERIC_BATCH => {
            ProducerId::numeric(d.u64().ok_or(short.clone())?)
        }
        KIND_NAMED_SINGLE | KIND_NAMED_BATCH => {
            let n = d.u16().ok_or(short.clone())? as usize;
            let name = d.bytes(n).ok_or(short.clone())?;
            let name = std::str::from_utf8(name)
                .map_err(|_| Corruption::BadField("producer name (not UTF-8)"))?;
            ProducerId::named(name)
        }
        other => return Err(Corruption::BadKind(other)),
    };
    let partition = d.i32().ok_or(short.clone())?;
    let epoch = d.i16().ok_or(short.clone())?;
    let first = d.i32().ok_or(short.clone())?;
    let request = if kind == KIND_NUMERIC_SINGLE || kind == KIND_NAMED_SINGLE {
        AppendRequest::single(id, partition, epoch, first)
    } else {
        let last = d.i32().ok_or(short.clone())?;
        let offset = d.i64().ok_or(short.clone())?;
        let timestamp = d.i64().ok_or(short)?;
        let mut r = AppendRequest::single(id, partition, epoch, first);
        r.last = last;
        r.metadata = Some(BatchMetadata { offset, timestamp });
        r
    };
    Ok(request)
}

/// A cheap test of whether a valid record could start at `bytes[0]`:
/// plausible length and kind. Used to skip most offsets when looking for
/// valid records after damage.
pub(crate) fn plausible(bytes: &[u8]) -> bool {
    let Some(len) = u32_at(bytes, 4) else {
        return false;
    };
    let len = len as usize;
    let kind = bytes.get(12).copied().unwrap_or(0);
    match kind {
        KIND_NUMERIC_SINGLE => len == HEADER + 8 + SINGLE_TAIL,
        KIND_NUMERIC_BATCH => len == HEADER + 8 + BATCH_TAIL,
        KIND_NAMED_SINGLE | KIND_NAMED_BATCH => (MIN_LEN..=MAX_LEN).contains(&len),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::Batch;

    fn samples() -> Vec<AppendRequest> {
        vec![
            AppendRequest::single(7u64, 3, 1, 42),
            AppendRequest::batch(
                u64::MAX,
                -1,
                i16::MIN,
                Batch::new(0, i32::MAX, i64::MIN, -1),
            ),
            AppendRequest::single("p1", 0, 0, 0),
            AppendRequest::single("", i32::MAX, -1, 5),
            AppendRequest::batch(
                "x".repeat(300),
                2,
                9,
                Batch::new(5, 9, 77, 1_700_000_000_000),
            ),
        ]
    }

    #[test]
    fn records_round_trip_and_know_their_distance_from_the_durable_end() {
        let mut buf = Vec::new();
        let reqs = samples();
        for r in &reqs {
            encode(&mut buf, r);
        }
        seal(&mut buf, 99, 1000);
        let mut at = 0;
        for r in &reqs {
            let d = decode(&buf[at..], seed(99)).unwrap();
            assert_eq!(&d.request, r);
            assert_eq!(d.since_durable as usize, 1000 + at);
            assert!(plausible(&buf[at..]));
            at += d.len;
        }
        assert_eq!(at, buf.len());
        // The salt is part of the checksum: another segment's record fails.
        assert!(matches!(
            decode(&buf, 98),
            Err(Bad::Invalid(Corruption::ChecksumMismatch { .. }))
        ));
    }

    #[test]
    fn zeros_never_parse_and_nothing_panics() {
        assert!(matches!(
            decode(&[0u8; 64], 0),
            Err(Bad::Invalid(Corruption::BadLength(0)))
        ));
        assert!(matches!(decode(&[0u8; 5], 0), Err(Bad::Incomplete(_))));
        assert!(!plausible(&[0u8; 64]));
        let mut buf = Vec::new();
        encode(&mut buf, &samples()[1]);
        seal(&mut buf, 0, 0);
        for cut in 0..buf.len() {
            assert!(
                matches!(decode(&buf[..cut], 0), Err(Bad::Incomplete(_))),
                "cut {cut}"
            );
        }
        for bit in 0..buf.len() * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&b, seed(0)).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn sizes_are_as_documented() {
        let mut buf = Vec::new();
        encode(&mut buf, &AppendRequest::single(1u64, 0, 0, 0));
        assert_eq!(buf.len(), 31);
        buf.clear();
        encode(
            &mut buf,
            &AppendRequest::batch(1u64, 0, 0, Batch::new(0, 0, 0, 0)),
        );
        assert_eq!(buf.len(), 51);
        buf.clear();
        encode(&mut buf, &AppendRequest::single("p1", 0, 0, 0));
        assert_eq!(buf.len(), 27);
        assert_eq!(MIN_LEN, 25);
    }
}
