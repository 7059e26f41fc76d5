//! One partition: its log, its producer state, and the produce path that
//! keeps the two in agreement.
//!
//! # One store for every partition
//!
//! Every partition's producer state lives in one [`ProducerStateStore`],
//! `DIR/state/`, shared by the whole data directory: the partition with
//! catalog key `k` ([`crate::catalog`]) is the store's partition `k`. A
//! partition costs its log file and an entry in the store's maps, and no
//! thread, buffer or preallocated segment of its own: the store's flusher
//! and snapshot threads, and its log's fsyncs, serve all partitions. (Up
//! to this version each partition had a store of its own: 64 MiB of
//! preallocated log and three to four threads each, which bounded the
//! broker to tens of partitions.)
//!
//! What one store for many logs needs from the store is that each
//! partition can be followed on its own: where its state ends
//! ([`ProducerStateStore::partition_end_offset`]) and how to take it back
//! when its log is cut ([`ProducerStateStore::truncate_partition_to`]),
//! while the other partitions keep theirs.
//!
//! # The produce path and the order of durable writes
//!
//! The partition log is the source of truth; the producer state is derived
//! from it and may lag behind it. Under the partition's lock, held from the
//! decision to the end of the log's `fdatasync`, so batches of one
//! partition are classified and written one at a time:
//!
//! 1. the offset the batch would get is the log's next offset;
//! 2. `append_batch` classifies it; if `ACCEPTED`, the state now knows the
//!    batch at that offset (in memory: the store runs with
//!    [`FsyncPolicy::Interval`], so its record reaches the disk within
//!    [`STATE_FSYNC_INTERVAL`], not before the answer);
//! 3. the batch is written to the partition log and `fdatasync`'ed;
//! 4. only then is the client answered.
//!
//! The state decides first: a batch must not reach the log before it is
//! known to be no duplicate. Its durability is not needed for the answer,
//! because recovery can derive it from the log: only the log's `fdatasync`
//! is on the produce path.
//!
//! A `DUPLICATE` is an acknowledgement too, and it is answered from the
//! in-memory state, which learns of a batch before the batch is durable.
//! Holding the lock through step 3 is what makes that safe: a retry racing
//! its original (a new connection after a dropped one) waits for the lock,
//! so it is classified only once the original is durable, or once the
//! partition refuses everything because the original's write failed. The
//! log's fsync must therefore never move out of the lock (to batch fsyncs
//! across requests, say) without the duplicates waiting for it too. After a
//! restart the same holds because opening the log `fdatasync`s what it
//! found ([`crate::plog`]).
//!
//! # Recovery: the state brought exactly to the log
//!
//! Both are prefixes of one history (the accepted batches in log order), so
//! after a crash a partition's state is either *behind* its log (its newest
//! records were not yet on disk: the common case) or *ahead* of it (its
//! records were flushed, the log's write was not done). On open:
//!
//! - *behind*: every idempotent batch of the log past the partition's end
//!   in the state ([`ProducerStateStore::partition_end_offset`]) is
//!   appended to the state again, in order, each of which must be
//!   `ACCEPTED` (anything else means the state is not a prefix of this log,
//!   and it is rebuilt). O(batches behind), read through the log's index;
//! - then the agreement check: the newest batch each producer has in the
//!   log must be exactly what the state holds as that producer's newest
//!   (epoch, last sequence, offset), the state must know no producer the
//!   log lacks (one the state expired itself is fine: the log still has
//!   its batches) and no batch at or past the log's end. O(the partition's
//!   producers);
//! - *ahead*: the partition's state is cut back to the log's end with
//!   [`ProducerStateStore::truncate_partition_to`], which reads a snapshot
//!   and the store's log after it, not this partition's whole log. A state
//!   left ahead would answer the client's retry of the lost batch with
//!   `DUPLICATE` and an offset the log never had, losing an acknowledged
//!   message;
//! - any other disagreement (a state directory replaced, say), or a
//!   truncation that cannot reach back (`TruncateBelowHistory`): the
//!   partition's state is removed ([`ProducerStateStore::remove_partition`],
//!   one logged group) and rebuilt from its whole log, O(log). A crash in
//!   the middle leaves it behind or as it was, and the next open goes on.
//!
//! A write or fsync failure of either file poisons the partition: it answers
//! `KAFKA_STORAGE_ERROR` until the broker restarts and recovery makes the
//! two agree again (a failed fsync is never retried).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use producer_state::{
    AppendOptions, Batch, BatchOutcome, FsyncPolicy, Marker, Origin, ProducerId,
    ProducerStateStore, Semantics, StoreOptions,
};

use crate::batch::{self, BatchHeader, ControlMarker};
use crate::error::{Error, Result};
use crate::plog::{PartitionLog, ReadRange, sync_dir};

/// The log's file name inside the partition directory.
pub const LOG_FILE: &str = "00000000000000000000.log";
/// What a partition directory held when each partition had a store of its
/// own: removed once the shared store has caught up with the log.
const LEGACY_STATE: [&str; 3] = ["state", "state.rebuild", "state.old"];

/// What a produce of one batch came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Produced {
    /// Written to the log at this base offset.
    Appended {
        /// Offset of the batch's first record.
        base_offset: i64,
    },
    /// A retry of a batch already in the log: answered with its offset.
    Duplicate {
        /// The original batch's base offset.
        base_offset: i64,
    },
    /// Refused with a Kafka error code.
    Refused {
        /// The Kafka error code.
        code: i16,
        /// Why, for the log and the response's error message.
        message: String,
    },
}

/// What a log says of one producer at its end: its newest epoch (of a
/// data batch or a marker) and its newest data batch (epoch, last
/// sequence, offset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LastBatch {
    epoch: i16,
    data: Option<(i16, i32, i64)>,
}

