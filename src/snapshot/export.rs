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

use super::entry as entry_codec;
use crate::codec::{Dec, Put};
use crate::engine::ProducerStateManager;
use crate::engine::info::ProducerInfo;
use crate::engine::kafka::side::{FullEntry, KafkaProducerState};
use crate::engine::kafka::state::KafkaState;
use crate::engine::kafka::txn::AbortedTxn;
use crate::error::{Corruption, Error, Result};
use crate::id::ProducerId;
use crate::semantics::Semantics;

const MAGIC: &[u8; 8] = b"PSTATEXP";
/// A strict store's export.
const VERSION: u16 = 1;
/// A Kafka-mode store's export: a Kafka section before the entries.
const VERSION_KAFKA: u16 = 2;
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
    /// Sorted by producer id; every entry of `partition` (of a Kafka
    /// export: the keys of the compact map).
    entries: Vec<ProducerInfo>,
    /// A Kafka export's side table and aborted list; `None` for a seed
    /// export.
    kafka: Option<KafkaPart>,
}

/// What a Kafka-mode partition holds beyond its compact keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KafkaPart {
    /// The side-table keys, sorted by id.
    pub(crate) side: Vec<(ProducerId, FullEntry)>,
    /// The aborted transactions, oldest marker first.
    pub(crate) aborted: Vec<AbortedTxn>,
}

impl KafkaPart {
    /// The part as a Kafka state of its own (for its section's bytes).
    fn state(&self, partition: i32) -> KafkaState {
        let mut k = KafkaState::default();
        for (id, e) in &self.side {
            k.insert_side(id.clone(), partition, e.clone());
        }
        if !self.aborted.is_empty() {
            k.txns_mut().set_aborted(partition, self.aborted.clone());
        }
        k
    }
}

impl PartitionExport {
    /// The export of `partition` holding `entries` (each of that
    /// partition, each key once), sorted by producer id.
    pub(crate) fn new(partition: i32, mut entries: Vec<ProducerInfo>) -> PartitionExport {
        entries.sort_by(|a, b| a.producer_id.cmp(&b.producer_id));
        PartitionExport {
            partition,
            entries,
            kafka: None,
        }
    }

    /// The export of a Kafka-mode partition: its compact keys (`entries`)
    /// and `kafka`, the side-table keys and the aborted list.
    pub(crate) fn new_kafka(
        partition: i32,
        entries: Vec<ProducerInfo>,
        mut kafka: KafkaPart,
    ) -> PartitionExport {
        kafka.side.sort_by(|a, b| a.0.cmp(&b.0));
        PartitionExport {
            kafka: Some(kafka),
            ..PartitionExport::new(partition, entries)
        }
    }

    /// The semantics of the store (or engine) it was taken from: only a
    /// store of the same semantics imports it.
    pub fn semantics(&self) -> Semantics {
        if self.kafka.is_some() {
            Semantics::Kafka
        } else {
            Semantics::Strict
        }
    }

    /// A Kafka export's side table and aborted list.
    pub(crate) fn kafka_part(&self) -> Option<&KafkaPart> {
        self.kafka.as_ref()
    }

    /// The partition's aborted transactions, oldest marker first (a Kafka
    /// export's; empty for a strict export).
    pub fn aborted_transactions(&self) -> &[AbortedTxn] {
        self.kafka.as_ref().map_or(&[], |k| &k.aborted)
    }

