//! Crash safety under a simulated file system that keeps written and
//! durable bytes apart.
//!
//! - A crash at every IO operation of a 2,000-append workload (with several
//!   snapshots and segment rolls), each crash image recovered five ways
//!   (unsynced bytes dropped, kept, torn at a random point, sectors lost
//!   out of order, and directory changes not yet synced surviving in any
//!   combination): recovery succeeds and the state is exactly the
//!   acknowledged appends, plus at most the one in flight.
//! - A failed write (and a half-done write with ENOSPC) and a failed fsync
//!   at every operation index: the append gets the error, memory is
//!   unchanged, the store is poisoned, and reopening recovers.
//! - A machine crash under the buffered policies, with many writes never
//!   fsync'ed and any of their sectors lost: recovery opens to a prefix of
//!   the history that holds everything that was made durable.

mod common;

use std::io;

use common::model::Model;
use common::store_util::{diff, dir, matches, sim_opts, workload};
use producer_state::fs::{Fault, FileSystem, SimFs, Unsynced};
use producer_state::{AppendRequest, Error, ProducerStateStore};

const APPENDS: usize = 2000;

/// Runs the workload until the first error. Returns the model of the
/// acknowledged appends and the request in flight when it failed.
fn run(fs: &SimFs, reqs: &[AppendRequest]) -> (Model, Option<AppendRequest>) {
    let mut acked = Model::default();
    let Ok(store) = ProducerStateStore::open_with(dir(), sim_opts(fs)) else {
        return (acked, None);
    };
    for r in reqs {
        match store.append_request(r) {
            Ok(got) => {
                let want = acked.append(r);
                assert_eq!(got, want, "outcome of an acknowledged append");
            }
            Err(_) => return (acked, Some(r.clone())),
        }
    }
    (acked, None)
}

fn recovered_matches(
    store: &ProducerStateStore,
    acked: &Model,
    inflight: &Option<AppendRequest>,
) -> bool {
    matches(store, acked)
        || inflight.as_ref().is_some_and(|r| {
            let mut m = acked.clone();
            m.append(r).is_accepted() && matches(store, &m)
        })
}

#[test]
fn a_crash_at_every_io_operation_loses_nothing_acknowledged() {
    let reqs = workload(APPENDS);
    let full = SimFs::new();
    let (model, inflight) = run(&full, &reqs);
    assert!(inflight.is_none());
    let total = full.ops();
    // The workload exercises rolls, snapshots and retention.
    let files: Vec<String> = full
        .files()
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    let segments = files.iter().filter(|f| f.ends_with(".wal")).count();
    let snapshots = files.iter().filter(|f| f.ends_with(".snap")).count();
    assert!(segments >= 2 && snapshots == 2, "{files:?}");
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("00000000000000000000.wal")),
        "old segments were deleted: {files:?}"
    );
    assert!(model.keys.len() == 5 && total > 3000, "{total} operations");

    let modes = |n: u64| {
        [
            Unsynced::Drop,
            Unsynced::Keep,
            Unsynced::TornPrefix(n),
            Unsynced::Sectors(n),
        ]
    };
    for n in 0..total {
        let fs = SimFs::new();
        fs.set_fault(n, Fault::Crash);
        let (acked, inflight) = run(&fs, &reqs);
        assert!(fs.crashed(), "operation {n} was reached");
        // The four byte images, then one whose directory changes since the
        // last directory sync survive in an arbitrary combination.
        let images = modes(n)
            .map(|mode| (format!("{mode:?}"), fs.crash_image(mode)))
            .into_iter()
            .chain([(
                "reordered directory changes".to_string(),
                fs.crash_image_reordered(Unsynced::Keep, n),
            )]);
        for (mode, img) in images {
            let store = ProducerStateStore::open_with(dir(), sim_opts(&img)).unwrap_or_else(|e| {
                panic!("crash at operation {n}, image {mode}: recovery failed: {e}")
            });
            assert!(
                recovered_matches(&store, &acked, &inflight),
                "crash at operation {n}, image {mode}: {}",
                diff(&store, &acked)
            );
            // The recovered store keeps working and the history continues.
            drop(store);
        }
    }
    // And the complete run recovers to the complete model.
    let store =
        ProducerStateStore::open_with(dir(), sim_opts(&full.crash_image(Unsynced::Drop))).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
}

