//! The state machine's snapshot file against openraft's concurrency:
//! openraft 0.9 builds a snapshot in a task of its own
//! (`sm::Worker::build_snapshot` spawns it) while its state machine
//! worker goes on applying entries and installing snapshots sent by the
//! leader, so a build and an install can write `raft-snapshot` at the
//! same time. Whatever their order, the file must end as the newest
//! snapshot: openraft purges the log up to an installed snapshot, so a
//! replica that restarted from an older one could not rebuild its state.
//! For the same reason a purge of the log waits until the snapshot that
//! covers it is on disk.

use std::io::Cursor;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta,
    StoredMembership,
};
use producer_state::ProducerStateManager;
use producer_state::fs::{DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, StdFs, WriteFile};
use producer_state_raft::command::apply;
use producer_state_raft::{Append, Command, LogStore, NodeId, StateMachine, TypeConfig};

mod common;
use common::sorted;

/// The real file system, except that the first creation of the snapshot's
/// temporary file once armed waits until the test lets it go.
#[derive(Debug)]
struct Gate {
    armed: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

impl Gate {
    fn wait_if_armed(&self, path: &Path) {
        if !path.ends_with("raft-snapshot.tmp") {
            return;
        }
        let armed = self.armed.lock().unwrap().take();
        if let Some((reached, release)) = armed {
            reached.send(()).unwrap();
            // Bounded: a test that never releases fails, not hangs.
            release.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    }
}

impl FileSystem for Gate {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        StdFs.create_dir_all(path)
    }
    fn kind(&self, path: &Path) -> std::io::Result<Option<EntryKind>> {
        StdFs.kind(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<DirEntry>> {
        StdFs.list(dir)
    }
    fn open_read(&self, path: &Path) -> std::io::Result<Box<dyn ReadFile>> {
        StdFs.open_read(path)
    }
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn WriteFile>> {
        self.wait_if_armed(path);
        StdFs.create_new(path)
    }
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn WriteFile>> {
        StdFs.open_append(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        StdFs.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        StdFs.remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        StdFs.sync_dir(path)
    }
    fn try_lock(&self, path: &Path) -> std::io::Result<Option<Box<dyn LockGuard>>> {
        StdFs.try_lock(path)
    }
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn command(index: u64) -> Command {
    Command::Append(Append::batch(
        index % 3,
        0,
        0,
        (index / 3) as i32,
        (index / 3) as i32,
        index as i64,
    ))
}

fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
    range
        .map(|i| Entry {
            log_id: log_id(i),
            payload: EntryPayload::Normal(command(i)),
        })
        .collect()
}

/// The index of the last purged log id in `raft-meta.json`.
fn purged_on_disk(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("raft-meta.json")).ok()?;
    let meta: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    meta["last_purged"]["index"].as_u64()
}

/// The leader's snapshot at 20: what entries 1..=20 come to.
fn leader_snapshot_at_20() -> (
    ProducerStateManager,
    SnapshotMeta<NodeId, BasicNode>,
    Vec<u8>,
) {
    let mut leader = ProducerStateManager::new();
    for i in 1..=20 {
        apply(&mut leader, i, &command(i));
    }
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(20)),
        last_membership: StoredMembership::default(),
        snapshot_id: "leader-20".into(),
    };
    let data = leader.encode_snapshot(21).unwrap();
    (leader, meta, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_finishes_after_an_install_leaves_the_installed_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        armed: Mutex::new(None),
    });
    let mut sm = StateMachine::open_with(gate.clone(), dir.path(), None).unwrap();
    sm.apply(entries(1..=10)).await.unwrap();

    let (leader, meta, data) = leader_snapshot_at_20();

    // A build of the state at 10 starts and stops as it creates its
    // file; meanwhile the snapshot at 20 is installed.
    let (reached_tx, reached) = channel();
    let (release, release_rx) = channel();
    *gate.armed.lock().unwrap() = Some((reached_tx, release_rx));
    let mut builder = sm.get_snapshot_builder().await;
    let build = tokio::spawn(async move { builder.build_snapshot().await });
    tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the build reached its file");
    let mut installer = sm.clone();
    let (m, d) = (meta.clone(), data.clone());
    let mut install = tokio::spawn(async move {
        installer
            .install_snapshot(&m, Box::new(Cursor::new(d)))
            .await
    });
    // The install may wait for the build (then this times out), or not.
    let early = tokio::time::timeout(Duration::from_millis(500), &mut install).await;
    release.send(()).unwrap();
    let built = build.await.unwrap().expect("the build");
    assert_eq!(built.meta.last_log_id, Some(log_id(10)));
    match early {
        Ok(installed) => installed.unwrap().expect("the install"),
        Err(_) => install.await.unwrap().expect("the install"),
    }

    // The newest snapshot is the current one, in memory and on disk.
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, Some(log_id(20)));
    let (at, state) = sm.state();
    assert_eq!(at, Some(log_id(20)));
    assert_eq!(sorted(&state), sorted(&leader));
    let reopened = StateMachine::open(dir.path(), None).unwrap();
    let (at, state) = reopened.state();
    assert_eq!(
        at,
        Some(log_id(20)),
        "the replica would restart from an older snapshot than the log it purged"
    );
    assert_eq!(sorted(&state), sorted(&leader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_after_an_install_waits_until_the_snapshot_is_on_disk() {
    // openraft 0.9 installs a snapshot from the leader by handing it to its
    // state machine worker and, at once, purging the log up to it
    // (`FollowingHandler::install_full_snapshot` issues both; the purge
    // waits for nothing). If the purge reached the disk first and the
    // machine then stopped, the replica would restart from its older
    // snapshot with the log after it purged: it could not rebuild its
    // state. The purge must wait for the snapshot file.
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        armed: Mutex::new(None),
    });
    let (mut log, _) = LogStore::open_with(gate.clone(), dir.path()).unwrap();
    let mut sm = StateMachine::open_with(gate.clone(), dir.path(), None).unwrap();
    log.purge_after_snapshots(&sm);
    log.blocking_append(entries(1..=10)).await.unwrap();
    sm.apply(entries(1..=10)).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    // The leader's snapshot at 20 is installed; its file write is held.
    let (_, meta, data) = leader_snapshot_at_20();
    let (reached_tx, reached) = channel();
    let (release, release_rx) = channel();
    *gate.armed.lock().unwrap() = Some((reached_tx, release_rx));
    let mut installer = sm.clone();
    let install = tokio::spawn(async move {
        installer
            .install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await
    });
    tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the install reached its file");
    let mut purger = log.clone();
    let mut purge = tokio::spawn(async move { purger.purge(log_id(20)).await });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut purge).await;

    // What a crash now would leave: the purge must not be on disk before
    // the snapshot that covers it. (The log holds its directory: its
    // purge record is read as the file it is, docs/format.md.)
    let purged = purged_on_disk(dir.path());
    let snapshot = StateMachine::open(dir.path(), None).unwrap().last_applied();
    assert!(
        purged <= snapshot.map(|s| s.index),
        "the log is purged to {purged:?} on disk, the snapshot there is at {snapshot:?}"
    );
    assert!(early.is_err(), "the purge did not wait for the snapshot");

    release.send(()).unwrap();
    install.await.unwrap().expect("the install");
    purge.await.unwrap().expect("the purge");
    assert_eq!(purged_on_disk(dir.path()), Some(20));
    drop((log, sm));
    let (mut reopened, _) = LogStore::open(dir.path()).unwrap();
    let state = reopened.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(20)));
    let reopened = StateMachine::open(dir.path(), None).unwrap();
    assert_eq!(reopened.last_applied(), Some(log_id(20)));
}
