//! The transaction records of a `Semantics::Kafka` store (kinds 16 to 20):
//! transactional batches, end-transaction markers, and aborted
//! transactions forgotten below an offset.
//!
//! They exist only in segments whose header has the Kafka flag (version
//! 5); a strict store's segment reads any of these kinds as damage, as
//! before. Plain Kafka-mode batches keep using kinds 1 to 4: replay applies
//! them the same way. The origin of a batch (client, coordinator,
//! replication) is not stored: it changed only which checks ran, and
//! replay runs none. The bytes are in docs/format.md.

#![deny(clippy::indexing_slicing)]

use super::frame::{AT_KIND, AT_LEN, HEADER, put};
use super::op::{LogOp, begin, end};
use crate::batch::{AppendRequest, BatchMetadata};
use crate::codec::{Dec, Put};
use crate::engine::ProducerStateManager;
use crate::engine::info::ProducerInfo;
use crate::engine::kafka::state::KafkaState;
use crate::engine::kafka::txn::{AbortedTxn, Marker, MarkerKind};
use crate::error::{Corruption, Error, Result};
use crate::id::ProducerId;
use crate::semantics::Semantics;

const KIND_BATCH_NUMERIC: u8 = 16;
const KIND_BATCH_NAMED: u8 = 17;
const KIND_MARKER_NUMERIC: u8 = 18;
const KIND_MARKER_NAMED: u8 = 19;
const KIND_FORGET_ABORTED: u8 = 20;
const KIND_KAFKA_PARTITION: u8 = 21;

/// Fields of a batch after the id: partition, epoch, first, last, offset,
/// timestamp, flags.
const BATCH_TAIL: usize = 4 + 2 + 4 + 4 + 8 + 8 + 1;
/// Fields of a marker after the id: partition, epoch, kind, coordinator
/// epoch, offset, timestamp.
const MARKER_TAIL: usize = 4 + 2 + 1 + 4 + 8 + 8;
/// The record lengths of docs/format.md.
pub(super) const BATCH_NUMERIC_LEN: usize = HEADER + 8 + BATCH_TAIL;
pub(super) const MARKER_NUMERIC_LEN: usize = HEADER + 8 + MARKER_TAIL;
pub(super) const FORGET_LEN: usize = HEADER + 4 + 8;
/// A partition-state record holds at least its partition, its reset flag
/// and the two counts of an empty section.
const PARTITION_MIN_LEN: usize = HEADER + 4 + 1 + 4 + 4;
/// The longest section a partition-state record carries.
pub(crate) const MAX_SECTION: usize = super::op::MAX_LEN - (HEADER + 4 + 1);
const NAMED_BASE: usize = HEADER + 2;
/// The batch flag: the batch is transactional.
const TRANSACTIONAL: u8 = 1;
const _: () = assert!(NAMED_BASE + super::frame::MAX_NAME + BATCH_TAIL <= super::op::MAX_LEN);

/// Puts the id (numeric: `u64`; named: `u16` length and UTF-8) and
/// returns the record kind to use, numeric or named.
fn put_id(buf: &mut Vec<u8>, id: &ProducerId, numeric: u8, named: u8) -> u8 {
    match id.as_numeric() {
        Some(n) => {
            buf.put_u64(n);
            numeric
        }
        None => {
            let name = id.name_bytes().unwrap_or_default();
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
            named
        }
    }
}

fn set_kind(buf: &mut [u8], start: usize, kind: u8) {
    if let Some(k) = buf.get_mut(start + AT_KIND) {
        *k = kind;
    }
}

/// Appends a Kafka-mode data batch record (kind 16 or 17). The caller has
/// checked that a name fits and that the batch has metadata (single
/// appends are plain: kinds 1 to 4).
pub(crate) fn encode_batch(buf: &mut Vec<u8>, r: &AppendRequest, transactional: bool) {
    if let (Some(id), Some(m)) = (r.producer_id.as_numeric(), r.metadata) {
        // The common record, built in place and appended at once: the
        // field-by-field path below checks the buffer's room per field,
        // which cost a transactional batch more than its classification.
        // The same bytes (a test compares the two).
        buf.extend_from_slice(&numeric_batch(id, r, m, transactional));
        return;
    }
    encode_batch_fields(buf, r, transactional);
}

