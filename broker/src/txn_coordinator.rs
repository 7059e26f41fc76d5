//! The transaction coordinator: transactional ids, their producer ids and
//! epochs, the partitions and groups of the transaction each has open, and
//! the transaction log that makes all of it durable.
//!
//! It follows Kafka's `TransactionCoordinator` and its state machine
//! (`TransactionState`): `Empty` -> `Ongoing` (AddPartitionsToTxn,
//! AddOffsetsToTxn) -> `PrepareCommit` / `PrepareAbort` (EndTxn) ->
//! `CompleteCommit` / `CompleteAbort` (every marker written) -> `Ongoing`
//! again with the next transaction. Every transition is appended to the
//! transaction log (`DIR/transactions.log`, a [`RecordsLog`]: the whole
//! state of the transactional id after it, as Kafka's `__transaction_state`
//! does) and made durable before anyone is answered.
//!
//! Where it differs from Kafka, and why:
//!
//! - EndTxn is answered once the markers are written, not once
//!   `PrepareCommit` is: this broker writes markers to its own partitions,
//!   in a few milliseconds, so a consumer that reads right after the commit
//!   returns sees it. An EndTxn acknowledged or not, whose `Prepare` record
//!   is durable, completes when the broker restarts ([`TxnCoordinator::recover`]).
//! - InitProducerId while a transaction is ongoing aborts it and returns
//!   the bumped epoch in the same call (Kafka starts the abort and answers
//!   `CONCURRENT_TRANSACTIONS` until it is done, and the client retries).
//! - One broker: the coordinator epoch is a counter kept in the log and
//!   bumped each time the log is opened, so markers written by an earlier
//!   run of the broker are older than this run's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};
use crate::records_log::{Malformed, Reader, RecordsLog, Writer};

/// Kafka's `transaction.max.timeout.ms` default: a longer
/// `transaction.timeout.ms` is refused.
pub const MAX_TIMEOUT_MS: i32 = 900_000;

/// Kafka error codes the coordinator answers with.
pub mod code {
    /// `INVALID_PRODUCER_EPOCH`.
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    /// `INVALID_TXN_STATE`.
    pub const INVALID_TXN_STATE: i16 = 48;
    /// `INVALID_PRODUCER_ID_MAPPING`.
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    /// `INVALID_TRANSACTION_TIMEOUT`.
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    /// `CONCURRENT_TRANSACTIONS`.
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    /// `PRODUCER_FENCED`.
    pub const PRODUCER_FENCED: i16 = 90;
    /// `INVALID_REQUEST`.
    pub const INVALID_REQUEST: i16 = 42;
    /// `KAFKA_STORAGE_ERROR`.
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    /// `UNKNOWN_SERVER_ERROR`.
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
}

/// Where a transactional id's transaction is (Kafka's `TransactionState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnState {
    /// No transaction since the producer id was handed out or bumped.
    Empty,
    /// Partitions or groups were added: a transaction is open.
    Ongoing,
    /// EndTxn(commit) is durable; markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a fence is durable; markers are being
    /// written.
    PrepareAbort,
    /// Every commit marker is written.
    CompleteCommit,
    /// Every abort marker is written.
    CompleteAbort,
}

impl TxnState {
    fn code(self) -> u8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
        }
    }

    fn from_code(c: u8) -> std::result::Result<TxnState, Malformed> {
        Ok(match c {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            _ => return Err("an unknown transaction state"),
        })
    }

    /// Kafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }
}

/// One transactional id's state: the record the transaction log holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMeta {
    /// The producer's `transactional.id`.
    pub transactional_id: String,
    /// The producer id it has.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
    /// Its `transaction.timeout.ms`.
    pub timeout_ms: i32,
    /// Where its transaction is.
    pub state: TxnState,
    /// The partitions in the transaction, (topic, partition).
    pub partitions: BTreeSet<(String, i32)>,
    /// The consumer groups whose offsets are in the transaction.
    pub groups: BTreeSet<String>,
    /// When the transaction began (the first partition or group added), ms.
    pub started_ms: i64,
}

const KIND_TXN: u8 = 1;
const KIND_EPOCH: u8 = 2;

