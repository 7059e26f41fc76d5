//! The replica's files of a fixed history, byte for byte (docs/format.md,
//! "A replica of producer-state-raft"): the committed `raft.log` and
//! `raft-snapshot` in `tests/golden/` must still decode to that history,
//! and the encoders must still write exactly them. To write them anew
//! after a deliberate format change (with a new version):
//! `PRODUCER_STATE_BLESS=1 cargo test -p producer-state-raft --test golden`.
//!
//! Older files stay as they were written and must still be read:
//! `raft-v2.log` (log version 2, appends only: the first five entries of
//! the history) opens to its entries and is rewritten as version 3;
//! `raft-snapshot-crate-v2` holds the state after those five entries in
//! the crate's snapshot version 2; `raft-snapshot-crate-v3` the state
//! after the whole history in the crate's snapshot version 3 (the golden
//! `raft-snapshot` before version 4); `raft-snapshot-crate-v4` the same in
//! the crate's snapshot version 4 (before version 5 added partition ends).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder,
};
use producer_state::{Batch, ProducerStateManager};
use producer_state_raft::{
    Append, Command, LifecycleOutcome, LogStore, OpenLogError, Outcome, StateMachine, TypeConfig,
};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn history() -> Vec<Entry<TypeConfig>> {
    let id = |term, index| LogId::new(CommittedLeaderId::new(term, 1), index);
    vec![
        Entry {
            log_id: id(1, 0),
            payload: EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([1, 2, 3])],
                None,
            )),
        },
        Entry {
            log_id: id(1, 1),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: id(1, 2),
            payload: EntryPayload::Normal(Command::Append(Append::single(7u64, 0, 0, 0))),
        },
        Entry {
            log_id: id(2, 3),
            payload: EntryPayload::Normal(Command::AppendAll(vec![
                Append::batch("orders", -1, 3, 0, 9, 1_700_000_000_000),
                Append::batch(u64::MAX, i32::MAX, i16::MAX, 0, 0, -5),
                Append::single(7u64, 0, 0, 1),
            ])),
        },
        Entry {
            log_id: id(2, 4),
            payload: EntryPayload::Normal(Command::Append(Append::batch(
                "orders",
                -1,
                3,
                0,
                9,
                1_700_000_000_999,
            ))),
        },
        // Log version 3: the lifecycle commands.
        Entry {
            log_id: id(2, 5),
            payload: EntryPayload::Normal(Command::Expire {
                now_ms: 1_700_000_000_000,
                expiration_ms: 86_400_000,
            }),
        },
        Entry {
            log_id: id(2, 6),
            payload: EntryPayload::Normal(Command::RemovePartition { partition: -1 }),
        },
        Entry {
            log_id: id(3, 7),
            payload: EntryPayload::Normal(Command::import_partition(&moved())),
        },
        Entry {
            log_id: id(3, 8),
            payload: EntryPayload::Normal(Command::Append(Append::batch(
                3u64,
                9,
                1,
                0,
                4,
                1_700_000_000_500,
            ))),
        },
    ]
}

/// The entries of `raft-v2.log`: the history's appends.
const V2_ENTRIES: usize = 5;

/// A partition exported from another group: producer 3 on partition 9,
/// one batch at offset 77 * 65,536.
fn moved() -> producer_state::PartitionExport {
    let mut other = ProducerStateManager::new();
    other.append_batch(3u64, 9, 1, Batch::new(0, 4, 77 << 16, 1_700_000_000_400));
    other.export_partition(9).unwrap()
}

/// The golden log's salt: a new log draws one at random, so the history
/// is written after this header, made by hand as docs/format.md describes.
const SALT: u64 = 0x0123_4567_89ab_cdef;

