//! Group commit: the log queue, who leads its commits, and the flusher
//! thread.
//!
//! Self-contained in the spirit of raft-engine's `write_barrier.rs`: it
//! knows records, positions and groups, not keys. Its state, a
//! [`LogQueue`], lives behind the same mutex as whatever the store keeps
//! beside it (the [`Host`]), because the order in which the store
//! classifies appends must be the order of their records in the log; the
//! host is told when a group is durable ([`Host::apply_durable`]) and when
//! one failed ([`Host::discard_in_flight`]).
//!
//! A group is everything queued when a leader takes it: one `write`, and
//! one `fdatasync` through a handle of its own (the writer's lock is not
//! held meanwhile, so the next group can form). One group is written at a
//! time, so only the group being written is ever unsynced. Appenders of a
//! group sleep on one futex word of [`Signal`] and read the outcome from
//! atomics, so a commit costs the leader one wake-up call whatever the
//! group's size.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::batch::AppendRequest;
use crate::error::{Error, Result};
use crate::recovery::reach::{self, Placed, Reach};
use crate::recovery::replay::append_offset;
use crate::telemetry::{Group, Poison, Telemetry};
use crate::wal::record::RecordBuf;
#[cfg(test)]
use crate::wal::writer::IdSource;
use crate::wal::writer::LogWriter;

pub(super) use super::failure::Failure;

/// Records buffered before a buffered policy hands them to the flusher.
pub(super) const FLUSH_BYTES: usize = 64 << 10;

/// Records buffered at which a buffered append waits for the flusher (the
/// disk is slower than the appends): memory stays bounded.
pub(super) const MAX_BUFFERED: usize = 1 << 20;

/// Futex words that appenders waiting for a group sleep on; group `g` uses
/// `words[g % WAIT_SLOTS]`. At most two groups are pending at a time (the
/// one being written and the one forming), so waiters of different groups
/// rarely share a word.
const WAIT_SLOTS: usize = 4;

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

/// Who leads group commits: the one state machine of the flusher hand-off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leader {
    /// Nobody. Under `Always`, nothing is queued then: whoever queues a
    /// record next leads.
    Idle,
    /// A caller (an appender, or `sync`) leads.
    Caller,
    /// The flusher thread has been told to lead and has not started yet.
    FlusherCalled,
    /// The flusher thread leads.
    Flusher,
    /// The store is closing and nobody leads again: the flusher thread
    /// exits.
    Stopped,
}

/// The log's counters since the store was opened.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LogStats {
    pub(super) records_written: u64,
    pub(super) bytes_written: u64,
    pub(super) groups_written: u64,
    pub(super) log_fsyncs: u64,
    pub(super) fsync_time: Duration,
    pub(super) peak_buffered_bytes: u64,
}

/// Records on their way to the log: the forming group, its positions and
/// group ids, what is durable, and who leads. `T` is what the host wants
/// back, in log order, once a group is durable (`Always`).
pub(super) struct LogQueue<T> {
    /// Encoded records not yet written (the forming group).
    buf: RecordBuf,
    /// What the forming group's records apply, once durable (`Always`).
    queued: Vec<T>,
    /// The buffer of the last group written, kept for the next one: a
    /// fresh buffer would grow (and fault in its pages) all over again.
    spare: Vec<u8>,
    /// Position of `buf`'s first record.
    buf_first: u64,
    next_position: u64,
    /// Id of the group forming in `buf`; groups are written in id order.
    group: u64,
    /// The group being written, if one is.
    writing: Option<u64>,
    /// Records before `durable` are fsync'ed (and, under `Always`, applied).
    durable: u64,
    /// `sync` wants records before this durable: the leader fsyncs.
    sync_to: u64,
    /// Whenever `buf` holds records under `Always`, this is not `Idle`:
    /// somebody will commit them.
    leader: Leader,
    /// The flusher thread, to wake when it is called.
    flusher: Option<Thread>,
    failed: Option<Failure>,
    stats: LogStats,
    /// What a partition's truncation must read of the log (every record
    /// pushed is noted with its position).
    reach: Reach,
    /// The last position of an append that is not placed ([`Reach`]),
    /// kept here, beside the position, for the append path.
    unplaced: Option<u64>,
}