#[test]
fn a_failed_write_or_fsync_poisons_the_store_and_changes_nothing() {
    let reqs = workload(600);
    let total = {
        let fs = SimFs::new();
        run(&fs, &reqs);
        fs.ops()
    };
    let faults = [
        Fault::Error(io::ErrorKind::Other),
        Fault::Error(io::ErrorKind::StorageFull),
        Fault::PartialWrite,
    ];
    let mut poisoned_runs = 0;
    for n in 0..total {
        for fault in faults {
            let fs = SimFs::new();
            fs.set_fault(n, fault);
            let store = match ProducerStateStore::open_with(dir(), sim_opts(&fs)) {
                Ok(s) => s,
                // The fault hit `open`: a second open works on what is there.
                Err(_) => ProducerStateStore::open_with(dir(), sim_opts(&fs)).expect("second open"),
            };
            let mut acked = Model::default();
            let mut inflight = None;
            for r in &reqs {
                let before = store.get(r.producer_id.clone(), r.partition);
                let len = store.len();
                match store.append_request(r) {
                    Ok(got) => assert_eq!(got, acked.append(r)),
                    Err(e) => {
                        assert!(matches!(e, Error::Io { .. }), "op {n} {fault:?}: {e}");
                        assert_eq!(
                            store.get(r.producer_id.clone(), r.partition),
                            before,
                            "memory changed"
                        );
                        assert_eq!(store.len(), len);
                        let again = store.append_request(r).unwrap_err();
                        assert!(matches!(again, Error::Poisoned { .. }), "{again}");
                        assert!(matches!(store.sync().unwrap_err(), Error::Poisoned { .. }));
                        inflight = Some(r.clone());
                        poisoned_runs += 1;
                        break;
                    }
                }
            }
            drop(store);
            // Reopen on the same disk (no crash) and on a crash image.
            for fs in [fs.clone(), fs.crash_image(Unsynced::Drop)] {
                let store = ProducerStateStore::open_with(dir(), sim_opts(&fs))
                    .unwrap_or_else(|e| panic!("op {n} {fault:?}: reopen failed: {e}"));
                assert!(
                    recovered_matches(&store, &acked, &inflight),
                    "op {n} {fault:?}: {}",
                    diff(&store, &acked)
                );
            }
        }
    }
    assert!(
        poisoned_runs > total as usize,
        "most faults hit an append: {poisoned_runs}"
    );
}

