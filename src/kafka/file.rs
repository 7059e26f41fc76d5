//! Kafka's producer snapshot file (version 1), byte for byte: its name,
//! its encoding and a verifying reader, and one entry's mapping to and
//! from this crate's entries. The layout is in the [`crate::kafka`] docs.

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::Path;

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::directory::names;
use crate::engine::entry::ProducerEntry;
use crate::error::{Corruption, Error, Result};
use crate::fs::read_full;
use crate::id::ProducerId;

use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};

/// The only snapshot version Kafka reads and writes.
pub const VERSION: i16 = 1;
/// Bytes before the first entry.
pub const HEADER_LEN: usize = 10;
/// Bytes per entry.
pub const ENTRY_LEN: usize = 46;

/// The file name of a Kafka snapshot covering offsets below `offset`.
pub fn file_name(offset: u64) -> String {
    names::kafka_snapshot_name(offset)
}

/// The offset in a Kafka snapshot's file name (`<20 digits>.snapshot`).
pub fn parse_file_name(name: &str) -> Option<u64> {
    names::parse_kafka_snapshot_name(name)
}

fn put_entry(out: &mut Vec<u8>, e: &KafkaProducerEntry) {
    out.extend_from_slice(&e.producer_id.to_be_bytes());
    out.extend_from_slice(&e.epoch.to_be_bytes());
    out.extend_from_slice(&e.last_sequence.to_be_bytes());
    out.extend_from_slice(&e.last_offset.to_be_bytes());
    out.extend_from_slice(&e.offset_delta.to_be_bytes());
    out.extend_from_slice(&e.timestamp.to_be_bytes());
    out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
    out.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
}

/// Encodes entries, in the order given, as a Kafka version 1 snapshot file.
///
/// ```
/// use producer_state::kafka;
/// // The empty snapshot: version 1, CRC-32C of four zero bytes, count 0.
/// assert_eq!(kafka::encode(&[]), [0, 1, 0x48, 0x67, 0x4b, 0xc7, 0, 0, 0, 0]);
/// ```
pub fn encode(entries: &[KafkaProducerEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * entries.len());
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for e in entries {
        put_entry(&mut out, e);
    }
    let crc = crc32c::crc32c(out.get(6..).unwrap_or_default());
    if let Some(field) = out.get_mut(2..6) {
        field.copy_from_slice(&crc.to_be_bytes());
    }
    out
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

fn parse_entry(b: &[u8]) -> KafkaProducerEntry {
    KafkaProducerEntry {
        producer_id: i64::from_be_bytes(be(b, 0)),
        epoch: i16::from_be_bytes(be(b, 8)),
        last_sequence: i32::from_be_bytes(be(b, 10)),
        last_offset: i64::from_be_bytes(be(b, 14)),
        offset_delta: i32::from_be_bytes(be(b, 22)),
        timestamp: i64::from_be_bytes(be(b, 26)),
        coordinator_epoch: i32::from_be_bytes(be(b, 34)),
        current_txn_first_offset: i64::from_be_bytes(be(b, 38)),
    }
}

/// Streams a Kafka snapshot of `file_len` bytes from `r`, handing each
/// entry to `each`, and verifies it: version 1, a count that matches the
/// file's length, no producer id twice, and the CRC-32C over bytes 6 to
/// the end, checked after the last entry (so `each` must not be trusted
/// until this returns `Ok`). Returns the number of entries.
///
/// Kafka writes a snapshot from a map keyed by producer id, so a producer
/// id that appears twice is damage, reported at the second entry. This is
/// also what bounds the work and memory spent on a file by what it really
/// holds: a count the file's length allows but its bytes do not back (a
/// sparse file, a hole of zeros) repeats one entry and stops at the second.
/// Memory: the read buffer, plus 8 bytes per distinct producer id.
///
/// ```
/// use std::path::Path;
/// use producer_state::kafka;
///
/// let path = Path::new("tests/fixtures/kafka/00000000000000000035.snapshot");
/// let file = std::fs::File::open(path)?;
/// let len = file.metadata()?.len();
/// let mut ids = Vec::new();
/// let n = kafka::read(path, std::io::BufReader::new(file), len, |e| {
///     ids.push(e.producer_id); // not to be trusted until `read` returns Ok
///     Ok(())
/// })?;
/// assert_eq!(n, 5);
/// assert!(ids.contains(&1017));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`Error::Corrupt`] with the file, byte offset and kind for damaged or
/// missing bytes; [`Error::UnsupportedVersion`] for a version other than 1;
/// [`Error::Io`] if reading fails; whatever `each` returns.
pub fn read(
    path: &Path,
    mut r: impl Read,
    file_len: u64,
    mut each: impl FnMut(KafkaProducerEntry) -> Result<()>,
) -> Result<u64> {
    let io = |e| Error::io("read", path, e);
    let mut head = [0u8; HEADER_LEN];
    let n = read_full(&mut r, &mut head).map_err(io)?;
    if n < HEADER_LEN {
        return Err(Error::corrupt(
            path,
            n as u64,
            crate::codec::truncated(HEADER_LEN, n),
        ));
    }
    let version = i16::from_be_bytes(be(&head, 0));
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found: version as u16,
            supported: VERSION as u16,
        });
    }
    let stored = u32::from_be_bytes(be(&head, 2));
    let count = i32::from_be_bytes(be(&head, 6));
    if count < 0 {
        return Err(Error::corrupt(
            path,
            6,
            Corruption::BadField("entry count (negative)"),
        ));
    }
    let expected = HEADER_LEN as u64 + ENTRY_LEN as u64 * count as u64;
    if expected > file_len {
        return Err(Error::corrupt(
            path,
            file_len,
            Corruption::Truncated {
                needed: expected,
                available: file_len,
            },
        ));
    }
    if expected < file_len {
        return Err(Error::corrupt(
            path,
            expected,
            Corruption::TrailingBytes(file_len - expected),
        ));
    }
    let mut crc = crc32c::crc32c(head.get(6..).unwrap_or_default());
    let mut buf = vec![0u8; ENTRY_LEN * 4096];
    let mut left = count as u64;
    let mut offset = HEADER_LEN as u64;
    let mut seen = std::collections::HashSet::new();
    while left > 0 {
        let n = left.min(4096) as usize;
        let chunk = buf.get_mut(..n * ENTRY_LEN).unwrap_or_default();
        let got = read_full(&mut r, chunk).map_err(io)?;
        if got < chunk.len() {
            return Err(Error::corrupt(
                path,
                offset + got as u64,
                crate::codec::truncated(chunk.len(), got),
            ));
        }
        crc = crc32c::crc32c_append(crc, chunk);
        for (i, e) in chunk.chunks_exact(ENTRY_LEN).enumerate() {
            let e = parse_entry(e);
            if !seen.insert(e.producer_id) {
                return Err(Error::corrupt(
                    path,
                    offset + (i * ENTRY_LEN) as u64,
                    Corruption::DuplicateKey,
                ));
            }
            each(e)?;
        }
        left -= n as u64;
        offset += chunk.len() as u64;
    }
    if stored != crc {
        return Err(Error::corrupt(
            path,
            2,
            Corruption::ChecksumMismatch {
                stored,
                computed: crc,
            },
        ));
    }
    Ok(count as u64)
}

