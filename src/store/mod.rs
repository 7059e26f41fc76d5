//! The durable store: the engine's rules over a write-ahead log and
//! checksummed snapshots.
//!
//! # The write path
//!
//! validate -> (only if ACCEPTED) write the log record -> fsync per policy
//! -> apply to memory -> return. Duplicates and rejections write nothing.
//!
//! With [`FsyncPolicy::Always`] an accepted append is first held as
//! *in flight*: its record is queued in the forming *group* and the key's
//! speculative state is kept beside the committed state. If no group commit
//! is running, the appender leads one itself: it takes the group, writes it
//! with one `write` and one `fdatasync`, applies it to the committed state
//! and wakes the group's other appenders. A lone appender therefore pays
//! exactly one fsync, with no timer, sleep or thread hand-off in the way.
//! Appenders that arrive while a group commit runs queue into the next
//! group and sleep; if records are queued when the leader's group is done,
//! the leader hands the next group to a flusher thread and returns, and the
//! flusher runs group commits back to back for as long as records keep
//! arriving. One group is written at a time, so only the group being
//! written is ever unsynced.
//!
//! Waiting is cheap because it matters: with dozens of appenders on two
//! cores, the CPU spent parking and waking threads, not the disk, bounded
//! throughput. Appenders of a group sleep on one futex word and read the
//! outcome from atomics, so a group commit costs the leader one wake-up
//! call whatever the group's size, and a woken appender returns without
//! taking the store's lock again.
//!
//! Under the buffered policies an append is classified, applied and
//! encoded under the lock and returns; the flusher thread checksums and
//! writes the buffer in the background once it holds 64 KiB (an appender
//! waits only when 1 MiB is pending: the disk is behind).
//!
//! Validation and the update it implies are atomic per key: a request that
//! continues a key's in-flight state is queued after it (a producer may
//! pipeline), and any other request for a key with records in flight (a
//! retry, a zombie, a gap) waits until they are durable and is then
//! classified against the committed state. So a retry that races its
//! original is never accepted twice: it answers `DUPLICATE`, with the
//! original's metadata, once the original is durable, or the original's
//! error if its write failed.
//!
//! If a write or fsync fails, every append waiting on that group gets the
//! error, none of them is applied, and the store is poisoned: it refuses
//! further appends until reopened. A failed fsync is never retried.
//!
//! # Snapshots
//!
//! A snapshot is the state at one log position P, written without stopping
//! appenders and without a second copy of the state: the state is split
//! into 256 shards and the snapshot encodes one shard at a time under the
//! store's lock. An append applied after P to a shard not yet encoded first
//! saves the key's entry as it was at P (a pre-image), and the encoder uses
//! those. Appenders wait at most for one shard's encoding.

mod append_all;
mod background;
mod commit;
mod failure;
mod kafka;
mod keys;
mod lifecycle;
mod moves;
mod options;
mod order;
pub(crate) mod pipelined;
mod rewind;
mod snapshots;
mod state;
mod stats;
mod txn;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::batch::{AppendRequest, Batch};
use crate::engine::entry::ProducerEntry;
use crate::engine::map::hash_key;
use crate::engine::shards::SHARDS;
use crate::error::{Error, Result};
use crate::fs::LockGuard;
use crate::id::ProducerId;
use crate::outcome::{AppendOutcome, BatchOutcome};
use crate::recovery::{self, report::RecoveryReport};
use crate::telemetry::Telemetry;
use crate::wal::frame::MAX_NAME;
use crate::wal::writer::LogWriter;

use commit::{FLUSH_BYTES, GroupCommit, LogQueue, lock};
use keys::Keys;
pub use options::{AtCapacity, FsyncPolicy, StoreOptions};
use snapshots::{Book, Snapshots};
use state::{Life, State, Submit};
pub use stats::StoreStats;

/// Requests [`ProducerStateStore::append_all`] looks up ahead of applying
/// them under a buffered policy (see [`warm`]): few enough that their slots
/// stay in the first-level cache.
const WARM: usize = 32;

struct Bg {
    stop: bool,
    snapshot_wanted: bool,
}