fn header() -> Vec<u8> {
    let mut h = b"PSRAFTLG".to_vec();
    h.extend_from_slice(&3u16.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&SALT.to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// Writes the history's log and a snapshot after it into `dir`.
async fn write(dir: &Path) {
    std::fs::write(dir.join("raft.log"), header()).unwrap();
    let (mut log, _) = LogStore::open(dir).unwrap();
    log.blocking_append(history()).await.unwrap();
    let mut sm = StateMachine::open(dir, None).unwrap();
    let responses = sm.apply(history()).await.unwrap();
    // The retry at index 4 was answered from the window of index 3.
    assert_eq!(
        responses[4].outcomes[0],
        Outcome::Duplicate {
            original: Some((3 * 65536, 1_700_000_000_000))
        }
    );
    // The expiration forgot the key whose batch is from 1969 (timestamp
    // -5), not "orders" (its batch is "now") nor producer 7 (no
    // timestamp); the removal forgot "orders"; the import added producer
    // 3, whose retry is answered with the offset its old group gave.
    let lifecycle: Vec<_> = responses[5..8]
        .iter()
        .map(|r| r.lifecycle.clone())
        .collect();
    assert_eq!(
        lifecycle,
        [
            Some(LifecycleOutcome::Expired { keys: 1 }),
            Some(LifecycleOutcome::PartitionRemoved { keys: 1 }),
            Some(LifecycleOutcome::Imported { keys: 1 }),
        ]
    );
    assert_eq!(
        responses[8].outcomes,
        [Outcome::Duplicate {
            original: Some((77 << 16, 1_700_000_000_400))
        }]
    );
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
}

#[tokio::test]
async fn the_golden_files_decode_to_their_history_and_are_written_byte_for_byte() {
    let fresh = tempfile::tempdir().unwrap();
    write(fresh.path()).await;
    if std::env::var_os("PRODUCER_STATE_BLESS").is_some() {
        std::fs::create_dir_all(golden()).unwrap();
        for f in ["raft.log", "raft-snapshot"] {
            std::fs::copy(fresh.path().join(f), golden().join(f)).unwrap();
        }
    }
    for f in ["raft.log", "raft-snapshot"] {
        let (now, kept) = (
            std::fs::read(fresh.path().join(f)).unwrap(),
            std::fs::read(golden().join(f)).unwrap(),
        );
        let first_difference = now.iter().zip(&kept).position(|(a, b)| a != b);
        assert!(
            now == kept,
            "{f} is no longer written as the golden file: {} bytes against {}, first difference at {first_difference:?}",
            now.len(),
            kept.len()
        );
    }
    // Decoding: a copy of the golden files opens to the history.
    let copy = tempfile::tempdir().unwrap();
    for f in ["raft.log", "raft-snapshot"] {
        std::fs::copy(golden().join(f), copy.path().join(f)).unwrap();
    }
    let (mut log, opened) = LogStore::open(copy.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (history().len(), 0));
    assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), history());
    let sm = StateMachine::open(copy.path(), None).unwrap();
    let (at, state) = sm.state();
    assert_eq!(at, Some(history()[8].log_id));
    assert_eq!(state.len(), 2);
    assert_eq!(state.get(7u64, 0).unwrap().last_sequence(), 1);
    assert_eq!(state.get(3u64, 9), moved().iter().next().map(|i| i.entry));
    // The same state in the crate's snapshot versions 3 and 4 opens to it
    // too.
    let sorted = |m: &ProducerStateManager| {
        let mut v: Vec<_> = m.iter().map(|(id, p, e)| (id.to_string(), p, e)).collect();
        v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        v
    };
    for older in ["raft-snapshot-crate-v3", "raft-snapshot-crate-v4"] {
        let d = tempfile::tempdir().unwrap();
        std::fs::copy(golden().join(older), d.path().join("raft-snapshot")).unwrap();
        let old = StateMachine::open(d.path(), None).unwrap();
        let (old_at, old_state) = old.state();
        assert_eq!(old_at, at, "{older}");
        assert_eq!(sorted(&old_state), sorted(&state), "{older}");
    }
    // A snapshot written before the crate's snapshot version 3 (no store
    // section, no activity per key) still opens to the state after the
    // appends of the history.
    let older = tempfile::tempdir().unwrap();
    std::fs::copy(
        golden().join("raft-snapshot-crate-v2"),
        older.path().join("raft-snapshot"),
    )
    .unwrap();
    check_state_after_appends(older.path());
}

