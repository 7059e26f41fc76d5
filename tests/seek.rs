//! A reopen reads no record its snapshot covers: a snapshot of version 6
//! records where its position lies in its segment, and recovery seeks
//! there (docs/format.md, Recovering, step 3). These tests check that the
//! seek is taken and gives the state a full read gives; that damage below
//! the seek point is not read (and a fallback to an older base reads and
//! refuses it); that a recorded offset that is wrong in any way falls back
//! to reading the segment from its first record; and what the bounded
//! check of a preallocated segment's room after a close marker sees.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::model::Model;
use common::store_util::{diff, dir, matches, sim_opts, workload};
use producer_state::fs::{FileSystem, SimFs, Unsynced};
use producer_state::{
    AppendRequest, Batch, Clock, Corruption, Error, FsyncPolicy, ManualClock, ProducerStateStore,
    SeekFallback, Semantics, StoreOptions,
};

/// One segment of 1 MiB (preallocated, the default), snapshots only when
/// asked, the clock the test moves.
fn opts(fs: &SimFs, clock: &Arc<ManualClock>, policy: FsyncPolicy) -> StoreOptions {
    sim_opts(fs)
        .segment_size(1 << 20)
        .snapshot_every_records(None)
        .fsync(policy)
        .clock(clock.clone())
}

/// Appends `reqs`, moving the clock every fifth one (single-sequence
/// appends then log clock records), into the store and the model.
fn append(
    store: &ProducerStateStore,
    model: &mut Model,
    clock: &ManualClock,
    reqs: &[AppendRequest],
) {
    for (i, r) in reqs.iter().enumerate() {
        if i % 5 == 0 {
            clock.advance(std::time::Duration::from_millis(3));
        }
        let now = clock.now_ms();
        assert_eq!(store.append_request(r).unwrap(), model.append_at(r, now));
    }
}

/// The only file of the store's directory whose name ends in `.{ext}`.
fn only(fs: &SimFs, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = fs
        .files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

fn snapshot_file(fs: &SimFs) -> PathBuf {
    only(fs, "snap")
}

/// A store of 300 appends, a snapshot, 60 more; closed cleanly or not.
/// Returns the file system, the model, the clock and the snapshot's
/// position.
fn store_with_snapshot(policy: FsyncPolicy, close: bool) -> (SimFs, Model, Arc<ManualClock>, u64) {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut model = Model::default();
    let reqs = workload(360);
    let store = ProducerStateStore::open_with(dir(), opts(&fs, &clock, policy)).unwrap();
    append(&store, &mut model, &clock, &reqs[..300]);
    let snap = store.snapshot().unwrap().unwrap();
    append(&store, &mut model, &clock, &reqs[300..]);
    let fs = if close {
        store.close().unwrap();
        fs
    } else {
        store.sync().unwrap();
        let image = fs.crash_image(Unsynced::Keep);
        drop(store);
        image
    };
    let name = snap.file_stem().unwrap().to_str().unwrap().to_owned();
    (fs, model, clock, name.parse().unwrap())
}

fn reopen(fs: &SimFs, clock: &Arc<ManualClock>) -> producer_state::Result<ProducerStateStore> {
    ProducerStateStore::open_with(dir(), opts(fs, clock, FsyncPolicy::Always))
}

#[test]
fn a_reopen_seeks_past_every_record_its_snapshot_covers() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Never] {
        for close in [true, false] {
            let (fs, model, clock, position) = store_with_snapshot(policy, close);
            let bytes = fs.read_file(&snapshot_file(&fs)).unwrap();
            assert_eq!(&bytes[8..10], &[6, 0], "{policy:?}: a version-6 snapshot");
            let store = reopen(&fs, &clock).unwrap();
            assert!(
                matches(&store, &model),
                "{policy:?}: {}",
                diff(&store, &model)
            );
            let r = store.recovery_report();
            let seek = r.seek.clone().expect("the snapshot recorded its point");
            assert_eq!(seek.fallback, None, "{policy:?} {close}: {r}");
            assert_eq!(
                seek.offset,
                u64::from(u32::from_le_bytes(bytes[12..16].try_into().unwrap()))
            );
            // One segment: every position below the snapshot's is in it.
            assert_eq!(seek.records_not_read, position, "{r}");
            assert_eq!(r.records_read_not_replayed, 0, "{r}");
            assert_eq!(r.records_replayed, r.next_position - position);
            assert_eq!(r.clean_shutdown, Some(close));
            assert!(r.to_string().contains("seek: "), "{r}");
        }
    }
}

