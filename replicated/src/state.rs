//! The state machine: the producer state of one replica, in memory, with
//! the applied log id beside it, and its snapshot in the crate's format.
//!
//! Applying an entry classifies its appends against a
//! [`ProducerStateManager`] ([`crate::command::apply`]): deterministic, so
//! every replica that applies the same committed log holds the same state.
//! The state is not written per entry: the Raft log is the write-ahead log
//! (`log.rs`). What is durable is the snapshot, `raft-snapshot`, which
//! holds the state *and* the log id it reflects, written atomically before
//! openraft may purge the log below it. After a restart the state is the
//! snapshot, and openraft re-applies the committed entries after it (up to
//! the committed hint the log keeps, then as the leader commits more):
//! every entry is applied once to the rebuilt state, never twice.
//!
//! A snapshot's data, as openraft streams it to a lagging or new replica,
//! is exactly the crate's own snapshot file (docs/format.md "Snapshot
//! files"), at position `last_log_id.index + 1`. Its checksum is verified,
//! and its position checked against the metadata, before anything is
//! replaced: [`verify_snapshot`] runs on the receiving side before the
//! snapshot reaches openraft (a damaged transfer is refused and retried;
//! the replica keeps its state), and again in [`StateMachine`]'s install.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use producer_state::ProducerStateManager;
use tokio::sync::watch;

use crate::command::{self, Command, Reader, Response};
use crate::{NodeId, TypeConfig, read_file, write_atomically};
use producer_state::fs::{FileSystem, StdFs};

const SNAPSHOT_FILE: &str = "raft-snapshot";
const MAGIC: &[u8; 8] = b"PSRAFTSN";
const VERSION: u16 = 1;

type SErr = StorageError<NodeId>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Called after every entry a replica applies: its log index, its command
/// (none for Raft's blank and membership entries) and what it came to.
/// Tests record the applied log through it.
pub type ApplyObserver = Arc<dyn Fn(u64, Option<&Command>, &Response) + Send + Sync>;

/// A snapshot that must not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes are not a valid snapshot (checksum, length, entry).
    #[error("snapshot {id} is damaged: {source}")]
    Damaged {
        /// The snapshot's id.
        id: String,
        /// What the crate's reader found.
        source: producer_state::Error,
    },
    /// A valid snapshot of another position than its metadata states.
    #[error("snapshot {id} covers position {found}, its metadata says {expected}")]
    WrongPosition {
        /// The snapshot's id.
        id: String,
        /// The position the metadata implies.
        expected: u64,
        /// The position in the snapshot's header.
        found: u64,
    },
    /// The replica's snapshot file is not one this build wrote.
    #[error("{path} is damaged: {what}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Reading the replica's snapshot file failed.
    #[error("read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The crate snapshot's position for a snapshot at `last`: every log
/// record before it is reflected.
pub fn position_of(last: Option<LogId<NodeId>>) -> u64 {
    last.map_or(0, |l| l.index + 1)
}

/// Checks a received snapshot before anything is replaced: the crate's
/// checksum over every byte, every entry, and the position against the
/// metadata. Returns the state it holds.
pub fn verify_snapshot(meta: &Meta, data: &[u8]) -> Result<ProducerStateManager, SnapshotError> {
    let id = meta.snapshot_id.clone();
    let (found, mgr) = ProducerStateManager::decode_snapshot(format!("snapshot {id}"), data)
        .map_err(|source| SnapshotError::Damaged {
            id: id.clone(),
            source,
        })?;
    let expected = position_of(meta.last_log_id);
    if found != expected {
        return Err(SnapshotError::WrongPosition {
            id,
            expected,
            found,
        });
    }
    Ok(mgr)
}

