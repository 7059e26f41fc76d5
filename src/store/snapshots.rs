//! Online snapshots and retention.

use super::*;

pub(super) struct Book {
    /// Positions of every snapshot file on disk.
    pub(super) files: BTreeSet<u64>,
    /// Positions of snapshots not known to be damaged, oldest first.
    pub(super) valid: Vec<u64>,
    /// Segments detached from the writer whose removal failed: retention
    /// tries them again next time.
    pub(super) orphans: Vec<PathBuf>,
}

impl Shared {
    /// True (once) when an automatic snapshot threshold has been crossed.
    pub(super) fn note_snapshot_due(&self, st: &mut State) -> bool {
        let (records, bytes) = st.since_snapshot;
        let due = self
            .opts
            .snapshot_every_records
            .is_some_and(|n| records >= n)
            || self.opts.snapshot_every_bytes.is_some_and(|n| bytes >= n);
        if due && !st.snapshot_requested && st.failed.is_none() {
            st.snapshot_requested = true;
            return true;
        }
        false
    }

    /// Starts (or, without a background thread, takes) a due snapshot.
    pub(super) fn snapshot_due(&self) {
        if self.opts.background_snapshots {
            let mut bg = lock(&self.bg);
            bg.snapshot_wanted = true;
            self.bg_cv.notify_all();
        } else if let Err(e) = self.take_snapshot() {
            *lock(&self.snapshot_error) = Some(e.to_string());
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
            if let Err(e) = self.take_snapshot() {
                *lock(&self.snapshot_error) = Some(e.to_string());
            }
        }
    }

    pub(super) fn take_snapshot(&self) -> Result<Option<PathBuf>> {
        let mut book = lock(&self.book);
        let fs = self.opts.fs.as_ref();
        let position = {
            let mut st = self.lock_state();
            st.snapshot_requested = false;
            if let Some(f) = &st.failed {
                return Err(f.error_for(None));
            }
            // Under `Always` the committed state is exactly the durable
            // records; under buffered policies every record is applied.
            let p = if self.is_always() {
                st.durable
            } else {
                st.next_lsn
            };
            if book.valid.last() == Some(&p) {
                st.since_snapshot = (0, 0);
                return Ok(None);
            }
            st.capture = Some(Capture {
                position: p,
                done: [false; SHARDS],
                pre: (0..SHARDS).map(|_| HashMap::new()).collect(),
            });
            st.since_snapshot = (0, 0);
            p
        };
        let written = self.write_snapshot(fs, position);
        self.lock_state().capture = None;
        let path = match written {
            Ok(p) => p,
            Err(e) => {
                let tmp = self.dir.join(format!(
                    "{}{}",
                    snapshot::file_name(position),
                    snapshot::TMP_SUFFIX
                ));
                let _ = fs.remove_file(&tmp);
                return Err(e);
            }
        };
        self.lock_state().stats.snapshots_written += 1;
        book.files.insert(position);
        book.valid.retain(|&p| p != position);
        book.valid.push(position);
        *lock(&self.snapshot_error) = None;
        self.retain(&mut book)?;
        Ok(Some(path))
    }

    pub(super) fn write_snapshot(&self, fs: &dyn FileSystem, position: u64) -> Result<PathBuf> {
        let mut w = snapshot::Writer::create(fs, &self.dir, position)?;
        let mut chunk = Vec::new();
        let mut n = 0u64;
        for i in 0..SHARDS {
            {
                let mut st = lock(&self.state);
                let st = &mut *st;
                let Some(c) = &mut st.capture else {
                    return Err(Error::Poisoned {
                        cause: "snapshot capture lost".into(),
                    });
                };
                let pre = std::mem::take(&mut c.pre[i]);
                for (id, partition, entry) in st.shards.shard(i).iter() {
                    let e = match pre.get(&(id.clone(), partition)) {
                        Some(Some(old)) => *old,
                        Some(None) => continue,
                        None => entry,
                    };
                    snapshot::encode_entry(&mut chunk, &id, partition, &e);
                    n += 1;
                }
                c.done[i] = true;
            }
            // Let appenders that queued for the lock meanwhile take it
            // before the next shard (bounded, should one never get there).
            let waited = std::time::Instant::now();
            while self.state_waiters.load(Ordering::Relaxed) > 0
                && waited.elapsed() < Duration::from_millis(1)
            {
                std::thread::yield_now();
            }
            // Write in pieces of about 1 MiB: few IO calls, bounded memory.
            if chunk.len() >= 1 << 20 || i == SHARDS - 1 {
                w.write(&chunk, n)?;
                chunk.clear();
                n = 0;
            }
        }
        if !self.is_always() {
            // The snapshot covers records the log may not hold durably yet:
            // make the log durable first, or a crash could leave a snapshot
            // ahead of its log.
            self.sync()?;
        }
        w.finish(fs, &self.dir)
    }

    /// Deletes snapshots beyond the newest `keep_snapshots`, and the log
    /// segments whose records all lie before the oldest one kept.
    pub(super) fn retain(&self, book: &mut Book) -> Result<()> {
        let keep = self.opts.keep_snapshots;
        if book.valid.len() <= keep {
            return Ok(());
        }
        let oldest_kept = book.valid[book.valid.len() - keep];
        let fs = self.opts.fs.as_ref();
        let doomed: Vec<u64> = book
            .files
            .iter()
            .copied()
            .filter(|&p| p < oldest_kept)
            .collect();
        // A file already gone (removed by hand, say) is what we wanted.
        let remove = |path: &Path| match remove_gradually(fs, path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path, e)),
            _ => Ok(()),
        };
        for p in &doomed {
            remove(&self.dir.join(snapshot::file_name(*p)))?;
            book.files.remove(p);
        }
        book.valid.retain(|&p| p >= oldest_kept);
        let mut segments = std::mem::take(&mut book.orphans);
        segments.extend(lock(&self.writer).detach_before(oldest_kept));
        let mut left = segments.into_iter();
        while let Some(path) = left.next() {
            if let Err(e) = remove(&path) {
                book.orphans.push(path);
                book.orphans.extend(left);
                return Err(e);
            }
        }
        fs.sync_dir(&self.dir)
            .map_err(|e| Error::io("fsync directory", &self.dir, e))
    }
}