/// The same history opened with its snapshot's point and without it (the
/// file rewritten as version 5): the same state, and the full read reads
/// every covered record.
#[test]
fn a_seek_and_a_full_read_give_the_same_state() {
    let (fs, model, clock, position) = store_with_snapshot(FsyncPolicy::Always, true);
    let snap = snapshot_file(&fs);
    let mut bytes = fs.read_file(&snap).unwrap();
    bytes[8..10].copy_from_slice(&5u16.to_le_bytes());
    bytes[12..16].fill(0);
    bytes[44..48].fill(0);
    reseal(&mut bytes);
    let v5 = {
        let fs = copy(&fs);
        fs.overwrite(&snap, &bytes);
        fs
    };
    let seeking = reopen(&fs, &clock).unwrap();
    let reading = reopen(&v5, &clock).unwrap();
    for s in [&seeking, &reading] {
        assert!(matches(s, &model), "{}", diff(s, &model));
    }
    let r = reading.recovery_report();
    assert_eq!(
        (r.seek.clone(), r.records_read_not_replayed),
        (None, position)
    );
    assert!(
        r.to_string()
            .contains(&format!("read, not replayed: {position} records"))
    );
}

/// Recomputes a snapshot's header CRC (bytes 40..44) and its file CRC
/// (the last 4 bytes) after a test changed its header.
fn reseal(bytes: &mut [u8]) {
    let head = crc32c::crc32c(&bytes[..40]);
    bytes[40..44].copy_from_slice(&head.to_le_bytes());
    let n = bytes.len() - 4;
    let file = crc32c::crc32c(&bytes[..n]);
    bytes[n..].copy_from_slice(&file.to_le_bytes());
}

/// A copy of every file of `fs`.
fn copy(fs: &SimFs) -> SimFs {
    let out = SimFs::new();
    out.create_dir_all(&dir()).unwrap();
    for (p, _) in fs.files() {
        out.overwrite(&p, &fs.read_file(&p).unwrap());
    }
    out
}

/// The store's only segment.
fn segment(fs: &SimFs) -> PathBuf {
    only(fs, "wal")
}

