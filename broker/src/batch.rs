//! The fixed header of a Kafka record batch (magic 2), read and checked.
//!
//! The broker never decodes records: it stores a produced batch as it came,
//! with its base offset rewritten, and serves the same bytes to consumers.
//! What it needs from a batch is in the 61-byte header, big-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | base offset (the broker assigns it) |
//! | 8 | 4 | batch length: bytes after this field |
//! | 12 | 4 | partition leader epoch |
//! | 16 | 1 | magic, 2 |
//! | 17 | 4 | CRC-32C of bytes 21 to the end |
//! | 21 | 2 | attributes (bits 0-2 compression, 4 transactional, 5 control) |
//! | 23 | 4 | last offset delta |
//! | 27 | 8 | base timestamp |
//! | 35 | 8 | max timestamp |
//! | 43 | 8 | producer id (-1: not idempotent) |
//! | 51 | 2 | producer epoch |
//! | 53 | 4 | base sequence |
//! | 57 | 4 | record count |
//!
//! The CRC does not cover the base offset, so rewriting it keeps the batch
//! valid, which is what Kafka's broker does too.

use std::fmt;

/// Bytes of the header up to and including the record count.
pub const HEADER_LEN: usize = 61;
/// Bytes before the batch-length field's count starts (base offset + length).
pub const LOG_OVERHEAD: usize = 12;
/// The largest batch the broker takes (Kafka's default `message.max.bytes`
/// is about 1 MiB; this leaves room for clients configured higher).
pub const MAX_BATCH_LEN: usize = 16 << 20;

const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;

/// What the broker reads from a batch header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// Base offset as found in the bytes (a producer sends 0).
    pub base_offset: i64,
    /// Total size of the batch in bytes, header included.
    pub size: usize,
    /// Attribute bits.
    pub attributes: i16,
    /// Offset of the last record relative to the base offset.
    pub last_offset_delta: i32,
    /// Largest record timestamp of the batch (ms).
    pub max_timestamp: i64,
    /// Producer id, or -1 for a producer without idempotence.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Sequence number of the first record.
    pub base_sequence: i32,
    /// Number of records.
    pub record_count: i32,
}

/// Why bytes are not one valid batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than the header or the batch length says.
    Truncated {
        /// Bytes the batch needs.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// The batch length is below the header's size or above [`MAX_BATCH_LEN`].
    BadLength(i32),
    /// Not record batch format 2.
    BadMagic(i8),
    /// The stored CRC-32C does not match the bytes.
    BadCrc {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes.
        actual: u32,
    },
    /// Record count below 1, or not last offset delta + 1.
    BadCount {
        /// The record count field.
        count: i32,
        /// The last offset delta field.
        last_offset_delta: i32,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Truncated { needed, available } => {
                write!(
                    f,
                    "truncated batch: needs {needed} bytes, {available} there"
                )
            }
            BatchError::BadLength(n) => write!(f, "batch length {n} out of range"),
            BatchError::BadMagic(m) => write!(f, "magic {m}, only record batch v2 is supported"),
            BatchError::BadCrc { stored, actual } => {
                write!(
                    f,
                    "CRC-32C mismatch: stored {stored:#010x}, computed {actual:#010x}"
                )
            }
            BatchError::BadCount {
                count,
                last_offset_delta,
            } => write!(
                f,
                "record count {count} does not fit last offset delta {last_offset_delta}"
            ),
        }
    }
}

impl std::error::Error for BatchError {}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

/// The total size the batch at the start of `bytes` claims (12 + batch
/// length), once its first 12 bytes are there.
pub fn claimed_size(bytes: &[u8]) -> Result<usize, BatchError> {
    if bytes.len() < LOG_OVERHEAD {
        return Err(BatchError::Truncated {
            needed: LOG_OVERHEAD,
            available: bytes.len(),
        });
    }
    let len = i32::from_be_bytes(be(bytes, 8));
    if len < (HEADER_LEN - LOG_OVERHEAD) as i32 || len as usize > MAX_BATCH_LEN {
        return Err(BatchError::BadLength(len));
    }
    Ok(LOG_OVERHEAD + len as usize)
}

/// Reads and verifies the batch at the start of `bytes` (which may hold
/// more after it): length, magic, CRC-32C and record count.
pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let size = claimed_size(bytes)?;
    if bytes.len() < size {
        return Err(BatchError::Truncated {
            needed: size,
            available: bytes.len(),
        });
    }
    let magic = i8::from_be_bytes(be(bytes, 16));
    if magic != 2 {
        return Err(BatchError::BadMagic(magic));
    }
    let stored = u32::from_be_bytes(be(bytes, CRC_AT));
    let actual = crc32c::crc32c(bytes.get(ATTRIBUTES_AT..size).unwrap_or_default());
    if stored != actual {
        return Err(BatchError::BadCrc { stored, actual });
    }
    let h = BatchHeader {
        base_offset: i64::from_be_bytes(be(bytes, 0)),
        size,
        attributes: i16::from_be_bytes(be(bytes, 21)),
        last_offset_delta: i32::from_be_bytes(be(bytes, 23)),
        max_timestamp: i64::from_be_bytes(be(bytes, 35)),
        producer_id: i64::from_be_bytes(be(bytes, 43)),
        producer_epoch: i16::from_be_bytes(be(bytes, 51)),
        base_sequence: i32::from_be_bytes(be(bytes, 53)),
        record_count: i32::from_be_bytes(be(bytes, 57)),
    };
    if h.record_count < 1 || h.last_offset_delta.checked_add(1) != Some(h.record_count) {
        return Err(BatchError::BadCount {
            count: h.record_count,
            last_offset_delta: h.last_offset_delta,
        });
    }
    Ok(h)
}

