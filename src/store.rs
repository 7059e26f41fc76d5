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
//! waits only when 8 MiB are pending: the disk is behind).
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

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::batch::{AppendRequest, Batch};
use crate::entry::ProducerEntry;
use crate::error::{Error, Result};
use crate::fs::{EntryKind, FileSystem, LockGuard, StdFs, remove_gradually};
use crate::id::ProducerId;
use crate::map::hash_key;
use crate::outcome::{AppendOutcome, BatchOutcome};
use crate::recovery::{self, RecoveryMode, RecoveryReport};
use crate::rules;
use crate::shards::{SHARDS, Shards, shard_of, warm};
use crate::snapshot;
use crate::wal::record::{MAX_NAME, RecordBuf};
use crate::wal::writer::{IdSource, LogWriter};

/// When the log is fsync'ed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every accepted append is on disk (written and fsync'ed) before
    /// `append` returns; concurrent appends share fsyncs. Nothing
    /// acknowledged is ever lost. The default.
    Always,
    /// Records are buffered in the process, written when 64 KiB are
    /// buffered, and written and fsync'ed every interval by a thread of
    /// their own (and on [`ProducerStateStore::sync`], snapshots and
    /// close). A crash, of the process or of the machine, loses at most the
    /// appends acknowledged during the last interval (plus the time one
    /// write and fsync take; a snapshot running meanwhile does not delay
    /// them). A failed write or fsync poisons the store; appends already
    /// acknowledged may then be lost, as in a crash.
    Interval(Duration),
    /// Records are buffered in the process (64 KiB) and handed to the OS,
    /// never fsync'ed except on [`ProducerStateStore::sync`], snapshots,
    /// segment rolls and close. Not crash-safe: a process crash loses the
    /// buffer, a machine crash whatever the OS had not written. For tests
    /// and bulk loads.
    Never,
}

/// How a [`ProducerStateStore`] is opened. Every setter documents its default.
#[derive(Clone)]
pub struct StoreOptions {
    fsync: FsyncPolicy,
    snapshot_every_records: Option<u64>,
    snapshot_every_bytes: Option<u64>,
    segment_size: u64,
    keep_snapshots: usize,
    recovery: RecoveryMode,
    background_snapshots: bool,
    fs: Arc<dyn FileSystem>,
    ids: IdSource,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            fsync: FsyncPolicy::Always,
            snapshot_every_records: Some(1_000_000),
            snapshot_every_bytes: Some(64 << 20),
            segment_size: 64 << 20,
            keep_snapshots: 2,
            recovery: RecoveryMode::Strict,
            background_snapshots: true,
            fs: Arc::new(StdFs),
            ids: IdSource::Random,
        }
    }
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("fsync", &self.fsync)
            .field("snapshot_every_records", &self.snapshot_every_records)
            .field("snapshot_every_bytes", &self.snapshot_every_bytes)
            .field("segment_size", &self.segment_size)
            .field("keep_snapshots", &self.keep_snapshots)
            .field("recovery", &self.recovery)
            .field("background_snapshots", &self.background_snapshots)
            .field("fs", &self.fs)
            .finish()
    }
}

impl StoreOptions {
    /// When the log is fsync'ed. Default [`FsyncPolicy::Always`].
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }

    /// Take a snapshot after this many accepted appends (`None`: never by
    /// count). Default 1,000,000. Recovery replays at most about this many
    /// records; a snapshot costs one pass over the state.
    pub fn snapshot_every_records(mut self, n: Option<u64>) -> Self {
        self.snapshot_every_records = n;
        self
    }

    /// Take a snapshot after this many bytes of log (`None`: never by size).
    /// Default 64 MiB.
    pub fn snapshot_every_bytes(mut self, n: Option<u64>) -> Self {
        self.snapshot_every_bytes = n;
        self
    }

    /// Roll to a new log segment once the active one holds this many bytes
    /// (a soft limit: one group of records never spans two segments).
    /// Default 64 MiB; at least 1 KiB and at most 1 GiB (a segment never
    /// grows past 4 GiB, the most its records' offsets can describe).
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// Derives the store id and every segment's salt from `seed` instead
    /// of drawing them at random, so that a fixed history writes fixed
    /// bytes: for the golden-file tests only. Two stores given one seed
    /// cannot tell each other's segments apart (docs/format.md).
    #[doc(hidden)]
    pub fn fixed_ids_for_tests(mut self, seed: u64) -> Self {
        self.ids = IdSource::Fixed(seed);
        self
    }

    /// How many snapshots to keep (at least 2, so that recovery can fall
    /// back to an older one; the log is kept back to the oldest). Default 2.
    pub fn keep_snapshots(mut self, n: usize) -> Self {
        self.keep_snapshots = n;
        self
    }

    /// What recovery does with damage other than a torn tail. Default
    /// [`RecoveryMode::Strict`].
    pub fn recovery(mut self, mode: RecoveryMode) -> Self {
        self.recovery = mode;
        self
    }

    /// Run automatic snapshots on a background thread (default `true`). With
    /// `false` the append that crosses a threshold takes the snapshot before
    /// it returns: slower for that append, but deterministic, which tests
    /// under a simulated file system want.
    pub fn background_snapshots(mut self, on: bool) -> Self {
        self.background_snapshots = on;
        self
    }

    /// The file system to use. Default [`StdFs`]; tests use [`crate::fs::SimFs`].
    pub fn file_system(mut self, fs: Arc<dyn FileSystem>) -> Self {
        self.fs = fs;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.keep_snapshots < 2 {
            return Err(Error::InvalidOptions(format!(
                "keep_snapshots must be at least 2, not {}",
                self.keep_snapshots
            )));
        }
        if !(1024..=1 << 30).contains(&self.segment_size) {
            return Err(Error::InvalidOptions(format!(
                "segment_size must be between 1 KiB and 1 GiB, not {}",
                self.segment_size
            )));
        }
        if self.fsync == FsyncPolicy::Interval(Duration::ZERO) {
            return Err(Error::InvalidOptions(
                "the fsync interval must be above zero".into(),
            ));
        }
        if self.snapshot_every_records == Some(0) || self.snapshot_every_bytes == Some(0) {
            return Err(Error::InvalidOptions(
                "snapshot thresholds must be above zero (or None)".into(),
            ));
        }
        Ok(())
    }
}

