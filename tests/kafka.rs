//! Kafka's producer snapshot format: the two test vectors from the notes, a
//! file written by Kafka's own ProducerStateManager (tests/fixtures/kafka),
//! committed golden files written by this crate, every truncation and bit
//! flip, seeding a store from Kafka's files and exporting back: under the
//! strict rules (one compact entry per producer) and losslessly under
//! `Semantics::Kafka`, byte for byte in Kafka's own entry order.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use producer_state::kafka::{self, KafkaProducerEntry};
use producer_state::{
    AppendOutcome, Batch, BatchMetadata, BatchOutcome, ProducerStateStore, Semantics, StoreOptions,
};

const FIXTURE: &str = "tests/fixtures/kafka/00000000000000000035.snapshot";

/// The fixture's expected contents, from its TSV.
fn expected() -> Vec<KafkaProducerEntry> {
    let text =
        std::fs::read_to_string("tests/fixtures/kafka/00000000000000000035.expected.tsv").unwrap();
    let mut v: Vec<KafkaProducerEntry> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<i64> = l.split('\t').map(|x| x.parse().unwrap()).collect();
            KafkaProducerEntry {
                producer_id: f[0],
                epoch: f[1] as i16,
                last_sequence: f[2] as i32,
                last_offset: f[3],
                offset_delta: f[4] as i32,
                timestamp: f[5],
                coordinator_epoch: f[6] as i32,
                current_txn_first_offset: f[7],
            }
        })
        .collect();
    v.sort();
    v
}

#[test]
fn kafkas_own_file_decodes_to_its_expected_entries_and_re_encodes_exactly() {
    let bytes = std::fs::read(FIXTURE).unwrap();
    assert_eq!(bytes.len(), 10 + 46 * 5);
    let decoded = kafka::decode(Path::new(FIXTURE), &bytes).unwrap();
    let mut sorted = decoded.clone();
    sorted.sort();
    assert_eq!(sorted, expected(), "as a set");
    // In Kafka's order, the encoder writes the very same bytes ...
    assert_eq!(kafka::encode(&decoded), bytes);
    // ... and in any other order the same entries (46-byte chunks).
    let other = kafka::encode(&sorted);
    let chunks = |b: &[u8]| {
        let mut c: Vec<Vec<u8>> = b[10..].chunks(46).map(<[u8]>::to_vec).collect();
        c.sort();
        c
    };
    assert_eq!(other[..2], bytes[..2]);
    assert_eq!(other[6..10], bytes[6..10]);
    assert_eq!(chunks(&other), chunks(&bytes));
}

#[test]
fn through_this_crates_state_and_back_nothing_changes() {
    let bytes = std::fs::read(FIXTURE).unwrap();
    let entries = kafka::decode(Path::new(FIXTURE), &bytes).unwrap();
    let back: Vec<KafkaProducerEntry> = entries
        .iter()
        .map(|k| {
            let (id, e) = kafka::to_entry(k).unwrap();
            assert_eq!(
                e.retained_batches().len(),
                1,
                "one retained batch per producer, as Kafka keeps"
            );
            kafka::from_entry(&id, &e).unwrap()
        })
        .collect();
    assert_eq!(back, entries);
    assert_eq!(kafka::encode(&back), bytes);
}

#[test]
fn every_truncation_and_bit_flip_of_kafkas_file_is_a_clear_error() {
    let bytes = std::fs::read(FIXTURE).unwrap();
    for cut in 0..bytes.len() {
        let e = kafka::decode(Path::new(FIXTURE), &bytes[..cut]).unwrap_err();
        assert!(e.is_corruption(), "cut {cut}: {e}");
        assert!(
            e.to_string().contains("00000000000000000035.snapshot"),
            "{e}"
        );
    }
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        let e = kafka::decode(Path::new(FIXTURE), &b).unwrap_err();
        assert!(e.is_corruption(), "bit {bit}: {e}");
    }
}

/// Committed files this crate wrote in Kafka's format (Kafka tooling reads
/// them; regenerate with GOLDEN_REGENERATE=1).
#[test]
fn golden_kafka_files() {
    let one = KafkaProducerEntry {
        producer_id: 1,
        epoch: 0,
        last_sequence: 1,
        last_offset: 1,
        offset_delta: 0,
        timestamp: 1000,
        coordinator_epoch: -1,
        current_txn_first_offset: -1,
    };
    let files: [(&str, Vec<u8>); 3] = [
        ("00000000000000000000.snapshot", kafka::encode(&[])),
        ("00000000000000000002.snapshot", kafka::encode(&[one])),
        ("00000000000000000035.snapshot", kafka::encode(&expected())),
    ];
    for (name, bytes) in &files {
        let path = PathBuf::from("tests/golden/kafka").join(name);
        if std::env::var("GOLDEN_REGENERATE").is_ok() {
            std::fs::write(&path, bytes).unwrap();
        }
        assert_eq!(&std::fs::read(&path).unwrap(), bytes, "{name}");
        kafka::decode(&path, bytes).unwrap();
    }
    // The notes' vector, byte for byte.
    assert_eq!(files[0].1, [0x00, 0x01, 0x48, 0x67, 0x4b, 0xc7, 0, 0, 0, 0]);
    assert_eq!(
        &files[1].1[..10],
        &[0x00, 0x01, 0xf9, 0xce, 0x37, 0x9c, 0, 0, 0, 1]
    );
}

