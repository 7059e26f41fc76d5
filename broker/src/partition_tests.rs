//! Tests of `partition.rs`.

use super::*;

fn batch(pid: i64, epoch: i16, seq: i32, count: i32) -> Vec<u8> {
    let mut b = vec![0u8; batch::HEADER_LEN];
    b.extend_from_slice(&[5u8; 8]);
    let len = (b.len() - batch::LOG_OVERHEAD) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    b[16] = 2;
    b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    b[57..61].copy_from_slice(&count.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The shared state of the data directory holding partition `dir`.
fn state_dir(dir: &Path) -> PathBuf {
    dir.parent().unwrap().join("state")
}

/// Opens partition `dir` as key `key` of its data directory's state.
fn open_key(dir: &Path, key: i32) -> (Partition, OpenReport) {
    let store = Arc::new(open_state(dir.parent().unwrap(), 0, PRODUCER_ID_EXPIRATION).unwrap());
    let known = known_producers(&store);
    let ids = known.get(&key).cloned().unwrap_or_default();
    Partition::open(dir, ("t", key, key), &store, &ids).unwrap()
}

fn open(dir: &Path) -> (Partition, OpenReport) {
    open_key(dir, 0)
}

/// Cuts partition `dir`'s log file to `len` bytes, as a crash that lost
/// its tail would.
fn cut_log(dir: &Path, len: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join(LOG_FILE))
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Drops the partitions and closes their shared state.
fn close(ps: impl IntoIterator<Item = Partition>) {
    let mut store = None;
    for p in ps {
        store = Some(p.store.clone());
    }
    Arc::try_unwrap(store.unwrap()).unwrap().close().unwrap();
}

#[test]
fn a_lost_state_directory_is_replayed_so_retries_stay_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let (p, _) = open(&dir);
    assert_eq!(
        p.produce(&mut batch(7, 0, 0, 2)),
        Produced::Appended { base_offset: 0 }
    );
    assert_eq!(
        p.produce(&mut batch(7, 0, 2, 3)),
        Produced::Appended { base_offset: 2 }
    );
    close([p]);
    fs::remove_dir_all(state_dir(&dir)).unwrap();

    let (p, report) = open(&dir);
    // A fresh state is behind the log by all of it.
    assert_eq!((report.replayed, &report.rebuilt), (2, &None), "{report:?}");
    assert_eq!(report.max_producer_id, 7);
    // Without the replay a fresh state would accept the retry of the
    // first batch a second time.
    assert_eq!(
        p.produce(&mut batch(7, 0, 0, 2)),
        Produced::Duplicate { base_offset: 0 }
    );
    assert_eq!(
        p.produce(&mut batch(7, 0, 5, 1)),
        Produced::Appended { base_offset: 5 }
    );
    close([p]);
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Replaces the partition's state with `saved` (a copy taken earlier).
fn restore_state(dir: &Path, saved: &Path) {
    fs::remove_dir_all(state_dir(dir)).unwrap();
    copy_dir(saved, &state_dir(dir));
}

#[test]
fn a_state_behind_the_log_is_caught_up_by_replaying_the_batches_past_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let saved = tmp.path().join("saved");
    let (p, _) = open(&dir);
    assert_eq!(
        p.produce(&mut batch(7, 0, 0, 2)),
        Produced::Appended { base_offset: 0 }
    );
    close([p]);
    copy_dir(&state_dir(&dir), &saved);
    let (p, _) = open(&dir);
    assert_eq!(
        p.produce(&mut batch(7, 0, 2, 3)),
        Produced::Appended { base_offset: 2 }
    );
    assert_eq!(
        p.produce(&mut batch(-1, -1, -1, 1)),
        Produced::Appended { base_offset: 5 }
    );
    assert_eq!(
        p.produce(&mut batch(8, 0, 0, 1)),
        Produced::Appended { base_offset: 6 }
    );
    close([p]);
    // What a crash leaves when the state's last records were not yet
    // on disk (FsyncPolicy::Interval): a state that knows only b0.
    restore_state(&dir, &saved);

    let (p, report) = open(&dir);
    assert_eq!(
        (report.replayed, &report.rebuilt),
        (2, &None),
        "caught up by the two idempotent batches past offset 0: {report:?}"
    );
    // The client retries the batches it never heard about: the log has
    // them, so they must be duplicates with their offsets, not appended
    // again.
    assert_eq!(
        p.produce(&mut batch(7, 0, 2, 3)),
        Produced::Duplicate { base_offset: 2 }
    );
    assert_eq!(
        p.produce(&mut batch(8, 0, 0, 1)),
        Produced::Duplicate { base_offset: 6 }
    );
    assert_eq!(
        p.produce(&mut batch(7, 0, 5, 1)),
        Produced::Appended { base_offset: 7 }
    );
    close([p]);
    // The replayed state is the store's own now: it agrees on reopening.
    let (p, report) = open(&dir);
    assert_eq!((report.replayed, &report.rebuilt), (0, &None));
    close([p]);
}

#[test]
fn a_state_of_another_history_is_rebuilt_from_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("a").join("t-0");
    let dir = tmp.path().join("b").join("t-0");
    let saved = tmp.path().join("saved");
    // Another history: producer 9 at offset 0 (another data directory).
    let (p, _) = open(&other);
    p.produce(&mut batch(9, 0, 0, 1));
    close([p]);
    copy_dir(&state_dir(&other), &saved);
    let (p, _) = open(&dir);
    p.produce(&mut batch(7, 0, 0, 1));
    p.produce(&mut batch(7, 0, 1, 1));
    close([p]);
    restore_state(&dir, &saved);

    // Past the foreign state's offset 0 the log holds producer 7's
    // sequence 1 (applied as log recovery applies, without checks),
    // but the state knows producer 9, which the log does not.
    let (p, report) = open(&dir);
    let why = report.rebuilt.clone().expect("rebuilt");
    assert!(why.contains("producer 9"), "{why}");
    assert_eq!(
        report.replayed, 1,
        "the batch past offset 0, before the check"
    );
    assert_eq!(
        p.produce(&mut batch(7, 0, 1, 1)),
        Produced::Duplicate { base_offset: 1 }
    );
    assert_eq!(
        p.produce(&mut batch(9, 0, 0, 1)),
        Produced::Appended { base_offset: 2 },
        "producer 9 is not in this log"
    );
    close([p]);
}

