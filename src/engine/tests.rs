use super::*;
use crate::outcome::AppendOutcome::*;
use crate::{BatchMetadata, OutOfOrderReason};
use std::path::Path;

#[test]
fn the_task_example() {
    let mut mgr = ProducerStateManager::new();
    let got: Vec<_> = [(0, 0), (0, 1), (0, 1), (0, 5), (1, 0), (0, 2)]
        .into_iter()
        .map(|(epoch, seq)| mgr.append("p1", 0, epoch, seq))
        .collect();
    assert_eq!(
        got,
        [
            Accepted,
            Accepted,
            Duplicate,
            OutOfOrder,
            Accepted,
            FencedEpoch
        ]
    );
    let e = mgr.get("p1", 0).unwrap();
    assert_eq!((e.epoch(), e.last_sequence()), (1, 0));
}

#[test]
fn only_accepted_changes_state() {
    let mut mgr = ProducerStateManager::new();
    mgr.append(1u64, 0, 2, 0);
    mgr.append(1u64, 0, 2, 1);
    let before = mgr.get(1u64, 0);
    for (epoch, seq) in [
        (2, 1),
        (2, 0),
        (2, 9),
        (1, 2),
        (3, 4),
        (2, -1),
        (i16::MIN, 0),
    ] {
        assert_ne!(mgr.append(1u64, 0, epoch, seq), Accepted);
        assert_eq!(mgr.get(1u64, 0), before, "after ({epoch}, {seq})");
    }
    assert_eq!(mgr.append(1u64, 7, 0, 3), OutOfOrder);
    assert_eq!(mgr.get(1u64, 7), None);
    assert_eq!(mgr.len(), 1);
}

#[test]
fn a_rejected_new_epoch_leaves_the_old_epoch_usable() {
    let mut mgr = ProducerStateManager::new();
    mgr.append("p", 0, 0, 0);
    assert_eq!(mgr.append("p", 0, 1, 3), OutOfOrder);
    assert_eq!(mgr.get("p", 0).unwrap().epoch(), 0);
    assert_eq!(mgr.append("p", 0, 0, 1), Accepted);
    assert_eq!(mgr.append("p", 0, 1, 0), Accepted);
    assert_eq!(mgr.append("p", 0, 0, 2), FencedEpoch);
}

#[test]
fn keys_are_independent() {
    let mut mgr = ProducerStateManager::new();
    assert_eq!(mgr.append("a", 0, 5, 0), Accepted);
    assert_eq!(mgr.append("a", 1, 0, 0), Accepted);
    assert_eq!(mgr.append("b", 0, 0, 0), Accepted);
    assert_eq!(mgr.append("a", 1, 0, 1), Accepted);
    assert_eq!(mgr.append("a", 0, 5, 1), Accepted);
    assert_eq!(mgr.append("b", 0, 1, 0), Accepted);
    assert_eq!(mgr.append("a", 0, 4, 0), FencedEpoch);
    assert_eq!(mgr.len(), 3);
}

#[test]
fn the_retry_window_answers_the_last_five_batches() {
    let mut mgr = ProducerStateManager::new();
    let batches: Vec<Batch> = (0..7)
        .map(|i| {
            Batch::new(
                i * 3,
                i * 3 + 2,
                100 + i64::from(i) * 10,
                5000 + i64::from(i),
            )
        })
        .collect();
    for b in &batches {
        assert_eq!(mgr.append_batch(9u64, 0, 0, *b), BatchOutcome::Accepted);
    }
    for b in &batches[2..] {
        assert_eq!(
            mgr.append_batch(9u64, 0, 0, *b),
            BatchOutcome::Duplicate {
                original: Some(BatchMetadata {
                    offset: b.offset,
                    timestamp: b.timestamp
                })
            }
        );
    }
    // Older than the window: a multi-record retry is rejected, a
    // single-sequence retry is still a duplicate (rule 4).
    assert_eq!(
        mgr.append_batch(9u64, 0, 0, batches[1]),
        BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::OverlapsAccepted { last_accepted: 20 }
        }
    );
    assert_eq!(mgr.append(9u64, 0, 0, 4), Duplicate);
    assert_eq!(
        mgr.append_batch(9u64, 0, 0, Batch::new(4, 4, 0, 0)),
        BatchOutcome::Duplicate { original: None }
    );
    let e = mgr.get(9u64, 0).unwrap();
    let kept: Vec<_> = e.retained_batches().map(|b| b.first_sequence).collect();
    assert_eq!(kept, [6, 9, 12, 15, 18]);
}

