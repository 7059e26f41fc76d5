//! Online snapshots and retention.
//!
//! A snapshot is the state at one log position P, written without stopping
//! appenders and without a second copy of the state: the state is split
//! into 256 shards and the snapshot encodes one shard at a time under the
//! store's lock. An append applied after P to a shard not yet encoded first
//! saves the key's entry as it was at P (a pre-image, see
//! [`super::keys::Capture`]), and the encoder uses those. Appenders wait at
//! most for one shard's encoding.
//!
//! Once a snapshot is durable, retention deletes the snapshots beyond the
//! newest `keep_snapshots` and the log segments older than the oldest kept.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::commit::{GroupCommit, lock};
use super::keys::{Capture, Keys};
use super::state::State;
use crate::directory::names;
use crate::engine::shards::SHARDS;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, remove_gradually};
use crate::recovery::truncate::{self, Base};
use crate::snapshot;

/// A snapshot of at least this many keys (a few MiB: 37 bytes a key or
/// more) issues its every-1-MiB fsyncs on a thread of its own
/// (`background_sync.rs`), its encoding going on meanwhile; a smaller one
/// has a few fsyncs at most, not worth a thread, and issues them inline.
const BACKGROUND_SYNC_FROM: usize = 100_000;

/// The snapshot files on disk.
pub(super) struct Book {
    /// Positions of every snapshot file on disk.
    pub(super) files: BTreeSet<u64>,
    /// Positions of snapshots not known to be damaged, oldest first.
    pub(super) valid: Vec<u64>,
    /// Segments detached from the writer whose removal failed: retention
    /// tries them again next time.
    pub(super) orphans: Vec<PathBuf>,
}

/// Takes snapshots and keeps the newest few.
pub(super) struct Snapshots {
    dir: PathBuf,
    fs: Arc<dyn FileSystem>,
    keep: usize,
    /// Held by a snapshot while it runs: one at a time.
    book: Mutex<Book>,
    /// The last automatic snapshot's error (apart from `book`, which a
    /// snapshot holds while it runs).
    last_error: Mutex<Option<Arc<Error>>>,
}

impl Snapshots {
    pub(super) fn new(dir: PathBuf, fs: Arc<dyn FileSystem>, keep: usize, book: Book) -> Snapshots {
        Snapshots {
            dir,
            fs,
            keep,
            book: Mutex::new(book),
            last_error: Mutex::new(None),
        }
    }

