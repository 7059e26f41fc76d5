//! The engine's Kafka-mode surface: transactional appends and markers,
//! the transaction views (last stable offset, aborted transactions), and
//! the crate-internal hooks the durable store replays Kafka records and
//! truncates Kafka-mode partitions through.
//!
//! Apart from the strict path in `mod.rs` because none of it runs there:
//! every public method here refuses [`Semantics::Strict`] with
//! [`Error::Unsupported`] or answers as an engine without transactions.

pub(crate) mod entry;
pub(crate) mod rules;
pub(crate) mod side;
pub(crate) mod state;
pub(crate) mod txn;
pub(crate) mod verification;

use super::ProducerStateManager;
use crate::batch::{AppendOptions, AppendRequest, Batch, Origin};
use crate::engine::entry::ProducerEntry;
use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};
use crate::engine::kafka::side::KafkaProducerState;
use crate::engine::kafka::state::KafkaState;
use crate::engine::kafka::txn::{
    AbortedTxn, LATE_TRANSACTION_BUFFER_MS, LateTransaction, Marker, MarkerOutcome,
};
use crate::engine::kafka::verification::VerificationState;
use crate::engine::map::{Ask, StateMap};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
#[cfg(doc)]
use crate::semantics::Semantics;

impl ProducerStateManager {
    /// Classifies a batch with its origin and transactional flags, and
    /// records it if accepted (Kafka's `UnifiedLog.append` for one batch):
    /// a transactional batch opens the producer's transaction on the
    /// partition at the batch's offset, or continues it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`], which has no
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
        let ask = Ask::batch(epoch, &batch);
        Ok(k.append(map, &producer_id.into(), partition, ask, options))
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
    /// [`Error::Unsupported`] under [`Semantics::Strict`].
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

    /// Kafka's `UnifiedLog.maybeStartTransactionVerification` (KIP-890):
    /// the broker is about to ask the transaction coordinator whether the
    /// producer added this partition to its transaction, for a request
    /// whose first batch starts at `sequence` (a coordinator's own write
    /// passes -1, Kafka's `NO_SEQUENCE`). Returns false, changing nothing,
    /// when the producer's transaction on the partition is open already
    /// (nothing to verify) or verification is off
    /// ([`ProducerStateManager::set_transaction_verification`]). Otherwise
    /// the key's [`VerificationState`] is created at `now_ms`, or verified
    /// again (its lowest sequence of the newest epoch kept), and returns
    /// true.
    ///
    /// The state outlives the coordinator's answer: until a transactional
    /// batch or marker of the producer is accepted, or it expires, a
    /// client batch of the producer starting above its lowest sequence is
    /// refused ([`OutOfOrderReason::AboveVerifiedSequence`]).
    /// [`ProducerStateManager::append_with`] with
    /// [`AppendOptions::verified`] calls this itself (at the batch's
    /// timestamp): call it only for a verification whose append does not
    /// follow, such as one the coordinator refused.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`].
    ///
    /// ```
    /// use producer_state::{AppendOptions, Batch, BatchOutcome, ProducerStateManager, Semantics};
    ///
    /// let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    /// // Sequence 3 was verified, but the coordinator did not answer in time ...
    /// assert!(mgr.start_transaction_verification(7u64, 0, 0, 3, 1_000)?);
    /// // ... so sequence 5, verified next, may not overtake it ...
    /// let txn = AppendOptions::client().transactional().verified();
    /// assert!(!mgr.append_with(7u64, 0, 0, Batch::new(5, 5, 10, 1_001), txn)?.is_accepted());
    /// // ... while its retry appends, and ends the verification.
    /// assert!(mgr.append_with(7u64, 0, 0, Batch::new(3, 4, 10, 1_002), txn)?.is_accepted());
    /// assert_eq!(mgr.verification_state(7u64, 0), None);
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// [`OutOfOrderReason::AboveVerifiedSequence`]: crate::OutOfOrderReason::AboveVerifiedSequence
    /// [`AppendOptions::verified`]: crate::AppendOptions::verified
    pub fn start_transaction_verification(
        &mut self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
        now_ms: i64,
    ) -> Result<bool> {
        let (k, _) = self.kafka_mut("a transaction verification")?;
        Ok(k.start_verification(&producer_id.into(), partition, (epoch, sequence), now_ms))
    }