#[test]
fn a_store_seeded_from_kafka_answers_retries_and_fences_zombies() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let report = kafka::seed_store(&store_dir, &[(PathBuf::from(FIXTURE), 3)]).unwrap();
    assert_eq!(report.imported, 5);
    assert!(report.skipped.is_empty());
    let s = ProducerStateStore::open(&store_dir).unwrap();
    assert_eq!(s.len(), 5);
    // Producer 1017, epoch 1: last batch 2..=4 at offsets 3..=5.
    assert_eq!(
        s.append_batch(1017u64, 3, 1, Batch::new(2, 4, 99, 0))
            .unwrap(),
        BatchOutcome::Duplicate {
            original: Some(BatchMetadata {
                offset: 3,
                timestamp: 1_700_000_000_003
            })
        }
    );
    assert_eq!(s.append(1017u64, 3, 1, 5).unwrap(), AppendOutcome::Accepted);
    assert_eq!(
        s.append(1017u64, 3, 0, 0).unwrap(),
        AppendOutcome::FencedEpoch
    );
    assert_eq!(
        s.append(1017u64, 2, 1, 5).unwrap(),
        AppendOutcome::OutOfOrder,
        "other partitions are unknown"
    );
    // Seeding refuses a directory that already holds a store.
    drop(s);
    assert!(matches!(
        kafka::seed_store(&store_dir, &[(PathBuf::from(FIXTURE), 3)]),
        Err(producer_state::Error::SeedTargetNotEmpty { .. })
    ));
}

#[test]
fn a_store_exports_a_kafka_snapshot_kafka_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = ProducerStateStore::open(dir.path().join("s")).unwrap();
    s.append_batch(7u64, 0, 2, Batch::new(0, 3, 100, 55))
        .unwrap();
    s.append_batch(7u64, 0, 2, Batch::new(4, 9, 104, 56))
        .unwrap();
    s.append(8u64, 0, 0, 0).unwrap(); // no offset: Kafka sees "no batch"
    s.append("named", 0, 0, 0).unwrap(); // Kafka ids are numbers
    s.append(9u64, 1, 0, 0).unwrap(); // another partition
    let out = dir.path().join(kafka::file_name(110));
    let (written, skipped) = kafka::export(s.iter(), 0, &out).unwrap();
    assert_eq!((written, skipped), (2, 1));
    let back = kafka::decode(&out, &std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        back,
        vec![
            KafkaProducerEntry {
                producer_id: 7,
                epoch: 2,
                last_sequence: 9,
                last_offset: 109,
                offset_delta: 5,
                timestamp: 56,
                coordinator_epoch: -1,
                current_txn_first_offset: -1
            },
            KafkaProducerEntry {
                producer_id: 8,
                epoch: 0,
                last_sequence: 0,
                last_offset: -1,
                offset_delta: 0,
                timestamp: -1,
                coordinator_epoch: -1,
                current_txn_first_offset: -1
            },
        ]
    );
}

/// A sparse Kafka snapshot: a header claiming `count` entries, then a hole
/// of zeros, with a CRC that verifies (so only its entries can tell).
fn sparse_kafka_file(path: &Path, count: u32) {
    let mut head = vec![0u8, 1, 0, 0, 0, 0];
    head.extend_from_slice(&count.to_be_bytes());
    let zeros = vec![0u8; 46 << 16];
    let mut crc = crc32c::crc32c(&head[6..]);
    let mut left = u64::from(count) * 46;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        crc = crc32c::crc32c_append(crc, &zeros[..n]);
        left -= n as u64;
    }
    head[2..6].copy_from_slice(&crc.to_be_bytes());
    let f = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut &f, &head).unwrap();
    f.set_len(10 + 46 * u64::from(count)).unwrap();
}

#[test]
fn a_sparse_kafka_file_is_corruption_at_its_second_entry_not_gigabytes_read() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(kafka::file_name(0));
    // 4.6 million entries claimed (200 MB), backed by 10 bytes.
    sparse_kafka_file(&src, 200_000_000 / 46);
    let store = dir.path().join("store");
    match kafka::seed_store(&store, &[(src.clone(), 0)]) {
        Err(producer_state::Error::Corrupt { file, offset, kind }) => {
            assert_eq!(file, src);
            assert_eq!(offset, 10 + 46, "the second entry");
            assert_eq!(kind, producer_state::Corruption::DuplicateKey);
        }
        other => panic!("{other:?}"),
    }
    // The reader says the same, whatever it is handed.
    let f = std::fs::File::open(&src).unwrap();
    let len = f.metadata().unwrap().len();
    let mut seen = 0u64;
    let e = kafka::read(&src, std::io::BufReader::new(f), len, |_| {
        seen += 1;
        Ok(())
    })
    .unwrap_err();
    assert!(e.is_corruption(), "{e}");
    assert_eq!(seen, 1);
}

