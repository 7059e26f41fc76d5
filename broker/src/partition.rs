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
//! # Recovery
//!
//! On open the partition's state is brought exactly to its log
//! (`agreement.rs`).
//!
//! A write or fsync failure of either file poisons the partition: it answers
//! `KAFKA_STORAGE_ERROR` until the broker restarts and recovery makes the
//! two agree again (a failed fsync is never retried).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use producer_state::{
    AppendOptions, BatchOutcome, FsyncPolicy, Origin, ProducerId, ProducerStateStore, Semantics,
    StoreOptions,
};

use crate::agreement::{LastBatch, marker_at, to_batch};
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

/// The directory of producer-state store `shard` in a data directory:
/// `state` for store 0 (the only one by default), `state-<shard>` for the
/// others.
pub fn state_dir_name(shard: usize) -> String {
    if shard == 0 {
        "state".to_string()
    } else {
        format!("state-{shard}")
    }
}

/// Opens producer-state store `shard` of the data directory
/// (`DIR/state`, or `DIR/state-<shard>`: [`state_dir_name`]). A
/// state written under the strict rules (a broker before Kafka mode) is
/// derived data: it is moved aside to `state.strict-<millis>` and every
/// partition replays its log into a new one.
pub fn open_state(dir: &Path, shard: usize, expiration: Duration) -> Result<ProducerStateStore> {
    let path = dir.join(state_dir_name(shard));
    let state_err = |source| Error::State {
        partition: "(all)".into(),
        source,
    };
    match ProducerStateStore::open_with(&path, state_options(expiration)) {
        Err(producer_state::Error::SemanticsMismatch { .. }) => {
            let aside = dir.join(format!(
                "{}.strict-{}",
                state_dir_name(shard),
                crate::now_ms()
            ));
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
        let log_end = log.next_offset();
        crate::agreement::bring_to_log(
            store,
            (&log, &log_path),
            (&name, key),
            (known, &log_last),
            &mut report,
        )?;
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

    /// The append options of client batch `h` of `producer_id`: a
    /// transactional batch is verified by `verify` (the coordinator's
    /// answer, KIP-890), or refused.
    fn options_for(
        &self,
        h: &BatchHeader,
        producer_id: &ProducerId,
        verify: Option<&dyn Fn() -> std::result::Result<(), i16>>,
    ) -> std::result::Result<AppendOptions, Produced> {
        let mut options = AppendOptions::client();
        if !h.is_transactional() {
            return Ok(options);
        }
        options = options.transactional();
        match verify.map(|v| v()) {
            Some(Ok(())) => Ok(options.verified()),
            Some(Err(code)) => {
                // As in Kafka, the verification began before the
                // coordinator answered, and its state outlives the refusal
                // (KIP-890): the producer's higher sequences are refused
                // until an append succeeds.
                let _ = self.store.start_transaction_verification(
                    producer_id.clone(),
                    self.key,
                    h.producer_epoch,
                    h.base_sequence,
                );
                Err(Produced::Refused {
                    code,
                    message: "the partition is not in the producer's ongoing transaction".into(),
                })
            }
            None => Ok(options),
        }
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
        let h = match validate(bytes) {
            Ok(h) => h,
            Err(refused) => return refused,
        };
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
            let options = match self.options_for(&h, &producer_id, verify) {
                Ok(o) => o,
                Err(refused) => return refused,
            };
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

/// The batch a produce request carries, checked as Kafka checks a
/// client's batch before anything is decided: exactly one batch that
/// parses, a sequence not below 0, no control records, a transactional
/// batch with a producer id. The refusal otherwise.
fn validate(bytes: &[u8]) -> std::result::Result<BatchHeader, Produced> {
    let refuse = |e: ResponseError, message: String| Produced::Refused {
        code: e.code(),
        message,
    };
    let h = match batch::parse(bytes) {
        Ok(h) => h,
        // Kafka: a count that disagrees with the offsets is an invalid
        // record (`LogValidator.validateBatch`); damage is corruption.
        Err(e @ batch::BatchError::BadCount { .. }) => {
            return Err(refuse(ResponseError::InvalidRecord, e.to_string()));
        }
        Err(e) => return Err(refuse(ResponseError::CorruptMessage, e.to_string())),
    };
    if h.is_idempotent() && h.base_sequence < 0 {
        return Err(refuse(
            ResponseError::InvalidRecord,
            format!(
                "invalid sequence number {} in a batch of producer {}",
                h.base_sequence, h.producer_id
            ),
        ));
    }
    if h.size != bytes.len() {
        return Err(refuse(
            ResponseError::InvalidRecord,
            "a produce request must hold exactly one record batch per partition".into(),
        ));
    }
    if h.is_control() {
        return Err(refuse(
            ResponseError::InvalidRecord,
            "clients may not write control records".into(),
        ));
    }
    if h.is_transactional() && !h.is_idempotent() {
        return Err(refuse(
            ResponseError::InvalidRecord,
            "a transactional batch without a producer id".into(),
        ));
    }
    Ok(h)
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
