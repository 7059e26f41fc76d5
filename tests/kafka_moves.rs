//! Partition moves between `Semantics::Kafka` stores:
//! an export carries the producers' retry windows, coordinator epochs and
//! open transactions and the partition's aborted list, so the new home
//! answers as the old one would; the import is one atomic group, durable
//! and replayed exactly (a crash at every IO operation of it recovers to
//! before or after, never between); a store refuses an export of the other
//! semantics and an import into a partition that has state, changing
//! nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::store_util::sim_opts;
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AbortedTxn, AppendOptions, Batch, BatchOutcome, Error, KafkaProducerState, ManualClock, Marker,
    MarkerOutcome, Origin, PartitionExport, ProducerId, ProducerStateStore, Semantics,
    StoreOptions,
};

const P: i32 = 3;

fn opts(fs: &SimFs) -> StoreOptions {
    sim_opts(fs).semantics(Semantics::Kafka)
}

fn txn() -> AppendOptions {
    AppendOptions::client().transactional().verified()
}

/// The old home's partition `P`: a plain producer with a window of two
/// batches (1), an aborted transaction (2, coordinator epoch 3), an open
/// one (3, epoch 1), a replicated gap that only the side table holds (4);
/// and a key of another partition, which stays behind.
fn old_home(s: &ProducerStateStore) {
    let ok = |o: BatchOutcome| assert!(o.is_accepted(), "{o:?}");
    ok(s.append_batch(1u64, P, 0, Batch::new(0, 4, 0, 100))
        .unwrap());
    ok(s.append_batch(1u64, P, 0, Batch::new(5, 9, 5, 101))
        .unwrap());
    ok(s.append_with(2u64, P, 0, Batch::new(0, 1, 10, 102), txn())
        .unwrap());
    let m = s
        .append_marker(2u64, P, 0, Marker::abort(3, 12, 103), Origin::Coordinator)
        .unwrap();
    assert!(matches!(m, MarkerOutcome::Accepted { completed: Some(_) }));
    ok(s.append_with(3u64, P, 1, Batch::new(0, 2, 13, 104), txn())
        .unwrap());
    let repl = AppendOptions::replication();
    ok(s.append_with(4u64, P, 0, Batch::new(0, 0, 16, 105), repl)
        .unwrap());
    ok(s.append_with(4u64, P, 0, Batch::new(5, 5, 17, 106), repl)
        .unwrap());
    ok(s.append_batch(9u64, 4, 0, Batch::new(0, 0, 18, 107))
        .unwrap());
}

/// Everything a reader of partition `p` sees.
type View = (
    Vec<(ProducerId, KafkaProducerState)>,
    Vec<AbortedTxn>,
    Option<i64>,
    i64,
);

fn view(s: &ProducerStateStore, p: i32) -> View {
    (
        s.kafka_producers(p),
        s.aborted_transactions(p),
        s.first_unstable_offset(p),
        s.last_stable_offset(p, 30),
    )
}