    /// Holds the book: no snapshot is taken and no file retained or
    /// deleted until the guard is dropped (truncation reads them).
    pub(super) fn hold(&self) -> std::sync::MutexGuard<'_, Book> {
        lock(&self.book)
    }

    /// The error of the last automatic snapshot, if it failed.
    pub(super) fn last_error(&self) -> Option<Arc<Error>> {
        lock(&self.last_error).clone()
    }

    /// Notes an automatic snapshot's failure.
    pub(super) fn set_error(&self, e: Error) {
        *lock(&self.last_error) = Some(Arc::new(e));
    }

    /// Takes a snapshot of the state behind `log`'s lock now; `sync` makes
    /// the log durable (buffered policies: a snapshot must not be ahead of
    /// its log). A snapshot written is reported to the store's telemetry
    /// (a failure is the caller's to report: it knows who gets the error).
    pub(super) fn take(
        &self,
        log: &GroupCommit<State>,
        sync: impl Fn() -> Result<()>,
    ) -> Result<Option<PathBuf>> {
        let mut book = lock(&self.book);
        let started = Instant::now();
        let fs = self.fs.as_ref();
        let position = {
            let mut st = log.lock_state();
            st.snapshot_requested = false;
            if let Some(f) = st.log.failed() {
                return Err(f.error_for(None));
            }
            // Under `Always` the committed state is exactly the durable
            // records; under buffered policies every record is applied.
            // Kafka mode applies every record as it is queued (see
            // `txn.rs`): its state is that of every record queued, which
            // the snapshot then waits to be durable.
            let p = if log.is_always() && st.keys.meta.kafka.is_none() {
                st.log.durable()
            } else {
                st.log.next_position()
            };
            if book.valid.last() == Some(&p) {
                st.since_snapshot = (0, 0);
                return Ok(None);
            }
            // The store section's fields; a Kafka-mode engine is not
            // copied here but rebuilt at `p` from the files (`write`).
            let kafka = st.keys.meta.kafka.take();
            let meta = st.keys.meta.clone();
            st.keys.meta.kafka = kafka;
            st.keys.capture = Some(Capture::new(p, meta));
            st.since_snapshot = (0, 0);
            p
        };
        // Where the position lies in the log, for recovery to seek there.
        log.writer().pin(position);
        let base = book.valid.last().copied();
        let written = self.write(fs, log, (position, base), sync);
        log.lock_state().keys.capture = None;
        let (path, keys, bytes) = match written {
            Ok(w) => w,
            Err(e) => {
                let tmp = self.dir.join(format!(
                    "{}{}",
                    names::snapshot_name(position),
                    names::SNAPSHOT_TMP_SUFFIX
                ));
                let _ = fs.remove_file(&tmp);
                return Err(e);
            }
        };
        let live = {
            let mut st = log.lock_state();
            st.snapshots_written += 1;
            st.keys.shards.len()
        };
        let t = log.telemetry();
        t.snapshot_written(position, keys, bytes, started.elapsed());
        t.producers(live);
        book.files.insert(position);
        book.valid.retain(|&p| p != position);
        book.valid.push(position);
        *lock(&self.last_error) = None;
        self.retain(&mut book, log)?;
        Ok(Some(path))
    }

    /// Writes the snapshot at `position` (`base`: the newest valid snapshot
    /// below it, if any); returns its path, keys and bytes.
    fn write(
        &self,
        fs: &dyn FileSystem,
        log: &GroupCommit<State>,
        (position, base): (u64, Option<u64>),
        sync: impl Fn() -> Result<()>,
    ) -> Result<(PathBuf, u64, u64)> {
        let mut w = snapshot::Writer::create(fs, &self.dir, position)?;
        {
            // The store-level state at the position, captured with it.
            let st = log.lock_state_quietly();
            let Some(c) = &st.keys.capture else {
                return Err(Error::Internal(
                    "a snapshot's capture of the state was lost",
                ));
            };
            if st.keys.shards.len() >= BACKGROUND_SYNC_FROM {
                w.sync_in_background();
            }
            let mut section = Vec::new();
            c.meta.encode(&mut section);
            let kafka = st.keys.meta.kafka.is_some();
            drop(st);
            w.write(&section, 0)?;
            if kafka {
                // A Kafka-mode state at the position: its side table and
                // aborted lists, then its compact keys, rebuilt from the
                // newest snapshot and the log on this thread (appenders go
                // on), once the log holds every record below the position.
                sync()?;
                let (segments, last_len) = log.writer().written();
                let base = match base {
                    Some(p) => Base {
                        snapshot: Some(self.dir.join(names::snapshot_name(p))),
                        position: p,
                    },
                    None => Base {
                        snapshot: None,
                        position: 0,
                    },
                };
                let k = truncate::kafka_state_at(&truncate::History {
                    fs,
                    dir: &self.dir,
                    base: &base,
                    segments: &segments,
                    last_len,
                    end: position,
                    units: None,
                    skimmed: Default::default(),
                })?;
                if let Some(side) = k.kafka_side() {
                    w.write_kafka(side)?;
                }
                let mut blocks = snapshot::Blocks::default();
                for (id, partition, e, act) in k.compact_entries() {
                    blocks.push(snapshot::UNSHARDED, &id, partition, &e, act);
                    if blocks.len() >= 1 << 20 {
                        blocks.flush(&mut w)?;
                    }
                }
                blocks.flush(&mut w)?;
                point(log, position, &mut w);
                let (keys, bytes) = w.size();
                return Ok((w.finish(fs, &self.dir)?, keys, bytes));
            }
        }
        // One block per shard (or more, for a shard of over 1 MiB).
        let mut blocks = snapshot::Blocks::default();
        for i in 0..SHARDS {
            {
                let mut st = log.lock_state_quietly();
                encode_shard(&mut st.keys, i, &mut blocks)?;
            }
            log.let_waiters_in();
            // Write in pieces of about 1 MiB: few IO calls, bounded memory.
            if blocks.len() >= 1 << 20 || i == SHARDS - 1 {
                blocks.flush(&mut w)?;
            }
        }
        if !log.is_always() {
            // The snapshot covers records the log may not hold durably yet:
            // make the log durable first, or a crash could leave a snapshot
            // ahead of its log.
            sync()?;
        }
        point(log, position, &mut w);
        let (keys, bytes) = w.size();
        Ok((w.finish(fs, &self.dir)?, keys, bytes))
    }

    /// Deletes snapshots beyond the newest `keep_snapshots`, and the log
    /// segments whose records all lie before the oldest one kept.
    fn retain(&self, book: &mut Book, log: &GroupCommit<State>) -> Result<()> {
        let keep = self.keep;
        if book.valid.len() <= keep {
            return Ok(());
        }
        let oldest_kept = book.valid[book.valid.len() - keep];
        let fs = self.fs.as_ref();
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
            remove(&self.dir.join(names::snapshot_name(*p)))?;
            book.files.remove(p);
        }
        book.valid.retain(|&p| p >= oldest_kept);
        // No truncation starts before the oldest snapshot kept now: where
        // the records before it lie need not be kept (recovery::reach).
        log.lock_state().log.reach_mut().forget_below(oldest_kept);
        let mut segments = std::mem::take(&mut book.orphans);
        segments.extend(log.writer().detach_before(oldest_kept));
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