#[test]
fn a_crash_with_many_unsynced_writes_recovers_a_prefix_whatever_sectors_survive() {
    use producer_state::FsyncPolicy;
    // Big segments and no snapshots: under `Never` every 64 KiB buffer is
    // one more write that is never fsync'ed, so the crash image has holes
    // in the middle of the unsynced bytes, not only at their end. Histories
    // are single-sequence appends to 64 keys, so each prefix is known.
    let reqs: Vec<AppendRequest> = (0..12_000)
        .map(|i| AppendRequest::single(i % 64, 0, 0, (i / 64) as i32))
        .collect();
    for policy in [FsyncPolicy::Never, FsyncPolicy::Always] {
        for seed in 0..24u64 {
            let fs = SimFs::new();
            let opts = |fs: &SimFs| {
                sim_opts(fs)
                    .fsync(policy)
                    .segment_size(1 << 30)
                    .snapshot_every_records(None)
            };
            let store = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
            // Make the first half durable, then write the rest unsynced.
            let half = reqs.len() / 2;
            for r in &reqs[..half] {
                store.append_request(r).unwrap();
            }
            store.sync().unwrap();
            if policy == FsyncPolicy::Always {
                // Under `Always` nothing is ever unsynced for long: cut the
                // last fsync short instead, mid-workload.
                fs.set_fault(fs.ops() + 2 * (seed + 1), Fault::Crash);
            }
            for r in &reqs[half..] {
                if store.append_request(r).is_err() {
                    break;
                }
            }
            let img = fs.crash_image(if seed % 2 == 0 {
                Unsynced::Sectors(seed)
            } else {
                Unsynced::TornPrefix(seed)
            });
            drop(store);
            let store = ProducerStateStore::open_with(dir(), opts(&img))
                .unwrap_or_else(|e| panic!("{policy:?} seed {seed}: recovery refused: {e}"));
            // The state is the history up to some append n >= half: every
            // key k has last sequence (n - 1 - k) / 64 if k < n.
            let n = (0..64u64)
                .map(|k| {
                    store
                        .get(k, 0)
                        .map_or(0, |e| e.last_sequence() as usize * 64 + k as usize + 1)
                })
                .max()
                .unwrap();
            assert!(
                n >= half,
                "{policy:?} seed {seed}: lost synced appends ({n})"
            );
            for k in 0..64u64 {
                let want = (k < n as u64).then(|| (n - 1 - k as usize) / 64);
                let got = store.get(k, 0).map(|e| e.last_sequence() as usize);
                assert_eq!(
                    got, want,
                    "{policy:?} seed {seed} key {k}: not a prefix of {n}"
                );
            }
        }
    }
}

#[test]
fn the_interval_policy_makes_appends_durable_within_the_interval() {
    use std::time::{Duration, Instant};
    let fs = SimFs::new();
    let opts = sim_opts(&fs).fsync(producer_state::FsyncPolicy::Interval(
        Duration::from_millis(5),
    ));
    let store = ProducerStateStore::open_with(dir(), opts).unwrap();
    let mut model = Model::default();
    for r in workload(300) {
        assert_eq!(store.append_request(&r).unwrap(), model.append(&r));
    }
    // Acknowledged appends may be lost for up to one interval, no longer:
    // without any call from us, a crash image soon holds all of them.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let img = fs.crash_image(Unsynced::Drop);
        let recovered = ProducerStateStore::open_with(dir(), sim_opts(&img)).unwrap();
        if matches(&recovered, &model) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never durable: {}",
            diff(&recovered, &model)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    store.close().unwrap();
}

/// A found bug: the interval's fsyncs ran on the snapshot thread, so
/// while a snapshot streamed to a slow disk (seconds for a large state)
/// nothing was fsync'ed and the loss window grew to the snapshot's length.
#[test]
fn the_interval_holds_while_a_background_snapshot_streams_to_a_slow_disk() {
    use std::time::{Duration, Instant};
    const KEYS: u64 = 300_000;
    let fs = SimFs::new();
    let opts = |fs: &SimFs| {
        sim_opts(fs)
            .fsync(producer_state::FsyncPolicy::Interval(
                Duration::from_millis(5),
            ))
            .snapshot_every_records(Some(KEYS))
            .background_snapshots(true)
            .segment_size(64 << 20)
    };
    let store = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let reqs: Vec<_> = (0..KEYS - 10)
        .map(|k| AppendRequest::single(k, 0, 0, 0))
        .collect();
    for o in store.append_all(&reqs) {
        assert!(o.unwrap().is_accepted());
    }
    store.sync().unwrap();
    // A slow disk: the snapshot (about 6 MB) takes about two seconds.
    fs.set_write_delay(Duration::from_millis(300));
    for k in 0..20u64 {
        store.append(k, 0, 0, 1).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        store.stats().snapshots_written,
        0,
        "the snapshot is streaming"
    );
    let key = 7_777_777u64;
    store.append(key, 0, 0, 0).unwrap();
    let start = Instant::now();
    loop {
        let img = fs.crash_image(Unsynced::Drop);
        let recovered = ProducerStateStore::open_with(dir(), opts(&img)).unwrap();
        if recovered.get(key, 0).is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "not durable after {:?}: the snapshot held the interval's fsyncs back",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        store.stats().snapshots_written,
        0,
        "durable while the snapshot still streamed"
    );
    fs.set_write_delay(Duration::ZERO);
    store.close().unwrap();
}