/// Decodes a whole Kafka snapshot held in memory (see [`read`]).
///
/// # Errors
///
/// As [`read`]: [`Error::Corrupt`] naming the byte offset of the damage,
/// [`Error::UnsupportedVersion`] for a version other than 1.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<KafkaProducerEntry>> {
    let mut out = Vec::new();
    read(path, bytes, bytes.len() as u64, |e| {
        out.push(e);
        Ok(())
    })?;
    Ok(out)
}

/// The state of one Kafka entry in this crate's terms: a numeric producer
/// id, the epoch and last sequence, and the last batch as one retained batch
/// (first sequence derived as Kafka does: last sequence minus the offset
/// delta; offset = the batch's first offset; timestamp = the entry's). A
/// batch whose sequences would wrap past `2^31 - 1`, or that has no offset,
/// is not retained; the last sequence is. Transaction state is not modelled
/// (the coordinator epoch and an open transaction's offset are dropped):
/// this is the strict rules' view ([`seed_store`](super::seed_store));
/// [`seed_kafka_store`](super::seed_kafka_store)
/// keeps everything.
///
/// # Errors
///
/// [`Unrepresentable`] for an entry this crate cannot hold (a negative
/// producer id, an epoch or sequence out of range).
pub fn to_entry(
    e: &KafkaProducerEntry,
) -> std::result::Result<(ProducerId, ProducerEntry), Unrepresentable> {
    let Ok(producer_id) = u64::try_from(e.producer_id) else {
        return Err(Unrepresentable::NegativeProducerId);
    };
    if e.last_sequence < 0 {
        return Err(Unrepresentable::NoSequence);
    }
    let first = i64::from(e.last_sequence) - i64::from(e.offset_delta);
    let batch = (e.last_offset >= 0 && e.offset_delta >= 0 && first >= 0).then(|| RetainedBatch {
        first_sequence: first as i32,
        last_sequence: e.last_sequence,
        metadata: Some(BatchMetadata {
            offset: e.last_offset - i64::from(e.offset_delta),
            timestamp: e.timestamp,
        }),
    });
    let batches: &[RetainedBatch] = match &batch {
        Some(b) => std::slice::from_ref(b),
        None => &[],
    };
    let entry = ProducerEntry::from_parts(e.epoch, e.last_sequence, batches)
        .ok_or(Unrepresentable::NoSequence)?;
    Ok((ProducerId::numeric(producer_id), entry))
}

