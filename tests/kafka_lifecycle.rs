//! The producer lifecycle in a `Semantics::Kafka` store: Kafka's
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
    AppendOptions, Batch, BatchOutcome, Error, ManualClock, Marker, Origin, OutOfOrderReason,
    ProducerId, ProducerStateStore, Semantics, StoreOptions, TxnStateReason, VerificationState,
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

/// A producer, its epoch, a data batch (first, last, transactional) or a
/// marker (commit), and the offset.
type Step = (u64, i16, Option<(i32, i32, bool)>, Option<bool>, i64);

/// Data batches and markers over three producers and two partitions, at
/// growing offsets (a log's), with aborts, epoch bumps and plain batches.
fn stream(seed: u64, n: usize) -> Vec<Step> {
    let mut s = seed | 1;
    let mut next = [0i32; 3];
    let mut epoch = [0i16; 3];
    let mut offset = 0i64;
    let mut out = Vec::new();
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let p = (s % 3) as usize;
        match (s >> 8) % 6 {
            0 | 1 => {
                let commit = s >> 20 & 1 == 0;
                if s >> 21 & 3 == 0 {
                    epoch[p] += 1;
                    next[p] = 0;
                }
                out.push((p as u64, epoch[p], None, Some(commit), offset));
                offset += 1;
            }
            _ => {
                let len = ((s >> 12) % 3) as i32;
                let txn = p != 2 || s >> 30 & 1 == 1;
                out.push((
                    p as u64,
                    epoch[p],
                    Some((next[p], next[p] + len, txn)),
                    None,
                    offset,
                ));
                next[p] += len + 1;
                offset += i64::from(len) + 1;
            }
        }
    }
    out
}

/// Producer 1 (partition 1) has a name, the others (partition 0) numeric
/// ids: the log holds both kinds of every record, and a partition's
/// truncation passes over the other partition's records of either kind.
fn producer(pid: u64) -> ProducerId {
    if pid == 1 {
        ProducerId::named("producer one")
    } else {
        ProducerId::numeric(pid)
    }
}

fn on_engine(
    m: &mut producer_state::ProducerStateManager,
    &(n, epoch, data, marker, offset): &Step,
) {
    let (pid, p) = (producer(n), (n % 2) as i32);
    if let Some((first, last, t)) = data {
        let o = if t { txn() } else { AppendOptions::client() };
        m.append_with(
            pid.clone(),
            p,
            epoch,
            Batch::new(first, last, offset, offset),
            o,
        )
        .unwrap();
    }
    if let Some(commit) = marker {
        let mk = if commit {
            Marker::commit
        } else {
            Marker::abort
        };
        m.append_marker(pid, p, epoch, mk(1, offset, offset), Origin::Coordinator)
            .unwrap();
    }
}

fn on_store(s: &ProducerStateStore, &(n, epoch, data, marker, offset): &Step) {
    let (pid, p) = (producer(n), (n % 2) as i32);
    if let Some((first, last, t)) = data {
        let o = if t { txn() } else { AppendOptions::client() };
        s.append_with(
            pid.clone(),
            p,
            epoch,
            Batch::new(first, last, offset, offset),
            o,
        )
        .unwrap();
    }
    if let Some(commit) = marker {
        let mk = if commit {
            Marker::commit
        } else {
            Marker::abort
        };
        s.append_marker(pid, p, epoch, mk(1, offset, offset), Origin::Coordinator)
            .unwrap();
    }
}

fn same_as(s: &ProducerStateStore, m: &producer_state::ProducerStateManager) -> bool {
    (0..2).all(|p| {
        let mut ids: Vec<_> = m.iter().filter(|e| e.1 == p).map(|e| e.0).collect();
        ids.sort();
        let want: Vec<_> = ids
            .into_iter()
            .map(|id| (id.clone(), m.kafka_state(id, p).unwrap()))
            .collect();
        s.kafka_producers(p) == want
            && s.aborted_transactions(p) == m.aborted_transactions(p)
            && s.first_unstable_offset(p) == m.first_unstable_offset(p)
    })
}