/// [`encode_batch`] field by field: any id, with or without metadata.
fn encode_batch_fields(buf: &mut Vec<u8>, r: &AppendRequest, transactional: bool) {
    let s = begin(buf, KIND_BATCH_NUMERIC);
    let kind = put_id(buf, &r.producer_id, KIND_BATCH_NUMERIC, KIND_BATCH_NAMED);
    set_kind(buf, s, kind);
    let m = r.metadata.unwrap_or(BatchMetadata {
        offset: -1,
        timestamp: -1,
    });
    buf.put_i32(r.partition);
    buf.put_i16(r.epoch);
    buf.put_i32(r.first);
    buf.put_i32(r.last);
    buf.put_i64(m.offset);
    buf.put_i64(m.timestamp);
    buf.put_u8(if transactional { TRANSACTIONAL } else { 0 });
    end(buf, s);
}

/// A numeric id's batch record (kind 16), header fields but the length
/// and kind left zero as [`begin`] leaves them.
#[inline]
fn numeric_batch(
    id: u64,
    r: &AppendRequest,
    m: BatchMetadata,
    transactional: bool,
) -> [u8; BATCH_NUMERIC_LEN] {
    let mut rec = [0u8; BATCH_NUMERIC_LEN];
    put(&mut rec, AT_LEN, (BATCH_NUMERIC_LEN as u32).to_le_bytes());
    put(&mut rec, AT_KIND, [KIND_BATCH_NUMERIC]);
    let at = HEADER;
    put(&mut rec, at, id.to_le_bytes());
    put(&mut rec, at + 8, r.partition.to_le_bytes());
    put(&mut rec, at + 12, r.epoch.to_le_bytes());
    put(&mut rec, at + 14, r.first.to_le_bytes());
    put(&mut rec, at + 18, r.last.to_le_bytes());
    put(&mut rec, at + 22, m.offset.to_le_bytes());
    put(&mut rec, at + 30, m.timestamp.to_le_bytes());
    put(
        &mut rec,
        at + 38,
        [if transactional { TRANSACTIONAL } else { 0 }],
    );
    rec
}

/// Appends an end-transaction marker record (kind 18 or 19).
pub(crate) fn encode_marker(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    epoch: i16,
    marker: &Marker,
) {
    if let Some(n) = id.as_numeric() {
        // Built in place, as a numeric batch is (the same bytes).
        let mut rec = [0u8; MARKER_NUMERIC_LEN];
        put(&mut rec, AT_LEN, (MARKER_NUMERIC_LEN as u32).to_le_bytes());
        put(&mut rec, AT_KIND, [KIND_MARKER_NUMERIC]);
        let at = HEADER;
        put(&mut rec, at, n.to_le_bytes());
        put(&mut rec, at + 8, partition.to_le_bytes());
        put(&mut rec, at + 12, epoch.to_le_bytes());
        put(&mut rec, at + 14, [marker_kind(marker)]);
        put(&mut rec, at + 15, marker.coordinator_epoch.to_le_bytes());
        put(&mut rec, at + 19, marker.offset.to_le_bytes());
        put(&mut rec, at + 27, marker.timestamp.to_le_bytes());
        buf.extend_from_slice(&rec);
        return;
    }
    encode_marker_fields(buf, id, partition, epoch, marker);
}

fn marker_kind(marker: &Marker) -> u8 {
    match marker.kind {
        MarkerKind::Commit => 0,
        MarkerKind::Abort => 1,
    }
}

/// [`encode_marker`] field by field: any id.
fn encode_marker_fields(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    epoch: i16,
    marker: &Marker,
) {
    let s = begin(buf, KIND_MARKER_NUMERIC);
    let kind = put_id(buf, id, KIND_MARKER_NUMERIC, KIND_MARKER_NAMED);
    set_kind(buf, s, kind);
    buf.put_i32(partition);
    buf.put_i16(epoch);
    buf.put_u8(marker_kind(marker));
    buf.put_i32(marker.coordinator_epoch);
    buf.put_i64(marker.offset);
    buf.put_i64(marker.timestamp);
    end(buf, s);
}