#[test]
fn an_export_replaces_the_file_atomically_and_durably() {
    use producer_state::fs::{Fault, FileSystem, SimFs, Unsynced};
    let state = |n: u64| {
        let mut m = producer_state::ProducerStateManager::new();
        for id in 0..n {
            m.append_batch(id, 0, 1, Batch::new(0, 1, id as i64, 5));
        }
        m.iter().collect::<Vec<_>>()
    };
    let dir = Path::new("/k");
    let path = dir.join(kafka::file_name(7));
    let setup = || {
        let fs = SimFs::new();
        fs.create_dir_all(dir).unwrap();
        kafka::export_with(&fs, state(2), 0, &path).unwrap();
        fs
    };
    let old = setup().read_file(&path).unwrap();
    let fs = setup();
    let before = fs.ops();
    kafka::export_with(&fs, state(3), 0, &path).unwrap();
    let new = fs.read_file(&path).unwrap();
    assert_eq!(kafka::decode(&path, &new).unwrap().len(), 3);
    // What survives a crash after the export returned: the new file.
    assert_eq!(
        fs.crash_image(Unsynced::Drop).read_file(&path),
        Some(new.clone())
    );
    // A crash at any operation of the export leaves the old file or the
    // new one, whole.
    let ops = fs.ops() - before;
    assert!(ops >= 4, "write, fsync, rename, fsync directory: {ops}");
    for n in 0..ops {
        let fs = setup();
        fs.set_fault(fs.ops() + n, Fault::Crash);
        assert!(kafka::export_with(&fs, state(3), 0, &path).is_err());
        for mode in [Unsynced::Drop, Unsynced::Keep] {
            let got = fs.crash_image(mode).read_file(&path);
            assert!(
                got.as_ref() == Some(&old) || got.as_ref() == Some(&new),
                "op {n} {mode:?}: {got:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------
// Kafka's entry order, and Kafka-mode seeding and export (lossless).

const SMALL: &str = "tests/fixtures/kafka/small/00000000000000000041.snapshot";

fn entry(producer_id: i64) -> KafkaProducerEntry {
    KafkaProducerEntry {
        producer_id,
        epoch: 0,
        last_sequence: 0,
        last_offset: 0,
        offset_delta: 0,
        timestamp: 0,
        coordinator_epoch: -1,
        current_txn_first_offset: -1,
    }
}

/// Iteration orders `java.util.HashMap<Long, _>` itself produced
/// (tests/fixtures/kafka/hashmap-order.txt): small and crowded tables,
/// growth at 0.75, ids above 2^32, ids whose halves cancel in the hash.
#[test]
fn entries_come_in_javas_hashmap_order() {
    let text = std::fs::read_to_string("tests/fixtures/kafka/hashmap-order.txt").unwrap();
    let mut cases = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (ids, java) = line.split_once('\t').unwrap();
        let parse =
            |s: &str| -> Vec<i64> { s.split_whitespace().map(|x| x.parse().unwrap()).collect() };
        let (ids, java) = (parse(ids), parse(java));
        // Given in any order (here reversed, then rotated), the entries
        // come out in Java's.
        let mut v: Vec<_> = ids.iter().rev().map(|&id| entry(id)).collect();
        v.rotate_left(ids.len() / 3);
        kafka::sort_in_kafka_order(&mut v);
        let got: Vec<i64> = v.iter().map(|e| e.producer_id).collect();
        assert_eq!(got, java, "{} ids", ids.len());
        cases += 1;
    }
    assert_eq!(cases, 36);
}

/// Both files Kafka wrote come back byte for byte from their entries in
/// any order.
#[test]
fn kafkas_files_are_reencoded_in_kafkas_own_order() {
    for path in [FIXTURE, SMALL] {
        let bytes = std::fs::read(path).unwrap();
        let mut entries = kafka::decode(Path::new(path), &bytes).unwrap();
        entries.sort_by_key(|e| std::cmp::Reverse(e.producer_id));
        kafka::sort_in_kafka_order(&mut entries);
        assert_eq!(kafka::encode(&entries), bytes, "{path}");
    }
}

fn kafka_opts() -> StoreOptions {
    StoreOptions::default()
        .semantics(Semantics::Kafka)
        .background_snapshots(false)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
}

fn export_bytes(store: &ProducerStateStore, partition: i32, dir: &Path) -> Vec<u8> {
    let out = dir.join("export.snapshot");
    kafka::export_store(store, partition, &out).unwrap();
    std::fs::read(out).unwrap()
}

#[test]
fn kafkas_files_round_trip_byte_for_byte_through_a_kafka_mode_store() {
    for (path, n) in [(SMALL, 6), (FIXTURE, 5)] {
        let dir = tempfile::tempdir().unwrap();
        let store_dir = dir.path().join("store");
        let report = kafka::seed_kafka_store(&store_dir, &[(PathBuf::from(path), 2)]).unwrap();
        assert_eq!((report.imported, report.skipped.len()), (n, 0));
        let bytes = std::fs::read(path).unwrap();
        let store = ProducerStateStore::open_with(&store_dir, kafka_opts()).unwrap();
        assert_eq!(store.len(), n as usize);
        assert_eq!(export_bytes(&store, 2, dir.path()), bytes, "{path}");
        // Another partition holds nothing; the store's own snapshot and a
        // reopen keep every field.
        assert_eq!(export_bytes(&store, 0, dir.path()).len(), 10);
        store.snapshot().unwrap();
        store.close().unwrap();
        let store = ProducerStateStore::open_with(&store_dir, kafka_opts()).unwrap();
        assert_eq!(
            export_bytes(&store, 2, dir.path()),
            bytes,
            "{path} reopened"
        );
    }
}

#[test]
fn a_kafka_mode_seed_keeps_transactions_coordinator_epochs_and_marker_only_producers() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    kafka::seed_kafka_store(&store_dir, &[(PathBuf::from(SMALL), 0)]).unwrap();
    let store = ProducerStateStore::open_with(&store_dir, kafka_opts()).unwrap();
    let s = |pid: u64| store.kafka_state(pid, 0).unwrap();
    // 1000: committed by coordinator epoch 7; the timestamp is the marker's.
    let k = s(1000);
    assert_eq!((k.epoch, k.coordinator_epoch), (3, 7));
    assert_eq!(
        (k.last_timestamp, k.current_txn_first_offset),
        (1_700_000_001_500, None)
    );
    assert_eq!(k.batches.len(), 1);
    assert_eq!(k.batches[0].metadata.unwrap().offset, 13);
    // 1001: an open transaction from offset 17, coordinator epoch 2.
    let k = s(1001);
    assert_eq!(
        (k.coordinator_epoch, k.current_txn_first_offset),
        (2, Some(17))
    );
    // 1002: known from its ABORT marker only.
    let k = s(1002);
    assert_eq!((k.epoch, k.last_sequence, k.coordinator_epoch), (1, -1, 4));
    assert!(k.batches.is_empty());
    // 1003: an open transaction from offset 31, no coordinator yet.
    let k = s(1003);
    assert_eq!(
        (k.coordinator_epoch, k.current_txn_first_offset),
        (-1, Some(31))
    );
    // The oldest open transaction bounds the last stable offset; Kafka's
    // snapshots hold no aborted transactions (its .txnindex does).
    assert_eq!(store.first_unstable_offset(0), Some(17));
    assert_eq!(store.last_stable_offset(0, 41), 17);
    assert!(store.aborted_transactions(0).is_empty());
    drop(store);
    // The directory is a Kafka-mode store: the strict rules refuse it.
    let err = ProducerStateStore::open(&store_dir).unwrap_err();
    assert!(
        matches!(err, producer_state::Error::SemanticsMismatch { .. }),
        "{err}"
    );
}

/// After the seed, the stream of small/commands.txt goes on as Kafka goes
/// on after reloading that file: the verdicts of an engine that loaded it
/// as Kafka's `truncateAndReload` does (which tests/kafka_oracle.rs holds
/// to Kafka's own verdicts after a reload), for retries, a fenced
/// coordinator, markers, new transactions, across a reopen.
#[test]
fn a_seeded_kafka_store_continues_the_stream_as_kafka_would() {
    use producer_state::{AppendOptions, Marker, Origin, ProducerStateManager};
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    kafka::seed_kafka_store(&store_dir, &[(PathBuf::from(SMALL), 0)]).unwrap();
    let mut store = Some(ProducerStateStore::open_with(&store_dir, kafka_opts()).unwrap());
    let bytes = std::fs::read(SMALL).unwrap();
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let entries = kafka::decode(Path::new(SMALL), &bytes).unwrap();
    assert!(mgr.load_kafka_snapshot(0, &entries).unwrap().is_empty());

    enum Op {
        Data(u64, i16, i32, i32, bool),
        Marker(u64, i16, bool, i32),
        Reopen,
    }
    use Op::*;
    let c = AppendOptions::client();
    let t = c.transactional().verified();
    let ops = [
        Data(0, 0, 6, 9, false),      // retry of the one cached batch: duplicate
        Data(0, 0, 5, 5, false),      // older than the window after a reload
        Data(0, 0, 10, 10, false),    // next
        Marker(1001, 1, true, 1),     // coordinator epoch 1 < 2: fenced
        Data(1003, 0, 10, 10, false), // non-transactional inside a transaction
        Marker(1001, 1, true, 2),     // commits 17..
        Reopen,
        Data(1003, 0, 10, 12, true),
        Marker(1003, 0, false, 0),                       // aborts 31..
        Data(1002, 1, 0, 1, false),                      // after its abort's epoch bump: from 0
        Data(1002, 0, 2, 2, false),                      // zombie epoch
        Data(1000, 3, 4, 4, true),                       // a new transaction
        Data(9_007_199_254_740_993, 32766, 4, 4, false), // overlaps 0..4
        Data(9_007_199_254_740_993, 32766, 5, 5, false),
        Reopen,
        Marker(1000, 3, true, 6), // fenced: 7 on file
        Marker(1000, 3, false, 7),
    ];
    let mut offset = 41i64;
    let mut verdicts = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let ts = 1_700_000_010_000 + i as i64;
        let s = store.as_ref().unwrap();
        let (ours, theirs) = match *op {
            Data(pid, epoch, first, last, txn) => {
                let batch = Batch::new(first, last, offset, ts);
                let o = if txn { t } else { c };
                let a = s.append_with(pid, 0, epoch, batch, o).unwrap();
                let b = mgr.append_with(pid, 0, epoch, batch, o).unwrap();
                if a.is_accepted() {
                    offset += i64::from(last - first) + 1;
                }
                (format!("{a:?}"), format!("{b:?}"))
            }
            Marker(pid, epoch, commit, coordinator) => {
                let m = if commit {
                    Marker::commit(coordinator, offset, ts)
                } else {
                    Marker::abort(coordinator, offset, ts)
                };
                let a = s
                    .append_marker(pid, 0, epoch, m, Origin::Coordinator)
                    .unwrap();
                let b = mgr
                    .append_marker(pid, 0, epoch, m, Origin::Coordinator)
                    .unwrap();
                if a.is_accepted() {
                    offset += 1;
                }
                (format!("{a:?}"), format!("{b:?}"))
            }
            Reopen => {
                store.take().unwrap().close().unwrap();
                store = Some(ProducerStateStore::open_with(&store_dir, kafka_opts()).unwrap());
                verdicts.push("reopened".to_string());
                continue;
            }
        };
        assert_eq!(ours, theirs, "op {i}");
        verdicts.push(ours);
    }
    // What Kafka answers there (the oracle's verdicts for the same cases
    // in edge-cases.in): spelled out for the ones that matter most.
    assert!(verdicts[0].starts_with("Duplicate"), "{}", verdicts[0]);
    assert!(verdicts[1].starts_with("OutOfOrder"), "{}", verdicts[1]);
    assert_eq!(verdicts[2], "Accepted");
    assert!(
        verdicts[3].starts_with("CoordinatorFenced"),
        "{}",
        verdicts[3]
    );
    assert!(
        verdicts[4].starts_with("InvalidTxnState"),
        "{}",
        verdicts[4]
    );
    assert!(verdicts[5].contains("first_offset: 17"), "{}", verdicts[5]);
    assert!(verdicts[8].contains("first_offset: 31"), "{}", verdicts[8]);
    assert_eq!(verdicts[9], "Accepted");
    assert!(verdicts[10].starts_with("FencedEpoch"), "{}", verdicts[10]);
    assert!(verdicts[12].starts_with("OutOfOrder"), "{}", verdicts[12]);
    assert!(
        verdicts[15].starts_with("CoordinatorFenced"),
        "{}",
        verdicts[15]
    );
    let s = store.as_ref().unwrap();
    assert_eq!(s.aborted_transactions(0), mgr.aborted_transactions(0));
    assert_eq!(s.aborted_transactions(0).len(), 2, "1003's, then 1000's");
    assert_eq!(s.first_unstable_offset(0), mgr.first_unstable_offset(0));
    // And the export is the engine's state, in Kafka's order.
    let mut theirs = mgr.kafka_snapshot_entries(0).unwrap();
    kafka::sort_in_kafka_order(&mut theirs);
    assert_eq!(export_bytes(s, 0, dir.path()), kafka::encode(&theirs));
}

#[test]
fn a_kafka_mode_seed_skips_negative_ids_and_refuses_a_producer_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut neg = entry(-1);
    neg.last_offset = 3;
    let file = dir.path().join("neg.snapshot");
    std::fs::write(&file, kafka::encode(&[entry(5), neg])).unwrap();
    let report = kafka::seed_kafka_store(
        &dir.path().join("a"),
        &[(file.clone(), 0), (PathBuf::from(SMALL), 1)],
    )
    .unwrap();
    assert_eq!(report.imported, 7);
    assert_eq!(report.skipped.len(), 1);
    let skipped = &report.skipped[0];
    assert_eq!((&skipped.file, skipped.producer_id), (&file, -1));
    assert_eq!(skipped.reason, kafka::Unrepresentable::NegativeProducerId);
    let twice = kafka::seed_kafka_store(
        &dir.path().join("b"),
        &[(PathBuf::from(SMALL), 1), (PathBuf::from(SMALL), 1)],
    );
    assert!(
        matches!(
            twice,
            Err(producer_state::Error::SeedDuplicateProducer { partition: 1, .. })
        ),
        "{twice:?}"
    );
    // A directory that holds a store is refused.
    let again = kafka::seed_kafka_store(&dir.path().join("a"), &[]);
    assert!(
        matches!(&again, Err(producer_state::Error::SeedTargetNotEmpty { path }) if *path == dir.path().join("a")),
        "{again:?}"
    );
}