/// Writes `offset` into the base offset field (the CRC does not cover it).
pub fn set_base_offset(bytes: &mut [u8], offset: i64) {
    if let Some(field) = bytes.get_mut(0..8) {
        field.copy_from_slice(&offset.to_be_bytes());
    }
}

impl BatchHeader {
    /// Offset of the last record once the batch is at `base`.
    pub fn last_offset(&self, base: i64) -> i64 {
        base + i64::from(self.last_offset_delta)
    }

    /// True if the producer is idempotent (has a producer id).
    pub fn is_idempotent(&self) -> bool {
        self.producer_id >= 0
    }

    /// True for a transactional batch (attribute bit 4).
    pub fn is_transactional(&self) -> bool {
        self.attributes & (1 << 4) != 0
    }

    /// True for a control batch (attribute bit 5: transaction markers).
    pub fn is_control(&self) -> bool {
        self.attributes & (1 << 5) != 0
    }

    /// The sequence of the batch's last record: base + count - 1, wrapping
    /// after `i32::MAX` to 0 as Kafka's sequences do
    /// (`DefaultRecordBatch.incrementSequence`).
    pub fn last_sequence(&self) -> i32 {
        let last = i64::from(self.base_sequence) + i64::from(self.record_count) - 1;
        (last % (i64::from(i32::MAX) + 1)) as i32
    }
}

/// What an end-transaction control record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlMarker {
    /// COMMIT (`true`) or ABORT.
    pub commit: bool,
    /// The coordinator epoch that wrote it.
    pub coordinator_epoch: i32,
}

/// A control batch holding one COMMIT or ABORT marker of
/// `producer_id`/`epoch`, as Kafka's coordinator has the partition leader
/// write it: transactional and control attributes, no sequence, one
/// record whose key is (version 0, type: 0 abort, 1 commit) and whose value
/// is (version 0, coordinator epoch), encoded by the protocol crate.
pub fn control_batch(
    producer_id: i64,
    epoch: i16,
    marker: ControlMarker,
    timestamp: i64,
) -> Vec<u8> {
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&i16::from(marker.commit).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let record = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp,
        key: Some(bytes::Bytes::from(key)),
        value: Some(bytes::Bytes::from(value)),
        headers: Default::default(),
    };
    let mut buf = bytes::BytesMut::new();
    // Encoding one uncompressed record into memory cannot fail.
    let _ = RecordBatchEncoder::encode(
        &mut buf,
        [&record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    );
    buf.to_vec()
}

/// The marker a control batch holds, read with the protocol crate's
/// decoder; `None` for a batch that holds no end-transaction marker.
pub fn control_marker(batch: &[u8]) -> Option<ControlMarker> {
    let mut b = bytes::Bytes::copy_from_slice(batch);
    let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut b).ok()?;
    let record = set.records.first()?;
    let key = record.key.as_ref()?;
    let value = record.value.as_ref()?;
    let kind = i16::from_be_bytes([*key.get(2)?, *key.get(3)?]);
    let epoch = i32::from_be_bytes([
        *value.get(2)?,
        *value.get(3)?,
        *value.get(4)?,
        *value.get(5)?,
    ]);
    match kind {
        0 | 1 => Some(ControlMarker {
            commit: kind == 1,
            coordinator_epoch: epoch,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A syntactically valid batch with `count` empty records' worth of
    /// payload (the broker does not look at records).
    pub(crate) fn batch(pid: i64, epoch: i16, seq: i32, count: i32) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b.extend_from_slice(&[7u8; 10]);
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[35..43].copy_from_slice(&1234i64.to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[51..53].copy_from_slice(&epoch.to_be_bytes());
        b[53..57].copy_from_slice(&seq.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn parses_the_header_and_rewriting_the_offset_keeps_it_valid() {
        let mut b = batch(42, 3, 100, 5);
        let h = parse(&b).unwrap();
        assert_eq!(
            (
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.record_count
            ),
            (42, 3, 100, 5)
        );
        assert_eq!(
            (h.last_sequence(), h.max_timestamp, h.size),
            (104, 1234, b.len())
        );
        set_base_offset(&mut b, 777);
        assert_eq!(parse(&b).unwrap().base_offset, 777);
    }

    #[test]
    fn a_control_batch_parses_and_reads_back_its_marker() {
        for commit in [true, false] {
            let m = ControlMarker {
                commit,
                coordinator_epoch: 7,
            };
            let b = control_batch(42, 3, m, 1_700_000_000_000);
            let h = parse(&b).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.record_count),
                (42, 3, 1)
            );
            assert_eq!(control_marker(&b), Some(m));
        }
        assert_eq!(control_marker(&batch(1, 0, 0, 1)), None);
    }

    #[test]
    fn the_last_sequence_wraps_to_zero_as_kafkas_does() {
        let b = batch(1, 0, i32::MAX - 1, 4);
        assert_eq!(parse(&b).unwrap().last_sequence(), 1);
    }

    #[test]
    fn rejects_damage_without_panicking() {
        let good = batch(1, 0, 0, 1);
        let mut flipped = good.clone();
        flipped[40] ^= 1;
        assert!(matches!(parse(&flipped), Err(BatchError::BadCrc { .. })));
        assert!(matches!(
            parse(&good[..good.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
        let mut magic = good.clone();
        magic[16] = 1;
        assert_eq!(parse(&magic), Err(BatchError::BadMagic(1)));
        let mut len = good.clone();
        len[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(parse(&len), Err(BatchError::BadLength(-5)));
        for n in 0..good.len() {
            let _ = parse(&good[..n]);
        }
        let bad_count = batch(1, 0, 0, 0);
        assert!(matches!(
            parse(&bad_count),
            Err(BatchError::BadCount { .. })
        ));
    }
}