struct Shared {
    dir: PathBuf,
    opts: StoreOptions,
    /// The group commit, and behind its lock the store's [`State`].
    log: GroupCommit<State>,
    snapshots: Snapshots,
    bg: Mutex<Bg>,
    bg_cv: Condvar,
    _lock: Box<dyn LockGuard>,
    /// Under `Semantics::Kafka` (see `txn.rs`).
    kafka: bool,
}

/// The durable producer-state store. `Send + Sync`: share it between
/// threads (for example in an `Arc`) and append from all of them.
///
/// ```
/// use producer_state::{AppendOutcome, ProducerStateStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = ProducerStateStore::open(dir.path())?;
/// assert_eq!(store.append("p1", 0, 0, 0)?, AppendOutcome::Accepted);
/// assert_eq!(store.append("p1", 0, 0, 1)?, AppendOutcome::Accepted);
/// store.close()?;
///
/// // Reopened: the state was recovered from the log.
/// let store = ProducerStateStore::open(dir.path())?;
/// assert_eq!(store.recovery_report().records_replayed, 2);
/// assert_eq!(store.append("p1", 0, 0, 1)?, AppendOutcome::Duplicate);
/// assert_eq!(store.append("p1", 0, 1, 0)?, AppendOutcome::Accepted);
/// assert_eq!(store.append("p1", 0, 0, 2)?, AppendOutcome::FencedEpoch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ProducerStateStore {
    shared: Arc<Shared>,
    /// The snapshot thread and the interval's fsync thread, if any.
    background: Vec<JoinHandle<()>>,
    flusher: Option<JoinHandle<()>>,
    report: RecoveryReport,
    closed: bool,
}

impl fmt::Debug for ProducerStateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerStateStore")
            .field("dir", &self.shared.dir)
            .field("options", &self.shared.opts)
            .finish_non_exhaustive()
    }
}

impl ProducerStateStore {
    /// Opens the store in `dir` with default options: creates the directory
    /// if missing, otherwise recovers it.
    ///
    /// ```
    /// use producer_state::{AppendOutcome, Error, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// assert_eq!(store.append(7u64, 0, 0, 0)?, AppendOutcome::Accepted);
    /// // One store per directory: a second open is refused while it is open.
    /// assert!(matches!(ProducerStateStore::open(dir.path()), Err(Error::Locked { .. })));
    /// drop(store);
    /// let again = ProducerStateStore::open(dir.path())?;
    /// assert_eq!(again.recovery_report().records_replayed, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Locked`] if another open store holds the directory (the
    /// lock is on the directory itself: deleting its `LOCK` file does not
    /// release it); [`Error::InvalidPath`] if `dir` is empty;
    /// [`Error::NotADirectory`] if `dir` is a file; [`Error::Corrupt`] if
    /// recovery finds damage other than a torn tail; [`Error::Io`] if the
    /// file system fails.
    pub fn open(dir: impl AsRef<Path>) -> Result<ProducerStateStore> {
        ProducerStateStore::open_with(dir, StoreOptions::default())
    }