impl<T> LogQueue<T> {
    /// An empty queue whose next record has position `next_position`, every
    /// record before it durable.
    pub(super) fn new(next_position: u64) -> LogQueue<T> {
        LogQueue {
            buf: RecordBuf::default(),
            queued: Vec::new(),
            spare: Vec::new(),
            buf_first: next_position,
            next_position,
            group: 0,
            writing: None,
            durable: next_position,
            sync_to: 0,
            leader: Leader::Idle,
            flusher: None,
            failed: None,
            stats: LogStats::default(),
            reach: Reach::new(next_position),
            unplaced: None,
        }
    }

    /// The queue with what recovery learnt of the log before
    /// `next_position` ([`Reach`]).
    pub(super) fn with_reach(self, mut reach: Reach) -> LogQueue<T> {
        reach.live_from(self.next_position);
        LogQueue { reach, ..self }
    }

    /// How far a partition's truncation must read ([`Reach`]).
    pub(super) fn reach(&self) -> &Reach {
        &self.reach
    }

    /// [`LogQueue::reach`], to forget what no truncation needs.
    pub(super) fn reach_mut(&mut self) -> &mut Reach {
        &mut self.reach
    }

    /// Where the next record starts in the forming group (the group is
    /// smaller than a segment, so the offset fits).
    #[inline]
    fn here(&self) -> u32 {
        u32::try_from(self.buf.len()).unwrap_or(u32::MAX)
    }

    /// Encodes `r` into the forming group; returns its position.
    #[inline]
    pub(super) fn push(&mut self, r: &AppendRequest) -> u64 {
        let at = self.here();
        self.buf.push(r);
        let pos = self.next_position;
        self.next_position += 1;
        let offset = append_offset(r, pos);
        if reach::placed(r) {
            self.reach.append(r.partition, offset, pos, Some(at));
        } else {
            self.unplaced = Some(pos);
            self.reach.append_unplaced(r.partition, offset, pos);
        }
        pos
    }

    /// Where the records a replay of `partition` reads lie, from `base`
    /// to `stop`, keeping what lies below `offset` (`range`), if known
    /// ([`Reach::units`]).
    pub(super) fn units(&self, partition: i32, range: (u64, u64, i64)) -> Option<Vec<Placed>> {
        self.reach.units(partition, range, self.unplaced)
    }

    /// Encodes records other than packable appends: `encode` appends them
    /// and says how many positions they take. Returns the first of those
    /// positions (the next position if they take none) and what `encode`
    /// returned. Records that take positions may touch any partition
    /// ([`Reach::other`]); records whose partitions are known go through
    /// [`LogQueue::push_marked_op`], one partition's batch or marker
    /// through [`LogQueue::push_partition_op`].
    pub(super) fn push_op<R>(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> (u64, R)) -> (u64, R) {
        self.push_marked_op(encode, Reach::other)
    }

    /// [`LogQueue::push_op`] for records that touch known partitions:
    /// `mark` notes what they touch, with their last position, as
    /// [`Reach::mark`]'s rule says (recovery follows the same rule when
    /// it rebuilds the bookkeeping). Not called if they take no position.
    pub(super) fn push_marked_op<R>(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> (u64, R),
        mark: impl FnOnce(&mut Reach, u64),
    ) -> (u64, R) {
        let at = self.here();
        let (positions, r) = self.buf.push_with(encode);
        let pos = self.next_position;
        self.next_position += positions;
        if positions > 0 {
            let more = u32::try_from(positions - 1).unwrap_or(u32::MAX);
            let last = pos + positions - 1;
            self.reach
                .marking((pos, more, at), |reach| mark(reach, last));
        } else {
            self.reach.quiet(at, pos);
        }
        (pos, r)
    }

