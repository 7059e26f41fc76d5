//! Machine crashes of one replica's files, simulated: a workload of log
//! appends, a vote, a truncation, a purge that rewrites the log, and
//! snapshots runs on the core crate's `SimFs`, which crashes at every IO
//! operation in turn; each crash image (unsynced bytes dropped, kept, or
//! kept in part) is reopened and must hold everything acknowledged:
//!
//! - the log opens (a torn tail is cut, never refused) and holds every
//!   acknowledged entry, exactly, followed by nothing but a prefix of what
//!   was in flight;
//! - an acknowledged vote and purge are there;
//! - the state machine opens at a snapshot that was acknowledged, or the
//!   one being written when the machine stopped.
//!
//! The images: unsynced bytes dropped, kept, kept as a torn prefix, the
//! same with directory changes reordered (each survives on its own), and
//! the sectors of unsynced writes persisted out of order, which leaves a
//! damaged record followed by valid records of the same write (every
//! record names its write, so the log cuts that write rather than refuse).
//!
//! A second workload opens a log of the previous version (2), which the
//! open rewrites as version 3, and appends to it: a crash at any of its
//! operations keeps every entry of the old file.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, Vote,
};
use producer_state::fs::{Fault, FileSystem, SimFs, Unsynced};
use producer_state_raft::{Append, Command, LogStore, StateMachine, TypeConfig};

const STEPS: u64 = 48;
const PER_STEP: u64 = 24;
/// Sector images per crash point: which sectors of an unsynced write
/// survive decides what the log must tell apart (one seed missed a write
/// torn after a truncation).
const SECTOR_SEEDS: u64 = 8;

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Command::Append(Append::batch(
            index % 7,
            (index % 3) as i32,
            term as i16,
            0,
            0,
            index as i64,
        ))),
    }
}

/// What the workload got acknowledged before its first failure, and what
/// it had in flight.
#[derive(Clone, Debug, Default)]
struct Acked {
    /// The log as it must be: every acknowledged entry (from index 1).
    entries: Vec<Entry<TypeConfig>>,
    /// Entries handed to the log whose append did not return.
    in_flight: Vec<Entry<TypeConfig>>,
    vote: Option<Vote<u64>>,
    /// A truncation that did not return: the entries it would leave.
    truncating: Option<usize>,
    purged: Option<u64>,
    /// Log index of the last acknowledged snapshot, and of the one being
    /// written when the workload stopped.
    snapshot: Option<u64>,
    snapshot_in_flight: Option<u64>,
}

async fn workload(fs: Arc<SimFs>, dir: &Path) -> Acked {
    let mut acked = Acked::default();
    let Ok((mut log, _)) = LogStore::open_with(fs.clone(), dir) else {
        return acked;
    };
    let Ok(mut sm) = StateMachine::open_with(fs.clone(), dir, None) else {
        return acked;
    };
    let mut term = 1;
    for step in 0..STEPS {
        if step == 20 {
            // A new leader replaces the last 10 entries with its own.
            term = 2;
            let at = acked.entries.len() as u64 - 9;
            let cut = acked.entries[at as usize - 1].log_id;
            acked.truncating = Some(at as usize - 1);
            if log.truncate(cut).await.is_err() {
                return acked;
            }
            acked.truncating = None;
            acked.entries.truncate(at as usize - 1);
        }
        let first = acked.entries.len() as u64 + 1;
        let batch: Vec<_> = (first..first + PER_STEP).map(|i| entry(term, i)).collect();
        acked.in_flight = batch.clone();
        if log.blocking_append(batch.clone()).await.is_err() {
            return acked;
        }
        acked.in_flight.clear();
        acked.entries.extend(batch.clone());
        if step == 5 {
            let v = Vote::new_committed(1, 1);
            if log.save_vote(&v).await.is_err() {
                return acked;
            }
            acked.vote = Some(v);
        }
        if step % 12 == 11 {
            // Apply everything and snapshot it, then purge below it (the
            // purge rewrites the file once enough of it is purged).
            if sm.apply(batch_since(&acked, acked.snapshot)).await.is_err() {
                return acked;
            }
            let at = acked.entries.len() as u64;
            acked.snapshot_in_flight = Some(at);
            let built = sm.get_snapshot_builder().await.build_snapshot().await;
            if built.is_err() {
                return acked;
            }
            acked.snapshot = Some(at);
            acked.snapshot_in_flight = None;
            // Keep the last 50 entries (openraft's `max_in_snapshot_log_to_keep`).
            let upto = acked.entries[at as usize - 51].log_id;
            if log.purge(upto).await.is_err() {
                return acked;
            }
            acked.purged = Some(upto.index);
        }
    }
    acked
}

