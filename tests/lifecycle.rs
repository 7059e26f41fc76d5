//! The producer lifecycle (docs/lifecycle.md), operation by operation:
//! activity and the log clock, expiration and its determinism, the
//! unknown-producer policy, the bounded table (eviction and refusal) and
//! the memory of removed keys, the listing, partition removal, and the
//! refusals of bad input that change nothing.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::store_util::{dir, sim_opts};
use producer_state::fs::{FileSystem, SimFs, Unsynced};
use producer_state::{
    AppendOutcome, AppendRequest, AtCapacity, Batch, BatchOutcome, Clock, Error, FsyncPolicy,
    ManualClock, OutOfOrderReason, ProducerId, ProducerInfo, ProducerStateStore, StoreOptions,
    UnknownProducer,
};

const T0: i64 = 1_700_000_000_000;
const HOUR: Duration = Duration::from_secs(3600);

/// Options over `fs` with the clock `clock`, a one-hour expiration swept
/// only on demand.
fn opts(fs: &SimFs, clock: &ManualClock) -> StoreOptions {
    sim_opts(fs)
        .clock(Arc::new(clock.clone()))
        .producer_expiration(Some(HOUR))
}

/// Every key of the store with its state, sorted.
fn state(s: &ProducerStateStore) -> Vec<ProducerInfo> {
    let mut v: Vec<ProducerInfo> = s
        .iter()
        .map(|(id, p, _)| s.describe(id, p).expect("listed keys have state"))
        .collect();
    v.sort_by(|a, b| (&a.producer_id, a.partition).cmp(&(&b.producer_id, b.partition)));
    v
}

/// Opens the store of `_fs` (the options name its file system; the
/// parameter keeps the call sites saying which disk they open).
fn reopen(_fs: &SimFs, o: StoreOptions) -> ProducerStateStore {
    ProducerStateStore::open_with(dir(), o).unwrap()
}

#[test]
fn a_key_is_active_at_its_batch_timestamp_or_the_clock_that_accepted_it() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(&fs, opts(&fs, &clock));
    s.append(1u64, 0, 0, 0).unwrap();
    assert_eq!(s.describe(1u64, 0).unwrap().last_activity, T0);
    s.append_batch(2u64, 0, 0, Batch::new(0, 3, 10, 42))
        .unwrap();
    assert_eq!(s.describe(2u64, 0).unwrap().last_timestamp(), 42);
    clock.advance(Duration::from_millis(5));
    s.append(1u64, 0, 0, 1).unwrap();
    assert_eq!(s.describe(1u64, 0).unwrap().last_activity, T0 + 5);
    // A rejected or duplicate append is no activity.
    clock.advance(Duration::from_millis(5));
    assert_eq!(s.append(1u64, 0, 0, 1).unwrap(), AppendOutcome::Duplicate);
    assert_eq!(s.describe(1u64, 0).unwrap().last_activity, T0 + 5);
    // A clock that steps back does not take the log clock with it.
    clock.set(T0 - 1_000);
    s.append(1u64, 0, 0, 2).unwrap();
    assert_eq!(s.describe(1u64, 0).unwrap().last_activity, T0 + 5);
    drop(s);
    // The activities are in the log: recovered exactly, whatever the clock.
    let later = ManualClock::new(T0 * 2);
    let s = reopen(&fs, opts(&fs, &later));
    assert_eq!(s.describe(1u64, 0).unwrap().last_activity, T0 + 5);
    assert_eq!(s.describe(2u64, 0).unwrap().last_activity, 42);
}