impl LastBatch {
    /// Notes a batch of the log (data or control) of this producer.
    fn note(&mut self, h: &BatchHeader) {
        self.epoch = h.producer_epoch;
        if !h.is_control() {
            self.data = Some((h.producer_epoch, h.last_sequence(), h.base_offset));
        }
    }
}

struct Inner {
    log: PartitionLog,
    failed: Option<String>,
}

/// One partition of a topic.
pub struct Partition {
    name: String,
    /// The partition's key in the shared store ([`crate::catalog`]).
    key: i32,
    store: Arc<ProducerStateStore>,
    inner: Mutex<Inner>,
    timings: Timings,
}

/// Where the produce path's time goes, summed over batches (nanoseconds).
#[derive(Debug, Default)]
pub struct Timings {
    /// Batches through [`Partition::produce`].
    pub batches: AtomicU64,
    /// In `append_batch` (classification and handing the state's record to
    /// its buffer; the store's own thread fsyncs it).
    pub state_ns: AtomicU64,
    /// In the partition log's write and fdatasync.
    pub log_ns: AtomicU64,
    /// In [`Partition::produce`] in all (parsing, the lock, both writes).
    pub total_ns: AtomicU64,
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("name", &self.name)
            .finish()
    }
}

/// How long the producer state may keep records unsynced. A crash loses
/// at most about this much of the state, which opening then replays from
/// the log; the longer, the fewer fsyncs compete with the log's.
pub const STATE_FSYNC_INTERVAL: Duration = Duration::from_secs(1);

/// What opening a partition found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Bytes cut from a torn log tail.
    pub torn_bytes: u64,
    /// Batches of the log appended to a state that was behind it.
    pub replayed: u64,
    /// Why the producer state was cut back to the log's end (it was ahead
    /// of it), if it was.
    pub truncated: Option<String>,
    /// Why the producer state was rebuilt from the log, if it was.
    pub rebuilt: Option<String>,
    /// The highest producer id in the log (-1: none).
    pub max_producer_id: i64,
}

/// Kafka's `producer.id.expiration.ms` default: a producer without an
/// open transaction whose newest batch is a day old (by the batch's
/// timestamp, as in Kafka) is forgotten by the sweep that runs every 10
/// minutes (`producer.id.expiration.check.interval.ms`).
pub const PRODUCER_ID_EXPIRATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The options of the shared producer state: Kafka's rules
/// (`Semantics::Kafka`: Kafka's verdicts, transactions, markers and the
/// last stable offset), fsync'ed in the background ([`STATE_FSYNC_INTERVAL`]),
/// producers expiring after `expiration` (`producer.id.expiration.ms`;
/// `Semantics::Kafka` alone turns expiration off, so it is set after).
pub fn state_options(expiration: Duration) -> StoreOptions {
    StoreOptions::default()
        .fsync(FsyncPolicy::Interval(STATE_FSYNC_INTERVAL))
        .semantics(Semantics::Kafka)
        .producer_expiration(Some(expiration))
}

/// Opens the data directory's shared producer state (`DIR/state`). A
/// state written under the strict rules (a broker before Kafka mode) is
/// derived data: it is moved aside to `state.strict-<millis>` and every
/// partition replays its log into a new one.
pub fn open_state(dir: &Path, expiration: Duration) -> Result<ProducerStateStore> {
    let path = dir.join("state");
    let state_err = |source| Error::State {
        partition: "(all)".into(),
        source,
    };
    match ProducerStateStore::open_with(&path, state_options(expiration)) {
        Err(producer_state::Error::SemanticsMismatch { .. }) => {
            let aside = dir.join(format!("state.strict-{}", crate::now_ms()));
            tracing::warn!(from = %path.display(), to = %aside.display(), "the producer state was written under other rules; moved aside, the partition logs are replayed");
            fs::rename(&path, &aside).map_err(|e| Error::io("rename", &path, e))?;
            sync_dir(dir)?;
            ProducerStateStore::open_with(&path, state_options(expiration)).map_err(state_err)
        }
        other => other.map_err(state_err),
    }
}

/// The producers the shared state knows, by partition key: read once when
/// the broker opens, so each partition's agreement check costs its own
/// producers, not the store's.
pub fn known_producers(store: &ProducerStateStore) -> HashMap<i32, Vec<ProducerId>> {
    let mut out: HashMap<i32, Vec<ProducerId>> = HashMap::new();
    for (id, p, _) in store.iter() {
        out.entry(p).or_default().push(id);
    }
    out
}

/// Applies a batch read back from the partition log (`h`, its bytes
/// `bytes`) to `store` as partition `key`, at the offset the log gave it,
/// as Kafka's log recovery does (the replication origin: what the log
/// holds was accepted once): a data batch with its transactional flag, a
/// control batch as its COMMIT or ABORT marker. `None` for a batch that
/// carries no producer state (not idempotent, or a control batch of
/// another kind).
fn append_logged(
    store: &ProducerStateStore,
    h: &BatchHeader,
    bytes: &[u8],
    name: &str,
    key: i32,
) -> Result<Option<std::result::Result<(), String>>> {
    if !h.is_idempotent() {
        return Ok(None);
    }
    let Ok(producer_id) = ProducerId::try_from(h.producer_id) else {
        return Ok(None);
    };
    let state = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    if h.is_control() {
        let Some(m) = batch::control_marker(bytes) else {
            return Ok(None);
        };
        let marker = marker_at(m, h.base_offset, h.max_timestamp);
        let outcome = store
            .append_marker(
                producer_id,
                key,
                h.producer_epoch,
                marker,
                Origin::Replication,
            )
            .map_err(state)?;
        return Ok(Some(if outcome.is_accepted() {
            Ok(())
        } else {
            Err(outcome.to_string())
        }));
    }
    let mut options = AppendOptions::replication();
    if h.is_transactional() {
        options = options.transactional().verified();
    }
    let outcome = store
        .append_with(
            producer_id,
            key,
            h.producer_epoch,
            to_batch(h, h.base_offset),
            options,
        )
        .map_err(state)?;
    Ok(Some(if outcome.is_accepted() {
        Ok(())
    } else {
        Err(outcome.to_string())
    }))
}