/// Records buffered before a buffered policy hands them to the flusher.
const FLUSH_BYTES: usize = 64 << 10;

/// Records buffered at which a buffered append waits for the flusher (the
/// disk is slower than the appends): memory stays bounded.
const MAX_BUFFERED: usize = 8 << 20;

/// Requests [`ProducerStateStore::append_all`] looks up ahead of applying
/// them under a buffered policy (see [`warm`]): few enough that their slots
/// stay in the first-level cache.
const WARM: usize = 32;

/// Futex words that appenders waiting for a group sleep on; group `g` uses
/// `words[g % WAIT_SLOTS]`. At most two groups are pending at a time (the
/// one being written and the one forming), so waiters of different groups
/// rarely share a word.
const WAIT_SLOTS: usize = 4;

/// A key with appends in flight (queued or written, not yet durable).
struct Pending {
    hash: u64,
    id: ProducerId,
    partition: i32,
    /// The key's state once everything in flight is applied.
    entry: ProducerEntry,
    /// Position and group of the key's last record in flight.
    lsn: u64,
    group: u64,
}

/// A queued record waiting to be applied once durable (`Always`).
struct Queued {
    hash: u64,
    request: AppendRequest,
    lsn: u64,
}

/// Why the store is poisoned.
#[derive(Clone)]
struct Failure {
    op: &'static str,
    path: PathBuf,
    kind: io::ErrorKind,
    message: String,
    /// Positions of the records lost with the failed group (and queued
    /// behind it).
    group: (u64, u64),
}

impl Failure {
    fn from_error(e: &Error, group: (u64, u64)) -> Failure {
        match e {
            Error::Io { op, path, source } => Failure {
                op,
                path: path.clone(),
                kind: source.kind(),
                message: source.to_string(),
                group,
            },
            other => Failure {
                op: "write",
                path: PathBuf::new(),
                kind: io::ErrorKind::Other,
                message: other.to_string(),
                group,
            },
        }
    }

    /// The error an append whose record has position `lsn` gets.
    fn error_for(&self, lsn: Option<u64>) -> Error {
        match lsn {
            Some(l) if (self.group.0..self.group.1).contains(&l) => Error::Io {
                op: self.op,
                path: self.path.clone(),
                source: io::Error::new(self.kind, self.message.clone()),
            },
            _ => Error::Poisoned {
                cause: format!("{} {}: {}", self.op, self.path.display(), self.message),
            },
        }
    }
}

/// A snapshot in progress: the position and which shards are encoded.
struct Capture {
    position: u64,
    done: [bool; SHARDS],
    /// Per shard: entries as they were at `position`, for keys changed since
    /// (`None`: the key did not exist at `position`).
    pre: Vec<HashMap<(ProducerId, i32), Option<ProducerEntry>>>,
}

struct State {
    shards: Shards,
    /// `Always`: the keys with records in flight.
    overlay: HashTable<Pending>,
    /// Encoded records not yet written (the forming group), and (`Always`)
    /// what they apply.
    buf: RecordBuf,
    queued: Vec<Queued>,
    /// The buffer of the last group written, kept for the next one: a
    /// fresh buffer would grow (and fault in its pages) all over again.
    spare: Vec<u8>,
    /// Position of `buf`'s first record.
    buf_first: u64,
    next_lsn: u64,
    /// Id of the group forming in `buf`; groups are written in id order.
    group: u64,
    /// The group being written, if one is.
    writing: Option<u64>,
    /// Records before `durable` are fsync'ed (and, under `Always`, applied).
    durable: u64,
    /// `sync` wants records before this durable: the leader fsyncs.
    sync_to: u64,
    /// A group commit is running (or the flusher has been told to run one).
    /// Whenever `buf` holds records under `Always`, this is true: somebody
    /// will commit them.
    leading: bool,
    /// The flusher thread, and whether it should take over as leader.
    flusher: Option<std::thread::Thread>,
    flusher_turn: bool,
    stopping: bool,
    failed: Option<Failure>,
    capture: Option<Capture>,
    since_snapshot: (u64, u64),
    snapshot_requested: bool,
    stats: StoreStats,
}

/// Counters of the store's IO since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Accepted appends written to the log.
    pub records_written: u64,
    /// Writes of record groups (one per group commit).
    pub groups_written: u64,
    /// fsyncs of the log.
    pub log_fsyncs: u64,
    /// Snapshots written.
    pub snapshots_written: u64,
    /// The most bytes of records held in memory, not yet handed to the OS
    /// (buffered policies: bounded near 8 MiB plus one `append_all` call).
    pub peak_buffered_bytes: u64,
}