/// `sync` and `close` return the IO error that lost the records they
/// were to make durable; after that, the store is poisoned.
#[test]
fn a_sync_or_close_whose_write_fails_returns_the_io_error() {
    for fault in [
        Fault::Error(io::ErrorKind::Other),
        Fault::Error(io::ErrorKind::StorageFull),
        Fault::PartialWrite,
    ] {
        let fs = SimFs::new();
        let opts = sim_opts(&fs).fsync(producer_state::FsyncPolicy::Never);
        let store = ProducerStateStore::open_with(dir(), opts.clone()).unwrap();
        store.append(1u64, 0, 0, 0).unwrap();
        fs.set_fault(fs.ops(), fault);
        let e = store.sync().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{fault:?}: {e}");
        let again = store.sync().unwrap_err();
        assert!(matches!(again, Error::Poisoned { .. }), "{again}");
        drop(store);

        let fs = SimFs::new();
        let store =
            ProducerStateStore::open_with(dir(), opts.file_system(std::sync::Arc::new(fs.clone())))
                .unwrap();
        store.append(1u64, 0, 0, 0).unwrap();
        fs.set_fault(fs.ops(), fault);
        let e = store.close().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{fault:?}: {e}");
    }
}

/// Positions of the files with extension `ext`, ascending.
fn positions(fs: &SimFs, ext: &str) -> Vec<u64> {
    let mut v: Vec<u64> = fs
        .files()
        .into_iter()
        .filter_map(|(p, _)| {
            let name = p.file_name()?.to_str()?.to_owned();
            name.strip_suffix(ext)?.parse().ok()
        })
        .collect();
    v.sort_unstable();
    v
}

/// Found by review: a segment whose removal failed was forgotten (never
/// removed by this process), and a snapshot file already gone made every
/// later retention fail. Whatever operation of a snapshot's retention
/// fails, later snapshots leave no segment whose records all lie before
/// the oldest snapshot kept; a snapshot removed by hand is no error.
#[test]
fn retention_retries_what_it_could_not_remove() {
    let opts = |fs: &SimFs| sim_opts(fs).segment_size(1024).snapshot_every_records(None);
    let round = |s: &ProducerStateStore, r: i32| {
        for k in 0..40u64 {
            s.append(k, 0, 0, r).unwrap();
        }
    };
    // Two snapshots, then appends: the next snapshot's retention removes
    // the first snapshot and segments.
    let before_third = || {
        let fs = SimFs::new();
        let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
        for r in 0..2 {
            round(&s, r);
            s.snapshot().unwrap();
        }
        round(&s, 2);
        (fs, s)
    };
    let window = {
        let (fs, s) = before_third();
        let before = fs.ops();
        s.snapshot().unwrap();
        fs.ops() - before
    };
    for n in 0..window {
        let (fs, s) = before_third();
        fs.set_fault(fs.ops() + n, Fault::Error(io::ErrorKind::PermissionDenied));
        let _ = s.snapshot();
        for r in 3..6 {
            round(&s, r);
            s.snapshot().unwrap();
        }
        let oldest = positions(&fs, ".snap")[0];
        let segs = positions(&fs, ".wal");
        for w in segs.windows(2) {
            assert!(
                w[1] > oldest,
                "fault at op {n}: segment {} holds only records before snapshot {oldest}",
                w[0]
            );
        }
    }
    // A snapshot file removed by hand.
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    for r in 0..2 {
        round(&s, r);
        s.snapshot().unwrap();
    }
    let first = positions(&fs, ".snap")[0];
    fs.remove_file(&dir().join(format!("{first:020}.snap")))
        .unwrap();
    for r in 2..5 {
        round(&s, r);
        s.snapshot().unwrap();
    }
    let oldest = positions(&fs, ".snap")[0];
    assert!(positions(&fs, ".wal").windows(2).all(|w| w[1] > oldest));
}