/// Encodes shard `i` as it was at the snapshot's position: its keys from
/// their slots where none changed since, else with the pre-images of the
/// keys that did (and of those removed since).
fn encode_shard(keys: &mut Keys, i: usize, blocks: &mut snapshot::Blocks) -> Result<()> {
    let shard = i as u16;
    let Some(c) = &mut keys.capture else {
        return Err(Error::Internal(
            "a snapshot's capture of the state was lost",
        ));
    };
    let pre = std::mem::take(&mut c.pre[i]);
    // Keys removed since the position are in `pre` and no
    // longer in the shard: encoded from their pre-images.
    if pre.is_empty() {
        // No key of the shard changed since the position (the
        // usual case): each is encoded from its slot and
        // window where they lie.
        keys.shards
            .shard(i)
            .for_each_raw(|id, partition, head, window, act| {
                blocks.push_parts(shard, id, partition, head, window, act.ms());
            });
    } else {
        for (id, partition, entry, act) in keys.shards.shard(i).iter_full() {
            let (e, a) = match pre.get(&(id.clone(), partition)) {
                Some(Some(old)) => *old,
                Some(None) => continue,
                None => (entry, act.ms()),
            };
            blocks.push(shard, &id, partition, &e, a);
        }
    }
    for ((id, partition), old) in &pre {
        if let Some((e, a)) = old
            && !keys.shards.shard(i).contains_hashed(
                crate::engine::map::hash_key(id, *partition),
                id,
                *partition,
            )
        {
            blocks.push(shard, id, *partition, e, *a);
        }
    }
    c.done[i] = true;
    Ok(())
}

/// Gives the snapshot at `position` the point where that position lies in
/// the log, if the writer knows it and it lies inside a segment (at a
/// segment's start there is nothing to skip: no point, version 5). Called
/// once every record below `position` is written.
fn point(log: &GroupCommit<State>, position: u64, w: &mut snapshot::Writer) {
    let found = log.writer().take_pin(position);
    if let Some(p) = found.filter(|p| p.first_position < position)
        && let Ok(offset) = u32::try_from(p.offset)
    {
        w.set_point(snapshot::LogPoint {
            offset,
            seed: p.seed,
        });
    }
}