#[test]
fn truncate_to_is_kafkas_truncate_and_reload_and_survives_reopen() {
    let steps = stream(0x9e37_79b9, 120);
    let end = steps.last().map(|s| s.4 + 3).unwrap();
    let mut checked = 0;
    for x in (0..end).step_by(7).chain([end / 2 + 1]) {
        let fs = SimFs::new();
        let clock = Arc::new(ManualClock::new(0));
        let o = opts(&fs, &clock)
            .producer_expiration(None)
            .snapshot_every_records(Some(25))
            .keep_snapshots(64);
        let s = ProducerStateStore::open_with(dir(), o.clone()).unwrap();
        for st in &steps {
            on_store(&s, st);
        }
        let high = steps
            .iter()
            .map(|s| s.4 + s.2.map_or(0, |d| i64::from(d.1 - d.0)))
            .max();
        if x > high.unwrap() + 1 {
            assert!(matches!(
                s.truncate_to(x),
                Err(Error::TruncateAboveEnd { .. })
            ));
            continue;
        }
        s.truncate_to(x).unwrap();
        let mut m = producer_state::ProducerStateManager::with_semantics(Semantics::Kafka);
        for st in steps.iter().filter(|st| st.4 < x) {
            on_engine(&mut m, st);
        }
        assert!(same_as(&s, &m), "truncated to {x}");
        drop(s);
        let s = ProducerStateStore::open_with(dir(), o).unwrap();
        assert!(same_as(&s, &m), "reopened after truncating to {x}");
        // The log goes on from the offset, and a second truncation below
        // the first passes over it.
        for st in steps.iter().filter(|st| st.4 >= x).take(5) {
            on_store(&s, st);
            on_engine(&mut m, st);
        }
        assert!(same_as(&s, &m), "appended after truncating to {x}");
        if x >= 10 {
            s.truncate_to(x - 10).unwrap();
            let mut m = producer_state::ProducerStateManager::with_semantics(Semantics::Kafka);
            for st in steps.iter().filter(|st| st.4 < x - 10) {
                on_engine(&mut m, st);
            }
            assert!(same_as(&s, &m), "truncated again to {}", x - 10);
        }
        checked += 1;
    }
    assert!(checked > 10);
}

/// `truncate_partition_to(p, x)` gives partition `p` the state of its
/// history below `x` (Kafka's `truncateAndReload` of that partition), and
/// leaves the other partition exactly as it was: the engine fed the
/// other partition's whole stream and this one's below `x` agrees, before
/// and after a reopen, after more appends, and after a second truncation
/// (of this partition below the first, then of the store as a whole).
#[test]
fn truncate_partition_to_is_truncate_and_reload_of_that_partition_alone() {
    let steps = stream(0x51_7cc1, 140);
    let part = |st: &Step| (st.0 % 2) as i32;
    let end_of = |p: i32| {
        steps
            .iter()
            .filter(|st| part(st) == p)
            .map(|s| s.4)
            .max()
            .map_or(0, |h| h + 1)
    };
    let mut checked = 0;
    for p in 0..2 {
        let end = end_of(p);
        for x in (0..end).step_by(9).chain([end / 2 + 1, end]) {
            let fs = SimFs::new();
            let clock = Arc::new(ManualClock::new(0));
            let o = opts(&fs, &clock)
                .producer_expiration(None)
                .snapshot_every_records(Some(25))
                .keep_snapshots(64);
            let s = ProducerStateStore::open_with(dir(), o.clone()).unwrap();
            for st in &steps {
                on_store(&s, st);
            }
            let other_end = s.partition_end_offset(1 - p);
            assert_eq!(s.partition_end_offset(p), end);
            assert!(matches!(
                s.truncate_partition_to(p, end + 1),
                Err(Error::TruncateAboveEnd { .. })
            ));
            s.truncate_partition_to(p, x).unwrap();
            let kept = |st: &&Step| part(st) != p || st.4 < x;
            let mut m = producer_state::ProducerStateManager::with_semantics(Semantics::Kafka);
            for st in steps.iter().filter(kept) {
                on_engine(&mut m, st);
            }
            assert!(same_as(&s, &m), "partition {p} truncated to {x}");
            assert_eq!(s.partition_end_offset(p), x);
            assert_eq!(s.partition_end_offset(1 - p), other_end);
            drop(s);
            let s = ProducerStateStore::open_with(dir(), o.clone()).unwrap();
            assert!(same_as(&s, &m), "reopened: partition {p} truncated to {x}");
            assert_eq!(s.partition_end_offset(p), x);
            // The partition's log goes on from the offset.
            for st in steps.iter().filter(|st| part(st) == p && st.4 >= x).take(5) {
                on_store(&s, st);
                on_engine(&mut m, st);
            }
            assert!(same_as(&s, &m), "appended after {x}");
            if x >= 10 {
                s.truncate_partition_to(p, x - 10).unwrap();
                let mut m = producer_state::ProducerStateManager::with_semantics(Semantics::Kafka);
                for st in steps.iter().filter(|st| part(st) != p || st.4 < x - 10) {
                    on_engine(&mut m, st);
                }
                assert!(
                    same_as(&s, &m),
                    "partition {p} truncated again to {}",
                    x - 10
                );
                // A store-wide truncation passes over the partition's
                // groups that reach it, and applies those below it.
                let all = x - 5;
                s.truncate_to(all).unwrap();
                let mut m = producer_state::ProducerStateManager::with_semantics(Semantics::Kafka);
                for st in steps
                    .iter()
                    .filter(|st| st.4 < all && (part(st) != p || st.4 < x - 10))
                {
                    on_engine(&mut m, st);
                }
                assert!(same_as(&s, &m), "then the store truncated to {all}");
                drop(s);
                let s = ProducerStateStore::open_with(dir(), o).unwrap();
                assert!(same_as(&s, &m), "reopened after both");
            }
            checked += 1;
        }
    }
    assert!(checked > 10);
}

