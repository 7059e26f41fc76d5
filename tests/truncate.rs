//! `truncate_to(offset)`: the state afterwards is that of the history
//! with every append at or above the offset removed (a single-sequence
//! append counting at its log position), computed from a retained
//! snapshot and the log, logged as one atomic group; errors change
//! nothing.

mod common;

use std::sync::Arc;

use common::model::{Model, ModelConfig};
use common::store_util::{diff, dir, matches, sim_opts};
use producer_state::fs::{SimFs, Unsynced};
use producer_state::{
    AppendRequest, Batch, Error, FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions,
};

const T0: i64 = 1_700_000_000_000;

fn opts(fs: &SimFs) -> StoreOptions {
    sim_opts(fs)
        .clock(Arc::new(ManualClock::new(T0)))
        .snapshot_every_records(None)
}

/// Appends `reqs` to the store and the model (the model learns each
/// single append's position from the store).
fn append(s: &ProducerStateStore, m: &mut Model, reqs: &[AppendRequest]) {
    for r in reqs {
        m.next_pos = s.next_position();
        let got = s.append_request(r).unwrap();
        assert_eq!(got, m.append_at(r, T0), "{r:?}");
    }
}

fn batch(k: u64, p: i32, first: i32, n: i32, offset: i64) -> AppendRequest {
    AppendRequest::batch(
        k,
        p,
        0,
        Batch::new(first, first + n - 1, offset, T0 + offset),
    )
}

#[test]
fn keys_roll_back_to_their_older_batches_and_vanish_if_all_were_cut() {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let mut m = Model::default();
    // Key 1: 20 batches of 2 records at offsets 0, 10, ..., 190 (more than
    // the 5 retained: the older ones must come back from the log).
    let mut reqs: Vec<AppendRequest> = (0..20)
        .map(|i| batch(1, 0, 2 * i, 2, 10 * i64::from(i)))
        .collect();
    // Key 2 starts at offset 150; key 3 has a new epoch at 120.
    reqs.push(batch(2, 0, 0, 1, 150));
    reqs.push(batch(3, 1, 0, 1, 5));
    reqs.push(AppendRequest::batch(3u64, 1, 1, Batch::new(0, 0, 120, T0)));
    append(&s, &mut m, &reqs);
    let before = s.stats().truncations;
    s.truncate_to(100).unwrap();
    assert_eq!(m.truncate(100).unwrap(), 3);
    assert!(matches(&s, &m), "{}", diff(&s, &m));
    let e = s.get(1u64, 0).unwrap();
    assert_eq!(e.last_sequence(), 19);
    let firsts: Vec<i32> = e.retained_batches().map(|b| b.first_sequence).collect();
    assert_eq!(
        firsts,
        [10, 12, 14, 16, 18],
        "the window of the older batches"
    );
    assert!(s.get(2u64, 0).is_none());
    assert_eq!(s.get(3u64, 1).unwrap().epoch(), 0, "the older epoch");
    assert_eq!(s.stats().truncations, before + 1);
    // The log continues at the offset: a producer resends what was cut.
    append(
        &s,
        &mut m,
        &[batch(1, 0, 20, 2, 100), batch(2, 0, 0, 1, 102)],
    );
    drop(s);
    // Durable: recovered exactly, the group replayed as logged.
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert!(matches(&s, &m), "{}", diff(&s, &m));
}

#[test]
fn single_appends_are_cut_at_their_log_position() {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let mut m = Model::default();
    let reqs: Vec<AppendRequest> = (0..30)
        .map(|i| AppendRequest::single(i % 3, 0, 0, (i / 3) as i32))
        .collect();
    append(&s, &mut m, &reqs);
    assert_eq!(s.next_position(), 30);
    s.truncate_to(13).unwrap();
    m.truncate(13).unwrap();
    assert!(matches(&s, &m), "{}", diff(&s, &m));
    // Positions 0..13: keys 0 and 1 have 5 appends (seq 0..4), key 2 has 4.
    assert_eq!(s.get(0u64, 0).unwrap().last_sequence(), 4);
    assert_eq!(s.get(2u64, 0).unwrap().last_sequence(), 3);
}