struct Applied {
    mgr: ProducerStateManager,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

struct Shared {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    applied: Mutex<Applied>,
    /// The newest snapshot persisted: what `raft-snapshot` holds.
    current: Mutex<Option<(Meta, Arc<Vec<u8>>)>>,
    /// Held while `raft-snapshot` is written (on a blocking thread): a
    /// build runs in a task of its own in openraft 0.9, beside installs.
    persisting: Mutex<()>,
    /// The log id of the snapshot on disk, for purges to wait on
    /// (`LogStore::purge_after_snapshots`).
    on_disk: watch::Sender<Option<LogId<NodeId>>>,
    builds: AtomicU64,
    observer: Option<ApplyObserver>,
}

/// One replica's state machine (a cloneable handle: openraft owns one
/// clone, the replica keeps another to read the state).
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StateMachine {
    /// Opens the state machine of the replica in `dir`: the state of its
    /// snapshot file if there is one, else empty.
    ///
    /// # Errors
    ///
    /// A snapshot file that is damaged is refused (the log below it is
    /// purged, so the state cannot be rebuilt locally): remove the
    /// replica's directory and add it back as a new member, and it is sent
    /// a snapshot.
    pub fn open(
        dir: &Path,
        observer: Option<ApplyObserver>,
    ) -> Result<StateMachine, SnapshotError> {
        StateMachine::open_with(Arc::new(StdFs), dir, observer)
    }

    /// [`StateMachine::open`] through a file system of the core crate's
    /// seam (`SimFs` in the crash tests).
    pub fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        observer: Option<ApplyObserver>,
    ) -> Result<StateMachine, SnapshotError> {
        let path = dir.join(SNAPSHOT_FILE);
        let read = read_file(fs.as_ref(), &path).map_err(|source| SnapshotError::Io {
            path: path.clone(),
            source,
        })?;
        let (applied, current) = match read {
            Some(bytes) => {
                let (meta, data) = decode_file(&path, &bytes)?;
                let mgr = verify_snapshot(&meta, &data)?;
                let applied = Applied {
                    mgr,
                    last_applied: meta.last_log_id,
                    membership: meta.last_membership.clone(),
                };
                (applied, Some((meta, Arc::new(data))))
            }
            None => (
                Applied {
                    mgr: ProducerStateManager::new(),
                    last_applied: None,
                    membership: StoredMembership::default(),
                },
                None,
            ),
        };
        Ok(StateMachine {
            shared: Arc::new(Shared {
                fs,
                dir: dir.to_path_buf(),
                applied: Mutex::new(applied),
                on_disk: watch::Sender::new(current.as_ref().and_then(|(m, _)| m.last_log_id)),
                current: Mutex::new(current),
                persisting: Mutex::new(()),
                builds: AtomicU64::new(0),
                observer,
            }),
        })
    }

    /// A copy of the producer state and the log id it reflects.
    pub fn state(&self) -> (Option<LogId<NodeId>>, ProducerStateManager) {
        let a = lock(&self.shared.applied);
        (a.last_applied, a.mgr.clone())
    }

    /// The log id the state reflects.
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        lock(&self.shared.applied).last_applied
    }

    /// The log id of the snapshot on disk, as it changes.
    pub(crate) fn snapshots(&self) -> watch::Receiver<Option<LogId<NodeId>>> {
        self.shared.on_disk.subscribe()
    }

    /// Persists a snapshot (envelope and crate bytes) atomically and makes
    /// it the current one, on a blocking thread: its fsyncs must not hold
    /// up a runtime worker.
    ///
    /// openraft 0.9 builds snapshots in a task of its own, so a build can
    /// finish after an install of a newer snapshot: writes are one at a
    /// time, and one older than the current snapshot is skipped (openraft
    /// purges the log up to the newest, so the file must never go back).
    async fn persist(&self, meta: &Meta, data: Arc<Vec<u8>>) -> Result<(), SErr> {
        let err = |e: String| -> SErr {
            StorageIOError::write_snapshot(Some(meta.signature()), openraft::AnyError::error(e))
                .into()
        };
        let bytes = encode_file(meta, &data).map_err(|e| err(e.to_string()))?;
        let (shared, meta) = (self.shared.clone(), meta.clone());
        tokio::task::spawn_blocking(move || {
            let _one_at_a_time = lock(&shared.persisting);
            let newer = |(m, _): &(Meta, _)| m.last_log_id > meta.last_log_id;
            if lock(&shared.current).as_ref().is_some_and(newer) {
                return Ok(());
            }
            write_atomically(shared.fs.as_ref(), &shared.dir, SNAPSHOT_FILE, &bytes, true)?;
            shared.on_disk.send_replace(meta.last_log_id);
            *lock(&shared.current) = Some((meta, data));
            Ok(())
        })
        .await
        .map_err(|e| err(e.to_string()))?
        .map_err(|e: std::io::Error| err(e.to_string()))
    }
}

