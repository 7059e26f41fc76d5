//! One partition's producer state, moved between stores (a reassignment):
//! what [`ProducerStateStore::export_partition`] returns and
//! [`ProducerStateStore::import_partition`] takes, and its bytes for the
//! wire or a file.
//!
//! Each key keeps its whole retry window and its last activity, so a
//! producer retrying against the partition's new home gets the same
//! answers (a `DUPLICATE` with the original offset) as it would have from
//! the old one, and expiration and eviction see the same ages. The bytes
//! reuse the snapshot's entry encoding (version 3) under a small header and
//! a CRC-32C; docs/format.md has them.
//!
//! [`ProducerStateStore::export_partition`]: crate::ProducerStateStore::export_partition
//! [`ProducerStateStore::import_partition`]: crate::ProducerStateStore::import_partition

#![deny(clippy::indexing_slicing)]

use std::collections::HashSet;
use std::path::PathBuf;

use crate::codec::{Dec, Put};
use crate::entry_codec;
use crate::error::{Corruption, Error, Result};
use crate::id::ProducerId;
use crate::info::ProducerInfo;

const MAGIC: &[u8; 8] = b"PSTATEXP";
const VERSION: u16 = 1;
/// Magic, version, flags, partition, count.
const HEADER_LEN: usize = 8 + 2 + 2 + 4 + 8;

/// The producer state of one partition, taken from a store (see the
/// module docs).
///
/// ```
/// use producer_state::{Batch, BatchOutcome, ProducerStateStore};
///
/// let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
/// let old = ProducerStateStore::open(a.path())?;
/// let batch = Batch::new(0, 9, 1000, 1_700_000_000_000);
/// old.append_batch(42u64, 3, 0, batch)?;
/// let bytes = old.export_partition(3)?.to_bytes();
///
/// // The partition's new home: a retry is a duplicate there too.
/// let new = ProducerStateStore::open(b.path())?;
/// let moved = producer_state::PartitionExport::from_bytes(&bytes)?;
/// assert_eq!(new.import_partition(&moved)?, 1);
/// assert_eq!(
///     new.append_batch(42u64, 3, 0, batch)?,
///     BatchOutcome::Duplicate { original: Some(batch.metadata()) }
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionExport {
    partition: i32,
    /// Sorted by producer id; every entry of `partition`.
    entries: Vec<ProducerInfo>,
}

impl PartitionExport {
    /// The export of `partition` holding `entries` (each of that
    /// partition, each key once), sorted by producer id.
    pub(crate) fn new(partition: i32, mut entries: Vec<ProducerInfo>) -> PartitionExport {
        entries.sort_by(|a, b| a.producer_id.cmp(&b.producer_id));
        PartitionExport { partition, entries }
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Number of producers (keys).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the partition had no producer state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys and their states, sorted by producer id.
    pub fn iter(&self) -> impl Iterator<Item = &ProducerInfo> {
        self.entries.iter()
    }

    /// The highest batch offset the state holds (of every retained batch
    /// of every key, not only each key's newest: offsets in a window need
    /// not grow), -1 for none: the offset at or below which
    /// [`truncate_to`](crate::ProducerStateStore::truncate_to) undoes the
    /// import, so a truncation never keeps a batch at or above its offset.
    pub fn high_offset(&self) -> i64 {
        self.entries
            .iter()
            .flat_map(|i| i.retained_batches().filter_map(|b| b.metadata))
            .map(|m| m.offset)
            .max()
            .unwrap_or(-1)
    }

    /// The bytes of the export (docs/format.md, "Partition exports").
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.put_u16(VERSION);
        b.put_u16(0);
        b.put_i32(self.partition);
        b.put_u64(self.entries.len() as u64);
        for i in &self.entries {
            entry_codec::encode_entry(
                &mut b,
                &i.producer_id,
                i.partition,
                &i.entry,
                Some(i.last_activity),
            );
        }
        let crc = crc32c::crc32c(&b);
        b.put_u32(crc);
        b
    }