#[test]
fn expired_keys_lose_their_state_and_recovery_never_decides_again() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(&fs, opts(&fs, &clock));
    for k in 0..100u64 {
        s.append(k, (k % 4) as i32, 0, 0).unwrap();
    }
    clock.advance(HOUR / 2);
    for k in 0..10u64 {
        s.append(k, (k % 4) as i32, 0, 1).unwrap();
    }
    // 1h after the first appends: keys 10.. are exactly an hour old.
    clock.advance(HOUR / 2);
    assert_eq!(s.expire_now().unwrap(), 90);
    assert_eq!(s.len(), 10);
    assert_eq!(s.stats().expired, 90);
    // Rule 1 again: a retry is out of order, a restart at 0 is accepted.
    assert_eq!(
        s.append_batch(50u64, 2, 0, Batch::new(1, 1, 0, T0))
            .unwrap(),
        BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::UnknownProducer { first_sequence: 1 }
        }
    );
    assert!(s.was_removed(50u64, 2));
    assert!(!s.was_removed(1_000u64, 2), "never seen");
    assert_eq!(s.append(50u64, 2, 0, 0).unwrap(), AppendOutcome::Accepted);
    let live = state(&s);
    drop(s);

    // Recovery at any later time replays the expirations the log holds and
    // makes none of its own: the keys an hour old by then stay.
    let far = ManualClock::new(T0 + 1_000 * 3_600_000);
    let s = reopen(&fs, opts(&fs, &far));
    assert_eq!(state(&s), live);
    assert!(s.was_removed(51u64, 3), "the filter is recovered too");
    // A sweep now expires them, and that is logged in turn.
    assert_eq!(s.expire_now().unwrap(), 11);
    assert!(s.is_empty());
    drop(s);
    let s = reopen(&fs, opts(&fs, &ManualClock::new(0)));
    assert!(s.is_empty());
    // Without an expiration, a sweep removes nothing.
    let s2 = {
        drop(s);
        reopen(&fs, opts(&fs, &far).producer_expiration(None))
    };
    assert_eq!(s2.expire_now().unwrap(), 0);
}

#[test]
fn a_directory_replays_to_the_live_state_on_any_machine_at_any_time() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    // One snapshot, taken mid-way (none deleted, so the log is kept
    // from position 0).
    let o = |fs: &SimFs, c: &ManualClock| {
        opts(fs, c)
            .snapshot_every_records(None)
            .max_producers(Some(40))
            .unknown_producer(UnknownProducer::AcceptAny)
    };
    let s = reopen(&fs, o(&fs, &clock));
    let mut x = 7u64;
    for i in 0..600u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = x % 64;
        let p = (k % 3) as i32;
        let next = s.describe(k, p).map_or(0, |i| i.last_sequence() + 1);
        if i % 3 == 0 {
            s.append_batch(k, p, 0, Batch::new(next, next + 1, i as i64, T0 + i as i64))
                .unwrap();
        } else {
            // Some at a sequence above 0: accepted for unknown keys.
            s.append(k, p, 0, if next == 0 { 5 } else { next }).unwrap();
        }
        clock.advance(Duration::from_secs(17));
        if i % 97 == 0 {
            s.expire_now().unwrap();
        }
        if i == 300 {
            s.snapshot().unwrap().unwrap();
        }
    }
    assert!(s.stats().evicted > 0 && s.stats().expired > 0);
    let live = state(&s);
    let filter: Vec<bool> = (0..64u64)
        .map(|k| s.was_removed(k, (k % 3) as i32))
        .collect();
    drop(s);

    // The same directory, read at a far later time with another policy.
    let far = ManualClock::new(i64::MAX / 4);
    let again = reopen(
        &fs,
        o(&fs, &far).unknown_producer(UnknownProducer::RequireZero),
    );
    assert_eq!(state(&again), live);
    drop(again);

    // A copy holding only the log (every segment from position 0, no
    // snapshot) replays everything on a fresh directory.
    let only_log = SimFs::new();
    only_log.create_dir_all(&dir()).unwrap();
    let img = fs.crash_image(Unsynced::Drop);
    for (path, _) in img.files() {
        let name = path.file_name().unwrap().to_str().unwrap();
        if name.ends_with(".wal") {
            only_log.overwrite(&path, &img.read_file(&path).unwrap());
        }
    }
    assert!(
        img.files()
            .iter()
            .any(|(p, _)| p.ends_with("00000000000000000000.wal"))
    );
    let replayed = reopen(&only_log, o(&only_log, &far));
    assert_eq!(replayed.recovery_report().snapshot, None);
    assert_eq!(state(&replayed), live);
    let f: Vec<bool> = (0..64u64)
        .map(|k| replayed.was_removed(k, (k % 3) as i32))
        .collect();
    assert_eq!(f, filter);
}

