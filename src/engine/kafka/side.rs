//! The side table: a literal copy of Kafka's `ProducerStateEntry` for
//! each key the compact map cannot hold (a transaction, a marker, a window
//! of batches that are not consecutive, a negative sequence), looked up on
//! the compact map's own hash. `state.rs` decides which keys live here.

use std::collections::VecDeque;

use hashbrown::HashTable;

use crate::batch::{AppendOptions, BatchMetadata, RetainedBatch};
use crate::engine::entry::{Head, ProducerEntry, RETAINED_BATCHES, Window};
use crate::engine::kafka::entry::KafkaProducerEntry;
use crate::engine::kafka::rules::{KafkaCurrent, first_sequence_of, sequence_span};
use crate::engine::kafka::txn::Marker;
use crate::engine::map::{Ask, hash_key};
use crate::id::ProducerId;

/// One key's state as Kafka's broker holds it.
///
/// ```
/// use producer_state::{AppendOptions, Batch, Marker, Origin, ProducerStateManager, Semantics};
///
/// let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
/// let txn = AppendOptions::client().transactional().verified();
/// mgr.append_with(7u64, 0, 3, Batch::new(0, 2, 10, 1_000), txn)?;
/// let state = mgr.kafka_state(7u64, 0).unwrap();
/// assert_eq!(state.current_txn_first_offset, Some(10));
/// mgr.append_marker(7u64, 0, 3, Marker::commit(5, 13, 1_500), Origin::Coordinator)?;
/// let state = mgr.kafka_state(7u64, 0).unwrap();
/// assert_eq!((state.coordinator_epoch, state.current_txn_first_offset), (5, None));
/// assert_eq!(state.last_timestamp, 1_500); // the marker's
/// # Ok::<(), producer_state::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaProducerState {
    /// The producer epoch (-1: none known).
    pub epoch: i16,
    /// The last sequence of the newest cached batch (-1: none).
    pub last_sequence: i32,
    /// The timestamp of the last batch or marker (-1: none).
    pub last_timestamp: i64,
    /// The coordinator epoch of the last marker (-1: none).
    pub coordinator_epoch: i32,
    /// The first offset of the open transaction on this partition.
    pub current_txn_first_offset: Option<i64>,
    /// The cached batches, oldest first (at most
    /// [`RETAINED_BATCHES`](crate::RETAINED_BATCHES)); the last offset of
    /// each is its offset plus its sequence span.
    pub batches: Vec<RetainedBatch>,
}

/// A key in the side table: Kafka's `ProducerStateEntry`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FullEntry {
    pub(crate) epoch: i16,
    /// The newest batch's last sequence; -1 when there is none. (A key that
    /// came from the map with only single-sequence appends keeps its last
    /// sequence without a batch.)
    pub(crate) last_sequence: i32,
    pub(crate) last_timestamp: i64,
    pub(crate) coordinator_epoch: i32,
    pub(crate) txn_first_offset: Option<i64>,
    pub(crate) batches: VecDeque<RetainedBatch>,
}

impl FullEntry {
    pub(super) const EMPTY: FullEntry = FullEntry {
        epoch: -1,
        last_sequence: -1,
        last_timestamp: -1,
        coordinator_epoch: -1,
        txn_first_offset: None,
        batches: VecDeque::new(),
    };

    pub(crate) fn from_regular(e: &ProducerEntry) -> FullEntry {
        let batches: VecDeque<RetainedBatch> = e.retained_batches().collect();
        FullEntry {
            epoch: e.epoch(),
            last_sequence: e.last_sequence(),
            last_timestamp: e.last_batch_timestamp().unwrap_or(-1),
            coordinator_epoch: -1,
            txn_first_offset: None,
            batches,
        }
    }

    pub(super) fn current(&self) -> KafkaCurrent {
        KafkaCurrent {
            epoch: self.epoch,
            last_sequence: self.last_sequence,
            coordinator_epoch: self.coordinator_epoch,
            txn_open: self.txn_first_offset.is_some(),
        }
    }

