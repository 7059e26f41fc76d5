//! Writes sealed groups of records to the active segment and rolls to a new
//! segment when it is full.
//!
//! A group (everything one leader writes at once) never spans two segments,
//! so the segment size is a soft limit. A new segment is created, its header
//! written and fsync'ed, and the directory fsync'ed before any record goes
//! into it; the segment it replaces is fsync'ed first, so every segment but
//! the last is complete on disk.
//!
//! Preallocation (the default; the preallocated flag of format version
//! 5): a segment is made as a temporary file `<active segment>.wal.prep`
//! of `segment_size` zeros, written (not a hole, not `fallocate`, whose
//! unwritten extents still cost a metadata commit on ext4) and fsync'ed;
//! at the roll its header is written into it, fsync'ed, and it is renamed
//! into place and the directory fsync'ed. Records then overwrite blocks that are allocated and
//! written, so the `fdatasync` of a group commits no file-system metadata
//! (about 1.4x faster here). The next segment is prepared on a thread of
//! its own once the active one is half full (or, without background work,
//! by the append that rolls). A segment left before its preallocated end (a
//! group that did not fit) is cut to its records and fsync'ed before the
//! next one is created, so only the last segment has room left.
//!
//! Preallocated segments grow with the log: a new store's first segment
//! has [`FIRST_SEGMENT`] bytes, and each next one [`GROWTH`] times its
//! predecessor's, up to `segment_size`. A store that holds little costs
//! little disk (an empty one 64 KiB, not a whole segment of zeros), and a
//! busy one reaches full-size segments within a few rolls.
//!
//! File descriptors: the steady state (writing groups, fsyncing them) opens
//! none. The second handle that group commit fsyncs through is duplicated
//! once per segment and kept; if the process has no descriptor left for
//! it, the fsync goes through the writer's own handle. A roll needs
//! descriptors (the next file, the directory's fsync); when one is refused
//! for want of descriptors (`EMFILE`, `ENFILE`), nothing is lost and the
//! store is not poisoned: the group goes into the active segment, which
//! grows past its size, and the next group tries the roll again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::frame;
use super::points::{Points, SegmentPoint};
use super::record;
use super::segment::{self, Ids};
use crate::directory::names;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, WriteFile};

/// The most bytes a segment holds (header included), so that a record's
/// distance from the durable end fits its `u32` field.
pub(crate) const MAX_SEGMENT_BYTES: u64 = u32::MAX as u64;

/// A new store's first preallocated segment, in bytes.
pub(crate) const FIRST_SEGMENT: u64 = 64 << 10;
/// Each preallocated segment is this many times its predecessor, up to the
/// segment size: 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB, 64 MiB by default.
pub(crate) const GROWTH: u64 = 4;

/// True for `EMFILE` and `ENFILE` (Linux and the BSDs): no file descriptor
/// left for the process or the system. The call had no effect and may work
/// later.
fn out_of_descriptors(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(24 | 23)))
}

/// The active segment's second handle, through which group commit fsyncs
/// without holding the writer (only the leader does, one at a time).
pub(crate) type SyncFile = Arc<Mutex<Box<dyn WriteFile>>>;

/// What an fsync through [`LogWriter::sync_handle`] covers.
pub(crate) struct SyncToken {
    pub path: PathBuf,
    first_position: u64,
    len: u64,
}

/// Where the store id and the segment salts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum IdSource {
    /// Random: a new store id for a new store, a new salt for every segment.
    #[default]
    Random,
    /// Derived from this seed and the segment's first position, so that a
    /// fixed history writes fixed bytes (the golden files). Tests only: two
    /// stores with one seed cannot tell their segments apart.
    Fixed(u64),
}

impl IdSource {
    fn store(self) -> u64 {
        match self {
            IdSource::Random => random_u64(),
            IdSource::Fixed(seed) => mix(seed, 0),
        }
    }

    fn salt(self, pos: u64) -> u64 {
        match self {
            IdSource::Random => random_u64(),
            IdSource::Fixed(seed) => mix(seed, pos.wrapping_add(1)),
        }
    }
}