/// The library's marker for a control record at `offset`.
fn marker_at(m: ControlMarker, offset: i64, timestamp: i64) -> Marker {
    if m.commit {
        Marker::commit(m.coordinator_epoch, offset, timestamp)
    } else {
        Marker::abort(m.coordinator_epoch, offset, timestamp)
    }
}

/// Applies to `store` every idempotent batch of `log` past `after`, in
/// order: `Ok(Ok(n))` when each applied, `Ok(Err(why))` at the first that
/// did not (the state is not a prefix of this log).
fn replay(
    store: &ProducerStateStore,
    log: &PartitionLog,
    after: i64,
    name: &str,
    key: i32,
) -> Result<std::result::Result<u64, String>> {
    let mut n = 0u64;
    let mut refused = None;
    log.for_each_batch_after(after, |h, bytes| {
        if refused.is_some() {
            return Ok(());
        }
        match append_logged(store, h, bytes, name, key)? {
            None => {}
            Some(Ok(())) => n += 1,
            Some(Err(outcome)) => {
                refused = Some(format!(
                    "replaying the log past offset {after}: the batch at offset {} was {outcome}",
                    h.base_offset
                ));
            }
        }
        Ok(())
    })?;
    Ok(refused.map_or(Ok(n), Err))
}

/// Why the partition's state and its log disagree, or `None` if they
/// agree: every producer the state knows (`known`, and those of the log)
/// must be at the log's newest epoch for it, with the log's newest data
/// batch as its newest cached batch (or, with none cached, an epoch the
/// marker that bumped it set), and nothing at or past the log's end; a
/// producer of the log the state does not know must be one the state
/// removed itself (expired: `was_removed`).
fn disagreement(
    store: &ProducerStateStore,
    key: i32,
    known: &[ProducerId],
    log_last: &HashMap<i64, LastBatch>,
    log_end: i64,
) -> Option<String> {
    let mut ids: BTreeSet<i64> = log_last.keys().copied().collect();
    for id in known {
        match id.as_numeric().and_then(|p| i64::try_from(p).ok()) {
            Some(pid) => ids.insert(pid),
            None => {
                return Some(format!(
                    "the state holds producer {id}, which no Kafka client has"
                ));
            }
        };
    }
    for pid in ids {
        let Ok(id) = u64::try_from(pid) else { continue };
        let Some(st) = store.kafka_state(id, key) else {
            if log_last.contains_key(&pid) && !store.was_removed(id, key) {
                return Some(format!(
                    "the log has producer {pid}, which the state does not know and did not expire"
                ));
            }
            continue;
        };
        let newest = st
            .batches
            .last()
            .and_then(|b| b.metadata.map(|m| (st.epoch, b.last_sequence, m.offset)));
        if let Some((_, _, offset)) = newest
            && offset >= log_end
        {
            return Some(format!(
                "the state is ahead of the log: producer {pid} has a batch at offset {offset}, \
                 the log ends at {log_end}"
            ));
        }
        let Some(l) = log_last.get(&pid) else {
            return Some(format!("the state knows producer {pid}, the log does not"));
        };
        let agrees = l.epoch == st.epoch
            && match newest {
                Some(n) => l.data == Some(n),
                None => l.data.is_none_or(|(epoch, _, _)| epoch < st.epoch),
            };
        if !agrees {
            return Some(format!(
                "producer {pid}: the state's newest batch is {newest:?} at epoch {}, the log's {l:?}",
                st.epoch
            ));
        }
    }
    None
}

fn to_batch(h: &BatchHeader, offset: i64) -> Batch {
    Batch::new(h.base_sequence, h.last_sequence(), offset, h.max_timestamp)
}

/// Rebuilds the partition's state from its whole log: the partition is
/// removed from the shared state (one logged group), then every batch of
/// the log is appended, in order. A crash part-way leaves the state as it
/// was (the removal not durable) or behind the log, and the next open
/// rebuilds again or catches up. O(log).
fn rebuild(store: &ProducerStateStore, log_path: &Path, name: &str, key: i32) -> Result<()> {
    let state_err = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    store.remove_partition(key).map_err(state_err)?;
    PartitionLog::for_each_batch(log_path, |h, bytes| {
        match append_logged(store, h, bytes, name, key)? {
            None | Some(Ok(())) => Ok(()),
            Some(Err(outcome)) => Err(Error::Rebuild {
                partition: name.to_string(),
                offset: h.base_offset,
                outcome,
            }),
        }
    })
}

/// Removes the per-partition state directories a broker before the shared
/// state left in `dir` (derived data: the shared state has caught up with
/// the log when this runs, and is made durable first by the caller).
pub fn remove_legacy_state(dir: &Path) -> Result<bool> {
    let mut removed = false;
    for name in LEGACY_STATE {
        let path = dir.join(name);
        match fs::remove_dir_all(&path) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &path, e)),
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(removed)
}