/// What a Kafka-mode store shows of partitions 0 and 1.
type View = Vec<(
    Vec<(
        producer_state::ProducerId,
        producer_state::KafkaProducerState,
    )>,
    Vec<producer_state::AbortedTxn>,
    Option<i64>,
)>;

/// A partition's truncation reads on through the records of other kinds
/// that touch its partition (an expiration of one of its producers, far
/// after its own appends) and stops before those that touch others alone
/// (another partition's truncation and removal): the expired producer
/// stays expired, as when the store's own bookkeeping says so, and as
/// when recovery rebuilt it at a reopen.
#[test]
fn a_partition_truncation_reads_through_what_touches_its_partition() {
    for reopen in [false, true] {
        let fs = SimFs::new();
        let clock = Arc::new(ManualClock::new(DAY));
        let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
        let batch = |pid: u64, p: i32, seq: i32, ts: i64| {
            let b = Batch::new(seq, seq, i64::from(seq), ts);
            assert!(s.append_batch(pid, p, 0, b).unwrap().is_accepted());
        };
        // Partition 0: producer 1, old; partition 1: producer 2, recent.
        for seq in 0..10 {
            batch(1, 0, seq, 1_000);
        }
        for seq in 0..50 {
            batch(2, 1, seq, 2 * DAY);
        }
        clock.set(DAY + 2_000);
        assert_eq!(s.expire_now().unwrap(), 1, "producer 1");
        // After it: partition 1 and 2 appended to, 2 truncated, 3 removed.
        for seq in 50..100 {
            batch(2, 1, seq, 2 * DAY);
        }
        for seq in 0..20 {
            batch(3, 2, seq, 2 * DAY);
            batch(4, 3, seq, 2 * DAY);
        }
        s.truncate_partition_to(2, 10).unwrap();
        s.remove_partition(3).unwrap();
        let s = if reopen {
            drop(s);
            ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap()
        } else {
            s
        };
        s.truncate_partition_to(0, 5).unwrap();
        assert!(s.kafka_state(1u64, 0).is_none(), "reopen {reopen}: expired");
        assert!(s.was_removed(1u64, 0));
        assert_eq!(s.partition_end_offset(0), 5);
        assert_eq!(s.kafka_state(2u64, 1).map(|k| k.last_sequence), Some(99));
        assert_eq!(s.kafka_state(3u64, 2).map(|k| k.last_sequence), Some(9));
        assert!(s.kafka_producers(3).is_empty());
    }
    // A removed partition appended to again at higher offsets, then cut
    // below them: the replay reads on through the removal (its only
    // record after the first producer's appends that touches the
    // partition), so the removal stays as it was. The first producer's
    // 256 appends fill one run of the bookkeeping, so the second's do
    // not carry the replay past the removal.
    for reopen in [false, true] {
        let fs = SimFs::new();
        let clock = Arc::new(ManualClock::new(DAY));
        let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
        for (pid, base, n) in [(1u64, 0, 256), (2, 1_000, 10)] {
            if pid == 2 {
                s.remove_partition(5).unwrap();
            }
            for seq in 0..n {
                let b = Batch::new(seq, seq, base + i64::from(seq), DAY);
                assert!(s.append_batch(pid, 5, 0, b).unwrap().is_accepted());
            }
        }
        let s = if reopen {
            drop(s);
            ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap()
        } else {
            s
        };
        s.truncate_partition_to(5, 500).unwrap();
        assert!(s.kafka_producers(5).is_empty(), "reopen {reopen}");
    }
}