#[test]
fn sequences_wrap_and_the_window_recognises_retries_across_the_wrap() {
    let mut mgr = ProducerStateManager::new();
    mgr.append_batch(1u64, 0, 0, Batch::new(0, i32::MAX - 1, 0, 0));
    let at_max = Batch::new(i32::MAX, i32::MAX, 7, 8);
    assert_eq!(mgr.append_batch(1u64, 0, 0, at_max), BatchOutcome::Accepted);
    assert_eq!(
        mgr.append_batch(1u64, 0, 0, Batch::new(0, 0, 9, 9)),
        BatchOutcome::Accepted
    );
    assert_eq!(
        mgr.append_batch(1u64, 0, 0, at_max),
        BatchOutcome::Duplicate {
            original: Some(at_max.metadata())
        }
    );
    assert_eq!(mgr.append(1u64, 0, 0, 1), Accepted);
    // Without a window, plain comparison applies: MAX is "higher" than 1.
    let mut plain = ProducerStateManager::new();
    plain.append(2u64, 0, 0, 0);
    assert_eq!(plain.append(2u64, 0, 0, i32::MAX), OutOfOrder);
}

#[test]
fn the_epoch_limit() {
    let mut mgr = ProducerStateManager::new();
    assert_eq!(mgr.append(1u64, 0, i16::MAX, 0), Accepted);
    assert_eq!(mgr.append(1u64, 0, i16::MAX, 1), Accepted);
    // Nothing is above MAX: the session can only continue, and every
    // lower epoch is fenced; a new session needs a new producer id.
    assert_eq!(mgr.append(1u64, 0, i16::MAX - 1, 0), FencedEpoch);
    assert_eq!(mgr.append(1u64, 0, i16::MIN, 0), FencedEpoch);
    assert_eq!(mgr.append(1u64, 0, i16::MAX, 0), Duplicate);
    // Negative epochs are ordinary, signed, as in Kafka.
    assert_eq!(mgr.append(2u64, 0, -1, 0), Accepted);
    assert_eq!(mgr.append(2u64, 0, 0, 0), Accepted);
    assert_eq!(mgr.append(2u64, 0, -1, 1), FencedEpoch);
}

fn sorted(m: &ProducerStateManager) -> Vec<(String, i32, ProducerEntry)> {
    let mut v: Vec<_> = m
        .iter()
        .map(|(id, p, e)| (format!("{id:?}"), p, e))
        .collect();
    v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    v
}

fn varied() -> ProducerStateManager {
    let mut m = ProducerStateManager::new();
    for pid in 0..40u64 {
        m.append(pid, (pid % 3) as i32, 1, 0);
    }
    for i in 0..9 {
        m.append_batch(
            "named",
            -4,
            2,
            Batch::new(i * 2, i * 2 + 1, i64::from(i), 9),
        );
    }
    m.append("y".repeat(300), i32::MAX, i16::MIN, 0);
    m
}

#[test]
fn a_snapshot_in_memory_round_trips_the_whole_state() {
    let m = varied();
    let (position, back) =
        ProducerStateManager::decode_snapshot("mem", &m.encode_snapshot(u64::MAX).unwrap())
            .unwrap();
    assert_eq!(position, u64::MAX);
    assert_eq!(sorted(&back), sorted(&m));
    // The copy is an engine like the original: it answers a retry of a
    // retained batch with the original metadata, and goes on accepting.
    let mut back = back;
    assert_eq!(
        back.append_batch("named", -4, 2, Batch::new(16, 17, 8, 9)),
        BatchOutcome::Duplicate {
            original: Some(BatchMetadata {
                offset: 8,
                timestamp: 9
            })
        }
    );
    assert_eq!(back.append(39u64, 0, 1, 1), Accepted);
    let (_, empty) = ProducerStateManager::decode_snapshot(
        "mem",
        &ProducerStateManager::new().encode_snapshot(0).unwrap(),
    )
    .unwrap();
    assert!(empty.is_empty());
}

