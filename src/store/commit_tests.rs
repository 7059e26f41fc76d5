//! Unit tests of `commit`, in a file of their own beside it (they see its
//! private items through `use super::*`).
//!
//! The group commit alone, over `SimFs`, with a host that only records
//! what it is told: no keys, no rules.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;
use crate::fs::{Fault, FileSystem, SimFs, Unsynced};

/// Items are the records' positions.
struct Recorder {
    log: LogQueue<u64>,
    applied: Vec<u64>,
    discarded: usize,
    /// `after_group` answers true this many more times.
    due: usize,
}

impl Host for Recorder {
    type Item = u64;
    fn log(&mut self) -> &mut LogQueue<u64> {
        &mut self.log
    }
    fn apply_durable(&mut self, items: Vec<u64>) {
        self.applied.extend(items);
    }
    fn discard_in_flight(&mut self) {
        self.discarded += 1;
    }
    fn after_group(&mut self) -> bool {
        let due = self.due > 0;
        self.due = self.due.saturating_sub(1);
        due
    }
    fn live_keys(&self) -> usize {
        self.applied.len()
    }
}

fn open(fs: &Arc<SimFs>, always: bool) -> GroupCommit<Recorder> {
    let dir = Path::new("/store");
    fs.create_dir_all(dir).unwrap();
    let writer = LogWriter::create(
        fs.clone(),
        dir,
        0,
        Vec::new(),
        None,
        crate::wal::writer::Layout {
            segment_size: 1 << 20,
            ids: IdSource::Fixed(1),
            preallocate: true,
            background: false,
            kafka: false,
        },
    )
    .unwrap();
    let host = Recorder {
        log: LogQueue::new(0),
        applied: Vec::new(),
        discarded: 0,
        due: 0,
    };
    GroupCommit::new(always, host, writer, Telemetry::new(dir, &[]))
}

/// Runs the flusher thread of `gc` until `stop`.
fn flusher(gc: &Arc<GroupCommit<Recorder>>) -> std::thread::JoinHandle<()> {
    let g = gc.clone();
    let h = std::thread::spawn(move || g.flush_loop(|| {}));
    gc.lock_state().log.set_flusher(h.thread().clone());
    h
}

fn request(seq: i32) -> AppendRequest {
    AppendRequest::single("p", 0, 0, seq)
}

/// What an appender under `Always` does: queue, commit, wait.
fn append(gc: &GroupCommit<Recorder>, seq: i32, on_due: impl Fn()) -> Result<u64> {
    let mut st = gc.lock_state();
    if let Some(f) = st.log.failed() {
        return Err(f.error_for(None));
    }
    let pos = st.log.push(&request(seq));
    st.log.queue(pos);
    let group = st.log.group();
    gc.commit(st, on_due);
    gc.await_durable(group, pos).map(|()| pos)
}

/// Bytes a crash keeps that are not zeros (segments are preallocated).
fn durable_bytes(fs: &SimFs) -> usize {
    let image = fs.crash_image(Unsynced::Drop);
    let files = image.files();
    let bytes = files.iter().filter_map(|(p, _)| image.read_file(p));
    bytes.map(|b| b.iter().filter(|&&x| x != 0).count()).sum()
}

#[test]
fn a_lone_appender_pays_one_write_and_one_fsync() {
    let fs = Arc::new(SimFs::new());
    let gc = open(&fs, true);
    let before = durable_bytes(&fs);
    assert_eq!(append(&gc, 0, || {}).unwrap(), 0);
    assert!(durable_bytes(&fs) > before, "the record is durable");
    let st = gc.lock_state();
    let s = st.log.stats();
    assert_eq!(
        (s.records_written, s.groups_written, s.log_fsyncs),
        (1, 1, 1)
    );
    assert_eq!(st.applied, [0]);
    assert_eq!(st.log.durable(), 1);
    assert_eq!(st.log.leader, Leader::Idle);
}

#[test]
fn concurrent_appenders_share_fsyncs_and_come_back_in_log_order() {
    let fs = Arc::new(SimFs::new());
    fs.set_sync_delay(Duration::from_millis(2));
    let gc = Arc::new(open(&fs, true));
    let flusher = flusher(&gc);
    let (threads, each) = (16, 20);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let gc = gc.clone();
            std::thread::spawn(move || {
                (0..each)
                    .map(|i| append(&gc, t * each + i, || {}).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut positions: Vec<u64> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    positions.sort_unstable();
    let n = (threads * each) as u64;
    assert_eq!(positions, (0..n).collect::<Vec<_>>(), "one position each");
    gc.stop();
    flusher.join().unwrap();
    let st = gc.lock_state();
    assert_eq!(
        st.applied,
        (0..n).collect::<Vec<_>>(),
        "applied in log order"
    );
    let s = st.log.stats();
    assert_eq!(s.records_written, n);
    assert!(
        s.log_fsyncs < n / 2,
        "{} fsyncs for {n} records",
        s.log_fsyncs
    );
    assert_eq!(st.log.leader, Leader::Stopped);
}

#[test]
fn a_failed_fsync_fails_its_group_and_poisons_the_queue() {
    let fs = Arc::new(SimFs::new());
    let gc = open(&fs, true);
    append(&gc, 0, || {}).unwrap();
    // The next group's write, then its fsync.
    fs.set_fault(fs.ops() + 1, Fault::Error(std::io::ErrorKind::Other));
    assert!(matches!(append(&gc, 1, || {}), Err(Error::Io { .. })));
    assert!(matches!(append(&gc, 2, || {}), Err(Error::Poisoned { .. })));
    let mut st = gc.lock_state();
    assert_eq!(st.applied, [0], "the failed group is not applied");
    assert_eq!(st.discarded, 1);
    assert_eq!(st.log.durable(), 1);
    assert!(st.log().failed().is_some());
    drop(st);
    // No fsync is retried: a sync reports the failure.
    assert!(gc.sync(|| {}).is_err());
}

#[test]
fn buffered_records_are_written_and_fsynced_by_sync_and_not_applied() {
    let fs = Arc::new(SimFs::new());
    let gc = open(&fs, false);
    {
        let mut st = gc.lock_state();
        for seq in 0..3 {
            st.log.push(&request(seq));
        }
    }
    let before = durable_bytes(&fs);
    gc.sync(|| {}).unwrap();
    assert!(durable_bytes(&fs) > before);
    let st = gc.lock_state();
    assert_eq!(st.log.durable(), 3);
    assert_eq!(st.log.stats().log_fsyncs, 1);
    assert!(
        st.applied.is_empty(),
        "buffered records are applied when queued"
    );
}

#[test]
fn the_leader_reports_what_the_host_asked_for_after_its_group() {
    let fs = Arc::new(SimFs::new());
    let gc = open(&fs, true);
    gc.lock_state().due = 1;
    let calls = AtomicUsize::new(0);
    let count = || {
        calls.fetch_add(1, Ordering::Relaxed);
    };
    append(&gc, 0, count).unwrap();
    append(&gc, 1, count).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}