fn batch_since(acked: &Acked, snapshot: Option<u64>) -> Vec<Entry<TypeConfig>> {
    let from = snapshot.unwrap_or(0) as usize;
    acked.entries[from..].to_vec()
}

async fn check(image: SimFs, dir: &Path, acked: &Acked, what: &str) {
    let fs: Arc<dyn FileSystem> = Arc::new(image);
    let (mut log, _) = match LogStore::open_with(fs.clone(), dir) {
        Ok(l) => l,
        Err(e) => panic!("{what}: the log does not open: {e}"),
    };
    let got = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    let state = log.get_log_state().await.unwrap();
    let purged = state.last_purged_log_id.map(|l| l.index);
    assert!(
        purged >= acked.purged,
        "{what}: purge {purged:?} < {:?}",
        acked.purged
    );
    let from = purged.unwrap_or(0) as usize;
    // Every acknowledged entry above the purge point, exactly (or, if a
    // truncation was in flight, what it leaves: either is a log Raft
    // accepts, since it only truncates entries that were not committed)...
    let mut want = acked.entries.get(from..).unwrap_or_default();
    if let Some(n) = acked.truncating
        && got.len() < want.len()
    {
        want = acked.entries.get(from..n).unwrap_or_default();
    }
    assert!(
        got.len() >= want.len(),
        "{what}: {} entries of {}",
        got.len(),
        want.len()
    );
    assert_eq!(&got[..want.len()], want, "{what}");
    // ...then at most a prefix of the append in flight.
    let extra = &got[want.len()..];
    assert!(
        acked.in_flight.starts_with(extra),
        "{what}: {} entries after the acknowledged ones that were never appended",
        extra.len()
    );
    if acked.vote.is_some() {
        assert_eq!(log.read_vote().await.unwrap(), acked.vote, "{what}");
    }
    let sm = match StateMachine::open_with(fs, dir, None) {
        Ok(sm) => sm,
        Err(e) => panic!("{what}: the state machine does not open: {e}"),
    };
    let at = sm.last_applied().map(|l| l.index);
    assert!(
        at == acked.snapshot
            || (acked.snapshot_in_flight.is_some() && at == acked.snapshot_in_flight),
        "{what}: snapshot at {at:?}, acknowledged {:?}, in flight {:?}",
        acked.snapshot,
        acked.snapshot_in_flight
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_io_operation_keeps_everything_acknowledged() {
    let dir = Path::new("/replica");
    // The whole workload once, to count its IO operations.
    let full = Arc::new(SimFs::new());
    let all = workload(full.clone(), dir).await;
    // Ten entries replaced at step 20; the last step snapshots and purges.
    assert_eq!(all.entries.len() as u64, STEPS * PER_STEP - 10);
    assert_eq!(all.snapshot, Some(all.entries.len() as u64));
    assert_eq!(all.purged, all.snapshot.map(|s| s - 50));
    // The last purge rewrote the file: it holds the last 50 entries.
    let log_len = full.read_file(&dir.join("raft.log")).unwrap().len();
    assert!(
        log_len < 50 * 80,
        "the log was not compacted: {log_len} bytes"
    );
    let ops = full.ops();
    check(full.crash_image(Unsynced::Drop), dir, &all, "no crash").await;
    let mut checked = 0;
    for crash_at in 0..ops {
        let fs = Arc::new(SimFs::new());
        fs.set_fault(crash_at, Fault::Crash);
        let acked = workload(fs.clone(), dir).await;
        assert!(
            fs.crashed(),
            "the crash at {crash_at} of {ops} did not happen"
        );
        for (image, name) in [
            (fs.crash_image(Unsynced::Drop), "unsynced dropped"),
            (fs.crash_image(Unsynced::Keep), "unsynced kept"),
            (
                fs.crash_image(Unsynced::TornPrefix(crash_at)),
                "a torn prefix",
            ),
            (
                fs.crash_image_reordered(Unsynced::TornPrefix(crash_at), crash_at),
                "a torn prefix, directory changes reordered",
            ),
        ]
        .into_iter()
        .chain((0..SECTOR_SEEDS).map(|k| {
            (
                fs.crash_image(Unsynced::Sectors(crash_at * SECTOR_SEEDS + k)),
                "sectors of unsynced writes persisted out of order",
            )
        })) {
            check(
                image,
                dir,
                &acked,
                &format!("crash at op {crash_at} of {ops}, {name}"),
            )
            .await;
            checked += 1;
        }
    }
    eprintln!("{checked} crash images checked over {ops} operations");
}

/// A replica of the previous build: the golden version-2 log.
fn version_2_replica(dir: &Path) -> Arc<SimFs> {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/raft-v2.log");
    let fs = Arc::new(SimFs::new());
    fs.overwrite(&dir.join("raft.log"), &std::fs::read(golden).unwrap());
    fs
}

/// Opens the log in `dir` (rewriting a version-2 log as version 3) and
/// appends one lifecycle entry; what was read, and whether the entry was
/// acknowledged.
async fn upgrade_and_append(fs: Arc<SimFs>, dir: &Path) -> Option<(Vec<Entry<TypeConfig>>, bool)> {
    let (mut log, _) = LogStore::open_with(fs, dir).ok()?;
    let read = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    let next = Entry {
        log_id: LogId::new(CommittedLeaderId::new(9, 1), read.len() as u64),
        payload: EntryPayload::Normal(Command::RemovePartition { partition: 4 }),
    };
    let acked = log.blocking_append([next]).await.is_ok();
    Some((read, acked))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_a_version_2_log_is_rewritten_keeps_every_entry() {
    // Opening a version-2 log rewrites it as version 3 (docs/format.md,
    // "Versions"). A crash at any IO operation of that open, or of the
    // append after it, leaves a log that opens to every entry the old file
    // held (then the appended one if it was acknowledged, or nothing else
    // but it), in version 3 once opened.
    let dir = Path::new("/replica");
    let full = version_2_replica(dir);
    let (old, acked) = upgrade_and_append(full.clone(), dir).await.unwrap();
    assert!(acked && old.len() == 5, "{} entries", old.len());
    let ops = full.ops();
    let mut checked = 0;
    for crash_at in 0..ops {
        let fs = version_2_replica(dir);
        fs.set_fault(crash_at, Fault::Crash);
        let acked = upgrade_and_append(fs.clone(), dir)
            .await
            .is_some_and(|(_, acked)| acked);
        assert!(
            fs.crashed(),
            "the crash at {crash_at} of {ops} did not happen"
        );
        for (image, name) in [
            (fs.crash_image(Unsynced::Drop), "unsynced dropped"),
            (fs.crash_image(Unsynced::Keep), "unsynced kept"),
            (
                fs.crash_image(Unsynced::TornPrefix(crash_at)),
                "a torn prefix",
            ),
            (
                fs.crash_image_reordered(Unsynced::TornPrefix(crash_at), crash_at),
                "a torn prefix, directory changes reordered",
            ),
            (
                fs.crash_image(Unsynced::Sectors(crash_at)),
                "sectors out of order",
            ),
        ] {
            let what = format!("crash at op {crash_at} of {ops}, {name}");
            let image = Arc::new(image);
            let (mut log, _) = match LogStore::open_with(image.clone(), dir) {
                Ok(l) => l,
                Err(e) => panic!("{what}: the log does not open: {e}"),
            };
            let got = log.try_get_log_entries(0..u64::MAX).await.unwrap();
            assert_eq!(&got[..old.len().min(got.len())], &old[..], "{what}");
            assert!(
                got.len() == old.len() + 1 || (!acked && got.len() == old.len()),
                "{what}: {} entries",
                got.len()
            );
            drop(log);
            let bytes = image.read_file(&dir.join("raft.log")).unwrap();
            assert_eq!(&bytes[8..10], &3u16.to_le_bytes(), "{what}");
            checked += 1;
        }
    }
    eprintln!("{checked} crash images of an upgrade checked over {ops} operations");
}