/// A state ahead of its log (its record flushed, the log's write lost)
/// is cut back to the log's end, that partition's alone: the other
/// partition of the same state keeps its producers, and nothing is
/// rebuilt.
#[test]
fn a_state_ahead_of_its_log_is_truncated_to_it_and_the_others_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let next = tmp.path().join("t-1");
    let (p, _) = open_key(&dir, 0);
    let q = Partition::open(&next, ("t", 1, 1), &p.store, &[])
        .unwrap()
        .0;
    for seq in 0..3 {
        p.produce(&mut batch(7, 0, seq, 1));
        q.produce(&mut batch(8, 0, seq, 1));
    }
    let cut = p.lock().log.plan(2, usize::MAX, true, 3).unwrap().pos;
    close([p, q]);
    // The log loses its last batch (offset 2); the state has it.
    cut_log(&dir, cut);
    let store = Arc::new(open_state(tmp.path(), 0, PRODUCER_ID_EXPIRATION).unwrap());
    let known = known_producers(&store);
    assert_eq!(store.partition_end_offset(0), 3, "ahead of the log's 2");
    let (p, report) = Partition::open(&dir, ("t", 0, 0), &store, known.get(&0).unwrap()).unwrap();
    let (q, other) = Partition::open(&next, ("t", 1, 1), &store, known.get(&1).unwrap()).unwrap();
    let why = report.truncated.clone().expect("truncated");
    assert!(why.contains("ahead"), "{why}");
    assert_eq!(
        (&report.rebuilt, &other.truncated, &other.rebuilt),
        (&None, &None, &None)
    );
    assert_eq!(store.partition_end_offset(0), 2);
    assert_eq!(store.partition_end_offset(1), 3);
    // The client's retry of the lost batch is written again, not
    // answered as a duplicate at an offset the log never had.
    assert_eq!(
        p.produce(&mut batch(7, 0, 2, 1)),
        Produced::Appended { base_offset: 2 }
    );
    assert_eq!(
        q.produce(&mut batch(8, 0, 2, 1)),
        Produced::Duplicate { base_offset: 2 }
    );
    drop(store);
    close([p, q]);
}