#[test]
fn a_crash_at_every_operation_of_a_kafka_mode_seed_leaves_no_store_or_the_whole_one() {
    use producer_state::fs::{Fault, FileSystem, SimFs, Unsynced};
    let bytes = std::fs::read(SMALL).unwrap();
    let (src, dir) = (Path::new("/kafka/0.snapshot"), Path::new("/store"));
    let setup = || {
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/kafka")).unwrap();
        let mut f = fs.create_new(src).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(Path::new("/kafka")).unwrap();
        fs.create_dir_all(dir).unwrap();
        fs
    };
    let fs = setup();
    let before = fs.ops();
    kafka::seed_kafka_store_with(&fs, dir, &[(src.to_path_buf(), 0)]).unwrap();
    let ops = fs.ops() - before;
    let open = |fs: &SimFs| {
        ProducerStateStore::open_with(dir, kafka_opts().file_system(Arc::new(fs.clone())))
    };
    let exported = |fs: &SimFs, s: &ProducerStateStore| {
        let out = Path::new("/kafka/out.snapshot");
        kafka::export_store_with(fs, s, 0, out).unwrap();
        fs.read_file(out).unwrap()
    };
    let whole = open(&fs.crash_image(Unsynced::Drop)).unwrap();
    assert_eq!(exported(&fs, &whole), bytes);
    let mut empty = 0;
    for n in 0..ops {
        let fs = setup();
        fs.set_fault(fs.ops() + n, Fault::Crash);
        assert!(kafka::seed_kafka_store_with(&fs, dir, &[(src.to_path_buf(), 0)]).is_err());
        for mode in [Unsynced::Drop, Unsynced::Keep] {
            let image = fs.crash_image(mode);
            let s = open(&image).unwrap();
            if s.is_empty() {
                empty += 1;
            } else {
                assert_eq!(exported(&image, &s), bytes, "op {n} {mode:?}");
            }
        }
    }
    assert!(empty > 0);
}