    /// Every producer of the export as Kafka holds it, sorted by producer
    /// id: of a Kafka export its coordinator epoch and open transaction
    /// too; of a strict export each key's window as Kafka would read it.
    pub fn kafka_producers(&self) -> Vec<(ProducerId, KafkaProducerState)> {
        let mut out: Vec<(ProducerId, KafkaProducerState)> = self
            .entries
            .iter()
            .map(|i| {
                (
                    i.producer_id.clone(),
                    FullEntry::from_regular(&i.entry).view(),
                )
            })
            .collect();
        if let Some(k) = &self.kafka {
            out.extend(k.side.iter().map(|(id, e)| (id.clone(), e.view())));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Number of producers (keys).
    pub fn len(&self) -> usize {
        self.entries.len() + self.kafka.as_ref().map_or(0, |k| k.side.len())
    }

    /// True when the partition had no producer state (for a Kafka export:
    /// no producer and no aborted transaction).
    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.aborted_transactions().is_empty()
    }

    /// The keys and their states in the crate's entry form, sorted by
    /// producer id: every key of a strict export; of a Kafka export, the
    /// producers whose state is such an entry (no transaction, no marker,
    /// a window of consecutive batches), the others being only in
    /// [`PartitionExport::kafka_producers`].
    pub fn iter(&self) -> impl Iterator<Item = &ProducerInfo> {
        self.entries.iter()
    }

    /// The highest batch offset the state holds (of every retained batch
    /// of every key, not only each key's newest: offsets in a window need
    /// not grow), -1 for none: the offset at or below which
    /// [`truncate_to`](crate::ProducerStateStore::truncate_to) undoes the
    /// import, so a truncation never keeps a batch at or above its offset.
    ///
    /// Of a Kafka export, the side-table keys' batches count too, and so do
    /// the offsets of its open transactions and aborted transactions (the
    /// last one is the ABORT marker's).
    pub fn high_offset(&self) -> i64 {
        let compact = self
            .entries
            .iter()
            .flat_map(|i| i.retained_batches().filter_map(|b| b.metadata))
            .map(|m| m.offset);
        let kafka = self.kafka.iter().flat_map(|k| {
            let side = k.side.iter().flat_map(|(_, e)| {
                e.batches
                    .iter()
                    .filter_map(|b| b.metadata.map(|m| m.offset))
                    .chain(e.txn_first_offset)
            });
            side.chain(k.aborted.iter().map(|t| t.last_offset.max(t.first_offset)))
        });
        compact.chain(kafka).max().unwrap_or(-1)
    }

    /// The bytes of the export (docs/format.md, "Partition exports").
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.put_u16(if self.kafka.is_some() {
            VERSION_KAFKA
        } else {
            VERSION
        });
        b.put_u16(0);
        b.put_i32(self.partition);
        b.put_u64(self.entries.len() as u64);
        if let Some(k) = &self.kafka {
            crate::snapshot::kafka::encode(&mut b, &k.state(self.partition));
        }
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
        let (version, flags) = d.magic_version_flags(MAGIC).map_err(|k| bad(0, k))?;
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
        if version != VERSION && version != VERSION_KAFKA {
            return Err(Error::UnsupportedVersion {
                file: file(),
                found: version,
                supported: VERSION_KAFKA,
            });
        }
        if flags != 0 {
            return Err(bad(10, Corruption::BadField("export flags")));
        }
        let mut seen: HashSet<ProducerId> = HashSet::new();
        let mut at = HEADER_LEN;
        let kafka = if version == VERSION_KAFKA {
            let (part, len) = decode_kafka(body, partition).map_err(|(o, k)| bad(o, k))?;
            seen.extend(part.side.iter().map(|(id, _)| id.clone()));
            at += len;
            Some(part)
        } else {
            None
        };
        let entries = entry_codec::decode_infos(body.get(at..).unwrap_or_default(), |e| {
            if e.partition != partition {
                Err(Corruption::BadField("entry of another partition"))
            } else if !seen.insert(e.producer_id.clone()) {
                Err(Corruption::DuplicateKey)
            } else {
                Ok(())
            }
        })
        .map_err(|(o, kind)| bad(at + o, kind))?;
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
        Ok(match kafka {
            Some(k) => PartitionExport::new_kafka(partition, entries, k),
            None => PartitionExport::new(partition, entries),
        })
    }
}

/// Reads the Kafka section of a version-2 export's `body` (after the
/// header): the part and how many bytes it took, or the offset in `body`
/// and the damage.
fn decode_kafka(
    body: &[u8],
    partition: i32,
) -> std::result::Result<(KafkaPart, usize), (usize, Corruption)> {
    let len = body
        .get(HEADER_LEN..)
        .and_then(|b| Dec::new(b).u64())
        .ok_or((HEADER_LEN, Corruption::BadField("Kafka section length")))?;
    let start = HEADER_LEN + 8;
    let section = usize::try_from(len)
        .ok()
        .and_then(|l| body.get(start..start.checked_add(l)?))
        .ok_or((HEADER_LEN, Corruption::BadField("Kafka section length")))?;
    let state =
        crate::snapshot::kafka::decode_state(section).map_err(|(at, kind)| (start + at, kind))?;
    if !state.only_partition(partition) {
        return Err((
            start,
            Corruption::BadField("Kafka state of another partition"),
        ));
    }
    let (side, aborted) = state.partition_side(partition);
    Ok((KafkaPart { side, aborted }, 8 + section.len()))
}