#[test]
fn damage_below_the_seek_point_is_not_read_and_a_fallback_refuses_it() {
    let (fs, model, clock, _) = store_with_snapshot(FsyncPolicy::Always, true);
    let seg = segment(&fs);
    let snap = snapshot_file(&fs);
    let point = {
        let b = fs.read_file(&snap).unwrap();
        u64::from(u32::from_le_bytes(b[12..16].try_into().unwrap()))
    };
    // A flipped bit in the middle of the records the snapshot covers.
    let mut log = fs.read_file(&seg).unwrap();
    let at = (point / 2) as usize;
    log[at] ^= 0x10;
    fs.overwrite(&seg, &log);
    let store = reopen(&fs, &clock).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    assert_eq!(store.recovery_report().records_read_not_replayed, 0);
    store.close().unwrap();
    // Without the snapshot, replay reads those bytes: the damage is found
    // (a valid record after it was written once it was durable).
    fs.delete(&snap);
    match reopen(&fs, &clock) {
        Err(Error::Corrupt { file, offset, kind }) => {
            assert_eq!(file, seg);
            assert!(offset <= at as u64, "{offset} {at}");
            assert!(matches!(kind, Corruption::DamagedMidLog), "{kind:?}");
        }
        other => panic!("expected the damage to be found: {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_wrong_recorded_point_falls_back_to_reading_the_segment() {
    let (fs, model, clock, position) = store_with_snapshot(FsyncPolicy::Always, true);
    let snap = snapshot_file(&fs);
    let good = fs.read_file(&snap).unwrap();
    let offset = u32::from_le_bytes(good[12..16].try_into().unwrap());
    let seed = u32::from_le_bytes(good[44..48].try_into().unwrap());
    let seg_len = fs.read_file(&segment(&fs)).unwrap().len() as u32;
    let cases = [
        // Inside the record before the point: no record starts there.
        (offset - 3, seed, SeekFallback::NoRecord),
        // Inside the first record after it.
        (offset + 5, seed, SeekFallback::NoRecord),
        // Before the first record, and past the file's end.
        (20, seed, SeekFallback::OutOfRange),
        (seg_len + 1, seed, SeekFallback::OutOfRange),
        // Another segment's seed: not the file the point was taken in.
        (offset, seed ^ 1, SeekFallback::OtherSegment),
    ];
    for (offset, seed, why) in cases {
        let mut b = good.clone();
        b[12..16].copy_from_slice(&offset.to_le_bytes());
        b[44..48].copy_from_slice(&seed.to_le_bytes());
        reseal(&mut b);
        let fs = copy(&fs);
        fs.overwrite(&snap, &b);
        let store = reopen(&fs, &clock).unwrap();
        assert!(matches(&store, &model), "{why:?}: {}", diff(&store, &model));
        let r = store.recovery_report();
        let seek = r.seek.clone().unwrap();
        assert_eq!(seek.fallback, Some(why), "{r}");
        assert_eq!(seek.records_not_read, 0);
        assert_eq!(r.records_read_not_replayed, position, "{r}");
        assert!(r.to_string().contains("seek: not taken"), "{r}");
    }
}

#[test]
fn a_kafka_mode_reopen_seeks_too() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let o = |fs: &SimFs| opts(fs, &clock, FsyncPolicy::Always).semantics(Semantics::Kafka);
    let store = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let batch = |pid: u64, seq: i32, offset: i64| {
        AppendRequest::batch(
            pid,
            0,
            0,
            Batch::new(seq, seq, offset, 1_700_000_000_000 + offset),
        )
    };
    for i in 0..200 {
        let pid = i % 7;
        let got = store
            .append_request(&batch(pid, (i / 7) as i32, i as i64))
            .unwrap();
        assert!(got.is_accepted(), "{got:?}");
    }
    store.snapshot().unwrap().unwrap();
    for i in 200..230 {
        let pid = i % 7;
        assert!(
            store
                .append_request(&batch(pid, (i / 7) as i32, i as i64))
                .unwrap()
                .is_accepted()
        );
    }
    let before: Vec<_> = (0..7).map(|pid| store.kafka_state(pid, 0)).collect();
    store.close().unwrap();
    let store = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let after: Vec<_> = (0..7).map(|pid| store.kafka_state(pid, 0)).collect();
    assert_eq!(before, after);
    let r = store.recovery_report();
    assert_eq!(r.seek.as_ref().map(|s| s.fallback), Some(None), "{r}");
    assert_eq!(
        (r.records_read_not_replayed, r.records_replayed),
        (0, 30),
        "{r}"
    );
}

/// After a close marker only the first MiB of a preallocated segment's
/// room is read: a byte that is not zero further on is not seen (docs/
/// format.md says what that costs and why it is safe); after a crash the
/// room is read to its end, and the same byte is a torn tail.
#[test]
fn the_room_after_a_close_marker_is_checked_for_one_mib() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let o = |fs: &SimFs| opts(fs, &clock, FsyncPolicy::Never).segment_size(16 << 20);
    let store = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    // Past the 64 KiB, 256 KiB and 1 MiB segments: the fourth has 4 MiB.
    let mut i = 0u64;
    while segments(&fs) < 4 {
        let r = AppendRequest::batch(
            i % 1000,
            0,
            0,
            Batch::new((i / 1000) as i32, (i / 1000) as i32, i as i64, 0),
        );
        assert!(store.append_request(&r).unwrap().is_accepted());
        i += 1;
    }
    store.close().unwrap();
    let last = fs
        .files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .max()
        .unwrap();
    let mut bytes = fs.read_file(&last).unwrap();
    assert_eq!(bytes.len(), 4 << 20);
    let far = 3 << 20;
    bytes[far] = 1;
    let near = fs.clone();
    let mut close_to_end = bytes.clone();
    close_to_end[far] = 0;
    let end = close_to_end.iter().rposition(|&b| b != 0).unwrap();
    close_to_end[end + 1000] = 1;

    fs.overwrite(&last, &bytes);
    let r = ProducerStateStore::open_with(dir(), o(&fs))
        .unwrap()
        .recovery_report()
        .clone();
    assert_eq!(
        (r.clean_shutdown, r.torn_tail.clone()),
        (Some(true), None),
        "{r}"
    );

    near.overwrite(&last, &close_to_end);
    let r = ProducerStateStore::open_with(dir(), o(&near))
        .unwrap()
        .recovery_report()
        .clone();
    assert!(
        r.torn_tail.is_some(),
        "a byte in the first MiB is seen: {r}"
    );

    // Without the close marker (a crash), the whole room is read.
    let crashed = copy(&fs);
    let mut b = bytes.clone();
    let marker = end + 1 - 17;
    assert_eq!(b[marker + 16], 5, "the close marker is the last record");
    b[marker..=end].fill(0);
    crashed.overwrite(&last, &b);
    let r = ProducerStateStore::open_with(dir(), o(&crashed))
        .unwrap()
        .recovery_report()
        .clone();
    let torn = r
        .torn_tail
        .clone()
        .expect("the byte far in the room is found");
    assert_eq!(
        (torn.offset, r.clean_shutdown),
        (marker as u64, Some(false))
    );
}