    /// [`LogQueue::push_op`] for one record of one operation on
    /// `partition` at `offset` (a Kafka-mode batch or marker).
    pub(super) fn push_partition_op(
        &mut self,
        (partition, offset): (i32, i64),
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> u64 {
        let at = self.here();
        self.buf.push_with(encode);
        let pos = self.next_position;
        self.next_position += 1;
        self.reach.append(partition, offset, pos, Some(at));
        pos
    }

    /// The group and position of the last record queued that is not yet
    /// durable, if any: the forming group's, else the one being written.
    pub(super) fn last_queued(&self) -> Option<(u64, u64)> {
        if self.next_position <= self.durable {
            return None;
        }
        let group = if self.buf.is_empty() {
            self.writing.unwrap_or(self.group.saturating_sub(1))
        } else {
            self.group
        };
        Some((group, self.next_position - 1))
    }

    /// `Always`: what the record just pushed applies once durable.
    #[inline]
    pub(super) fn queue(&mut self, item: T) {
        self.queued.push(item);
    }

    /// Bytes of encoded records not yet written.
    #[inline]
    pub(super) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Position of the next record.
    #[inline]
    pub(super) fn next_position(&self) -> u64 {
        self.next_position
    }

    /// Records before this position are durable.
    pub(super) fn durable(&self) -> u64 {
        self.durable
    }

    /// Id of the forming group.
    #[inline]
    pub(super) fn group(&self) -> u64 {
        self.group
    }

    /// Why the store is poisoned, if it is.
    #[inline]
    pub(super) fn failed(&self) -> Option<&Failure> {
        self.failed.as_ref()
    }

    pub(super) fn stats(&self) -> LogStats {
        self.stats
    }

    pub(super) fn stats_mut(&mut self) -> &mut LogStats {
        &mut self.stats
    }

    /// The flusher thread, to wake when it is called.
    pub(super) fn set_flusher(&mut self, t: Thread) {
        self.flusher = Some(t);
    }

    /// Tells the flusher thread to take over as leader.
    fn call_flusher(&mut self) {
        self.leader = Leader::FlusherCalled;
        if let Some(f) = &self.flusher {
            f.unpark();
        }
    }

    /// Buffered policies: starts the flusher on the buffer unless a write
    /// is already under way (which takes whatever is buffered next).
    pub(super) fn hand_to_flusher(&mut self) {
        if self.leader == Leader::Idle {
            self.call_flusher();
        }
    }
}

/// What the group commit needs of the state kept beside its queue, under
/// the same lock.
pub(super) trait Host {
    /// What a record brings back once durable.
    type Item;
    fn log(&mut self) -> &mut LogQueue<Self::Item>;
    /// `Always`: a group is durable; `items` are its records', in log order.
    fn apply_durable(&mut self, items: Vec<Self::Item>);
    /// A group failed: every record in flight is lost.
    fn discard_in_flight(&mut self);
    /// `Always`, after each group: true if the host has work to do once the
    /// lock is let go (the store: a snapshot threshold was crossed). The
    /// leader passes it on through the `on_due` its caller gave.
    fn after_group(&mut self) -> bool;
    /// How many keys the host holds (for the live-producers gauge).
    fn live_keys(&self) -> usize;
    /// Keys expired and evicted since the store opened (for the
    /// expiration and eviction counters, published with each group: every
    /// removal is a record, so a group follows it).
    fn removed_keys(&self) -> (u64, u64) {
        (0, 0)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The store never panics while holding a lock except on a bug; after
    // one, the state is still consistent at the granularity of the lock.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The group commit: the lock over the queue and its host, the log writer
/// and the signals appenders wait on.
pub(super) struct GroupCommit<S> {
    /// `FsyncPolicy::Always`: every group is fsync'ed and applied when
    /// durable; otherwise records are applied when queued and fsync'ed
    /// only on `sync`.
    always: bool,
    state: Mutex<S>,
    /// Threads waiting for `state` (see [`GroupCommit::lock_state`]).
    state_waiters: AtomicU32,
    signal: Signal,
    /// Notified after every group (for `sync`, which is not a hot path).
    group_done: Condvar,
    writer: Mutex<LogWriter>,
    telemetry: Telemetry,
}

impl<S: Host> GroupCommit<S> {
    pub(super) fn new(
        always: bool,
        mut state: S,
        writer: LogWriter,
        telemetry: Telemetry,
    ) -> GroupCommit<S> {
        let signal = Signal::default();
        signal.durable.store(state.log().durable, Ordering::Relaxed);
        GroupCommit {
            always,
            state: Mutex::new(state),
            state_waiters: AtomicU32::new(0),
            signal,
            group_done: Condvar::new(),
            writer: Mutex::new(writer),
            telemetry,
        }
    }

    /// The store's metrics and events.
    pub(super) fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    pub(super) fn is_always(&self) -> bool {
        self.always
    }

    /// Takes the state lock. A thread that has to wait for it says so, so
    /// that a snapshot, which takes the lock once per shard, lets it in
    /// between two shards instead of taking the lock straight back (the
    /// lock is not fair: a woken waiter loses to a thread already running).
    #[inline]
    pub(super) fn lock_state(&self) -> MutexGuard<'_, S> {
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

    /// Takes the state lock without saying so if it has to wait: for the
    /// snapshot, which is what lets the others in.
    pub(super) fn lock_state_quietly(&self) -> MutexGuard<'_, S> {
        lock(&self.state)
    }

    /// True while a thread waits for the state lock.
    pub(super) fn has_waiters(&self) -> bool {
        self.state_waiters.load(Ordering::Relaxed) > 0
    }

    /// For work that takes the state lock once per shard (a snapshot, an
    /// expiration sweep), between two shards with the lock released: lets
    /// the threads that queued for the lock meanwhile take it first
    /// (bounded to 1 ms, should one never get there).
    pub(super) fn let_waiters_in(&self) {
        let waited = std::time::Instant::now();
        while self.has_waiters() && waited.elapsed() < std::time::Duration::from_millis(1) {
            std::thread::yield_now();
        }
    }

    /// The log writer (for retention, which detaches old segments).
    pub(super) fn writer(&self) -> MutexGuard<'_, LogWriter> {
        lock(&self.writer)
    }

