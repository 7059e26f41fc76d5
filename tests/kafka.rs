//! Kafka's producer snapshot format: the two test vectors from the notes, a
//! file written by Kafka's own ProducerStateManager (tests/fixtures/kafka),
//! committed golden files written by this crate, every truncation and bit
//! flip, seeding a store from Kafka's files and exporting back.

use std::path::{Path, PathBuf};

use producer_state::kafka::{self, KafkaProducerEntry};
use producer_state::{AppendOutcome, Batch, BatchMetadata, BatchOutcome, ProducerStateStore};

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
    assert!(kafka::seed_store(&store_dir, &[(PathBuf::from(FIXTURE), 3)]).is_err());
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
