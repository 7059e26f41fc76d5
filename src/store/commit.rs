//! Group commit: the log queue, its leaders and the flusher thread.

use super::*;

/// Records buffered before a buffered policy hands them to the flusher.
pub(super) const FLUSH_BYTES: usize = 64 << 10;

/// Records buffered at which a buffered append waits for the flusher (the
/// disk is slower than the appends): memory stays bounded.
pub(super) const MAX_BUFFERED: usize = 8 << 20;

/// Futex words that appenders waiting for a group sleep on; group `g` uses
/// `words[g % WAIT_SLOTS]`. At most two groups are pending at a time (the
/// one being written and the one forming), so waiters of different groups
/// rarely share a word.
pub(super) const WAIT_SLOTS: usize = 4;

/// Why the store is poisoned.
#[derive(Clone)]
pub(super) struct Failure {
    pub(super) op: &'static str,
    pub(super) path: PathBuf,
    pub(super) kind: io::ErrorKind,
    pub(super) message: String,
    /// Positions of the records lost with the failed group (and queued
    /// behind it).
    pub(super) group: (u64, u64),
}

impl Failure {
    pub(super) fn from_error(e: &Error, group: (u64, u64)) -> Failure {
        match e {
            Error::Io { op, path, source } => Failure {
                op,
                path: path.clone(),
                kind: source.kind(),
                message: source.to_string(),
                group,
            },
            other => Failure {
                op: "write",
                path: PathBuf::new(),
                kind: io::ErrorKind::Other,
                message: other.to_string(),
                group,
            },
        }
    }

    /// The error an append whose record has position `lsn` gets.
    pub(super) fn error_for(&self, lsn: Option<u64>) -> Error {
        match lsn {
            Some(l) if (self.group.0..self.group.1).contains(&l) => Error::Io {
                op: self.op,
                path: self.path.clone(),
                source: io::Error::new(self.kind, self.message.clone()),
            },
            _ => Error::Poisoned {
                cause: format!("{} {}: {}", self.op, self.path.display(), self.message),
            },
        }
    }
}

/// What appenders waiting for a group read without the state lock.
#[derive(Default)]
pub(super) struct Signal {
    /// Every group with a smaller id is done: durable and applied, or failed.
    pub(super) completed: AtomicU64,
    /// Records before this position are durable.
    pub(super) durable: AtomicU64,
    pub(super) failed: AtomicBool,
    pub(super) words: [AtomicU32; WAIT_SLOTS],
}

impl Signal {
    pub(super) fn word(&self, group: u64) -> &AtomicU32 {
        &self.words[(group % WAIT_SLOTS as u64) as usize]
    }

    /// Sleeps until group `group` is done or the store is poisoned.
    pub(super) fn await_group(&self, group: u64) {
        let w = self.word(group);
        loop {
            let seen = w.load(Ordering::Acquire);
            if self.completed.load(Ordering::Acquire) > group || self.failed.load(Ordering::Acquire)
            {
                return;
            }
            atomic_wait::wait(w, seen);
        }
    }

    /// Wakes the waiters of `group` (every waiter after a failure). One
    /// futex call wakes them all: the kernel does the rest, and the leader
    /// makes no call per waiter.
    pub(super) fn wake(&self, group: u64, failed: bool) {
        let words = if failed {
            &self.words[..]
        } else {
            std::slice::from_ref(self.word(group))
        };
        for w in words {
            w.fetch_add(1, Ordering::Release);
            atomic_wait::wake_all(w);
        }
    }
}

impl State {
    /// Tells the flusher thread to take over as leader.
    pub(super) fn call_flusher(&mut self) {
        self.flusher_turn = true;
        if let Some(f) = &self.flusher {
            f.unpark();
        }
    }
}

impl Shared {
    /// `Always`, after queueing: leads a group commit if nobody does (the
    /// caller's record is then in it), else leaves the records to the leader.
    pub(super) fn commit(&self, mut st: MutexGuard<'_, State>) {
        if st.leading {
            return;
        }
        st.leading = true;
        self.lead(st, false);
    }