/// The Kafka entry for one of this crate's entries: `None` for named
/// producer ids and numeric ids above `i64::MAX`, which Kafka cannot hold.
/// The newest retained batch becomes Kafka's last batch; without one that
/// has an offset (single-sequence appends carry none), the last offset is
/// -1 and the timestamp -1, which Kafka reads as "no batch".
pub fn from_entry(id: &ProducerId, e: &ProducerEntry) -> Option<KafkaProducerEntry> {
    let producer_id = i64::try_from(id.as_numeric()?).ok()?;
    let last = e.retained_batches().last();
    let (last_offset, offset_delta, timestamp) = match last.and_then(|b| b.metadata.map(|m| (b, m)))
    {
        Some((b, m)) => {
            let delta = b.last_sequence - b.first_sequence;
            (m.offset + i64::from(delta), delta, m.timestamp)
        }
        None => (-1, 0, -1),
    };
    Some(KafkaProducerEntry {
        producer_id,
        epoch: e.epoch(),
        last_sequence: e.last_sequence(),
        last_offset,
        offset_delta,
        timestamp,
        coordinator_epoch: -1,
        current_txn_first_offset: -1,
    })
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_test_vectors_from_the_notes() {
        assert_eq!(encode(&[]), hex("0001 48674bc7 00000000"));
        let one = KafkaProducerEntry {
            producer_id: 1,
            epoch: 0,
            last_sequence: 1,
            last_offset: 1,
            offset_delta: 0,
            timestamp: 1000,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let bytes = hex(
            "0001 f9ce379c 00000001 0000000000000001 0000 00000001 0000000000000001 00000000 00000000000003e8 ffffffff ffffffffffffffff",
        );
        assert_eq!(encode(&[one]), bytes);
        assert_eq!(decode(Path::new("v"), &bytes).unwrap(), vec![one]);
        assert!(
            decode(Path::new("v"), &hex("0001 48674bc7 00000000"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error() {
        let e = KafkaProducerEntry {
            producer_id: 7,
            epoch: 2,
            last_sequence: 9,
            last_offset: 100,
            offset_delta: 3,
            timestamp: 5,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let bytes = encode(&[
            e,
            KafkaProducerEntry {
                producer_id: 8,
                ..e
            },
        ]);
        for cut in 0..bytes.len() {
            assert!(
                decode(Path::new("k"), &bytes[..cut])
                    .unwrap_err()
                    .is_corruption(),
                "cut {cut}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(Path::new("k"), &b).unwrap_err().is_corruption(),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn entries_map_to_one_retained_batch_and_back() {
        let k = KafkaProducerEntry {
            producer_id: 1017,
            epoch: 1,
            last_sequence: 4,
            last_offset: 5,
            offset_delta: 2,
            timestamp: 1_700_000_000_003,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let (id, e) = to_entry(&k).unwrap();
        assert_eq!(id, ProducerId::from(1017u64));
        let b: Vec<_> = e.retained_batches().collect();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].first_sequence, b[0].last_sequence), (2, 4));
        assert_eq!(
            b[0].metadata,
            Some(BatchMetadata {
                offset: 3,
                timestamp: 1_700_000_000_003
            })
        );
        assert_eq!(from_entry(&id, &e), Some(k));
        // Not representable, or not fully.
        assert_eq!(
            to_entry(&KafkaProducerEntry {
                producer_id: -1,
                ..k
            }),
            Err(Unrepresentable::NegativeProducerId)
        );
        assert_eq!(
            to_entry(&KafkaProducerEntry {
                last_sequence: -1,
                last_offset: -1,
                ..k
            }),
            Err(Unrepresentable::NoSequence)
        );
        let wrapped = to_entry(&KafkaProducerEntry {
            offset_delta: 20,
            ..k
        })
        .unwrap()
        .1;
        assert_eq!(
            (wrapped.last_sequence(), wrapped.retained_batches().len()),
            (4, 0)
        );
        assert_eq!(from_entry(&ProducerId::from("p1"), &e), None);
    }
}