/// Appends a forget-aborted record (kind 20).
pub(crate) fn encode_forget(buf: &mut Vec<u8>, partition: i32, offset: i64) {
    let s = begin(buf, KIND_FORGET_ABORTED);
    buf.put_i32(partition);
    buf.put_i64(offset);
    end(buf, s);
}

/// Appends a partition-state record (kind 21): `section` is a Kafka
/// section without its length field, at most [`MAX_SECTION`] bytes (the
/// caller cuts larger states into several records).
pub(crate) fn encode_partition(buf: &mut Vec<u8>, partition: i32, reset: bool, section: &[u8]) {
    let s = begin(buf, KIND_KAFKA_PARTITION);
    buf.put_i32(partition);
    buf.put_u8(u8::from(reset));
    buf.extend_from_slice(section);
    end(buf, s);
}

/// Whether `kind` is a transaction record kind.
pub(super) fn is_kind(kind: u8) -> bool {
    (KIND_BATCH_NUMERIC..=KIND_KAFKA_PARTITION).contains(&kind)
}

/// For the transaction records that hold one operation on one partition
/// (batches and markers): whether the id is numeric, and the bytes after
/// it, the partition first ([`super::record::one_partition`]).
pub(super) fn one_partition_kind(kind: u8) -> Option<(bool, usize)> {
    match kind {
        KIND_BATCH_NUMERIC => Some((true, BATCH_TAIL)),
        KIND_BATCH_NAMED => Some((false, BATCH_TAIL)),
        KIND_MARKER_NUMERIC => Some((true, MARKER_TAIL)),
        KIND_MARKER_NAMED => Some((false, MARKER_TAIL)),
        _ => None,
    }
}

/// Whether `len` can be the length of a record of transaction `kind`.
pub(super) fn len_ok(kind: u8, len: usize) -> bool {
    let named =
        |tail: usize| (NAMED_BASE + tail..=NAMED_BASE + u16::MAX as usize + tail).contains(&len);
    match kind {
        KIND_BATCH_NUMERIC => len == BATCH_NUMERIC_LEN,
        KIND_BATCH_NAMED => named(BATCH_TAIL),
        KIND_MARKER_NUMERIC => len == MARKER_NUMERIC_LEN,
        KIND_MARKER_NAMED => named(MARKER_TAIL),
        KIND_FORGET_ABORTED => len == FORGET_LEN,
        KIND_KAFKA_PARTITION => (PARTITION_MIN_LEN..=super::op::MAX_LEN).contains(&len),
        _ => false,
    }
}

fn get_id(kind: u8, numeric: u8, d: &mut Dec<'_>) -> Result<ProducerId, Corruption> {
    let short = || Corruption::BadField("transaction record (too short)");
    if kind == numeric {
        return Ok(ProducerId::numeric(d.u64().ok_or_else(short)?));
    }
    let n = d.u16().ok_or_else(short)? as usize;
    let name = d.bytes(n).ok_or_else(short)?;
    let name =
        std::str::from_utf8(name).map_err(|_| Corruption::BadField("producer name (not UTF-8)"))?;
    Ok(ProducerId::named(name))
}