    /// `Always`, after queueing: leads a group commit if nobody does (the
    /// caller's record is then in it), else leaves the records to the leader.
    #[inline]
    pub(super) fn commit(&self, mut st: MutexGuard<'_, S>, on_due: impl Fn()) {
        let log = st.log();
        if log.leader != Leader::Idle {
            return;
        }
        log.leader = Leader::Caller;
        if self.lead(st, false) {
            on_due();
        }
    }

    /// Buffered policies, before an append: waits while [`MAX_BUFFERED`]
    /// bytes of records are pending (the disk is behind) for the write in
    /// progress, after which the flusher takes the whole buffer. So the
    /// buffer never holds more than that plus one call's records.
    #[inline]
    pub(super) fn room<'a>(&'a self, mut st: MutexGuard<'a, S>) -> MutexGuard<'a, S> {
        loop {
            let log = st.log();
            if log.buf.len() < MAX_BUFFERED || log.failed.is_some() {
                return st;
            }
            log.hand_to_flusher();
            let group = log.writing.unwrap_or(log.group);
            drop(st);
            self.signal.await_group(group);
            st = self.lock_state();
        }
    }

    /// Whether the record at `pos` is durable already (no lock taken).
    pub(super) fn durable_past(&self, pos: u64) -> bool {
        self.signal.durable.load(Ordering::Acquire) > pos
    }

    /// Waits until the record at `pos`, in group `group`, is durable.
    pub(super) fn await_durable(&self, group: u64, pos: u64) -> Result<()> {
        self.signal.await_group(group);
        if self.signal.durable.load(Ordering::Acquire) > pos {
            return Ok(());
        }
        let mut st = self.lock_state();
        let log = st.log();
        if log.durable > pos {
            return Ok(());
        }
        Err(match &log.failed {
            Some(f) => f.error_for(Some(pos)),
            None => Error::Internal("a group was done without one of its records"),
        })
    }