/// A random `u64` from the standard library alone: `RandomState` is keyed
/// randomly per process (and differently for every instance), hashed here
/// with the time, the process id and a counter. Not for cryptography; a
/// salt only has to differ from every other salt a disk may hold.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// splitmix64 of `seed` and `i`.
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How the writer lays out new segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The size a segment is rolled at (and preallocated to).
    pub segment_size: u64,
    /// Where the store id and the segment salts come from.
    pub ids: IdSource,
    /// Preallocate each segment to `segment_size` (version 5 with the
    /// preallocated flag), or let it grow by appends (the flag clear).
    pub preallocate: bool,
    /// Prepare the next preallocated segment on a thread of its own; if
    /// not, the append that rolls prepares it (deterministic, for tests).
    pub background: bool,
    /// The store runs `Semantics::Kafka`: every new segment's header says
    /// so (the Kafka flag of version 5), and it may hold kinds 16 to 20.
    pub kafka: bool,
}

/// The next segment's file.
enum Next {
    /// Being zero-filled and fsync'ed under its temporary name, on a
    /// thread of its own.
    Preparing {
        tmp: PathBuf,
        size: u64,
        thread: std::thread::JoinHandle<io::Result<Box<dyn WriteFile>>>,
    },
    /// Made (a roll that was postponed gave it back).
    Ready(Fresh),
}

/// A file made for the next segment under its temporary name, not yet
/// installed.
struct Fresh {
    tmp: PathBuf,
    file: Box<dyn WriteFile>,
    /// Its preallocated length; 0 when it grows by appends.
    size: u64,
}

/// The temporary name of the segment prepared while the one starting at
/// `active` is written.
fn prep_path(dir: &Path, active: u64) -> PathBuf {
    dir.join(names::segment_prep_name(active))
}

/// Creates `path` and fills it with `len` zeros, fsync'ed (none: empty).
fn prepare(fs: &dyn FileSystem, path: &Path, len: u64) -> io::Result<Box<dyn WriteFile>> {
    let mut f = fs.create_new(path)?;
    if len > 0 {
        f.write_zeros(0, len)?;
        f.sync_data()?;
    }
    Ok(f)
}

/// One segment on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentInfo {
    pub first_position: u64,
}

pub(crate) struct LogWriter {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    file: Box<dyn WriteFile>,
    path: PathBuf,
    first_position: u64,
    /// The CRC seed of the active segment's records.
    seed: u32,
    /// The store id every new segment gets.
    store: u64,
    len: u64,
    /// Bytes of the active segment known to be durable (fsync'ed). Every
    /// record states how far past this it was written; see
    /// [`frame::seal`].
    synced: u64,
    records: u64,
    /// Every live segment, oldest first; the last is the active one.
    segments: Vec<SegmentInfo>,
    /// A write failed (its operation and kind): the file's end is
    /// unknown, nothing more is written.
    broken: Option<(&'static str, io::ErrorKind)>,
    /// The active segment has an older format version: roll before writing.
    roll_first: bool,
    /// The active segment's length on disk: zeros from `len` to here.
    alloc: u64,
    /// Where the active segment rolls: its preallocated size, else
    /// `segment_size`.
    active_size: u64,
    layout: Layout,
    /// The next segment, prepared or being prepared.
    next: Option<Next>,
    /// The active segment's second handle, once duplicated.
    sync_file: Option<SyncFile>,
    /// Where recent groups ended, and the position a snapshot pinned.
    points: Points,
}

impl LogWriter {
    /// Starts a new segment whose first record will have position `pos`.
    /// `store` is the store id of the log so far (`None`: a new store, or
    /// a log of versions before 3: a new id is drawn).
    pub(crate) fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        pos: u64,
        mut segments: Vec<SegmentInfo>,
        store: Option<u64>,
        layout: Layout,
    ) -> Result<LogWriter> {
        let Layout {
            segment_size, ids, ..
        } = layout;
        let store = store.unwrap_or_else(|| ids.store());
        // The first segment is prepared here, at open, like any other: the
        // first append must not pay for allocating blocks.
        let size = if layout.preallocate {
            segment_size.min(FIRST_SEGMENT)
        } else {
            0
        };
        let tmp = prep_path(dir, pos);
        let file =
            prepare(fs.as_ref(), &tmp, size).map_err(|e| Error::io("preallocate", &tmp, e))?;
        let mut fresh = Fresh { tmp, file, size };
        let (path, seed) = new_segment(fs.as_ref(), dir, pos, store, ids, &mut fresh, layout.kafka)
            .map_err(|e| e.error)?;
        let mut w = LogWriter {
            fs,
            dir: dir.to_path_buf(),
            file: fresh.file,
            path,
            first_position: pos,
            seed,
            store,
            len: segment::HEADER_LEN as u64,
            synced: segment::HEADER_LEN as u64,
            records: 0,
            segments: Vec::new(),
            broken: None,
            roll_first: false,
            alloc: size.max(segment::HEADER_LEN as u64),
            active_size: if layout.preallocate {
                size.max(segment::HEADER_LEN as u64)
            } else {
                segment_size
            },
            layout,
            next: None,
            sync_file: None,
            points: Points::default(),
        };
        segments.push(SegmentInfo {
            first_position: pos,
        });
        w.segments = segments;
        w.prepare_next();
        Ok(w)
    }