/// One Kafka entry as Kafka's broker can write it: a batch (any sequences,
/// possibly wrapping, any offset delta) or none (marker-only: last
/// sequence and last offset -1, delta 0), with or without a coordinator
/// epoch and an open transaction.
fn kafka_entry() -> impl proptest::strategy::Strategy<Value = KafkaProducerEntry> {
    use proptest::prelude::*;
    let id = prop_oneof![0i64..64, 0i64..100_000, 0i64..i64::MAX];
    let batch = prop_oneof![
        3 => (0i32..i32::MAX, 0i32..20, 0i64..1 << 40).prop_map(|(last, delta, off)| (last, off.max(i64::from(delta)), delta)),
        1 => Just((-1, -1, 0)),
    ];
    (
        id,
        -1i16..i16::MAX,
        batch,
        -1i64..1 << 42,
        prop_oneof![Just(-1), 0i32..100],
        prop_oneof![Just(-1), 0i64..1 << 40],
    )
        .prop_map(
            |(
                producer_id,
                epoch,
                (last_sequence, last_offset, offset_delta),
                timestamp,
                coordinator_epoch,
                txn,
            )| {
                KafkaProducerEntry {
                    producer_id,
                    epoch,
                    last_sequence,
                    last_offset,
                    offset_delta,
                    timestamp,
                    coordinator_epoch,
                    current_txn_first_offset: txn,
                }
            },
        )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Any file Kafka can write comes back byte for byte through a seeded
    /// Kafka-mode store (the reference: the file itself).
    #[test]
    fn any_kafka_file_round_trips_through_a_kafka_mode_store(
        entries in proptest::collection::vec(kafka_entry(), 0..40)
    ) {
        use producer_state::fs::{FileSystem, SimFs};
        let mut seen = std::collections::HashSet::new();
        let mut entries: Vec<_> = entries.into_iter().filter(|e| seen.insert(e.producer_id)).collect();
        kafka::sort_in_kafka_order(&mut entries);
        let bytes = kafka::encode(&entries);
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/k")).unwrap();
        let src = Path::new("/k/00000000000000000100.snapshot");
        fs.overwrite(src, &bytes);
        let report = kafka::seed_kafka_store_with(&fs, Path::new("/s"), &[(src.to_path_buf(), 4)]).unwrap();
        proptest::prop_assert_eq!(report.imported as usize, entries.len());
        let opts = kafka_opts().file_system(Arc::new(fs.clone()));
        let store = ProducerStateStore::open_with("/s", opts).unwrap();
        let out = Path::new("/k/out.snapshot");
        let (written, skipped) = kafka::export_store_with(&fs, &store, 4, out).unwrap();
        proptest::prop_assert_eq!((written, skipped), (entries.len(), 0));
        let back = fs.read_file(out).unwrap();
        if back != bytes {
            let got = kafka::decode(out, &back).unwrap();
            proptest::prop_assert_eq!(got, entries);
        }
    }
}