    /// Leads group commits: takes the forming group (every record queued),
    /// writes it with one `write` (in log order: the writer lock is taken
    /// before the state lock is let go), fsyncs it through a handle of its
    /// own if the policy or a `sync` call asks, applies it (`Always`) and
    /// wakes its waiters with one futex call. Then, if records were queued
    /// meanwhile, a caller (`flusher` false) hands the next group to the
    /// flusher thread and returns, while the flusher goes on until nothing
    /// is queued. The check for more comes after the wake-up, so that
    /// appenders woken by it can join the next group. Returns true if the
    /// host asked for work after a group ([`Host::after_group`]).
    // Over 100 lines on purpose: the order of its steps (take the group and
    // the writer lock under the state lock, write, let go, fsync, apply,
    // wake, look for more) is what makes group commit correct, and it reads
    // in one place; each step that stands alone is a function of its own.
    fn lead<'a>(&'a self, mut st: MutexGuard<'a, S>, flusher: bool) -> bool {
        let mut due = false;
        loop {
            let log = st.log();
            let group = log.group;
            log.group += 1;
            log.writing = Some(group);
            let first = log.buf_first;
            let end = log.next_position;
            let spare = std::mem::take(&mut log.spare);
            let mut buf = log.buf.take(spare);
            let queued = std::mem::take(&mut log.queued);
            log.buf_first = end;
            let needs_sync = (self.always || log.sync_to > log.durable) && log.durable < end;
            let mut w = lock(&self.writer);
            drop(st);

            let bytes = buf.len() as u64;
            let mut fsync = None;
            let mut start = None;
            let result = (|| {
                if !buf.is_empty() {
                    start = Some(w.write(&mut buf, first, end - first)?);
                }
                let mut handle = None;
                if needs_sync {
                    handle = w.sync_handle();
                    if handle.is_none() {
                        // No descriptor for a second handle: fsync through
                        // the writer's own, holding it meanwhile.
                        let started = Instant::now();
                        w.sync()?;
                        fsync = Some(started.elapsed());
                    }
                }
                drop(w);
                if let Some((h, token)) = handle {
                    let started = Instant::now();
                    lock(&h)
                        .sync_data()
                        .map_err(|e| Error::io("fsync", &token.path, e))?;
                    fsync = Some(started.elapsed());
                    lock(&self.writer).synced(&token);
                }
                Ok::<(), Error>(())
            })();

            st = self.lock_state();
            let log = st.log();
            let result = result.and_then(|()| {
                if let Some(f) = &log.failed {
                    return Err(f.error_for(None));
                }
                if let Some(start) = start {
                    log.reach.written(first, start);
                }
                if !buf.is_empty() {
                    log.stats.groups_written += 1;
                    log.stats.records_written += end - first;
                    log.stats.bytes_written += bytes;
                }
                if needs_sync {
                    log.stats.log_fsyncs += 1;
                    log.stats.fsync_time += fsync.unwrap_or_default();
                    log.durable = end;
                }
                Ok(())
            });
            let mut poisoned = None;
            match &result {
                Ok(()) if needs_sync => st.apply_durable(queued),
                Ok(()) => {}
                Err(e) => {
                    let log = st.log();
                    if log.failed.is_none() {
                        // Everything not yet durable is lost to the appends
                        // waiting on it.
                        let range = (log.durable, log.next_position);
                        log.failed = Some(Failure::from_error(e, range));
                        poisoned = log.failed.clone();
                        log.queued.clear();
                        log.buf.clear();
                        self.signal.failed.store(true, Ordering::Release);
                        st.discard_in_flight();
                    }
                }
            }
            let log = st.log();
            buf.clear();
            if log.spare.capacity() < buf.capacity() {
                log.spare = buf;
            }
            log.writing = None;
            self.signal.durable.store(log.durable, Ordering::Release);
            self.signal.completed.store(group + 1, Ordering::Release);
            let failed = log.failed.is_some();
            due |= self.always && st.after_group();
            let live = self.telemetry.producers_due().then(|| st.live_keys());
            let (expired, evicted) = st.removed_keys();
            drop(st);
            self.signal.wake(group, failed);
            self.group_done.notify_all();
            // Reported once the group's appenders are on their way.
            if result.is_ok() {
                let records = if bytes > 0 { end - first } else { 0 };
                self.telemetry.group(&Group {
                    records,
                    bytes,
                    fsync,
                });
            }
            if let (Some(f), Err(e)) = (&poisoned, &result) {
                self.telemetry.poisoned(&Poison {
                    op: f.op,
                    path: &f.path,
                    error: e,
                    records: f.group.1 - f.group.0,
                });
            }
            if let Some(live) = live {
                self.telemetry.producers(live);
            }
            self.telemetry.removed(expired, evicted);

            st = self.lock_state();
            let log = st.log();
            // Under the buffered policies a short buffer waits for the
            // next append to fill it to FLUSH_BYTES (or for a sync): taking
            // every few records as they come would make the appenders and
            // the flusher fight over the lock for each.
            let short = !self.always && log.buf.len() < FLUSH_BYTES && log.sync_to <= log.durable;
            if log.buf.is_empty() || log.failed.is_some() || short {
                log.leader = Leader::Idle;
                break;
            }
            if !flusher {
                log.call_flusher();
                break;
            }
        }
        drop(st);
        // `sync`, and `stop`, may be waiting for the lead to end.
        self.group_done.notify_all();
        due
    }

