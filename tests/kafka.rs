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
