//! The Raft log on disk: the one write-ahead log of a replica.
//!
//! Under Raft the log already is a write-ahead log: an entry is
//! acknowledged to the leader only after it is fsync'ed here, and a
//! committed entry is on a majority of these logs. So the state machine
//! keeps the producer state in memory and never writes a second log (see
//! docs/scaling.md, "Durability", for the choice and its measurement).
//!
//! Files in the replica's directory (bytes in docs/format.md):
//!
//! - `raft.log`: a 24-byte header with a random salt, then records
//!   `[len u32][crc32c u32][payload]`, one per entry, each CRC seeded by
//!   the salt (so bytes a producer chose never pass for a record),
//!   appended and fdatasync'ed before openraft hears the entries are
//!   flushed, by a writer thread that fsyncs every append queued while the
//!   last fsync ran at once (a group commit; `writer.rs`);
//! - `raft-meta.json`: the vote and the last purged log id, replaced
//!   atomically (temporary file, fsync, rename, directory fsync);
//! - `raft-committed.json`: the committed log id, a hint written without
//!   fsync, at most every 50 ms, by the writer thread (openraft re-applies
//!   committed entries at start up to it; if it lags, is lost, unreadable,
//!   or names an entry the log does not hold, which a crash can leave, the
//!   replica learns the commit from the leader and applies then: nothing
//!   is applied twice either way).
//!
//! How the records are laid out, and how a torn last write is told from
//! damage, is `log_file.rs`'s; this module keeps the entries in memory and
//! the files in step with openraft's calls.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use crate::log_file::{self, Entries, Header, LOG_FILE, LOG_HEADER, Scanned};
use crate::state::StateMachine;
use crate::writer::{self, COMMITTED_FILE, LogStats, Op};
use crate::{NodeId, TypeConfig, read_file, write_atomically};
use producer_state::fs::{FileSystem, StdFs};

const META_FILE: &str = "raft-meta.json";

type SErr = StorageError<NodeId>;

/// How long a purge waits for the snapshot that covers it (it is being
/// written by an install; a failed install stops the replica anyway).
const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

struct Inner {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    /// The file's header (its salt seeds every record's CRC).
    header: Header,
    /// The writer thread's queue (`writer.rs`).
    writer: Sender<Op>,
    /// The writer thread, joined when the last handle is dropped.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Changes never; closed when the writer has finished and let go of
    /// the directory.
    closed: watch::Receiver<()>,
    /// Bytes of `raft.log` that hold records, counting those queued.
    len: u64,
    /// Every entry not purged, with the file offset of its record.
    entries: Entries,
    meta: Meta,
    committed: Option<LogId<NodeId>>,
    /// The log id of the state machine's snapshot file, if linked
    /// ([`LogStore::purge_after_snapshots`]).
    snapshots: Option<watch::Receiver<Option<LogId<NodeId>>>>,
}

/// A replica's Raft log (cloneable handle; openraft's log reader is a
/// clone).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    stats: Arc<LogStats>,
}

/// What opening a log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOpened {
    /// Entries read from `raft.log`.
    pub entries: usize,
    /// Bytes cut from its end: an append torn by a crash, never acknowledged.
    pub torn_bytes: u64,
}

fn io_err(e: std::io::Error) -> SErr {
    StorageIOError::write_logs(&e).into()
}

/// The log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenLogError {
    /// An IO call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another log has this directory open (in this process or another):
    /// two writers of one file would interleave their records.
    #[error("{path} is open by another log: stop that replica first")]
    Locked {
        /// The replica's directory.
        path: PathBuf,
    },
    /// Bytes that are not a valid record are followed by valid ones, or a
    /// metadata file does not parse: entries this replica acknowledged
    /// would be lost, so it refuses to start.
    #[error("{path} is damaged at byte {offset}: {what}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What is wrong.
        what: &'static str,
    },
}

/// The log file's length and what its scan finds (records after
/// `last_purged`), the file created with its header first if there is
/// none or it is empty (the header is written whole or not at all).
fn read_log(
    fs: &dyn FileSystem,
    dir: &Path,
    last_purged: Option<u64>,
) -> Result<(usize, Scanned), OpenLogError> {
    let path = dir.join(LOG_FILE);
    let io = |op| {
        let path = path.clone();
        move |source| OpenLogError::Io { op, path, source }
    };
    let mut bytes = read_file(fs, &path)
        .map_err(io("read"))?
        .unwrap_or_default();
    if bytes.is_empty() {
        let header = log_file::new_header(dir);
        write_atomically(fs, dir, LOG_FILE, &header, true).map_err(io("create"))?;
        bytes = header.to_vec();
    }
    let scanned = log_file::scan(&bytes, last_purged).map_err(|d| OpenLogError::Corrupt {
        path: path.clone(),
        offset: d.offset,
        what: d.what,
    })?;
    Ok((bytes.len(), scanned))
}

