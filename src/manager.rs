//! The in-memory engine.
//!
//! `ProducerStateManager` is the classifier with no disk behind it: what a
//! test suite or a broker that persists state by other means links. The
//! durable [`ProducerStateStore`](crate::ProducerStateStore) runs exactly
//! the same rules over the same map, so an append classifies identically in
//! both.
//!
//! Under [`Semantics::Kafka`] the same map holds plain producers and a side
//! table (`kafka_state.rs`) the transactional ones; the seed path does not
//! look at it.

use std::path::Path;

use crate::batch::{AppendOptions, AppendRequest, Batch, BatchMetadata, Origin};
use crate::entry::ProducerEntry;
use crate::error::{Corruption, Error, Result};
use crate::export::{KafkaPart, PartitionExport};
use crate::id::ProducerId;
use crate::info::ProducerInfo;
use crate::kafka::{KafkaProducerEntry, Unrepresentable};
use crate::kafka_state::{KafkaProducerState, KafkaState, expire_compact};
use crate::map::{Apply, StateMap, hash_key};
use crate::outcome::{AppendOutcome, BatchOutcome};
use crate::rules::UnknownProducer;
use crate::semantics::Semantics;
use crate::snapshot;
use crate::txn::{AbortedTxn, Marker, MarkerOutcome};
use crate::wal::op::LogOp;

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
    /// An engine with no state, under the seed rules.
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
            Semantics::Seed
        }
    }

    fn kafka_mut(&mut self, what: &'static str) -> Result<(&mut KafkaState, &mut StateMap)> {
        match &mut self.kafka {
            Some(k) => Ok((k, &mut self.map)),
            None => Err(Error::Unsupported {
                what,
                semantics: Semantics::Seed,
            }),
        }
    }

    /// A plain client append under Kafka's rules; out of line and marked
    /// cold, so the seed path that branches around it is laid out and
    /// register-allocated as it was (the hint costs Kafka mode nothing
    /// measurable: its two probes of the map dominate).
    #[cold]
    #[inline(never)]
    fn kafka_append(
        &mut self,
        id: &ProducerId,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        meta: Option<BatchMetadata>,
    ) -> BatchOutcome {
        match &mut self.kafka {
            Some(k) => k.append(
                &mut self.map,
                id,
                partition,
                epoch,
                first,
                last,
                meta,
                AppendOptions::client(),
            ),
            None => {
                let how = self.how();
                self.map
                    .append(id, partition, epoch, first, last, meta, how)
            }
        }
    }

    fn kafka_ref(&self, what: &'static str) -> Result<&KafkaState> {
        self.kafka.as_deref().ok_or(Error::Unsupported {
            what,
            semantics: Semantics::Seed,
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
        // The id is made in each branch, so the seed path keeps it in
        // registers as before (its address never escapes to a call).
        if self.kafka.is_some() {
            return self
                .kafka_append(
                    &producer_id.into(),
                    partition,
                    epoch,
                    sequence,
                    sequence,
                    None,
                )
                .outcome();
        }
        self.map
            .append(
                &producer_id.into(),
                partition,
                epoch,
                sequence,
                sequence,
                None,
                self.how(),
            )
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
        let (first, last, meta) = (
            batch.first_sequence,
            batch.last_sequence,
            Some(batch.metadata()),
        );
        if self.kafka.is_some() {
            return self.kafka_append(&producer_id.into(), partition, epoch, first, last, meta);
        }
        self.map.append(
            &producer_id.into(),
            partition,
            epoch,
            first,
            last,
            meta,
            self.how(),
        )
    }

    /// Classifies one request (single or batch) and records it if accepted.
    pub fn append_request(&mut self, request: &AppendRequest) -> BatchOutcome {
        let r = request;
        if self.kafka.is_some() {
            return self.kafka_append(
                &r.producer_id,
                r.partition,
                r.epoch,
                r.first,
                r.last,
                r.metadata,
            );
        }
        self.map.append(
            &r.producer_id,
            r.partition,
            r.epoch,
            r.first,
            r.last,
            r.metadata,
            self.how(),
        )
    }

    /// Classifies a batch with its origin and transactional flags, and
    /// records it if accepted (Kafka's `UnifiedLog.append` for one batch):
    /// a transactional batch opens the producer's transaction on the
    /// partition at the batch's offset, or continues it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Seed`], which has no
    /// transactions and no origins.
    ///
    /// ```
    /// use producer_state::{AppendOptions, Batch, BatchOutcome, ProducerStateManager, Semantics, TxnStateReason};
    ///
    /// let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    /// let txn = AppendOptions::client().transactional();
    /// // A transaction nobody verified with the coordinator (KIP-890) is refused ...
    /// assert_eq!(
    ///     mgr.append_with(7u64, 0, 0, Batch::new(0, 0, 100, 1), txn)?,
    ///     BatchOutcome::InvalidTxnState { reason: TxnStateReason::NotVerified }
    /// );
    /// // ... a verified one opens at its offset, and holds the last stable offset back.
    /// assert!(mgr.append_with(7u64, 0, 0, Batch::new(0, 0, 100, 1), txn.verified())?.is_accepted());
    /// assert_eq!(mgr.first_unstable_offset(0), Some(100));
    /// assert_eq!(mgr.last_stable_offset(0, 101), 100);
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    pub fn append_with(
        &mut self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
        options: AppendOptions,
    ) -> Result<BatchOutcome> {
        let (k, map) = self.kafka_mut("an append with an origin or transactional flags")?;
        Ok(k.append(
            map,
            &producer_id.into(),
            partition,
            epoch,
            batch.first_sequence,
            batch.last_sequence,
            Some(batch.metadata()),
            options,
        ))
    }

    /// Classifies an end-transaction marker written at `epoch` and applies
    /// it if accepted: the producer's open transaction on the partition (if
    /// any) is complete, its coordinator epoch is the marker's, and a
    /// higher epoch (a coordinator-driven abort that bumps the epoch) drops
    /// its cached batches, so its next batch must start at sequence 0.
    ///
    /// `origin` is [`Origin::Coordinator`] for a leader writing the marker
    /// (a lower producer or coordinator epoch is refused) or
    /// [`Origin::Replication`] (both are applied); [`Origin::Client`] is
    /// treated as the coordinator (Kafka refuses control batches from
    /// clients before producer state is consulted: a broker must not pass
    /// them here).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Seed`].
    pub fn append_marker(
        &mut self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        marker: Marker,
        origin: Origin,
    ) -> Result<MarkerOutcome> {
        let (k, map) = self.kafka_mut("an end-transaction marker")?;
        Ok(k.marker(
            map,
            &producer_id.into(),
            partition,
            epoch,
            &marker,
            Some(origin),
        ))
    }

    /// The state of one key as Kafka holds it, with its transaction and
    /// coordinator epoch; `None` without state, and always `None` under
    /// [`Semantics::Seed`] (use [`ProducerStateManager::get`]).
    pub fn kafka_state(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<KafkaProducerState> {
        self.kafka
            .as_deref()?
            .state(&self.map, &producer_id.into(), partition)
    }

    /// The first offset of the oldest transaction still open on the
    /// partition (Kafka's first unstable offset); `None` when none is.
    pub fn first_unstable_offset(&self, partition: i32) -> Option<i64> {
        self.kafka
            .as_deref()?
            .txns()
            .first_unstable_offset(partition)
    }

    /// The partition's last stable offset for a log ending at
    /// `log_end_offset` (exclusive): consumers reading committed data stop
    /// there. The oldest open transaction's first offset, or the log end.
    pub fn last_stable_offset(&self, partition: i32, log_end_offset: i64) -> i64 {
        self.first_unstable_offset(partition)
            .map_or(log_end_offset, |f| f.min(log_end_offset))
    }

    /// The partition's aborted transactions, in the order their markers
    /// came (empty under [`Semantics::Seed`]). They are kept until
    /// [`ProducerStateManager::forget_aborted_before`] drops them, as a
    /// broker does when the log start offset passes them.
    pub fn aborted_transactions(&self, partition: i32) -> &[AbortedTxn] {
        self.kafka
            .as_deref()
            .map_or(&[], |k| k.txns().aborted(partition))
    }

    /// Drops the partition's aborted transactions whose marker is below
    /// `offset` (the log start offset moved past them).
    pub fn forget_aborted_before(&mut self, partition: i32, offset: i64) {
        if let Some(k) = &mut self.kafka {
            k.txns_mut().forget_aborted_before(partition, offset);
        }
    }

    /// Forgets every producer whose last activity is `expiration_ms` or
    /// more before `now_ms` (Kafka's `removeExpiredProducers`, its
    /// `producer.id.expiration.ms` one day by default), and returns how
    /// many keys were forgotten. An expired key has no state: its next
    /// append is classified as a new producer's (rule 1 under
    /// [`Semantics::Seed`]; under [`Semantics::Kafka`] accepted at any
    /// sequence).
    ///
    /// The engine keeps no clock, so a key's last activity is the
    /// timestamp of its newest retained batch (and, under
    /// [`Semantics::Kafka`], of its last marker). **A key whose newest
    /// append carried no timestamp (a single-sequence
    /// [`append`](ProducerStateManager::append)) never expires here**: the
    /// engine does not know when it was made. (The durable store stamps
    /// such appends with its clock and expires them; docs/lifecycle.md.)
    /// Under [`Semantics::Kafka`] a producer with an open transaction
    /// does not expire either, as in Kafka.
    ///
    /// The time is the caller's: the same state and the same arguments
    /// forget the same keys on any machine, so replicas that apply the
    /// same call stay equal (what `producer-state-raft` does).
    ///
    /// ```
    /// use producer_state::{Batch, ProducerStateManager};
    ///
    /// let day = 86_400_000;
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append_batch(1u64, 0, 0, Batch::new(0, 4, 100, 1_000));
    /// mgr.append_batch(2u64, 0, 0, Batch::new(0, 4, 105, 5_000));
    /// mgr.append(3u64, 0, 0, 0); // no timestamp: never expires here
    /// assert_eq!(mgr.expire_producers(1_000 + day, day)?, 1);
    /// assert!(mgr.get(1u64, 0).is_none() && mgr.get(2u64, 0).is_some());
    /// assert_eq!(mgr.expire_producers(i64::MAX, day)?, 1);
    /// assert_eq!(mgr.len(), 1);
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None today under either semantics; the `Result` stays so that a
    /// refusal (as before seed-mode expiration existed) is not a breaking
    /// change.
    pub fn expire_producers(&mut self, now_ms: i64, expiration_ms: i64) -> Result<usize> {
        match &mut self.kafka {
            Some(k) => Ok(k.expire(&mut self.map, now_ms, expiration_ms)),
            None => Ok(expire_compact(&mut self.map, now_ms, expiration_ms)),
        }
    }

    /// Forgets every key of `partition` and returns how many there were:
    /// the partition has moved away or been deleted. Under
    /// [`Semantics::Kafka`] its transactions go too: the open ones (its
    /// last stable offset is the log end again) and the aborted ones.
    ///
    /// ```
    /// use producer_state::ProducerStateManager;
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(1u64, 0, 0, 0);
    /// mgr.append(2u64, 0, 0, 0);
    /// mgr.append(1u64, 1, 0, 0);
    /// assert_eq!(mgr.remove_partition(0), 2);
    /// assert_eq!(mgr.remove_partition(0), 0);
    /// assert_eq!(mgr.len(), 1);
    /// ```
    pub fn remove_partition(&mut self, partition: i32) -> usize {
        let before = self.len();
        self.map.retain(|_, p, _| p != partition);
        if let Some(k) = &mut self.kafka {
            k.remove_partition(partition);
        }
        before - self.len()
    }

    /// Forgets one key and says whether it had state (under
    /// [`Semantics::Kafka`] an open transaction of it is no longer open):
    /// what a durable store's logged expiration does to one key, for a
    /// caller that keeps its own engine in step with such a log.
    ///
    /// ```
    /// use producer_state::ProducerStateManager;
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(1u64, 0, 0, 0);
    /// assert!(mgr.remove_producer(1u64, 0));
    /// assert!(!mgr.remove_producer(1u64, 0));
    /// assert!(mgr.is_empty());
    /// ```
    pub fn remove_producer(&mut self, producer_id: impl Into<ProducerId>, partition: i32) -> bool {
        self.remove_kafka_key(&producer_id.into(), partition)
    }

    /// The partition's producers as a Kafka `.snapshot` file holds them
    /// (each with its newest batch, coordinator epoch and open
    /// transaction), in no particular order; write them with
    /// [`kafka::encode`](crate::kafka::encode). Named producer ids have no
    /// place in Kafka's format and are left out.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Seed`] (its entries are
    /// exported by [`kafka::export`](crate::kafka::export)).
    pub fn kafka_snapshot_entries(&self, partition: i32) -> Result<Vec<KafkaProducerEntry>> {
        Ok(self
            .kafka_ref("Kafka's snapshot view")?
            .snapshot_entries(&self.map, partition))
    }

    /// Replaces the partition's producers with the entries of a Kafka
    /// snapshot, as Kafka's broker reloads one: each producer keeps only
    /// its newest batch (the retry window shrinks to one batch), and open
    /// transactions are open again. Returns the entries that could not be
    /// loaded (negative producer ids). Kafka also leaves out producers that
    /// expired while it was down: call
    /// [`ProducerStateManager::expire_producers`] after loading for that.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Seed`].
    pub fn load_kafka_snapshot(
        &mut self,
        partition: i32,
        entries: &[KafkaProducerEntry],
    ) -> Result<Vec<(i64, Unrepresentable)>> {
        let (k, map) = self.kafka_mut("loading a Kafka snapshot")?;
        Ok(k.load(map, partition, entries))
    }

    /// Adds one entry of a Kafka snapshot to the partition without
    /// replacing the partition's other producers (seeding a store from
    /// several files, see [`kafka::seed_kafka_store`](crate::kafka::seed_kafka_store)):
    /// `Ok(false)` if the key has state already.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Seed`]; the inner error
    /// for an entry that cannot be loaded (a negative producer id).
    pub(crate) fn add_kafka_entry(
        &mut self,
        partition: i32,
        entry: &KafkaProducerEntry,
    ) -> Result<std::result::Result<bool, Unrepresentable>> {
        let (k, map) = self.kafka_mut("seeding from a Kafka snapshot")?;
        Ok(k.insert_kafka(map, partition, entry))
    }

    /// Classifies a request under Kafka's rules with its own options and
    /// applies it if accepted (the Kafka-mode store's entry point); under
    /// the seed rules, as [`ProducerStateManager::append_request`].
    pub(crate) fn kafka_append_request(&mut self, r: &AppendRequest) -> BatchOutcome {
        match &mut self.kafka {
            Some(k) => k.append(
                &mut self.map,
                &r.producer_id,
                r.partition,
                r.epoch,
                r.first,
                r.last,
                r.metadata,
                r.options,
            ),
            None => self.append_request(r),
        }
    }

    /// Applies a Kafka-mode data batch that was accepted when its record
    /// was written (replay), without classifying it; nothing under the
    /// seed rules (the store never logs these there).
    pub(crate) fn apply_kafka_batch(&mut self, r: &AppendRequest, transactional: bool) {
        if let Some(k) = &mut self.kafka {
            k.apply_batch(
                &mut self.map,
                &r.producer_id,
                r.partition,
                r.epoch,
                r.first,
                r.last,
                r.metadata,
                transactional,
            );
        }
    }

    /// Applies an end-transaction marker that was accepted when its record
    /// was written (replay), without classifying it.
    pub(crate) fn apply_kafka_marker(
        &mut self,
        producer_id: &ProducerId,
        partition: i32,
        epoch: i16,
        marker: &Marker,
    ) {
        if let Some(k) = &mut self.kafka {
            k.marker(&mut self.map, producer_id, partition, epoch, marker, None);
        }
    }

    /// The keys a Kafka-mode expiration at `now_ms` drops (see
    /// [`ProducerStateManager::expire_producers`]), left in place; empty
    /// under the seed rules.
    pub(crate) fn kafka_expired_keys(
        &self,
        now_ms: i64,
        expiration_ms: i64,
    ) -> Vec<(ProducerId, i32)> {
        self.kafka
            .as_deref()
            .map(|k| k.expired_keys(&self.map, now_ms, expiration_ms))
            .unwrap_or_default()
    }

    /// Forgets one Kafka-mode key (a logged expiration replayed, or the
    /// live store applying the one it logged); false without state.
    pub(crate) fn remove_kafka_key(&mut self, id: &ProducerId, partition: i32) -> bool {
        match &mut self.kafka {
            Some(k) => k.remove_key(&mut self.map, id, partition),
            None => self.map.remove(id, partition).is_some(),
        }
    }

    /// The producer ids with state on `partition`, sorted.
    pub(crate) fn kafka_keys_of(&self, partition: i32) -> Vec<ProducerId> {
        let mut ids = match self.kafka.as_deref() {
            Some(k) => k.keys_of(&self.map, partition),
            None => Vec::new(),
        };
        ids.sort();
        ids
    }

    /// Every partition with Kafka-mode state: keys, open or aborted
    /// transactions.
    pub(crate) fn kafka_partitions(&self) -> std::collections::BTreeSet<i32> {
        let mut out: std::collections::BTreeSet<i32> = self.map.iter().map(|(_, p, _)| p).collect();
        if let Some(k) = self.kafka.as_deref() {
            out.extend(k.partitions());
        }
        out
    }

    /// What a reader of `partition` sees: each producer's Kafka state
    /// (sorted by id) and the aborted list. Two engines with the same view
    /// of every partition give the same verdicts.
    pub(crate) fn kafka_partition_view(
        &self,
        partition: i32,
    ) -> (Vec<(ProducerId, KafkaProducerState)>, Vec<AbortedTxn>) {
        let keys = self
            .kafka_keys_of(partition)
            .into_iter()
            .filter_map(|id| Some((id.clone(), self.kafka_state(id, partition)?)))
            .collect();
        (keys, self.aborted_transactions(partition).to_vec())
    }

    /// The log operations that set `partition` to this engine's state of
    /// it (members of a Kafka-mode truncation group): partition-state
    /// records (the first resets) for the side table and the aborted
    /// list, then key-state records for the compact keys.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] if one side-table key alone does not fit a
    /// record (a producer name of over about 65,000 bytes).
    pub(crate) fn kafka_partition_ops(&self, partition: i32) -> Result<Vec<LogOp>> {
        /// A record's worth, by estimate (a record holds up to 64 KiB).
        const CHUNK: usize = 48 << 10;
        let k = self.kafka_ref("a Kafka-mode truncation")?;
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
            let section = crate::kafka_snapshot::encode_body(c);
            if section.len() > crate::wal::txn_op::MAX_SECTION {
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
        let compact: Vec<ProducerInfo> = self
            .map
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .map(|(producer_id, partition, entry)| ProducerInfo {
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

    /// Applies a partition-state record (see
    /// [`ProducerStateManager::kafka_partition_ops`]).
    pub(crate) fn apply_kafka_partition(
        &mut self,
        partition: i32,
        reset: bool,
        section: &[u8],
    ) -> Result<()> {
        let add = crate::kafka_snapshot::decode_state(section)
            .map_err(|_| Error::Internal("a partition-state record that decoded once does not"))?;
        if reset {
            self.remove_partition(partition);
        }
        let (k, _) = self.kafka_mut("a Kafka-mode truncation")?;
        k.absorb(add);
        Ok(())
    }

    /// Sets a compact key to `entry` (a truncation's key-state record).
    pub(crate) fn set_kafka_compact(
        &mut self,
        id: &ProducerId,
        partition: i32,
        entry: &ProducerEntry,
    ) {
        self.remove_kafka_key(id, partition);
        self.insert_loaded(id, partition, entry);
    }

    /// The Kafka-mode side of the engine (side table, transactions).
    pub(crate) fn kafka_side(&self) -> Option<&KafkaState> {
        self.kafka.as_deref()
    }

    /// A Kafka-mode engine made of a snapshot's Kafka section; its compact
    /// keys follow through [`ProducerStateManager::insert_loaded`].
    pub(crate) fn from_kafka_side(kafka: KafkaState, keys: u64) -> Self {
        let mut map = StateMap::default();
        map.reserve(keys as usize, keys as usize);
        ProducerStateManager {
            map,
            kafka: Some(Box::new(kafka)),
            ..ProducerStateManager::default()
        }
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
            .insert_new_hashed(hash_key(id, partition), id, partition, e, ())
    }

    /// The compact keys (the seed-format entries of a snapshot), with the
    /// activity a snapshot states for a key of an engine without a clock.
    pub(crate) fn compact_entries(
        &self,
    ) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry, i64)> + '_ {
        self.map.iter().map(|(id, p, e)| {
            let activity = snapshot::legacy_activity(&e);
            (id, p, e, activity)
        })
    }

    /// The producer state of `partition` (each key with its whole retry
    /// window), for a partition that moves to another engine or store
    /// ([`ProducerStateManager::import_partition`],
    /// [`ProducerStateStore::import_partition`](crate::ProducerStateStore::import_partition),
    /// [`PartitionExport::to_bytes`](crate::PartitionExport::to_bytes) for
    /// the wire). The engine keeps no clock: each key's last activity is
    /// its newest batch's timestamp, 0 for a key without one (as in
    /// [`ProducerStateManager::encode_snapshot`]).
    ///
    /// # Errors
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
            .map
            .iter()
            .filter(|(_, p, _)| *p == partition)
            .map(|(producer_id, partition, entry)| ProducerInfo {
                last_activity: snapshot::legacy_activity(&entry),
                producer_id,
                partition,
                entry,
            })
            .collect();
        Ok(match self.kafka.as_deref() {
            None => PartitionExport::new(partition, entries),
            Some(k) => {
                let (side, aborted) = k.partition_side(partition);
                PartitionExport::new_kafka(partition, entries, KafkaPart { side, aborted })
            }
        })
    }

    /// Refuses an import the engine cannot take: an export of the other
    /// semantics; under the seed rules a key the engine holds; under
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
        if self.kafka.is_some() {
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
        if let (Some(k), Some(part)) = (self.kafka.as_deref_mut(), export.kafka_part()) {
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
            let h = hash_key(&i.producer_id, i.partition);
            // Each key once (the export's reader refuses repeats), and
            // none here (checked above): every insert is new.
            self.map
                .insert_new_hashed(h, &i.producer_id, i.partition, &i.entry, ());
        }
        Ok(export.len())
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

    /// The whole state as a snapshot in the crate's own checksummed format
    /// (docs/format.md, "Snapshot files"), byte for byte what the durable
    /// store writes to `<position>.snap`, stating `position` in its header.
    ///
    /// For a caller that keeps or ships the state by other means, such as a
    /// replicated state machine building a snapshot at its applied log
    /// index. [`ProducerStateManager::decode_snapshot`] reads it back, and
    /// so do the store's recovery and the `inspect-snapshot` tool when the
    /// bytes are saved under the store's file name.
    ///
    /// ```
    /// use producer_state::{AppendOutcome, ProducerStateManager};
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(7u64, 0, 0, 0);
    /// let bytes = mgr.encode_snapshot(42)?;
    /// let (position, copy) = ProducerStateManager::decode_snapshot("transfer", &bytes)?;
    /// assert_eq!((position, copy.get(7u64, 0)), (42, mgr.get(7u64, 0)));
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// Under [`Semantics::Kafka`] the snapshot's header says so (flag bit
    /// 0) and a Kafka section holds the side table and the aborted
    /// transactions (docs/format.md); [`ProducerStateManager::decode_snapshot`]
    /// gives back a Kafka-mode engine with the same state.
    ///
    /// # Errors
    ///
    /// None today; a `Result` so that a state the format cannot hold is an
    /// error, never a file that loses it.
    pub fn encode_snapshot(&self, position: u64) -> Result<Vec<u8>> {
        // The engine keeps no clock: a key's activity is its newest
        // batch's timestamp, as for a file written before activity existed.
        Ok(snapshot::encode_to_vec(
            position,
            &crate::meta::Meta::default(),
            self.kafka.as_deref(),
            self.compact_entries(),
        ))
    }

    /// Reads a snapshot made by [`ProducerStateManager::encode_snapshot`]
    /// (or a store's snapshot file) into a fresh engine, with the position
    /// its header states.
    ///
    /// Nothing is returned unless every check passes: magic, version,
    /// lengths, every entry, the CRC over every byte and the entry count.
    /// `source` names the bytes in errors (a path, or any label such as
    /// "snapshot from node 2").
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming `source` and the byte offset of the first
    /// damage (also for a key stated twice), or
    /// [`Error::UnsupportedVersion`]. Never a panic, whatever the bytes.
    pub fn decode_snapshot(source: impl AsRef<Path>, bytes: &[u8]) -> Result<(u64, Self)> {
        let source = source.as_ref();
        let mut map = StateMap::default();
        let read = |id: ProducerId, partition, entry: ProducerEntry, _activity| {
            if map.insert_new_hashed(hash_key(&id, partition), &id, partition, &entry, ()) {
                Ok(())
            } else {
                Err(Error::corrupt(source, 0, Corruption::DuplicateKey))
            }
        };
        let (header, _meta, kafka) = snapshot::read_kafka(source, bytes, bytes.len() as u64, read)?;
        if let Some(k) = &kafka
            && let Some((id, p, _)) = k.side().find(|(id, p, _)| map.get(id, *p).is_some())
        {
            let _ = (id, p);
            return Err(Error::corrupt(source, 0, Corruption::DuplicateKey));
        }
        let manager = ProducerStateManager {
            map,
            kafka: kafka.map(Box::new),
            ..ProducerStateManager::default()
        };
        Ok((header.position, manager))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppendOutcome::*;
    use crate::{BatchMetadata, OutOfOrderReason};
    use std::path::Path;

    #[test]
    fn the_task_example() {
        let mut mgr = ProducerStateManager::new();
        let got: Vec<_> = [(0, 0), (0, 1), (0, 1), (0, 5), (1, 0), (0, 2)]
            .into_iter()
            .map(|(epoch, seq)| mgr.append("p1", 0, epoch, seq))
            .collect();
        assert_eq!(
            got,
            [
                Accepted,
                Accepted,
                Duplicate,
                OutOfOrder,
                Accepted,
                FencedEpoch
            ]
        );
        let e = mgr.get("p1", 0).unwrap();
        assert_eq!((e.epoch(), e.last_sequence()), (1, 0));
    }

    #[test]
    fn only_accepted_changes_state() {
        let mut mgr = ProducerStateManager::new();
        mgr.append(1u64, 0, 2, 0);
        mgr.append(1u64, 0, 2, 1);
        let before = mgr.get(1u64, 0);
        for (epoch, seq) in [
            (2, 1),
            (2, 0),
            (2, 9),
            (1, 2),
            (3, 4),
            (2, -1),
            (i16::MIN, 0),
        ] {
            assert_ne!(mgr.append(1u64, 0, epoch, seq), Accepted);
            assert_eq!(mgr.get(1u64, 0), before, "after ({epoch}, {seq})");
        }
        assert_eq!(mgr.append(1u64, 7, 0, 3), OutOfOrder);
        assert_eq!(mgr.get(1u64, 7), None);
        assert_eq!(mgr.len(), 1);
    }

    #[test]
    fn a_rejected_new_epoch_leaves_the_old_epoch_usable() {
        let mut mgr = ProducerStateManager::new();
        mgr.append("p", 0, 0, 0);
        assert_eq!(mgr.append("p", 0, 1, 3), OutOfOrder);
        assert_eq!(mgr.get("p", 0).unwrap().epoch(), 0);
        assert_eq!(mgr.append("p", 0, 0, 1), Accepted);
        assert_eq!(mgr.append("p", 0, 1, 0), Accepted);
        assert_eq!(mgr.append("p", 0, 0, 2), FencedEpoch);
    }

    #[test]
    fn keys_are_independent() {
        let mut mgr = ProducerStateManager::new();
        assert_eq!(mgr.append("a", 0, 5, 0), Accepted);
        assert_eq!(mgr.append("a", 1, 0, 0), Accepted);
        assert_eq!(mgr.append("b", 0, 0, 0), Accepted);
        assert_eq!(mgr.append("a", 1, 0, 1), Accepted);
        assert_eq!(mgr.append("a", 0, 5, 1), Accepted);
        assert_eq!(mgr.append("b", 0, 1, 0), Accepted);
        assert_eq!(mgr.append("a", 0, 4, 0), FencedEpoch);
        assert_eq!(mgr.len(), 3);
    }

    #[test]
    fn the_retry_window_answers_the_last_five_batches() {
        let mut mgr = ProducerStateManager::new();
        let batches: Vec<Batch> = (0..7)
            .map(|i| {
                Batch::new(
                    i * 3,
                    i * 3 + 2,
                    100 + i64::from(i) * 10,
                    5000 + i64::from(i),
                )
            })
            .collect();
        for b in &batches {
            assert_eq!(mgr.append_batch(9u64, 0, 0, *b), BatchOutcome::Accepted);
        }
        for b in &batches[2..] {
            assert_eq!(
                mgr.append_batch(9u64, 0, 0, *b),
                BatchOutcome::Duplicate {
                    original: Some(BatchMetadata {
                        offset: b.offset,
                        timestamp: b.timestamp
                    })
                }
            );
        }
        // Older than the window: a multi-record retry is rejected, a
        // single-sequence retry is still a duplicate (rule 4).
        assert_eq!(
            mgr.append_batch(9u64, 0, 0, batches[1]),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::OverlapsAccepted { last_accepted: 20 }
            }
        );
        assert_eq!(mgr.append(9u64, 0, 0, 4), Duplicate);
        assert_eq!(
            mgr.append_batch(9u64, 0, 0, Batch::new(4, 4, 0, 0)),
            BatchOutcome::Duplicate { original: None }
        );
        let e = mgr.get(9u64, 0).unwrap();
        let kept: Vec<_> = e.retained_batches().map(|b| b.first_sequence).collect();
        assert_eq!(kept, [6, 9, 12, 15, 18]);
    }

    #[test]
    fn sequences_wrap_and_the_window_recognises_retries_across_the_wrap() {
        let mut mgr = ProducerStateManager::new();
        mgr.append_batch(1u64, 0, 0, Batch::new(0, i32::MAX - 1, 0, 0));
        let at_max = Batch::new(i32::MAX, i32::MAX, 7, 8);
        assert_eq!(mgr.append_batch(1u64, 0, 0, at_max), BatchOutcome::Accepted);
        assert_eq!(
            mgr.append_batch(1u64, 0, 0, Batch::new(0, 0, 9, 9)),
            BatchOutcome::Accepted
        );
        assert_eq!(
            mgr.append_batch(1u64, 0, 0, at_max),
            BatchOutcome::Duplicate {
                original: Some(at_max.metadata())
            }
        );
        assert_eq!(mgr.append(1u64, 0, 0, 1), Accepted);
        // Without a window, plain comparison applies: MAX is "higher" than 1.
        let mut plain = ProducerStateManager::new();
        plain.append(2u64, 0, 0, 0);
        assert_eq!(plain.append(2u64, 0, 0, i32::MAX), OutOfOrder);
    }

    #[test]
    fn the_epoch_limit() {
        let mut mgr = ProducerStateManager::new();
        assert_eq!(mgr.append(1u64, 0, i16::MAX, 0), Accepted);
        assert_eq!(mgr.append(1u64, 0, i16::MAX, 1), Accepted);
        // Nothing is above MAX: the session can only continue, and every
        // lower epoch is fenced; a new session needs a new producer id.
        assert_eq!(mgr.append(1u64, 0, i16::MAX - 1, 0), FencedEpoch);
        assert_eq!(mgr.append(1u64, 0, i16::MIN, 0), FencedEpoch);
        assert_eq!(mgr.append(1u64, 0, i16::MAX, 0), Duplicate);
        // Negative epochs are ordinary, signed, as in Kafka.
        assert_eq!(mgr.append(2u64, 0, -1, 0), Accepted);
        assert_eq!(mgr.append(2u64, 0, 0, 0), Accepted);
        assert_eq!(mgr.append(2u64, 0, -1, 1), FencedEpoch);
    }

    fn sorted(m: &ProducerStateManager) -> Vec<(String, i32, ProducerEntry)> {
        let mut v: Vec<_> = m
            .iter()
            .map(|(id, p, e)| (format!("{id:?}"), p, e))
            .collect();
        v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        v
    }

    fn varied() -> ProducerStateManager {
        let mut m = ProducerStateManager::new();
        for pid in 0..40u64 {
            m.append(pid, (pid % 3) as i32, 1, 0);
        }
        for i in 0..9 {
            m.append_batch(
                "named",
                -4,
                2,
                Batch::new(i * 2, i * 2 + 1, i64::from(i), 9),
            );
        }
        m.append("y".repeat(300), i32::MAX, i16::MIN, 0);
        m
    }

    #[test]
    fn a_snapshot_in_memory_round_trips_the_whole_state() {
        let m = varied();
        let (position, back) =
            ProducerStateManager::decode_snapshot("mem", &m.encode_snapshot(u64::MAX).unwrap())
                .unwrap();
        assert_eq!(position, u64::MAX);
        assert_eq!(sorted(&back), sorted(&m));
        // The copy is an engine like the original: it answers a retry of a
        // retained batch with the original metadata, and goes on accepting.
        let mut back = back;
        assert_eq!(
            back.append_batch("named", -4, 2, Batch::new(16, 17, 8, 9)),
            BatchOutcome::Duplicate {
                original: Some(BatchMetadata {
                    offset: 8,
                    timestamp: 9
                })
            }
        );
        assert_eq!(back.append(39u64, 0, 1, 1), Accepted);
        let (_, empty) = ProducerStateManager::decode_snapshot(
            "mem",
            &ProducerStateManager::new().encode_snapshot(0).unwrap(),
        )
        .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn a_damaged_snapshot_in_memory_is_an_error_naming_its_source() {
        let bytes = varied().encode_snapshot(5).unwrap();
        for cut in 0..bytes.len() {
            let err = ProducerStateManager::decode_snapshot("transfer", &bytes[..cut]).unwrap_err();
            assert!(err.is_corruption(), "cut at {cut}: {err}");
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            match ProducerStateManager::decode_snapshot("transfer", &bad) {
                Err(Error::Corrupt { file, .. }) => assert_eq!(file, Path::new("transfer")),
                other => panic!("flip at {at}: {other:?}"),
            }
        }
    }
    #[test]
    fn accept_any_admits_the_first_append_of_an_unknown_key_at_any_sequence() {
        let mut mgr = ProducerStateManager::new().with_unknown_producer(UnknownProducer::AcceptAny);
        assert_eq!(mgr.append(1u64, 0, 4, 17), Accepted);
        assert_eq!(mgr.append(1u64, 0, 4, 18), Accepted);
        assert_eq!(mgr.append(1u64, 0, 4, 20), OutOfOrder, "rule 4 as usual");
        assert_eq!(mgr.append(1u64, 0, 3, 19), FencedEpoch);
        // Malformed batches are still rejected.
        assert_eq!(mgr.append(2u64, 0, 0, -1), OutOfOrder);
        assert_eq!(
            mgr.append_batch(2u64, 0, 0, Batch::new(9, 3, 0, 0))
                .outcome(),
            OutOfOrder
        );
        assert_eq!(mgr.get(1u64, 0).map(|e| e.last_sequence()), Some(18));
        assert_eq!(mgr.unknown_producer(), UnknownProducer::AcceptAny);
    }

    #[test]
    fn extreme_ids_and_partitions() {
        let mut mgr = ProducerStateManager::new();
        for pid in [0, 1, u64::MAX, 1 << 63, 0x243f_6a88_85a3_08d3] {
            for partition in [i32::MIN, -1, 0, i32::MAX] {
                assert_eq!(mgr.append(pid, partition, 0, 0), Accepted);
            }
        }
        assert_eq!(mgr.len(), 20);
        assert_eq!(mgr.append("", 0, 0, 0), Accepted);
        assert_eq!(mgr.append("", 0, 0, 0), Duplicate);
    }

    #[test]
    fn a_kafka_mode_engine_round_trips_with_its_side_table_and_aborted_lists() {
        use crate::{AppendOptions, Marker, Origin};
        let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
        let txn = AppendOptions::client().transactional().verified();
        mgr.append_batch(1u64, 0, 0, Batch::new(0, 2, 10, 1));
        mgr.append_with("t", 0, 3, Batch::new(0, 0, 13, 2), txn)
            .unwrap();
        mgr.append_marker("t", 0, 3, Marker::abort(4, 14, 3), Origin::Coordinator)
            .unwrap();
        mgr.append_with(9u64, 5, 1, Batch::new(0, 4, 20, 4), txn)
            .unwrap();
        let bytes = mgr.encode_snapshot(7).unwrap();
        assert_eq!(bytes[10], 1, "the header's Kafka flag");
        let (pos, back) = ProducerStateManager::decode_snapshot("mem", &bytes).unwrap();
        assert_eq!((pos, back.semantics()), (7, Semantics::Kafka));
        for (id, p) in [
            (ProducerId::from(1u64), 0),
            ("t".into(), 0),
            (9u64.into(), 5),
        ] {
            assert_eq!(back.kafka_state(id.clone(), p), mgr.kafka_state(id, p));
        }
        assert_eq!(back.aborted_transactions(0), mgr.aborted_transactions(0));
        assert_eq!(back.first_unstable_offset(5), Some(20));
        assert_eq!(
            back.encode_snapshot(7).unwrap(),
            bytes,
            "the same bytes again"
        );
        // Every cut and flipped bit is an error, never a panic.
        for cut in 0..bytes.len() {
            assert!(ProducerStateManager::decode_snapshot("mem", &bytes[..cut]).is_err());
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x04;
            assert!(
                ProducerStateManager::decode_snapshot("mem", &bad).is_err(),
                "flip at {at}"
            );
        }
    }

    /// One step of the lifecycle property test.
    #[derive(Clone, Debug)]
    enum Step {
        Batch {
            pid: u8,
            partition: u8,
            epoch: i16,
            ts: i64,
        },
        Single {
            pid: u8,
            partition: u8,
            epoch: i16,
        },
        Expire {
            now: i64,
            expiration: i64,
        },
        RemovePartition(u8),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..6, 0u8..3, 0i16..2, 0i64..1_000)
                .prop_map(|(pid, partition, epoch, ts)| Step::Batch { pid, partition, epoch, ts }),
            2 => (0u8..6, 0u8..3, 0i16..2)
                .prop_map(|(pid, partition, epoch)| Step::Single { pid, partition, epoch }),
            1 => (0i64..1_500, 0i64..600)
                .prop_map(|(now, expiration)| Step::Expire { now, expiration }),
            1 => (0u8..4).prop_map(Step::RemovePartition),
        ]
    }

    proptest::proptest! {
        /// Expiration and partition removal against a model that keeps,
        /// per key, only the timestamp of its last accepted append (none
        /// for a single-sequence append): a key expires when that
        /// timestamp is `expiration` or more before `now`, never without
        /// one; a partition removal forgets exactly its keys. The counts
        /// returned and the keys left are the model's after every step.
        #[test]
        fn expiration_and_partition_removal_match_a_model(
            steps in proptest::collection::vec(step(), 1..120),
        ) {
            use std::collections::BTreeMap;
            let mut mgr = ProducerStateManager::new();
            let mut model: BTreeMap<(u64, i32), Option<i64>> = BTreeMap::new();
            let mut next: BTreeMap<(u64, i32, i16), i32> = BTreeMap::new();
            for s in steps {
                match s {
                    Step::Batch { pid, partition, epoch, ts } => {
                        let (pid, p) = (u64::from(pid), i32::from(partition));
                        let seq = next.get(&(pid, p, epoch)).copied().unwrap_or(0);
                        let b = Batch::new(seq, seq + 1, i64::from(seq), ts);
                        if mgr.append_batch(pid, p, epoch, b).is_accepted() {
                            model.insert((pid, p), Some(ts));
                            next.insert((pid, p, epoch), seq + 2);
                        } else {
                            // Forgotten or fenced: start the session over.
                            next.insert((pid, p, epoch), 0);
                        }
                    }
                    Step::Single { pid, partition, epoch } => {
                        let (pid, p) = (u64::from(pid), i32::from(partition));
                        let seq = next.get(&(pid, p, epoch)).copied().unwrap_or(0);
                        if mgr.append(pid, p, epoch, seq) == Accepted {
                            model.insert((pid, p), None);
                            next.insert((pid, p, epoch), seq + 1);
                        } else {
                            next.insert((pid, p, epoch), 0);
                        }
                    }
                    Step::Expire { now, expiration } => {
                        let before = model.len();
                        model.retain(|_, ts| !ts.is_some_and(|t| now - t >= expiration));
                        let n = mgr.expire_producers(now, expiration).unwrap();
                        proptest::prop_assert_eq!(n, before - model.len());
                    }
                    Step::RemovePartition(partition) => {
                        let p = i32::from(partition);
                        let before = model.len();
                        model.retain(|&(_, kp), _| kp != p);
                        proptest::prop_assert_eq!(mgr.remove_partition(p), before - model.len());
                    }
                }
                let mut keys: Vec<(u64, i32)> = mgr
                    .iter()
                    .map(|(id, p, _)| (id.as_numeric().unwrap(), p))
                    .collect();
                keys.sort();
                proptest::prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn an_expired_producer_is_new_again_and_its_retry_is_not_a_duplicate() {
        let mut mgr = ProducerStateManager::new();
        let b = Batch::new(0, 4, 10, 1_000);
        assert_eq!(mgr.append_batch(1u64, 0, 3, b), BatchOutcome::Accepted);
        assert_eq!(
            mgr.append_batch(1u64, 0, 3, Batch::new(5, 9, 15, 1_001)),
            BatchOutcome::Accepted
        );
        assert_eq!(
            mgr.expire_producers(1_500, 500).unwrap(),
            0,
            "1,001 is newer"
        );
        assert_eq!(mgr.expire_producers(1_501, 500).unwrap(), 1);
        // A retry of its last batch is now a gap (rule 1), not a
        // duplicate; a batch at sequence 0 is a new producer's, accepted
        // at any epoch (and a retry of its first batch would be accepted
        // again: why the expiration must outlast any retry).
        let last = Batch::new(5, 9, 15, 1_001);
        assert_eq!(mgr.append_batch(1u64, 0, 3, last).outcome(), OutOfOrder);
        assert_eq!(mgr.append_batch(1u64, 0, 0, b), BatchOutcome::Accepted);
        assert_eq!(mgr.get(1u64, 0).map(|e| e.epoch()), Some(0));
        // Saturating: times at the ends of i64 neither wrap nor panic.
        assert_eq!(mgr.expire_producers(i64::MIN, 0).unwrap(), 0);
        assert_eq!(mgr.expire_producers(i64::MAX, i64::MAX).unwrap(), 0);
        assert_eq!(mgr.expire_producers(i64::MAX, 1).unwrap(), 1);
    }

    #[test]
    fn removing_a_kafka_partition_forgets_its_transactions_and_side_table_keys() {
        use crate::{AppendOptions, Marker, Origin};
        let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
        let txn = AppendOptions::client().transactional().verified();
        for p in [0, 1] {
            mgr.append_with(1u64, p, 0, Batch::new(0, 0, 10, 1), txn)
                .unwrap();
            mgr.append_marker(1u64, p, 0, Marker::abort(0, 11, 2), Origin::Coordinator)
                .unwrap();
            mgr.append_with(2u64, p, 0, Batch::new(0, 0, 12, 3), txn)
                .unwrap();
            mgr.append(3u64, p, 0, 0);
        }
        assert_eq!(
            (
                mgr.first_unstable_offset(0),
                mgr.aborted_transactions(0).len()
            ),
            (Some(12), 1)
        );
        assert_eq!(mgr.remove_partition(0), 3);
        assert_eq!(mgr.first_unstable_offset(0), None);
        assert!(mgr.aborted_transactions(0).is_empty());
        assert!(mgr.kafka_state(1u64, 0).is_none() && mgr.kafka_state(2u64, 0).is_none());
        assert!(mgr.get(3u64, 0).is_none());
        // The other partition keeps everything.
        assert_eq!(
            (
                mgr.first_unstable_offset(1),
                mgr.aborted_transactions(1).len()
            ),
            (Some(12), 1)
        );
        assert_eq!(mgr.len(), 3);
        // A producer of the removed partition starts over there.
        assert!(
            mgr.append_with(2u64, 0, 0, Batch::new(0, 0, 20, 4), txn)
                .unwrap()
                .is_accepted()
        );
        assert_eq!(mgr.first_unstable_offset(0), Some(20));
    }

    #[test]
    fn a_partition_moves_between_engines_with_its_retry_windows() {
        let mut old = varied();
        let export = old.export_partition(-4).unwrap();
        assert_eq!(export.len(), 1);
        let bytes = export.to_bytes();
        let moved = crate::PartitionExport::from_bytes(&bytes).unwrap();
        let mut new = ProducerStateManager::new();
        new.append(5u64, 0, 0, 0);
        assert_eq!(new.import_partition(&moved).unwrap(), 1);
        assert_eq!(new.get("named", -4), old.get("named", -4));
        assert_eq!(
            new.append_batch("named", -4, 2, Batch::new(16, 17, 8, 9)),
            BatchOutcome::Duplicate {
                original: Some(BatchMetadata {
                    offset: 8,
                    timestamp: 9
                })
            }
        );
        // A second import of the same keys is refused whole.
        let before = sorted(&new);
        match new.import_partition(&moved) {
            Err(Error::ImportConflict { partition: -4, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(sorted(&new), before);
        // Removed at the old home, the partition has no state left there.
        assert_eq!(old.remove_partition(-4), 1);
        assert!(old.export_partition(-4).unwrap().is_empty());
        // An export moves only between engines of the same semantics.
        let mut kafka = ProducerStateManager::with_semantics(Semantics::Kafka);
        let e = kafka.import_partition(&moved).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ImportSemanticsMismatch {
                    partition: -4,
                    exported: Semantics::Seed,
                    store: Semantics::Kafka
                }
            ),
            "{e}"
        );
        let k_export = kafka.export_partition(-4).unwrap();
        assert_eq!(k_export.semantics(), Semantics::Kafka);
        assert!(matches!(
            new.import_partition(&k_export),
            Err(Error::ImportSemanticsMismatch { .. })
        ));
        assert!(kafka.is_empty());
    }
}