#[test]
fn expiration_runs_in_the_background_at_its_interval() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(
        &fs,
        opts(&fs, &clock).expiration_interval(Some(Duration::from_millis(5))),
    );
    s.append(1u64, 0, 0, 0).unwrap();
    clock.advance(2 * HOUR);
    let started = Instant::now();
    while !s.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "no sweep ran");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.stats().expired, 1);
}

#[test]
fn accept_any_admits_an_unknown_producer_and_replays_under_either_policy() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let any = |fs: &SimFs| opts(fs, &clock).unknown_producer(UnknownProducer::AcceptAny);
    let s = reopen(&fs, any(&fs));
    assert_eq!(s.append(9u64, 0, 2, 41).unwrap(), AppendOutcome::Accepted);
    assert_eq!(s.append(9u64, 0, 2, 42).unwrap(), AppendOutcome::Accepted);
    assert_eq!(s.append(9u64, 0, 2, 44).unwrap(), AppendOutcome::OutOfOrder);
    s.append_all(&[
        AppendRequest::single(10u64, 0, 0, 7),
        AppendRequest::single(10u64, 0, 0, 8),
    ]);
    drop(s);
    // Reopened requiring 0: the log says those appends were accepted.
    let strict = reopen(&fs, opts(&fs, &clock));
    assert_eq!(strict.get(9u64, 0).unwrap().last_sequence(), 42);
    assert_eq!(strict.get(10u64, 0).unwrap().last_sequence(), 8);
    assert_eq!(
        strict.append(11u64, 0, 0, 3).unwrap(),
        AppendOutcome::OutOfOrder
    );
}

#[test]
fn a_full_table_evicts_the_least_recently_active_keys_and_remembers_them() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let capped = |fs: &SimFs| opts(fs, &clock).max_producers(Some(3));
    let s = reopen(&fs, capped(&fs));
    for k in 0..3u64 {
        s.append(k, 0, 0, 0).unwrap();
        clock.advance(Duration::from_millis(1));
    }
    // Touch key 0: key 1 is now the least recently active.
    s.append(0u64, 0, 0, 1).unwrap();
    clock.advance(Duration::from_millis(1));
    s.append(3u64, 0, 0, 0).unwrap();
    assert_eq!(s.len(), 3);
    assert!(s.get(1u64, 0).is_none());
    assert!(s.was_removed(1u64, 0));
    assert!(!s.was_removed(2u64, 0));
    assert_eq!(s.stats().evicted, 1);
    // A batch's own timestamp is its activity: an old one goes first.
    s.append_batch(2u64, 0, 0, Batch::new(1, 1, 0, T0 - 5))
        .unwrap();
    s.append(4u64, 0, 0, 0).unwrap();
    assert!(s.get(2u64, 0).is_none());
    // A retry from the evicted producer is told apart from a new one.
    assert_eq!(s.append(1u64, 0, 0, 1).unwrap(), AppendOutcome::OutOfOrder);
    assert!(s.was_removed(1u64, 0) && !s.was_removed(77u64, 0));
    let live = state(&s);
    drop(s);
    let s = reopen(&fs, capped(&fs));
    assert_eq!(state(&s), live);
    // Reopened with a lower cap: the next new key evicts down to it.
    drop(s);
    let s = reopen(&fs, opts(&fs, &clock).max_producers(Some(1)));
    s.append(5u64, 0, 0, 0).unwrap();
    assert_eq!(s.len(), 1);
    assert!(s.get(5u64, 0).is_some());
}