/// Decodes the payload of a transaction record of `kind` (after the
/// header).
pub(super) fn decode_payload(kind: u8, d: &mut Dec<'_>) -> Result<LogOp, Corruption> {
    let short = || Corruption::BadField("transaction record (too short)");
    let op = match kind {
        KIND_BATCH_NUMERIC | KIND_BATCH_NAMED => {
            let id = get_id(kind, KIND_BATCH_NUMERIC, d)?;
            let partition = d.i32().ok_or_else(short)?;
            let epoch = d.i16().ok_or_else(short)?;
            let first = d.i32().ok_or_else(short)?;
            let last = d.i32().ok_or_else(short)?;
            let offset = d.i64().ok_or_else(short)?;
            let timestamp = d.i64().ok_or_else(short)?;
            let flags = d.u8().ok_or_else(short)?;
            if flags & !TRANSACTIONAL != 0 {
                return Err(Corruption::BadField("batch flags"));
            }
            let mut request = AppendRequest::single(id, partition, epoch, first);
            request.last = last;
            request.metadata = Some(BatchMetadata { offset, timestamp });
            LogOp::KafkaBatch {
                request,
                transactional: flags & TRANSACTIONAL != 0,
            }
        }
        KIND_MARKER_NUMERIC | KIND_MARKER_NAMED => {
            let producer_id = get_id(kind, KIND_MARKER_NUMERIC, d)?;
            let partition = d.i32().ok_or_else(short)?;
            let epoch = d.i16().ok_or_else(short)?;
            let kind = match d.u8().ok_or_else(short)? {
                0 => MarkerKind::Commit,
                1 => MarkerKind::Abort,
                _ => return Err(Corruption::BadField("marker kind")),
            };
            let marker = Marker {
                kind,
                coordinator_epoch: d.i32().ok_or_else(short)?,
                offset: d.i64().ok_or_else(short)?,
                timestamp: d.i64().ok_or_else(short)?,
            };
            LogOp::TxnMarker {
                producer_id,
                partition,
                epoch,
                marker,
            }
        }
        KIND_FORGET_ABORTED => LogOp::ForgetAborted {
            partition: d.i32().ok_or_else(short)?,
            offset: d.i64().ok_or_else(short)?,
        },
        KIND_KAFKA_PARTITION => {
            let partition = d.i32().ok_or_else(short)?;
            let reset = match d.u8().ok_or_else(short)? {
                0 => false,
                1 => true,
                _ => return Err(Corruption::BadField("partition reset flag")),
            };
            let section = d.bytes(d.remaining()).ok_or_else(short)?.to_vec();
            // Valid, and of this partition only, or damage.
            let state = crate::snapshot::kafka::decode_state(&section).map_err(|(_, k)| k)?;
            if !state.only_partition(partition) {
                return Err(Corruption::BadField("partition state of another partition"));
            }
            LogOp::KafkaPartition {
                partition,
                reset,
                section,
            }
        }
        other => return Err(Corruption::BadKind(other)),
    };
    if d.remaining() != 0 {
        return Err(Corruption::BadLength(d.remaining() as u64));
    }
    Ok(op)
}