impl TxnMeta {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(KIND_TXN);
        w.str(&self.transactional_id)
            .i64(self.producer_id)
            .i16(self.producer_epoch)
            .i32(self.timeout_ms)
            .u8(self.state.code())
            .i64(self.started_ms)
            .i32(self.partitions.len() as i32);
        for (t, p) in &self.partitions {
            w.str(t).i32(*p);
        }
        w.i32(self.groups.len() as i32);
        for g in &self.groups {
            w.str(g);
        }
        w.0
    }

    fn decode(r: &mut Reader<'_>) -> std::result::Result<TxnMeta, Malformed> {
        let transactional_id = r.str()?;
        let producer_id = r.i64()?;
        let producer_epoch = r.i16()?;
        let timeout_ms = r.i32()?;
        let state = TxnState::from_code(r.u8()?)?;
        let started_ms = r.i64()?;
        let mut partitions = BTreeSet::new();
        for _ in 0..r.count(8)? {
            partitions.insert((r.str()?, r.i32()?));
        }
        let mut groups = BTreeSet::new();
        for _ in 0..r.count(4)? {
            groups.insert(r.str()?);
        }
        Ok(TxnMeta {
            transactional_id,
            producer_id,
            producer_epoch,
            timeout_ms,
            state,
            partitions,
            groups,
            started_ms,
        })
    }
}

/// What ends a transaction: writing a marker to each of its partitions and
/// completing its groups' offsets. The broker implements it; the
/// coordinator decides when.
pub trait Markers {
    /// Writes a COMMIT (`commit`) or ABORT marker of producer
    /// `producer_id`/`producer_epoch` with `coordinator_epoch` to
    /// `topic`-`partition`, durably. `Err` with a reason when it could not
    /// (the partition is unknown or refuses writes): the transaction stays
    /// in its `Prepare` state and is tried again later.
    fn write_marker(
        &self,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> std::result::Result<(), String>;

    /// Makes the offsets producer `producer_id` committed to `group` within
    /// its transaction visible (`commit`) or drops them, durably.
    fn complete_offsets(
        &self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> std::result::Result<(), String>;
}

/// Who asks: a transactional id, the producer id and epoch it claims,
/// and the code to answer an epoch that is not the current one with
/// (`PRODUCER_FENCED` in request versions that know it,
/// `INVALID_PRODUCER_EPOCH` before).
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    /// The `transactional.id`.
    pub transactional_id: &'a str,
    /// The producer id it claims.
    pub producer_id: i64,
    /// The epoch it claims.
    pub epoch: i16,
    /// The code for an old epoch.
    pub fenced: i16,
}

/// The answer to InitProducerId.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Initialized {
    /// The producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
}

/// The coordinator: every transactional id's state and its log.
#[derive(Debug)]
pub struct TxnCoordinator {
    log: RecordsLog,
    txns: BTreeMap<String, TxnMeta>,
    coordinator_epoch: i32,
    view: Arc<TxnView>,
}

/// The ongoing transactions, readable without the coordinator's lock: what
/// a partition checks a transactional batch against while it holds its
/// own lock (KIP-890's verification of the write). The coordinator updates
/// it with every transition, and takes a transaction out of it (its
/// `Prepare` state) before it writes a single marker: a batch checked
/// under a partition's lock is therefore either in the transaction, before
/// its marker there, or refused. A check made before taking the partition
/// lock could pass, lose the race to the marker, and open a new
/// transaction after it that nothing would ever end.
#[derive(Debug, Default)]
pub struct TxnView {
    /// Every transactional id's producer id and epoch, with the partitions
    /// of its transaction while one is ongoing.
    ongoing: RwLock<HashMap<String, Current>>,
}

/// A transactional id's producer id, epoch, and the partitions of its
/// ongoing transaction (none when none is ongoing).
type Current = (i64, i16, Option<BTreeSet<(String, i32)>>);