#[test]
fn a_damaged_snapshot_in_memory_is_an_error_naming_its_source() {
    let bytes = varied().encode_snapshot(5).unwrap();
    for cut in 0..bytes.len() {
        let err = ProducerStateManager::decode_snapshot("transfer", &bytes[..cut]).unwrap_err();
        assert!(err.is_corruption(), "cut at {cut}: {err}");
    }
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        match ProducerStateManager::decode_snapshot("transfer", &bad) {
            Err(Error::Corrupt { file, .. }) => assert_eq!(file, Path::new("transfer")),
            other => panic!("flip at {at}: {other:?}"),
        }
    }
}
#[test]
fn accept_any_admits_the_first_append_of_an_unknown_key_at_any_sequence() {
    let mut mgr = ProducerStateManager::new().with_unknown_producer(UnknownProducer::AcceptAny);
    assert_eq!(mgr.append(1u64, 0, 4, 17), Accepted);
    assert_eq!(mgr.append(1u64, 0, 4, 18), Accepted);
    assert_eq!(mgr.append(1u64, 0, 4, 20), OutOfOrder, "rule 4 as usual");
    assert_eq!(mgr.append(1u64, 0, 3, 19), FencedEpoch);
    // Malformed batches are still rejected.
    assert_eq!(mgr.append(2u64, 0, 0, -1), OutOfOrder);
    assert_eq!(
        mgr.append_batch(2u64, 0, 0, Batch::new(9, 3, 0, 0))
            .outcome(),
        OutOfOrder
    );
    assert_eq!(mgr.get(1u64, 0).map(|e| e.last_sequence()), Some(18));
    assert_eq!(mgr.unknown_producer(), UnknownProducer::AcceptAny);
}

#[test]
fn extreme_ids_and_partitions() {
    let mut mgr = ProducerStateManager::new();
    for pid in [0, 1, u64::MAX, 1 << 63, 0x243f_6a88_85a3_08d3] {
        for partition in [i32::MIN, -1, 0, i32::MAX] {
            assert_eq!(mgr.append(pid, partition, 0, 0), Accepted);
        }
    }
    assert_eq!(mgr.len(), 20);
    assert_eq!(mgr.append("", 0, 0, 0), Accepted);
    assert_eq!(mgr.append("", 0, 0, 0), Duplicate);
}

#[test]
fn a_kafka_mode_engine_round_trips_with_its_side_table_and_aborted_lists() {
    use crate::{AppendOptions, Marker, Origin};
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let txn = AppendOptions::client().transactional().verified();
    mgr.append_batch(1u64, 0, 0, Batch::new(0, 2, 10, 1));
    mgr.append_with("t", 0, 3, Batch::new(0, 0, 13, 2), txn)
        .unwrap();
    mgr.append_marker("t", 0, 3, Marker::abort(4, 14, 3), Origin::Coordinator)
        .unwrap();
    mgr.append_with(9u64, 5, 1, Batch::new(0, 4, 20, 4), txn)
        .unwrap();
    let bytes = mgr.encode_snapshot(7).unwrap();
    assert_eq!(bytes[10], 1, "the header's Kafka flag");
    let (pos, back) = ProducerStateManager::decode_snapshot("mem", &bytes).unwrap();
    assert_eq!((pos, back.semantics()), (7, Semantics::Kafka));
    for (id, p) in [
        (ProducerId::from(1u64), 0),
        ("t".into(), 0),
        (9u64.into(), 5),
    ] {
        assert_eq!(back.kafka_state(id.clone(), p), mgr.kafka_state(id, p));
    }
    assert_eq!(back.aborted_transactions(0), mgr.aborted_transactions(0));
    assert_eq!(back.first_unstable_offset(5), Some(20));
    assert_eq!(
        back.encode_snapshot(7).unwrap(),
        bytes,
        "the same bytes again"
    );
    // Every cut and flipped bit is an error, never a panic.
    for cut in 0..bytes.len() {
        assert!(ProducerStateManager::decode_snapshot("mem", &bytes[..cut]).is_err());
    }
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x04;
        assert!(
            ProducerStateManager::decode_snapshot("mem", &bad).is_err(),
            "flip at {at}"
        );
    }
}