#[test]
fn a_kafka_partition_moves_with_its_transactions_and_answers_the_same() {
    let (fa, fb) = (SimFs::new(), SimFs::new());
    let a = ProducerStateStore::open_with("/a", opts(&fa)).unwrap();
    old_home(&a);
    let export = a.export_partition(P).unwrap();
    assert_eq!(export.semantics(), Semantics::Kafka);
    assert_eq!(export.len(), 4, "partition 4's key stays behind");
    assert_eq!(export.high_offset(), 17);
    // Through its bytes, as between two brokers.
    let moved = PartitionExport::from_bytes(&export.to_bytes()).unwrap();
    assert_eq!(moved, export);

    let b = ProducerStateStore::open_with("/b", opts(&fb)).unwrap();
    b.append_batch(7u64, 8, 0, Batch::new(0, 0, 0, 1)).unwrap();
    let other = view(&b, 8);
    assert_eq!(b.import_partition(&moved).unwrap(), 4);
    assert_eq!(view(&b, P), view(&a, P));
    assert_eq!(b.first_unstable_offset(P), Some(13));
    assert_eq!(b.aborted_transactions(P).len(), 1);
    assert_eq!(
        view(&b, 8),
        other,
        "the store's other partitions are untouched"
    );
    assert!(b.kafka_state(9u64, 4).is_none());
    drop(b);
    let b = ProducerStateStore::open_with("/b", opts(&fb)).unwrap();
    assert_eq!(view(&b, P), view(&a, P), "through reopen");

    // Retries in the window are duplicates with their original offsets,
    // at the new home as at the old.
    for (pid, epoch, batch, options) in [
        (1u64, 0, Batch::new(5, 9, 40, 200), AppendOptions::client()),
        (1u64, 0, Batch::new(0, 4, 41, 200), AppendOptions::client()),
        (3u64, 1, Batch::new(0, 2, 42, 200), txn()),
    ] {
        let got = b.append_with(pid, P, epoch, batch, options).unwrap();
        assert!(
            matches!(got, BatchOutcome::Duplicate { original: Some(_) }),
            "{got:?}"
        );
        assert_eq!(got, a.append_with(pid, P, epoch, batch, options).unwrap());
    }
    // A stale coordinator is fenced; the current one completes the moved
    // transaction, which lifts the last stable offset.
    let fenced = b
        .append_marker(2u64, P, 0, Marker::commit(2, 20, 300), Origin::Coordinator)
        .unwrap();
    assert!(
        !matches!(fenced, MarkerOutcome::Accepted { .. }),
        "{fenced:?}"
    );
    assert_eq!(
        fenced,
        a.append_marker(2u64, P, 0, Marker::commit(2, 20, 300), Origin::Coordinator)
            .unwrap()
    );
    let commit = Marker::commit(4, 21, 301);
    let done = b
        .append_marker(3u64, P, 1, commit, Origin::Coordinator)
        .unwrap();
    assert!(
        matches!(
            done,
            MarkerOutcome::Accepted { completed: Some(c) }
                if (c.first_offset, c.last_offset, c.aborted) == (13, 21, false)
        ),
        "{done:?}"
    );
    assert_eq!(
        done,
        a.append_marker(3u64, P, 1, commit, Origin::Coordinator)
            .unwrap()
    );
    assert_eq!(b.first_unstable_offset(P), None);
    assert_eq!(view(&b, P), view(&a, P));
    // Through a snapshot this time.
    assert!(b.snapshot().unwrap().is_some());
    drop(b);
    let b = ProducerStateStore::open_with("/b", opts(&fb)).unwrap();
    assert_eq!(
        view(&b, P),
        view(&a, P),
        "the marker after the import is in the snapshot too"
    );

    // Truncation treats the import as one append at its highest offset
    // (17): above it the imported state stays and the marker goes ...
    b.truncate_to(18).unwrap();
    assert_eq!(b.first_unstable_offset(P), Some(13));
    assert_eq!(b.kafka_producers(P), moved.kafka_producers());
    // ... at or below it the import is undone whole.
    b.truncate_to(17).unwrap();
    assert!(b.kafka_producers(P).is_empty() && b.aborted_transactions(P).is_empty());
    assert_eq!(view(&b, 8), other);
    drop(b);
    let b = ProducerStateStore::open_with("/b", opts(&fb)).unwrap();
    assert!(b.kafka_producers(P).is_empty());
    // Imported again, it is there again.
    assert_eq!(b.import_partition(&moved).unwrap(), 4);
    assert_eq!(b.kafka_producers(P), moved.kafka_producers());
}