#[test]
fn a_retry_racing_its_original_is_answered_only_once_the_original_is_durable() {
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    let tmp = tempfile::tempdir().unwrap();
    let (p, _) = open(&tmp.path().join("t-0"));
    let p = Arc::new(p);
    let (in_sync, wait_in_sync) = mpsc::channel();
    let (release, wait_release) = mpsc::channel::<()>();
    // Every append stops between its write and its fdatasync until
    // `release` is dropped.
    p.lock().log.before_sync = Some(crate::plog::SyncHook(Box::new(move || {
        let _ = in_sync.send(());
        let _ = wait_release.recv();
    })));
    let original = {
        let p = p.clone();
        std::thread::spawn(move || p.produce(&mut batch(4, 0, 0, 3)))
    };
    wait_in_sync.recv().unwrap();
    // The original is in the in-memory state and written to the log,
    // not durable: its retry (from a new connection) arrives now.
    let (answered, answer) = mpsc::channel();
    let retry = {
        let p = p.clone();
        std::thread::spawn(move || answered.send(p.produce(&mut batch(4, 0, 0, 3))))
    };
    assert!(
        answer.recv_timeout(Duration::from_millis(300)).is_err(),
        "the retry was answered before its original was durable"
    );
    drop(release);
    assert_eq!(
        original.join().unwrap(),
        Produced::Appended { base_offset: 0 }
    );
    retry.join().unwrap().unwrap();
    assert_eq!(
        answer.recv().unwrap(),
        Produced::Duplicate { base_offset: 0 }
    );
    assert_eq!(p.high_watermark(), 3);
}

#[test]
fn an_older_brokers_state_directories_are_removed_and_the_log_replayed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let (p, _) = open(&dir);
    p.produce(&mut batch(3, 0, 0, 1));
    close([p]);
    // What a broker with a store per partition left: its state dirs;
    // the shared state is new.
    fs::remove_dir_all(state_dir(&dir)).unwrap();
    for name in LEGACY_STATE {
        fs::create_dir(dir.join(name)).unwrap();
        fs::write(dir.join(name).join("00000000000000000000.wal"), b"x").unwrap();
    }
    let (p, report) = open(&dir);
    assert_eq!((report.replayed, &report.rebuilt), (1, &None));
    assert!(remove_legacy_state(&dir).unwrap());
    assert!(LEGACY_STATE.iter().all(|n| !dir.join(n).exists()));
    assert!(!remove_legacy_state(&dir).unwrap());
    assert_eq!(
        p.produce(&mut batch(3, 0, 0, 1)),
        Produced::Duplicate { base_offset: 0 }
    );
    close([p]);
}

/// A producer the state expired while its batches are still in the
/// partition log: a restart neither truncates nor rebuilds (the
/// state remembers that it expired the producer), and the producer's
/// next batch is accepted at its sequence, as Kafka since KIP-360
/// accepts it (no UNKNOWN_PRODUCER_ID on produce).
#[test]
fn an_expired_producer_causes_no_rebuild_and_continues_as_in_kafka() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let (p, _) = open(&dir);
    // The test batches carry timestamp 0, older than the default
    // expiration (a day) by decades.
    assert_eq!(
        p.produce(&mut batch(5, 0, 0, 2)),
        Produced::Appended { base_offset: 0 }
    );
    assert_eq!(
        p.produce(&mut batch(6, 0, 0, 1)),
        Produced::Appended { base_offset: 2 }
    );
    assert_eq!(p.store.expire_now().unwrap(), 2);
    assert!(p.producers().is_empty());
    assert!(p.store.was_removed(5u64, 0));
    close([p]);

    let (p, report) = open(&dir);
    assert_eq!(
        (report.replayed, &report.truncated, &report.rebuilt),
        (0, &None, &None),
        "{report:?}"
    );
    assert!(p.producers().is_empty(), "expired, not replayed back");
    // Producer 5 continues at sequence 2: Kafka (KIP-360) accepts the
    // first batch of a producer without state at any sequence.
    assert_eq!(
        p.produce(&mut batch(5, 0, 2, 1)),
        Produced::Appended { base_offset: 3 }
    );
    close([p]);
    let (p, report) = open(&dir);
    assert_eq!((report.replayed, &report.rebuilt), (0, &None), "{report:?}");
    assert_eq!(
        p.produce(&mut batch(5, 0, 2, 1)),
        Produced::Duplicate { base_offset: 3 }
    );
    close([p]);
}