/// One step of the lifecycle property test.
#[derive(Clone, Debug)]
enum Step {
    Batch {
        pid: u8,
        partition: u8,
        epoch: i16,
        ts: i64,
    },
    Single {
        pid: u8,
        partition: u8,
        epoch: i16,
    },
    Expire {
        now: i64,
        expiration: i64,
    },
    RemovePartition(u8),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..6, 0u8..3, 0i16..2, 0i64..1_000)
            .prop_map(|(pid, partition, epoch, ts)| Step::Batch { pid, partition, epoch, ts }),
        2 => (0u8..6, 0u8..3, 0i16..2)
            .prop_map(|(pid, partition, epoch)| Step::Single { pid, partition, epoch }),
        1 => (0i64..1_500, 0i64..600)
            .prop_map(|(now, expiration)| Step::Expire { now, expiration }),
        1 => (0u8..4).prop_map(Step::RemovePartition),
    ]
}

proptest::proptest! {
    /// Expiration and partition removal against a model that keeps,
    /// per key, only the timestamp of its last accepted append (none
    /// for a single-sequence append): a key expires when that
    /// timestamp is `expiration` or more before `now`, never without
    /// one; a partition removal forgets exactly its keys. The counts
    /// returned and the keys left are the model's after every step.
    #[test]
    fn expiration_and_partition_removal_match_a_model(
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        use std::collections::BTreeMap;
        let mut mgr = ProducerStateManager::new();
        let mut model: BTreeMap<(u64, i32), Option<i64>> = BTreeMap::new();
        let mut next: BTreeMap<(u64, i32, i16), i32> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Batch { pid, partition, epoch, ts } => {
                    let (pid, p) = (u64::from(pid), i32::from(partition));
                    let seq = next.get(&(pid, p, epoch)).copied().unwrap_or(0);
                    let b = Batch::new(seq, seq + 1, i64::from(seq), ts);
                    if mgr.append_batch(pid, p, epoch, b).is_accepted() {
                        model.insert((pid, p), Some(ts));
                        next.insert((pid, p, epoch), seq + 2);
                    } else {
                        // Forgotten or fenced: start the session over.
                        next.insert((pid, p, epoch), 0);
                    }
                }
                Step::Single { pid, partition, epoch } => {
                    let (pid, p) = (u64::from(pid), i32::from(partition));
                    let seq = next.get(&(pid, p, epoch)).copied().unwrap_or(0);
                    if mgr.append(pid, p, epoch, seq) == Accepted {
                        model.insert((pid, p), None);
                        next.insert((pid, p, epoch), seq + 1);
                    } else {
                        next.insert((pid, p, epoch), 0);
                    }
                }
                Step::Expire { now, expiration } => {
                    let before = model.len();
                    model.retain(|_, ts| !ts.is_some_and(|t| now - t >= expiration));
                    let n = mgr.expire_producers(now, expiration).unwrap();
                    proptest::prop_assert_eq!(n, before - model.len());
                }
                Step::RemovePartition(partition) => {
                    let p = i32::from(partition);
                    let before = model.len();
                    model.retain(|&(_, kp), _| kp != p);
                    proptest::prop_assert_eq!(mgr.remove_partition(p), before - model.len());
                }
            }
            let mut keys: Vec<(u64, i32)> = mgr
                .iter()
                .map(|(id, p, _)| (id.as_numeric().unwrap(), p))
                .collect();
            keys.sort();
            proptest::prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
        }
    }
}

#[test]
fn an_expired_producer_is_new_again_and_its_retry_is_not_a_duplicate() {
    let mut mgr = ProducerStateManager::new();
    let b = Batch::new(0, 4, 10, 1_000);
    assert_eq!(mgr.append_batch(1u64, 0, 3, b), BatchOutcome::Accepted);
    assert_eq!(
        mgr.append_batch(1u64, 0, 3, Batch::new(5, 9, 15, 1_001)),
        BatchOutcome::Accepted
    );
    assert_eq!(
        mgr.expire_producers(1_500, 500).unwrap(),
        0,
        "1,001 is newer"
    );
    assert_eq!(mgr.expire_producers(1_501, 500).unwrap(), 1);
    // A retry of its last batch is now a gap (rule 1), not a
    // duplicate; a batch at sequence 0 is a new producer's, accepted
    // at any epoch (and a retry of its first batch would be accepted
    // again: why the expiration must outlast any retry).
    let last = Batch::new(5, 9, 15, 1_001);
    assert_eq!(mgr.append_batch(1u64, 0, 3, last).outcome(), OutOfOrder);
    assert_eq!(mgr.append_batch(1u64, 0, 0, b), BatchOutcome::Accepted);
    assert_eq!(mgr.get(1u64, 0).map(|e| e.epoch()), Some(0));
    // Saturating: times at the ends of i64 neither wrap nor panic.
    assert_eq!(mgr.expire_producers(i64::MIN, 0).unwrap(), 0);
    assert_eq!(mgr.expire_producers(i64::MAX, i64::MAX).unwrap(), 0);
    assert_eq!(mgr.expire_producers(i64::MAX, 1).unwrap(), 1);
}