#[test]
fn an_import_is_refused_into_a_partition_with_state_or_a_store_of_the_other_semantics() {
    let fa = SimFs::new();
    let a = ProducerStateStore::open_with("/a", opts(&fa)).unwrap();
    old_home(&a);
    let moved = a.export_partition(P).unwrap();

    // Twice: the keys are there.
    let fb = SimFs::new();
    let b = ProducerStateStore::open_with("/b", opts(&fb)).unwrap();
    b.import_partition(&moved).unwrap();
    let (before, pos) = (view(&b, P), b.next_position());
    let e = b.import_partition(&moved).unwrap_err();
    assert!(
        matches!(e, Error::ImportConflict { partition: P, .. }),
        "{e}"
    );
    assert_eq!(
        (view(&b, P), b.next_position()),
        (before, pos),
        "nothing written"
    );

    // One other producer of the partition is state enough: the aborted
    // list and the last stable offset come from one log.
    let fc = SimFs::new();
    let c = ProducerStateStore::open_with("/c", opts(&fc)).unwrap();
    c.append_batch(50u64, P, 0, Batch::new(0, 0, 0, 1)).unwrap();
    let e = c.import_partition(&moved).unwrap_err();
    assert!(
        matches!(&e, Error::ImportConflict { producer_id, partition: P } if *producer_id == 50u64.into()),
        "{e}"
    );

    // Only aborted transactions left (their producer expired): refused too.
    let fd = SimFs::new();
    let clock = Arc::new(ManualClock::new(0));
    let d = ProducerStateStore::open_with(
        "/d",
        opts(&fd)
            .producer_expiration(Some(Duration::from_millis(10)))
            .clock(clock.clone()),
    )
    .unwrap();
    d.append_with(60u64, P, 0, Batch::new(0, 0, 0, 0), txn())
        .unwrap();
    d.append_marker(60u64, P, 0, Marker::abort(0, 1, 0), Origin::Coordinator)
        .unwrap();
    clock.set(100);
    assert_eq!(d.expire_now().unwrap(), 1);
    let pos = d.next_position();
    let e = d.import_partition(&moved).unwrap_err();
    assert!(
        matches!(e, Error::ImportPartitionNotEmpty { partition: P }),
        "{e}"
    );
    assert_eq!(
        (d.aborted_transactions(P).len(), d.next_position()),
        (1, pos)
    );

    // A strict store refuses a Kafka export, and a Kafka store a seed one.
    let fs = SimFs::new();
    let seed = ProducerStateStore::open_with("/s", sim_opts(&fs)).unwrap();
    let e = seed.import_partition(&moved).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ImportSemanticsMismatch {
                partition: P,
                exported: Semantics::Kafka,
                store: Semantics::Strict
            }
        ),
        "{e}"
    );
    assert!(seed.is_empty() && seed.next_position() == 0);
    seed.append_batch(1u64, P, 0, Batch::new(0, 0, 0, 1))
        .unwrap();
    let seed_export = seed.export_partition(P).unwrap();
    assert_eq!(seed_export.semantics(), Semantics::Strict);
    assert_eq!(
        seed_export.to_bytes()[8],
        1,
        "strict exports stay version 1"
    );
    let fe = SimFs::new();
    let e_store = ProducerStateStore::open_with("/e", opts(&fe)).unwrap();
    let e = e_store.import_partition(&seed_export).unwrap_err();
    assert!(matches!(e, Error::ImportSemanticsMismatch { .. }), "{e}");
    assert!(e_store.is_empty() && e_store.next_position() == 0);
}

/// The store `/b` with a key of its own, before the import.
fn new_home(fs: &SimFs) -> ProducerStateStore {
    let b = ProducerStateStore::open_with("/b", opts(fs)).unwrap();
    b.append_batch(7u64, 8, 0, Batch::new(0, 0, 0, 1)).unwrap();
    b
}

#[test]
fn a_crash_at_every_io_operation_of_an_import_recovers_before_or_after() {
    let fa = SimFs::new();
    let a = ProducerStateStore::open_with("/a", opts(&fa)).unwrap();
    old_home(&a);
    let moved = a.export_partition(P).unwrap();
    // The state before and after, without a crash.
    let fs = SimFs::new();
    let b = new_home(&fs);
    let before = (view(&b, P), view(&b, 8));
    let start = fs.ops();
    b.import_partition(&moved).unwrap();
    let ops = fs.ops() - start;
    let after = (view(&b, P), view(&b, 8));
    assert_ne!(before, after);
    drop(b);
    let (mut saw_before, mut saw_after) = (false, false);
    for n in 0..ops + 2 {
        for image in [Unsynced::Drop, Unsynced::Keep, Unsynced::TornPrefix(n)] {
            let fs = SimFs::new();
            let b = new_home(&fs);
            fs.set_fault(fs.ops() + n, Fault::Crash);
            let r = b.import_partition(&moved);
            drop(b);
            let img = if fs.crashed() {
                fs.crash_image(image)
            } else {
                fs.clone()
            };
            let b = ProducerStateStore::open_with("/b", opts(&img))
                .unwrap_or_else(|e| panic!("crash at {n}: recovery: {e}"));
            let got = (view(&b, P), view(&b, 8));
            if r.is_ok() {
                // Acknowledged (durable under Always): all of it.
                assert_eq!(got, after, "crash at {n}, acknowledged");
            } else {
                assert!(
                    got == before || got == after,
                    "crash at {n}: between: {got:?}"
                );
            }
            saw_before |= got == before;
            saw_after |= got == after;
            // Whatever it recovered to, the store answers on: an import
            // that did not survive can be made again.
            if got == before {
                assert_eq!(b.import_partition(&moved).unwrap(), 4);
                assert_eq!((view(&b, P), view(&b, 8)), after);
            }
        }
    }
    assert!(saw_before && saw_after && ops > 1, "{ops} IO operations");
}