fn view(s: &ProducerStateStore) -> View {
    (0..2)
        .map(|p| {
            (
                s.kafka_producers(p),
                s.aborted_transactions(p),
                s.first_unstable_offset(p),
            )
        })
        .collect()
}

#[test]
fn kafka_mode_truncation_out_of_range_is_refused_and_changes_nothing() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(0));
    let o = opts(&fs, &clock)
        .producer_expiration(None)
        .snapshot_every_records(Some(50))
        .segment_size(2048);
    let s = ProducerStateStore::open_with(dir(), o.clone()).unwrap();
    // Four producers on two partitions, each a transaction of three
    // batches then a marker (every third an ABORT), one offset each.
    let mut offset = 0i64;
    let mut seq = [0i32; 4];
    for round in 0..60u64 {
        let pid = round % 4;
        let p = (round % 2) as i32;
        for _ in 0..3 {
            let b = Batch::new(seq[pid as usize], seq[pid as usize], offset, offset);
            assert!(s.append_with(pid, p, 0, b, txn()).unwrap().is_accepted());
            seq[pid as usize] += 1;
            offset += 1;
        }
        let m = if round % 3 == 0 {
            Marker::abort(0, offset, offset)
        } else {
            Marker::commit(0, offset, offset)
        };
        s.append_marker(pid, p, 0, m, Origin::Coordinator).unwrap();
        offset += 1;
    }
    // One transaction left open.
    let b = Batch::new(seq[1], seq[1], offset, offset);
    assert!(s.append_with(1u64, 1, 0, b, txn()).unwrap().is_accepted());
    let end = offset + 1;
    assert!(s.stats().snapshots_written >= 4);
    let before = view(&s);
    assert!(!before[0].1.is_empty() && before[1].2.is_some());
    let written = s.stats().records_written;
    // Above the end: refused with the end, nothing written or changed.
    match s.truncate_to(end + 1) {
        Err(Error::TruncateAboveEnd { offset: o, end: e }) => assert_eq!((o, e), (end + 1, end)),
        other => panic!("{other:?}"),
    }
    // At the end: nothing to undo, nothing written.
    s.truncate_to(end).unwrap();
    // Below every retained snapshot: refused, and the error says how far
    // back it can go.
    let lowest = match s.truncate_to(3) {
        Err(Error::TruncateBelowHistory { offset: 3, lowest }) => lowest,
        other => panic!("{other:?}"),
    };
    assert!(lowest > 3 && lowest < end, "{lowest}");
    assert_eq!(s.stats().records_written, written);
    assert_eq!(view(&s), before);
    // Nothing reached the log: a reopen shows the same state.
    drop(s);
    let s = ProducerStateStore::open_with(dir(), o.clone()).unwrap();
    assert_eq!(view(&s), before);
    // The offset the error named is reachable.
    s.truncate_to(lowest).unwrap();
    assert_ne!(view(&s), before);
    let cut = view(&s);
    drop(s);
    let s = ProducerStateStore::open_with(dir(), o).unwrap();
    assert_eq!(view(&s), cut);
}