/// The log operations that set `partition` to `engine`'s state of it (members of a Kafka-mode truncation group): partition-state
/// records (the first resets) for the side table and the aborted
/// list, then key-state records for the compact keys.
///
/// # Errors
///
/// [`Error::Unsupported`] if one side-table key alone does not fit a
/// record (a producer name of over about 65,000 bytes).
pub(crate) fn kafka_partition_ops(
    engine: &ProducerStateManager,
    partition: i32,
) -> Result<Vec<LogOp>> {
    /// A record's worth, by estimate (a record holds up to 64 KiB).
    const CHUNK: usize = 48 << 10;
    let k = engine.kafka_side().ok_or(Error::Unsupported {
        what: "a Kafka-mode truncation",
        semantics: Semantics::Strict,
    })?;
    let (side, aborted) = k.partition_side(partition);
    let id_len = |id: &ProducerId| id.name_bytes().map_or(8, |n| 2 + n.len());
    let mut chunks: Vec<KafkaState> = vec![KafkaState::default()];
    let mut size = 0;
    for (id, e) in side {
        let est = id_len(&id) + 40 + 25 * e.batches.len();
        if size + est > CHUNK && size > 0 {
            chunks.push(KafkaState::default());
            size = 0;
        }
        size += est;
        if let Some(c) = chunks.last_mut() {
            c.insert_side(id, partition, e);
        }
    }
    let mut list: Vec<AbortedTxn> = Vec::new();
    for t in aborted {
        let est = id_len(&t.producer_id) + 25;
        if size + est > CHUNK && size > 0 {
            if let Some(c) = chunks.last_mut() {
                c.txns_mut()
                    .set_aborted(partition, std::mem::take(&mut list));
            }
            chunks.push(KafkaState::default());
            size = 0;
        }
        size += est;
        list.push(t);
    }
    if let Some(c) = chunks.last_mut()
        && !list.is_empty()
    {
        c.txns_mut().set_aborted(partition, list);
    }
    let mut ops = Vec::with_capacity(chunks.len() + 1);
    for (i, c) in chunks.iter().enumerate() {
        let section = crate::snapshot::kafka::encode_body(c);
        if section.len() > MAX_SECTION {
            return Err(Error::Unsupported {
                what: "truncating a Kafka-mode partition with a producer name this long",
                semantics: Semantics::Kafka,
            });
        }
        ops.push(LogOp::KafkaPartition {
            partition,
            reset: i == 0,
            section,
        });
    }
    let compact: Vec<ProducerInfo> = engine
        .compact_entries()
        .filter(|(_, p, _, _)| *p == partition)
        .map(|(producer_id, partition, entry, _)| ProducerInfo {
            producer_id,
            partition,
            entry,
            last_activity: 0,
        })
        .collect();
    for part in compact.chunks(256) {
        ops.push(LogOp::Set {
            entries: part.to_vec(),
        });
    }
    Ok(ops)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::wal::frame::{seal, seed};
    use crate::wal::record::{Layout, decode};

    #[test]
    fn a_numeric_batch_built_in_place_has_the_bytes_of_the_field_by_field_record() {
        for (id, partition, epoch, first, last, offset, ts, txn) in [
            (0u64, 0, 0, 0, 0, 0i64, 0i64, false),
            (
                u64::MAX,
                -3,
                i16::MIN,
                i32::MAX,
                -1,
                i64::MIN,
                i64::MAX,
                true,
            ),
            (
                0x0102_0304_0506_0708,
                i32::MIN,
                7,
                5,
                9,
                0x1122_3344_5566_7788,
                -1,
                true,
            ),
        ] {
            let mut r = AppendRequest::single(id, partition, epoch, first);
            r.last = last;
            r.metadata = Some(BatchMetadata {
                offset,
                timestamp: ts,
            });
            let (mut fast, mut fields) = (vec![0xAA], vec![0xAA]);
            encode_batch(&mut fast, &r, txn);
            encode_batch_fields(&mut fields, &r, txn);
            assert_eq!(fast, fields, "{id} {partition} {txn}");
            assert_eq!(fast.len(), 1 + BATCH_NUMERIC_LEN);
        }
    }

    #[test]
    fn a_numeric_marker_built_in_place_has_the_bytes_of_the_field_by_field_record() {
        for (id, partition, epoch, marker) in [
            (0u64, 0, 0, Marker::commit(0, 0, 0)),
            (
                u64::MAX,
                -3,
                i16::MIN,
                Marker::abort(i32::MIN, i64::MAX, -1),
            ),
            (
                0x0102_0304_0506_0708,
                i32::MAX,
                7,
                Marker::abort(0x1122_3344, 0x1122_3344_5566_7788, i64::MIN),
            ),
        ] {
            let id = ProducerId::numeric(id);
            let (mut fast, mut fields) = (vec![0xAA], vec![0xAA]);
            encode_marker(&mut fast, &id, partition, epoch, &marker);
            encode_marker_fields(&mut fields, &id, partition, epoch, &marker);
            assert_eq!(fast, fields, "{id:?} {partition}");
            assert_eq!(fast.len(), 1 + MARKER_NUMERIC_LEN);
        }
    }

    fn ops() -> Vec<LogOp> {
        let mut named = AppendRequest::single("tx-é", -3, 7, 10);
        named.last = 12;
        named.metadata = Some(BatchMetadata {
            offset: 40,
            timestamp: 1_700,
        });
        let mut numeric = named.clone();
        numeric.producer_id = ProducerId::numeric(u64::MAX);
        vec![
            LogOp::KafkaBatch {
                request: numeric,
                transactional: true,
            },
            LogOp::KafkaBatch {
                request: named,
                transactional: false,
            },
            LogOp::TxnMarker {
                producer_id: ProducerId::numeric(9),
                partition: 2,
                epoch: i16::MAX,
                marker: Marker::abort(i32::MAX, 99, -5),
            },
            LogOp::TxnMarker {
                producer_id: ProducerId::named("n"),
                partition: 2,
                epoch: -1,
                marker: Marker::commit(0, 0, 0),
            },
            LogOp::ForgetAborted {
                partition: i32::MIN,
                offset: i64::MAX,
            },
        ]
    }

    fn encode(op: &LogOp, buf: &mut Vec<u8>) {
        match op {
            LogOp::KafkaBatch {
                request,
                transactional,
            } => encode_batch(buf, request, *transactional),
            LogOp::TxnMarker {
                producer_id,
                partition,
                epoch,
                marker,
            } => encode_marker(buf, producer_id, *partition, *epoch, marker),
            LogOp::ForgetAborted { partition, offset } => encode_forget(buf, *partition, *offset),
            _ => unreachable!(),
        }
    }

    #[test]
    fn records_round_trip_only_in_a_kafka_segment_and_have_the_documented_lengths() {
        let sd = seed(&[7; 24]);
        let kafka = Layout::of(5).with_kafka(true);
        let mut lens = Vec::new();
        for op in ops() {
            let mut buf = Vec::new();
            encode(&op, &mut buf);
            seal(&mut buf, sd, 0, 0);
            lens.push(buf.len());
            let d = decode(&buf, sd, kafka, 0).unwrap();
            assert_eq!(d.len, buf.len());
            assert_eq!(d.ops.collect::<Vec<_>>(), vec![op.clone()]);
            // A strict store's segment (or an older version) reads it as damage.
            for layout in [
                Layout::of(5),
                Layout::of(5).with_kafka(false),
                Layout::of(4).with_kafka(true),
            ] {
                assert!(decode(&buf, sd, layout, 0).is_err(), "{op:?} in {layout:?}");
            }
            // Every cut and every flipped bit is an error, never a panic.
            for cut in 0..buf.len() {
                assert!(decode(&buf[..cut], sd, kafka, 0).is_err());
            }
            for at in 0..buf.len() {
                let mut bad = buf.clone();
                bad[at] ^= 0x40;
                assert!(decode(&bad, sd, kafka, 0).is_err(), "flip at {at}");
            }
        }
        // 56, 50 + name (5 bytes), 52, 46 + name (1 byte), 29.
        assert_eq!(lens, [56, 55, 52, 47, 29]);
    }

    /// A valid partition-state body of `partition`: a numeric key with an
    /// open transaction and two cached batches, a named key without a
    /// batch, and an aborted list of one.
    fn body(partition: i32) -> Vec<u8> {
        use crate::batch::RetainedBatch;
        use crate::engine::kafka::side::FullEntry;
        use crate::engine::kafka::state::KafkaState;
        use crate::engine::kafka::txn::AbortedTxn;
        let batch = |f, l, offset| RetainedBatch {
            first_sequence: f,
            last_sequence: l,
            metadata: Some(BatchMetadata {
                offset,
                timestamp: 7,
            }),
        };
        let mut k = KafkaState::default();
        let e = FullEntry {
            epoch: 1,
            last_sequence: 9,
            last_timestamp: 5,
            coordinator_epoch: 2,
            txn_first_offset: Some(40),
            batches: [batch(0, 4, 40), batch(5, 9, 45)].into(),
        };
        assert!(k.insert_side(ProducerId::numeric(3), partition, e));
        let e = FullEntry {
            epoch: 0,
            last_sequence: -1,
            last_timestamp: -1,
            coordinator_epoch: -1,
            txn_first_offset: None,
            batches: Default::default(),
        };
        assert!(k.insert_side(ProducerId::named("p"), partition, e));
        k.txns_mut().set_aborted(
            partition,
            vec![AbortedTxn {
                producer_id: ProducerId::numeric(3),
                first_offset: 10,
                last_offset: 20,
                last_stable_offset: 10,
            }],
        );
        crate::snapshot::kafka::encode_body(&k)
    }

    fn partition_record(partition: i32, section: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_partition(&mut buf, partition, true, section);
        seal(&mut buf, seed(&[7; 24]), 0, 0);
        buf
    }

    /// Decodes a record in a Kafka segment, operations included.
    fn decode_record(buf: &[u8]) -> Result<Vec<LogOp>, ()> {
        let kafka = Layout::of(5).with_kafka(true);
        decode(buf, seed(&[7; 24]), kafka, 0)
            .map(|d| d.ops.collect())
            .map_err(|_| ())
    }

    fn corrupt(bytes: &[u8]) -> Corruption {
        crate::snapshot::kafka::decode_state(bytes)
            .map(|_| ())
            .expect_err("damage decoded")
            .1
    }

    #[test]
    fn hand_made_damage_in_a_partition_state_is_corruption() {
        let good = body(4);
        assert!(crate::snapshot::kafka::decode_state(&good).is_ok());
        assert_eq!(decode_record(&partition_record(4, &good)).unwrap().len(), 1);
        let short = Corruption::BadField("Kafka section (too short)");
        // A key count far beyond the bytes.
        let mut b = good.clone();
        b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(corrupt(&b), Corruption::BadField(_)));
        // The first key's id kind byte is 7.
        let mut b = good.clone();
        b[4] = 7;
        assert_eq!(corrupt(&b), Corruption::BadField("producer id kind"));
        // A list count beyond the bytes: the last list holds one
        // transaction (a numeric id and three offsets: 33 bytes).
        let at = good.len() - 33 - 4;
        assert_eq!(good[at..at + 4], 1u32.to_le_bytes());
        let mut b = good.clone();
        b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(corrupt(&b), Corruption::BadField(_)));
        // An empty list, and a partition count beyond the bytes.
        let mut b = good.clone();
        b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        b.truncate(at + 4);
        assert_eq!(
            corrupt(&b),
            Corruption::BadField("aborted list of no transaction")
        );
        let mut b = good.clone();
        b[at - 8..at - 4].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(corrupt(&b), Corruption::BadField(_)));
        // A byte too many, a byte too few.
        let mut b = good.clone();
        b.push(0);
        assert_eq!(corrupt(&b), Corruption::TrailingBytes(1));
        assert_eq!(corrupt(&good[..good.len() - 1]), short);
        assert_eq!(corrupt(&[]), short);
        // In a record: the section of another partition, and a reset flag
        // of 2, are damage even with a valid checksum.
        assert!(decode_record(&partition_record(5, &good)).is_err());
        let mut r = partition_record(4, &good);
        r[HEADER + 4] = 2;
        seal(&mut r, seed(&[7; 24]), 0, 0);
        assert!(decode_record(&r).is_err());
        // A length field beyond the record, and one beyond any record.
        let r = partition_record(4, &good);
        for len in [r.len() as u32 + 1, u32::MAX] {
            let mut bad = r.clone();
            bad[4..8].copy_from_slice(&len.to_le_bytes());
            assert!(decode_record(&bad).is_err(), "length {len}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// No byte string panics the decoders of the transaction records
        /// and the Kafka section: random bytes as any kind's payload, and
        /// valid partition states with bytes changed, cut or added, as a
        /// section and as a record with a valid checksum. What a damaged
        /// section decodes to, when it decodes, writes back to a section
        /// that decodes again to the same bytes (no state half-read).
        #[test]
        fn damaged_bytes_never_panic_the_decoders(
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            edits in proptest::collection::vec((0usize..512, proptest::prelude::any::<u8>()), 0..4),
            cut in 0usize..512,
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3),
        ) {
            for kind in KIND_BATCH_NUMERIC..=KIND_KAFKA_PARTITION + 1 {
                let _ = decode_payload(kind, &mut Dec::new(&random));
            }
            let _ = crate::snapshot::kafka::decode_state(&random);
            let mut b = body(1);
            for &(at, v) in &edits {
                let n = b.len();
                b[at % n] = v;
            }
            b.truncate(cut.max(1));
            b.extend_from_slice(&extra);
            if let Ok(k) = crate::snapshot::kafka::decode_state(&b) {
                let again = crate::snapshot::kafka::encode_body(&k);
                let k2 = crate::snapshot::kafka::decode_state(&again).unwrap();
                proptest::prop_assert_eq!(crate::snapshot::kafka::encode_body(&k2), again);
            }
            if b.len() <= MAX_SECTION {
                let _ = decode_record(&partition_record(1, &b));
            }
        }
    }
}