#[test]
fn removing_a_kafka_partition_forgets_its_transactions_and_side_table_keys() {
    use crate::{AppendOptions, Marker, Origin};
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let txn = AppendOptions::client().transactional().verified();
    for p in [0, 1] {
        mgr.append_with(1u64, p, 0, Batch::new(0, 0, 10, 1), txn)
            .unwrap();
        mgr.append_marker(1u64, p, 0, Marker::abort(0, 11, 2), Origin::Coordinator)
            .unwrap();
        mgr.append_with(2u64, p, 0, Batch::new(0, 0, 12, 3), txn)
            .unwrap();
        mgr.append(3u64, p, 0, 0);
    }
    assert_eq!(
        (
            mgr.first_unstable_offset(0),
            mgr.aborted_transactions(0).len()
        ),
        (Some(12), 1)
    );
    assert_eq!(mgr.remove_partition(0), 3);
    assert_eq!(mgr.first_unstable_offset(0), None);
    assert!(mgr.aborted_transactions(0).is_empty());
    assert!(mgr.kafka_state(1u64, 0).is_none() && mgr.kafka_state(2u64, 0).is_none());
    assert!(mgr.get(3u64, 0).is_none());
    // The other partition keeps everything.
    assert_eq!(
        (
            mgr.first_unstable_offset(1),
            mgr.aborted_transactions(1).len()
        ),
        (Some(12), 1)
    );
    assert_eq!(mgr.len(), 3);
    // A producer of the removed partition starts over there.
    assert!(
        mgr.append_with(2u64, 0, 0, Batch::new(0, 0, 20, 4), txn)
            .unwrap()
            .is_accepted()
    );
    assert_eq!(mgr.first_unstable_offset(0), Some(20));
}

#[test]
fn a_partition_moves_between_engines_with_its_retry_windows() {
    let mut old = varied();
    let export = old.export_partition(-4).unwrap();
    assert_eq!(export.len(), 1);
    let bytes = export.to_bytes();
    let moved = crate::snapshot::export::PartitionExport::from_bytes(&bytes).unwrap();
    let mut new = ProducerStateManager::new();
    new.append(5u64, 0, 0, 0);
    assert_eq!(new.import_partition(&moved).unwrap(), 1);
    assert_eq!(new.get("named", -4), old.get("named", -4));
    assert_eq!(
        new.append_batch("named", -4, 2, Batch::new(16, 17, 8, 9)),
        BatchOutcome::Duplicate {
            original: Some(BatchMetadata {
                offset: 8,
                timestamp: 9
            })
        }
    );
    // A second import of the same keys is refused whole.
    let before = sorted(&new);
    match new.import_partition(&moved) {
        Err(Error::ImportConflict { partition: -4, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(sorted(&new), before);
    // Removed at the old home, the partition has no state left there.
    assert_eq!(old.remove_partition(-4), 1);
    assert!(old.export_partition(-4).unwrap().is_empty());
    // An export moves only between engines of the same semantics.
    let mut kafka = ProducerStateManager::with_semantics(Semantics::Kafka);
    let e = kafka.import_partition(&moved).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ImportSemanticsMismatch {
                partition: -4,
                exported: Semantics::Strict,
                store: Semantics::Kafka
            }
        ),
        "{e}"
    );
    let k_export = kafka.export_partition(-4).unwrap();
    assert_eq!(k_export.semantics(), Semantics::Kafka);
    assert!(matches!(
        new.import_partition(&k_export),
        Err(Error::ImportSemanticsMismatch { .. })
    ));
    assert!(kafka.is_empty());
}