    /// Buffered policies, before an append: waits while [`MAX_BUFFERED`]
    /// bytes of records are pending (the disk is behind) for the write in
    /// progress, after which the flusher takes the whole buffer. So the
    /// buffer never holds more than that plus one call's records.
    pub(super) fn room<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while st.buf.len() >= MAX_BUFFERED && st.failed.is_none() {
            self.hand_to_flusher(&mut st);
            let group = st.writing.unwrap_or(st.group);
            drop(st);
            self.signal.await_group(group);
            st = self.lock_state();
        }
        st
    }

    /// Buffered policies: starts the flusher on the buffer unless a write
    /// is already under way (which takes whatever is buffered next).
    pub(super) fn hand_to_flusher(&self, st: &mut State) {
        if !st.leading {
            st.leading = true;
            st.call_flusher();
        }
    }

    /// Waits until the record at `lsn`, in group `group`, is durable.
    pub(super) fn await_durable(&self, group: u64, lsn: u64) -> Result<()> {
        self.signal.await_group(group);
        if self.signal.durable.load(Ordering::Acquire) > lsn {
            return Ok(());
        }
        let st = self.lock_state();
        if st.durable > lsn {
            return Ok(());
        }
        Err(match &st.failed {
            Some(f) => f.error_for(Some(lsn)),
            None => Error::Poisoned {
                cause: format!("internal error: group {group} done without record {lsn}"),
            },
        })
    }

    /// Leads group commits: takes the forming group (every record queued),
    /// writes it with one `write` (in log order: the writer lock is taken
    /// before the state lock is let go), fsyncs it through a handle of its
    /// own if the policy or a `sync` call asks, applies it (`Always`) and
    /// wakes its waiters with one futex call. Then, if records were queued
    /// meanwhile, an appender (`flusher` false) hands the next group to the
    /// flusher thread and returns to its caller, while the flusher goes on
    /// until nothing is queued. The check for more comes after the wake-up,
    /// so that appenders woken by it can join the next group.
    pub(super) fn lead<'a>(&'a self, mut st: MutexGuard<'a, State>, flusher: bool) {
        let mut due = false;
        loop {
            let group = st.group;
            st.group += 1;
            st.writing = Some(group);
            let first = st.buf_first;
            let end = st.next_lsn;
            let spare = std::mem::take(&mut st.spare);
            let mut buf = st.buf.take(spare);
            let queued = std::mem::take(&mut st.queued);
            st.buf_first = end;
            let needs_sync = (self.is_always() || st.sync_to > st.durable) && st.durable < end;
            let mut w = lock(&self.writer);
            drop(st);

            let result = (|| {
                if !buf.is_empty() {
                    w.write(&mut buf, first, end - first)?;
                }
                let handle = if needs_sync {
                    Some(w.sync_handle()?)
                } else {
                    None
                };
                drop(w);
                if let Some((mut h, token)) = handle {
                    h.sync_data()
                        .map_err(|e| Error::io("fsync", &token.path, e))?;
                    lock(&self.writer).synced(&token);
                }
                Ok::<(), Error>(())
            })();

            st = self.lock_state();
            let result = result.and_then(|()| {
                if let Some(f) = &st.failed {
                    return Err(f.error_for(None));
                }
                if !buf.is_empty() {
                    st.stats.groups_written += 1;
                    st.stats.records_written += end - first;
                }
                if needs_sync {
                    st.stats.log_fsyncs += 1;
                    st.durable = end;
                    st.apply_group(queued)
                        .map_err(|m| Error::Poisoned { cause: m })?;
                }
                Ok(())
            });
            if let Err(e) = &result
                && st.failed.is_none()
            {
                // Everything not yet durable is lost to the appends waiting on it.
                let range = (st.durable, st.next_lsn);
                st.failed = Some(Failure::from_error(e, range));
                st.overlay.clear();
                st.queued.clear();
                st.buf.clear();
                self.signal.failed.store(true, Ordering::Release);
            }
            buf.clear();
            if st.spare.capacity() < buf.capacity() {
                st.spare = buf;
            }
            st.writing = None;
            self.signal.durable.store(st.durable, Ordering::Release);
            self.signal.completed.store(group + 1, Ordering::Release);
            let failed = st.failed.is_some();
            due |= self.is_always() && self.note_snapshot_due(&mut st);
            drop(st);
            self.signal.wake(group, failed);
            self.group_done.notify_all();

            st = self.lock_state();
            // Under the buffered policies a short buffer waits for the
            // next append to fill it to FLUSH_BYTES (or for a sync): taking
            // every few records as they come would make the appenders and
            // the flusher fight over the lock for each.
            let short = !self.is_always() && st.buf.len() < FLUSH_BYTES && st.sync_to <= st.durable;
            if st.buf.is_empty() || st.failed.is_some() || short {
                st.leading = false;
                break;
            }
            if !flusher {
                st.call_flusher();
                break;
            }
        }
        drop(st);
        // `sync` may be waiting for the lead to end.
        self.group_done.notify_all();
        if due {
            self.snapshot_due();
        }
    }

    /// The flusher thread: takes over group commits from an appender when
    /// records keep arriving (so that the appender returns to its caller)
    /// and writes the buffered policies' records in the background.
    pub(super) fn flush_loop(&self) {
        loop {
            let mut st = self.lock_state();
            while !st.flusher_turn {
                if st.stopping {
                    return;
                }
                drop(st);
                std::thread::park();
                st = self.lock_state();
            }
            st.flusher_turn = false;
            self.lead(st, true);
        }
    }

    pub(super) fn sync(&self) -> Result<()> {
        let mut st = self.lock_state();
        if let Some(f) = &st.failed {
            return Err(f.error_for(None));
        }
        let target = st.next_lsn;
        st.sync_to = st.sync_to.max(target);
        loop {
            // Durable first: a later group's failure does not undo it.
            if st.durable >= target {
                return Ok(());
            }
            if let Some(f) = &st.failed {
                // A failure during this call: the IO error itself if it
                // lost records the call covers.
                return Err(f.error_for(target.checked_sub(1)));
            }
            if st.leading {
                st = self.group_done.wait(st).unwrap_or_else(|e| e.into_inner());
            } else {
                st.leading = true;
                self.lead(st, false);
                st = self.lock_state();
            }
        }
    }

    /// `Interval(d)`: writes and fsyncs the buffered records every `d`.
    pub(super) fn tick(&self) {
        let FsyncPolicy::Interval(every) = self.opts.fsync else {
            return;
        };
        let mut next = Instant::now() + every;
        loop {
            let mut bg = lock(&self.bg);
            loop {
                if bg.stop {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                bg = self
                    .bg_cv
                    .wait_timeout(bg, next - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(bg);
            // A failure poisons the store; appends report it.
            let _ = self.sync();
            next = Instant::now() + every;
        }
    }
}