    /// Reads what [`PartitionExport::to_bytes`] wrote, verifying every
    /// byte.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] (naming "partition export" and the byte offset)
    /// for bytes that are not an export or are damaged: a bad magic or
    /// checksum, an entry that does not decode, a key twice, a key of
    /// another partition; [`Error::UnsupportedVersion`] for a later
    /// version.
    pub fn from_bytes(bytes: &[u8]) -> Result<PartitionExport> {
        let file = || PathBuf::from("partition export");
        let bad = |offset: usize, kind| Error::corrupt(file(), offset as u64, kind);
        let Some(body_end) = bytes.len().checked_sub(4) else {
            return Err(bad(0, crate::codec::truncated(HEADER_LEN + 4, bytes.len())));
        };
        if bytes.len() < HEADER_LEN + 4 {
            return Err(bad(0, crate::codec::truncated(HEADER_LEN + 4, bytes.len())));
        }
        let mut d = Dec::new(bytes);
        if d.bytes(8) != Some(&MAGIC[..]) {
            return Err(bad(0, Corruption::BadMagic));
        }
        let version = d.u16().unwrap_or(0);
        let flags = d.u16().unwrap_or(0);
        let partition = d.i32().unwrap_or(0);
        let count = d.u64().unwrap_or(0);
        let body = bytes.get(..body_end).unwrap_or_default();
        let stored = crate::codec::u32_at(bytes, body_end).unwrap_or(0);
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(bad(
                body_end,
                Corruption::ChecksumMismatch { stored, computed },
            ));
        }
        if version != VERSION {
            return Err(Error::UnsupportedVersion {
                file: file(),
                found: version,
                supported: VERSION,
            });
        }
        if flags != 0 {
            return Err(bad(10, Corruption::BadField("export flags")));
        }
        let mut seen: HashSet<ProducerId> = HashSet::new();
        let entries = entry_codec::decode_infos(body.get(HEADER_LEN..).unwrap_or_default(), |e| {
            if e.partition != partition {
                Err(Corruption::BadField("entry of another partition"))
            } else if !seen.insert(e.producer_id.clone()) {
                Err(Corruption::DuplicateKey)
            } else {
                Ok(())
            }
        })
        .map_err(|(at, kind)| bad(HEADER_LEN + at, kind))?;
        if entries.len() as u64 != count {
            let found = entries.len() as u64;
            return Err(bad(
                16,
                Corruption::CountMismatch {
                    stated: count,
                    found,
                },
            ));
        }
        Ok(PartitionExport::new(partition, entries))
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::BatchMetadata;
    use crate::entry::ProducerEntry;

    fn sample() -> PartitionExport {
        let mut windowed = ProducerEntry::start(2, 0, 4, None);
        for k in 0..7 {
            let meta = Some(BatchMetadata {
                offset: 100 + k,
                timestamp: 7 * k,
            });
            windowed.accept(false, 2, 5 + k as i32, 5 + k as i32, meta);
        }
        let info = |id: ProducerId, entry, last_activity| ProducerInfo {
            producer_id: id,
            partition: 9,
            entry,
            last_activity,
        };
        PartitionExport::new(
            9,
            vec![
                info(
                    ProducerId::from("named"),
                    ProducerEntry::start(0, 0, 0, None),
                    5,
                ),
                info(ProducerId::from(3u64), windowed, -1),
            ],
        )
    }

    #[test]
    fn an_export_round_trips_and_every_damage_is_refused() {
        let e = sample();
        assert_eq!(e.high_offset(), 106);
        assert_eq!(
            e.iter().next().map(|i| i.producer_id.clone()),
            Some(3u64.into())
        );
        let b = e.to_bytes();
        assert_eq!(PartitionExport::from_bytes(&b).unwrap(), e);
        for cut in 0..b.len() {
            assert!(PartitionExport::from_bytes(&b[..cut]).is_err(), "cut {cut}");
        }
        for bit in 0..b.len() * 8 {
            let mut x = b.clone();
            x[bit / 8] ^= 1 << (bit % 8);
            let err = PartitionExport::from_bytes(&x).unwrap_err();
            assert!(err.is_corruption(), "bit {bit}: {err}");
        }
        let empty = PartitionExport::new(1, Vec::new());
        assert!(empty.is_empty() && empty.high_offset() == -1);
        assert_eq!(
            PartitionExport::from_bytes(&empty.to_bytes()).unwrap(),
            empty
        );
    }
}
