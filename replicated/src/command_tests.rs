//! Tests of `command.rs`.

use super::*;

fn sample() -> Vec<Command> {
    vec![
        Command::Append(Append::single(7u64, 0, 0, 0)),
        Command::Append(Append::batch("orders", -3, i16::MIN, 5, 9, -1)),
        Command::AppendAll(vec![
            Append::batch(u64::MAX, i32::MAX, 2, 0, 4, i64::MAX),
            Append::single("", i32::MIN, -1, i32::MAX),
        ]),
        Command::Expire {
            now_ms: i64::MIN,
            expiration_ms: i64::MAX,
        },
        Command::RemovePartition {
            partition: i32::MIN,
        },
        Command::import_partition(&export()),
    ]
}

/// Partition 4 of an engine with two producers.
fn export() -> PartitionExport {
    let mut mgr = ProducerStateManager::new();
    mgr.append_batch(1u64, 4, 0, Batch::new(0, 9, 100, 5));
    mgr.append("named", 4, 2, 0);
    mgr.append(1u64, 5, 0, 0);
    mgr.export_partition(4).unwrap()
}

#[test]
fn lifecycle_commands_answer_how_many_keys_went_and_only_appends_batch() {
    let mut mgr = ProducerStateManager::new();
    for p in [0, 1] {
        apply(
            &mut mgr,
            1,
            &Command::Append(Append::batch(9u64, p, 0, 0, 0, 1_000)),
        );
    }
    apply(&mut mgr, 2, &Command::Append(Append::single(8u64, 0, 0, 0)));
    let expire = |now_ms| Command::Expire {
        now_ms,
        expiration_ms: 500,
    };
    let answer = |mgr: &mut ProducerStateManager, c: &Command| apply(mgr, 3, c).lifecycle;
    assert_eq!(
        answer(&mut mgr, &expire(1_499)),
        Some(LifecycleOutcome::Expired { keys: 0 })
    );
    let r = apply(&mut mgr, 4, &expire(1_500));
    assert_eq!(
        (r.outcomes.len(), r.lifecycle),
        (0, Some(LifecycleOutcome::Expired { keys: 2 }))
    );
    assert_eq!(mgr.len(), 1, "the single-sequence key has no timestamp");
    assert_eq!(
        answer(&mut mgr, &Command::RemovePartition { partition: 0 }),
        Some(LifecycleOutcome::PartitionRemoved { keys: 1 })
    );
    assert!(mgr.is_empty());
    // An import; its retry (the answer lost) is answered the same and
    // adds nothing; a conflicting one is refused whole.
    let import = Command::import_partition(&export());
    for _ in 0..2 {
        assert_eq!(
            answer(&mut mgr, &import),
            Some(LifecycleOutcome::Imported { keys: 2 })
        );
        assert_eq!(mgr.len(), 2);
    }
    apply(
        &mut mgr,
        5,
        &Command::Append(Append::batch(1u64, 4, 0, 10, 11, 6)),
    );
    let before = mgr.get(1u64, 4);
    assert!(matches!(
        answer(&mut mgr, &import),
        Some(LifecycleOutcome::ImportRefused { .. })
    ));
    assert_eq!((mgr.len(), mgr.get(1u64, 4)), (2, before));
    // Damaged bytes never reach a replica (validate), and would be
    // refused alike if they did.
    let mut bad = export().to_bytes();
    bad[20] ^= 1;
    let bad = Command::ImportPartition { export: bad };
    assert!(bad.validate().is_err());
    assert!(matches!(
        answer(&mut mgr, &bad),
        Some(LifecycleOutcome::ImportRefused { .. })
    ));
    assert!(!expire(0).is_append() && Command::Append(Append::single(1u64, 0, 0, 0)).is_append());
}

#[test]
fn commands_round_trip_and_every_cut_or_extra_byte_is_refused() {
    for c in sample() {
        let mut b = Vec::new();
        c.encode(&mut b);
        assert_eq!(Command::decode(&b), Ok(c.clone()));
        for cut in 0..b.len() {
            assert!(Command::decode(&b[..cut]).is_err(), "{c:?} cut at {cut}");
        }
        b.push(0);
        assert_eq!(Command::decode(&b), Err("bytes after the command"));
    }
    assert!(Command::decode(&[TAG_APPEND_ALL, 0, 0, 0, 0]).is_err());
    assert!(Command::decode(&[9]).is_err());
}

#[test]
fn offsets_number_slots_within_an_entry_and_stop_at_the_limits() {
    assert_eq!(offset_of(0, 0), Some(0));
    assert_eq!(offset_of(3, 2), Some(3 * 65536 + 2));
    assert_eq!(offset_of(3, MAX_APPENDS_PER_ENTRY), None);
    assert_eq!(offset_of(1 << 47, 0), None);
    assert_eq!(offset_of((1 << 47) - 1, 65535), Some(i64::MAX));
}

#[test]
fn apply_classifies_in_order_and_a_retry_gets_the_original_offset() {
    let mut mgr = ProducerStateManager::new();
    let group = Command::AppendAll(vec![
        Append::batch(1u64, 0, 0, 0, 9, 100),
        Append::batch(1u64, 0, 0, 10, 19, 101),
        Append::batch(1u64, 0, 0, 0, 9, 102),
        Append::single(2u64, 0, 0, 3),
    ]);
    let r = apply(&mut mgr, 5, &group);
    let base = 5 * 65536;
    assert_eq!(
        r.outcomes,
        [
            Outcome::Accepted { offset: base },
            Outcome::Accepted { offset: base + 1 },
            Outcome::Duplicate {
                original: Some((base, 100))
            },
            Outcome::OutOfOrder {
                reason: r.outcomes[3].clone().reason_or_empty()
            },
        ]
    );
    assert_eq!(r.outcomes[3].word(), "OUT_OF_ORDER");
    let retry = apply(
        &mut mgr,
        9,
        &Command::Append(Append::batch(1u64, 0, 0, 10, 19, 7)),
    );
    assert_eq!(
        retry.outcomes,
        [Outcome::Duplicate {
            original: Some((base + 1, 101))
        }]
    );
    let fenced = apply(
        &mut mgr,
        10,
        &Command::Append(Append::single(1u64, 0, -1, 0)),
    );
    assert_eq!(fenced.outcomes, [Outcome::FencedEpoch { current_epoch: 0 }]);
}

impl Outcome {
    fn reason_or_empty(self) -> String {
        match self {
            Outcome::OutOfOrder { reason } => reason,
            _ => String::new(),
        }
    }
}

#[test]
fn the_encoded_length_is_the_length_of_the_bytes() {
    for c in sample() {
        let mut b = Vec::new();
        c.encode(&mut b);
        assert_eq!(c.encoded_len(), b.len(), "{c:?}");
    }
}

#[test]
fn validate_refuses_what_cannot_be_numbered_or_encoded() {
    assert!(Command::AppendAll(vec![]).validate().is_err());
    let many = vec![Append::single(1u64, 0, 0, 0); MAX_APPENDS_PER_ENTRY + 1];
    assert!(Command::AppendAll(many).validate().is_err());
    let long = Append::single("x".repeat(70_000).as_str(), 0, 0, 0);
    assert!(Command::Append(long).validate().is_err());
    let negative = Command::Expire {
        now_ms: 0,
        expiration_ms: -1,
    };
    assert!(negative.validate().is_err());
    let huge = Command::ImportPartition {
        export: vec![0; MAX_COMMAND_BYTES],
    };
    assert_eq!(huge.validate(), Err("a command is at most 16 MiB encoded"));
    assert!(sample().iter().all(|c| c.validate().is_ok()));
}