/// How many segments the store has.
fn segments(fs: &SimFs) -> usize {
    fs.files()
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "wal"))
        .count()
}

/// The store's newest segment.
fn last_segment(fs: &SimFs) -> PathBuf {
    fs.files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .max()
        .unwrap()
}

/// A reopen after a clean close removes the close marker, durably, before
/// it appends. Otherwise, if a crash lost the first pages of the next
/// group (they read back as they were: the marker, then the room's zeros)
/// and kept its later ones (sectors persisted out of order, inside one
/// group's write and fsync), the next open would take the marker for a
/// clean shutdown, check one MiB of zeros after it and never see the
/// records beyond, which a later session could then resume into. Without
/// the marker that open reads the room to its end, finds them and cuts
/// them as a torn write.
#[test]
fn records_written_after_a_clean_reopen_are_not_hidden_behind_its_marker() {
    let fs = SimFs::new();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let o = |fs: &SimFs| opts(fs, &clock, FsyncPolicy::Always).segment_size(16 << 20);
    let req = |i: u64| {
        AppendRequest::batch(
            i % 1000,
            0,
            0,
            Batch::new((i / 1000) as i32, (i / 1000) as i32, i as i64, 0),
        )
    };
    // One append_all call: one group, one write, one fsync.
    let accept_all = |store: &ProducerStateStore, seqs: std::ops::Range<u64>| {
        let all: Vec<AppendRequest> = seqs.map(req).collect();
        let outcomes = store.append_all(&all);
        assert!(outcomes.into_iter().all(|o| o.unwrap().is_accepted()));
    };
    // Past the 64 KiB, 256 KiB, 1 MiB and 4 MiB segments, into the 16 MiB
    // one.
    let store = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    let mut n = 0;
    while segments(&fs) < 5 {
        accept_all(&store, n..n + 100);
        n += 100;
    }
    let closed_at = store.next_position();
    store.close().unwrap();
    let last = last_segment(&fs);
    let records_end = fs
        .read_file(&last)
        .unwrap()
        .iter()
        .rposition(|&b| b != 0)
        .unwrap()
        + 1;

    let store = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    assert_eq!(store.recovery_report().clean_shutdown, Some(true));
    // What is durable once the open is done, before any append.
    let durable = fs.read_file(&last).unwrap();
    assert!(
        durable[..records_end].ends_with(&[0u8; 17]),
        "the marker is gone from the disk"
    );
    // One group of about 11 MiB: one write, one fsync.
    accept_all(&store, n..n + 200_000);
    let image = fs.crash_image(Unsynced::Keep);
    drop(store);
    let mut bytes = image.read_file(&last).unwrap();
    let written = bytes.iter().rposition(|&b| b != 0).unwrap();
    // Well past the MiB checked after a marker, and the reads that check
    // makes at once.
    let lost = (records_end - 17)..(records_end + (6 << 20));
    assert!(
        written > lost.end + (64 << 10),
        "records beyond the lost pages"
    );
    bytes[lost.clone()].copy_from_slice(&durable[lost]);
    image.overwrite(&last, &bytes);

    let store = ProducerStateStore::open_with(dir(), o(&image)).unwrap();
    let r = store.recovery_report();
    assert_eq!(r.clean_shutdown, Some(false), "{r}");
    assert!(r.torn_tail.is_some(), "the later records are found: {r}");
    assert_eq!(store.next_position(), closed_at, "and none is replayed");
}

/// A truncation replays from its base snapshot as recovery does: from the
/// snapshot's log point, not from its segment's first record. A bit
/// flipped below that point (after a reopen, which does not read it
/// either) is not read, so the truncation succeeds and gives the model's
/// state; replayed from the segment's start it would be refused as damage.
#[test]
fn a_truncation_replays_from_its_base_snapshots_log_point() {
    let (fs, mut model, clock, _) = store_with_snapshot(FsyncPolicy::Always, true);
    let seg = segment(&fs);
    let point = {
        let b = fs.read_file(&snapshot_file(&fs)).unwrap();
        u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize
    };
    let mut log = fs.read_file(&seg).unwrap();
    log[point / 2] ^= 0x10;
    fs.overwrite(&seg, &log);
    let store = reopen(&fs, &clock).unwrap();
    // Above the snapshot's highest offset (its base), below the end.
    let snap_high = workload(300)
        .iter()
        .filter_map(|r| r.metadata().map(|m| m.offset))
        .max()
        .unwrap();
    let offset = snap_high + 50;
    assert!(offset < model.high, "{offset} {}", model.high);
    store.truncate_to(offset).unwrap();
    model.truncate(offset).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
}
