//! The store's Kafka-mode API (`Semantics::Kafka`): appends with Kafka's
//! options, markers, verification, and the reads of the Kafka state (a
//! producer's state, the last stable offset, the aborted list, late
//! transactions). Each runs through `txn.rs`, which classifies, applies
//! and logs under the store's lock.

use super::txn::{KafkaAnswer, KafkaOp, check_kafka, engine_of};
use super::{ProducerStateStore, check_name};
use crate::batch::{AppendOptions, AppendRequest, Batch};
use crate::engine::ProducerStateManager;
use crate::engine::kafka::side::KafkaProducerState;
use crate::engine::kafka::txn::{AbortedTxn, LateTransaction, Marker, MarkerOutcome};
use crate::engine::kafka::verification::VerificationState;
use crate::error::{Error, Result};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::semantics::Semantics;

impl ProducerStateStore {
    /// A plain append in Kafka mode (its options in the request): what
    /// [`ProducerStateStore::append_request`] runs under
    /// [`Semantics::Kafka`]. Out of line and cold, so the strict path that
    /// branches around it is laid out as if it did not exist.
    #[cold]
    #[inline(never)]
    pub(super) fn kafka_decide(&self, request: &AppendRequest) -> Result<BatchOutcome> {
        check_name(request)?;
        check_kafka(request)?;
        self.shared
            .kafka_run(KafkaOp::Batch(request))
            .map(|a| match a {
                KafkaAnswer::Batch(o) => o,
                _ => BatchOutcome::Accepted,
            })
    }

    /// The verdicts this store gives (chosen at open, recorded in the
    /// directory).
    pub fn semantics(&self) -> Semantics {
        self.shared.opts.semantics
    }

    /// Classifies a batch with its origin and transactional flags and, if
    /// accepted, makes it durable before returning: Kafka's
    /// `UnifiedLog.append` for one batch, as
    /// [`ProducerStateManager::append_with`] (same verdicts), over the
    /// log. A transactional batch opens the producer's transaction on the
    /// partition at the batch's offset, or continues it.
    ///
    /// ```
    /// use producer_state::{AppendOptions, Batch, Marker, Origin, ProducerStateStore, Semantics, StoreOptions};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let opts = StoreOptions::default().semantics(Semantics::Kafka);
    /// let store = ProducerStateStore::open_with(dir.path(), opts.clone())?;
    /// let txn = AppendOptions::client().transactional().verified();
    /// store.append_with(7u64, 0, 0, Batch::new(0, 4, 100, 1), txn)?;
    /// assert_eq!(store.last_stable_offset(0, 105), 100);
    /// store.close()?;
    /// // The open transaction survives a reopen, and an ABORT lists it.
    /// let store = ProducerStateStore::open_with(dir.path(), opts)?;
    /// assert_eq!(store.first_unstable_offset(0), Some(100));
    /// store.append_marker(7u64, 0, 0, Marker::abort(1, 105, 2), Origin::Coordinator)?;
    /// assert_eq!(store.aborted_transactions(0)[0].first_offset, 100);
    /// assert_eq!(store.last_stable_offset(0, 106), 106);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`]; otherwise as
    /// [`ProducerStateStore::append`].
    pub fn append_with(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
        options: AppendOptions,
    ) -> Result<BatchOutcome> {
        let r = AppendRequest::batch(producer_id, partition, epoch, batch).with_options(options);
        check_name(&r)?;
        let answer = self
            .shared
            .kafka_run(KafkaOp::Batch(&r))
            .map(KafkaAnswer::batch);
        self.shared.log.telemetry().answered(&answer);
        answer
    }

    /// Classifies an end-transaction marker written at `epoch` and, if
    /// accepted, makes it durable before returning, as
    /// [`ProducerStateManager::append_marker`] (same verdicts).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`];
    /// [`Error::ProducerIdTooLong`], [`Error::Io`], [`Error::Poisoned`] as
    /// for appends.
    pub fn append_marker(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        marker: Marker,
        origin: crate::batch::Origin,
    ) -> Result<MarkerOutcome> {
        let id = producer_id.into();
        check_name(&AppendRequest::single(id.clone(), partition, epoch, 0))?;
        let op = KafkaOp::Marker {
            id: &id,
            partition,
            epoch,
            marker,
            origin,
        };
        match self.shared.kafka_run(op)? {
            KafkaAnswer::Marker(o) => Ok(o),
            _ => Err(Error::Internal("a marker was answered as a batch")),
        }
    }

    /// Drops the partition's aborted transactions whose marker is below
    /// `offset` (the log start offset moved past them), durably.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`]; [`Error::Io`] or
    /// [`Error::Poisoned`] as for appends.
    pub fn forget_aborted_before(&self, partition: i32, offset: i64) -> Result<()> {
        self.shared
            .kafka_run(KafkaOp::Forget { partition, offset })
            .map(|_| ())
    }

