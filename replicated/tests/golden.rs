//! The replica's files of a fixed history, byte for byte (docs/format.md,
//! "A replica of producer-state-raft"): the committed `raft.log` and
//! `raft-snapshot` in `tests/golden/` must still decode to that history,
//! and the encoders must still write exactly them. To write them anew
//! after a deliberate format change (with a new version):
//! `PRODUCER_STATE_BLESS=1 cargo test -p producer-state-raft --test golden`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder,
};
use producer_state_raft::{Append, Command, LogStore, OpenLogError, StateMachine, TypeConfig};

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
    ]
}

/// The golden log's salt: a new log draws one at random, so the history
/// is written after this header, made by hand as docs/format.md describes.
const SALT: u64 = 0x0123_4567_89ab_cdef;

fn header() -> Vec<u8> {
    let mut h = b"PSRAFTLG".to_vec();
    h.extend_from_slice(&2u16.to_le_bytes());
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
        producer_state_raft::Outcome::Duplicate {
            original: Some((3 * 65536, 1_700_000_000_000))
        }
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
    assert_eq!((opened.entries, opened.torn_bytes), (5, 0));
    assert_eq!(log.try_get_log_entries(0..100).await.unwrap(), history());
    check_state(copy.path());
    // A snapshot written before the crate's snapshot version 3 (no store
    // section, no activity per key) still opens to the same state.
    let older = tempfile::tempdir().unwrap();
    std::fs::copy(
        golden().join("raft-snapshot-crate-v2"),
        older.path().join("raft-snapshot"),
    )
    .unwrap();
    check_state(older.path());
}

/// The state machine in `dir` holds the history's state.
fn check_state(dir: &Path) {
    let sm = StateMachine::open(dir, None).unwrap();
    let (at, state) = sm.state();
    assert_eq!(at, Some(history()[4].log_id));
    assert_eq!(state.len(), 3);
    let orders = state.get("orders", -1).unwrap();
    assert_eq!((orders.epoch(), orders.last_sequence()), (3, 9));
    assert_eq!(state.get(7u64, 0).unwrap().last_sequence(), 1);
    assert_eq!(state.get(u64::MAX, i32::MAX).unwrap().epoch(), i16::MAX);
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