/// `raft-snapshot`: magic, version, the metadata as JSON, a CRC over
/// those, then the crate's snapshot file (docs/format.md).
fn encode_file(meta: &Meta, data: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec(meta)?;
    let mut out = Vec::with_capacity(20 + json.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

fn decode_file(path: &Path, bytes: &[u8]) -> Result<(Meta, Vec<u8>), SnapshotError> {
    let bad = |what: &str| SnapshotError::File {
        path: path.to_path_buf(),
        what: what.to_string(),
    };
    let mut r = Reader(bytes);
    if r.take(8).map_err(bad)? != MAGIC {
        return Err(bad("not a replica snapshot (magic)"));
    }
    let version = r.u16().map_err(bad)?;
    if version != VERSION {
        return Err(bad(&format!(
            "version {version}; this build reads {VERSION}"
        )));
    }
    if r.u16().map_err(bad)? != 0 {
        return Err(bad("reserved field"));
    }
    let len = r.u32().map_err(bad)? as usize;
    let json = r.take(len).map_err(bad)?;
    let head_len = bytes.len() - r.0.len();
    let stored = r.u32().map_err(bad)?;
    if crc32c::crc32c(&bytes[..head_len]) != stored {
        return Err(bad("metadata checksum"));
    }
    let meta: Meta = serde_json::from_slice(json).map_err(|_| bad("metadata"))?;
    Ok((meta, r.0.to_vec()))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        // Copy under the lock (a memory copy), encode without it, so
        // applying goes on while the snapshot is written.
        let (mgr, last, membership) = {
            let a = lock(&self.shared.applied);
            (a.mgr.clone(), a.last_applied, a.membership.clone())
        };
        // The replicas run the seed rules, whose state the format holds
        // whole; an error here would be a Kafka-mode engine, never built.
        let data = mgr
            .encode_snapshot(position_of(last))
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let n = self.shared.builds.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match last {
            Some(l) => format!("{}-{}-{n}", l.leader_id, l.index),
            None => format!("--{n}"),
        };
        let meta = Meta {
            last_log_id: last,
            last_membership: membership,
            snapshot_id,
        };
        // Durable before openraft may purge the log it replaces.
        self.persist(&meta, Arc::new(data.clone())).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), SErr> {
        let a = lock(&self.shared.applied);
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut a = lock(&self.shared.applied);
        let mut out = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            let (cmd, response) = match &entry.payload {
                EntryPayload::Normal(cmd) => (Some(cmd), command::apply(&mut a.mgr, index, cmd)),
                EntryPayload::Membership(m) => {
                    a.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    (None, Response::default())
                }
                EntryPayload::Blank => (None, Response::default()),
            };
            a.last_applied = Some(entry.log_id);
            if let Some(observe) = &self.shared.observer {
                observe(index, cmd, &response);
            }
            out.push(response);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        // Verified again here (the transport verified it too): whatever
        // path a snapshot takes, damaged bytes never replace the state.
        let mgr = verify_snapshot(meta, &data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        self.persist(meta, Arc::new(data)).await?;
        let mut a = lock(&self.shared.applied);
        a.mgr = mgr;
        a.last_applied = meta.last_log_id;
        a.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        Ok(lock(&self.shared.current)
            .as_ref()
            .map(|(meta, data)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(data.as_ref().clone())),
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Append;
    use openraft::CommittedLeaderId;

    fn meta(index: u64) -> Meta {
        Meta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("t-{index}"),
        }
    }

    #[test]
    fn the_snapshot_file_round_trips_and_refuses_every_damage() {
        let mut mgr = ProducerStateManager::new();
        command::apply(
            &mut mgr,
            4,
            &Command::Append(Append::batch(9u64, 1, 0, 0, 3, 77)),
        );
        let data = mgr.encode_snapshot(5).unwrap();
        let m = meta(4);
        let file = encode_file(&m, &data).unwrap();
        let p = Path::new("raft-snapshot");
        let (back, bytes) = decode_file(p, &file).unwrap();
        assert_eq!((back.snapshot_id.as_str(), &bytes), ("t-4", &data));
        assert_eq!(
            verify_snapshot(&back, &bytes).unwrap().get(9u64, 1),
            mgr.get(9u64, 1)
        );
        for at in 0..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 1;
            let refused = decode_file(p, &bad)
                .map_err(|e| e.to_string())
                .and_then(|(m, d)| verify_snapshot(&m, &d).map_err(|e| e.to_string()));
            assert!(refused.is_err(), "flip at {at} accepted");
        }
        for cut in 0..file.len() {
            let refused = decode_file(p, &file[..cut])
                .map_err(|e| e.to_string())
                .and_then(|(m, d)| verify_snapshot(&m, &d).map_err(|e| e.to_string()));
            assert!(refused.is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn a_valid_snapshot_of_another_position_is_refused() {
        let data = ProducerStateManager::new().encode_snapshot(3).unwrap();
        assert!(matches!(
            verify_snapshot(&meta(4), &data),
            Err(SnapshotError::WrongPosition {
                expected: 5,
                found: 3,
                ..
            })
        ));
    }
}