struct Book {
    /// Positions of every snapshot file on disk.
    files: BTreeSet<u64>,
    /// Positions of snapshots not known to be damaged, oldest first.
    valid: Vec<u64>,
    /// Segments detached from the writer whose removal failed: retention
    /// tries them again next time.
    orphans: Vec<PathBuf>,
}

struct Bg {
    stop: bool,
    snapshot_wanted: bool,
}

/// What appenders waiting for a group read without the state lock.
#[derive(Default)]
struct Signal {
    /// Every group with a smaller id is done: durable and applied, or failed.
    completed: AtomicU64,
    /// Records before this position are durable.
    durable: AtomicU64,
    failed: AtomicBool,
    words: [AtomicU32; WAIT_SLOTS],
}

impl Signal {
    fn word(&self, group: u64) -> &AtomicU32 {
        &self.words[(group % WAIT_SLOTS as u64) as usize]
    }

    /// Sleeps until group `group` is done or the store is poisoned.
    fn await_group(&self, group: u64) {
        let w = self.word(group);
        loop {
            let seen = w.load(Ordering::Acquire);
            if self.completed.load(Ordering::Acquire) > group || self.failed.load(Ordering::Acquire)
            {
                return;
            }
            atomic_wait::wait(w, seen);
        }
    }

    /// Wakes the waiters of `group` (every waiter after a failure). One
    /// futex call wakes them all: the kernel does the rest, and the leader
    /// makes no call per waiter.
    fn wake(&self, group: u64, failed: bool) {
        let words = if failed {
            &self.words[..]
        } else {
            std::slice::from_ref(self.word(group))
        };
        for w in words {
            w.fetch_add(1, Ordering::Release);
            atomic_wait::wake_all(w);
        }
    }
}

struct Shared {
    dir: PathBuf,
    opts: StoreOptions,
    state: Mutex<State>,
    /// Threads waiting for `state` (see [`Shared::lock_state`]).
    state_waiters: AtomicU32,
    signal: Signal,
    /// Notified after every group (for `sync`, which is not a hot path).
    group_done: Condvar,
    writer: Mutex<LogWriter>,
    book: Mutex<Book>,
    /// The last automatic snapshot's error (apart from `book`, which a
    /// snapshot holds while it runs).
    snapshot_error: Mutex<Option<String>>,
    bg: Mutex<Bg>,
    bg_cv: Condvar,
    _lock: Box<dyn LockGuard>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The store never panics while holding a lock except on a bug; after
    // one, the state is still consistent at the granularity of the lock.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What submitting one request under `Always` came to.
enum Submit {
    Done(BatchOutcome),
    /// Accepted and queued at this position, in this group: wait for it.
    Queued {
        group: u64,
        lsn: u64,
    },
    /// The key has records in flight up to this position (in this group)
    /// and the request is not their continuation: wait, then classify again.
    Wait {
        group: u64,
        lsn: u64,
    },
}

impl State {
    /// Tells the flusher thread to take over as leader.
    fn call_flusher(&mut self) {
        self.flusher_turn = true;
        if let Some(f) = &self.flusher {
            f.unpark();
        }
    }