impl Partition {
    /// Opens partition `index` of `topic` in `dir` (created if missing),
    /// whose state is partition `key` of the shared `store` (`known`: the
    /// producers the store knew of it when the broker opened): recovers the
    /// log, then makes the partition's state agree with it.
    pub fn open(
        dir: &Path,
        (topic, index, key): (&str, i32, i32),
        store: &Arc<ProducerStateStore>,
        known: &[ProducerId],
    ) -> Result<(Partition, OpenReport)> {
        let name = format!("{topic}-{index}");
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let log_path = dir.join(LOG_FILE);
        let mut report = OpenReport {
            max_producer_id: -1,
            ..OpenReport::default()
        };
        let mut log_last: HashMap<i64, LastBatch> = HashMap::new();
        let (log, torn) = PartitionLog::open(&log_path, |h, _| {
            if h.is_idempotent() {
                log_last.entry(h.producer_id).or_default().note(h);
                report.max_producer_id = report.max_producer_id.max(h.producer_id);
            }
            Ok(())
        })?;
        if let Some(t) = &torn {
            tracing::warn!(
                partition = %name, pos = t.pos, bytes = t.bytes, saved_to = %t.saved_to.display(),
                reason = %t.reason, "cut a torn tail from the partition log"
            );
            report.torn_bytes = t.bytes;
        }
        let state_err = |source| Error::State {
            partition: name.clone(),
            source,
        };
        // Behind: catch up with the log. Nothing to replay when the state
        // agrees or is ahead (its end is then past the log's newest
        // batch, or past the log's end).
        let end = store.partition_end_offset(key) - 1;
        let refused = match replay(store, &log, end, &name, key)? {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(partition = %name, batches = n, after = end, "replayed the partition log into the producer state, which was behind it");
                }
                report.replayed = n;
                None
            }
            Err(why) => Some(why),
        };
        let log_end = log.next_offset();
        let mut why = refused.or_else(|| disagreement(store, key, known, &log_last, log_end));
        // Ahead: cut the partition's state back to the log's end.
        if let Some(w) = &why
            && store.partition_end_offset(key) > log_end
        {
            match store.truncate_partition_to(key, log_end) {
                Ok(()) => {
                    let now: Vec<ProducerId> = store
                        .kafka_producers(key)
                        .into_iter()
                        .map(|(id, _)| id)
                        .collect();
                    match disagreement(store, key, &now, &log_last, log_end) {
                        None => {
                            tracing::warn!(partition = %name, reason = %w, to = log_end, "the producer state was ahead of the partition log; truncated it to the log's end");
                            report.truncated = Some(w.clone());
                            why = None;
                        }
                        Some(still) => why = Some(format!("{w}; truncated to {log_end}: {still}")),
                    }
                }
                Err(producer_state::Error::TruncateBelowHistory { lowest, .. }) => {
                    why = Some(format!("{w}; truncation reaches back to {lowest} only"));
                }
                Err(e) => return Err(state_err(e)),
            }
        }
        if let Some(why) = why {
            tracing::warn!(partition = %name, reason = %why, "rebuilding the producer state from the partition log");
            rebuild(store, &log_path, &name, key)?;
            let now: Vec<ProducerId> = store
                .kafka_producers(key)
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            if let Some(still) = disagreement(store, key, &now, &log_last, log_end) {
                return Err(Error::Rebuild {
                    partition: name,
                    offset: log_end,
                    outcome: format!("a rebuilt state that still disagrees: {still}"),
                });
            }
            report.rebuilt = Some(why);
        }
        tracing::debug!(
            partition = %name, next_offset = log_end, producers = log_last.len(),
            "partition open"
        );
        Ok((
            Partition {
                name,
                key,
                store: store.clone(),
                inner: Mutex::new(Inner { log, failed: None }),
                timings: Timings::default(),
            },
            report,
        ))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `topic-index`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Produces one record batch (the bytes of one partition of a produce
    /// request): classifies it in the producer state, and if accepted
    /// writes it to the log and makes it durable. Blocks on an fsync: call
    /// it off the async runtime's worker threads.
    pub fn produce(&self, bytes: &mut [u8]) -> Produced {
        self.produce_as(bytes, None)
    }

    /// [`Partition::produce`] of a transactional batch, with `verify`: the
    /// transaction coordinator's check that the batch's producer added this
    /// partition to its ongoing transaction (KIP-890), run under the
    /// partition's lock, so that no marker of that transaction can come
    /// between the check and the write. Refused with the check's error
    /// code when it fails.
    pub fn produce_verified(
        &self,
        bytes: &mut [u8],
        verify: &dyn Fn() -> std::result::Result<(), i16>,
    ) -> Produced {
        let start = Instant::now();
        let produced = self.produce_timed(bytes, Some(verify));
        self.timings.batches.fetch_add(1, Ordering::Relaxed);
        add_elapsed(&self.timings.total_ns, start);
        produced
    }

    fn produce_as(
        &self,
        bytes: &mut [u8],
        verify: Option<&dyn Fn() -> std::result::Result<(), i16>>,
    ) -> Produced {
        let start = Instant::now();
        let produced = self.produce_timed(bytes, verify);
        self.timings.batches.fetch_add(1, Ordering::Relaxed);
        add_elapsed(&self.timings.total_ns, start);
        produced
    }

    /// Where this partition's produce time went.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// The partition's key in the shared producer state.
    pub fn key(&self) -> i32 {
        self.key
    }

    /// The producers the partition's state holds, by id, as
    /// DescribeProducers (KIP-664) lists them. Producer ids are the
    /// broker's (numeric, below 2^63).
    pub fn producers(&self) -> Vec<(i64, producer_state::KafkaProducerState)> {
        self.store
            .kafka_producers(self.key)
            .into_iter()
            .filter_map(|(id, st)| Some((i64::try_from(id.as_numeric()?).ok()?, st)))
            .collect()
    }

    fn produce_timed(
        &self,
        bytes: &mut [u8],
        verify: Option<&dyn Fn() -> std::result::Result<(), i16>>,
    ) -> Produced {
        let refuse = |e: ResponseError, message: String| Produced::Refused {
            code: e.code(),
            message,
        };
        let h = match batch::parse(bytes) {
            Ok(h) => h,
            // Kafka: a count that disagrees with the offsets is an invalid
            // record (`LogValidator.validateBatch`); damage is corruption.
            Err(e @ batch::BatchError::BadCount { .. }) => {
                return refuse(ResponseError::InvalidRecord, e.to_string());
            }
            Err(e) => return refuse(ResponseError::CorruptMessage, e.to_string()),
        };
        if h.is_idempotent() && h.base_sequence < 0 {
            return refuse(
                ResponseError::InvalidRecord,
                format!(
                    "invalid sequence number {} in a batch of producer {}",
                    h.base_sequence, h.producer_id
                ),
            );
        }
        if h.size != bytes.len() {
            return refuse(
                ResponseError::InvalidRecord,
                "a produce request must hold exactly one record batch per partition".into(),
            );
        }
        if h.is_control() {
            return refuse(
                ResponseError::InvalidRecord,
                "clients may not write control records".into(),
            );
        }
        if h.is_transactional() && !h.is_idempotent() {
            return refuse(
                ResponseError::InvalidRecord,
                "a transactional batch without a producer id".into(),
            );
        }
        let mut inner = self.lock();
        if let Some(f) = &inner.failed {
            return refuse(ResponseError::KafkaStorageError, f.clone());
        }
        if h.is_idempotent() {
            let offset = inner.log.next_offset();
            let t = Instant::now();
            let Ok(producer_id) = ProducerId::try_from(h.producer_id) else {
                return refuse(
                    ResponseError::InvalidRecord,
                    format!("producer id {} is negative", h.producer_id),
                );
            };
            let mut options = AppendOptions::client();
            if h.is_transactional() {
                options = options.transactional();
                match verify.map(|v| v()) {
                    Some(Ok(())) => options = options.verified(),
                    Some(Err(code)) => {
                        // As in Kafka, the verification began before the
                        // coordinator answered, and its state outlives the
                        // refusal (KIP-890): the producer's higher
                        // sequences are refused until an append succeeds.
                        let _ = self.store.start_transaction_verification(
                            producer_id.clone(),
                            self.key,
                            h.producer_epoch,
                            h.base_sequence,
                        );
                        return Produced::Refused {
                            code,
                            message: "the partition is not in the producer's ongoing transaction"
                                .into(),
                        };
                    }
                    None => {}
                }
            }
            let outcome = self.store.append_with(
                producer_id,
                self.key,
                h.producer_epoch,
                to_batch(&h, offset),
                options,
            );
            add_elapsed(&self.timings.state_ns, t);
            match outcome {
                Ok(BatchOutcome::Accepted) => {}
                Ok(BatchOutcome::Duplicate {
                    original: Some(original),
                }) => {
                    return Produced::Duplicate {
                        base_offset: original.offset,
                    };
                }
                Ok(o @ BatchOutcome::Duplicate { original: None }) => {
                    return refuse(ResponseError::DuplicateSequenceNumber, o.to_string());
                }
                // Kafka's error for each refusal (out of order, fenced,
                // invalid transaction state, invalid record); an outcome
                // a newer producer-state may add is refused rather than
                // guessed at.
                Ok(o) => {
                    let code = o.kafka_error().map_or(-1, |e| e.code());
                    return Produced::Refused {
                        code,
                        message: o.to_string(),
                    };
                }
                Err(e) => {
                    let msg = format!("producer state of {}: {e}", self.name);
                    tracing::error!(partition = %self.name, error = %e, "producer state write failed; partition refuses produce until restart");
                    inner.failed = Some(msg.clone());
                    return refuse(ResponseError::KafkaStorageError, msg);
                }
            }
        }
        let t = Instant::now();
        let appended = inner.log.append(bytes, &h);
        add_elapsed(&self.timings.log_ns, t);
        match appended {
            Ok(base_offset) => Produced::Appended { base_offset },
            Err(e) => {
                let msg = format!("partition log {}: {e}", inner.log.path().display());
                tracing::error!(partition = %self.name, error = %e, "partition log write failed; partition refuses produce until restart");
                inner.failed = Some(msg.clone());
                refuse(ResponseError::KafkaStorageError, msg)
            }
        }
    }

    /// The offset the next batch gets (the high watermark: everything below
    /// it is durable).
    pub fn high_watermark(&self) -> i64 {
        self.lock().log.next_offset()
    }

    /// Batches from `offset` up to about `max_bytes`, and the high
    /// watermark; `Err` with OFFSET_OUT_OF_RANGE outside `0..=hw`.
    pub fn read(&self, offset: i64, max_bytes: usize) -> std::result::Result<(Vec<u8>, i64), i16> {
        let (range, hw) = self.plan_read(offset, max_bytes, true)?;
        match range {
            Some(r) => self.read_range(r).map(|bytes| (bytes, hw)),
            None => Ok((Vec::new(), hw)),
        }
    }

    /// What a fetch from `offset` of at most `max_bytes` reads (see
    /// [`PartitionLog::plan`]), and the high watermark; `Err` with
    /// OFFSET_OUT_OF_RANGE outside `0..=hw`.
    pub fn plan_read(
        &self,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
    ) -> std::result::Result<(Option<ReadRange>, i64), i16> {
        self.plan_isolated(offset, max_bytes, at_least_one, false)
            .map(|(r, hw, _)| (r, hw))
    }

    /// [`Partition::plan_read`] for a reader at an isolation level: with
    /// `read_committed`, only batches below the last stable offset. Returns
    /// the range, the high watermark and the last stable offset.
    pub fn plan_isolated(
        &self,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
        read_committed: bool,
    ) -> std::result::Result<(Option<ReadRange>, i64, i64), i16> {
        let inner = self.lock();
        let hw = inner.log.next_offset();
        if offset < 0 || offset > hw {
            return Err(ResponseError::OffsetOutOfRange.code());
        }
        let lso = self.store.last_stable_offset(self.key, hw);
        let upto = if read_committed { lso } else { hw };
        Ok((
            inner.log.plan(offset, max_bytes, at_least_one, upto),
            hw,
            lso,
        ))
    }

    /// The last stable offset: the first offset of the oldest open
    /// transaction, or the high watermark.
    pub fn last_stable_offset(&self) -> i64 {
        let inner = self.lock();
        self.store
            .last_stable_offset(self.key, inner.log.next_offset())
    }

    /// The aborted transactions a `read_committed` reader of offsets
    /// `from..upto` must skip: (producer id, first offset), those whose
    /// ABORT marker is at or after `from` and that began before `upto`.
    pub fn aborted_between(&self, from: i64, upto: i64) -> Vec<(i64, i64)> {
        // Under the partition's lock: no marker is written meanwhile.
        let _inner = self.lock();
        self.store
            .aborted_transactions(self.key)
            .into_iter()
            .filter(|a| a.last_offset >= from && a.first_offset < upto)
            .filter_map(|a| {
                let pid = a
                    .producer_id
                    .as_numeric()
                    .and_then(|p| i64::try_from(p).ok())?;
                Some((pid, a.first_offset))
            })
            .collect()
    }

    /// Writes a COMMIT or ABORT marker of `producer_id`/`epoch` (the
    /// transaction coordinator's): decided by the producer state, then a
    /// control batch appended to the log and made durable, under the
    /// partition's lock. Returns the marker's offset.
    pub fn write_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        marker: ControlMarker,
        timestamp: i64,
    ) -> std::result::Result<i64, String> {
        let mut inner = self.lock();
        if let Some(f) = &inner.failed {
            return Err(f.clone());
        }
        let pid = ProducerId::try_from(producer_id)
            .map_err(|_| format!("producer id {producer_id} is negative"))?;
        let offset = inner.log.next_offset();
        let outcome = self.store.append_marker(
            pid,
            self.key,
            epoch,
            marker_at(marker, offset, timestamp),
            Origin::Coordinator,
        );
        match outcome {
            Ok(o) if o.is_accepted() => {}
            Ok(o) => return Err(format!("the marker was refused: {o}")),
            Err(e) => {
                let msg = format!("producer state of {}: {e}", self.name);
                inner.failed = Some(msg.clone());
                return Err(msg);
            }
        }
        let mut bytes = batch::control_batch(producer_id, epoch, marker, timestamp);
        let h =
            batch::parse(&bytes).map_err(|e| format!("a marker batch that does not parse: {e}"))?;
        match inner.log.append(&mut bytes, &h) {
            Ok(at) => Ok(at),
            Err(e) => {
                let msg = format!("partition log {}: {e}", inner.log.path().display());
                tracing::error!(partition = %self.name, error = %e, "writing a marker failed; partition refuses writes until restart");
                inner.failed = Some(msg.clone());
                Err(msg)
            }
        }
    }

    /// The bytes of a planned read.
    pub fn read_range(&self, range: ReadRange) -> std::result::Result<Vec<u8>, i16> {
        self.lock().log.read_range(range).map_err(|e| {
            tracing::error!(partition = %self.name, error = %e, "reading the partition log failed");
            ResponseError::KafkaStorageError.code()
        })
    }

    /// ListOffsets: `-1` latest, `-2` earliest, `-3` max timestamp, else the
    /// first batch with a timestamp at or after it. `(offset, timestamp)`,
    /// `(-1, -1)` when there is none.
    pub fn list_offset(&self, timestamp: i64) -> (i64, i64) {
        let inner = self.lock();
        match timestamp {
            -1 => (inner.log.next_offset(), -1),
            -2 => (0, -1),
            -3 => inner.log.max_timestamp().unwrap_or((-1, -1)),
            ts => inner.log.offset_for_timestamp(ts).unwrap_or((-1, -1)),
        }
    }
}

