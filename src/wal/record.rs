//! One log record: decoding any record by its kind, the append records
//! (kinds 1 to 4) and the close marker (kind 5). The framing every record
//! shares (header, CRC, seal) is in [`super::frame`]; the lifecycle
//! records of version 5 are in [`super::op`], the transaction records in
//! [`super::txn_op`].

#![deny(clippy::indexing_slicing)]

use super::frame::{AT_KIND, AT_LEN, AT_OFFSET, HEADER, MAX_NAME, crc, put, stored_crc};
use super::op::{self, LogOp};
use super::txn_op;
use crate::batch::{AppendRequest, BatchMetadata};
use crate::codec::{Dec, Put, set_u32, u32_at};
use crate::error::Corruption;
use crate::id::ProducerId;

const KIND_NUMERIC_SINGLE: u8 = 1;
const KIND_NUMERIC_BATCH: u8 = 2;
const KIND_NAMED_SINGLE: u8 = 3;
const KIND_NAMED_BATCH: u8 = 4;
/// A clean close: no append, written by `close` as the last record.
const KIND_CLOSE: u8 = 5;
/// Payload after the id: partition, epoch, sequence (single) ...
const SINGLE_TAIL: usize = 4 + 2 + 4;
/// ... or partition, epoch, first, last, offset, timestamp (batch).
const BATCH_TAIL: usize = 4 + 2 + 4 + 4 + 8 + 8;
/// The longest record of any version (a version-5 key-state record of one
/// entry with the longest name); versions 1 to 4 end at a named batch
/// append (65,584 bytes). The shortest is [`MIN_LEN`].
pub(crate) const MAX_LEN: usize = op::MAX_LEN;
const MAX_APPEND_LEN: usize = HEADER + 2 + MAX_NAME + BATCH_TAIL;
const _: () = assert!(MAX_APPEND_LEN <= MAX_LEN);

/// How the records of a segment of some format version are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Record header bytes: 13 before version 3 (no offset field), 17.
    header: usize,
    /// The most appends a kind-1 record holds: 1 in version 1.
    max_packed: usize,
    /// Version 5: the lifecycle records (kinds 6 to 10) exist.
    lifecycle: bool,
    /// Version 6: a partition's truncation group (kind 11) exists.
    partition_groups: bool,
    /// Version 5 with the Kafka flag: the transaction records (kinds 16 to
    /// 20) exist.
    kafka: bool,
}

impl Layout {
    /// The layout of a segment of `version` (1 to 6).
    pub(crate) fn of(version: u16) -> Layout {
        Layout {
            header: if version >= 3 { HEADER } else { HEADER - 4 },
            max_packed: if version < 2 { 1 } else { MAX_PACKED },
            lifecycle: version >= 5,
            partition_groups: version >= 6,
            kafka: false,
        }
    }

    /// The same layout in a segment whose header has the Kafka flag.
    pub(crate) fn with_kafka(self, kafka: bool) -> Layout {
        Layout {
            kafka: self.lifecycle && kafka,
            ..self
        }
    }

    /// Record header bytes.
    pub(crate) fn header(self) -> usize {
        self.header
    }

    /// Whether records state their own offset (and close markers exist).
    pub(crate) fn positioned(self) -> bool {
        self.header == HEADER
    }

    fn min_len(self) -> usize {
        if self.positioned() {
            HEADER
        } else {
            self.header + 2 + SINGLE_TAIL
        }
    }

    fn max_len(self) -> usize {
        if self.lifecycle {
            MAX_LEN
        } else {
            self.header + 2 + MAX_NAME + BATCH_TAIL
        }
    }
}