    /// Continues the last of `segments`, which holds `records` records in
    /// `len` bytes (recovery has already cut any torn tail; a preallocated
    /// segment may hold zeros after them). fsyncs it first: recovery read
    /// those records, maybe from the page cache of a process that crashed,
    /// and new records must not follow bytes that are not durable without
    /// saying so. A segment of a format version before 5 is not written
    /// to: the next group starts a new segment (or, if it holds no record,
    /// it is replaced by a new one).
    pub(crate) fn resume(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        mut segments: Vec<SegmentInfo>,
        (len, records): (u64, u64),
        layout: Layout,
    ) -> Result<LogWriter> {
        let ids = layout.ids;
        let last = segments
            .last()
            .copied()
            .ok_or_else(|| Error::InvalidOptions("no segment to resume".into()))?;
        let path = dir.join(names::segment_name(last.first_position));
        let (head, alloc) = read_header(fs.as_ref(), &path)?;
        let version = head.version;
        // Only a segment of the current version may take lifecycle
        // records; an older one is left as it is.
        let writable = version >= segment::VERSION;
        if !writable && records == 0 {
            fs.remove_file(&path)
                .map_err(|e| Error::io("remove", &path, e))?;
            segments.pop();
            return LogWriter::create(fs, dir, last.first_position, segments, None, layout);
        }
        let mut file = fs
            .open_append(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        file.sync_data().map_err(|e| Error::io("fsync", &path, e))?;
        let mut w = LogWriter {
            fs,
            dir: dir.to_path_buf(),
            file,
            path,
            first_position: last.first_position,
            seed: head.seed,
            store: head.store.unwrap_or_else(|| ids.store()),
            len,
            synced: len,
            records,
            segments,
            broken: None,
            roll_first: !writable,
            alloc: alloc.max(len),
            active_size: if layout.preallocate {
                layout.segment_size.min(alloc.max(len).max(FIRST_SEGMENT))
            } else {
                layout.segment_size
            },
            layout,
            next: None,
            sync_file: None,
            points: Points::default(),
        };
        w.prepare_next();
        Ok(w)
    }

    /// Starts following where position `p` lies on disk, for a snapshot at
    /// `p` ([`LogWriter::take_pin`] tells): see [`Points::pin`].
    pub(crate) fn pin(&mut self, p: u64) {
        let written = self.next_position();
        self.points.pin(p, written);
    }

    /// Where the pinned position `p` lies on disk, if known; unpins.
    pub(crate) fn take_pin(&mut self, p: u64) -> Option<SegmentPoint> {
        self.points.take_pin(p)
    }

    /// The first positions of the live segments, oldest first.
    pub(crate) fn segments(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.first_position).collect()
    }

    /// The live segments (as [`LogWriter::segments`]) and the bytes
    /// written to the active one: every record written so far lies in
    /// them, whole, so a reader may read that much of the active segment
    /// while the log goes on.
    pub(crate) fn written(&self) -> (Vec<u64>, u64) {
        (self.segments(), self.len)
    }

    /// Position of the next record.
    pub(crate) fn next_position(&self) -> u64 {
        self.first_position + self.records
    }

    /// The preallocated size of the segment after the active one: the
    /// active one's times [`GROWTH`], up to `segment_size`; 0 without
    /// preallocation.
    fn next_size(&self) -> u64 {
        if self.layout.preallocate {
            self.layout
                .segment_size
                .min(self.active_size.saturating_mul(GROWTH))
                .max(FIRST_SEGMENT.min(self.layout.segment_size))
        } else {
            0
        }
    }