    fn overlay_find(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<&Pending> {
        self.overlay
            .find(hash, |p| p.partition == partition && p.id == *id)
    }

    /// Saves the entry of a key about to change if a snapshot needs it as
    /// it was at the snapshot's position.
    fn save_pre_image(&mut self, hash: u64, id: &ProducerId, partition: i32, lsn: u64) {
        let Some(c) = &mut self.capture else { return };
        let s = shard_of(hash);
        if c.done[s] || lsn < c.position {
            return;
        }
        let shards = &self.shards;
        c.pre[s]
            .entry((id.clone(), partition))
            .or_insert_with(|| shards.get(hash, id, partition));
    }

    fn enqueue_record(&mut self, r: &AppendRequest) -> u64 {
        let before = self.buf.len();
        self.buf.push(r);
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        self.since_snapshot.0 += 1;
        self.since_snapshot.1 += (self.buf.len() - before) as u64;
        lsn
    }

    /// `Always`: classifies against the in-flight state if the key has one,
    /// else the committed state; queues an accepted request.
    fn submit_durable(&mut self, hash: u64, r: &AppendRequest) -> Submit {
        let (base, in_flight) = match self.overlay_find(hash, &r.producer_id, r.partition) {
            Some(p) => (Some(p.entry), Some((p.group, p.lsn))),
            None => (self.shards.get(hash, &r.producer_id, r.partition), None),
        };
        let outcome = rules::classify(
            base.map(|e| e.current()),
            r.epoch,
            r.first,
            r.last,
            |f, l| base.and_then(|e| e.find(f, l)),
        );
        if !outcome.is_accepted() {
            return match in_flight {
                Some((group, lsn)) => Submit::Wait { group, lsn },
                None => Submit::Done(outcome),
            };
        }
        let entry = match base {
            Some(mut e) => {
                e.accept(r.epoch > e.epoch(), r.epoch, r.first, r.last, r.metadata);
                e
            }
            None => ProducerEntry::start(r.epoch, r.first, r.last, r.metadata),
        };
        let lsn = self.enqueue_record(r);
        let group = self.group;
        self.queued.push(Queued {
            hash,
            request: r.clone(),
            lsn,
        });
        match self.overlay.find_mut(hash, |p| {
            p.partition == r.partition && p.id == r.producer_id
        }) {
            Some(p) => {
                p.entry = entry;
                p.lsn = lsn;
                p.group = group;
            }
            None => {
                self.overlay.insert_unique(
                    hash,
                    Pending {
                        hash,
                        id: r.producer_id.clone(),
                        partition: r.partition,
                        entry,
                        lsn,
                        group,
                    },
                    |p| p.hash,
                );
            }
        }
        Submit::Queued { group, lsn }
    }

    /// Buffered policies: classify, apply and queue the record at once.
    #[inline]
    fn submit_buffered(&mut self, hash: u64, r: &AppendRequest) -> BatchOutcome {
        if self.capture.is_some() {
            // If the append is rejected, the pre-image equals the current
            // entry, which is harmless.
            let lsn = self.next_lsn;
            self.save_pre_image(hash, &r.producer_id, r.partition, lsn);
        }
        let outcome = self.shards.append(hash, r);
        if outcome.is_accepted() {
            self.enqueue_record(r);
        }
        outcome
    }

    /// `Always`: applies a durable group to the committed state.
    fn apply_group(&mut self, group: Vec<Queued>) -> std::result::Result<(), String> {
        for q in group {
            let r = &q.request;
            self.save_pre_image(q.hash, &r.producer_id, r.partition, q.lsn);
            let outcome = self.shards.append(q.hash, r);
            if !outcome.is_accepted() {
                return Err(format!(
                    "internal error: the durable record at position {} did not apply ({outcome})",
                    q.lsn
                ));
            }
            if let Ok(entry) = self.overlay.find_entry(q.hash, |p| {
                p.partition == r.partition && p.id == r.producer_id
            }) && entry.get().lsn == q.lsn
            {
                entry.remove();
            }
        }
        Ok(())
    }
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
    /// # Errors
    ///
    /// [`Error::Locked`] if another open store holds the directory;
    /// [`Error::NotADirectory`] if `dir` is a file; [`Error::Corrupt`] if
    /// recovery finds damage other than a torn tail; [`Error::Io`] if the
    /// file system fails.
    pub fn open(dir: impl AsRef<Path>) -> Result<ProducerStateStore> {
        ProducerStateStore::open_with(dir, StoreOptions::default())
    }

    /// Opens the store in `dir` with `opts`. Errors as [`ProducerStateStore::open`],
    /// and [`Error::InvalidOptions`].
    pub fn open_with(dir: impl AsRef<Path>, opts: StoreOptions) -> Result<ProducerStateStore> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let fs = opts.fs.clone();
        match fs.kind(&dir).map_err(|e| Error::io("stat", &dir, e))? {
            Some(EntryKind::Dir) => {}
            Some(_) => return Err(Error::NotADirectory { path: dir }),
            None => fs
                .create_dir_all(&dir)
                .map_err(|e| Error::io("create directory", &dir, e))?,
        }
        let lock_path = dir.join("LOCK");
        let guard = fs
            .try_lock(&lock_path)
            .map_err(|e| Error::io("lock", &lock_path, e))?
            .ok_or_else(|| Error::Locked { path: dir.clone() })?;

        let rec = recovery::recover(fs.as_ref(), &dir, opts.recovery)?;
        let writer = match rec.active {
            Some((len, records)) => LogWriter::resume(
                fs.clone(),
                &dir,
                rec.segments,
                len,
                records,
                opts.segment_size,
                opts.ids,
            )?,
            None => LogWriter::create(
                fs.clone(),
                &dir,
                rec.next_lsn,
                opts.segment_size,
                rec.segments,
                rec.store_id,
                opts.ids,
            )?,
        };
        debug_assert_eq!(writer.next_lsn(), rec.next_lsn);
        let state = State {
            shards: rec.shards,
            overlay: HashTable::new(),
            buf: RecordBuf::default(),
            queued: Vec::new(),
            spare: Vec::new(),
            buf_first: rec.next_lsn,
            next_lsn: rec.next_lsn,
            group: 0,
            writing: None,
            durable: rec.next_lsn,
            sync_to: 0,
            leading: false,
            flusher: None,
            flusher_turn: false,
            stopping: false,
            failed: None,
            capture: None,
            since_snapshot: (rec.report.records_replayed, 0),
            snapshot_requested: false,
            stats: StoreStats::default(),
        };
        let signal = Signal::default();
        signal.durable.store(rec.next_lsn, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            dir,
            state: Mutex::new(state),
            state_waiters: AtomicU32::new(0),
            signal,
            group_done: Condvar::new(),
            writer: Mutex::new(writer),
            book: Mutex::new(Book {
                files: rec.snapshot_files,
                valid: rec.snapshots,
                orphans: Vec::new(),
            }),
            snapshot_error: Mutex::new(None),
            bg: Mutex::new(Bg {
                stop: false,
                snapshot_wanted: false,
            }),
            bg_cv: Condvar::new(),
            _lock: guard,
            opts,
        });
        // Snapshots and the interval's fsyncs run on threads of their own:
        // a snapshot of a large state on a slow disk takes seconds, and the
        // interval's loss window must not grow by that much.
        let mut background = Vec::new();
        let spawn = |name: &str, f: fn(&Shared)| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&s))
                .map_err(|e| Error::io("spawn background thread", &shared.dir, e))
        };
        if shared.opts.background_snapshots {
            background.push(spawn("producer-state-snap", Shared::background)?);
        }
        if matches!(shared.opts.fsync, FsyncPolicy::Interval(_)) {
            background.push(spawn("producer-state-tick", Shared::tick)?);
        }
        let s = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("producer-state-flush".into())
            .spawn(move || s.flush_loop())
            .map_err(|e| Error::io("spawn flusher thread", &shared.dir, e))?;
        shared.lock_state().flusher = Some(flusher.thread().clone());
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
    /// returning. Errors as [`ProducerStateStore::append`].
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
    /// returning. Errors as [`ProducerStateStore::append`].
    pub fn append_request(&self, request: &AppendRequest) -> Result<BatchOutcome> {
        check_name(request)?;
        let shared = &*self.shared;
        let hash = hash_key(&request.producer_id, request.partition);
        let mut st = shared.lock_state();
        if !shared.is_always() {
            st = shared.room(st);
        }
        if let Some(f) = &st.failed {
            return Err(f.error_for(None));
        }
        if !shared.is_always() {
            let o = st.submit_buffered(hash, request);
            if o.is_accepted() {
                shared.after_buffered(st);
            }
            return Ok(o);
        }
        loop {
            match st.submit_durable(hash, request) {
                Submit::Done(o) => return Ok(o),
                Submit::Queued { group, lsn } => {
                    shared.commit(st);
                    return shared
                        .await_durable(group, lsn)
                        .map(|()| BatchOutcome::Accepted);
                }
                Submit::Wait { group, lsn } => {
                    drop(st);
                    shared.await_durable(group, lsn)?;
                    st = shared.lock_state();
                    if let Some(f) = &st.failed {
                        return Err(f.error_for(None));
                    }
                }
            }
        }
    }

    /// Appends many requests, for example one produce request covering many
    /// partitions: the same outcomes as appending them one by one in this
    /// order, but under one lock, and all accepted records share one write
    /// and one fsync (unless a request retries an earlier one of the same
    /// call, which then waits for it to be durable). Outcomes are in input
    /// order.
    pub fn append_all(&self, requests: &[AppendRequest]) -> Vec<Result<BatchOutcome>> {
        let shared = &*self.shared;
        let mut st = shared.lock_state();
        if !shared.is_always() {
            st = shared.room(st);
            return shared.append_all_buffered(st, requests);
        }
        let mut out: Vec<Result<BatchOutcome>> = Vec::with_capacity(requests.len());
        // Accepted: (index, group, position), to settle once durable.
        let mut queued: Vec<(usize, u64, u64)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if let Err(e) = check_name(r) {
                out.push(Err(e));
                continue;
            }
            let hash = hash_key(&r.producer_id, r.partition);
            out.push(loop {
                if let Some(f) = &st.failed {
                    break Err(f.error_for(None));
                }
                match st.submit_durable(hash, r) {
                    Submit::Done(o) => break Ok(o),
                    Submit::Queued { group, lsn } => {
                        queued.push((i, group, lsn));
                        break Ok(BatchOutcome::Accepted);
                    }
                    Submit::Wait { group, lsn } => {
                        // Our own queued records may be what it waits for:
                        // make sure somebody commits them.
                        shared.commit(st);
                        let waited = shared.await_durable(group, lsn);
                        st = shared.lock_state();
                        if let Err(e) = waited {
                            break Err(e);
                        }
                    }
                }
            });
        }
        if let Some(&(_, group, lsn)) = queued.last() {
            shared.commit(st);
            if shared.await_durable(group, lsn).is_err() {
                let st = shared.lock_state();
                for &(i, _, lsn) in &queued {
                    if let Some(f) = &st.failed
                        && st.durable <= lsn
                    {
                        out[i] = Err(f.error_for(Some(lsn)));
                    }
                }
            }
        }
        out
    }

    /// The entry of one key, if it has state. Under `Always` that is the
    /// state of the durable appends; under the buffered policies, of every
    /// accepted append, including those not yet durable (and, after a
    /// failed write has poisoned the store, those the log lost: reopen to
    /// see what survived).
    pub fn get(&self, producer_id: impl Into<ProducerId>, partition: i32) -> Option<ProducerEntry> {
        let id = producer_id.into();
        let st = self.shared.lock_state();
        st.shards.get(hash_key(&id, partition), &id, partition)
    }

    /// Number of keys with state (as [`ProducerStateStore::get`] sees it).
    pub fn len(&self) -> usize {
        self.shared.lock_state().shards.len()
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
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        (0..SHARDS).flat_map(move |i| {
            let st = self.shared.lock_state();
            st.shards.shard(i).iter().collect::<Vec<_>>()
        })
    }

    /// Takes a snapshot now and waits until it is durable. Returns its path,
    /// or `None` if nothing was appended since the last snapshot.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if writing it failed (the log is unaffected and the
    /// store keeps accepting appends), [`Error::Poisoned`] if the store is.
    pub fn snapshot(&self) -> Result<Option<PathBuf>> {
        self.shared.take_snapshot()
    }

    /// Makes every accepted append durable now (writes and fsyncs whatever
    /// a buffered policy holds; under `Always` everything acknowledged
    /// already is).
    pub fn sync(&self) -> Result<()> {
        self.shared.sync()
    }

    /// What recovery found when the store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Counters of the store's IO since it was opened.
    pub fn stats(&self) -> StoreStats {
        self.shared.lock_state().stats
    }

    /// The error of the last automatic snapshot, if it failed (the log is
    /// unaffected; the next threshold tries again).
    pub fn last_snapshot_error(&self) -> Option<String> {
        lock(&self.shared.snapshot_error).clone()
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
        {
            let mut st = self.shared.lock_state();
            st.stopping = true;
            if let Some(f) = &st.flusher {
                f.unpark();
            }
        }
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
        // Everything is durable and nothing more is written: mark the log
        // closed cleanly, unless something failed.
        result?;
        if self.shared.lock_state().failed.is_some() {
            return Ok(());
        }
        lock(&self.shared.writer).close()
    }
}

