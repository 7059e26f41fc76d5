//! The in-memory engine: the rules and the state they keep, with no bytes
//! and no IO.
//!
//! `ProducerStateManager` is the classifier with no disk behind it: what a
//! test suite or a broker that persists state by other means links. The
//! durable [`ProducerStateStore`](crate::ProducerStateStore) runs exactly
//! the same rules over the same map, so an append classifies identically in
//! both.
//!
//! The folder, bottom up: `rules.rs` (the four rules, a pure function),
//! `entry.rs` (one key's state and retry window), `map.rs` (the compact
//! map of keys), `info.rs` (a key described with its activity),
//! `shards.rs` (the store's state: 256 maps), `filter.rs` (the store's
//! memory of removed keys); this file (the engine and the strict path) and
//! `partitions.rs` (what acts on keys as a whole: expiry, removal, moves).
//!
//! Under [`Semantics::Kafka`] the same map holds plain producers and a side
//! table (`kafka/state.rs`) the transactional ones; the strict path does not
//! look at it. `kafka/` is the Kafka-mode surface (Kafka's checks,
//! transactions, markers, the store's Kafka hooks).

pub(crate) mod entry;
pub(crate) mod filter;
pub(crate) mod hash;
pub(crate) mod info;
pub(crate) mod kafka;
pub(crate) mod map;
mod partitions;
pub(crate) mod rules;
pub(crate) mod shards;
mod slot;

use crate::batch::{AppendOptions, AppendRequest, Batch};
use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::kafka::state::KafkaState;
use crate::engine::map::{Apply, Ask, StateMap};
use crate::engine::rules::UnknownProducer;
use crate::error::{Error, Result};
use crate::id::ProducerId;
use crate::outcome::{AppendOutcome, BatchOutcome};
use crate::semantics::Semantics;

/// The idempotent-produce engine: classifies every append per
/// (producer id, partition) and keeps the state that only accepted appends
/// change.
///
/// ```
/// use producer_state::{AppendOutcome::*, ProducerStateManager};
///
/// let mut mgr = ProducerStateManager::new();
/// assert_eq!(mgr.append("p1", 0, 0, 0), Accepted);
/// assert_eq!(mgr.append("p1", 0, 0, 1), Accepted);
/// assert_eq!(mgr.append("p1", 0, 0, 1), Duplicate); // retry
/// assert_eq!(mgr.append("p1", 0, 0, 5), OutOfOrder); // gap: 2, 3, 4 missing
/// assert_eq!(mgr.append("p1", 0, 1, 0), Accepted); // new session restarts at 0
/// assert_eq!(mgr.append("p1", 0, 0, 2), FencedEpoch); // zombie
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProducerStateManager {
    map: StateMap,
    unknown: UnknownProducer,
    /// `Some` exactly under [`Semantics::Kafka`].
    kafka: Option<Box<KafkaState>>,
}

impl ProducerStateManager {
    /// An engine with no state, under the strict rules.
    pub fn new() -> Self {
        ProducerStateManager::default()
    }

    /// The same engine with rule 1 as `policy` says (default
    /// [`UnknownProducer::RequireZero`]; [`UnknownProducer::AcceptAny`] is
    /// Kafka's behaviour since KIP-360).
    pub fn with_unknown_producer(mut self, policy: UnknownProducer) -> Self {
        self.unknown = policy;
        self
    }

    /// What rule 1 does with a key that has no state.
    pub fn unknown_producer(&self) -> UnknownProducer {
        self.unknown
    }

    #[inline(always)]
    fn how(&self) -> Apply<()> {
        Apply {
            unknown: self.unknown,
            x: (),
        }
    }

    /// An engine with no state, giving the verdicts of `semantics`.
    pub fn with_semantics(semantics: Semantics) -> Self {
        ProducerStateManager {
            kafka: (semantics == Semantics::Kafka).then(Box::default),
            ..ProducerStateManager::default()
        }
    }

    /// The verdicts this engine gives.
    pub fn semantics(&self) -> Semantics {
        if self.kafka.is_some() {
            Semantics::Kafka
        } else {
            Semantics::Strict
        }
    }

    fn kafka_mut(&mut self, what: &'static str) -> Result<(&mut KafkaState, &mut StateMap)> {
        match &mut self.kafka {
            Some(k) => Ok((k, &mut self.map)),
            None => Err(Error::Unsupported {
                what,
                semantics: Semantics::Strict,
            }),
        }
    }

    /// A plain client append under Kafka's rules; out of line and marked
    /// cold, so the strict path that branches around it is laid out and
    /// register-allocated as it was (the hint costs Kafka mode nothing
    /// measurable: its two probes of the map dominate).
    #[cold]
    #[inline(never)]
    fn kafka_append(&mut self, id: &ProducerId, partition: i32, ask: Ask) -> BatchOutcome {
        match &mut self.kafka {
            Some(k) => k.append(&mut self.map, id, partition, ask, AppendOptions::client()),
            None => {
                let how = self.how();
                self.map.append(id, partition, ask, how)
            }
        }
    }

    fn kafka_ref(&self, what: &'static str) -> Result<&KafkaState> {
        self.kafka.as_deref().ok_or(Error::Unsupported {
            what,
            semantics: Semantics::Strict,
        })
    }

