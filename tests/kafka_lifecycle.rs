//! Issue 13's lifecycle in a `Semantics::Kafka` store (issue 15): Kafka's
//! expiration (never a producer with an open transaction), partition
//! removal with its transactions, the DescribeProducers view, each logged
//! and replayed exactly (a reopen with the clock far ahead decides
//! nothing again).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::store_util::{dir, sim_opts};
use producer_state::fs::SimFs;
use producer_state::{
    AppendOptions, Batch, Error, ManualClock, Marker, Origin, ProducerStateStore, Semantics,
    StoreOptions,
};

const DAY: i64 = 86_400_000;

fn opts(fs: &SimFs, clock: &Arc<ManualClock>) -> StoreOptions {
    sim_opts(fs)
        .semantics(Semantics::Kafka)
        .producer_expiration(Some(Duration::from_millis(DAY as u64)))
        .clock(clock.clone())
}

fn txn() -> AppendOptions {
    AppendOptions::client().transactional().verified()
}

#[test]
fn kafka_mode_expires_by_timestamp_but_never_an_open_transaction_and_replays_it() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(DAY));
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    // 1: plain, old. 2: open transaction, old. 3: plain, recent.
    // 4: committed transaction, its marker old.
    s.append_batch(1u64, 0, 0, Batch::new(0, 0, 10, 1_000))
        .unwrap();
    s.append_with(2u64, 0, 0, Batch::new(0, 0, 11, 1_000), txn())
        .unwrap();
    s.append_batch(3u64, 0, 0, Batch::new(0, 0, 12, DAY + 5_000))
        .unwrap();
    s.append_with(4u64, 1, 0, Batch::new(0, 0, 13, 1_000), txn())
        .unwrap();
    s.append_marker(4u64, 1, 0, Marker::abort(2, 14, 2_000), Origin::Coordinator)
        .unwrap();
    // Kafka's rule: now - lastTimestamp >= expiration, at the boundary too.
    clock.set(DAY + 2_000);
    assert_eq!(s.expire_now().unwrap(), 2, "1 and 4");
    assert!(s.kafka_state(1u64, 0).is_none() && s.kafka_state(4u64, 1).is_none());
    assert!(
        s.kafka_state(2u64, 0).is_some(),
        "an open transaction stays"
    );
    assert_eq!(s.first_unstable_offset(0), Some(11));
    assert_eq!(s.aborted_transactions(1).len(), 1, "the aborted list stays");
    assert!(s.was_removed(1u64, 0) && !s.was_removed(3u64, 0));
    // The expired producer starts again at any sequence (KIP-360).
    assert!(
        s.append_batch(1u64, 0, 0, Batch::new(7, 7, 15, DAY + 2_000))
            .unwrap()
            .is_accepted()
    );
    assert_eq!(s.expire_now().unwrap(), 0);
    let live: Vec<_> = (0..2).map(|p| s.kafka_producers(p)).collect();
    drop(s);
    // Far in the future: recovery replays the logged expiration, decides
    // nothing again.
    clock.set(i64::MAX / 2);
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    let again: Vec<_> = (0..2).map(|p| s.kafka_producers(p)).collect();
    assert_eq!(again, live);
    assert!(s.was_removed(4u64, 1), "the filter is replayed too");
    assert_eq!(s.kafka_state(1u64, 0).map(|k| k.last_sequence), Some(7));
    // Now everything without an open transaction goes.
    assert_eq!(s.expire_now().unwrap(), 2);
    assert_eq!(s.kafka_producers(0).len(), 1);
}

#[test]
fn remove_partition_drops_its_producers_and_transactions_atomically() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(0));
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    s.append_with(1u64, 0, 0, Batch::new(0, 1, 10, 1), txn())
        .unwrap();
    s.append_with(2u64, 0, 0, Batch::new(0, 0, 12, 1), txn())
        .unwrap();
    s.append_marker(2u64, 0, 0, Marker::abort(0, 13, 1), Origin::Coordinator)
        .unwrap();
    s.append_batch(3u64, 0, 0, Batch::new(0, 0, 14, 1)).unwrap();
    s.append_with(1u64, 1, 0, Batch::new(0, 0, 15, 1), txn())
        .unwrap();
    let d = s.kafka_producers(0);
    assert_eq!(
        d.iter()
            .map(|(id, k)| (
                id.as_numeric().unwrap(),
                k.current_txn_first_offset,
                k.coordinator_epoch
            ))
            .collect::<Vec<_>>(),
        [(1, Some(10), -1), (2, None, 0), (3, None, -1)]
    );
    assert_eq!(s.producers(0).len(), 3);
    assert_eq!(s.describe(3u64, 0).map(|i| i.last_activity), Some(1));
    assert_eq!(s.remove_partition(0).unwrap(), 3);
    assert_eq!(s.remove_partition(0).unwrap(), 0);
    assert!(s.kafka_producers(0).is_empty() && s.aborted_transactions(0).is_empty());
    assert_eq!(s.first_unstable_offset(0), None);
    assert_eq!(
        s.first_unstable_offset(1),
        Some(15),
        "other partitions stay"
    );
    assert!(!s.was_removed(1u64, 0), "a removal is not a forgetting");
    drop(s);
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    assert!(s.kafka_producers(0).is_empty() && s.aborted_transactions(0).is_empty());
    assert_eq!(s.first_unstable_offset(1), Some(15));
    assert_eq!(s.len(), 1);
}

#[test]
fn kafka_mode_has_no_producer_cap() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(0));
    let r = ProducerStateStore::open_with(dir(), opts(&fs, &clock).max_producers(Some(10)));
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{:?}", r.err());
}