impl Drop for ProducerStateStore {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
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
        self.opts.fsync == FsyncPolicy::Always
    }

    /// Takes the state lock. A thread that has to wait for it says so, so
    /// that a snapshot, which takes the lock once per shard, lets it in
    /// between two shards instead of taking the lock straight back (the
    /// lock is not fair: a woken waiter loses to a thread already running).
    fn lock_state(&self) -> MutexGuard<'_, State> {
        match self.state.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.state_waiters.fetch_add(1, Ordering::Relaxed);
                let g = lock(&self.state);
                self.state_waiters.fetch_sub(1, Ordering::Relaxed);
                g
            }
        }
    }

    /// `Always`, after queueing: leads a group commit if nobody does (the
    /// caller's record is then in it), else leaves the records to the leader.
    fn commit(&self, mut st: MutexGuard<'_, State>) {
        if st.leading {
            return;
        }
        st.leading = true;
        self.lead(st, false);
    }

    /// Buffered policies, before an append: waits while [`MAX_BUFFERED`]
    /// bytes of records are pending (the disk is behind) for the write in
    /// progress, after which the flusher takes the whole buffer. So the
    /// buffer never holds more than that plus one call's records.
    fn room<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while st.buf.len() >= MAX_BUFFERED && st.failed.is_none() {
            self.hand_to_flusher(&mut st);
            let group = st.writing.unwrap_or(st.group);
            drop(st);
            self.signal.await_group(group);
            st = self.lock_state();
        }
        st
    }

    /// Buffered policies: starts the flusher on the buffer unless a write
    /// is already under way (which takes whatever is buffered next).
    fn hand_to_flusher(&self, st: &mut State) {
        if !st.leading {
            st.leading = true;
            st.call_flusher();
        }
    }

    /// Buffered policies, after an accepted append: hands a full buffer to
    /// the flusher and starts a snapshot if a threshold was crossed.
    fn after_buffered(&self, mut st: MutexGuard<'_, State>) {
        let len = st.buf.len();
        st.stats.peak_buffered_bytes = st.stats.peak_buffered_bytes.max(len as u64);
        if len >= FLUSH_BYTES {
            self.hand_to_flusher(&mut st);
        }
        let due = self.note_snapshot_due(&mut st);
        drop(st);
        if due {
            self.snapshot_due();
        }
    }

    /// [`ProducerStateStore::append_all`] under a buffered policy: classify,
    /// apply and encode every request under one lock.
    fn append_all_buffered(
        &self,
        mut st: MutexGuard<'_, State>,
        requests: &[AppendRequest],
    ) -> Vec<Result<BatchOutcome>> {
        if let Some(f) = &st.failed {
            return requests
                .iter()
                .map(|r| check_name(r).and(Err(f.error_for(None))))
                .collect();
        }
        let mut accepted = false;
        let mut out = Vec::with_capacity(requests.len());
        let mut hashes = [0u64; WARM];
        for chunk in requests.chunks(WARM) {
            for (h, r) in hashes.iter_mut().zip(chunk) {
                *h = hash_key(&r.producer_id, r.partition);
            }
            let shards = &st.shards;
            warm(hashes.iter().copied().zip(chunk), |hash, r| {
                shards.contains(hash, &r.producer_id, r.partition)
            });
            for (&hash, r) in hashes.iter().zip(chunk) {
                out.push(check_name(r).map(|()| {
                    let o = st.submit_buffered(hash, r);
                    accepted |= o.is_accepted();
                    o
                }));
            }
        }
        if accepted {
            self.after_buffered(st);
        }
        out
    }

    /// Waits until the record at `lsn`, in group `group`, is durable.
    fn await_durable(&self, group: u64, lsn: u64) -> Result<()> {
        self.signal.await_group(group);
        if self.signal.durable.load(Ordering::Acquire) > lsn {
            return Ok(());
        }
        let st = self.lock_state();
        if st.durable > lsn {
            return Ok(());
        }
        Err(match &st.failed {
            Some(f) => f.error_for(Some(lsn)),
            None => Error::Poisoned {
                cause: format!("internal error: group {group} done without record {lsn}"),
            },
        })
    }

    /// Leads group commits: takes the forming group (every record queued),
    /// writes it with one `write` (in log order: the writer lock is taken
    /// before the state lock is let go), fsyncs it through a handle of its
    /// own if the policy or a `sync` call asks, applies it (`Always`) and
    /// wakes its waiters with one futex call. Then, if records were queued
    /// meanwhile, an appender (`flusher` false) hands the next group to the
    /// flusher thread and returns to its caller, while the flusher goes on
    /// until nothing is queued. The check for more comes after the wake-up,
    /// so that appenders woken by it can join the next group.
    fn lead<'a>(&'a self, mut st: MutexGuard<'a, State>, flusher: bool) {
        let mut due = false;
        loop {
            let group = st.group;
            st.group += 1;
            st.writing = Some(group);
            let first = st.buf_first;
            let end = st.next_lsn;
            let spare = std::mem::take(&mut st.spare);
            let mut buf = st.buf.take(spare);
            let queued = std::mem::take(&mut st.queued);
            st.buf_first = end;
            let needs_sync = (self.is_always() || st.sync_to > st.durable) && st.durable < end;
            let mut w = lock(&self.writer);
            drop(st);

            let result = (|| {
                if !buf.is_empty() {
                    w.write(&mut buf, first, end - first)?;
                }
                let handle = if needs_sync {
                    Some(w.sync_handle()?)
                } else {
                    None
                };
                drop(w);
                if let Some((mut h, token)) = handle {
                    h.sync_data()
                        .map_err(|e| Error::io("fsync", &token.path, e))?;
                    lock(&self.writer).synced(&token);
                }
                Ok::<(), Error>(())
            })();

            st = self.lock_state();
            let result = result.and_then(|()| {
                if let Some(f) = &st.failed {
                    return Err(f.error_for(None));
                }
                if !buf.is_empty() {
                    st.stats.groups_written += 1;
                    st.stats.records_written += end - first;
                }
                if needs_sync {
                    st.stats.log_fsyncs += 1;
                    st.durable = end;
                    st.apply_group(queued)
                        .map_err(|m| Error::Poisoned { cause: m })?;
                }
                Ok(())
            });
            if let Err(e) = &result
                && st.failed.is_none()
            {
                // Everything not yet durable is lost to the appends waiting on it.
                let range = (st.durable, st.next_lsn);
                st.failed = Some(Failure::from_error(e, range));
                st.overlay.clear();
                st.queued.clear();
                st.buf.clear();
                self.signal.failed.store(true, Ordering::Release);
            }
            buf.clear();
            if st.spare.capacity() < buf.capacity() {
                st.spare = buf;
            }
            st.writing = None;
            self.signal.durable.store(st.durable, Ordering::Release);
            self.signal.completed.store(group + 1, Ordering::Release);
            let failed = st.failed.is_some();
            due |= self.is_always() && self.note_snapshot_due(&mut st);
            drop(st);
            self.signal.wake(group, failed);
            self.group_done.notify_all();

            st = self.lock_state();
            // Under the buffered policies a short buffer waits for the
            // next append to fill it to FLUSH_BYTES (or for a sync): taking
            // every few records as they come would make the appenders and
            // the flusher fight over the lock for each.
            let short = !self.is_always() && st.buf.len() < FLUSH_BYTES && st.sync_to <= st.durable;
            if st.buf.is_empty() || st.failed.is_some() || short {
                st.leading = false;
                break;
            }
            if !flusher {
                st.call_flusher();
                break;
            }
        }
        drop(st);
        // `sync` may be waiting for the lead to end.
        self.group_done.notify_all();
        if due {
            self.snapshot_due();
        }
    }

    /// The flusher thread: takes over group commits from an appender when
    /// records keep arriving (so that the appender returns to its caller)
    /// and writes the buffered policies' records in the background.
    fn flush_loop(&self) {
        loop {
            let mut st = self.lock_state();
            while !st.flusher_turn {
                if st.stopping {
                    return;
                }
                drop(st);
                std::thread::park();
                st = self.lock_state();
            }
            st.flusher_turn = false;
            self.lead(st, true);
        }
    }

    fn sync(&self) -> Result<()> {
        let mut st = self.lock_state();
        if let Some(f) = &st.failed {
            return Err(f.error_for(None));
        }
        let target = st.next_lsn;
        st.sync_to = st.sync_to.max(target);
        loop {
            // Durable first: a later group's failure does not undo it.
            if st.durable >= target {
                return Ok(());
            }
            if let Some(f) = &st.failed {
                // A failure during this call: the IO error itself if it
                // lost records the call covers.
                return Err(f.error_for(target.checked_sub(1)));
            }
            if st.leading {
                st = self.group_done.wait(st).unwrap_or_else(|e| e.into_inner());
            } else {
                st.leading = true;
                self.lead(st, false);
                st = self.lock_state();
            }
        }
    }

    /// True (once) when an automatic snapshot threshold has been crossed.
    fn note_snapshot_due(&self, st: &mut State) -> bool {
        let (records, bytes) = st.since_snapshot;
        let due = self
            .opts
            .snapshot_every_records
            .is_some_and(|n| records >= n)
            || self.opts.snapshot_every_bytes.is_some_and(|n| bytes >= n);
        if due && !st.snapshot_requested && st.failed.is_none() {
            st.snapshot_requested = true;
            return true;
        }
        false
    }

    /// Starts (or, without a background thread, takes) a due snapshot.
    fn snapshot_due(&self) {
        if self.opts.background_snapshots {
            let mut bg = lock(&self.bg);
            bg.snapshot_wanted = true;
            self.bg_cv.notify_all();
        } else if let Err(e) = self.take_snapshot() {
            *lock(&self.snapshot_error) = Some(e.to_string());
        }
    }

    /// The snapshot thread: takes the snapshots a threshold asked for.
    fn background(&self) {
        loop {
            let mut bg = lock(&self.bg);
            while !bg.stop && !bg.snapshot_wanted {
                bg = self.bg_cv.wait(bg).unwrap_or_else(|e| e.into_inner());
            }
            if bg.stop {
                return;
            }
            bg.snapshot_wanted = false;
            drop(bg);
            if let Err(e) = self.take_snapshot() {
                *lock(&self.snapshot_error) = Some(e.to_string());
            }
        }
    }

    /// `Interval(d)`: writes and fsyncs the buffered records every `d`.
    fn tick(&self) {
        let FsyncPolicy::Interval(every) = self.opts.fsync else {
            return;
        };
        let mut next = Instant::now() + every;
        loop {
            let mut bg = lock(&self.bg);
            loop {
                if bg.stop {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                bg = self
                    .bg_cv
                    .wait_timeout(bg, next - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(bg);
            // A failure poisons the store; appends report it.
            let _ = self.sync();
            next = Instant::now() + every;
        }
    }

    fn take_snapshot(&self) -> Result<Option<PathBuf>> {
        let mut book = lock(&self.book);
        let fs = self.opts.fs.as_ref();
        let position = {
            let mut st = self.lock_state();
            st.snapshot_requested = false;
            if let Some(f) = &st.failed {
                return Err(f.error_for(None));
            }
            // Under `Always` the committed state is exactly the durable
            // records; under buffered policies every record is applied.
            let p = if self.is_always() {
                st.durable
            } else {
                st.next_lsn
            };
            if book.valid.last() == Some(&p) {
                st.since_snapshot = (0, 0);
                return Ok(None);
            }
            st.capture = Some(Capture {
                position: p,
                done: [false; SHARDS],
                pre: (0..SHARDS).map(|_| HashMap::new()).collect(),
            });
            st.since_snapshot = (0, 0);
            p
        };
        let written = self.write_snapshot(fs, position);
        self.lock_state().capture = None;
        let path = match written {
            Ok(p) => p,
            Err(e) => {
                let tmp = self.dir.join(format!(
                    "{}{}",
                    snapshot::file_name(position),
                    snapshot::TMP_SUFFIX
                ));
                let _ = fs.remove_file(&tmp);
                return Err(e);
            }
        };
        self.lock_state().stats.snapshots_written += 1;
        book.files.insert(position);
        book.valid.retain(|&p| p != position);
        book.valid.push(position);
        *lock(&self.snapshot_error) = None;
        self.retain(&mut book)?;
        Ok(Some(path))
    }

    fn write_snapshot(&self, fs: &dyn FileSystem, position: u64) -> Result<PathBuf> {
        let mut w = snapshot::Writer::create(fs, &self.dir, position)?;
        let mut chunk = Vec::new();
        let mut n = 0u64;
        for i in 0..SHARDS {
            {
                let mut st = lock(&self.state);
                let st = &mut *st;
                let Some(c) = &mut st.capture else {
                    return Err(Error::Poisoned {
                        cause: "snapshot capture lost".into(),
                    });
                };
                let pre = std::mem::take(&mut c.pre[i]);
                for (id, partition, entry) in st.shards.shard(i).iter() {
                    let e = match pre.get(&(id.clone(), partition)) {
                        Some(Some(old)) => *old,
                        Some(None) => continue,
                        None => entry,
                    };
                    snapshot::encode_entry(&mut chunk, &id, partition, &e);
                    n += 1;
                }
                c.done[i] = true;
            }
            // Let appenders that queued for the lock meanwhile take it
            // before the next shard (bounded, should one never get there).
            let waited = std::time::Instant::now();
            while self.state_waiters.load(Ordering::Relaxed) > 0
                && waited.elapsed() < Duration::from_millis(1)
            {
                std::thread::yield_now();
            }
            // Write in pieces of about 1 MiB: few IO calls, bounded memory.
            if chunk.len() >= 1 << 20 || i == SHARDS - 1 {
                w.write(&chunk, n)?;
                chunk.clear();
                n = 0;
            }
        }
        if !self.is_always() {
            // The snapshot covers records the log may not hold durably yet:
            // make the log durable first, or a crash could leave a snapshot
            // ahead of its log.
            self.sync()?;
        }
        w.finish(fs, &self.dir)
    }

    /// Deletes snapshots beyond the newest `keep_snapshots`, and the log
    /// segments whose records all lie before the oldest one kept.
    fn retain(&self, book: &mut Book) -> Result<()> {
        let keep = self.opts.keep_snapshots;
        if book.valid.len() <= keep {
            return Ok(());
        }
        let oldest_kept = book.valid[book.valid.len() - keep];
        let fs = self.opts.fs.as_ref();
        let doomed: Vec<u64> = book
            .files
            .iter()
            .copied()
            .filter(|&p| p < oldest_kept)
            .collect();
        // A file already gone (removed by hand, say) is what we wanted.
        let remove = |path: &Path| match remove_gradually(fs, path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path, e)),
            _ => Ok(()),
        };
        for p in &doomed {
            remove(&self.dir.join(snapshot::file_name(*p)))?;
            book.files.remove(p);
        }
        book.valid.retain(|&p| p >= oldest_kept);
        let mut segments = std::mem::take(&mut book.orphans);
        segments.extend(lock(&self.writer).detach_before(oldest_kept));
        let mut left = segments.into_iter();
        while let Some(path) = left.next() {
            if let Err(e) = remove(&path) {
                book.orphans.push(path);
                book.orphans.extend(left);
                return Err(e);
            }
        }
        fs.sync_dir(&self.dir)
            .map_err(|e| Error::io("fsync directory", &self.dir, e))
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

    #[test]
    fn options_are_validated() {
        let bad = [
            StoreOptions::default().keep_snapshots(1),
            StoreOptions::default().segment_size(10),
            StoreOptions::default().segment_size((1 << 30) + 1),
            StoreOptions::default().fsync(FsyncPolicy::Interval(Duration::ZERO)),
            StoreOptions::default().snapshot_every_records(Some(0)),
        ];
        for o in bad {
            assert!(
                matches!(o.validate(), Err(Error::InvalidOptions(_))),
                "{o:?}"
            );
        }
        assert!(StoreOptions::default().validate().is_ok());
    }
}