    /// Starts preparing the segment after the active one, on a thread of
    /// its own, if segments are preallocated in the background and the
    /// active one is half full (not before: its zeros would compete for
    /// the disk with the appends that follow an open). An error there is
    /// the next roll's.
    fn prepare_next(&mut self) {
        if !(self.layout.preallocate && self.layout.background)
            || self.next.is_some()
            || self.len < self.active_size / 2
        {
            return;
        }
        let path = prep_path(&self.dir, self.first_position);
        let size = self.next_size();
        let (fs, p) = (self.fs.clone(), path.clone());
        let spawned = std::thread::Builder::new()
            .name("producer-state-prealloc".into())
            .spawn(move || prepare(fs.as_ref(), &p, size));
        // No thread: the roll prepares it.
        if let Ok(thread) = spawned {
            self.next = Some(Next::Preparing {
                tmp: path,
                size,
                thread,
            });
        }
    }

    /// The next segment's file, made: waits for the thread preparing it, or
    /// prepares it now. Changes nothing on an error.
    fn take_next(&mut self) -> Result<Fresh> {
        match self.next.take() {
            Some(Next::Ready(fresh)) => Ok(fresh),
            Some(Next::Preparing { tmp, size, thread }) => match thread.join() {
                Ok(Ok(file)) => Ok(Fresh { tmp, file, size }),
                Ok(Err(e)) => {
                    // Nothing to keep: a file it made is removed, so that
                    // the next try can create it again.
                    let _ = self.fs.remove_file(&tmp);
                    Err(Error::io("preallocate", &tmp, e))
                }
                Err(_) => Err(Error::Internal("the thread preparing a segment panicked")),
            },
            None => {
                let tmp = prep_path(&self.dir, self.first_position);
                let size = self.next_size();
                match prepare(self.fs.as_ref(), &tmp, size) {
                    Ok(file) => Ok(Fresh { tmp, file, size }),
                    Err(e) => {
                        let _ = self.fs.remove_file(&tmp);
                        Err(Error::io("preallocate", &tmp, e))
                    }
                }
            }
        }
    }

    /// Writes one group of `count` records encoded by [`record::encode`],
    /// the first of which has position `pos`; rolls first if the active
    /// segment is full. Does not fsync (see [`LogWriter::sync`]). Returns
    /// the offset in its segment where the group starts.
    pub(crate) fn write(&mut self, buf: &mut [u8], pos: u64, count: u64) -> Result<u64> {
        // A group that does not continue the log exactly (an earlier write
        // failed) must not be written: its records would get wrong positions.
        if let Some((op, kind)) = self.broken {
            return Err(Error::Poisoned {
                op,
                path: self.path.clone(),
                kind,
            });
        }
        if pos != self.next_position() {
            return Err(Error::Internal(
                "a group of records does not continue the log",
            ));
        }
        let result = self.write_group(buf, pos, count);
        if let Err(e) = &result {
            self.broken = Some(match e {
                Error::Io { op, source, .. } => (*op, source.kind()),
                _ => ("write", io::ErrorKind::Other),
            });
        }
        result
    }