/// The vote and purge record in `dir` (default when absent), and the
/// committed hint (`None` when absent or unreadable: a hint only, module
/// docs).
fn read_meta(
    fs: &dyn FileSystem,
    dir: &Path,
) -> Result<(Meta, Option<LogId<NodeId>>), OpenLogError> {
    let meta_path = dir.join(META_FILE);
    let read = read_file(fs, &meta_path).map_err(|source| OpenLogError::Io {
        op: "read",
        path: meta_path.clone(),
        source,
    })?;
    let meta: Meta = match read {
        Some(b) => serde_json::from_slice(&b).map_err(|_| OpenLogError::Corrupt {
            path: meta_path.clone(),
            offset: 0,
            what: "not the vote and purge record",
        })?,
        None => Meta::default(),
    };
    let committed = read_file(fs, &dir.join(COMMITTED_FILE))
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<Option<LogId<NodeId>>>(&b).ok())
        .flatten();
    Ok((meta, committed))
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn tail.
    pub fn open(dir: &Path) -> Result<(LogStore, LogOpened), OpenLogError> {
        LogStore::open_with(Arc::new(StdFs), dir)
    }

    /// [`LogStore::open`] through a file system of the core crate's seam
    /// (`SimFs` in the crash tests).
    pub fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
    ) -> Result<(LogStore, LogOpened), OpenLogError> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenLogError::Io { op, path, source }
        };
        fs.create_dir_all(dir).map_err(io("create", dir))?;
        // Held by the writer thread until it has written its last byte.
        let lock =
            fs.try_lock(dir)
                .map_err(io("lock", dir))?
                .ok_or_else(|| OpenLogError::Locked {
                    path: dir.to_path_buf(),
                })?;
        let (meta, committed) = read_meta(fs.as_ref(), dir)?;
        let path = dir.join(LOG_FILE);
        let (
            len,
            Scanned {
                header,
                mut entries,
                end: at,
            },
        ) = read_log(fs.as_ref(), dir, meta.last_purged.map(|p| p.index))?;
        // The hint is written without an fsync, and openraft commits on a
        // follower up to what it accepted before that append is flushed: a
        // crash can keep a hint naming entries it lost. One the log does not
        // hold is dropped (openraft would refuse to start, unable to
        // re-apply up to it); the leader says again what is committed.
        let committed = committed.filter(|c| {
            meta.last_purged.is_some_and(|p| c.index <= p.index)
                || entries.get(&c.index).is_some_and(|(_, e)| e.log_id == *c)
        });
        let torn_bytes = (len - at) as u64;
        let upgrade = log_file::upgraded(&header);
        let (header, at) = match upgrade {
            // A version-2 log: rewritten as version 3 (the same salt and
            // entries, so records under the new header's seed) before
            // anything is appended, atomically (`log_file::upgraded`).
            Some(header) => {
                let buf = log_file::rewrite(&header, &mut entries).map_err(io("upgrade", &path))?;
                write_atomically(fs.as_ref(), dir, LOG_FILE, &buf, true)
                    .map_err(io("upgrade", &path))?;
                (header, buf.len())
            }
            None => (header, at),
        };
        let seed = log_file::record_seed(&header);
        let mut file = fs.open_append(&path).map_err(io("open", &path))?;
        // (An upgraded file holds no torn bytes: they were not rewritten.)
        if torn_bytes > 0 && upgrade.is_none() {
            file.set_len(at as u64).map_err(io("truncate", &path))?;
            file.sync_data().map_err(io("fsync", &path))?;
        }
        let opened = LogOpened {
            entries: entries.len(),
            torn_bytes,
        };
        let stats = Arc::new(LogStats::default());
        let (writer, thread, closed) = writer::spawn(
            fs.clone(),
            dir.to_path_buf(),
            file,
            at as u64,
            seed,
            lock,
            stats.clone(),
        )
        .map_err(io("spawn the log writer for", &path))?;
        let inner = Inner {
            fs,
            dir: dir.to_path_buf(),
            header,
            writer,
            thread: Some(thread),
            closed,
            len: at as u64,
            entries,
            meta,
            committed,
            snapshots: None,
        };
        Ok((
            LogStore {
                inner: Arc::new(Mutex::new(inner)),
                stats,
            },
            opened,
        ))
    }

    /// Makes every purge of this log wait until `sm`'s snapshot file
    /// covers it. openraft 0.9 installs a snapshot from the leader by
    /// handing it to the state machine's worker and purging the log up to
    /// it at once, without waiting for the install: a crash between the two
    /// would leave the log purged past the snapshot on disk, and the
    /// replica unable to rebuild its state. [`Replica`](crate::Replica)
    /// links its log and state machine so; a log on its own purges at once.
    pub fn purge_after_snapshots(&self, sm: &StateMachine) {
        self.lock().snapshots = Some(sm.snapshots());
    }

    /// A receiver that is closed (its `changed` fails) once every handle
    /// of this log is gone and its writer has finished and let go of the
    /// directory: openraft's tasks may hold handles a moment after it shuts
    /// down.
    pub(crate) fn closed(&self) -> watch::Receiver<()> {
        self.lock().closed.clone()
    }

    /// The log's counters.
    pub fn stats(&self) -> Arc<LogStats> {
        self.stats.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave half an update that
        // matters: the file is the truth and is re-read on the next open.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Inner {
    /// The last handle is gone: the writer finishes what is queued and
    /// lets go of the file and the directory before this returns, so the
    /// directory can be opened again at once.
    fn drop(&mut self) {
        let (gone, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.writer, gone));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    fn save_meta(&self) -> Result<(), SErr> {
        let bytes = serde_json::to_vec(&self.meta).map_err(|e| StorageIOError::write_vote(&e))?;
        write_atomically(self.fs.as_ref(), &self.dir, META_FILE, &bytes, true)
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    /// Queues a rewrite of `raft.log` with only the entries kept, when
    /// purged records are more than half of it (and more than 64 KiB): the
    /// file stays within about twice the unpurged log. The caller awaits
    /// the answer.
    fn compact(&mut self) -> Option<oneshot::Receiver<std::io::Result<()>>> {
        let first_offset = self.entries.values().next().map_or(self.len, |(o, _)| *o);
        if first_offset < 1 << 16 || first_offset < self.len / 2 {
            return None;
        }
        // Every entry was encoded once already when it was appended.
        let buf = log_file::rewrite(&self.header, &mut self.entries).ok()?;
        self.len = buf.len() as u64;
        Some(self.queue(|reply| Op::Replace(buf, reply)))
    }

    /// Queues an operation whose answer the caller awaits.
    fn queue(
        &self,
        op: impl FnOnce(oneshot::Sender<std::io::Result<()>>) -> Op,
    ) -> oneshot::Receiver<std::io::Result<()>> {
        let (tx, rx) = oneshot::channel();
        // If the writer is gone, `rx` reports it (its sender is dropped).
        let _ = self.writer.send(op(tx));
        rx
    }
}

/// The writer's answer to a queued operation.
async fn answer(rx: oneshot::Receiver<std::io::Result<()>>) -> Result<(), SErr> {
    match rx.await {
        Ok(r) => r.map_err(io_err),
        Err(_) => Err(io_err(std::io::Error::other("the log writer stopped"))),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let inner = self.lock();
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (_, e))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let inner = self.lock();
        let last_purged = inner.meta.last_purged;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|(_, e)| e.log_id)
            .or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        let mut inner = self.lock();
        inner.meta.vote = Some(*vote);
        inner.save_meta()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        Ok(self.lock().meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        let mut inner = self.lock();
        inner.committed = committed;
        let bytes = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        // Written by the writer thread when it has time (`writer.rs`).
        let _ = inner.writer.send(Op::Hint(bytes));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(self.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let mut buf = Vec::new();
        let mut encoded = Vec::new();
        for e in entries {
            let offset = inner.len + buf.len() as u64;
            log_file::encode_entry(&e, &mut buf).map_err(io_err)?;
            encoded.push((offset, e));
        }
        let n = encoded.len() as u64;
        // Readable at once (the leader may send an entry before its own
        // fsync; it counts itself only when `callback` reports it).
        for (offset, e) in encoded {
            inner.entries.insert(e.log_id.index, (offset, e));
        }
        inner.len += buf.len() as u64;
        self.stats.entries.fetch_add(n, Ordering::Relaxed);
        // The writer reports the entries flushed after its fsync; if it is
        // gone, dropping the callback tells openraft the IO failed.
        let _ = inner.writer.send(Op::Append(buf, callback));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let rx = {
            let mut inner = self.lock();
            let Some(offset) = inner.entries.get(&log_id.index).map(|(o, _)| *o) else {
                return Ok(());
            };
            inner.len = offset;
            let _ = inner.entries.split_off(&log_id.index);
            inner.queue(|reply| Op::Truncate(offset, reply))
        };
        answer(rx).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let snapshots = self.lock().snapshots.clone();
        if let Some(mut snapshot) = snapshots {
            let covered = |s: &Option<LogId<NodeId>>| s.is_some_and(|s| s.index >= log_id.index);
            let waited = tokio::time::timeout(PURGE_WAIT, snapshot.wait_for(covered)).await;
            if !matches!(waited, Ok(Ok(_))) {
                return Err(io_err(std::io::Error::other(format!(
                    "purge to {log_id}: no snapshot covering it was written within {PURGE_WAIT:?}"
                ))));
            }
        }
        let rx = {
            let mut inner = self.lock();
            inner.meta.last_purged = Some(log_id);
            inner.save_meta()?;
            let keep = inner.entries.split_off(&(log_id.index + 1));
            inner.entries = keep;
            if inner.entries.is_empty() {
                // Everything is purged (often: a snapshot was installed
                // past the end of the log): start the file again.
                let start = LOG_HEADER as u64;
                inner.len = start;
                Some(inner.queue(|reply| Op::Truncate(start, reply)))
            } else {
                inner.compact()
            }
        };
        match rx {
            Some(rx) => answer(rx).await,
            None => Ok(()),
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}