#[test]
fn rejections_map_to_kafka_error_codes_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, _) = open(&tmp.path().join("t-0"));
    p.produce(&mut batch(1, 2, 0, 1));
    let code = |o: Produced| match o {
        Produced::Refused { code, .. } => code,
        other => panic!("{other:?}"),
    };
    assert_eq!(code(p.produce(&mut batch(1, 2, 5, 1))), 45);
    assert_eq!(code(p.produce(&mut batch(1, 1, 1, 1))), 47);
    let mut two = batch(1, 2, 1, 1);
    two.extend(batch(1, 2, 2, 1));
    assert_eq!(code(p.produce(&mut two)), 87);
    assert_eq!(p.high_watermark(), 1);
    // Without a producer id the broker cannot deduplicate: appended twice.
    let b = batch(-1, -1, -1, 1);
    assert_eq!(
        p.produce(&mut b.clone()),
        Produced::Appended { base_offset: 1 }
    );
    assert_eq!(
        p.produce(&mut b.clone()),
        Produced::Appended { base_offset: 2 }
    );
    close([p]);
}

/// `batch`, marked transactional.
fn txn_batch(pid: i64, epoch: i16, seq: i32, count: i32) -> Vec<u8> {
    let mut b = batch(pid, epoch, seq, count);
    b[21..23].copy_from_slice(&0x10i16.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

const ABORT: ControlMarker = ControlMarker {
    commit: false,
    coordinator_epoch: 1,
};

/// An ABORT marker the state holds and the log lost (a crash between the
/// two writes): the state keeps it (the agreement check compares data
/// batches), and the coordinator, whose transaction is still prepared,
/// writes the marker again when the broker opens: the state accepts it
/// and lists the transaction once, so a `read_committed` reader is told
/// to skip it once, and the next transaction of the producer is not.
#[test]
fn a_marker_the_log_lost_is_written_again_and_aborts_its_transaction_once() {
    let ok = || Ok(());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let (p, _) = open(&dir);
    assert_eq!(
        p.produce_verified(&mut txn_batch(7, 0, 0, 2), &ok),
        Produced::Appended { base_offset: 0 }
    );
    assert_eq!(
        p.produce_verified(&mut txn_batch(7, 0, 2, 2), &ok),
        Produced::Appended { base_offset: 2 }
    );
    assert_eq!(p.last_stable_offset(), 0);
    assert_eq!(p.write_marker(7, 0, ABORT, 1).unwrap(), 4);
    assert_eq!(p.last_stable_offset(), 5);
    assert_eq!(p.aborted_between(0, 5), vec![(7, 0)]);
    let cut = p.lock().log.plan(4, usize::MAX, true, 5).unwrap().pos;
    close([p]);
    cut_log(&dir, cut);

    let (p, report) = open(&dir);
    assert_eq!((report.truncated, report.rebuilt), (None, None));
    assert_eq!(p.high_watermark(), 4);
    assert_eq!(p.aborted_between(0, 4), vec![(7, 0)]);
    assert_eq!(p.write_marker(7, 0, ABORT, 2).unwrap(), 4);
    assert_eq!(p.last_stable_offset(), 5);
    assert_eq!(p.aborted_between(0, 5), vec![(7, 0)]);
    // The next transaction, committed: only the first is skipped.
    assert_eq!(
        p.produce_verified(&mut txn_batch(7, 0, 4, 1), &ok),
        Produced::Appended { base_offset: 5 }
    );
    let commit = ControlMarker {
        commit: true,
        ..ABORT
    };
    assert_eq!(p.write_marker(7, 0, commit, 3).unwrap(), 6);
    assert_eq!(p.last_stable_offset(), 7);
    assert_eq!(p.aborted_between(0, 7), vec![(7, 0)]);
    close([p]);
    let (p, report) = open(&dir);
    assert_eq!((report.truncated, report.rebuilt), (None, None));
    assert_eq!(
        (p.last_stable_offset(), p.aborted_between(0, 7)),
        (7, vec![(7, 0)])
    );
    close([p]);
}
