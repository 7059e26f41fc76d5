//! `fdatasync` of a file being written, on a thread of its own.
//!
//! A big snapshot is fsync'ed every 1 MiB as it is written, so that the
//! disk never has one huge flush to do at the end (a concurrent log fsync
//! would wait for it). Done inline, those fsyncs were about half of a 1M-key
//! snapshot's time, the encoder idle while the disk worked: on this host an
//! fsync costs about 2 ms whatever its size below a few MiB, and a 61 MB
//! file has 61 of them. Here the writer only asks for one; a thread of its
//! own issues it on a second handle to the file (`dup`), while the writer
//! encodes and writes on. A request made while an fsync runs is served by
//! the next one, which then covers everything written by its start (fewer,
//! larger fsyncs when the disk is the slower side), and the writer waits
//! once more than [`MAX_BEHIND`] bytes are not yet durable, so no fsync
//! flushes more than that: the bound the inline fsyncs gave, a few MiB
//! instead of one.
//!
//! An fsync that fails stops the thread; the writer gets its error at its
//! next write or when it finishes, and the snapshot fails (it is never
//! retried: after a failed fsync nothing is known of what reached the disk).

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::file_system::WriteFile;

/// The most bytes written and not yet durable before the writer waits.
pub(crate) const MAX_BEHIND: u64 = 4 << 20;

#[derive(Default)]
struct Progress {
    /// Bytes the writer asked to make durable.
    requested: u64,
    /// Bytes covered by the fsync that runs or ran last.
    started: u64,
    /// Bytes known durable.
    done: u64,
    /// The fsync that failed; the thread stopped.
    failed: Option<io::Error>,
    /// The writer is done: the thread exits once idle.
    stop: bool,
}

type Shared = Arc<(Mutex<Progress>, Condvar)>;

fn lock(m: &Mutex<Progress>) -> MutexGuard<'_, Progress> {
    // The thread never panics holding it; a poisoned lock still holds
    // consistent numbers.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writer's copy of the thread's failed fsync, if any (the error
/// stays recorded: every later call reports it too).
fn reported(failed: &Option<io::Error>) -> io::Result<()> {
    match failed {
        Some(e) => Err(io::Error::new(e.kind(), e.to_string())),
        None => Ok(()),
    }
}

/// A thread that fsyncs one file on request.
pub(crate) struct BackgroundSync {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundSync {
    /// Starts the thread over `file` (a second handle to the file written).
    pub(crate) fn start(mut file: Box<dyn WriteFile>) -> io::Result<BackgroundSync> {
        let shared: Shared = Arc::default();
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("snapshot-fsync".into())
            .spawn(move || {
                let (m, cv) = &*theirs;
                loop {
                    let target = {
                        let mut p = lock(m);
                        while p.requested <= p.started && !p.stop {
                            p = cv
                                .wait(p)
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                        if p.requested <= p.started {
                            return;
                        }
                        p.started = p.requested;
                        p.requested
                    };
                    let r = file.sync_data();
                    let mut p = lock(m);
                    match r {
                        Ok(()) => p.done = target,
                        Err(e) => p.failed = Some(e),
                    }
                    cv.notify_all();
                    if p.failed.is_some() {
                        return;
                    }
                }
            })?;
        Ok(BackgroundSync {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for the first `written` bytes of the file to be made durable,
    /// then waits until at most [`MAX_BEHIND`] of them are not. Returns
    /// the error of a failed fsync (this one's or an earlier one's).
    pub(crate) fn request(&self, written: u64) -> io::Result<()> {
        let (m, cv) = &*self.shared;
        let mut p = lock(m);
        if written > p.requested {
            p.requested = written;
            cv.notify_all();
        }
        loop {
            reported(&p.failed)?;
            if written.saturating_sub(p.done) <= MAX_BEHIND {
                return Ok(());
            }
            p = cv
                .wait(p)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Stops the thread once its fsync (if any) is over; the error of a
    /// failed one. What was requested and not yet started is left to the
    /// caller's own final fsync.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.stop();
        reported(&lock(&self.shared.0).failed)
    }

    fn stop(&mut self) {
        {
            let mut p = lock(&self.shared.0);
            p.stop = true;
            // Nothing new starts: the caller syncs the rest itself.
            p.requested = p.started;
            self.shared.1.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BackgroundSync {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Fault, FileSystem, SimFs, Unsynced};
    use std::path::Path;

    #[test]
    fn requests_become_durable_and_a_failure_is_reported() {
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let path = Path::new("/d/f");
        let mut f = fs.create_new(path).unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        let sync = BackgroundSync::start(f.try_clone().unwrap()).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0;
        for _ in 0..10 {
            f.write_all(&chunk).unwrap();
            written += chunk.len() as u64;
            sync.request(written).unwrap();
            // Never more than the bound behind.
            let done = lock(&sync.shared.0).done;
            assert!(written - done <= MAX_BEHIND, "{written} {done}");
        }
        let done = lock(&sync.shared.0).done;
        sync.finish().unwrap();
        // What the thread made durable survives a crash.
        let img = fs.crash_image(Unsynced::Drop);
        assert!(img.read_file(path).unwrap().len() as u64 >= done);
        assert!(done >= written - MAX_BEHIND);

        // A failing fsync: the writer hears of it, at its next request or
        // when it finishes.
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let mut f = fs.create_new(path).unwrap();
        let sync = BackgroundSync::start(f.try_clone().unwrap()).unwrap();
        for _ in 0..6 {
            f.write_all(&chunk).unwrap();
        }
        // The next operation is the thread's fsync.
        fs.set_fault(fs.ops(), Fault::Error(io::ErrorKind::Other));
        let early = sync.request(6 << 20);
        assert!(
            early.is_err(),
            "6 MiB behind: the writer waits for the fsync, and it failed"
        );
        assert!(sync.finish().is_err());
    }
}
