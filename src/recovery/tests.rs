//! Unit tests of `recovery`, in a file of their own beside it (they see its
//! private items through `use super::*`).

use super::*;
use crate::batch::AppendRequest;
use crate::directory::names;
use crate::engine::map::hash_key;
use crate::fs::SimFs;
use crate::wal::frame::seal;
use crate::wal::record::encode;
use std::path::PathBuf;

/// A store directory holding one segment of `n` single-sequence appends
/// over 1,000 keys, key `i % 1000` at sequence `i / 1000`, except that
/// append `bad` (if any) skips a sequence: it does not apply. Written
/// in 64 KiB groups, `packed` as the store writes them (many appends
/// per record), else one append per record. Returns the offset and the
/// first position of the record holding `bad`.
fn log(n: u64, bad: Option<u64>, packed: bool) -> (SimFs, PathBuf, u64, u64) {
    let fs = SimFs::new();
    let dir = PathBuf::from("/s");
    fs.create_dir_all(&dir).unwrap();
    let mut bytes = segment::header(
        0,
        segment::Ids { store: 1, salt: 2 },
        segment::APPENDED_VERSION,
    );
    let seed = crate::wal::frame::seed(&bytes[12..36]);
    let (mut bad_offset, mut bad_record) = (0, 0);
    let mut group = Vec::new();
    let mut open = usize::MAX;
    let mut record_start = 0;
    for i in 0..n {
        let seq = (i / 1000) as i32 + i32::from(Some(i) == bad);
        if !packed {
            open = usize::MAX;
        }
        let before = open;
        encode(
            &mut group,
            &mut open,
            &AppendRequest::single(i % 1000, 0, 0, seq),
        );
        if open != before || !packed {
            record_start = i;
        }
        if Some(i) == bad {
            bad_offset = (bytes.len() + open) as u64;
            bad_record = record_start;
        }
        if group.len() >= 64 << 10 || i + 1 == n {
            seal(&mut group, seed, bytes.len() as u64, 0);
            bytes.append(&mut group);
            // As `RecordBuf::take`: the next group starts a record.
            open = usize::MAX;
        }
    }
    let path = dir.join(names::segment_name(0));
    let mut f = fs.create_new(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(&dir).unwrap();
    (fs, dir, bad_offset, bad_record)
}

/// `log(10)` with record 3 damaged, in a segment that is not the last
/// (a segment at 10 follows, with no record yet), and a leftover
/// temporary snapshot. Returns the two segments, the damaged record's
/// offset and the temporary file.
/// The header of a segment at 10 of `log`'s store.
fn header_at_10() -> Vec<u8> {
    segment::header(
        10,
        segment::Ids { store: 1, salt: 3 },
        segment::APPENDED_VERSION,
    )
}

fn damaged_before_the_last_segment() -> (SimFs, PathBuf, [PathBuf; 2], u64, PathBuf) {
    let (fs, dir, _, _) = log(10, None, false);
    let seg = dir.join(names::segment_name(0));
    let mut bytes = fs.read_file(&seg).unwrap();
    let mut offsets = Vec::new();
    let len = bytes.len() as u64;
    let scan = segment::scan(
        &seg,
        &bytes[..],
        len,
        |_| Ok(()),
        |_, at, _, _| {
            offsets.push(at);
            Ok(())
        },
    );
    assert!(scan.is_ok_and(|s| s.records == 10));
    // A byte in the middle of record 3.
    let bad = offsets[3];
    bytes[(bad + offsets[4]) as usize / 2] ^= 1;
    fs.overwrite(&seg, &bytes);
    let next = dir.join(names::segment_name(10));
    fs.overwrite(&next, &header_at_10());
    let tmp = dir.join(format!(
        "{}{}",
        names::snapshot_name(4),
        names::SNAPSHOT_TMP_SUFFIX
    ));
    fs.overwrite(&tmp, b"cut off");
    (fs, dir, [seg, next], bad, tmp)
}

#[test]
fn a_refused_open_writes_nothing() {
    let (fs, dir, [seg, _], bad, tmp) = damaged_before_the_last_segment();
    let before = fs.files();
    let ops = fs.ops();
    match recover(&fs, &dir, RecoveryMode::Strict) {
        Err(Error::Corrupt { file, offset, .. }) => assert_eq!((file, offset), (seg, bad)),
        other => panic!("{:?}", other.map(|r| r.report)),
    }
    // Not even the leftover temporary snapshot is removed: recovery
    // repairs only what it has decided to open.
    assert_eq!(fs.ops(), ops, "nothing was written");
    assert_eq!(fs.files(), before);
    assert!(fs.read_file(&tmp).is_some());
}

#[test]
fn a_dry_run_is_the_plan_an_open_then_makes() {
    let (fs, dir, [seg, next], bad, tmp) = damaged_before_the_last_segment();
    let Err(Error::Corrupt { kind, .. }) = recover_dry(&fs, &dir, RecoveryMode::Strict) else {
        panic!("strict refuses")
    };
    let len = fs.read_file(&seg).unwrap().len() as u64;
    let ops = fs.ops();
    let dry = recover_dry(&fs, &dir, RecoveryMode::Salvage).unwrap();
    assert_eq!(fs.ops(), ops, "a dry run writes nothing");
    assert!(fs.read_file(&tmp).is_some());
    let aside = |p: &Path| PathBuf::from(format!("{}.discarded", p.display()));
    let plan = vec![
        Repair::RemoveTemp { file: tmp.clone() },
        Repair::MoveAside {
            file: seg.clone(),
            from: bad,
            to: aside(&seg),
            bytes: len - bad,
        },
        Repair::MoveAside {
            file: next.clone(),
            from: 0,
            to: aside(&next),
            bytes: HEADER_LEN as u64,
        },
    ];
    assert_eq!(dry.report.repairs, plan);
    assert!(dry.report.dry_run);
    let salvage = dry.report.salvage.clone().expect("a salvage");
    assert_eq!(salvage.cause, Damage::new(&seg, bad, kind));
    assert_eq!(salvage.discarded, vec![aside(&seg), aside(&next)]);
    assert_eq!(salvage.bytes, len - bad + HEADER_LEN as u64);
    assert_eq!((dry.next_position, dry.active), (3, Some((bad, 3))));

    // The open makes exactly those repairs, and reports what the dry
    // run did.
    let done = recover(&fs, &dir, RecoveryMode::Salvage).unwrap();
    let mut same = done.report.clone();
    (same.dry_run, same.duration) = (true, dry.report.duration);
    assert_eq!(same, dry.report);
    assert_eq!(
        (done.next_position, done.active),
        (dry.next_position, dry.active)
    );
    assert!(fs.read_file(&tmp).is_none());
    assert!(fs.read_file(&next).is_none());
    assert_eq!(fs.read_file(&seg).unwrap().len() as u64, bad);
    assert_eq!(fs.read_file(&aside(&seg)).unwrap().len() as u64, len - bad);
    assert_eq!(fs.read_file(&aside(&next)), Some(header_at_10()));
    // Nothing is left to repair.
    let again = recover_dry(&fs, &dir, RecoveryMode::Strict).unwrap();
    assert_eq!(again.report.repairs, vec![]);
    assert_eq!(again.next_position, 3);
}

/// Options for a store on `fs` that snapshots only when told (and then
/// before the call returns).
fn sim_store_options(fs: &SimFs) -> crate::StoreOptions {
    crate::StoreOptions::default()
        .file_system(std::sync::Arc::new(fs.clone()))
        .background_snapshots(false)
}

#[test]
fn a_skipped_snapshot_says_where_and_what_as_values() {
    use crate::ProducerStateStore;
    let fs = SimFs::new();
    let dir = PathBuf::from("/s");
    let s = ProducerStateStore::open_with(&dir, sim_store_options(&fs)).unwrap();
    for k in 0..5u64 {
        s.append(k, 0, 0, 0).unwrap();
    }
    s.snapshot().unwrap();
    s.close().unwrap();
    // A copy under a newer name: its header still says 5.
    let five = fs.read_file(&dir.join(names::snapshot_name(5))).unwrap();
    let seven = dir.join(names::snapshot_name(7));
    fs.overwrite(&seven, &five);
    let r = recover_dry(&fs, &dir, RecoveryMode::Strict).unwrap().report;
    let kind = Corruption::NameMismatch {
        named: 7,
        header: 5,
    };
    assert_eq!(
        r.skipped_snapshots,
        vec![SkippedSnapshot {
            file: seven.clone(),
            offset: 16,
            kind: kind.clone(),
        }]
    );
    assert_eq!(
        r.skipped_snapshots[0].to_string(),
        Error::corrupt(&seven, 16, kind).to_string()
    );
    assert_eq!(r.snapshot.map(|u| u.position), Some(5));
}

#[test]
fn segments_wholly_below_the_snapshot_are_not_read() {
    use crate::ProducerStateStore;
    use crate::inspect::{Effect, Role};
    // Small segments and one snapshot at 120: several segments end
    // below it.
    let fs = SimFs::new();
    let dir = PathBuf::from("/s");
    let opts = sim_store_options(&fs)
        .segment_size(1024)
        .snapshot_every_records(None);
    let st = ProducerStateStore::open_with(&dir, opts).unwrap();
    for i in 0..150u64 {
        if i == 120 {
            st.snapshot().unwrap();
        }
        st.append(i % 7, 0, 0, (i / 7) as i32).unwrap();
    }
    st.close().unwrap();
    let clean = recover_dry(&fs, &dir, RecoveryMode::Strict).unwrap();
    let plan = Plan::read(&fs, &dir, RecoveryMode::Strict).unwrap().0;
    assert_eq!(plan.start, 120);
    let below = plan.segments.iter().filter(|&&l| l <= 120).count() - 1;
    assert!(below >= 2, "{:?}", plan.segments);
    assert_eq!(clean.report.segments_skipped, below);
    assert_eq!(
        clean.report.segments_read,
        plan.segments.len() - below,
        "the segment holding the start and those after it"
    );
    assert!(
        clean
            .report
            .to_string()
            .contains(&format!("not read: {below} segment(s)"))
    );

    // Damage in the body of a segment wholly below the snapshot, and
    // the same segment's first record: recovery never reads it, so the
    // store opens strictly, to the same state.
    let seg = plan.segment_path(0);
    let mut bytes = fs.read_file(&seg).unwrap();
    for b in bytes.iter_mut().skip(HEADER_LEN) {
        *b ^= 0x5a;
    }
    fs.overwrite(&seg, &bytes);
    let r = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
    assert_eq!(r.report.segments_skipped, below);
    assert_eq!((r.next_position, r.report.keys), (150, 7));
    for k in 0..7u64 {
        let id = crate::id::ProducerId::from(k);
        let want = clean.shards.get(hash_key(&id, 0), &id, 0).unwrap();
        let got = r.shards.get(hash_key(&id, 0), &id, 0).unwrap();
        assert_eq!(got.last_sequence(), want.last_sequence(), "key {k}");
    }
    // The inspector still reads it, and flags it as what a fallback
    // to an older snapshot (or to none) would need.
    let report =
        crate::inspect::directory(&crate::fs::ReadOnlyFs(fs.clone()), &dir, &mut |_| {}).unwrap();
    let f = report.files.iter().find(|f| f.path == seg).unwrap();
    assert_eq!(f.role, Role::Segment);
    assert!(f.problem.is_some(), "{f:?}");
    assert_eq!(f.effect, Effect::NeededByFallback);
}

#[test]
fn a_directory_named_like_a_store_file_is_refused_in_every_mode() {
    for name in ["00000000000000000001.wal", "00000000000000000001.snap"] {
        let (fs, dir, _, _) = log(10, None, false);
        fs.create_dir_all(&dir.join(name)).unwrap();
        for mode in [RecoveryMode::Strict, RecoveryMode::Salvage] {
            match recover(&fs, &dir, mode) {
                Err(Error::NotAFile { path, what }) => {
                    assert_eq!(path, dir.join(name));
                    assert_eq!(what, "a directory");
                }
                other => panic!("{name} {mode:?}: {:?}", other.map(|r| r.report)),
            }
        }
        // Other names are left alone.
        let (fs, dir, _, _) = log(10, None, false);
        fs.create_dir_all(&dir.join(format!("{name}.old"))).unwrap();
        assert_eq!(
            recover(&fs, &dir, RecoveryMode::Strict)
                .unwrap()
                .next_position,
            10
        );
    }
}

#[test]
fn a_long_log_replays_on_two_threads_to_the_same_state() {
    // 500k appends in records of about 3,600: 9 MB, above the parallel
    // threshold.
    let (fs, dir, _, _) = log(500_000, None, true);
    let r = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(r.report.replay_threads, cores.min(2));
    assert_eq!(r.report.records_replayed, 500_000);
    assert_eq!(r.next_position, 500_000);
    assert_eq!(r.shards.len(), 1000);
    for k in [0u64, 1, 500, 999] {
        let id = crate::id::ProducerId::from(k);
        let e = r.shards.get(hash_key(&id, 0), &id, 0).unwrap();
        assert_eq!(e.last_sequence(), 499);
    }
}

#[test]
fn a_record_that_does_not_apply_is_found_exactly_after_a_parallel_replay() {
    // The parallel replay applies records past the bad one on other
    // shards; recovery must still name the bad record and salvage
    // exactly the history before it. Packed, the bad append is in the
    // middle of a record, which salvage drops whole: the state never
    // holds part of a record the log no longer has.
    let bad = 300_123;
    for packed in [false, true] {
        let (fs, dir, offset, record) =
            log(if packed { 500_000 } else { 320_000 }, Some(bad), packed);
        assert_eq!(record == bad, !packed);
        match recover(&fs, &dir, RecoveryMode::Strict) {
            Err(Error::Corrupt {
                offset: o, kind, ..
            }) => {
                assert_eq!(o, offset);
                assert!(
                    matches!(kind, Corruption::RecordDoesNotApply { position, .. } if position == bad),
                    "{kind:?}"
                );
            }
            other => panic!("{:?}", other.map(|r| r.report)),
        }
        let r = recover(&fs, &dir, RecoveryMode::Salvage).unwrap();
        assert_eq!(r.report.replay_threads, 1, "found by the sequential replay");
        assert_eq!(r.next_position, record);
        assert_eq!(r.report.records_replayed, record);
        assert_eq!(r.active.map(|(len, _)| len), Some(offset));
        for k in 0..1000u64 {
            let id = crate::id::ProducerId::from(k);
            let last = r
                .shards
                .get(hash_key(&id, 0), &id, 0)
                .unwrap()
                .last_sequence();
            // Key k's last append before `record` is the largest i < record with i % 1000 == k.
            let want = ((record - 1 - (record - 1 + 1000 - k) % 1000) / 1000) as i32;
            assert_eq!(last, want, "key {k}");
        }
        // Opening the salvaged log again agrees.
        let again = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
        assert_eq!(again.next_position, record);
    }
}

/// Recovery learns from what it replays how far a partition's truncation
/// must read: from its replay start on, each partition's appends (in runs
/// of 256) and the records of other kinds.
#[test]
fn recovery_learns_how_far_a_partitions_truncation_reads() {
    use crate::ProducerStateStore;
    use crate::batch::Batch;
    let fs = SimFs::new();
    let dir = PathBuf::from("/s");
    let s = ProducerStateStore::open_with(&dir, sim_store_options(&fs)).unwrap();
    let batch = |k: u64, p: i32, i: i32| {
        s.append_batch(k, p, 0, Batch::new(i, i, i64::from(i), 0))
            .unwrap()
    };
    // Positions 0..10: partition 0 at offsets 0..10; then a snapshot.
    for i in 0..10 {
        batch(1, 0, i);
    }
    s.snapshot().unwrap();
    // Positions 10..610: partitions 0 and 1 in turn, offsets 10..310 and
    // 0..300.
    for i in 10..310 {
        batch(1, 0, i);
        batch(2, 1, i - 10);
    }
    s.close().unwrap();
    let rec = recover(&fs, &dir, RecoveryMode::Strict).unwrap();
    let snapshot = rec.report.snapshot.map(|u| u.position);
    assert_eq!((rec.report.next_position, snapshot), (610, Some(10)));
    // Before the replay's start nothing is known: read to it.
    assert_eq!(rec.reach.stop(0, 5, 0), 10);
    // Partition 0 cut at 20: its first run (offsets 10..=265, the last at
    // position 10 + 2 * 255) holds appends below the cut, the second none.
    assert_eq!(rec.reach.stop(0, 20, 10), 521);
    // Cut at its end: every append of it matters, the last at 608.
    assert_eq!(rec.reach.stop(0, 310, 10), 609);
    // Partition 1 cut at 0: nothing of it after the base matters.
    assert_eq!(rec.reach.stop(1, 0, 10), 10);
}

/// Recovery's replayer notes each record that takes a position, from its
/// start on: one partition's append or marker at its offset (a
/// single-sequence append at its position), any other kind as reaching
/// every partition.
#[test]
fn replayed_operations_feed_the_reach_from_its_start() {
    use crate::batch::{AppendRequest, Batch};
    use crate::id::ProducerId;
    use crate::recovery::replay::Replayer;
    use crate::wal::op::{GroupKind, LogOp, RemoveReason};
    fn op(r: &mut Replayer, pos: u64, op: LogOp) {
        r.op(pos, 0, 0, &op, |_| Ok(())).unwrap();
    }
    fn stop(r: &Replayer, partition: i32, offset: i64) -> u64 {
        r.reach.as_ref().unwrap().stop(partition, offset, 0)
    }
    let mut r = Replayer::new(Meta::default(), None).tracking(5);
    let batch = |p, o| LogOp::Append(AppendRequest::batch(1u64, p, 0, Batch::new(0, 0, o, 0)));
    op(&mut r, 3, batch(0, 1)); // before the start: not known, not needed
    op(&mut r, 6, batch(0, 100));
    op(&mut r, 7, LogOp::Clock(9)); // takes no position
    assert_eq!(stop(&r, 0, 50), 5);
    assert_eq!(stop(&r, 0, 101), 7);
    // A single-sequence append counts at its position.
    op(
        &mut r,
        8,
        LogOp::Append(AppendRequest::single(2u64, 0, 0, 0)),
    );
    assert_eq!(stop(&r, 0, 50), 9);
    // A removal touches the partitions of its keys, and no other.
    let remove = LogOp::Remove {
        reason: RemoveReason::Expired,
        keys: vec![(ProducerId::numeric(3), 2)],
    };
    op(&mut r, 9, remove);
    assert_eq!(stop(&r, 2, 0), 10);
    assert_eq!(stop(&r, 4, 0), 5);
    // Another partition's truncation group touches that partition; a
    // store-wide truncation's record, none (its members do).
    let group = |kind, arg| LogOp::Group {
        kind,
        members: 0,
        arg,
    };
    op(
        &mut r,
        10,
        group(GroupKind::TruncatePartition { partition: 2 }, 7),
    );
    assert_eq!((stop(&r, 2, 0), stop(&r, 4, 0)), (11, 5));
    op(&mut r, 11, group(GroupKind::Truncate, 7));
    assert_eq!((stop(&r, 2, 0), stop(&r, 4, 0)), (11, 5));
}
