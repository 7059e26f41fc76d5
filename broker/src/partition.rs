//! One partition: its log, its producer state, and the produce path that
//! keeps the two in agreement.
//!
//! # One store per partition
//!
//! Each partition has its own [`ProducerStateStore`] in `state/` beside its
//! log. The log and the state that must agree with it live and recover
//! together: recovery compares one log with one store, and rebuilding a
//! store reads only its own partition's log. One store for all partitions
//! (keyed by a global partition number) would share fsyncs across
//! partitions, but a torn tail in any partition's log would then force
//! rebuilding the state of every partition from every log. The cost is two
//! threads per partition (the store's flusher and snapshot threads), fine
//! for the tens of partitions this broker serves.
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
//! after a crash the state is either *behind* the log (its newest records
//! were not yet on disk: the common case) or *ahead* of it (its records
//! were flushed, the log's write was not done). On open:
//!
//! - *behind*: every idempotent batch of the log past the state's newest
//!   offset is appended to the state again, in order, each of which must be
//!   `ACCEPTED` (anything else means the state is not a prefix of this log,
//!   and it is rebuilt). O(batches behind), read through the log's index;
//! - then the agreement check: the newest batch each producer has in the
//!   log must be exactly what the state holds as that producer's newest
//!   (epoch, last sequence, offset), the state must know no producer the
//!   log lacks and no batch at or past the log's end;
//! - *ahead*, or any other disagreement (a state directory replaced, say):
//!   the state is rebuilt from the whole log. A state left ahead would
//!   answer the client's retry of the lost batch with `DUPLICATE` and an
//!   offset the log never had, losing an acknowledged message.
//!
//! A write or fsync failure of either file poisons the partition: it answers
//! `KAFKA_STORAGE_ERROR` until the broker restarts and recovery makes the
//! two agree again (a failed fsync is never retried).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
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
const STATE: &str = "state";
const STATE_REBUILD: &str = "state.rebuild";
const STATE_OLD: &str = "state.old";

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
    store: ProducerStateStore,
    failed: Option<String>,
}

/// One partition of a topic.
pub struct Partition {
    name: String,
    index: i32,
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
    /// Why the producer state was rebuilt from the log, if it was.
    pub rebuilt: Option<String>,
    /// The highest producer id in the log (-1: none).
    pub max_producer_id: i64,
}

/// The producer state runs Kafka's rules (`Semantics::Kafka`): Kafka's
/// verdicts, transactions, markers and the last stable offset.
fn state_options() -> StoreOptions {
    StoreOptions::default()
        .fsync(FsyncPolicy::Interval(STATE_FSYNC_INTERVAL))
        .semantics(Semantics::Kafka)
}

fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", dir, e)),
    }
}

/// Finishes or undoes a state swap interrupted by a crash (see [`rebuild`]).
fn settle_state_dirs(dir: &Path) -> Result<()> {
    // An unfinished rebuild: derived data, made again if needed.
    remove_dir_if_exists(&dir.join(STATE_REBUILD))?;
    let state = dir.join(STATE);
    let old = dir.join(STATE_OLD);
    if old.exists() {
        if state.exists() {
            // The swap completed; the old state is no longer needed.
            remove_dir_if_exists(&old)?;
        } else {
            // Crashed between the two renames: put the old state back; the
            // agreement check below finds it ahead again and rebuilds.
            fs::rename(&old, &state).map_err(|e| Error::io("rename", &old, e))?;
        }
        sync_dir(dir)?;
    }
    Ok(())
}

/// The offset of the newest batch or marker the state knows (-1: none).
fn state_end(store: &ProducerStateStore) -> i64 {
    store.end_offset() - 1
}