#[test]
fn memory_stays_bounded_under_endless_churn() {
    // 20,000 distinct producers with windows through a table of 500:
    // slots and windows are reused, so the table never grows past its cap.
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(
        &fs,
        opts(&fs, &clock)
            .max_producers(Some(500))
            .fsync(FsyncPolicy::Never)
            .snapshot_every_records(None)
            .segment_size(1 << 30),
    );
    for k in 0..20_000u64 {
        let o = s
            .append_batch(k, 0, 0, Batch::new(0, 0, k as i64, T0 + k as i64))
            .unwrap();
        assert!(o.is_accepted());
        assert!(s.len() <= 500);
    }
    assert_eq!(s.stats().evicted, 19_500);
    // The 500 most recent remain.
    assert!((19_500..20_000u64).all(|k| s.get(k, 0).is_some()));
}

#[test]
fn a_full_table_can_refuse_new_keys_instead_and_writes_nothing() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(
        &fs,
        opts(&fs, &clock)
            .max_producers(Some(2))
            .at_capacity(AtCapacity::Refuse),
    );
    s.append(1u64, 0, 0, 0).unwrap();
    s.append(2u64, 0, 0, 0).unwrap();
    let written = s.stats().records_written;
    match s.append(3u64, 0, 0, 0) {
        Err(Error::TooManyProducers { max: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(s.stats().records_written, written, "nothing written");
    assert!(s.get(3u64, 0).is_none());
    // Existing keys go on; a rejected new key needs no room.
    assert_eq!(s.append(1u64, 0, 0, 1).unwrap(), AppendOutcome::Accepted);
    assert_eq!(s.append(3u64, 0, 0, 5).unwrap(), AppendOutcome::OutOfOrder);
    let out = s.append_all(&[
        AppendRequest::single(2u64, 0, 0, 1),
        AppendRequest::single(4u64, 0, 0, 0),
    ]);
    assert!(out[0].is_ok());
    assert!(matches!(out[1], Err(Error::TooManyProducers { .. })));
    // Once a key expires there is room again.
    clock.advance(2 * HOUR);
    s.append(2u64, 0, 0, 2).unwrap();
    assert_eq!(s.expire_now().unwrap(), 1);
    assert_eq!(s.append(4u64, 0, 0, 0).unwrap(), AppendOutcome::Accepted);
}

#[test]
fn the_listing_shows_one_partitions_producers_sorted() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(&fs, opts(&fs, &clock));
    for k in 0..300u64 {
        s.append(k, (k % 30) as i32, 1, 0).unwrap();
    }
    s.append_batch("named", 7, 3, Batch::new(0, 4, 100, 555))
        .unwrap();
    let seven = s.producers(7);
    let mut want: Vec<ProducerId> = (0..300u64)
        .filter(|k| k % 30 == 7)
        .map(ProducerId::from)
        .collect();
    want.push(ProducerId::from("named"));
    assert_eq!(
        seven
            .iter()
            .map(|i| i.producer_id.clone())
            .collect::<Vec<_>>(),
        want
    );
    let named = seven.last().unwrap();
    assert_eq!((named.epoch(), named.last_sequence()), (3, 4));
    assert_eq!(named.last_timestamp(), 555);
    assert_eq!(named.retained_batches().count(), 1);
    assert!(s.producers(31).is_empty());
    assert_eq!(s.describe(7u64, 7).as_ref(), seven.first());
}

#[test]
fn removing_a_partition_drops_exactly_its_keys_and_is_logged() {
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let s = reopen(&fs, opts(&fs, &clock));
    for k in 0..500u64 {
        s.append(k, (k % 5) as i32, 0, 0).unwrap();
    }
    assert_eq!(s.remove_partition(3).unwrap(), 100);
    assert_eq!(s.remove_partition(3).unwrap(), 0);
    assert_eq!(s.remove_partition(99).unwrap(), 0);
    assert_eq!(s.len(), 400);
    assert!(s.producers(3).is_empty());
    assert!(
        !s.was_removed(3u64, 3),
        "a moved partition is not forgotten by choice"
    );
    assert_eq!(s.stats().partition_removed, 100);
    let live = state(&s);
    drop(s);
    let s = reopen(&fs, opts(&fs, &clock));
    assert_eq!(state(&s), live);
    assert_eq!(s.append(3u64, 3, 0, 0).unwrap(), AppendOutcome::Accepted);
}

#[test]
fn bad_options_are_refused_before_anything_is_created() {
    let fs = SimFs::new();
    for (o, what) in [
        (
            sim_opts(&fs).producer_expiration(Some(Duration::ZERO)),
            "producer_expiration",
        ),
        (sim_opts(&fs).max_producers(Some(0)), "max_producers"),
        (
            sim_opts(&fs).expiration_interval(Some(Duration::ZERO)),
            "expiration_interval",
        ),
    ] {
        match ProducerStateStore::open_with(dir(), o) {
            Err(Error::InvalidOptions(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("{what}: {other:?}"),
        }
        assert!(fs.list(Path::new("/store")).is_err(), "nothing created");
    }
    let clock = ManualClock::new(5);
    assert_eq!(clock.now_ms(), 5);
}

#[test]
fn a_partition_moves_to_another_store_with_its_retry_window_and_activity() {
    let (fa, fb) = (SimFs::new(), SimFs::new());
    let clock = ManualClock::new(T0);
    let a = reopen(&fa, opts(&fa, &clock));
    let mut batches = Vec::new();
    for i in 0..8 {
        let b = Batch::new(i * 2, i * 2 + 1, 1_000 + i64::from(i), T0 + i64::from(i));
        a.append_batch(42u64, 5, 1, b).unwrap();
        batches.push(b);
    }
    a.append("single", 5, 0, 0).unwrap();
    a.append(7u64, 6, 0, 0).unwrap();
    let export = a.export_partition(5).unwrap();
    assert_eq!(export.partition(), 5);
    assert_eq!(export.len(), 2);
    assert_eq!(export.high_offset(), 1_007);
    let moved = producer_state::PartitionExport::from_bytes(&export.to_bytes()).unwrap();
    assert_eq!(moved, export);

    let b = reopen(&fb, opts(&fb, &clock));
    b.append("single", 5, 0, 0).unwrap();
    // A key this store holds: refused, nothing imported.
    match b.import_partition(&moved) {
        Err(Error::ImportConflict { partition: 5, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(b.len(), 1);
    assert!(b.get(42u64, 5).is_none());
    b.remove_partition(5).unwrap();
    assert_eq!(b.import_partition(&moved).unwrap(), 2);
    assert_eq!(b.stats().imported, 2);
    for info in export.iter() {
        assert_eq!(b.describe(info.producer_id.clone(), 5).as_ref(), Some(info));
    }
    // The retry window came along: retries answer as they did on `a`.
    for old in &batches[3..] {
        assert_eq!(
            b.append_batch(42u64, 5, 1, *old).unwrap(),
            BatchOutcome::Duplicate {
                original: Some(old.metadata())
            }
        );
    }
    assert_eq!(
        b.append_batch(42u64, 5, 1, Batch::new(16, 16, 2_000, T0))
            .unwrap(),
        BatchOutcome::Accepted
    );
    // Durable, and an empty export imports nothing.
    drop(b);
    let b = reopen(&fb, opts(&fb, &clock));
    assert_eq!(b.get(42u64, 5).unwrap().last_sequence(), 16);
    assert_eq!(
        b.import_partition(&a.export_partition(99).unwrap())
            .unwrap(),
        0
    );

    // A store at its cap refuses or evicts to make room.
    let fc = SimFs::new();
    let c = reopen(
        &fc,
        opts(&fc, &clock)
            .max_producers(Some(2))
            .at_capacity(AtCapacity::Refuse),
    );
    c.append(1u64, 0, 0, 0).unwrap();
    assert!(matches!(
        c.import_partition(&moved),
        Err(Error::TooManyProducers { max: 2 })
    ));
    assert_eq!(c.len(), 1);
    let fd = SimFs::new();
    let d = reopen(&fd, opts(&fd, &clock).max_producers(Some(2)));
    d.append(1u64, 0, 0, 0).unwrap();
    assert_eq!(d.import_partition(&moved).unwrap(), 2);
    assert_eq!(d.len(), 2);
    assert!(d.get(1u64, 0).is_none(), "evicted for the import");
}