    fn write_group(&mut self, buf: &mut [u8], pos: u64, count: u64) -> Result<u64> {
        let end = self.len + buf.len() as u64;
        let must = self.roll_first || end > MAX_SEGMENT_BYTES;
        if self.records > 0
            && (must || self.len >= self.active_size)
            && let Some(refused) = self.roll(pos)?
            && must
        {
            // This group cannot go into the active segment either.
            return Err(refused);
        }
        if segment::HEADER_LEN as u64 + buf.len() as u64 > MAX_SEGMENT_BYTES {
            return Err(Error::io(
                "write",
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} bytes of records in one group: a segment holds at most {MAX_SEGMENT_BYTES}",
                        buf.len()
                    ),
                ),
            ));
        }
        // Below MAX_SEGMENT_BYTES, so every distance fits a u32.
        let unsynced = u32::try_from(self.len - self.synced).unwrap_or(u32::MAX);
        frame::seal(buf, self.seed, self.len, unsynced);
        // At its offset: into the zeros of a preallocated segment.
        self.file
            .write_all_at(self.len, buf)
            .map_err(|e| Error::io("write", &self.path, e))?;
        let start = self.len;
        self.len += buf.len() as u64;
        self.alloc = self.alloc.max(self.len);
        self.records += count;
        if count > 0 {
            let layout = record::Layout::of(segment::VERSION).with_kafka(self.layout.kafka);
            let segment = (self.first_position, self.seed);
            let (positions, bytes) = (pos..pos + count, start..self.len);
            self.points.written(buf, layout, segment, positions, bytes);
        }
        self.prepare_next();
        Ok(start)
    }

    /// A handle of the active segment to fsync it without holding the
    /// writer (its own file descriptor, duplicated once per segment); give
    /// the [`SyncToken`] back to [`LogWriter::synced`] once that fsync has
    /// succeeded. `None` when no descriptor could be had for it: fsync with
    /// [`LogWriter::sync`] instead.
    pub(crate) fn sync_handle(&mut self) -> Option<(SyncFile, SyncToken)> {
        if self.sync_file.is_none() {
            self.sync_file = Some(Arc::new(Mutex::new(self.file.try_clone().ok()?)));
        }
        let file = self.sync_file.clone()?;
        Some((
            file,
            SyncToken {
                path: self.path.clone(),
                first_position: self.first_position,
                len: self.len,
            },
        ))
    }

    /// Notes that an fsync through [`LogWriter::sync_handle`] succeeded:
    /// the bytes written before it are durable.
    pub(crate) fn synced(&mut self, token: &SyncToken) {
        if token.first_position == self.first_position {
            self.synced = self.synced.max(token.len);
        }
    }

    /// fsyncs the active segment.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("fsync", &self.path, e))?;
        self.synced = self.len;
        Ok(())
    }

    /// After an open that found the active segment's records ending with
    /// a close marker: removes the marker (zeros in a preallocated
    /// segment, else a shorter file) and fsyncs that before anything is
    /// appended. A marker left in place would stay the last record that
    /// decodes if a crash later lost the first pages written after it but
    /// kept later ones (sectors persisted out of order), and the next open
    /// would take that for a clean shutdown and check only the first MiB
    /// of the room (docs/format.md, rule 4), missing the records beyond.
    /// Without the marker that open reads the room to its end. Positions
    /// do not move: a marker takes none.
    pub(crate) fn reopen_after_close(&mut self) -> Result<()> {
        let marker = frame::HEADER as u64;
        if self.roll_first || self.len < segment::HEADER_LEN as u64 + marker {
            return Ok(());
        }
        let at = self.len - marker;
        let preallocated = self.alloc > self.len;
        let cut = if preallocated {
            self.file.write_zeros(at, marker)
        } else {
            self.file.set_len(at)
        };
        cut.and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io("remove the close marker", &self.path, e))?;
        self.len = at;
        self.synced = at;
        Ok(())
    }

    /// Writes a close marker and fsyncs it: the last thing a clean close
    /// does, so that the next open can report a clean shutdown. Skipped
    /// (`Ok`) when the active segment has an older version, which has no
    /// markers: the next open then reports the shutdown as unknown.
    pub(crate) fn close(&mut self) -> Result<()> {
        if self.roll_first || self.broken.is_some() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(frame::HEADER);
        record::encode_close(&mut buf);
        if self.len + buf.len() as u64 > MAX_SEGMENT_BYTES {
            return Ok(());
        }
        // Never a roll for it: a segment of nothing but a marker is no use.
        let unsynced = u32::try_from(self.len - self.synced).unwrap_or(u32::MAX);
        frame::seal(&mut buf, self.seed, self.len, unsynced);
        if let Err(e) = self.file.write_all_at(self.len, &buf) {
            self.broken = Some(("write", e.kind()));
            return Err(Error::io("write", &self.path, e));
        }
        self.len += buf.len() as u64;
        self.alloc = self.alloc.max(self.len);
        self.sync()
    }

    /// Starts the segment whose first record will have position `pos`.
    /// `Ok(Some(e))`: postponed, because `e` refused a file descriptor; the
    /// active segment stays active (complete on disk, its room cut), and
    /// the next group tries again.
    fn roll(&mut self, pos: u64) -> Result<Option<Error>> {
        // What needs a new descriptor comes first, while nothing has changed.
        let mut fresh = match self.take_next() {
            Ok(f) => f,
            Err(e) if out_of_descriptors(&e) => return Ok(Some(e)),
            Err(e) => return Err(e),
        };
        // Only the last segment may end in zeros (docs/format.md): cut the
        // room this one was not given records for.
        if self.alloc > self.len {
            self.file
                .set_len(self.len)
                .map_err(|e| Error::io("truncate", &self.path, e))?;
            self.alloc = self.len;
        }
        self.sync()?;
        let (path, seed) = match new_segment(
            self.fs.as_ref(),
            &self.dir,
            pos,
            self.store,
            self.layout.ids,
            &mut fresh,
            self.layout.kafka,
        ) {
            Ok(installed) => installed,
            Err(e) if out_of_descriptors(&e.error) => {
                // Refused the directory's fsync: take the new segment back
                // out of the directory (a crash before this leaves it there
                // empty, the last segment: what a finished roll leaves) and
                // keep its file for the next try.
                if e.renamed {
                    let at = self.dir.join(names::segment_name(pos));
                    self.fs
                        .rename(&at, &fresh.tmp)
                        .map_err(|err| Error::io("rename", &at, err))?;
                }
                self.next = Some(Next::Ready(fresh));
                return Ok(Some(e.error));
            }
            Err(e) => return Err(e.error),
        };
        self.file = fresh.file;
        self.path = path;
        self.seed = seed;
        self.sync_file = None;
        self.alloc = fresh.size.max(segment::HEADER_LEN as u64);
        self.active_size = if self.layout.preallocate {
            self.alloc
        } else {
            self.layout.segment_size
        };
        self.first_position = pos;
        self.len = segment::HEADER_LEN as u64;
        self.synced = segment::HEADER_LEN as u64;
        self.records = 0;
        self.roll_first = false;
        self.segments.push(SegmentInfo {
            first_position: pos,
        });
        self.prepare_next();
        Ok(None)
    }

    /// Forgets the segments whose records all lie before `position` (never
    /// the active one) and returns their paths, for the caller to delete
    /// without holding the writer.
    pub(crate) fn detach_before(&mut self, position: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        while self.segments.len() > 1
            && self
                .segments
                .get(1)
                .is_some_and(|s| s.first_position <= position)
        {
            let s = self.segments.remove(0);
            gone.push(self.dir.join(names::segment_name(s.first_position)));
        }
        gone
    }
}

