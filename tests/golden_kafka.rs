//! Committed files pin the on-disk format of a `Semantics::Kafka` store
//! (docs/format.md): `tests/golden/store-kafka-v6` holds the segments and
//! the snapshot (version 6, regenerated when that version came; its
//! segments unchanged) a fixed history writes, as tests/golden.rs does for
//! the strict rules. `store-kafka-v5` (segment version 5, snapshot version 4)
//! and `store-kafka-v5-snap3` (snapshot version 3) hold the same history
//! as older builds wrote it: still read.
//!
//! The history has every transaction record (kinds 16 to 20: a
//! transactional batch with a numeric and a named id, a COMMIT and an ABORT
//! marker with each, aborted transactions forgotten), a replicated batch
//! with a sequence gap (a side-table key that is not transactional, whose
//! batches keep the plain kind 2), plain
//! batches and single-sequence appends in Kafka-flagged segments, and a
//! snapshot taken while two transactions are open and two partitions list
//! aborted ones, so its Kafka section holds side-table keys and aborted
//! lists. The test checks that this build writes exactly those bytes
//! (segments byte for byte; the snapshot's header, store section and Kafka
//! section byte for byte, its compact entries as a set, their order being
//! the in-memory layout's), that the files say what docs/format.md says
//! they say, and that they open to the state the Kafka engine reaches on
//! the same history.
//!
//! Regenerate (only on a deliberate format change, with a new version):
//! `GOLDEN_REGENERATE=1 cargo test --test golden_kafka`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::golden_dir::committed as committed_in;
use common::snapshot_bytes::snapshot_entries;

use producer_state::fs::{FileSystem, ReadOnlyFs, SimFs};
use producer_state::inspect::{self, LogOp};
use producer_state::{
    AbortedTxn, AppendOptions, Batch, BatchOutcome, FsyncPolicy, ManualClock, Marker, Origin,
    ProducerId, ProducerStateManager, ProducerStateStore, Semantics, StoreOptions,
};

const GOLDEN: &str = "tests/golden/store-kafka-v6";
/// The same history as committed when segments were version 5 and
/// snapshots version 4: still read.
const GOLDEN_V5: &str = "tests/golden/store-kafka-v5";
/// The same history as committed when snapshots were version 3 (its
/// segments are `GOLDEN_V5`'s, byte for byte): still read.
const GOLDEN_SNAP3: &str = "tests/golden/store-kafka-v5-snap3";
/// The seed of the golden store's ids (see `fixed_ids_for_tests`).
const IDS_SEED: u64 = 0x4b61_666b;
const T0: i64 = 1_700_000_000_000;

fn opts(fs: &SimFs) -> StoreOptions {
    StoreOptions::default()
        .semantics(Semantics::Kafka)
        .file_system(Arc::new(fs.clone()))
        .fsync(FsyncPolicy::Always)
        .segment_size(1024)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
        .background_snapshots(false)
        .fixed_ids_for_tests(IDS_SEED)
        .clock(Arc::new(ManualClock::new(T0)))
        .expiration_interval(None)
        .preallocate(false)
}

/// One step of the fixed history.
#[derive(Clone)]
enum Step {
    /// A data batch: id, partition, epoch, first, last, offset, options.
    Data(ProducerId, i32, i16, i32, i32, i64, AppendOptions),
    /// A single-sequence append: id, partition, epoch, sequence.
    Single(ProducerId, i32, i16, i32),
    /// An end-transaction marker from the coordinator: id, partition,
    /// epoch, marker.
    End(ProducerId, i32, i16, Marker),
    /// Aborted transactions of a partition below an offset forgotten.
    Forget(i32, i64),
    /// A snapshot.
    Snapshot,
}