    /// The key's KIP-890 verification state, if a verification is in
    /// progress (always `None` under [`Semantics::Strict`]).
    pub fn verification_state(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<VerificationState> {
        self.kafka
            .as_deref()?
            .verifications()
            .get(&producer_id.into(), partition)
    }

    /// Every verification state, sorted by producer and partition.
    pub fn verification_states(&self) -> Vec<(ProducerId, i32, VerificationState)> {
        self.kafka
            .as_deref()
            .map(|k| k.verifications().sorted())
            .unwrap_or_default()
    }

    /// The verification half of Kafka's `removeExpiredProducers` alone
    /// (the store's sweep, which logs the keys it expires, runs it beside
    /// them); [`ProducerStateManager::expire_producers`] includes it.
    pub(crate) fn expire_verification_states(&mut self, now_ms: i64, expiration_ms: i64) {
        if let Some(k) = &mut self.kafka {
            k.verifications_mut().expire(now_ms, expiration_ms);
        }
    }

    /// Forgets the verification states of one partition (it is removed).
    pub(crate) fn forget_partition_verifications(&mut self, partition: i32) {
        if let Some(k) = &mut self.kafka {
            k.verifications_mut().remove_partition(partition);
        }
    }

    /// Forgets every verification state: what a broker restart does to
    /// them, since Kafka keeps them in memory only. A Kafka-mode store
    /// forgets them when it is reopened; a caller keeping an engine in step
    /// with a store calls this when it reopens the store.
    pub fn forget_verification_states(&mut self) {
        if let Some(k) = &mut self.kafka {
            k.verifications_mut().clear_all();
        }
    }

    /// Replaces every verification state with `states`: for a caller that
    /// rebuilds its engine from a log (as a store's truncation does) and
    /// keeps the verifications the broker holds in memory, as Kafka's
    /// truncation keeps them. Nothing under [`Semantics::Strict`].
    pub fn restore_verification_states(
        &mut self,
        states: impl IntoIterator<Item = (ProducerId, i32, VerificationState)>,
    ) {
        if let Some(k) = &mut self.kafka {
            let v = k.verifications_mut();
            v.clear_all();
            for (id, p, s) in states {
                v.set(id, p, s);
            }
        }
    }

    /// Kafka's `transaction.partition.verification.enable` (on by default):
    /// off, a transactional batch that opens a transaction needs no
    /// verification, and none is started (states already there stay until
    /// cleared or expired, as in Kafka, whose check does not read the
    /// setting). Nothing under [`Semantics::Strict`].
    pub fn set_transaction_verification(&mut self, enabled: bool) {
        if let Some(k) = &mut self.kafka {
            k.set_verification(enabled);
        }
    }

    /// Whether transaction verification is on (false under
    /// [`Semantics::Strict`], which has no transactions).
    pub fn transaction_verification(&self) -> bool {
        self.kafka
            .as_deref()
            .is_some_and(|k| k.verification_enabled())
    }

    /// The state of one key as Kafka holds it, with its transaction and
    /// coordinator epoch; `None` without state, and always `None` under
    /// [`Semantics::Strict`] (use [`ProducerStateManager::get`]).
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
    /// came (empty under [`Semantics::Strict`]). They are kept until
    /// [`ProducerStateManager::forget_aborted_before`] drops them, as a
    /// broker does when the log start offset passes them.
    pub fn aborted_transactions(&self, partition: i32) -> &[AbortedTxn] {
        self.kafka
            .as_deref()
            .map_or(&[], |k| k.txns().aborted(partition))
    }

    /// The partitions whose oldest open transaction is late at `now_ms`
    /// (Kafka's `hasLateTransaction`, partition by partition): its
    /// producer's last timestamp lies more than
    /// `max_transaction_timeout_ms` (Kafka's `transaction.max.timeout.ms`,
    /// 15 minutes by default) plus [`LATE_TRANSACTION_BUFFER_MS`] before
    /// `now_ms`. Sorted by partition; empty under [`Semantics::Strict`].
    ///
    /// As in Kafka only the oldest transaction of a partition is looked at:
    /// it is the one that holds the last stable offset back. A producer
    /// without a timestamp (none of its batches carried one) is never late.
    ///
    /// ```
    /// use producer_state::{AppendOptions, Batch, ProducerStateManager, Semantics};
    ///
    /// let mut m = ProducerStateManager::with_semantics(Semantics::Kafka);
    /// let txn = AppendOptions::client().transactional().verified();
    /// // A transaction opened at offset 100 at time 1,000,000 ms, never ended.
    /// m.append_with(7u64, 0, 0, Batch::new(0, 0, 100, 1_000_000), txn)?;
    /// let max = 900_000; // transaction.max.timeout.ms
    /// assert!(m.late_transactions(1_000_000 + max, max).is_empty());
    /// let late = m.late_transactions(1_000_000 + max + 300_001, max);
    /// assert_eq!((late[0].partition, late[0].first_offset), (0, 100));
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    pub fn late_transactions(
        &self,
        now_ms: i64,
        max_transaction_timeout_ms: i64,
    ) -> Vec<LateTransaction> {
        let Some(k) = self.kafka.as_deref() else {
            return Vec::new();
        };
        let bound = max_transaction_timeout_ms.saturating_add(LATE_TRANSACTION_BUFFER_MS);
        let mut late: Vec<LateTransaction> = k
            .txns()
            .oldest_open()
            .filter_map(|(partition, id, first_offset)| {
                let last_timestamp = k.state(&self.map, id, partition)?.last_timestamp;
                (last_timestamp > 0 && now_ms.saturating_sub(last_timestamp) > bound).then(|| {
                    LateTransaction {
                        partition,
                        producer_id: id.clone(),
                        first_offset,
                        last_timestamp,
                    }
                })
            })
            .collect();
        late.sort_by_key(|t| t.partition);
        late
    }

    /// Drops the partition's aborted transactions whose marker is below
    /// `offset` (the log start offset moved past them).
    pub fn forget_aborted_before(&mut self, partition: i32, offset: i64) {
        if let Some(k) = &mut self.kafka {
            k.txns_mut().forget_aborted_before(partition, offset);
        }
    }

    /// The partition's producers as a Kafka `.snapshot` file holds them
    /// (each with its newest batch, coordinator epoch and open
    /// transaction), in no particular order; write them with
    /// [`kafka::encode`](crate::kafka::encode). Named producer ids have no
    /// place in Kafka's format and are left out.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`] (its entries are
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
    /// [`Error::Unsupported`] under [`Semantics::Strict`].
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
    /// [`Error::Unsupported`] under [`Semantics::Strict`]; the inner error
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
    /// the strict rules, as [`ProducerStateManager::append_request`].
    pub(crate) fn kafka_append_request(&mut self, r: &AppendRequest) -> BatchOutcome {
        match &mut self.kafka {
            Some(k) => k.append(
                &mut self.map,
                &r.producer_id,
                r.partition,
                Ask::of(r),
                r.options,
            ),
            None => self.append_request(r),
        }
    }

    /// Applies a Kafka-mode data batch that was accepted when its record
    /// was written (replay), without classifying it; nothing under the
    /// strict rules (the store never logs these there).
    pub(crate) fn apply_kafka_batch(&mut self, r: &AppendRequest, transactional: bool) {
        if let Some(k) = &mut self.kafka {
            k.apply_batch(
                &mut self.map,
                &r.producer_id,
                r.partition,
                Ask::of(r),
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
    /// under the strict rules.
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

    /// Applies a partition-state record's section, decoded (see
    /// `wal::txn_op::kafka_partition_ops`): the partition's state is reset
    /// first if the record says so, then the section's producers and
    /// aborted transactions are added.
    pub(crate) fn absorb_kafka_partition(
        &mut self,
        partition: i32,
        reset: bool,
        add: KafkaState,
    ) -> Result<()> {
        if reset {
            self.reset_partition(partition);
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
}
