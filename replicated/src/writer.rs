//! The thread that writes and fsyncs one replica's `raft.log`.
//!
//! openraft's core task calls `append` and waits for nothing but the call
//! to return: it learns that entries are durable from the `LogFlushed`
//! callback. Doing the `write` + `fdatasync` inside `append` would block
//! the core task (and a runtime worker) for a whole fsync per call, so
//! appends queued behind it could never share one. Instead `append` hands
//! the encoded records to this thread and returns; the thread takes every
//! append waiting in its queue, writes them, fsyncs once, and then reports
//! each as flushed, in order: a group commit across appends, as the store's
//! (`src/store/commit.rs`) is across appenders.
//!
//! Truncations and file replacements go through the same queue, so the
//! file sees every change in the order the log made it; their callers wait
//! for the thread's answer. The committed hint goes through it too, and is
//! written at most every 50 ms (`HINT_EVERY`), never by openraft's core. After a failed write or fsync every later
//! operation fails too (nothing is retried: the replica stops, and the
//! next open cuts or refuses what reached the file).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openraft::storage::LogFlushed;
use producer_state::fs::{FileSystem, LockGuard, WriteFile};
use tokio::sync::{oneshot, watch};

use crate::log_file::{LOG_FILE, seal_write};
use crate::{TypeConfig, write_atomically};

/// Counters of one log, for benchmarks and tests: the writer counts its
/// fsyncs, the log the entries it queued.
#[derive(Debug, Default)]
pub struct LogStats {
    /// fdatasync calls on `raft.log`.
    pub fsyncs: AtomicU64,
    /// Entries appended.
    pub entries: AtomicU64,
}

/// The committed hint's file (docs/format.md): replaced by rename, never
/// fsync'ed.
pub(crate) const COMMITTED_FILE: &str = "raft-committed.json";

/// The hint is written at most this often. openraft saves the committed
/// log id on every commit, in its core task, before it applies: writing
/// the file there (a create, a write, a rename, on every node, for every
/// entry) held up every entry and its renames' writeback competed with the
/// log's fsyncs. A hint that lags is still right: openraft re-applies less
/// at start-up and hears the rest from the leader.
const HINT_EVERY: Duration = Duration::from_millis(50);

/// One change to the file.
pub(crate) enum Op {
    /// The committed hint's new bytes: written when [`HINT_EVERY`] has
    /// passed since the last, or when the writer has nothing else to do
    /// for that long, or when it finishes.
    Hint(Vec<u8>),
    /// Append these records; report them flushed after the fsync.
    Append(Vec<u8>, LogFlushed<TypeConfig>),
    /// Cut the file to this length and fsync.
    Truncate(u64, oneshot::Sender<std::io::Result<()>>),
    /// Replace the file atomically by these bytes.
    Replace(Vec<u8>, oneshot::Sender<std::io::Result<()>>),
}

struct Writer {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    file: Box<dyn WriteFile>,
    /// The directory's lock, let go after the file (fields drop in order).
    _lock: Box<dyn LockGuard>,
    /// Dropped last: tells `LogStore::closed` the writer is done.
    _closed: watch::Sender<()>,
    /// The file's length: where the next write begins.
    end: u64,
    /// The seed of the log's record checksums (`log_file::record_seed`).
    seed: u32,
    stats: Arc<LogStats>,
    /// The first failure, repeated to every later operation.
    failed: Option<String>,
    /// The committed hint not yet written, and when the last was.
    hint: Option<Vec<u8>>,
    hint_written: Instant,
}