fn history() -> Vec<Step> {
    use Step::*;
    let c = AppendOptions::client();
    let t = c.transactional().verified();
    let r = AppendOptions::replication();
    let (plain, txn, named) = (
        ProducerId::from(1u64),
        ProducerId::from(7u64),
        ProducerId::from("tx-named"),
    );
    let mut h = vec![
        Data(plain.clone(), 0, 0, 0, 2, 0, c),
        Single(2u64.into(), 0, 0, 0),
        Data(txn.clone(), 0, 0, 0, 1, 3, t), // kind 16, opens at 3
        Data(named.clone(), 1, 2, 0, 0, 0, t), // kind 17, opens at 0
        Data(9u64.into(), 0, 0, 5, 5, 5, r), // unknown producer at 5
        Data(9u64.into(), 0, 0, 7, 7, 6, r), // a gap: side table
        End(txn.clone(), 0, 0, Marker::commit(3, 7, T0 + 7)), // kind 18
        End(named.clone(), 1, 3, Marker::abort(1, 1, T0 + 8)), // kind 19, epoch bump
        Data(txn.clone(), 0, 0, 2, 4, 8, t),
        End(txn.clone(), 0, 0, Marker::abort(3, 11, T0 + 11)),
        Data(txn.clone(), 0, 0, 5, 5, 12, t), // open again at 12
        Data(named.clone(), 1, 3, 0, 1, 2, t), // open again at 2
        Snapshot,
        Forget(1, 2), // kind 20: the abort at 1 goes
        End(txn.clone(), 0, 0, Marker::commit(2, 13, T0 + 13)), // fenced: writes nothing
        Data(txn.clone(), 0, 0, 0, 0, 13, c), // inside a transaction: refused
    ];
    // Plain batches that roll the log into further segments.
    for i in 0..30 {
        h.push(Data(
            3u64.into(),
            2,
            1,
            i * 2,
            i * 2 + 1,
            100 + i64::from(i) * 2,
            c,
        ));
    }
    h.push(Single(2u64.into(), 0, 0, 1));
    h.push(End(named.clone(), 1, 3, Marker::commit(1, 4, T0 + 20)));
    h
}

/// What one step answered, as text (both engines' outcomes print alike).
fn on_store(s: &ProducerStateStore, step: &Step) -> String {
    match step.clone() {
        Step::Data(id, p, e, f, l, off, o) => {
            format!(
                "{:?}",
                s.append_with(id, p, e, Batch::new(f, l, off, T0 + off), o)
                    .unwrap()
            )
        }
        Step::Single(id, p, e, seq) => format!("{:?}", s.append(id, p, e, seq).unwrap()),
        Step::End(id, p, e, m) => {
            format!(
                "{:?}",
                s.append_marker(id, p, e, m, Origin::Coordinator).unwrap()
            )
        }
        Step::Forget(p, off) => format!("{:?}", s.forget_aborted_before(p, off).unwrap()),
        Step::Snapshot => format!("{:?}", s.snapshot().unwrap().is_some()),
    }
}

fn on_engine(m: &mut ProducerStateManager, step: &Step) -> String {
    match step.clone() {
        Step::Data(id, p, e, f, l, off, o) => {
            format!(
                "{:?}",
                m.append_with(id, p, e, Batch::new(f, l, off, T0 + off), o)
                    .unwrap()
            )
        }
        Step::Single(id, p, e, seq) => format!("{:?}", m.append(id, p, e, seq)),
        Step::End(id, p, e, mk) => {
            format!(
                "{:?}",
                m.append_marker(id, p, e, mk, Origin::Coordinator).unwrap()
            )
        }
        Step::Forget(p, off) => {
            m.forget_aborted_before(p, off);
            "()".to_string()
        }
        Step::Snapshot => "true".to_string(),
    }
}

/// Writes the history into `dir` and returns the engine that ran it.
fn write_history(fs: &SimFs, dir: &Path) -> ProducerStateManager {
    let store = ProducerStateStore::open_with(dir, opts(fs)).unwrap();
    let mut engine = ProducerStateManager::with_semantics(Semantics::Kafka);
    for (i, step) in history().iter().enumerate() {
        assert_eq!(
            on_store(&store, step),
            on_engine(&mut engine, step),
            "step {i}"
        );
    }
    store.close().unwrap();
    engine
}

fn store_files(fs: &SimFs, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = fs
        .list(dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name != "LOCK")
        .map(|e| (e.name.clone(), fs.read_file(&dir.join(&e.name)).unwrap()))
        .collect();
    files.sort();
    files
}