/// The directory of partition `index` of `topic` under `topics_dir`.
pub fn partition_dir(topics_dir: &Path, topic: &str, index: i32) -> PathBuf {
    topics_dir.join(format!("{topic}-{index}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, seq: i32, count: i32) -> Vec<u8> {
        let mut b = vec![0u8; batch::HEADER_LEN];
        b.extend_from_slice(&[5u8; 8]);
        let len = (b.len() - batch::LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[51..53].copy_from_slice(&epoch.to_be_bytes());
        b[53..57].copy_from_slice(&seq.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// The shared state of the data directory holding partition `dir`.
    fn state_dir(dir: &Path) -> PathBuf {
        dir.parent().unwrap().join("state")
    }

    /// Opens partition `dir` as key `key` of its data directory's state.
    fn open_key(dir: &Path, key: i32) -> (Partition, OpenReport) {
        let store = Arc::new(open_state(dir.parent().unwrap(), PRODUCER_ID_EXPIRATION).unwrap());
        let known = known_producers(&store);
        let ids = known.get(&key).cloned().unwrap_or_default();
        Partition::open(dir, ("t", key, key), &store, &ids).unwrap()
    }

    fn open(dir: &Path) -> (Partition, OpenReport) {
        open_key(dir, 0)
    }

    /// Drops the partitions and closes their shared state.
    fn close(ps: impl IntoIterator<Item = Partition>) {
        let mut store = None;
        for p in ps {
            store = Some(p.store.clone());
        }
        Arc::try_unwrap(store.unwrap()).unwrap().close().unwrap();
    }

    #[test]
    fn a_lost_state_directory_is_replayed_so_retries_stay_duplicates() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let (p, _) = open(&dir);
        assert_eq!(
            p.produce(&mut batch(7, 0, 0, 2)),
            Produced::Appended { base_offset: 0 }
        );
        assert_eq!(
            p.produce(&mut batch(7, 0, 2, 3)),
            Produced::Appended { base_offset: 2 }
        );
        close([p]);
        fs::remove_dir_all(state_dir(&dir)).unwrap();

        let (p, report) = open(&dir);
        // A fresh state is behind the log by all of it.
        assert_eq!((report.replayed, &report.rebuilt), (2, &None), "{report:?}");
        assert_eq!(report.max_producer_id, 7);
        // Without the replay a fresh state would accept the retry of the
        // first batch a second time.
        assert_eq!(
            p.produce(&mut batch(7, 0, 0, 2)),
            Produced::Duplicate { base_offset: 0 }
        );
        assert_eq!(
            p.produce(&mut batch(7, 0, 5, 1)),
            Produced::Appended { base_offset: 5 }
        );
        close([p]);
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &to.join(e.file_name()));
            } else {
                fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    /// Replaces the partition's state with `saved` (a copy taken earlier).
    fn restore_state(dir: &Path, saved: &Path) {
        fs::remove_dir_all(state_dir(dir)).unwrap();
        copy_dir(saved, &state_dir(dir));
    }

    #[test]
    fn a_state_behind_the_log_is_caught_up_by_replaying_the_batches_past_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let saved = tmp.path().join("saved");
        let (p, _) = open(&dir);
        assert_eq!(
            p.produce(&mut batch(7, 0, 0, 2)),
            Produced::Appended { base_offset: 0 }
        );
        close([p]);
        copy_dir(&state_dir(&dir), &saved);
        let (p, _) = open(&dir);
        assert_eq!(
            p.produce(&mut batch(7, 0, 2, 3)),
            Produced::Appended { base_offset: 2 }
        );
        assert_eq!(
            p.produce(&mut batch(-1, -1, -1, 1)),
            Produced::Appended { base_offset: 5 }
        );
        assert_eq!(
            p.produce(&mut batch(8, 0, 0, 1)),
            Produced::Appended { base_offset: 6 }
        );
        close([p]);
        // What a crash leaves when the state's last records were not yet
        // on disk (FsyncPolicy::Interval): a state that knows only b0.
        restore_state(&dir, &saved);

        let (p, report) = open(&dir);
        assert_eq!(
            (report.replayed, &report.rebuilt),
            (2, &None),
            "caught up by the two idempotent batches past offset 0: {report:?}"
        );
        // The client retries the batches it never heard about: the log has
        // them, so they must be duplicates with their offsets, not appended
        // again.
        assert_eq!(
            p.produce(&mut batch(7, 0, 2, 3)),
            Produced::Duplicate { base_offset: 2 }
        );
        assert_eq!(
            p.produce(&mut batch(8, 0, 0, 1)),
            Produced::Duplicate { base_offset: 6 }
        );
        assert_eq!(
            p.produce(&mut batch(7, 0, 5, 1)),
            Produced::Appended { base_offset: 7 }
        );
        close([p]);
        // The replayed state is the store's own now: it agrees on reopening.
        let (p, report) = open(&dir);
        assert_eq!((report.replayed, &report.rebuilt), (0, &None));
        close([p]);
    }

    #[test]
    fn a_state_of_another_history_is_rebuilt_from_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        let other = tmp.path().join("a").join("t-0");
        let dir = tmp.path().join("b").join("t-0");
        let saved = tmp.path().join("saved");
        // Another history: producer 9 at offset 0 (another data directory).
        let (p, _) = open(&other);
        p.produce(&mut batch(9, 0, 0, 1));
        close([p]);
        copy_dir(&state_dir(&other), &saved);
        let (p, _) = open(&dir);
        p.produce(&mut batch(7, 0, 0, 1));
        p.produce(&mut batch(7, 0, 1, 1));
        close([p]);
        restore_state(&dir, &saved);

        // Past the foreign state's offset 0 the log holds producer 7's
        // sequence 1 (applied as log recovery applies, without checks),
        // but the state knows producer 9, which the log does not.
        let (p, report) = open(&dir);
        let why = report.rebuilt.clone().expect("rebuilt");
        assert!(why.contains("producer 9"), "{why}");
        assert_eq!(
            report.replayed, 1,
            "the batch past offset 0, before the check"
        );
        assert_eq!(
            p.produce(&mut batch(7, 0, 1, 1)),
            Produced::Duplicate { base_offset: 1 }
        );
        assert_eq!(
            p.produce(&mut batch(9, 0, 0, 1)),
            Produced::Appended { base_offset: 2 },
            "producer 9 is not in this log"
        );
        close([p]);
    }

    /// A state ahead of its log (its record flushed, the log's write lost)
    /// is cut back to the log's end, that partition's alone: the other
    /// partition of the same state keeps its producers, and nothing is
    /// rebuilt.
    #[test]
    fn a_state_ahead_of_its_log_is_truncated_to_it_and_the_others_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let next = tmp.path().join("t-1");
        let (p, _) = open_key(&dir, 0);
        let q = Partition::open(&next, ("t", 1, 1), &p.store, &[])
            .unwrap()
            .0;
        for seq in 0..3 {
            p.produce(&mut batch(7, 0, seq, 1));
            q.produce(&mut batch(8, 0, seq, 1));
        }
        let cut = p.lock().log.plan(2, usize::MAX, true, 3).unwrap().pos;
        close([p, q]);
        // The log loses its last batch (offset 2); the state has it.
        fs::OpenOptions::new()
            .write(true)
            .open(dir.join(LOG_FILE))
            .unwrap()
            .set_len(cut)
            .unwrap();
        let store = Arc::new(open_state(tmp.path(), PRODUCER_ID_EXPIRATION).unwrap());
        let known = known_producers(&store);
        assert_eq!(store.partition_end_offset(0), 3, "ahead of the log's 2");
        let (p, report) =
            Partition::open(&dir, ("t", 0, 0), &store, known.get(&0).unwrap()).unwrap();
        let (q, other) =
            Partition::open(&next, ("t", 1, 1), &store, known.get(&1).unwrap()).unwrap();
        let why = report.truncated.clone().expect("truncated");
        assert!(why.contains("ahead"), "{why}");
        assert_eq!(
            (&report.rebuilt, &other.truncated, &other.rebuilt),
            (&None, &None, &None)
        );
        assert_eq!(store.partition_end_offset(0), 2);
        assert_eq!(store.partition_end_offset(1), 3);
        // The client's retry of the lost batch is written again, not
        // answered as a duplicate at an offset the log never had.
        assert_eq!(
            p.produce(&mut batch(7, 0, 2, 1)),
            Produced::Appended { base_offset: 2 }
        );
        assert_eq!(
            q.produce(&mut batch(8, 0, 2, 1)),
            Produced::Duplicate { base_offset: 2 }
        );
        drop(store);
        close([p, q]);
    }

    #[test]
    fn a_retry_racing_its_original_is_answered_only_once_the_original_is_durable() {
        use std::sync::{Arc, mpsc};
        use std::time::Duration;

        let tmp = tempfile::tempdir().unwrap();
        let (p, _) = open(&tmp.path().join("t-0"));
        let p = Arc::new(p);
        let (in_sync, wait_in_sync) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        // Every append stops between its write and its fdatasync until
        // `release` is dropped.
        p.lock().log.before_sync = Some(crate::plog::SyncHook(Box::new(move || {
            let _ = in_sync.send(());
            let _ = wait_release.recv();
        })));
        let original = {
            let p = p.clone();
            std::thread::spawn(move || p.produce(&mut batch(4, 0, 0, 3)))
        };
        wait_in_sync.recv().unwrap();
        // The original is in the in-memory state and written to the log,
        // not durable: its retry (from a new connection) arrives now.
        let (answered, answer) = mpsc::channel();
        let retry = {
            let p = p.clone();
            std::thread::spawn(move || answered.send(p.produce(&mut batch(4, 0, 0, 3))))
        };
        assert!(
            answer.recv_timeout(Duration::from_millis(300)).is_err(),
            "the retry was answered before its original was durable"
        );
        drop(release);
        assert_eq!(
            original.join().unwrap(),
            Produced::Appended { base_offset: 0 }
        );
        retry.join().unwrap().unwrap();
        assert_eq!(
            answer.recv().unwrap(),
            Produced::Duplicate { base_offset: 0 }
        );
        assert_eq!(p.high_watermark(), 3);
    }

    #[test]
    fn an_older_brokers_state_directories_are_removed_and_the_log_replayed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let (p, _) = open(&dir);
        p.produce(&mut batch(3, 0, 0, 1));
        close([p]);
        // What a broker with a store per partition left: its state dirs;
        // the shared state is new.
        fs::remove_dir_all(state_dir(&dir)).unwrap();
        for name in LEGACY_STATE {
            fs::create_dir(dir.join(name)).unwrap();
            fs::write(dir.join(name).join("00000000000000000000.wal"), b"x").unwrap();
        }
        let (p, report) = open(&dir);
        assert_eq!((report.replayed, &report.rebuilt), (1, &None));
        assert!(remove_legacy_state(&dir).unwrap());
        assert!(LEGACY_STATE.iter().all(|n| !dir.join(n).exists()));
        assert!(!remove_legacy_state(&dir).unwrap());
        assert_eq!(
            p.produce(&mut batch(3, 0, 0, 1)),
            Produced::Duplicate { base_offset: 0 }
        );
        close([p]);
    }

    /// A producer the state expired while its batches are still in the
    /// partition log: a restart neither truncates nor rebuilds (the
    /// state remembers that it expired the producer), and the producer's
    /// next batch is accepted at its sequence, as Kafka since KIP-360
    /// accepts it (no UNKNOWN_PRODUCER_ID on produce).
    #[test]
    fn an_expired_producer_causes_no_rebuild_and_continues_as_in_kafka() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let (p, _) = open(&dir);
        // The test batches carry timestamp 0, older than the default
        // expiration (a day) by decades.
        assert_eq!(
            p.produce(&mut batch(5, 0, 0, 2)),
            Produced::Appended { base_offset: 0 }
        );
        assert_eq!(
            p.produce(&mut batch(6, 0, 0, 1)),
            Produced::Appended { base_offset: 2 }
        );
        assert_eq!(p.store.expire_now().unwrap(), 2);
        assert!(p.producers().is_empty());
        assert!(p.store.was_removed(5u64, 0));
        close([p]);

        let (p, report) = open(&dir);
        assert_eq!(
            (report.replayed, &report.truncated, &report.rebuilt),
            (0, &None, &None),
            "{report:?}"
        );
        assert!(p.producers().is_empty(), "expired, not replayed back");
        // Producer 5 continues at sequence 2: Kafka (KIP-360) accepts the
        // first batch of a producer without state at any sequence.
        assert_eq!(
            p.produce(&mut batch(5, 0, 2, 1)),
            Produced::Appended { base_offset: 3 }
        );
        close([p]);
        let (p, report) = open(&dir);
        assert_eq!((report.replayed, &report.rebuilt), (0, &None), "{report:?}");
        assert_eq!(
            p.produce(&mut batch(5, 0, 2, 1)),
            Produced::Duplicate { base_offset: 3 }
        );
        close([p]);
    }

    #[test]
    fn rejections_map_to_kafka_error_codes_and_write_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (p, _) = open(&tmp.path().join("t-0"));
        p.produce(&mut batch(1, 2, 0, 1));
        let code = |o: Produced| match o {
            Produced::Refused { code, .. } => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(p.produce(&mut batch(1, 2, 5, 1))), 45);
        assert_eq!(code(p.produce(&mut batch(1, 1, 1, 1))), 47);
        let mut two = batch(1, 2, 1, 1);
        two.extend(batch(1, 2, 2, 1));
        assert_eq!(code(p.produce(&mut two)), 87);
        assert_eq!(p.high_watermark(), 1);
        // Without a producer id the broker cannot deduplicate: appended twice.
        let b = batch(-1, -1, -1, 1);
        assert_eq!(
            p.produce(&mut b.clone()),
            Produced::Appended { base_offset: 1 }
        );
        assert_eq!(
            p.produce(&mut b.clone()),
            Produced::Appended { base_offset: 2 }
        );
        close([p]);
    }
}