#[test]
fn a_crash_in_a_large_kafka_expiration_keeps_a_prefix_of_its_records() {
    // The expiration's group may come after a segment roll, whose
    // operations come first: crash at each of the next operations in turn
    // until one is the fsync after the group's write (its bytes unsynced).
    let partial: usize = (1..=12).map(crash_a_large_expiration_at).sum();
    assert!(partial > 0, "no image kept only the first record");
}

/// Crashes `at` operations into a large Kafka-mode expiration and checks
/// that every crash image holds a prefix of its records; returns how many
/// images kept some of them but not all.
fn crash_a_large_expiration_at(at: u64) -> usize {
    use producer_state::fs::{Fault, Unsynced};
    use producer_state::{AppendRequest, ProducerId};
    // 6,000 plain producers on partition 0: their removals take two
    // kind-7 records (64 KiB each at most).
    const N: u64 = 6_000;
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(0));
    let o = |fs: &SimFs| {
        opts(fs, &clock)
            .segment_size(1 << 20)
            .snapshot_every_records(None)
    };
    let s = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let requests: Vec<_> = (0..N)
        .map(|pid| AppendRequest::batch(pid, 0, 0, Batch::new(0, 0, pid as i64, 0)))
        .collect();
    assert!(s.append_all(&requests).iter().all(|r| r.is_ok()));
    clock.set(DAY);
    fs.set_fault(fs.ops() + at, Fault::Crash);
    if s.expire_now().is_ok() {
        // The expiration was done before operation `at`.
        return 0;
    }
    drop(s);
    let mut partial = 0;
    for seed in 0..40u64 {
        let image = fs.crash_image(Unsynced::TornPrefix(seed));
        let s = ProducerStateStore::open_with(dir(), o(&image)).unwrap();
        // The keys go in id order: what survives is every key from some
        // id on (a prefix of the records replayed, none decided again).
        let left: Vec<u64> = s
            .kafka_producers(0)
            .into_iter()
            .map(|(id, _)| id.as_numeric().unwrap())
            .collect();
        let from = N - left.len() as u64;
        assert_eq!(
            left,
            (from..N).collect::<Vec<_>>(),
            "crash at +{at}, seed {seed}"
        );
        assert!(from == 0 || from > 4_000, "whole records: {from}");
        partial += usize::from(from > 0 && from < N);
        assert_eq!(s.was_removed(ProducerId::numeric(0), 0), from > 0);
    }
    partial
}

// KIP-890's verification states in the store. Kafka keeps them in memory
// only (ProducerStateManager.java, trunk 1eb7644349cb: the
// `verificationStates` map, line 88; `writeSnapshot`, lines 667-677, has
// no field for them), so the store neither logs nor snapshots them.

/// A producer with a committed transaction and a verified retry of its
/// batch: a DUPLICATE, which leaves the verification state {lowest 0}.
fn verified_duplicate(s: &ProducerStateStore, pid: u64, partition: i32, ts: i64) {
    assert!(
        s.append_with(pid, partition, 0, Batch::new(0, 1, 10, ts), txn())
            .unwrap()
            .is_accepted()
    );
    s.append_marker(
        pid,
        partition,
        0,
        Marker::commit(0, 12, ts),
        Origin::Coordinator,
    )
    .unwrap();
    assert!(matches!(
        s.append_with(pid, partition, 0, Batch::new(0, 1, 13, ts + 1), txn())
            .unwrap(),
        BatchOutcome::Duplicate { .. }
    ));
}