impl TxnView {
    /// `Ok` if `producer_id`/`epoch` is `transactional_id`'s current
    /// producer and its ongoing transaction holds `topic`-`partition`;
    /// else the Kafka error: `INVALID_PRODUCER_EPOCH` for another epoch,
    /// `INVALID_TXN_STATE` otherwise.
    pub fn verify(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> std::result::Result<(), i16> {
        let ongoing = self.ongoing.read().unwrap_or_else(|p| p.into_inner());
        match ongoing.get(transactional_id) {
            Some((pid, e, parts)) if *pid == producer_id => {
                if *e != epoch {
                    Err(code::INVALID_PRODUCER_EPOCH)
                } else if parts
                    .as_ref()
                    .is_some_and(|p| p.contains(&(topic.to_string(), partition)))
                {
                    Ok(())
                } else {
                    Err(code::INVALID_TXN_STATE)
                }
            }
            _ => Err(code::INVALID_TXN_STATE),
        }
    }

    fn update(&self, m: &TxnMeta) {
        let mut ongoing = self.ongoing.write().unwrap_or_else(|p| p.into_inner());
        let parts = (m.state == TxnState::Ongoing).then(|| m.partitions.clone());
        ongoing.insert(
            m.transactional_id.clone(),
            (m.producer_id, m.producer_epoch, parts),
        );
    }
}

impl TxnCoordinator {
    /// Opens the transaction log at `path` and bumps the coordinator epoch.
    /// Transactions the log leaves in a `Prepare` state are completed by
    /// [`TxnCoordinator::recover`] once the partitions are open.
    pub fn open(path: &Path) -> Result<TxnCoordinator> {
        let (log, records) = RecordsLog::open(path)?;
        let mut txns = BTreeMap::new();
        let mut epoch = 0;
        for (i, rec) in records.iter().enumerate() {
            let bad = |reason: Malformed| Error::CorruptLog {
                path: path.to_path_buf(),
                pos: i as u64,
                reason: format!("record {i}: {reason}"),
            };
            let mut r = Reader(rec);
            match r.u8().map_err(bad)? {
                KIND_TXN => {
                    let m = TxnMeta::decode(&mut r).map_err(bad)?;
                    txns.insert(m.transactional_id.clone(), m);
                }
                KIND_EPOCH => epoch = r.i32().map_err(bad)?,
                _ => return Err(bad("an unknown record kind")),
            }
            if !r.done() {
                return Err(bad("bytes after the record"));
            }
        }
        let view = Arc::new(TxnView::default());
        for m in txns.values() {
            view.update(m);
        }
        let mut c = TxnCoordinator {
            log,
            txns,
            coordinator_epoch: epoch.saturating_add(1),
            view,
        };
        c.compact_if_due()?;
        let mut w = Writer::new(KIND_EPOCH);
        w.i32(c.coordinator_epoch);
        c.log.append(&[&w.0])?;
        Ok(c)
    }

    /// The coordinator epoch markers of this run carry.
    pub fn coordinator_epoch(&self) -> i32 {
        self.coordinator_epoch
    }

    /// A transactional id's state.
    pub fn get(&self, transactional_id: &str) -> Option<&TxnMeta> {
        self.txns.get(transactional_id)
    }

    /// Every transactional id's state.
    pub fn all(&self) -> impl Iterator<Item = &TxnMeta> {
        self.txns.values()
    }

    /// The ongoing transactions, for checks made without this lock.
    pub fn view(&self) -> Arc<TxnView> {
        self.view.clone()
    }

    fn write(&mut self, m: TxnMeta) -> Result<()> {
        self.log.append(&[&m.encode()])?;
        self.view.update(&m);
        self.txns.insert(m.transactional_id.clone(), m);
        self.compact_if_due()
    }

    /// Rewrites the log with the live records once it holds many more.
    fn compact_if_due(&mut self) -> Result<()> {
        if self.log.records() <= 2 * self.txns.len() as u64 + 1024 {
            return Ok(());
        }
        let mut live: Vec<Vec<u8>> = self.txns.values().map(TxnMeta::encode).collect();
        let mut w = Writer::new(KIND_EPOCH);
        w.i32(self.coordinator_epoch);
        live.push(w.0);
        self.log.rewrite(&live)
    }

