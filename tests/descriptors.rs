//! File descriptors: the store's steady state opens none, and a process
//! out of descriptors (`EMFILE`, at its `RLIMIT_NOFILE`) leaves a healthy
//! store healthy.
//!
//! A broker that holds many client connections can run its process out of
//! descriptors; a store that needed a new one for every fsync was poisoned
//! by that and refused every append until a restart. The simulated file
//! system refuses every call that would take a descriptor while it is
//! "exhausted", as the kernel does at the limit, and counts them.

mod common;

use std::sync::Arc;

use common::store_util::dir;
use producer_state::fs::{FileSystem, SimFs, Unsynced};
use producer_state::{
    AppendRequest, Batch, BatchOutcome, FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions,
};

fn opts(fs: &SimFs) -> StoreOptions {
    StoreOptions::default()
        .file_system(Arc::new(fs.clone()))
        .fsync(FsyncPolicy::Always)
        .segment_size(1 << 20)
        .background_snapshots(false)
        .snapshot_every_records(Some(3_000))
        .clock(Arc::new(ManualClock::new(0)))
        .expiration_interval(None)
}

/// Appends `n` batches of one record each for producers `first..first+n`,
/// one call each (one group commit each under `Always`).
fn append(s: &ProducerStateStore, first: u64, n: u64) -> Vec<BatchOutcome> {
    (first..first + n)
        .map(|pid| {
            s.append_request(&AppendRequest::batch(
                pid,
                0,
                0,
                Batch::new(0, 0, pid as i64, 0),
            ))
            .expect("an append under exhausted descriptors must not fail")
        })
        .collect()
}

fn segments(fs: &SimFs) -> usize {
    fs.list(&dir())
        .unwrap()
        .iter()
        .filter(|e| e.name.ends_with(".wal"))
        .count()
}

#[test]
fn appends_and_fsyncs_open_no_descriptor_once_a_segment_is_going() {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs).snapshot_every_records(None)).unwrap();
    // The first fsync duplicates the segment's handle, once.
    assert!(append(&s, 0, 1)[0].is_accepted());
    let before = fs.descriptor_requests();
    let fsyncs = s.stats().log_fsyncs;
    // 300 records of about 40 bytes stay in the first 64 KiB segment.
    assert!(append(&s, 1, 300).iter().all(BatchOutcome::is_accepted));
    assert_eq!(segments(&fs), 1, "the test meant to stay in one segment");
    assert_eq!(s.stats().log_fsyncs - fsyncs, 300, "one fsync an append");
    assert_eq!(
        fs.descriptor_requests(),
        before,
        "appends and fsyncs asked for new file descriptors"
    );
}

#[test]
fn a_process_out_of_descriptors_keeps_a_healthy_store_healthy() {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert!(append(&s, 0, 100).iter().all(BatchOutcome::is_accepted));
    let rolled_before = segments(&fs);

    // Out of descriptors: 6,000 appends, enough for several rolls and two
    // snapshots, none of which can open a file.
    fs.set_descriptors_exhausted(true);
    let refused_before = fs.descriptor_requests();
    assert!(append(&s, 100, 6_000).iter().all(BatchOutcome::is_accepted));
    assert!(
        fs.descriptor_requests() > refused_before,
        "the workload never needed a descriptor: it tests nothing"
    );
    assert_eq!(
        segments(&fs),
        rolled_before,
        "a roll happened without a descriptor"
    );
    assert!(
        s.last_snapshot_error().is_some(),
        "a snapshot was due and refused"
    );
    assert_eq!(s.stats().errors, 0);

    // Descriptors again: rolls and snapshots resume.
    fs.set_descriptors_exhausted(false);
    assert!(
        append(&s, 6_100, 6_000)
            .iter()
            .all(BatchOutcome::is_accepted)
    );
    assert!(
        segments(&fs) > rolled_before,
        "the postponed roll never came"
    );
    let snapshots = s.stats().snapshots_written;
    assert!(snapshots > 0, "no snapshot after descriptors came back");

    // Every acknowledged append survives a crash that keeps only what was
    // fsync'ed, and a retry of each is a duplicate.
    drop(s);
    let image = fs.crash_image(Unsynced::Drop);
    let s = ProducerStateStore::open_with(dir(), opts(&image)).unwrap();
    assert_eq!(s.len(), 12_100);
    for pid in [0u64, 99, 100, 3_000, 6_099, 6_100, 12_099] {
        let retry = AppendRequest::batch(pid, 0, 0, Batch::new(0, 0, pid as i64, 0));
        assert!(
            matches!(
                s.append_request(&retry).unwrap(),
                BatchOutcome::Duplicate { .. }
            ),
            "producer {pid}"
        );
    }
}