/// Moving a partition between engines: [`ProducerStateManager`]'s side of
/// [`PartitionExport`]. Here, beside the export's bytes, so that the engine
/// knows no format.
impl ProducerStateManager {
    /// The producer state of `partition` (each key with its whole retry
    /// window), for a partition that moves to another engine or store
    /// ([`ProducerStateManager::import_partition`],
    /// [`ProducerStateStore::import_partition`](crate::ProducerStateStore::import_partition),
    /// [`PartitionExport::to_bytes`](crate::PartitionExport::to_bytes) for
    /// the wire). The engine keeps no clock: each key's last activity is
    /// its newest batch's timestamp, 0 for a key without one (as in
    /// [`ProducerStateManager::encode_snapshot`]).
    ///
    /// Under [`Semantics::Kafka`] the export also holds the producers the
    /// side table keeps (coordinator epochs, open transactions) and the
    /// partition's aborted transactions (a version-2 export).
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for an engine that cannot
    /// export.
    pub fn export_partition(&self, partition: i32) -> Result<PartitionExport> {
        let entries = self
            .compact_entries()
            .filter(|(_, p, _, _)| *p == partition)
            .map(
                |(producer_id, partition, entry, last_activity)| ProducerInfo {
                    producer_id,
                    partition,
                    entry,
                    last_activity,
                },
            )
            .collect();
        Ok(match self.kafka_side() {
            None => PartitionExport::new(partition, entries),
            Some(k) => {
                let (side, aborted) = k.partition_side(partition);
                PartitionExport::new_kafka(partition, entries, KafkaPart { side, aborted })
            }
        })
    }

    /// Refuses an import the engine cannot take: an export of the other
    /// semantics; under the strict rules a key the engine holds; under
    /// [`Semantics::Kafka`] any state of the partition (a key, or aborted
    /// transactions: the partition's aborted list and last stable offset
    /// come from one log, and two cannot be merged).
    pub(crate) fn check_import(&self, export: &PartitionExport) -> Result<()> {
        let partition = export.partition();
        if export.semantics() != self.semantics() {
            return Err(Error::ImportSemanticsMismatch {
                partition,
                exported: export.semantics(),
                store: self.semantics(),
            });
        }
        if self.kafka_side().is_some() {
            if let Some(id) = self.kafka_keys_of(partition).into_iter().min() {
                return Err(Error::ImportConflict {
                    producer_id: id,
                    partition,
                });
            }
            if !self.aborted_transactions(partition).is_empty() {
                return Err(Error::ImportPartitionNotEmpty { partition });
            }
            return Ok(());
        }
        if let Some(i) = export
            .iter()
            .find(|i| self.get(i.producer_id.clone(), i.partition).is_some())
        {
            return Err(Error::ImportConflict {
                producer_id: i.producer_id.clone(),
                partition: i.partition,
            });
        }
        Ok(())
    }

    /// Adds the keys of `export` (a partition moved here) and returns how
    /// many: a producer retrying against its new home gets `DUPLICATE`
    /// with the original offset, as it would have from the old one. Last
    /// activities are not kept (the engine has none; see
    /// [`ProducerStateManager::expire_producers`]).
    ///
    /// ```
    /// use producer_state::{Batch, BatchOutcome, ProducerStateManager};
    ///
    /// let (mut old, mut new) = (ProducerStateManager::new(), ProducerStateManager::new());
    /// let batch = Batch::new(0, 9, 1000, 1_700_000_000_000);
    /// old.append_batch(42u64, 3, 0, batch);
    /// assert_eq!(new.import_partition(&old.export_partition(3)?)?, 1);
    /// assert_eq!(
    ///     new.append_batch(42u64, 3, 0, batch),
    ///     BatchOutcome::Duplicate { original: Some(batch.metadata()) }
    /// );
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Nothing is imported on an error.
    /// [`Error::ImportSemanticsMismatch`] for an export taken under the
    /// other semantics; [`Error::ImportConflict`] if a key of the export
    /// already has state here (under [`Semantics::Kafka`]: if any key of
    /// the partition has; remove the partition first if the import is meant
    /// to replace it); [`Error::ImportPartitionNotEmpty`] under
    /// [`Semantics::Kafka`] if aborted transactions of the partition are
    /// listed here.
    pub fn import_partition(&mut self, export: &PartitionExport) -> Result<usize> {
        self.check_import(export)?;
        if let (Some(k), Some(part)) = (self.kafka_side_mut(), export.kafka_part()) {
            let p = export.partition();
            for (id, e) in &part.side {
                // The partition has no key here (checked above).
                k.insert_side(id.clone(), p, e.clone());
            }
            if !part.aborted.is_empty() {
                k.txns_mut().set_aborted(p, part.aborted.clone());
            }
        }
        for i in export.iter() {
            // Each key once (the export's reader refuses repeats), and
            // none here (checked above): every insert is new.
            self.insert_compact_new(&i.producer_id, i.partition, &i.entry);
        }
        Ok(export.len())
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::BatchMetadata;
    use crate::engine::entry::ProducerEntry;

    /// `b` (the bytes of `e`) reads back as `e`; every cut of it and every
    /// flipped bit is refused as corruption.
    fn round_trips_and_refuses_every_damage(e: &PartitionExport, b: &[u8]) {
        assert_eq!(&PartitionExport::from_bytes(b).unwrap(), e);
        for cut in 0..b.len() {
            assert!(PartitionExport::from_bytes(&b[..cut]).is_err(), "cut {cut}");
        }
        for bit in 0..b.len() * 8 {
            let mut x = b.to_vec();
            x[bit / 8] ^= 1 << (bit % 8);
            let err = PartitionExport::from_bytes(&x).unwrap_err();
            assert!(err.is_corruption(), "bit {bit}: {err}");
        }
    }

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
        round_trips_and_refuses_every_damage(&e, &b);
        // A strict export is version 1, as before Kafka mode.
        assert_eq!(&b[8..10], &[1, 0]);
        assert_eq!(e.semantics(), Semantics::Strict);
        let empty = PartitionExport::new(1, Vec::new());
        assert!(empty.is_empty() && empty.high_offset() == -1);
        assert_eq!(
            PartitionExport::from_bytes(&empty.to_bytes()).unwrap(),
            empty
        );
    }

