//! The store's threads: the flusher (group commit's writes and fsyncs)
//! and, as the options ask, the snapshot thread, the interval's fsyncs and
//! the expiration sweeps. Each stops when the store closes.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::Shared;
use super::commit::lock;
use super::options::FsyncPolicy;
use crate::error::{Error, Result};

impl Shared {
    /// Starts the store's threads: the flusher (group commit's writes and
    /// fsyncs), and as the options ask, the snapshot, interval-fsync and
    /// expiration threads.
    pub(super) fn start_threads(self: &Arc<Self>) -> Result<(Vec<JoinHandle<()>>, JoinHandle<()>)> {
        let shared = self;
        // Snapshots and the interval's fsyncs run on threads of their own:
        // a snapshot of a large state on a slow disk takes seconds, and the
        // interval's loss window must not grow by that much.
        let mut background = Vec::new();
        let spawn = |name: &str, f: fn(&Shared)| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&s))
                .map_err(|e| Error::io("spawn background thread", &shared.dir, e))
        };
        if shared.opts.background_snapshots {
            background.push(spawn("producer-state-snap", Shared::background)?);
        }
        if matches!(shared.opts.fsync, FsyncPolicy::Interval(_)) {
            background.push(spawn("producer-state-tick", Shared::tick)?);
        }
        if shared.opts.expiration.is_some() && shared.opts.expiration_interval.is_some() {
            background.push(spawn("producer-state-expire", Shared::expirer)?);
        }
        let s = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("producer-state-flush".into())
            .spawn(move || s.log.flush_loop(|| s.snapshot_due()))
            .map_err(|e| Error::io("spawn flusher thread", &shared.dir, e))?;
        shared
            .log
            .lock_state()
            .log
            .set_flusher(flusher.thread().clone());
        Ok((background, flusher))
    }

    /// Starts (or, without a background thread, takes) a due snapshot.
    pub(super) fn snapshot_due(&self) {
        if self.opts.background_snapshots {
            let mut bg = lock(&self.bg);
            bg.snapshot_wanted = true;
            self.bg_cv.notify_all();
        } else {
            self.auto_snapshot();
        }
    }

    /// Takes the snapshot a threshold asked for; nobody waits for its
    /// error, so it is kept and reported.
    fn auto_snapshot(&self) {
        if let Err(e) = self.take_snapshot() {
            self.log.telemetry().snapshot_failed(&e, true);
            self.snapshots.set_error(e);
        }
    }

    /// The snapshot thread: takes the snapshots a threshold asked for.
    pub(super) fn background(&self) {
        loop {
            let mut bg = lock(&self.bg);
            while !bg.stop && !bg.snapshot_wanted {
                bg = self.bg_cv.wait(bg).unwrap_or_else(|e| e.into_inner());
            }
            if bg.stop {
                return;
            }
            bg.snapshot_wanted = false;
            drop(bg);
            self.auto_snapshot();
        }
    }

    /// Sweeps for expired keys every `expiration_interval` (its errors
    /// poison the store, and appends report them; a sweep that found the
    /// store poisoned stops).
    pub(super) fn expirer(&self) {
        let (Some(exp), Some(every)) = (self.opts.expiration, self.opts.expiration_interval) else {
            return;
        };
        while self.sleep(every) {
            if self.expire(exp).is_err() {
                return;
            }
        }
    }

    /// Sleeps `d` (the store's background threads); false once the store
    /// is closing.
    fn sleep(&self, d: std::time::Duration) -> bool {
        let next = Instant::now() + d;
        let mut bg = lock(&self.bg);
        loop {
            if bg.stop {
                return false;
            }
            let now = Instant::now();
            if now >= next {
                return true;
            }
            bg = self
                .bg_cv
                .wait_timeout(bg, next - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// `Interval(d)`: writes and fsyncs the buffered records every `d`.
    pub(super) fn tick(&self) {
        let FsyncPolicy::Interval(every) = self.opts.fsync else {
            return;
        };
        while self.sleep(every) {
            // A failure poisons the store; appends report it.
            let _ = self.sync();
        }
    }
}