    /// The flusher thread: takes over group commits from an appender when
    /// records keep arriving (so that the appender returns to its caller)
    /// and writes the buffered policies' records in the background. Returns
    /// once [`GroupCommit::stop`] was called.
    pub(super) fn flush_loop(&self, on_due: impl Fn()) {
        loop {
            let mut st = self.lock_state();
            loop {
                let log = st.log();
                match log.leader {
                    Leader::FlusherCalled => break,
                    Leader::Stopped => return,
                    Leader::Idle | Leader::Caller | Leader::Flusher => {}
                }
                drop(st);
                std::thread::park();
                st = self.lock_state();
            }
            st.log().leader = Leader::Flusher;
            if self.lead(st, true) {
                on_due();
            }
        }
    }

    /// Makes every record queued so far durable: leads a commit if nobody
    /// does, else waits for the leader's groups.
    pub(super) fn sync(&self, on_due: impl Fn()) -> Result<()> {
        let mut st = self.lock_state();
        let log = st.log();
        if let Some(f) = &log.failed {
            return Err(f.error_for(None));
        }
        let target = log.next_position;
        log.sync_to = log.sync_to.max(target);
        loop {
            let log = st.log();
            // Durable first: a later group's failure does not undo it.
            if log.durable >= target {
                return Ok(());
            }
            if let Some(f) = &log.failed {
                // A failure during this call: the IO error itself if it
                // lost records the call covers.
                return Err(f.error_for(target.checked_sub(1)));
            }
            if log.leader == Leader::Idle {
                log.leader = Leader::Caller;
                if self.lead(st, false) {
                    on_due();
                }
                st = self.lock_state();
            } else {
                st = self.group_done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// Closing: waits until nobody leads, then stops the flusher thread
    /// (its [`GroupCommit::flush_loop`] returns). Nobody may queue records
    /// afterwards.
    pub(super) fn stop(&self) {
        let mut st = self.lock_state();
        while !matches!(st.log().leader, Leader::Idle | Leader::Stopped) {
            st = self.group_done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let log = st.log();
        log.leader = Leader::Stopped;
        if let Some(f) = &log.flusher {
            f.unpark();
        }
    }
}

#[cfg(test)]
#[path = "commit_tests.rs"]
mod tests;