fn committed() -> Vec<(String, Vec<u8>)> {
    committed_in(GOLDEN)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A snapshot (version 3 to 6) split by an independent reading of
/// docs/format.md: the header, the store section, the Kafka section (its
/// length field included) and the bytes of the entries.
fn split_snapshot(file: &[u8]) -> (&[u8], &[u8], &[u8], &[u8]) {
    assert_eq!(&file[..8], b"PSTATSNP");
    let version = u16::from_le_bytes([file[8], file[9]]);
    assert!((3..=6).contains(&version), "version {version}");
    assert_eq!(
        u16::from_le_bytes([file[10], file[11]]),
        1,
        "flag bit 0: Kafka"
    );
    let body_len = le_u64(file, 32) as usize;
    assert_eq!(file.len(), 48 + body_len + 4);
    let body = &file[48..48 + body_len];
    let store = 4 + u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
    let kafka = 8 + le_u64(body, store) as usize;
    (
        &file[..48],
        &body[..store],
        &body[store..store + kafka],
        &body[store + kafka..],
    )
}

#[test]
fn the_committed_kafka_store_decodes_and_the_encoder_still_writes_it() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/golden");
    let engine = write_history(&fs, &dir);
    let fresh = store_files(&fs, &dir);
    let names: Vec<&String> = fresh.iter().map(|f| &f.0).collect();
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".wal")).count(),
        3,
        "{names:?}"
    );
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".snap")).count(),
        1,
        "{names:?}"
    );

    if std::env::var("GOLDEN_REGENERATE").is_ok() {
        let _ = std::fs::remove_dir_all(GOLDEN);
        std::fs::create_dir_all(GOLDEN).unwrap();
        for (name, bytes) in &fresh {
            std::fs::write(Path::new(GOLDEN).join(name), bytes).unwrap();
        }
    }

    let committed = committed();
    assert_eq!(
        committed.iter().map(|f| &f.0).collect::<Vec<_>>(),
        names,
        "the same files"
    );
    for ((name, cb), (_, fb)) in committed.iter().zip(&fresh) {
        if name.ends_with(".snap") {
            let (ch, cs, ck, ce) = split_snapshot(cb);
            let (fh, fs_, fk, fe) = split_snapshot(fb);
            assert_eq!((ch, cs, ck), (fh, fs_, fk), "{name}: header and sections");
            // The compact entries: the same set (their order is the
            // in-memory layout's).
            assert_eq!(ce.len(), fe.len(), "{name}: entries");
            assert_eq!(
                snapshot_entries(cb),
                snapshot_entries(fb),
                "{name}: entries"
            );
            assert_eq!(snapshot_entries(cb).len(), 2);
        } else {
            assert!(
                cb == fb,
                "{name}: the encoder no longer writes the committed bytes (format change? see docs/format.md)"
            );
        }
    }

    // The committed files open to the engine's state.
    opens_to_the_history(&committed, &engine);
    // So do those of segment version 5, and of snapshot version 3, whose
    // segments are version 5's.
    let v5 = committed_in(GOLDEN_V5);
    opens_to_the_history(&v5, &engine);
    let old = committed_in(GOLDEN_SNAP3);
    for ((name, ob), (_, nb)) in old.iter().zip(&v5) {
        if name.ends_with(".wal") {
            assert!(ob == nb, "{name}: the segments did not change");
        } else {
            assert_eq!(u16::from_le_bytes([ob[8], ob[9]]), 3, "{name}");
        }
    }
    opens_to_the_history(&old, &engine);
}

/// Opens a copy of `committed` and compares it with the engine that ran
/// the history.
fn opens_to_the_history(committed: &[(String, Vec<u8>)], engine: &ProducerStateManager) {
    let gfs = SimFs::new();
    let gdir = PathBuf::from("/copy");
    gfs.create_dir_all(&gdir).unwrap();
    for (name, bytes) in committed {
        gfs.overwrite(&gdir.join(name), bytes);
    }
    let store = ProducerStateStore::open_with(&gdir, opts(&gfs)).unwrap();
    let keys: Vec<(ProducerId, i32)> = vec![
        (1u64.into(), 0),
        (2u64.into(), 0),
        (3u64.into(), 2),
        (7u64.into(), 0),
        (9u64.into(), 0),
        ("tx-named".into(), 1),
    ];
    assert_eq!(store.len(), keys.len());
    for (id, p) in &keys {
        assert_eq!(
            store.kafka_state(id.clone(), *p),
            engine.kafka_state(id.clone(), *p),
            "{id:?}/{p}"
        );
    }
    for p in 0..3 {
        assert_eq!(
            store.aborted_transactions(p),
            engine.aborted_transactions(p)
        );
        assert_eq!(
            store.first_unstable_offset(p),
            engine.first_unstable_offset(p)
        );
    }
    // Spelled out: 7's transaction from 12 is open; tx-named's from 2 was
    // committed at the end; the abort of 8..11 is listed, that at 1 was
    // forgotten.
    assert_eq!(store.first_unstable_offset(0), Some(12));
    assert_eq!(store.first_unstable_offset(1), None);
    assert_eq!(
        store.aborted_transactions(0),
        vec![AbortedTxn {
            producer_id: 7u64.into(),
            first_offset: 8,
            last_offset: 11,
            last_stable_offset: 12,
        }]
    );
    assert!(store.aborted_transactions(1).is_empty());
    let named = store.kafka_state("tx-named", 1).unwrap();
    assert_eq!((named.epoch, named.coordinator_epoch), (3, 1));
    let report = store.recovery_report();
    assert_eq!(report.snapshot.as_ref().map(|s| s.position), Some(12));
    assert_eq!(report.clean_shutdown, Some(true));
    assert_eq!(report.torn_bytes_dropped(), 0);
}