#[test]
fn kafka_mode_seed_and_export_edge_cases_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    // A Kafka file of no producers seeds an empty Kafka-mode store, which
    // exports a file of no producers.
    let empty = dir.path().join("empty.snapshot");
    std::fs::write(&empty, kafka::encode(&[])).unwrap();
    let report = kafka::seed_kafka_store(&dir.path().join("e"), &[(empty.clone(), 0)]).unwrap();
    assert_eq!((report.imported, report.skipped.len()), (0, 0));
    let s = ProducerStateStore::open_with(dir.path().join("e"), kafka_opts()).unwrap();
    assert!(s.kafka_producers(0).is_empty());
    let out = dir.path().join("out.snapshot");
    assert_eq!(kafka::export_store(&s, 0, &out).unwrap(), (0, 0));
    assert_eq!(std::fs::read(&out).unwrap(), kafka::encode(&[]));
    drop(s);
    // A file of no bytes is corruption, and no store is left behind.
    let nothing = dir.path().join("nothing.snapshot");
    std::fs::write(&nothing, b"").unwrap();
    let target = dir.path().join("z");
    let err = kafka::seed_kafka_store(&target, &[(nothing, 0)]).unwrap_err();
    assert!(
        matches!(err, producer_state::Error::Corrupt { .. }),
        "{err:?}"
    );
    // One producer twice in one file (Kafka writes a map, never this):
    // corruption at the second entry; the directory holds no store, so a
    // good seed into it goes through.
    let twice = dir.path().join("twice.snapshot");
    std::fs::write(&twice, kafka::encode(&[entry(5), entry(5)])).unwrap();
    let err = kafka::seed_kafka_store(&target, &[(twice, 0)]).unwrap_err();
    assert!(
        matches!(
            err,
            producer_state::Error::Corrupt {
                kind: producer_state::Corruption::DuplicateKey,
                ..
            }
        ),
        "{err:?}"
    );
    // A negative id alone: skipped, reported, and the store is empty.
    let neg = dir.path().join("neg.snapshot");
    std::fs::write(&neg, kafka::encode(&[entry(-7)])).unwrap();
    let report = kafka::seed_kafka_store(&target, &[(neg.clone(), 0)]).unwrap();
    assert_eq!(report.imported, 0);
    assert_eq!(report.skipped.len(), 1);
    let skipped = &report.skipped[0];
    assert_eq!((&skipped.file, skipped.producer_id), (&neg, -7));
    assert_eq!(skipped.reason, kafka::Unrepresentable::NegativeProducerId);
    let s = ProducerStateStore::open_with(&target, kafka_opts()).unwrap();
    assert!(s.kafka_producers(0).is_empty());
    drop(s);
    // A Kafka-mode store with ids Kafka cannot hold (a name, a number
    // above i64::MAX): the export writes the others and counts these.
    let s = ProducerStateStore::open_with(dir.path().join("n"), kafka_opts()).unwrap();
    for id in [
        producer_state::ProducerId::named("n"),
        producer_state::ProducerId::numeric(u64::MAX),
        producer_state::ProducerId::numeric(9),
    ] {
        let b = Batch::new(0, 0, 0, 0);
        assert!(s.append_batch(id, 0, 0, b).unwrap().is_accepted());
    }
    assert_eq!(kafka::export_store(&s, 0, &out).unwrap(), (1, 2));
    let back = kafka::decode(&out, &std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(back.iter().map(|e| e.producer_id).collect::<Vec<_>>(), [9]);
}