impl Drop for LogWriter {
    /// A segment being prepared is waited for (no thread writes into the
    /// directory after the store has let it go) and its file removed; a
    /// crash before this leaves it to the next open, which removes it.
    fn drop(&mut self) {
        match self.next.take() {
            Some(Next::Preparing { tmp, thread, .. }) => {
                let _ = thread.join();
                let _ = self.fs.remove_file(&tmp);
            }
            Some(Next::Ready(fresh)) => {
                let _ = self.fs.remove_file(&fresh.tmp);
            }
            None => {}
        }
    }
}

/// The header of the segment at `path` (recovery has validated it), and
/// the file's length.
fn read_header(fs: &dyn FileSystem, path: &Path) -> Result<(segment::Header, u64)> {
    let mut f = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    let (h, _) = segment::read_header(path, &mut f)?;
    Ok((h, len))
}

/// Why installing a fresh file as a segment failed.
struct InstallError {
    error: Error,
    /// The file was renamed into place before the failure.
    renamed: bool,
}

/// Makes `fresh` the segment whose first record will have position `pos`,
/// with a fresh salt: writes its header (version 5, flagged preallocated if
/// it was), fsyncs it, renames it into place and fsyncs the directory.
/// Returns its path and its records' CRC seed.
fn new_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    pos: u64,
    store: u64,
    ids: IdSource,
    fresh: &mut Fresh,
    kafka: bool,
) -> std::result::Result<(PathBuf, u32), InstallError> {
    let path = dir.join(names::segment_name(pos));
    let header = segment::header_with(
        pos,
        Ids {
            store,
            salt: ids.salt(pos),
        },
        segment::VERSION,
        fresh.size > 0,
        kafka,
    );
    let seed = frame::seed(header.get(12..36).unwrap_or_default());
    let before = |error| InstallError {
        error,
        renamed: false,
    };
    let tmp = &fresh.tmp;
    fresh
        .file
        .write_all_at(0, &header)
        .map_err(|e| before(Error::io("write", tmp, e)))?;
    fresh
        .file
        .sync_data()
        .map_err(|e| before(Error::io("fsync", tmp, e)))?;
    fs.rename(tmp, &path)
        .map_err(|e| before(Error::io("rename", tmp, e)))?;
    fs.sync_dir(dir).map_err(|e| InstallError {
        error: Error::io("fsync directory", dir, e),
        renamed: true,
    })?;
    Ok((path, seed))
}