    /// InitProducerId with a transactional id: a new producer id at epoch
    /// 0 for a new id; otherwise the id's producer id at the next epoch
    /// (a new producer id once the epoch is exhausted), which fences every
    /// earlier instance. A transaction still open is aborted first.
    /// `new_id` hands out a producer id (the broker's durable allocator).
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        timeout_ms: i32,
        markers: &dyn Markers,
        new_id: &mut dyn FnMut() -> Result<i64>,
    ) -> std::result::Result<Initialized, i16> {
        if transactional_id.is_empty() {
            return Err(code::INVALID_REQUEST);
        }
        if timeout_ms <= 0 || timeout_ms > MAX_TIMEOUT_MS {
            return Err(code::INVALID_TRANSACTION_TIMEOUT);
        }
        let storage = |e: Error| {
            tracing::error!(error = %e, "the transaction log failed");
            code::KAFKA_STORAGE_ERROR
        };
        let next = match self.txns.get(transactional_id).cloned() {
            None => TxnMeta {
                transactional_id: transactional_id.to_string(),
                producer_id: new_id().map_err(storage)?,
                producer_epoch: 0,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                groups: BTreeSet::new(),
                started_ms: -1,
            },
            Some(mut m) => {
                if m.state == TxnState::Ongoing {
                    // The new instance fences the old one: abort what it
                    // left open, at the old epoch.
                    m = self.end(m, false, markers, "a new instance of the producer")?;
                } else if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
                    let commit = m.state == TxnState::PrepareCommit;
                    m = self.finish(m, commit, markers)?;
                }
                let (producer_id, producer_epoch) = if m.producer_epoch >= i16::MAX - 1 {
                    (new_id().map_err(storage)?, 0)
                } else {
                    (m.producer_id, m.producer_epoch + 1)
                };
                TxnMeta {
                    producer_id,
                    producer_epoch,
                    timeout_ms,
                    state: TxnState::Empty,
                    partitions: BTreeSet::new(),
                    groups: BTreeSet::new(),
                    started_ms: -1,
                    ..m
                }
            }
        };
        let answer = Initialized {
            producer_id: next.producer_id,
            producer_epoch: next.producer_epoch,
        };
        self.write(next).map_err(storage)?;
        Ok(answer)
    }

    /// The state of the caller's transactional id if the caller is its
    /// current producer; otherwise the error Kafka answers with.
    fn current(&self, c: &Caller<'_>) -> std::result::Result<TxnMeta, i16> {
        let m = self
            .txns
            .get(c.transactional_id)
            .ok_or(code::INVALID_PRODUCER_ID_MAPPING)?;
        if m.producer_id != c.producer_id {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        if m.producer_epoch != c.epoch {
            return Err(c.fenced);
        }
        Ok(m.clone())
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn: adds `partitions` and `groups`
    /// to the producer's transaction, opening it if none is.
    pub fn add(
        &mut self,
        caller: &Caller<'_>,
        partitions: &[(String, i32)],
        groups: &[String],
        now_ms: i64,
    ) -> std::result::Result<(), i16> {
        let transactional_id = caller.transactional_id;
        let mut m = self.current(caller)?;
        match m.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                return Err(code::CONCURRENT_TRANSACTIONS);
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                m.state = TxnState::Ongoing;
                m.partitions.clear();
                m.groups.clear();
                m.started_ms = now_ms;
            }
            TxnState::Ongoing => {}
        }
        let before = (m.partitions.len(), m.groups.len(), m.state);
        m.partitions.extend(partitions.iter().cloned());
        m.groups.extend(groups.iter().cloned());
        let changed = self.txns.get(transactional_id).map(|o| o.state) != Some(TxnState::Ongoing)
            || before != (m.partitions.len(), m.groups.len(), m.state);
        if changed {
            self.write(m).map_err(|e| {
                tracing::error!(error = %e, "the transaction log failed");
                code::KAFKA_STORAGE_ERROR
            })?;
        }
        Ok(())
    }

    /// Whether the caller's ongoing transaction holds `group`'s offsets
    /// (AddOffsetsToTxn came first): what TxnOffsetCommit requires.
    pub fn in_transaction(&self, caller: &Caller<'_>, group: &str) -> std::result::Result<(), i16> {
        let m = self.current(caller)?;
        if m.state == TxnState::Ongoing && m.groups.contains(group) {
            Ok(())
        } else {
            Err(code::INVALID_TXN_STATE)
        }
    }

    /// Whether a transactional batch of `producer_id`/`epoch` for
    /// `topic`-`partition` belongs to an ongoing transaction that holds
    /// the partition (KIP-890's verification of the write).
    pub fn verify(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> std::result::Result<(), i16> {
        self.view
            .verify(transactional_id, producer_id, epoch, topic, partition)
    }

    /// EndTxn: commits or aborts the producer's transaction: `Prepare`
    /// durable, every marker written, `Complete` durable.
    pub fn end_txn(
        &mut self,
        caller: &Caller<'_>,
        commit: bool,
        markers: &dyn Markers,
    ) -> std::result::Result<(), i16> {
        let m = self.current(caller)?;
        match (m.state, commit) {
            (TxnState::Ongoing, _) => {
                self.end(m, commit, markers, "EndTxn")?;
                Ok(())
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(()),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                // A retry while the markers failed before: try them again.
                self.finish(m, commit, markers).map(|_| ())
            }
            _ => Err(code::INVALID_TXN_STATE),
        }
    }

    /// Prepares and finishes the end of an ongoing transaction.
    fn end(
        &mut self,
        mut m: TxnMeta,
        commit: bool,
        markers: &dyn Markers,
        why: &str,
    ) -> std::result::Result<TxnMeta, i16> {
        m.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        tracing::info!(
            transactional_id = %m.transactional_id, producer_id = m.producer_id,
            epoch = m.producer_epoch, partitions = m.partitions.len(), groups = m.groups.len(),
            commit, why, "ending a transaction"
        );
        self.write(m.clone()).map_err(|e| {
            tracing::error!(error = %e, "the transaction log failed");
            code::KAFKA_STORAGE_ERROR
        })?;
        self.finish(m, commit, markers)
    }

    /// Writes the markers of a prepared transaction and completes it.
    fn finish(
        &mut self,
        mut m: TxnMeta,
        commit: bool,
        markers: &dyn Markers,
    ) -> std::result::Result<TxnMeta, i16> {
        for (topic, partition) in &m.partitions {
            if let Err(why) = markers.write_marker(
                topic,
                *partition,
                m.producer_id,
                m.producer_epoch,
                commit,
                self.coordinator_epoch,
            ) {
                tracing::error!(
                    transactional_id = %m.transactional_id, %topic, partition, reason = %why,
                    "writing a transaction marker failed; the transaction stays prepared"
                );
                return Err(code::KAFKA_STORAGE_ERROR);
            }
        }
        for group in &m.groups {
            if let Err(why) = markers.complete_offsets(group, m.producer_id, commit) {
                tracing::error!(
                    transactional_id = %m.transactional_id, %group, reason = %why,
                    "completing a transaction's offsets failed; the transaction stays prepared"
                );
                return Err(code::KAFKA_STORAGE_ERROR);
            }
        }
        m.state = if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        self.write(m.clone()).map_err(|e| {
            tracing::error!(error = %e, "the transaction log failed");
            code::KAFKA_STORAGE_ERROR
        })?;
        Ok(m)
    }

    /// Completes every transaction the log left prepared (a crash between
    /// `Prepare` and `Complete`). Returns how many; those that still fail
    /// stay prepared for the next call.
    pub fn recover(&mut self, markers: &dyn Markers) -> usize {
        let prepared: Vec<TxnMeta> = self
            .txns
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .cloned()
            .collect();
        let mut done = 0;
        for m in prepared {
            let commit = m.state == TxnState::PrepareCommit;
            if self.finish(m, commit, markers).is_ok() {
                done += 1;
            }
        }
        done
    }

    /// Aborts every ongoing transaction older than its timeout at `now_ms`,
    /// bumping the producer's epoch first (as Kafka does), so that the
    /// abandoned producer is fenced. Returns the transactional ids aborted.
    pub fn abort_expired(&mut self, now_ms: i64, markers: &dyn Markers) -> Vec<String> {
        let expired: Vec<TxnMeta> = self
            .txns
            .values()
            .filter(|m| {
                m.state == TxnState::Ongoing
                    && now_ms.saturating_sub(m.started_ms) > i64::from(m.timeout_ms)
            })
            .cloned()
            .collect();
        let mut aborted = Vec::new();
        for mut m in expired {
            if m.producer_epoch < i16::MAX - 1 {
                m.producer_epoch += 1;
            }
            let id = m.transactional_id.clone();
            tracing::warn!(
                transactional_id = %id, producer_id = m.producer_id, timeout_ms = m.timeout_ms,
                "aborting a transaction past its transaction.timeout.ms"
            );
            if self
                .end(m, false, markers, "transaction.timeout.ms")
                .is_ok()
            {
                aborted.push(id);
            }
        }
        aborted
    }
}

#[cfg(test)]
#[path = "txn_coordinator_tests.rs"]
mod tests;