    /// Opens the store in `dir` with `opts`.
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::open`], and [`Error::InvalidOptions`] if
    /// the options cannot work together.
    pub fn open_with(dir: impl AsRef<Path>, opts: StoreOptions) -> Result<ProducerStateStore> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let fs = opts.fs.clone();
        let guard = crate::directory::lock(fs.as_ref(), &dir)?;
        let telemetry = Telemetry::new(&dir, &opts.metric_labels);

        // Before recovery reads or repairs anything: a directory is never
        // replayed under the other semantics.
        recovery::semantics::check(fs.as_ref(), &dir, opts.semantics)?;
        let mut rec = recovery::recover(fs.as_ref(), &dir, opts.recovery)?;
        let kafka = opts.semantics == crate::semantics::Semantics::Kafka;
        if kafka && rec.meta.kafka.is_none() {
            rec.meta.kafka = Some(Box::new(
                crate::engine::ProducerStateManager::with_semantics(
                    crate::semantics::Semantics::Kafka,
                ),
            ));
        }
        // A broker setting, not state: the recovered engine takes it. It
        // has no verification states (never logged nor snapshotted), as a
        // restarted Kafka broker has none.
        if let Some(k) = rec.meta.kafka.as_deref_mut() {
            k.set_transaction_verification(opts.transaction_verification);
        }
        let writer = match rec.active {
            Some(active) => {
                let mut w =
                    LogWriter::resume(fs.clone(), &dir, rec.segments, active, opts.layout())?;
                if rec.report.clean_shutdown == Some(true) {
                    w.reopen_after_close()?;
                }
                w
            }
            None => LogWriter::create(
                fs.clone(),
                &dir,
                rec.next_position,
                rec.segments,
                rec.store_id,
                opts.layout(),
            )?,
        };
        debug_assert_eq!(writer.next_position(), rec.next_position);
        let always = opts.fsync == FsyncPolicy::Always;
        let life = Life {
            always,
            unknown: opts.unknown,
            cap: opts.max_producers,
            refuse: opts.at_capacity == AtCapacity::Refuse,
        };
        let keys = Keys::new(rec.shards, rec.meta, opts.max_producers.is_some());
        let mut state = State::new(
            keys,
            LogQueue::new(rec.next_position).with_reach(rec.reach),
            life,
        );
        state.since_snapshot = (rec.report.records_replayed, 0);
        state.snapshot_every = (opts.snapshot_every_records, opts.snapshot_every_bytes);
        let book = Book {
            files: rec.snapshot_files,
            valid: rec.snapshots,
            orphans: Vec::new(),
        };
        let shared = Arc::new(Shared {
            snapshots: Snapshots::new(dir.clone(), fs.clone(), opts.keep_snapshots, book),
            dir,
            log: GroupCommit::new(always, state, writer, telemetry),
            bg: Mutex::new(Bg {
                stop: false,
                snapshot_wanted: false,
            }),
            bg_cv: Condvar::new(),
            _lock: guard,
            opts,
            kafka,
        });
        let (background, flusher) = shared.start_threads()?;
        shared.log.telemetry().recovered(&rec.report);
        Ok(ProducerStateStore {
            shared,
            background,
            flusher: Some(flusher),
            report: rec.report,
            closed: false,
        })
    }

    /// Classifies a single-sequence append and, if accepted, makes it durable
    /// (per the fsync policy) before returning.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if writing or fsyncing its record failed (the store is
    /// then poisoned), [`Error::Poisoned`] after an earlier failure,
    /// [`Error::ProducerIdTooLong`] for a name over 65,535 bytes. Outcomes
    /// such as `DUPLICATE` are not errors.
    pub fn append(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> Result<AppendOutcome> {
        self.append_request(&AppendRequest::single(
            producer_id,
            partition,
            epoch,
            sequence,
        ))
        .map(|o| o.outcome())
    }

    /// Classifies a batch and, if accepted, makes it durable before
    /// returning.
    ///
    /// ```
    /// use producer_state::{Batch, BatchMetadata, BatchOutcome, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// // Records 0..=4 of producer 42 on partition 3, written at offset 100.
    /// let batch = Batch::new(0, 4, 100, 1_700_000_000_000);
    /// assert_eq!(store.append_batch(42u64, 3, 0, batch)?, BatchOutcome::Accepted);
    /// // The client did not hear back and retries: the answer names where
    /// // the original was written, so the broker can acknowledge it again.
    /// let original = Some(BatchMetadata { offset: 100, timestamp: 1_700_000_000_000 });
    /// assert_eq!(store.append_batch(42u64, 3, 0, batch)?, BatchOutcome::Duplicate { original });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::append`].
    pub fn append_batch(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
    ) -> Result<BatchOutcome> {
        self.append_request(&AppendRequest::batch(producer_id, partition, epoch, batch))
    }