    /// Starts a KIP-890 transaction verification at the clock's reading
    /// now, as [`ProducerStateManager::start_transaction_verification`]
    /// (same answer). In memory only: nothing is logged, and a reopen
    /// forgets it, as a restarted Kafka broker does (docs/format.md).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`].
    pub fn start_transaction_verification(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> Result<bool> {
        if !self.shared.kafka {
            return Err(self.shared.kafka_refused());
        }
        let now = self.shared.opts.clock.now_ms();
        let mut st = self.shared.lock_state();
        engine_of(&mut st.keys.meta.kafka)?.start_transaction_verification(
            producer_id,
            partition,
            epoch,
            sequence,
            now,
        )
    }

    /// The key's KIP-890 verification state (see
    /// [`ProducerStateManager::verification_state`]): `None` when no
    /// verification is in progress, after a reopen, and under
    /// [`Semantics::Strict`].
    pub fn verification_state(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<VerificationState> {
        let id = producer_id.into();
        self.engine(|k| k.verification_state(id, partition))
            .flatten()
    }

    /// Every verification state, sorted by producer and partition (see
    /// [`ProducerStateManager::verification_states`]).
    pub fn verification_states(&self) -> Vec<(ProducerId, i32, VerificationState)> {
        self.engine(ProducerStateManager::verification_states)
            .unwrap_or_default()
    }

    fn engine<R>(&self, f: impl FnOnce(&ProducerStateManager) -> R) -> Option<R> {
        let st = self.shared.lock_state();
        st.keys.meta.kafka.as_deref().map(f)
    }

    /// The state of one key as Kafka holds it (see
    /// [`ProducerStateManager::kafka_state`]); `None` without state and
    /// under [`Semantics::Strict`].
    pub fn kafka_state(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<KafkaProducerState> {
        let id = producer_id.into();
        self.engine(|k| k.kafka_state(id, partition)).flatten()
    }

    /// The producers of one partition as Kafka's DescribeProducers
    /// (KIP-664) gives them, sorted by producer id: each with its epoch,
    /// last sequence, last timestamp, coordinator epoch and the first
    /// offset of its open transaction (`current_txn_first_offset`, Kafka's
    /// `currentTransactionStartOffset`). Reads the state of every
    /// operation queued, as [`ProducerStateStore::kafka_state`]. Empty
    /// under [`Semantics::Strict`] (use [`ProducerStateStore::producers`]).
    pub fn kafka_producers(&self, partition: i32) -> Vec<(ProducerId, KafkaProducerState)> {
        self.engine(|k| {
            k.kafka_keys_of(partition)
                .into_iter()
                .filter_map(|id| {
                    let st = k.kafka_state(id.clone(), partition)?;
                    Some((id, st))
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// The first offset of the oldest transaction open on the partition;
    /// `None` when none is (and under [`Semantics::Strict`]).
    pub fn first_unstable_offset(&self, partition: i32) -> Option<i64> {
        self.engine(|k| k.first_unstable_offset(partition))
            .flatten()
    }

    /// The partition's last stable offset for a log ending at
    /// `log_end_offset` (exclusive), as
    /// [`ProducerStateManager::last_stable_offset`].
    pub fn last_stable_offset(&self, partition: i32, log_end_offset: i64) -> i64 {
        self.first_unstable_offset(partition)
            .map_or(log_end_offset, |f| f.min(log_end_offset))
    }

    /// The partition's aborted transactions, in the order their markers
    /// came (empty under [`Semantics::Strict`]).
    pub fn aborted_transactions(&self, partition: i32) -> Vec<AbortedTxn> {
        self.engine(|k| k.aborted_transactions(partition).to_vec())
            .unwrap_or_default()
    }

    /// The partitions whose oldest open transaction is late at `now_ms`
    /// (hanging: no coordinator is going to end it), as
    /// [`ProducerStateManager::late_transactions`]; empty under
    /// [`Semantics::Strict`]. Each call also sets the gauge
    /// `producer_state_partitions_with_late_transactions` (Kafka's
    /// `PartitionsWithLateTransactionsCount`) to what it found, so a
    /// broker that checks periodically keeps the gauge current.
    pub fn late_transactions(
        &self,
        now_ms: i64,
        max_transaction_timeout_ms: i64,
    ) -> Vec<LateTransaction> {
        let late = self
            .engine(|k| k.late_transactions(now_ms, max_transaction_timeout_ms))
            .unwrap_or_default();
        self.shared.log.telemetry().late_transactions(late.len());
        late
    }

    /// The partition's producers as a Kafka `.snapshot` file holds them
    /// (each with its newest batch, timestamp, coordinator epoch and open
    /// transaction), as [`ProducerStateManager::kafka_snapshot_entries`];
    /// [`kafka::export_store`](crate::kafka::export_store) writes them as
    /// Kafka does.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under [`Semantics::Strict`] (export its
    /// entries with [`kafka::export`](crate::kafka::export)).
    pub fn kafka_snapshot_entries(
        &self,
        partition: i32,
    ) -> Result<Vec<crate::engine::kafka::entry::KafkaProducerEntry>> {
        self.engine(|k| k.kafka_snapshot_entries(partition))
            .unwrap_or(Err(Error::Unsupported {
                what: "Kafka's snapshot view",
                semantics: Semantics::Strict,
            }))
    }
}