    fn kafka_sample() -> PartitionExport {
        let plain = sample().entries;
        let open = FullEntry {
            epoch: 3,
            last_sequence: 9,
            last_timestamp: 77,
            coordinator_epoch: 5,
            txn_first_offset: Some(120),
            batches: [RetainedBatch {
                first_sequence: 8,
                last_sequence: 9,
                metadata: Some(BatchMetadata {
                    offset: 120,
                    timestamp: 70,
                }),
            }]
            .into(),
        };
        let aborted = vec![AbortedTxn {
            producer_id: ProducerId::from(4u64),
            first_offset: 90,
            last_offset: 130,
            last_stable_offset: 90,
        }];
        let side = vec![(ProducerId::from(8u64), open)];
        PartitionExport::new_kafka(9, plain, KafkaPart { side, aborted })
    }

    use crate::batch::RetainedBatch;

    #[test]
    fn a_kafka_export_round_trips_and_every_damage_is_refused() {
        let e = kafka_sample();
        assert_eq!(e.semantics(), Semantics::Kafka);
        assert_eq!(e.len(), 3);
        // The aborted marker (130) is above every batch.
        assert_eq!(e.high_offset(), 130);
        let ids: Vec<ProducerId> = e.kafka_producers().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [3u64.into(), 8u64.into(), "named".into()]);
        let b = e.to_bytes();
        // Version 2; the Kafka section (its length, then the body the
        // snapshot's section has) right after the header; the entries
        // after it; the CRC last.
        assert_eq!(&b[8..10], &[2, 0]);
        let len = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
        let mut section = Vec::new();
        crate::snapshot::kafka::encode(&mut section, &e.kafka.as_ref().unwrap().state(9));
        assert_eq!(&b[24..32 + len], &section[..]);
        assert_eq!(
            u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()),
            crc32c::crc32c(&b[..b.len() - 4])
        );
        round_trips_and_refuses_every_damage(&e, &b);
        // A key both in the side table and among the entries is damage,
        // even with a good CRC.
        let mut twice = kafka_sample();
        twice.kafka.as_mut().unwrap().side[0].0 = ProducerId::from(3u64);
        let mut x = twice.to_bytes();
        x.truncate(x.len() - 4);
        let crc = crc32c::crc32c(&x);
        x.extend_from_slice(&crc.to_le_bytes());
        let err = PartitionExport::from_bytes(&x).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Corrupt {
                    kind: Corruption::DuplicateKey,
                    ..
                }
            ),
            "{err}"
        );
        // An empty Kafka partition with only an aborted list is not empty.
        let only_aborted = PartitionExport::new_kafka(
            9,
            Vec::new(),
            KafkaPart {
                side: Vec::new(),
                aborted: e.aborted_transactions().to_vec(),
            },
        );
        assert!(!only_aborted.is_empty(), "an aborted list is state");
        assert_eq!(only_aborted.len(), 0, "no producer");
        assert_eq!(
            PartitionExport::from_bytes(&only_aborted.to_bytes()).unwrap(),
            only_aborted
        );
    }

    #[test]
    fn a_later_version_is_refused_as_unsupported() {
        let mut b = kafka_sample().to_bytes();
        b[8] = 3;
        b.truncate(b.len() - 4);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            PartitionExport::from_bytes(&b),
            Err(Error::UnsupportedVersion { found: 3, .. })
        ));
    }
}