#[test]
fn a_second_truncation_below_or_above_the_first_removes_exactly_the_cut() {
    for second in [60, 95, 110] {
        let fs = SimFs::new();
        let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
        let mut m = Model::default();
        let first: Vec<AppendRequest> = (0..15)
            .map(|i| batch(7, 0, i, 1, 10 * i64::from(i)))
            .collect();
        append(&s, &mut m, &first);
        s.truncate_to(100).unwrap();
        m.truncate(100).unwrap();
        // The new leader's batches reuse offsets from 100 on, and other
        // sequences: the earlier group's key states must not bring back
        // what was cut.
        let after: Vec<AppendRequest> = (0..3)
            .map(|i| batch(7, 0, 10 + i, 1, 100 + 5 * i64::from(i)))
            .collect();
        append(&s, &mut m, &after);
        append(&s, &mut m, &[batch(8, 0, 0, 1, 101)]);
        s.truncate_to(second).unwrap();
        m.truncate(second).unwrap();
        assert!(matches(&s, &m), "second {second}: {}", diff(&s, &m));
        drop(s);
        let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
        assert!(
            matches(&s, &m),
            "second {second}, reopened: {}",
            diff(&s, &m)
        );
    }
}

#[test]
fn truncation_reaches_back_through_retained_snapshots_and_refuses_beyond() {
    let fs = SimFs::new();
    let o = |fs: &SimFs| opts(fs).snapshot_every_records(Some(50)).segment_size(2048);
    let s = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let mut m = Model::default();
    let reqs: Vec<AppendRequest> = (0..400)
        .map(|i| batch(i % 9, 0, (i / 9) as i32, 1, i as i64))
        .collect();
    append(&s, &mut m, &reqs);
    assert!(s.stats().snapshots_written >= 6);
    // Above the end: refused, nothing changed.
    let written = s.stats().records_written;
    assert!(matches!(
        s.truncate_to(401),
        Err(Error::TruncateAboveEnd {
            offset: 401,
            end: 400
        })
    ));
    // At the end: nothing to remove.
    s.truncate_to(400).unwrap();
    assert_eq!(s.stats().records_written, written);
    // Below the oldest retained snapshot (positions before it are gone
    // from the log): refused, nothing changed, and the error says how far
    // it can go.
    let lowest = match s.truncate_to(3) {
        Err(Error::TruncateBelowHistory { offset: 3, lowest }) => lowest,
        other => panic!("{other:?}"),
    };
    assert!(lowest > 3 && lowest < 400, "{lowest}");
    assert_eq!(s.stats().records_written, written, "nothing written");
    assert!(matches(&s, &m), "{}", diff(&s, &m));
    // Within reach: exactly the model.
    s.truncate_to(lowest).unwrap();
    m.truncate(lowest).unwrap();
    assert!(matches(&s, &m), "{}", diff(&s, &m));
    let s2 = {
        drop(s);
        ProducerStateStore::open_with(dir(), o(&fs)).unwrap()
    };
    assert!(matches(&s2, &m), "{}", diff(&s2, &m));
}

#[test]
fn truncation_keeps_expirations_and_undoes_nothing_else() {
    // Under `Never` too: the truncation is made durable before it returns.
    let fs = SimFs::new();
    let clock = ManualClock::new(T0);
    let o = |fs: &SimFs| {
        opts(fs)
            .fsync(FsyncPolicy::Never)
            .clock(Arc::new(clock.clone()))
            .producer_expiration(Some(std::time::Duration::from_secs(1)))
    };
    let s = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let mut m = Model {
        config: ModelConfig {
            expiration_ms: Some(1000),
            ..ModelConfig::default()
        },
        ..Model::default()
    };
    let now = |c: &ManualClock| producer_state::Clock::now_ms(c);
    for (i, r) in [batch(1, 0, 0, 1, 0), batch(2, 0, 0, 1, 1)]
        .iter()
        .enumerate()
    {
        m.next_pos = s.next_position();
        assert_eq!(
            s.append_request(r).unwrap(),
            m.append_at(r, now(&clock)),
            "{i}"
        );
    }
    clock.advance(std::time::Duration::from_secs(10));
    assert_eq!(s.expire_now().unwrap(), m.expire(now(&clock)));
    m.next_pos = s.next_position();
    let r = batch(1, 0, 0, 1, 5);
    assert_eq!(s.append_request(&r).unwrap(), m.append_at(&r, now(&clock)));
    s.truncate_to(3).unwrap();
    m.truncate(3).unwrap();
    assert!(matches(&s, &m), "{}", diff(&s, &m));
    assert!(
        s.is_empty(),
        "the expirations stay; the later append is cut"
    );
    let img = fs.crash_image(Unsynced::Drop);
    drop(s);
    let s = ProducerStateStore::open_with(dir(), o(&img)).unwrap();
    assert!(matches(&s, &m), "{}", diff(&s, &m));
}