/// Applies a batch read back from the partition log (`h`, its bytes
/// `bytes`) to `store`, at the offset the log gave it, as Kafka's log
/// recovery does (the replication origin: what the log holds was accepted
/// once): a data batch with its transactional flag, a control batch as its
/// COMMIT or ABORT marker. `None` for a batch that carries no producer
/// state (not idempotent, or a control batch of another kind).
fn append_logged(
    store: &ProducerStateStore,
    h: &BatchHeader,
    bytes: &[u8],
    name: &str,
    index: i32,
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
                index,
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
            index,
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
    index: i32,
) -> Result<std::result::Result<u64, String>> {
    let mut n = 0u64;
    let mut refused = None;
    log.for_each_batch_after(after, |h, bytes| {
        if refused.is_some() {
            return Ok(());
        }
        match append_logged(store, h, bytes, name, index)? {
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

/// Why the store and the log disagree, or `None` if they agree: every
/// producer the state knows must be at the log's newest epoch for it, with
/// the log's newest data batch as its newest cached batch (or, with none
/// cached, an epoch the marker that bumped it set), and nothing at or past
/// the log's end; a producer of the log the state does not know must be
/// one the state removed itself (expired: `was_removed`).
fn disagreement(
    store: &ProducerStateStore,
    index: i32,
    log_last: &HashMap<i64, LastBatch>,
    log_end: i64,
) -> Option<String> {
    let mut known = std::collections::HashSet::new();
    for (id, st) in store.kafka_producers(index) {
        let Some(pid) = id.as_numeric().and_then(|p| i64::try_from(p).ok()) else {
            return Some(format!(
                "the state holds producer {id}, which no Kafka client has"
            ));
        };
        known.insert(pid);
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
    log_last
        .keys()
        .find(|pid| {
            !known.contains(pid)
                && !u64::try_from(**pid)
                    .is_ok_and(|p| store.was_removed(ProducerId::numeric(p), index))
        })
        .map(|pid| {
            format!("the log has producer {pid}, which the state does not know and did not expire")
        })
}

fn to_batch(h: &BatchHeader, offset: i64) -> Batch {
    Batch::new(h.base_sequence, h.last_sequence(), offset, h.max_timestamp)
}

/// Rebuilds the producer state from the log's batches: appends every
/// batch of the log, in order, to a fresh store in `state.rebuild`, makes it
/// durable, then swaps it in: rename `state` to `state.old`, rename
/// `state.rebuild` to `state`, remove `state.old` (each step fsync'ed; a
/// crash anywhere in between is settled by [`settle_state_dirs`]). O(log).
fn rebuild(dir: &Path, log_path: &Path, name: &str, index: i32) -> Result<()> {
    let tmp = dir.join(STATE_REBUILD);
    remove_dir_if_exists(&tmp)?;
    let state_err = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    // Buffered: the rebuild is made durable once, by close, before the swap.
    let store = ProducerStateStore::open_with(&tmp, state_options().fsync(FsyncPolicy::Never))
        .map_err(state_err)?;
    PartitionLog::for_each_batch(log_path, |h, bytes| {
        match append_logged(&store, h, bytes, name, index)? {
            None | Some(Ok(())) => Ok(()),
            Some(Err(outcome)) => Err(Error::Rebuild {
                partition: name.to_string(),
                offset: h.base_offset,
                outcome,
            }),
        }
    })?;
    store.close().map_err(state_err)?;
    sync_dir(&tmp)?;
    sync_dir(dir)?;
    let state = dir.join(STATE);
    let old = dir.join(STATE_OLD);
    if state.exists() {
        fs::rename(&state, &old).map_err(|e| Error::io("rename", &state, e))?;
        sync_dir(dir)?;
    }
    fs::rename(&tmp, &state).map_err(|e| Error::io("rename", &tmp, e))?;
    sync_dir(dir)?;
    remove_dir_if_exists(&old)?;
    sync_dir(dir)
}

impl Partition {
    /// Opens partition `index` of `topic` in `dir` (created if missing):
    /// recovers the log, then makes the producer state agree with it.
    pub fn open(dir: &Path, topic: &str, index: i32) -> Result<(Partition, OpenReport)> {
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
        settle_state_dirs(dir)?;
        let state_err = |source| Error::State {
            partition: name.clone(),
            source,
        };
        let open_state =
            || ProducerStateStore::open_with(dir.join(STATE), state_options()).map_err(state_err);
        let mut store = match ProducerStateStore::open_with(dir.join(STATE), state_options()) {
            Ok(s) => s,
            // A state written under the seed rules (before the broker ran
            // Kafka's): derived data, made again from the log.
            Err(producer_state::Error::SemanticsMismatch { .. }) => {
                tracing::warn!(partition = %name, "the producer state was written under other rules; rebuilding it from the partition log");
                rebuild(dir, &log_path, &name, index)?;
                report.rebuilt = Some("the state was written under the seed rules".into());
                open_state()?
            }
            Err(e) => return Err(state_err(e)),
        };
        if let Some(torn) = store.recovery_report().torn_tail.as_ref() {
            tracing::warn!(partition = %name, ?torn, "the producer state's log had a torn tail");
        }
        // Behind: catch up with the log. Nothing to replay when the state
        // agrees or is ahead (its newest offset is then the log's newest
        // idempotent batch, or past the log's end).
        let end = state_end(&store);
        let replayed = replay(&store, &log, end, &name, index)?;
        let refused = match replayed {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(partition = %name, batches = n, after = end, "replayed the partition log into the producer state, which was behind it");
                }
                report.replayed = n;
                None
            }
            Err(why) => Some(why),
        };
        if let Some(why) =
            refused.or_else(|| disagreement(&store, index, &log_last, log.next_offset()))
        {
            // truncate_to: once `ProducerStateStore::truncate_to(offset)`
            // exists, the state-ahead case becomes
            // `store.truncate_to(log.next_offset())` here, O(state) instead
            // of this O(log) rebuild; keep the rebuild for the other
            // disagreements (a state directory replaced, a replay refused).
            tracing::warn!(partition = %name, reason = %why, "rebuilding the producer state from the partition log");
            store.close().map_err(state_err)?;
            rebuild(dir, &log_path, &name, index)?;
            store = open_state()?;
            if let Some(still) = disagreement(&store, index, &log_last, log.next_offset()) {
                return Err(Error::Rebuild {
                    partition: name,
                    offset: log.next_offset(),
                    outcome: format!("a rebuilt state that still disagrees: {still}"),
                });
            }
            report.rebuilt = Some(why);
        }
        tracing::info!(
            partition = %name, next_offset = log.next_offset(), producers = log_last.len(),
            "partition open"
        );
        Ok((
            Partition {
                name,
                index,
                inner: Mutex::new(Inner {
                    log,
                    store,
                    failed: None,
                }),
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

    /// fsyncs of the producer state's log since the partition was opened
    /// (on the store's own thread, off the produce path).
    pub fn state_fsyncs(&self) -> u64 {
        self.lock().store.stats().log_fsyncs
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
                        return Produced::Refused {
                            code,
                            message: "the partition is not in the producer's ongoing transaction"
                                .into(),
                        };
                    }
                    None => {}
                }
            }
            let outcome = inner.store.append_with(
                producer_id,
                self.index,
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
        let lso = inner.store.last_stable_offset(self.index, hw);
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
        inner
            .store
            .last_stable_offset(self.index, inner.log.next_offset())
    }

    /// The aborted transactions a `read_committed` reader of offsets
    /// `from..upto` must skip: (producer id, first offset), those whose
    /// ABORT marker is at or after `from` and that began before `upto`.
    pub fn aborted_between(&self, from: i64, upto: i64) -> Vec<(i64, i64)> {
        let inner = self.lock();
        inner
            .store
            .aborted_transactions(self.index)
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
        let outcome = inner.store.append_marker(
            pid,
            self.index,
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

    /// Closes the producer state (makes it durable, releases its lock).
    pub fn close(self) -> Result<()> {
        let inner = self.inner.into_inner().unwrap_or_else(|p| p.into_inner());
        inner.store.close().map_err(|source| Error::State {
            partition: self.name,
            source,
        })
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

    fn open(dir: &Path) -> (Partition, OpenReport) {
        Partition::open(dir, "t", 0).unwrap()
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
        p.close().unwrap();
        fs::remove_dir_all(dir.join(STATE)).unwrap();

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
        p.close().unwrap();
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
        fs::remove_dir_all(dir.join(STATE)).unwrap();
        copy_dir(saved, &dir.join(STATE));
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
        p.close().unwrap();
        copy_dir(&dir.join(STATE), &saved);
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
        p.close().unwrap();
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
        p.close().unwrap();
        // The replayed state is the store's own now: it agrees on reopening.
        let (p, report) = open(&dir);
        assert_eq!((report.replayed, &report.rebuilt), (0, &None));
        p.close().unwrap();
    }

    #[test]
    fn a_state_of_another_history_is_rebuilt_from_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        let other = tmp.path().join("t-1");
        let dir = tmp.path().join("t-0");
        let saved = tmp.path().join("saved");
        // Another history: producer 9 at offset 0.
        let (p, _) = open(&other);
        p.produce(&mut batch(9, 0, 0, 1));
        p.close().unwrap();
        copy_dir(&other.join(STATE), &saved);
        let (p, _) = open(&dir);
        p.produce(&mut batch(7, 0, 0, 1));
        p.produce(&mut batch(7, 0, 1, 1));
        p.close().unwrap();
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
        p.close().unwrap();
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
    fn a_swap_interrupted_between_its_renames_is_settled() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let (p, _) = open(&dir);
        p.produce(&mut batch(3, 0, 0, 1));
        p.close().unwrap();
        // Crash after `state` -> `state.old`, with a half-built rebuild.
        fs::rename(dir.join(STATE), dir.join(STATE_OLD)).unwrap();
        fs::create_dir(dir.join(STATE_REBUILD)).unwrap();
        fs::write(dir.join(STATE_REBUILD).join("junk"), b"x").unwrap();

        let (p, report) = open(&dir);
        assert!(
            report.rebuilt.is_none(),
            "the old state was put back and agrees"
        );
        assert!(!dir.join(STATE_OLD).exists() && !dir.join(STATE_REBUILD).exists());
        assert_eq!(
            p.produce(&mut batch(3, 0, 0, 1)),
            Produced::Duplicate { base_offset: 0 }
        );
        p.close().unwrap();
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
        p.close().unwrap();
    }
}