#[test]
fn a_name_too_long_for_the_log_is_refused_before_anything_happens() {
    let fs = SimFs::new();
    let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    let long = "x".repeat(65_536);
    let ops = fs.ops();
    let e = store.append(long.as_str(), 0, 0, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ProducerIdTooLong {
                len: 65_536,
                max: 65_535
            }
        ),
        "{e}"
    );
    assert_eq!(fs.ops(), ops, "nothing was written");
    assert!(store.is_empty());
    // The longest allowed name works, across a restart too.
    let ok = "y".repeat(65_535);
    assert!(store.append(ok.as_str(), 0, 0, 0).unwrap() == producer_state::AppendOutcome::Accepted);
    drop(store);
    let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    assert_eq!(
        store.get(ok.as_str(), 0).map(|e| e.last_sequence()),
        Some(0)
    );
}

/// The hazard of writing into bytes a crash left behind: a group torn by
/// a crash, whose later records survived, is cut by recovery; the next,
/// shorter group is written where the torn one started. Were the torn
/// group's later records left in place, they would stand at their own
/// offsets after it under the same salt and verify: appends that were
/// never acknowledged would come back after ones that were. Recovery cuts
/// the torn bytes (and fsyncs before anything is written again), so a
/// second crash recovers a prefix of what was written since.
#[test]
fn records_of_a_torn_group_never_verify_after_the_group_written_over_them() {
    let named = |k: usize, seq: i32| AppendRequest::single(format!("p{k}"), 0, 0, seq);
    let a: Vec<_> = (0..4).map(|k| named(k, 0)).collect();
    let b: Vec<_> = (0..6).map(|k| named(k, i32::from(k < 4))).collect();
    let c = [named(9, 0)];
    for damaged in 0..b.len() {
        let fs = SimFs::new();
        let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
        for r in store.append_all(&a) {
            r.unwrap();
        }
        // The group of `b` is written; its fsync never happens.
        fs.set_fault(fs.ops() + 1, Fault::Crash);
        let res = store.append_all(&b);
        assert!(res.iter().all(|r| r.is_err()), "{res:?}");
        let img = fs.crash_image(Unsynced::Keep);
        drop(store);
        // The crash tore one record of it; the ones after it survived.
        let seg = img
            .files()
            .into_iter()
            .map(|(p, _)| p)
            .rfind(|p| p.to_string_lossy().ends_with(".wal"))
            .unwrap();
        let mut bytes = img.read_file(&seg).unwrap();
        assert_eq!(&bytes[8..12], &[6, 0, 1, 0], "a preallocated segment");
        let first_b = 40 + 4 * 31;
        bytes[first_b + damaged * 31 + 20] ^= 0x55;
        img.overwrite(&seg, &bytes);
        let store = ProducerStateStore::open_with(dir(), sim_opts(&img)).unwrap();
        let kept = store.recovery_report().next_position as usize - a.len();
        assert_eq!(kept, damaged, "cut at the torn record");
        assert!(store.recovery_report().torn_tail.is_some());
        // A shorter group over the torn one, then a crash before its fsync
        // with every written byte kept.
        img.set_fault(img.ops() + 1, Fault::Crash);
        assert!(store.append_all(&c).iter().all(|r| r.is_err()));
        let img2 = img.crash_image(Unsynced::Keep);
        drop(store);
        let store = ProducerStateStore::open_with(dir(), sim_opts(&img2)).unwrap();
        let mut want = Model::default();
        for r in a.iter().chain(&b[..damaged]).chain(&c) {
            want.append(r);
        }
        assert!(
            matches(&store, &want),
            "torn at record {damaged}: {}",
            diff(&store, &want)
        );
        assert_eq!(
            store.recovery_report().next_position as usize,
            a.len() + damaged + 1,
            "nothing of the torn group after the record written over it"
        );
    }
}