    /// Kafka's `findDuplicateBatch` (the epoch is compared by the caller):
    /// the oldest cached batch with exactly these sequences.
    pub(super) fn find(&self, first: i32, last: i32) -> Option<Option<BatchMetadata>> {
        self.batches
            .iter()
            .find(|b| b.first_sequence == first && b.last_sequence == last)
            .map(|b| b.metadata)
    }

    /// Kafka's `maybeUpdateProducerEpoch`: any change drops the batches.
    pub(super) fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.epoch {
            self.batches.clear();
            self.last_sequence = -1;
            self.epoch = epoch;
        }
    }

    /// Caches an accepted batch; a transactional one with no transaction
    /// open opens one at its offset, which is returned.
    pub(super) fn add_batch(&mut self, ask: Ask, options: AppendOptions) -> Option<i64> {
        let Ask {
            epoch,
            first,
            last,
            meta,
        } = ask;
        self.set_epoch(epoch);
        if self.batches.len() == RETAINED_BATCHES {
            self.batches.pop_front();
        }
        self.batches.push_back(RetainedBatch {
            first_sequence: first,
            last_sequence: last,
            metadata: meta,
        });
        self.last_sequence = last;
        if let Some(m) = meta {
            self.last_timestamp = m.timestamp;
        }
        // Transactional appends always carry an offset (`append_with`
        // takes a `Batch`).
        let opened = meta
            .filter(|_| options.is_transactional() && self.txn_first_offset.is_none())
            .map(|m| m.offset);
        if opened.is_some() {
            self.txn_first_offset = opened;
        }
        opened
    }

    pub(super) fn apply_marker(&mut self, epoch: i16, marker: &Marker) {
        self.set_epoch(epoch);
        self.coordinator_epoch = marker.coordinator_epoch;
        self.txn_first_offset = None;
        self.last_timestamp = marker.timestamp;
    }

    pub(crate) fn view(&self) -> KafkaProducerState {
        KafkaProducerState {
            epoch: self.epoch,
            last_sequence: self.last_sequence,
            last_timestamp: self.last_timestamp,
            coordinator_epoch: self.coordinator_epoch,
            current_txn_first_offset: self.txn_first_offset,
            batches: self.batches.iter().copied().collect(),
        }
    }

    /// The nearest [`ProducerEntry`]: epoch and last sequence, and the
    /// newest run of cached batches the compact window can hold.
    pub(super) fn approximate(&self) -> ProducerEntry {
        let all: Vec<RetainedBatch> = self.batches.iter().copied().collect();
        (0..all.len())
            .find_map(|skip| {
                ProducerEntry::from_parts(self.epoch, self.last_sequence, all.get(skip..)?)
            })
            .unwrap_or(ProducerEntry {
                head: Head::new(self.epoch, self.last_sequence),
                window: Window::EMPTY,
            })
    }

    /// Kafka's snapshot entry (only the newest batch is kept).
    pub(super) fn to_kafka(&self, producer_id: i64) -> KafkaProducerEntry {
        let newest = self.batches.back().and_then(|b| {
            b.metadata
                .map(|m| (sequence_span(b.first_sequence, b.last_sequence), m))
        });
        let (last_offset, offset_delta) = match newest {
            Some((span, m)) => (m.offset.wrapping_add(span), span as i32),
            None => (-1, 0),
        };
        KafkaProducerEntry {
            producer_id,
            epoch: self.epoch,
            last_sequence: if newest.is_some() {
                self.last_sequence
            } else {
                -1
            },
            last_offset,
            offset_delta,
            timestamp: self.last_timestamp,
            coordinator_epoch: self.coordinator_epoch,
            current_txn_first_offset: self.txn_first_offset.unwrap_or(-1),
        }
    }

    /// An entry as Kafka's `readSnapshot` makes it: the batch only when the
    /// last offset is not negative, its timestamp the entry's.
    pub(super) fn from_kafka(e: &KafkaProducerEntry) -> FullEntry {
        let mut batches = VecDeque::new();
        if e.last_offset >= 0 {
            batches.push_back(RetainedBatch {
                first_sequence: first_sequence_of(e.last_sequence, e.offset_delta),
                last_sequence: e.last_sequence,
                metadata: Some(BatchMetadata {
                    offset: e.last_offset.wrapping_sub(i64::from(e.offset_delta)),
                    timestamp: e.timestamp,
                }),
            });
        }
        FullEntry {
            epoch: e.epoch,
            last_sequence: if e.last_offset >= 0 {
                e.last_sequence
            } else {
                -1
            },
            last_timestamp: e.timestamp,
            coordinator_epoch: e.coordinator_epoch,
            txn_first_offset: (e.current_txn_first_offset >= 0)
                .then_some(e.current_txn_first_offset),
            batches,
        }
    }

    /// The same state as a compact-map entry, when it fits one: no
    /// transaction, no marker, one ordinary batch (or none and a sequence).
    pub(super) fn as_regular(&self) -> Option<ProducerEntry> {
        if self.coordinator_epoch != -1 || self.txn_first_offset.is_some() || self.last_sequence < 0
        {
            return None;
        }
        let batches: Vec<RetainedBatch> = self.batches.iter().copied().collect();
        if batches
            .first()
            .and_then(|b| b.metadata)
            .map(|m| m.timestamp)
            != Some(self.last_timestamp)
        {
            return None;
        }
        ProducerEntry::from_parts(self.epoch, self.last_sequence, &batches)
    }
}