    /// Classifies a single-sequence append and records it if accepted.
    ///
    /// A batch of one record without metadata: rule 4 answers every retry at
    /// or below the last sequence with [`AppendOutcome::Duplicate`].
    #[inline(always)]
    pub fn append(
        &mut self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> AppendOutcome {
        let ask = || Ask::single(epoch, sequence);
        // The id and the request are made in each branch, so the strict path
        // keeps them in registers as before (their address never escapes
        // to a call).
        if self.kafka.is_some() {
            return self
                .kafka_append(&producer_id.into(), partition, ask())
                .outcome();
        }
        self.map
            .append(&producer_id.into(), partition, ask(), self.how())
            .outcome()
    }

    /// Classifies a batch and records it (with its offset and timestamp, for
    /// retries) if accepted.
    ///
    /// # Panics
    ///
    /// Only at a capacity limit: one map holds retry windows for at most
    /// 2^32 - 1 keys (about 400 GB of windows); the durable store's state is
    /// 256 such maps.
    ///
    /// ```
    /// use producer_state::{Batch, BatchMetadata, BatchOutcome, ProducerStateManager};
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// let first = Batch::new(0, 9, 1000, 1_700_000_000_000);
    /// assert_eq!(mgr.append_batch(42u64, 3, 0, first), BatchOutcome::Accepted);
    /// // The client retries: the broker answers with the original offset.
    /// assert_eq!(
    ///     mgr.append_batch(42u64, 3, 0, first),
    ///     BatchOutcome::Duplicate {
    ///         original: Some(BatchMetadata { offset: 1000, timestamp: 1_700_000_000_000 })
    ///     }
    /// );
    /// ```
    #[inline(always)]
    pub fn append_batch(
        &mut self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
    ) -> BatchOutcome {
        let ask = || Ask::batch(epoch, &batch);
        if self.kafka.is_some() {
            return self.kafka_append(&producer_id.into(), partition, ask());
        }
        self.map
            .append(&producer_id.into(), partition, ask(), self.how())
    }

    /// Classifies one request (single or batch) and records it if accepted.
    pub fn append_request(&mut self, request: &AppendRequest) -> BatchOutcome {
        let id = &request.producer_id;
        if self.kafka.is_some() {
            return self.kafka_append(id, request.partition, Ask::of(request));
        }
        self.map
            .append(id, request.partition, Ask::of(request), self.how())
    }

    /// Adds a compact entry read from a snapshot; false if the key has
    /// state already (in the map or the side table).
    pub(crate) fn insert_loaded(
        &mut self,
        id: &ProducerId,
        partition: i32,
        e: &ProducerEntry,
    ) -> bool {
        if self
            .kafka
            .as_deref()
            .is_some_and(|k| k.in_side(id, partition))
        {
            return false;
        }
        self.map
            .insert_new_hashed(HashedKey::new(id, partition), e, ())
    }

    /// The compact keys (the seed-format entries of a snapshot), with the
    /// activity a snapshot states for a key of an engine without a clock.
    pub(crate) fn compact_entries(
        &self,
    ) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry, i64)> + '_ {
        self.map.iter().map(|(id, p, e)| {
            let activity = e.activity_without_clock();
            (id, p, e, activity)
        })
    }

    /// The entry of one key, if it has state.
    ///
    /// Under [`Semantics::Kafka`], a key with transaction state or with
    /// cached batches that are not consecutive is shown with its epoch, its
    /// last sequence and the newest consecutive run of its batches;
    /// [`ProducerStateManager::kafka_state`] shows all of it.
    pub fn get(&self, producer_id: impl Into<ProducerId>, partition: i32) -> Option<ProducerEntry> {
        let id = producer_id.into();
        match &self.kafka {
            None => self.map.get(&id, partition),
            Some(k) => k.get(&self.map, &id, partition),
        }
    }

    /// Number of (producer id, partition) keys with state.
    pub fn len(&self) -> usize {
        self.map.len() + self.kafka.as_deref().map_or(0, KafkaState::len)
    }

    /// True when no key has state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key with its entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        self.map
            .iter()
            .chain(self.kafka.iter().flat_map(|k| k.iter()))
    }

    /// An engine over a state loaded from bytes: the compact map and, under
    /// [`Semantics::Kafka`], the Kafka-mode side.
    pub(crate) fn from_parts(map: StateMap, kafka: Option<KafkaState>) -> Self {
        ProducerStateManager {
            map,
            kafka: kafka.map(Box::new),
            ..ProducerStateManager::default()
        }
    }

    /// The Kafka-mode side of the engine, to change (an import).
    pub(crate) fn kafka_side_mut(&mut self) -> Option<&mut KafkaState> {
        self.kafka.as_deref_mut()
    }

    /// Adds a compact key known to be new (an import, checked before).
    pub(crate) fn insert_compact_new(
        &mut self,
        id: &ProducerId,
        partition: i32,
        e: &ProducerEntry,
    ) {
        self.map
            .insert_new_hashed(HashedKey::new(id, partition), e, ());
    }
}

#[cfg(test)]
mod tests;