/// The state machine in `dir` holds the state after the history's
/// appends (its first five entries).
fn check_state_after_appends(dir: &Path) {
    let sm = StateMachine::open(dir, None).unwrap();
    let (at, state) = sm.state();
    assert_eq!(at, Some(history()[V2_ENTRIES - 1].log_id));
    assert_eq!(state.len(), 3);
    let orders = state.get("orders", -1).unwrap();
    assert_eq!((orders.epoch(), orders.last_sequence()), (3, 9));
    assert_eq!(state.get(7u64, 0).unwrap().last_sequence(), 1);
    assert_eq!(state.get(u64::MAX, i32::MAX).unwrap().epoch(), i16::MAX);
}

#[tokio::test]
async fn a_log_of_version_2_opens_to_its_entries_and_is_rewritten_as_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.log");
    let v2 = std::fs::read(golden().join("raft-v2.log")).unwrap();
    std::fs::write(&path, &v2).unwrap();
    let appends = history()[..V2_ENTRIES].to_vec();
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (V2_ENTRIES, 0));
    assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), appends);
    // Rewritten before anything is appended: version 3, the same salt, so
    // a build that reads only version 2 refuses it by its version instead
    // of cutting a lifecycle command it cannot read as a torn write.
    let now = std::fs::read(&path).unwrap();
    assert_eq!(&now[8..10], &3u16.to_le_bytes());
    assert_eq!(now[12..20], v2[12..20]);
    assert_ne!(now, v2);
    // The rewritten log goes on like any other: a lifecycle command is
    // appended after the old entries, and everything reads back.
    let rest = history()[V2_ENTRIES..].to_vec();
    log.blocking_append(rest).await.unwrap();
    drop(log);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (history().len(), 0));
    assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), history());
}