/// The files say what docs/format.md says: Kafka flags in every header,
/// and the transaction records of the history, in order, as the library's
/// own reader (the inspector's) decodes them.
#[test]
fn the_committed_kafka_files_hold_the_documented_records() {
    let committed = committed();
    let mut kinds = Vec::new();
    for (name, bytes) in &committed {
        let path = Path::new(GOLDEN).join(name);
        if name.ends_with(".wal") {
            assert_eq!(&bytes[..8], b"PSTATWAL");
            assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 6, "version");
            assert_eq!(
                u16::from_le_bytes([bytes[10], bytes[11]]),
                2,
                "flag bit 1: Kafka"
            );
            let s = inspect::segment(
                &ReadOnlyFs(producer_state::fs::StdFs),
                &path,
                |_, at, op| {
                    let kind = bytes[at as usize + 16];
                    match op {
                        LogOp::KafkaBatch { transactional, .. } => {
                            kinds.push(format!("{kind} batch txn={transactional}"))
                        }
                        LogOp::TxnMarker { marker, .. } => kinds.push(format!(
                            "{kind} {:?} {}",
                            marker.kind, marker.coordinator_epoch
                        )),
                        LogOp::ForgetAborted { partition, offset } => {
                            kinds.push(format!("{kind} forget {partition} {offset}"))
                        }
                        _ => kinds.push(format!("{kind}")),
                    }
                },
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(s.semantics, Semantics::Kafka);
        } else {
            let s =
                inspect::decode_snapshot(&ReadOnlyFs(producer_state::fs::StdFs), &path).unwrap();
            assert_eq!(
                (s.semantics, s.position, s.entries),
                (Semantics::Kafka, 12, 2)
            );
        }
    }
    // Plain batches and single appends keep kinds 2 and 1, also for a
    // side-table key (9's replicated batches); the transaction records are
    // kinds 16 to 20.
    let mut expected: Vec<String> = [
        "2",
        "1",
        "16 batch txn=true",
        "17 batch txn=true",
        "2",
        "2",
        "18 Commit 3",
        "19 Abort 1",
        "16 batch txn=true",
        "18 Abort 3",
        "16 batch txn=true",
        "17 batch txn=true",
        "20 forget 1 2",
    ]
    .map(String::from)
    .to_vec();
    expected.extend(std::iter::repeat_n("2".to_string(), 30));
    expected.extend(["1".to_string(), "19 Commit 1".to_string()]);
    assert_eq!(kinds, expected);
}

/// The side table survives a snapshot taken from the committed store and a
/// reopen that replays nothing after it: the Kafka section carries it.
#[test]
fn a_snapshot_of_the_committed_store_keeps_its_kafka_state() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/copy");
    fs.create_dir_all(&dir).unwrap();
    for (name, bytes) in committed() {
        fs.overwrite(&dir.join(name), &bytes);
    }
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    let before: Vec<_> = [(7u64, 0), (9u64, 0)]
        .iter()
        .map(|&(id, p)| store.kafka_state(id, p))
        .collect();
    let aborted = store.aborted_transactions(0);
    store.snapshot().unwrap().unwrap();
    store.close().unwrap();
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    assert_eq!(store.recovery_report().records_replayed, 0);
    let after: Vec<_> = [(7u64, 0), (9u64, 0)]
        .iter()
        .map(|&(id, p)| store.kafka_state(id, p))
        .collect();
    assert_eq!(after, before);
    assert_eq!(store.aborted_transactions(0), aborted);
    // 7's transaction is still open: a plain batch is refused, the next
    // transactional one continues it.
    let plain = store
        .append_with(
            7u64,
            0,
            0,
            Batch::new(6, 6, 200, T0),
            AppendOptions::client(),
        )
        .unwrap();
    assert!(!plain.is_accepted(), "{plain:?}");
    let txn = AppendOptions::client().transactional().verified();
    let more = store.append_with(7u64, 0, 0, Batch::new(6, 6, 200, T0), txn);
    assert_eq!(more.unwrap(), BatchOutcome::Accepted);
    assert_eq!(store.first_unstable_offset(0), Some(12));
}