    /// Classifies one request and, if accepted, makes it durable before
    /// returning.
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::append`].
    pub fn append_request(&self, request: &AppendRequest) -> Result<BatchOutcome> {
        let answer = self.decide(request);
        self.shared.log.telemetry().answered(&answer);
        answer
    }

    /// [`ProducerStateStore::append_request`], before its answer is counted.
    #[inline]
    fn decide(&self, request: &AppendRequest) -> Result<BatchOutcome> {
        let shared = &*self.shared;
        if shared.kafka {
            return self.kafka_decide(request);
        }
        check_seed(request)?;
        let hash = hash_key(&request.producer_id, request.partition);
        let now = shared.now_for(std::slice::from_ref(request));
        let mut st = shared.lock_to_write(false)?;
        if !shared.is_always() {
            let o = st.submit_buffered(hash, request, now)?;
            if o.is_accepted() {
                shared.after_buffered(st);
            }
            return Ok(o);
        }
        loop {
            match st.submit_durable(hash, request, now) {
                Submit::Done(o) => return Ok(o),
                Submit::Refused(e) => return Err(e),
                Submit::Queued { group, pos } => {
                    shared.commit(st);
                    return shared
                        .await_durable(group, pos)
                        .map(|()| BatchOutcome::Accepted);
                }
                Submit::Wait { group, pos } => st = shared.relock_after(st, group, pos)?,
            }
        }
    }

    /// Appends many requests, for example one produce request covering many
    /// partitions: the same outcomes as appending them one by one in this
    /// order, but under one lock, and all accepted records share one write
    /// and one fsync (unless a request retries an earlier one of the same
    /// call, which then waits for it to be durable). Outcomes are in input
    /// order.
    ///
    /// ```
    /// use producer_state::{AppendRequest, Batch, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// // One produce request with batches for two partitions, and a retry.
    /// let requests = [
    ///     AppendRequest::batch(7u64, 0, 0, Batch::new(0, 9, 500, 1)),
    ///     AppendRequest::batch(7u64, 1, 0, Batch::new(0, 4, 80, 1)),
    ///     AppendRequest::batch(7u64, 0, 0, Batch::new(0, 9, 500, 1)),
    /// ];
    /// let outcomes: Vec<_> = store.append_all(&requests).into_iter().collect::<Result<_, _>>()?;
    /// assert!(outcomes[0].is_accepted() && outcomes[1].is_accepted());
    /// assert!(!outcomes[2].is_accepted()); // a duplicate of the first
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn append_all(&self, requests: &[AppendRequest]) -> Vec<Result<BatchOutcome>> {
        let answers = self.decide_all(requests);
        self.shared.log.telemetry().answered_all(&answers);
        answers
    }

    /// The entry of one key, if it has state. Under `Always` that is the
    /// state of the durable appends; under the buffered policies, of every
    /// accepted append, including those not yet durable (and, after a
    /// failed write has poisoned the store, those the log lost: reopen to
    /// see what survived).
    pub fn get(&self, producer_id: impl Into<ProducerId>, partition: i32) -> Option<ProducerEntry> {
        let id = producer_id.into();
        let st = self.shared.lock_state();
        if let Some(k) = &st.keys.meta.kafka {
            return k.get(id, partition);
        }
        st.keys.shards.get(hash_key(&id, partition), &id, partition)
    }

    /// Number of keys with state (as [`ProducerStateStore::get`] sees it).
    pub fn len(&self) -> usize {
        let st = self.shared.lock_state();
        match &st.keys.meta.kafka {
            Some(k) => k.len(),
            None => st.keys.shards.len(),
        }
    }