#[test]
fn a_log_of_version_1_is_refused_by_its_version() {
    // Version 1, never released, named a record's write by the write's
    // last index, which a truncation made ambiguous; this build reads
    // version 2 and refuses the old file by name rather than misread it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(golden().join("raft-v1.log"), dir.path().join("raft.log")).unwrap();
    match LogStore::open(dir.path()) {
        Err(OpenLogError::Corrupt {
            offset: 8, what, ..
        }) => {
            assert!(what.contains("version"), "{what}")
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a version 1 log was opened"),
    }
}

/// The frames of the wire protocol, version 1 (`wire.rs`'s module docs):
/// a request of each kind carrying the history's entries and commands,
/// and a reply of each kind, back to back in `wire-v1.bin`. They must
/// still decode to the same messages, and the encoders must still write
/// exactly these bytes: a node of this build and one of the build that
/// wrote them understand each other. (The snapshot a `SnapshotChunk` and
/// a `Dump` carry is opaque to the wire: it is the crate's snapshot of the
/// build that writes it, version 5 since partition ends; the file was
/// written anew for that, its frames unchanged.)
#[tokio::test]
async fn wire_frames_of_version_1_decode_and_encode_to_the_same_bytes() {
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
    use openraft::{LeaderId, SnapshotMeta, StoredMembership, Vote};
    use producer_state_raft::wire::{
        Reply, Request, SnapshotAck, SnapshotChunk, Status, SubmitReply, read_frame,
    };
    use producer_state_raft::{Answer, Response};

    let id = |term, index| LogId::new(CommittedLeaderId::new(term, 1), index);
    let vote = Vote {
        leader_id: LeaderId {
            term: 3,
            node_id: 1,
        },
        committed: true,
    };
    let membership = Membership::new(vec![BTreeSet::from([1, 2, 3])], None);
    let requests = [
        Request::AppendEntries(AppendEntriesRequest {
            vote,
            prev_log_id: None,
            leader_commit: Some(id(2, 4)),
            entries: history(),
        }),
        Request::Vote(VoteRequest {
            vote,
            last_log_id: Some(id(3, 8)),
        }),
        Request::SnapshotChunk(SnapshotChunk {
            vote,
            meta: SnapshotMeta {
                last_log_id: Some(id(3, 8)),
                last_membership: StoredMembership::new(Some(id(1, 0)), membership),
                snapshot_id: "3-1-8-1".into(),
            },
            total: 100,
            offset: 96,
            data: vec![1, 2, 3, 4],
        }),
        Request::Submit(Command::AppendAll(vec![
            Append::batch("orders", -1, 3, 0, 9, 1_700_000_000_000),
            Append::single(7u64, 0, 0, 2),
        ])),
        Request::Status,
        Request::Entries { from: 5, max: 100 },
        Request::Export,
    ];
    let replies = vec![
        Reply::AppendEntries(AppendEntriesResponse::PartialSuccess(Some(id(3, 6)))),
        Reply::Vote(VoteResponse {
            vote,
            vote_granted: false,
            last_log_id: Some(id(2, 4)),
        }),
        Reply::Snapshot(SnapshotAck::Received { next: 100 }),
        Reply::Snapshot(SnapshotAck::Installed { vote }),
        Reply::Submit(SubmitReply::Answered(Answer {
            log_id: id(3, 9),
            first_slot: 2,
            response: Response {
                outcomes: vec![
                    Outcome::Accepted {
                        offset: 9 << 16 | 2,
                    },
                    Outcome::Duplicate {
                        original: Some((3 << 16, 1_700_000_000_000)),
                    },
                    Outcome::OutOfOrder {
                        reason: "gap".into(),
                    },
                    Outcome::FencedEpoch { current_epoch: 4 },
                ],
                lifecycle: None,
            },
        })),
        Reply::Submit(SubmitReply::Answered(Answer {
            log_id: id(3, 10),
            first_slot: 0,
            response: Response {
                outcomes: Vec::new(),
                lifecycle: Some(LifecycleOutcome::Expired { keys: 2 }),
            },
        })),
        Reply::Submit(SubmitReply::NotLeader {
            leader: Some(2),
            addr: "127.0.0.1:7002".into(),
        }),
        Reply::Submit(SubmitReply::Unknown {
            reason: "not committed within 1s".into(),
        }),
        Reply::Submit(SubmitReply::Invalid {
            reason: "a command must carry at least one append".into(),
        }),
        Reply::Status(Status {
            id: 1,
            term: 3,
            leader: Some(1),
            last_applied: Some(id(3, 8)),
            last_log_index: Some(8),
            members: vec![(1, "127.0.0.1:7001".into()), (2, "127.0.0.1:7002".into())],
            snapshots_installed: 1,
            snapshots_refused: 0,
            log_fsyncs: 42,
        }),
        Reply::Entries(history()),
        Reply::Export {
            last_applied: Some(id(3, 8)),
            snapshot: ProducerStateManager::new().encode_snapshot(9).unwrap(),
        },
        Reply::Failed("the replica stopped".into()),
    ];
    let mut bytes = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        bytes.extend(r.encode(i as u64).unwrap());
    }
    for (i, r) in replies.iter().enumerate() {
        bytes.extend(r.encode(100 + i as u64).unwrap());
    }
    let path = golden().join("wire-v1.bin");
    if std::env::var_os("PRODUCER_STATE_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    let stored = std::fs::read(&path).unwrap();
    assert!(stored == bytes, "the encoders no longer write wire-v1.bin");
    let mut r = stored.as_slice();
    for (i, want) in requests.iter().enumerate() {
        let f = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(f.id, i as u64);
        let got = Request::decode(&f).unwrap();
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }
    for (i, want) in replies.iter().enumerate() {
        let f = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(f.id, 100 + i as u64);
        let got = Reply::decode(&f).unwrap();
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }
    assert!(read_frame(&mut r).await.unwrap().is_none());
}