#[test]
fn verification_states_are_never_logged_and_a_reopen_forgets_them() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(DAY));
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    s.append_with(1u64, 0, 0, Batch::new(0, 1, 10, 1_000), txn())
        .unwrap();
    s.append_marker(
        1u64,
        0,
        0,
        Marker::commit(0, 12, 1_001),
        Origin::Coordinator,
    )
    .unwrap();
    let written = s.stats().records_written;
    // What changes only the verification states writes nothing: a verified
    // duplicate, an explicit verification, a refusal because of one.
    assert!(matches!(
        s.append_with(1u64, 0, 0, Batch::new(0, 1, 13, 1_002), txn())
            .unwrap(),
        BatchOutcome::Duplicate { .. }
    ));
    assert!(s.start_transaction_verification(2u64, 0, 3, 5).unwrap());
    assert_eq!(
        s.append_batch(1u64, 0, 0, Batch::new(2, 2, 13, 1_003))
            .unwrap(),
        BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::AboveVerifiedSequence {
                first_sequence: 2,
                lowest_sequence: 0
            }
        }
    );
    assert_eq!(s.stats().records_written, written, "nothing logged");
    assert_eq!(
        s.verification_state(1u64, 0),
        Some(VerificationState::new(1_002, 0, 0)),
        "born at the verified batch's timestamp"
    );
    assert_eq!(
        s.verification_state(2u64, 0),
        Some(VerificationState::new(DAY, 5, 3)),
        "born at the store clock's reading"
    );
    // Neither a snapshot nor the log carries them across a reopen ...
    s.snapshot().unwrap();
    s.close().unwrap();
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    assert!(s.verification_states().is_empty());
    // ... so the batch refused before the restart is accepted after it, as
    // a restarted Kafka broker accepts it (2 follows 1).
    assert!(
        s.append_batch(1u64, 0, 0, Batch::new(2, 2, 13, 1_003))
            .unwrap()
            .is_accepted()
    );
}

#[test]
fn verification_states_outlive_a_truncation_expire_by_age_and_go_with_their_partition() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(DAY));
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    verified_duplicate(&s, 1, 0, DAY);
    clock.set(DAY + 5_000);
    assert!(s.start_transaction_verification(3u64, 1, 0, 0).unwrap());
    // Truncating below the marker opens the transaction again; Kafka's
    // truncateAndReload (ProducerStateManager.java 355-375) and
    // truncateFullyAndStartAt (510-520) leave verification states alone.
    s.truncate_to(12).unwrap();
    assert_eq!(
        s.kafka_state(1u64, 0).unwrap().current_txn_first_offset,
        Some(10)
    );
    assert_eq!(
        s.verification_state(1u64, 0),
        Some(VerificationState::new(DAY + 1, 0, 0))
    );
    // removeExpiredProducers (338-345): a state expires a day after it was
    // made, whatever its producer does (producer 1's transaction is open,
    // so the producer stays).
    clock.set(2 * DAY);
    s.expire_now().unwrap();
    assert!(s.verification_state(1u64, 0).is_some(), "a day less 1 ms");
    clock.set(2 * DAY + 1);
    s.expire_now().unwrap();
    assert_eq!(s.verification_state(1u64, 0), None);
    assert!(s.kafka_state(1u64, 0).is_some());
    assert!(s.verification_state(3u64, 1).is_some(), "made later");
    // A removed partition's state goes with it.
    s.remove_partition(1).unwrap();
    assert!(s.verification_states().is_empty());
}

/// `transaction.partition.verification.enable=false`: ReplicaManager skips
/// the verification (ReplicaManager.scala 1108-1115) and UnifiedLog does
/// not require it (UnifiedLog.scala batchMissingRequiredVerification,
/// 1085-1088).
#[test]
fn with_verification_off_none_is_needed_and_none_is_started() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(DAY));
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock).transaction_verification(false))
        .unwrap();
    let unverified = AppendOptions::client().transactional();
    assert!(
        s.append_with(1u64, 0, 0, Batch::new(0, 1, 10, DAY), unverified)
            .unwrap()
            .is_accepted()
    );
    s.append_marker(1u64, 0, 0, Marker::commit(0, 12, DAY), Origin::Coordinator)
        .unwrap();
    assert!(matches!(
        s.append_with(1u64, 0, 0, Batch::new(0, 1, 13, DAY), txn())
            .unwrap(),
        BatchOutcome::Duplicate { .. }
    ));
    assert!(!s.start_transaction_verification(1u64, 0, 0, 0).unwrap());
    assert!(s.verification_states().is_empty());
    assert!(
        s.append_batch(1u64, 0, 0, Batch::new(2, 2, 13, DAY))
            .unwrap()
            .is_accepted()
    );
    // The default is Kafka's: on.
    s.close().unwrap();
    let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock)).unwrap();
    assert_eq!(
        s.append_with(2u64, 0, 0, Batch::new(0, 0, 14, DAY), unverified)
            .unwrap(),
        BatchOutcome::InvalidTxnState {
            reason: TxnStateReason::NotVerified
        }
    );
}