/// The iteration order of a `java.util.HashMap<Long, _>` after `put` of
/// `ids` in this order, from empty, with list buckets only (the test keeps
/// every bucket under nine entries, so Java never builds a tree): the
/// order Kafka writes a snapshot in when its producers first appeared in
/// that order. Resizes split each bucket keeping its relative order, as
/// `HashMap.resize` does.
fn java_order(ids: &[i64]) -> Vec<i64> {
    let spread = |v: i64| {
        let v = v as u64;
        let h = (v ^ (v >> 32)) as u32;
        (h ^ (h >> 16)) as usize
    };
    let mut buckets: Vec<Vec<i64>> = vec![Vec::new(); 16];
    let mut size = 0;
    for &id in ids {
        let cap = buckets.len();
        let b = &mut buckets[spread(id) & (cap - 1)];
        let crowded = b.len() >= 8;
        b.push(id);
        size += 1;
        assert!(!(crowded && cap >= 64), "a tree bin: not modelled here");
        if size > cap / 4 * 3 || crowded {
            let mut next = vec![Vec::new(); cap * 2];
            for id in buckets.into_iter().flatten() {
                next[spread(id) & (cap * 2 - 1)].push(id);
            }
            buckets = next;
        }
    }
    buckets.into_iter().flatten().collect()
}