/// Appends the record of an accepted request, in the layout of the
/// current version, with the CRC, the offset and the distance from the
/// durable end left zero: [`seal`] fills them in once the segment and the
/// place in it are known.
///
/// A single-sequence append of a numeric id, the common case, joins the
/// kind-1 record that ends `buf` if there is one with room: one checksum
/// and one header then cover many appends, and each costs 18 bytes
/// instead of 31. `open` is that record's offset (`usize::MAX` for none);
/// the encoder keeps it, and whoever takes or clears `buf` must reset it
/// ([`RecordBuf`] does both): the checks below cannot tell a record's start
/// from bytes inside another record that happen to look like one.
/// The caller has checked that a name fits ([`MAX_NAME`]).
#[inline]
pub(crate) fn encode(buf: &mut Vec<u8>, open: &mut usize, r: &AppendRequest) {
    if let (Some(id), None) = (r.producer_id.as_numeric(), r.metadata) {
        let mut entry = [0u8; PACKED_ENTRY];
        put(&mut entry, 0, id.to_le_bytes());
        put(&mut entry, 8, r.partition.to_le_bytes());
        put(&mut entry, 12, r.epoch.to_le_bytes());
        put(&mut entry, 14, r.first.to_le_bytes());
        let at = *open;
        let len = buf.len().wrapping_sub(at);
        if at < buf.len()
            && len <= MAX_PACKED_LEN - PACKED_ENTRY
            && buf.get(at + AT_KIND) == Some(&KIND_NUMERIC_SINGLE)
            && u32_at(buf, at + AT_LEN) == Some(len as u32)
        {
            buf.extend_from_slice(&entry);
            set_u32(buf, at + AT_LEN, (len + PACKED_ENTRY) as u32);
            return;
        }
        let mut head = [0u8; HEADER];
        put(&mut head, AT_LEN, (NUMERIC_SINGLE_LEN as u32).to_le_bytes());
        put(&mut head, AT_KIND, [KIND_NUMERIC_SINGLE]);
        *open = buf.len();
        buf.extend_from_slice(&head);
        buf.extend_from_slice(&entry);
        return;
    }
    // Only the last record of `buf` may take more appends.
    *open = usize::MAX;
    let start = buf.len();
    buf.put_u32(0); // crc
    buf.put_u32(0); // length, set below
    buf.put_u32(0); // offset in the segment
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
    set_u32(buf, start + AT_LEN, len);
}

/// Appends a close marker: a record of no append, the last thing a clean
/// close writes, so that the next open can tell a clean shutdown from a
/// crash. Sealed like any record.
pub(crate) fn encode_close(buf: &mut Vec<u8>) {
    let mut head = [0u8; HEADER];
    put(&mut head, AT_LEN, (HEADER as u32).to_le_bytes());
    put(&mut head, AT_KIND, [KIND_CLOSE]);
    buf.extend_from_slice(&head);
}

/// Records encoded by [`encode`] and not yet written, with the offset of
/// the kind-1 record appends may still join. Keeping the two in one value
/// is what makes packing safe: the offset is dropped whenever the bytes
/// are taken or cleared, so it never points into other records.
#[derive(Debug)]
pub(crate) struct RecordBuf {
    bytes: Vec<u8>,
    open: usize,
}

impl Default for RecordBuf {
    fn default() -> Self {
        RecordBuf {
            bytes: Vec::new(),
            open: usize::MAX,
        }
    }
}

impl RecordBuf {
    /// Encodes the record of an accepted request (see [`encode`]).
    #[inline]
    pub(crate) fn push(&mut self, r: &AppendRequest) {
        encode(&mut self.bytes, &mut self.open, r);
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Takes the records, leaving `spare` (emptied) to encode into next.
    pub(crate) fn take(&mut self, mut spare: Vec<u8>) -> Vec<u8> {
        spare.clear();
        self.open = usize::MAX;
        std::mem::replace(&mut self.bytes, spare)
    }

    /// Encodes records other than packable appends with `encode` (see
    /// [`super::op`]): the kind-1 record open for more appends, if any,
    /// is closed first.
    pub(crate) fn push_with<R>(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        self.open = usize::MAX;
        encode(&mut self.bytes)
    }

    /// Drops the records.
    pub(crate) fn clear(&mut self) {
        self.open = usize::MAX;
        self.bytes.clear();
    }
}

/// The length of a single-sequence record of a numeric id holding one
/// append; each further append adds [`PACKED_ENTRY`] bytes.
const NUMERIC_SINGLE_LEN: usize = HEADER + PACKED_ENTRY;
/// One append in a kind-1 record: id, partition, epoch, sequence.
const PACKED_ENTRY: usize = 8 + SINGLE_TAIL;
/// The most appends a kind-1 record holds (versions 2 and 3), ...
pub(crate) const MAX_PACKED: usize = 3640;
/// ... and its longest length (65,537 bytes in version 3).
const MAX_PACKED_LEN: usize = HEADER + MAX_PACKED * PACKED_ENTRY;
const _: () = assert!(MAX_PACKED_LEN <= MAX_LEN);

/// Why a record could not be read at some offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// Fewer bytes remain than the record needs.
    Incomplete(Corruption),
    /// The bytes are not a valid record.
    Invalid(Corruption),
    /// A valid record of this segment, written at another offset: moved,
    /// repeated, or records before it are missing. Never a crash.
    Misplaced(Corruption),
}

/// A decoded record.
#[derive(Clone, Debug)]
pub(crate) struct Decoded<'a> {
    pub ops: Ops<'a>,
    pub len: usize,
    /// A close marker (no operation).
    pub close: bool,
}

/// The operations of one record, in log order: one, or the appends of a
/// kind-1 record.
#[derive(Clone, Debug)]
pub(crate) enum Ops<'a> {
    One(Option<LogOp>),
    Packed(std::slice::ChunksExact<'a, u8>),
}