    /// True when no key has state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key with its entry (as [`ProducerStateStore::get`] sees it),
    /// in no particular order. The
    /// iterator copies one shard (a 256th of the state) at a time under the
    /// store's lock, so it is consistent within a shard, not across shards
    /// while appends run.
    ///
    /// Under [`Semantics::Kafka`](crate::Semantics::Kafka) the whole state
    /// is copied at once, and keys with transaction state are shown as
    /// [`ProducerStateManager::get`](crate::ProducerStateManager::get)
    /// shows them.
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        let kafka: Option<Vec<_>> = if self.shared.kafka {
            let st = self.shared.lock_state();
            st.keys.meta.kafka.as_ref().map(|k| k.iter().collect())
        } else {
            None
        };
        let shards = if kafka.is_some() { 0 } else { SHARDS };
        kafka
            .into_iter()
            .flatten()
            .chain((0..shards).flat_map(move |i| {
                let st = self.shared.lock_state();
                st.keys.shards.shard(i).iter().collect::<Vec<_>>()
            }))
    }

    /// Takes a snapshot now and waits until it is durable. Returns its path,
    /// or `None` if nothing was appended since the last snapshot.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if writing it failed (the log is unaffected and the
    /// store keeps accepting appends), [`Error::Poisoned`] if the store is.
    pub fn snapshot(&self) -> Result<Option<PathBuf>> {
        let taken = self.shared.take_snapshot();
        if let Err(e) = &taken {
            self.shared.log.telemetry().snapshot_failed(e, false);
        }
        taken
    }

    /// Makes every accepted append durable now (writes and fsyncs whatever
    /// a buffered policy holds; under `Always` everything acknowledged
    /// already is).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the write or fsync failed (the store is poisoned
    /// from then on), [`Error::Poisoned`] after an earlier failure.
    pub fn sync(&self) -> Result<()> {
        let synced = self.shared.sync();
        self.shared.log.telemetry().producers(self.len());
        synced
    }

    /// The log position the next record takes. A single-sequence append
    /// has no offset of its own: its position stands in for it in
    /// [`ProducerStateStore::truncate_to`], so a broker that uses those
    /// reads this (after an append returns, the append's position is this
    /// minus one, if nothing else was appended meanwhile). Records queued
    /// but not yet durable count.
    pub fn next_position(&self) -> u64 {
        self.shared.lock_state().log.next_position()
    }

    /// One past the highest offset appended (a batch's offset, a
    /// single-sequence append's position; `truncate_to(offset)` lowers it
    /// to `offset`): the highest offset [`ProducerStateStore::truncate_to`]
    /// accepts, like Kafka's log end offset for the state. 0 for a store
    /// that has seen no append. Under `Always` the state of durable
    /// appends.
    pub fn end_offset(&self) -> i64 {
        self.shared.lock_state().keys.meta.high.saturating_add(1)
    }

    /// What recovery found when the store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Counters of the store's IO since it was opened.
    pub fn stats(&self) -> StoreStats {
        let st = self.shared.lock_state();
        let log = st.log.stats();
        let life = st.life_stats;
        let [accepted, duplicates, out_of_order, fenced] = st.answered;
        StoreStats {
            accepted,
            duplicates,
            out_of_order,
            fenced,
            errors: self.shared.log.telemetry().errors(),
            records_written: log.records_written,
            bytes_written: log.bytes_written,
            groups_written: log.groups_written,
            log_fsyncs: log.log_fsyncs,
            log_fsync_time: log.fsync_time,
            snapshots_written: st.snapshots_written,
            peak_buffered_bytes: log.peak_buffered_bytes,
            expired: life.expired,
            evicted: life.evicted,
            partition_removed: life.partition_removed,
            truncations: life.truncations,
            truncated_keys: life.truncated_keys,
            skimmed_truncations: life.skimmed_truncations,
            imported: life.imported,
        }
    }

    /// The error of the last automatic snapshot, if it failed (the log is
    /// unaffected; the next threshold tries again).
    pub fn last_snapshot_error(&self) -> Option<Arc<Error>> {
        self.shared.snapshots.last_error()
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops the background threads, makes everything durable and releases
    /// the directory. Dropping the store does the same, ignoring errors.
    ///
    /// # Errors
    ///
    /// The error of the final sync, if any, or [`Error::Poisoned`].
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        {
            let mut bg = lock(&self.shared.bg);
            bg.stop = true;
            self.shared.bg_cv.notify_all();
        }
        for h in self.background.drain(..) {
            let _ = h.join();
        }
        let result = self.shared.sync();
        self.shared.log.stop();
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
        // Nothing changes the keys any more: take them out of the gauges.
        self.shared.log.telemetry().producers(0);
        self.shared.log.telemetry().late_transactions(0);
        // Everything is durable and nothing more is written: mark the log
        // closed cleanly, unless something failed.
        result?;
        if self.shared.log.lock_state_quietly().log.failed().is_some() {
            return Ok(());
        }
        self.shared.log.writer().close()
    }
}