/// A snapshot of 100,000 keys or more fsyncs on a thread of its own while
/// it is written (`src/background_sync.rs`). Once `snapshot()` returns,
/// every byte of the file is durable; a failure at any of its IO
/// operations (a write, one of the thread's fsyncs, the last one) fails
/// the snapshot and leaves no snapshot file behind, and the store goes on.
#[test]
fn a_big_snapshot_is_durable_when_it_returns_and_fails_whole() {
    const KEYS: u64 = 120_000;
    let opts = |fs: &SimFs| {
        sim_opts(fs)
            .fsync(producer_state::FsyncPolicy::Never)
            .snapshot_every_records(None)
            .segment_size(64 << 20)
    };
    let fs = SimFs::new();
    let store = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let reqs: Vec<_> = (0..KEYS)
        .map(|k| AppendRequest::batch(k, 0, 0, producer_state::Batch::new(0, 0, k as i64, 7)))
        .collect();
    for o in store.append_all(&reqs) {
        assert!(o.unwrap().is_accepted());
    }
    store.sync().unwrap();
    let before = fs.ops();
    let path = store.snapshot().unwrap().unwrap();
    let ops = fs.ops() - before;
    let bytes = fs.read_file(&path).unwrap();
    assert!(
        bytes.len() > 4 << 20,
        "{} bytes: several fsyncs",
        bytes.len()
    );
    let img = fs.crash_image(Unsynced::Drop);
    assert_eq!(img.read_file(&path).as_deref(), Some(&bytes[..]));

    // A failure at operations spread over a snapshot's (the fsyncs are
    // issued by the other thread, so which operation an index hits varies).
    let mut failed = 0;
    for (i, n) in (0..ops).step_by((ops / 12).max(1) as usize).enumerate() {
        store.append(i as u64, 0, 0, 1 + i as i32).unwrap();
        store.sync().unwrap();
        fs.set_fault(fs.ops() + n, Fault::Error(io::ErrorKind::Other));
        match store.snapshot() {
            Ok(p) => {
                // The fault fell after the snapshot (on retention, say).
                assert!(fs.read_file(&p.unwrap()).is_some());
            }
            Err(_) => {
                failed += 1;
                // No temporary file is left; a snapshot file there is one
                // whose retention failed after it was in place: whole.
                let names: Vec<_> = fs.files().into_iter().map(|(p, _)| p).collect();
                assert!(
                    !names.iter().any(|p| p.to_string_lossy().ends_with(".tmp")),
                    "a failed snapshot left its temporary file: {names:?}"
                );
                let at = dir().join(format!("{:020}.snap", store.next_position()));
                if fs.read_file(&at).is_some() {
                    let s = producer_state::inspect::decode_snapshot(&fs, &at).unwrap();
                    assert_eq!(s.entries, store.len() as u64);
                }
            }
        }
        // A fault the snapshot finished before reaching (its fsyncs ran
        // on another thread) would hit the next append instead: drop it.
        fs.clear_faults();
    }
    assert!(failed >= 6, "only {failed} snapshots failed");
    // The store goes on, and its next snapshot is whole.
    store.append(KEYS + 1, 0, 0, 0).unwrap();
    store.sync().unwrap();
    let path = store.snapshot().unwrap().unwrap();
    let img = fs.crash_image(Unsynced::Drop);
    assert_eq!(img.read_file(&path), fs.read_file(&path));
    store.close().unwrap();
    let reopened = ProducerStateStore::open_with(dir(), opts(&img)).unwrap();
    assert_eq!(reopened.len() as u64, KEYS + 1);
}