/// Kafka's check of a file: version 1, and the CRC-32C at bytes 2..6 over
/// bytes 6 to the end (`ProducerStateManager.readSnapshot`, trunk
/// 1eb7644349cb, lines 625-638).
fn kafka_accepts(bytes: &[u8]) -> bool {
    bytes.len() >= 10
        && bytes[..2] == [0, 1]
        && u32::from_be_bytes(bytes[2..6].try_into().unwrap()) == crc32c::crc32c(&bytes[6..])
}

/// The 46-byte entries of a file, sorted: a file's content as a set.
fn entry_bytes(bytes: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = bytes[10..].chunks(46).collect();
    assert!(v.iter().all(|c| c.len() == 46));
    v.sort_unstable();
    v
}

/// The export question (docs/format.md, "Kafka's snapshot format"): an
/// export is in Kafka's order for a map filled in ascending producer id
/// order. Where Kafka's map had another history its file differs from the
/// export, and only so: the same 46-byte entries in another order, so
/// another CRC. Kafka reads both to the same producers:
/// `ProducerStateManager.readSnapshot` (trunk 1eb7644349cb, lines
/// 619-658) checks the CRC over bytes 6 to the end, then decodes each
/// entry on its own into a list; `loadFromSnapshot` (297-305) hands each
/// to `loadProducerEntry` (324-328), which puts it into `producers` by
/// its producer id and its open transaction into `ongoingTxns` by its
/// first offset. Both are maps keyed by what each entry carries, so with
/// unique producer ids the order cannot change what is loaded.
///
/// Shown here on a 1,000-producer history whose ids first appeared out of
/// order (the order Kafka's map would write comes from `java_order`), and
/// on Kafka's own `small` file written in reverse.
#[test]
fn an_export_in_another_order_than_kafkas_holds_the_same_entries_and_kafka_accepts_both() {
    // 1,000 ids in two ranges, first seen in a shuffled order.
    let mut ids: Vec<i64> = (0..500).map(|i| 1_000 + 3 * i).collect();
    ids.extend((0..500).map(|i| (1i64 << 40) + 7 * i));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..ids.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let entries = |order: &[i64]| -> Vec<KafkaProducerEntry> {
        order
            .iter()
            .map(|&id| KafkaProducerEntry {
                last_sequence: (id % 97) as i32,
                last_offset: id % 10_007,
                timestamp: 1_700_000_000_000 + id % 1_000,
                ..entry(id)
            })
            .collect()
    };
    let kafkas = kafka::encode(&entries(&java_order(&ids)));
    let mut ours = entries(&ids);
    kafka::sort_in_kafka_order(&mut ours);
    let ours = kafka::encode(&ours);
    // The model of Java's map agrees with the crate where the crate's
    // assumption holds (ascending insertion).
    let mut ascending = ids.clone();
    ascending.sort_unstable();
    assert_eq!(
        kafka::encode(&entries(&java_order(&ascending))),
        ours,
        "an ascending history gives the export's bytes"
    );

    let moved = kafkas[10..]
        .chunks(46)
        .zip(ours[10..].chunks(46))
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        moved > 0,
        "the histories must differ for the test to say anything"
    );
    for (name, bytes) in [("Kafka's", &kafkas), ("the export", &ours)] {
        assert!(kafka_accepts(bytes), "{name} file fails Kafka's check");
        let mut read = kafka::decode(Path::new(name), bytes).unwrap();
        read.sort_by_key(|e| e.producer_id);
        let mut want = entries(&ascending);
        want.sort_by_key(|e| e.producer_id);
        assert_eq!(read, want, "{name} file: the same producers");
    }
    assert_ne!(kafkas, ours);
    assert_eq!(kafkas.len(), ours.len());
    assert_eq!(kafkas[..2], ours[..2], "version");
    assert_eq!(kafkas[6..10], ours[6..10], "count");
    assert_eq!(
        entry_bytes(&kafkas),
        entry_bytes(&ours),
        "the same entries, byte for byte"
    );

    // Kafka's own file, its entries written in reverse: Kafka accepts it and
    // it holds the very bytes of Kafka's entries.
    let bytes = std::fs::read(SMALL).unwrap();
    let mut reversed = kafka::decode(Path::new(SMALL), &bytes).unwrap();
    reversed.reverse();
    let reversed = kafka::encode(&reversed);
    assert_ne!(reversed, bytes);
    assert!(kafka_accepts(&bytes) && kafka_accepts(&reversed));
    assert_eq!(entry_bytes(&reversed), entry_bytes(&bytes));
}