#[test]
fn truncation_undoes_an_import_whose_offsets_it_reaches() {
    let (fa, fb) = (SimFs::new(), SimFs::new());
    let a = ProducerStateStore::open_with(dir(), opts(&fa)).unwrap();
    a.append_request(&batch(1, 4, 0, 2, 500)).unwrap();
    let export = a.export_partition(4).unwrap();
    let b = ProducerStateStore::open_with(dir(), opts(&fb)).unwrap();
    let mut m = Model::default();
    append(&b, &mut m, &[batch(2, 0, 0, 1, 10), batch(2, 0, 1, 1, 20)]);
    m.next_pos = b.next_position();
    b.import_partition(&export).unwrap();
    m.import(
        export
            .iter()
            .map(|i| {
                let e = common::model::ModelEntry {
                    epoch: i.epoch(),
                    last: i.last_sequence(),
                    retained: Some(
                        i.retained_batches()
                            .map(|b| (b.first_sequence, b.last_sequence, b.metadata))
                            .collect(),
                    ),
                    act: i.last_activity,
                };
                ((i.producer_id.clone(), i.partition), e)
            })
            .collect(),
    );
    assert!(matches(&b, &m), "{}", diff(&b, &m));
    assert_eq!(b.end_offset(), 501);
    // At the end: nothing to undo.
    b.truncate_to(501).unwrap();
    assert!(b.get(1u64, 4).is_some());
    // Reaching its offset (500) undoes the import whole; the appends
    // below stay.
    m.truncate(300).unwrap();
    b.truncate_to(300).unwrap();
    assert!(matches(&b, &m), "{}", diff(&b, &m));
    assert!(b.get(1u64, 4).is_none(), "the import is undone");
    assert_eq!(b.get(2u64, 0).unwrap().last_sequence(), 1);
    m.truncate(15).unwrap();
    b.truncate_to(15).unwrap();
    assert!(matches(&b, &m), "{}", diff(&b, &m));
    assert_eq!(b.get(2u64, 0).unwrap().last_sequence(), 0);
}

/// Offsets in a window need not grow (a client resending an old batch as
/// the sequence's next after a wrap, offsets from another log): an import
/// counts at the highest offset any of its batches holds, not its keys'
/// newest, so a truncation leaves no batch at or above its offset.
#[test]
fn an_import_counts_at_its_highest_batch_offset_even_if_not_its_newest() {
    let (fa, fb) = (SimFs::new(), SimFs::new());
    let a = ProducerStateStore::open_with(dir(), opts(&fa)).unwrap();
    // The newest batch (offset 300) is below an older one (700).
    a.append_request(&batch(1, 4, 0, 2, 700)).unwrap();
    a.append_request(&batch(1, 4, 2, 1, 300)).unwrap();
    let export = a.export_partition(4).unwrap();
    assert_eq!(export.high_offset(), 700);
    let b = ProducerStateStore::open_with(dir(), opts(&fb)).unwrap();
    b.append_request(&batch(2, 0, 0, 1, 10)).unwrap();
    b.import_partition(&export).unwrap();
    assert_eq!(b.end_offset(), 701);
    // 500 is above the newest batch but below the one at 700: the import
    // is undone whole, the append below stays.
    b.truncate_to(500).unwrap();
    assert!(b.get(1u64, 4).is_none(), "the import is undone");
    assert_eq!(b.get(2u64, 0).unwrap().last_sequence(), 0);
    for info in b.producers(0) {
        assert!(
            info.retained_batches()
                .all(|r| r.metadata.is_none_or(|m| m.offset < 500))
        );
    }
}

/// A partition's truncation passes over other partitions' records unread,
/// but never the append an accept-any record belongs to: the permission
/// is that append's, and handed to the next one read it would bring back
/// an append of this partition that no longer applies.
#[test]
fn a_partition_truncation_keeps_accept_any_with_the_append_it_belongs_to() {
    let fs = SimFs::new();
    let o = opts(&fs).unknown_producer(producer_state::UnknownProducer::AcceptAny);
    let s = ProducerStateStore::open_with(dir(), o).unwrap();
    // Partition 0: key 1 at offset 100, then its next batch at offset 50
    // (a client's offsets need not grow).
    s.append_request(&batch(1, 0, 0, 1, 100)).unwrap();
    // Partition 1: key 9 unknown, accepted at sequence 5 (an accept-any
    // record, then the append).
    s.append_request(&batch(9, 1, 5, 1, 0)).unwrap();
    s.append_request(&batch(1, 0, 1, 1, 50)).unwrap();
    assert_eq!(s.get(1u64, 0).map(|e| e.last_sequence()), Some(1));
    // Cutting partition 0 at 80 removes key 1's first batch; its second
    // (sequence 1 of a key without state, logged without permission) no
    // longer applies.
    s.truncate_partition_to(0, 80).unwrap();
    assert_eq!(s.get(1u64, 0), None);
    assert_eq!(s.get(9u64, 1).map(|e| e.last_sequence()), Some(5));
}