impl Iterator for Ops<'_> {
    type Item = LogOp;

    fn next(&mut self) -> Option<LogOp> {
        match self {
            Ops::One(r) => r.take(),
            Ops::Packed(entries) => {
                let mut d = Dec::new(entries.next()?);
                Some(LogOp::Append(AppendRequest::single(
                    ProducerId::numeric(d.u64()?),
                    d.i32()?,
                    d.i16()?,
                    d.i32()?,
                )))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            Ops::One(r) => usize::from(r.is_some()),
            Ops::Packed(entries) => entries.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Ops<'_> {}

/// Decodes the record at the start of `bytes` (which may hold more), found
/// at offset `at` of a segment whose CRC seed is `seed` (see [`seed`]) and
/// whose records have `layout`.
pub(crate) fn decode(bytes: &[u8], seed: u32, layout: Layout, at: u64) -> Result<Decoded<'_>, Bad> {
    let avail = bytes.len();
    let header = layout.header;
    if avail < header {
        return Err(Bad::Incomplete(crate::codec::truncated(header, avail)));
    }
    let len = u32_at(bytes, AT_LEN).unwrap_or(0) as usize;
    if !(layout.min_len()..=layout.max_len()).contains(&len) {
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
    if layout.positioned() {
        let written_at = d.u32().unwrap_or(0);
        if u64::from(written_at) != at {
            return Err(Bad::Misplaced(Corruption::MisplacedRecord {
                written_at: u64::from(written_at),
            }));
        }
    }
    // The unsynced offset (read by `unsynced_offset`).
    d.u32();
    let kind = d.u8().unwrap_or(0);
    let mut close = false;
    let ops = if kind == KIND_NUMERIC_SINGLE {
        if !packed_len_ok(len, layout) {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        Ops::Packed(
            d.bytes(d.remaining())
                .unwrap_or_default()
                .chunks_exact(PACKED_ENTRY),
        )
    } else if kind == KIND_CLOSE && layout.positioned() {
        if len != header {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        close = true;
        Ops::One(None)
    } else if layout.lifecycle && op::is_kind(kind, layout.partition_groups) {
        if !op::len_ok(kind, len) {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        Ops::One(Some(
            op::decode_payload(kind, &mut d).map_err(Bad::Invalid)?,
        ))
    } else if layout.kafka && txn_op::is_kind(kind) {
        if !txn_op::len_ok(kind, len) {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        Ops::One(Some(
            txn_op::decode_payload(kind, &mut d).map_err(Bad::Invalid)?,
        ))
    } else {
        if len > MAX_APPEND_LEN {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        let request = decode_payload(kind, &mut d).map_err(Bad::Invalid)?;
        if d.remaining() != 0 {
            return Err(Bad::Invalid(Corruption::BadLength(len as u64)));
        }
        Ops::One(Some(LogOp::Append(request)))
    };
    Ok(Decoded { ops, len, close })
}

/// The partition and length of the record at `bytes[0]` when it holds
/// one operation on one partition that a replay of another partition may
/// pass over without decoding it: an append of a batch or of a named
/// producer (kinds 2 to 4) or, in a Kafka-flagged segment, a batch or a
/// marker (kinds 16 to 19). What is checked keeps the scan on record
/// boundaries and the partition true: the record is complete, its length
/// is exactly what its kind and name length make, it says it was written
/// at `at`, and its checksum (with the segment's `seed`) holds, so a
/// damaged partition field cannot hide one of the replayed partition's own
/// records. Its payload is not decoded: nothing of it reaches the state
/// rebuilt. `None` for every other record, a damaged one, and in segments
/// before version 3 (no written offset): those are decoded, and a damaged
/// one is then the error it always was.
#[inline(always)]
fn one_partition(bytes: &[u8], seed: u32, layout: Layout, at: u64) -> Option<(i32, usize)> {
    if !layout.positioned() {
        return None;
    }
    let len = u32_at(bytes, AT_LEN)? as usize;
    let rec = bytes.get(..len)?;
    if u64::from(u32_at(rec, AT_OFFSET)?) != at {
        return None;
    }
    let kind = *rec.get(AT_KIND)?;
    let (numeric, tail) = match kind {
        KIND_NUMERIC_BATCH => (true, BATCH_TAIL),
        KIND_NAMED_SINGLE => (false, SINGLE_TAIL),
        KIND_NAMED_BATCH => (false, BATCH_TAIL),
        other if layout.kafka => txn_op::one_partition_kind(other)?,
        _ => return None,
    };
    let id_len = if numeric {
        8
    } else {
        2 + usize::from(Dec::new(rec.get(HEADER..)?).u16()?)
    };
    if len != HEADER + id_len + tail || stored_crc(rec) != Some(crc(seed, rec)) {
        return None;
    }
    let partition = Dec::new(rec.get(HEADER + id_len..)?).i32()?;
    Some((partition, len))
}

/// The length a record starting at `bytes[0]` states, if its header's
/// length field is there (not checked: [`decode`] checks it).
pub(crate) fn stated_len(bytes: &[u8]) -> Option<usize> {
    u32_at(bytes, AT_LEN).map(|n| n as usize)
}

/// How many records from `bytes[0]` on (written at `at`, in a segment
/// whose CRC seed is `seed`) hold one operation on a partition other than
/// `only` ([`one_partition`]), one after the other, and their bytes: what
/// a replay of `only` passes over before the next record it must decode
/// (or the end of `bytes`).
pub(crate) fn pass_over(
    bytes: &[u8],
    seed: u32,
    layout: Layout,
    at: u64,
    only: i32,
) -> (u64, usize) {
    let (mut records, mut off) = (0u64, 0usize);
    while let Some(rest) = bytes.get(off..)
        && let Some((partition, len)) = one_partition(rest, seed, layout, at + off as u64)
        && partition != only
    {
        records += 1;
        off += len;
    }
    (records, off)
}

/// Whether `len` is the length of a kind-1 record of 1 to the layout's
/// most appends.
fn packed_len_ok(len: usize, layout: Layout) -> bool {
    len >= layout.header + PACKED_ENTRY
        && (len - layout.header).is_multiple_of(PACKED_ENTRY)
        && (len - layout.header) / PACKED_ENTRY <= layout.max_packed
}

/// Decodes the payload of a record of kind 2, 3 or 4 (one append).
fn decode_payload(kind: u8, d: &mut Dec<'_>) -> Result<AppendRequest, Corruption> {
    // Built only on the error path: `ok_or` would build (and clone) it
    // for every field of every record replayed.
    let remaining = d.remaining() as u64;
    let short = || Corruption::BadLength(remaining);
    let id = match kind {
        KIND_NUMERIC_BATCH => ProducerId::numeric(d.u64().ok_or_else(short)?),
        KIND_NAMED_SINGLE | KIND_NAMED_BATCH => {
            let n = d.u16().ok_or_else(short)? as usize;
            let name = d.bytes(n).ok_or_else(short)?;
            let name = std::str::from_utf8(name)
                .map_err(|_| Corruption::BadField("producer name (not UTF-8)"))?;
            ProducerId::named(name)
        }
        other => return Err(Corruption::BadKind(other)),
    };
    let partition = d.i32().ok_or_else(short)?;
    let epoch = d.i16().ok_or_else(short)?;
    let first = d.i32().ok_or_else(short)?;
    let request = if kind == KIND_NAMED_SINGLE {
        AppendRequest::single(id, partition, epoch, first)
    } else {
        let last = d.i32().ok_or_else(short)?;
        let offset = d.i64().ok_or_else(short)?;
        let timestamp = d.i64().ok_or_else(short)?;
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
pub(crate) fn plausible(bytes: &[u8], layout: Layout) -> bool {
    let Some(len) = u32_at(bytes, AT_LEN) else {
        return false;
    };
    let len = len as usize;
    let kind = bytes.get(layout.header - 1).copied().unwrap_or(0);
    match kind {
        KIND_NUMERIC_SINGLE => packed_len_ok(len, layout),
        KIND_NUMERIC_BATCH => len == layout.header + 8 + BATCH_TAIL,
        KIND_NAMED_SINGLE | KIND_NAMED_BATCH => {
            (layout.min_len()..=layout.max_len().min(MAX_APPEND_LEN)).contains(&len)
        }
        KIND_CLOSE => layout.positioned() && len == layout.header,
        k if layout.lifecycle && op::is_kind(k, layout.partition_groups) => op::len_ok(k, len),
        k if layout.kafka && txn_op::is_kind(k) => txn_op::len_ok(k, len),
        _ => false,
    }
}

/// The length the record at `bytes[0]` claims, if it is [`plausible`] and
/// `bytes` holds that many bytes.
pub(crate) fn claimed_len(bytes: &[u8], layout: Layout) -> Option<usize> {
    let len = u32_at(bytes, AT_LEN)? as usize;
    (plausible(bytes, layout) && len <= bytes.len()).then_some(len)
}

/// The record's unsynced offset: bytes from the segment's durable end,
/// when the record was written, to the record (the field just before the
/// kind byte, in every layout).
pub(crate) fn unsynced_offset(bytes: &[u8], layout: Layout) -> Option<u32> {
    u32_at(bytes, layout.header - 5)
}

/// The offset a version-3 record states it was written at (`None` for
/// the older layouts, whose records do not state it).
pub(crate) fn stated_offset(bytes: &[u8], layout: Layout) -> Option<u32> {
    if layout.positioned() {
        u32_at(bytes, 8)
    } else {
        None
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