/// One side-table key and its entry.
#[derive(Clone, Debug)]
pub(super) struct SideKey {
    pub(super) id: ProducerId,
    pub(super) partition: i32,
    pub(super) entry: FullEntry,
}

/// The side table: keys on the compact map's own hash (`map::hash_key`),
/// looked up by reference. A transactional batch looks its key up here
/// once; std's `HashMap` hashed a cloned `(ProducerId, i32)` with SipHash
/// for every lookup, a fifth of a transactional batch's instructions.
/// Iteration order is the table's: every reader that writes bytes or
/// answers a caller sorts.
#[derive(Clone, Debug, Default)]
pub(super) struct SideTable(pub(super) HashTable<SideKey>);

impl SideKey {
    /// Its hash in the table (what the table rehashes by when it grows).
    pub(super) fn hash(&self) -> u64 {
        hash_key(&self.id, self.partition)
    }
}

/// A lookup's test: whether a table key is (`id`, `partition`).
pub(super) fn is_key<'a>(id: &'a ProducerId, partition: i32) -> impl Fn(&SideKey) -> bool + 'a {
    move |k| k.partition == partition && k.id == *id
}

impl SideTable {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn get(&self, id: &ProducerId, partition: i32) -> Option<&FullEntry> {
        self.0
            .find(hash_key(id, partition), is_key(id, partition))
            .map(|k| &k.entry)
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: &ProducerId, partition: i32) -> Option<&mut FullEntry> {
        self.0
            .find_mut(hash_key(id, partition), is_key(id, partition))
            .map(|k| &mut k.entry)
    }

    pub(super) fn contains(&self, id: &ProducerId, partition: i32) -> bool {
        self.get(id, partition).is_some()
    }

    /// The key's entry, made by `make` if it has none.
    pub(super) fn get_or_insert_with(
        &mut self,
        id: &ProducerId,
        partition: i32,
        make: impl FnOnce() -> FullEntry,
    ) -> &mut FullEntry {
        let entry = self.0.entry(
            hash_key(id, partition),
            is_key(id, partition),
            SideKey::hash,
        );
        &mut entry
            .or_insert_with(|| SideKey {
                id: id.clone(),
                partition,
                entry: make(),
            })
            .into_mut()
            .entry
    }

    /// Adds a key that is not in the table.
    pub(super) fn insert_new(&mut self, id: ProducerId, partition: i32, entry: FullEntry) {
        self.0.insert_unique(
            hash_key(&id, partition),
            SideKey {
                id,
                partition,
                entry,
            },
            SideKey::hash,
        );
    }

    pub(super) fn remove(&mut self, id: &ProducerId, partition: i32) -> Option<FullEntry> {
        self.0
            .find_entry(hash_key(id, partition), is_key(id, partition))
            .ok()
            .map(|e| e.remove().0.entry)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&ProducerId, i32, &FullEntry)> + '_ {
        self.0.iter().map(|k| (&k.id, k.partition, &k.entry))
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&ProducerId, i32, &FullEntry) -> bool) {
        self.0.retain(|k| keep(&k.id, k.partition, &k.entry));
    }
}