impl Drop for ProducerStateStore {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Strict mode: refuses what the strict rules have no meaning for (an origin
/// or transactional flags), and a name the log cannot hold.
#[inline]
fn check_seed(r: &AppendRequest) -> Result<()> {
    if r.options != crate::batch::AppendOptions::client() {
        return Err(Error::Unsupported {
            what: "an append with an origin or transactional flags",
            semantics: crate::semantics::Semantics::Strict,
        });
    }
    check_name(r)
}

/// Refuses a producer name the log cannot hold, before anything happens.
fn check_name(r: &AppendRequest) -> Result<()> {
    match r.producer_id.name_bytes() {
        Some(name) if name.len() > MAX_NAME => Err(Error::ProducerIdTooLong {
            len: name.len(),
            max: MAX_NAME,
        }),
        _ => Ok(()),
    }
}

impl Shared {
    fn is_always(&self) -> bool {
        self.log.is_always()
    }

    #[inline]
    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.log.lock_state()
    }

    /// Takes the state lock to write records (`quietly`: without making
    /// the lock's holders let it in, see [`GroupCommit::lock_state`]): under
    /// the buffered policies once the buffer has room; the store's failure
    /// if it failed.
    #[inline]
    fn lock_to_write(&self, quietly: bool) -> Result<MutexGuard<'_, State>> {
        let mut st = if quietly {
            self.log.lock_state_quietly()
        } else {
            self.lock_state()
        };
        if !self.is_always() {
            st = self.room(st);
        }
        if let Some(f) = st.log.failed() {
            return Err(f.error_for(None));
        }
        Ok(st)
    }

    /// The clock's reading for a call appending `requests`: read only if
    /// one of them is a single-sequence append, the only kind whose
    /// activity is the clock's (a batch's is its timestamp; reading the
    /// clock costs about as much as a buffered append on some machines).
    #[inline]
    fn now_for(&self, requests: &[AppendRequest]) -> i64 {
        if requests.iter().any(|r| r.metadata.is_none()) {
            self.opts.clock.now_ms()
        } else {
            i64::MIN
        }
    }

    /// See [`GroupCommit::room`].
    #[inline]
    fn room<'a>(&'a self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.log.room(st)
    }

    /// `Always`, after queueing: see [`GroupCommit::commit`].
    #[inline]
    fn commit(&self, st: MutexGuard<'_, State>) {
        self.log.commit(st, || self.snapshot_due());
    }

    fn await_durable(&self, group: u64, pos: u64) -> Result<()> {
        self.log.await_durable(group, pos)
    }

    /// Lets go of the state lock until the record at `pos` (of commit
    /// group `group`) is durable, then takes it again: what an operation on
    /// a key with a record in flight does before it tries again. Leads a
    /// group commit if nobody does: a pipelined append queues its record
    /// without one (`append_pipelined`). The store's failure if it failed
    /// meanwhile.
    fn relock_after<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        group: u64,
        pos: u64,
    ) -> Result<MutexGuard<'a, State>> {
        self.commit(st);
        self.await_durable(group, pos)?;
        let st = self.lock_state();
        if let Some(f) = st.log.failed() {
            return Err(f.error_for(None));
        }
        Ok(st)
    }

    fn sync(&self) -> Result<()> {
        self.log.sync(|| self.snapshot_due())
    }

    fn take_snapshot(&self) -> Result<Option<PathBuf>> {
        self.snapshots.take(&self.log, || self.sync())
    }

    /// Buffered policies, after an accepted append: hands a full buffer to
    /// the flusher and starts a snapshot if a threshold was crossed.
    fn after_buffered(&self, mut st: MutexGuard<'_, State>) {
        let len = st.log.buffered();
        let stats = st.log.stats_mut();
        stats.peak_buffered_bytes = stats.peak_buffered_bytes.max(len as u64);
        if len >= FLUSH_BYTES {
            st.log.hand_to_flusher();
        }
        let due = st.note_snapshot_due();
        drop(st);
        if due {
            self.snapshot_due();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn the_store_is_send_and_sync() {
        assert_send_sync::<ProducerStateStore>();
    }
}