/// Starts the writer of `file` (opened to append after its records, which
/// end at `end`), holding the directory's `lock` until it ends: its queue,
/// its thread, and a receiver that is closed when it has ended.
pub(crate) fn spawn(
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    file: Box<dyn WriteFile>,
    end: u64,
    seed: u32,
    lock: Box<dyn LockGuard>,
    stats: Arc<LogStats>,
) -> std::io::Result<(Sender<Op>, JoinHandle<()>, watch::Receiver<()>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (closed, on_close) = watch::channel(());
    let mut w = Writer {
        fs,
        dir,
        file,
        _lock: lock,
        _closed: closed,
        end,
        seed,
        stats,
        failed: None,
        hint: None,
        hint_written: Instant::now(),
    };
    let thread = std::thread::Builder::new()
        .name("raft-log-writer".into())
        .spawn(move || w.run(rx))?;
    Ok((tx, thread, on_close))
}

impl Writer {
    /// The next operation; writes the pending hint if none comes in time.
    /// `None` once every sender is gone (the pending hint written).
    fn next(&mut self, rx: &Receiver<Op>) -> Option<Op> {
        loop {
            if self.hint.is_none() {
                return rx.recv().ok();
            }
            let wait = HINT_EVERY.saturating_sub(self.hint_written.elapsed());
            match rx.recv_timeout(wait) {
                Ok(op) => return Some(op),
                Err(RecvTimeoutError::Timeout) => self.write_hint(),
                Err(RecvTimeoutError::Disconnected) => {
                    self.write_hint();
                    return None;
                }
            }
        }
    }

    /// Writes the pending committed hint (a failure is ignored: it is a
    /// hint, and missing counts as none).
    fn write_hint(&mut self) {
        if let Some(bytes) = self.hint.take()
            && self.failed.is_none()
        {
            let _ = write_atomically(self.fs.as_ref(), &self.dir, COMMITTED_FILE, &bytes, false);
        }
        self.hint_written = Instant::now();
    }

    fn run(&mut self, rx: Receiver<Op>) {
        // Ends when every sender (every clone of the log) is gone.
        let mut next = self.next(&rx);
        while let Some(op) = next.take() {
            match op {
                Op::Hint(bytes) => self.hint = Some(bytes),
                Op::Append(bytes, done) => {
                    let mut group = vec![(bytes, done)];
                    loop {
                        match rx.try_recv() {
                            Ok(Op::Append(b, d)) => group.push((b, d)),
                            Ok(Op::Hint(h)) => self.hint = Some(h),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                        }
                    }
                    self.append(group);
                }
                Op::Truncate(len, reply) => {
                    let r = self.guard(|w| {
                        w.file.set_len(len)?;
                        w.end = len;
                        w.file.sync_data()
                    });
                    let _ = reply.send(r);
                }
                Op::Replace(bytes, reply) => {
                    let r = self.guard(|w| {
                        write_atomically(w.fs.as_ref(), &w.dir, LOG_FILE, &bytes, true)?;
                        w.file = w.fs.open_append(&w.dir.join(LOG_FILE))?;
                        w.end = bytes.len() as u64;
                        Ok(())
                    });
                    let _ = reply.send(r);
                }
            }
            if self.hint.is_some() && self.hint_written.elapsed() >= HINT_EVERY {
                self.write_hint();
            }
            if next.is_none() {
                next = self.next(&rx);
            }
        }
    }

    /// Runs `f` unless an earlier operation failed; a failure is kept.
    fn guard(&mut self, f: impl FnOnce(&mut Writer) -> std::io::Result<()>) -> std::io::Result<()> {
        if let Some(e) = &self.failed {
            return Err(std::io::Error::other(format!(
                "an earlier log write failed: {e}"
            )));
        }
        let r = f(self);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    fn append(&mut self, mut group: Vec<(Vec<u8>, LogFlushed<TypeConfig>)>) {
        // One write, marked as such in every record (`log_file::seal_write`).
        let mut bytes = Vec::with_capacity(group.iter().map(|(b, _)| b.len()).sum());
        for (b, _) in &mut group {
            bytes.append(b);
        }
        seal_write(&mut bytes, self.end, self.seed);
        let r = self.guard(|w| {
            w.file.write_all(&bytes)?;
            w.end += bytes.len() as u64;
            w.file.sync_data()
        });
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        for (_, done) in group {
            done.log_io_completed(match &r {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            });
        }
    }
}
