//! The Raft log on disk: the one write-ahead log of a replica.
//!
//! Under Raft the log already is a write-ahead log: an entry is
//! acknowledged to the leader only after it is fsync'ed here, and a
//! committed entry is on a majority of these logs. So the state machine
//! keeps the producer state in memory and never writes a second log (see
//! docs/scaling.md, "Durability", for the choice and its measurement).
//!
//! Files in the replica's directory (bytes in docs/format.md):
//!
//! - `raft.log`: a 24-byte header with a random salt, then records
//!   `[len u32][crc32c u32][payload]`, one per entry, each CRC seeded by
//!   the salt (so bytes a producer chose never pass for a record),
//!   appended and fdatasync'ed before openraft hears the entries are
//!   flushed, by a writer thread that fsyncs every append queued while the
//!   last fsync ran at once (a group commit; `writer.rs`);
//! - `raft-meta.json`: the vote and the last purged log id, replaced
//!   atomically (temporary file, fsync, rename, directory fsync);
//! - `raft-committed.json`: the committed log id, a hint written without
//!   fsync (openraft re-applies committed entries at start up to it; if it
//!   is lost, unreadable, or names an entry the log does not hold, which a
//!   crash can leave, the replica learns the commit from the leader and
//!   applies then: nothing is applied twice either way).
//!
//! Every record states where the write it went out in began (a file
//! offset). On open, damage (a record cut short or failing its checksum)
//! at offset X followed by nothing valid, or only by records of writes
//! that began at or before X, is what a crash leaves of a write whose
//! fsync never returned: never acknowledged, it is cut there. Damage
//! followed by a record of a write that began after X is refused as
//! corruption: a write starts only after the one before it was fsync'ed,
//! so X was durable and acknowledged, and a replica must not forget
//! entries a majority may have counted. An offset, not an index, names the
//! write: a truncation cuts the file and the next write begins at the cut,
//! whatever indices the records left before it carry.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError, StorageIOError,
    Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use crate::command::{self, Command, MAX_COMMAND_BYTES, Reader};
use crate::state::StateMachine;
use crate::writer::{self, Op};
use crate::{NodeId, TypeConfig, read_file, write_atomically};
use producer_state::crc::RangeCrc;
use producer_state::fs::{FileSystem, StdFs};

pub(crate) const LOG_FILE: &str = "raft.log";
const META_FILE: &str = "raft-meta.json";
const COMMITTED_FILE: &str = "raft-committed.json";
const RECORD_HEADER: usize = 8;
const LOG_MAGIC: &[u8; 8] = b"PSRAFTLG";
/// Version 3: command tags 3 to 5 (the lifecycle commands) may appear.
/// Version 2 logs are read and rewritten as version 3 when opened
/// (docs/format.md, "Versions").
const LOG_VERSION: u16 = 3;
const LOG_VERSION_2: u16 = 2;
/// `raft.log` starts with magic, version, reserved, a salt, and a CRC of
/// those.
const LOG_HEADER: usize = 24;

fn log_header(salt: u64) -> [u8; LOG_HEADER] {
    let mut h = [0u8; LOG_HEADER];
    h[..8].copy_from_slice(LOG_MAGIC);
    h[8..10].copy_from_slice(&LOG_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32c::crc32c(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A header of this version: reserved bytes zero, its CRC right.
fn log_header_valid(h: &[u8; LOG_HEADER]) -> bool {
    h[10..12] == [0, 0] && h[20..24] == crc32c::crc32c(&h[..20]).to_le_bytes()
}

/// The seed of every record's checksum in a log with this header: the
/// header's own CRC, so a function of its random salt. Bytes a producer
/// chose (a name) cannot pass for a record, since it cannot know the
/// salt, and neither can a record of another log.
fn record_seed(header: &[u8; LOG_HEADER]) -> u32 {
    u32::from_le_bytes([header[20], header[21], header[22], header[23]])
}

/// A salt for a new log: random (std's hasher keys come from the OS),
/// mixed with the time and the place.
fn new_salt(dir: &Path) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one((std::time::SystemTime::now(), std::process::id(), dir))
}
/// A record's payload is at most this long: the entry's head and the
/// longest command `Command::validate` lets through (membership entries
/// are far shorter). `append` refuses a longer entry rather than write a
/// record that `open` would not read back.
const MAX_PAYLOAD: u32 = MIN_PAYLOAD + MAX_COMMAND_BYTES as u32;

const KIND_BLANK: u8 = 0;
const KIND_NORMAL: u8 = 1;
const KIND_MEMBERSHIP: u8 = 2;

type SErr = StorageError<NodeId>;

/// How long a purge waits for the snapshot that covers it (it is being
/// written by an install; a failed install stops the replica anyway).
const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

struct Inner {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    /// The file's header (its salt seeds every record's CRC).
    header: [u8; LOG_HEADER],
    /// The writer thread's queue (`writer.rs`).
    writer: Sender<Op>,
    /// The writer thread, joined when the last handle is dropped.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Changes never; closed when the writer has finished and let go of
    /// the directory.
    closed: watch::Receiver<()>,
    /// Bytes of `raft.log` that hold records, counting those queued.
    len: u64,
    /// Every entry not purged, with the file offset of its record.
    entries: BTreeMap<u64, (u64, Entry<TypeConfig>)>,
    meta: Meta,
    committed: Option<LogId<NodeId>>,
    /// The log id of the state machine's snapshot file, if linked
    /// ([`LogStore::purge_after_snapshots`]).
    snapshots: Option<watch::Receiver<Option<LogId<NodeId>>>>,
}

/// Counters of one log, for benchmarks and tests.
#[derive(Debug, Default)]
pub struct LogStats {
    /// fdatasync calls on `raft.log`.
    pub fsyncs: AtomicU64,
    /// Entries appended.
    pub entries: AtomicU64,
}

/// A replica's Raft log (cloneable handle; openraft's log reader is a
/// clone).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    stats: Arc<LogStats>,
}

/// What opening a log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOpened {
    /// Entries read from `raft.log`.
    pub entries: usize,
    /// Bytes cut from its end: an append torn by a crash, never acknowledged.
    pub torn_bytes: u64,
}

fn io_err(e: std::io::Error) -> SErr {
    StorageIOError::write_logs(&e).into()
}

/// Appends the record of `e` to `out`; `Err` (and `out` as it was) if its
/// payload would be longer than [`MAX_PAYLOAD`].
pub(crate) fn encode_entry(e: &Entry<TypeConfig>, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER]);
    out.extend_from_slice(&e.log_id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&e.log_id.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&e.log_id.index.to_le_bytes());
    // Where the write this record goes out in begins.
    out.extend_from_slice(&0u64.to_le_bytes());
    match &e.payload {
        EntryPayload::Blank => out.push(KIND_BLANK),
        EntryPayload::Normal(c) => {
            out.push(KIND_NORMAL);
            c.encode(out);
        }
        EntryPayload::Membership(m) => {
            out.push(KIND_MEMBERSHIP);
            // Membership entries are rare and small; openraft's own serde
            // shape is their format.
            match serde_json::to_vec(m) {
                Ok(json) => out.extend_from_slice(&json),
                Err(e) => {
                    out.truncate(start);
                    return Err(std::io::Error::other(e));
                }
            }
        }
    }
    let payload_len = out.len() - start - RECORD_HEADER;
    let Some(len) = u32::try_from(payload_len)
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
    else {
        out.truncate(start);
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "entry {} takes {payload_len} bytes, more than a record holds ({MAX_PAYLOAD}); \
                 propose commands that pass Command::validate",
                e.log_id
            ),
        ));
    };
    // The write start and the CRC are filled in by `seal_write` once the
    // write is formed.
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Where a record's write-start field is: after length, CRC, term, node
/// and index.
const WRITE_AT: usize = RECORD_HEADER + 24;

/// Sets the write-start field of the record at the start of `rec` and
/// its CRC (seeded with `seed`); returns the record's length.
fn seal_record(rec: &mut [u8], write_start: u64, seed: u32) -> usize {
    let len = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
    rec[WRITE_AT..WRITE_AT + 8].copy_from_slice(&write_start.to_le_bytes());
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(seed, &rec[..4]),
        &rec[RECORD_HEADER..RECORD_HEADER + len],
    );
    rec[4..8].copy_from_slice(&crc.to_le_bytes());
    RECORD_HEADER + len
}

/// Marks every record in `buf` (whole records, as `encode_entry` wrote
/// them) as part of one write that begins at file offset `write_start`,
/// and checksums them with the log's `seed` ([`record_seed`]). The writer
/// calls it on each write before it is written: after a crash, records of
/// one write that did not reach the disk whole can be told from damage to
/// an earlier, fsync'ed write (`LogStore::open`).
pub(crate) fn seal_write(buf: &mut [u8], write_start: u64, seed: u32) {
    let mut at = 0;
    while at < buf.len() {
        at += seal_record(&mut buf[at..], write_start, seed);
    }
}

/// What the bytes at an offset of the log are.
enum Decoded {
    /// A whole valid record: the entry and the record's length.
    Record(Entry<TypeConfig>, usize),
    /// Not a whole valid record (cut short, or its checksum fails).
    NotARecord,
    /// A whole record, checksummed by this log, whose command this build
    /// does not read: written by a later build (a tag added since).
    /// Neither damage nor a torn write, and never cut: a replica that
    /// dropped it would apply a different log than the others.
    UnknownCommand,
}

/// The record at the start of `bytes`, file offset `at`.
fn decode_record(bytes: &[u8], at: usize, seed: u32) -> Decoded {
    let mut r = Reader(bytes);
    let (Ok(len), Ok(crc)) = (r.u32(), r.u32()) else {
        return Decoded::NotARecord;
    };
    if len > MAX_PAYLOAD {
        return Decoded::NotARecord;
    }
    let Ok(payload) = r.take(len as usize) else {
        return Decoded::NotARecord;
    };
    let computed = crc32c::crc32c_append(crc32c::crc32c_append(seed, &len.to_le_bytes()), payload);
    if computed != crc {
        return Decoded::NotARecord;
    }
    match decode_payload(payload, at) {
        Ok(entry) => Decoded::Record(entry, RECORD_HEADER + len as usize),
        Err(Some(command::UNKNOWN_TAG)) => Decoded::UnknownCommand,
        Err(_) => Decoded::NotARecord,
    }
}

/// A checksummed record's payload; `Err(Some(why))` when its command does
/// not decode.
fn decode_payload(payload: &[u8], at: usize) -> Result<Entry<TypeConfig>, Option<&'static str>> {
    let mut p = Reader(payload);
    let term = p.u64().map_err(|_| None)?;
    let node_id = p.u64().map_err(|_| None)?;
    let index = p.u64().map_err(|_| None)?;
    let write_start = p.u64().map_err(|_| None)?;
    if !(LOG_HEADER as u64..=at as u64).contains(&write_start) {
        return Err(None);
    }
    let payload = match p.u8().map_err(|_| None)? {
        KIND_BLANK if p.0.is_empty() => EntryPayload::Blank,
        KIND_NORMAL => EntryPayload::Normal(Command::decode(p.0).map_err(Some)?),
        KIND_MEMBERSHIP => EntryPayload::Membership(serde_json::from_slice(p.0).map_err(|_| None)?),
        _ => return Err(None),
    };
    Ok(Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, node_id), index),
        payload,
    })
}

/// Whether the bytes of `bytes` from `at` (where no valid record starts)
/// are what a crash leaves of the last write: nothing valid after `at`,
/// or only records of writes that began at or before `at`, so that `at`
/// was part of the write they went out in. A write is acknowledged only
/// after its fsync, and the next write starts only after that fsync, so a
/// record of a write that began after `at` proves `at` was fsync'ed: that
/// damage is refused.
///
/// Every offset after `at` is a candidate, tested at a constant cost
/// ([`write_start_at`]), so the search is linear in the bytes after the
/// damage whatever they hold.
fn torn_write(bytes: &[u8], at: usize, seed: u32) -> bool {
    let from = at + 1;
    let after = bytes.get(from..).unwrap_or_default();
    let crcs = RangeCrc::new(after);
    (0..after.len())
        .filter_map(|s| write_start_at(after, &crcs, s, from, seed))
        .all(|write_start| write_start <= at as u64)
}

/// The least payload: term, node, index, write start, kind.
const MIN_PAYLOAD: u32 = 33;

/// Where the write of the record at `s` in `bytes` (file offset `base +
/// s`) began, if a record that could have been written starts there: a
/// plausible length, kind and write start, and a checksum that verifies,
/// computed in O(1) from `crcs` (the prefix CRCs of `bytes`) whatever
/// length the record claims. The fields read are under the checksum; the
/// rest of the payload is not decoded (a record with a valid checksum was
/// written whole, which is all the search asks).
fn write_start_at(bytes: &[u8], crcs: &RangeCrc, s: usize, base: usize, seed: u32) -> Option<u64> {
    let field = |at: usize| -> Option<[u8; 8]> { bytes.get(s + at..s + at + 8)?.try_into().ok() };
    let head = field(0)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&len) {
        return None;
    }
    let kind = *bytes.get(s + RECORD_HEADER + 32)?;
    if kind > KIND_MEMBERSHIP || (kind == KIND_BLANK && len != MIN_PAYLOAD) {
        return None;
    }
    let write_start = u64::from_le_bytes(field(WRITE_AT)?);
    if !(LOG_HEADER as u64..=(base + s) as u64).contains(&write_start) {
        return None;
    }
    let seed = crc32c::crc32c_append(seed, &head[..4]);
    (crcs.crc_append(seed, s + RECORD_HEADER, len as usize)? == stored).then_some(write_start)
}

/// The log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenLogError {
    /// An IO call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another log has this directory open (in this process or another):
    /// two writers of one file would interleave their records.
    #[error("{path} is open by another log: stop that replica first")]
    Locked {
        /// The replica's directory.
        path: PathBuf,
    },
    /// Bytes that are not a valid record are followed by valid ones, or a
    /// metadata file does not parse: entries this replica acknowledged
    /// would be lost, so it refuses to start.
    #[error("{path} is damaged at byte {offset}: {what}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What is wrong.
        what: &'static str,
    },
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn tail.
    pub fn open(dir: &Path) -> Result<(LogStore, LogOpened), OpenLogError> {
        LogStore::open_with(Arc::new(StdFs), dir)
    }

    /// [`LogStore::open`] through a file system of the core crate's seam
    /// (`SimFs` in the crash tests).
    pub fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
    ) -> Result<(LogStore, LogOpened), OpenLogError> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenLogError::Io { op, path, source }
        };
        fs.create_dir_all(dir).map_err(io("create", dir))?;
        // Held by the writer thread until it has written its last byte.
        let lock =
            fs.try_lock(dir)
                .map_err(io("lock", dir))?
                .ok_or_else(|| OpenLogError::Locked {
                    path: dir.to_path_buf(),
                })?;
        let meta_path = dir.join(META_FILE);
        let meta: Meta = match read_file(fs.as_ref(), &meta_path).map_err(io("read", &meta_path))? {
            Some(b) => serde_json::from_slice(&b).map_err(|_| OpenLogError::Corrupt {
                path: meta_path.clone(),
                offset: 0,
                what: "not the vote and purge record",
            })?,
            None => Meta::default(),
        };
        // A hint only: unreadable is the same as absent (module docs).
        let committed = read_file(fs.as_ref(), &dir.join(COMMITTED_FILE))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<Option<LogId<NodeId>>>(&b).ok())
            .flatten();
        let path = dir.join(LOG_FILE);
        let mut bytes = read_file(fs.as_ref(), &path)
            .map_err(io("read", &path))?
            .unwrap_or_default();
        if bytes.is_empty() {
            // New (the header is written whole or not at all).
            let header = log_header(new_salt(dir));
            write_atomically(fs.as_ref(), dir, LOG_FILE, &header, true)
                .map_err(io("create", &path))?;
            bytes = header.to_vec();
        }
        let header: [u8; LOG_HEADER] = match bytes.get(..LOG_HEADER) {
            Some(h) if h[..8] != LOG_MAGIC[..] => None,
            Some(h)
                if h[8..10] != LOG_VERSION.to_le_bytes()
                    && h[8..10] != LOG_VERSION_2.to_le_bytes() =>
            {
                return Err(OpenLogError::Corrupt {
                    path,
                    offset: 8,
                    what: "a log version this build does not read",
                });
            }
            Some(h) => h.try_into().ok().filter(log_header_valid),
            None => None,
        }
        .ok_or_else(|| OpenLogError::Corrupt {
            path: path.clone(),
            offset: 0,
            what: "not a producer-state-raft log (header)",
        })?;
        let seed = record_seed(&header);
        let mut entries = BTreeMap::new();
        let mut at = LOG_HEADER;
        let mut prev: Option<u64> = None;
        while at < bytes.len() {
            match decode_record(&bytes[at..], at, seed) {
                // Records up to the last purged one are skipped whatever
                // their order: a purge to a snapshot's log id can pass the
                // end of the log (an installed snapshot), and the next
                // record then follows the snapshot, not the last record.
                Decoded::Record(e, n)
                    if meta.last_purged.is_some_and(|p| e.log_id.index <= p.index) =>
                {
                    at += n;
                }
                Decoded::Record(e, n) if prev.is_none_or(|p| e.log_id.index == p + 1) => {
                    prev = Some(e.log_id.index);
                    entries.insert(e.log_id.index, (at as u64, e));
                    at += n;
                }
                Decoded::UnknownCommand => {
                    return Err(OpenLogError::Corrupt {
                        path,
                        offset: at as u64,
                        what: "a command this build does not read (written by a later build: \
                               upgrade this replica)",
                    });
                }
                Decoded::Record(..) => {
                    return Err(OpenLogError::Corrupt {
                        path,
                        offset: at as u64,
                        what: "a record out of index order",
                    });
                }
                Decoded::NotARecord => {
                    if !torn_write(&bytes, at, seed) {
                        return Err(OpenLogError::Corrupt {
                            path,
                            offset: at as u64,
                            what: "a damaged record followed by a later write's records",
                        });
                    }
                    break;
                }
            }
        }
        // The hint is written without an fsync, and openraft commits on a
        // follower up to what it accepted before that append is flushed: a
        // crash can keep a hint naming entries it lost. One the log does not
        // hold is dropped (openraft would refuse to start, unable to
        // re-apply up to it); the leader says again what is committed.
        let committed = committed.filter(|c| {
            meta.last_purged.is_some_and(|p| c.index <= p.index)
                || entries.get(&c.index).is_some_and(|(_, e)| e.log_id == *c)
        });
        let torn_bytes = (bytes.len() - at) as u64;
        let upgrade = header[8..10] == LOG_VERSION_2.to_le_bytes();
        let (header, seed, at) = if upgrade {
            // A version-2 log: rewritten as version 3 (the same salt and
            // entries, so records under the new header's seed) before
            // anything is appended, atomically. A build that reads only
            // version 2 then refuses the file by its version, rather than
            // cut a lifecycle command it cannot read as a torn write.
            let salt = u64::from_le_bytes(header[12..20].try_into().unwrap_or_default());
            let header = log_header(salt);
            let buf = rewrite(&header, &mut entries).map_err(io("upgrade", &path))?;
            write_atomically(fs.as_ref(), dir, LOG_FILE, &buf, true)
                .map_err(io("upgrade", &path))?;
            (header, record_seed(&header), buf.len())
        } else {
            (header, seed, at)
        };
        let mut file = fs.open_append(&path).map_err(io("open", &path))?;
        // (An upgraded file holds no torn bytes: they were not rewritten.)
        if torn_bytes > 0 && !upgrade {
            file.set_len(at as u64).map_err(io("truncate", &path))?;
            file.sync_data().map_err(io("fsync", &path))?;
        }
        let opened = LogOpened {
            entries: entries.len(),
            torn_bytes,
        };
        let stats = Arc::new(LogStats::default());
        let (writer, thread, closed) = writer::spawn(
            fs.clone(),
            dir.to_path_buf(),
            file,
            at as u64,
            seed,
            lock,
            stats.clone(),
        )
        .map_err(io("spawn the log writer for", &path))?;
        let inner = Inner {
            fs,
            dir: dir.to_path_buf(),
            header,
            writer,
            thread: Some(thread),
            closed,
            len: at as u64,
            entries,
            meta,
            committed,
            snapshots: None,
        };
        Ok((
            LogStore {
                inner: Arc::new(Mutex::new(inner)),
                stats,
            },
            opened,
        ))
    }

    /// Makes every purge of this log wait until `sm`'s snapshot file
    /// covers it. openraft 0.9 installs a snapshot from the leader by
    /// handing it to the state machine's worker and purging the log up to
    /// it at once, without waiting for the install: a crash between the two
    /// would leave the log purged past the snapshot on disk, and the
    /// replica unable to rebuild its state. [`Replica`](crate::Replica)
    /// links its log and state machine so; a log on its own purges at once.
    pub fn purge_after_snapshots(&self, sm: &StateMachine) {
        self.lock().snapshots = Some(sm.snapshots());
    }

    /// A receiver that is closed (its `changed` fails) once every handle
    /// of this log is gone and its writer has finished and let go of the
    /// directory: openraft's tasks may hold handles a moment after it shuts
    /// down.
    pub(crate) fn closed(&self) -> watch::Receiver<()> {
        self.lock().closed.clone()
    }

    /// The log's counters.
    pub fn stats(&self) -> Arc<LogStats> {
        self.stats.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave half an update that
        // matters: the file is the truth and is re-read on the next open.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Inner {
    /// The last handle is gone: the writer finishes what is queued and
    /// lets go of the file and the directory before this returns, so the
    /// directory can be opened again at once.
    fn drop(&mut self) {
        let (gone, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.writer, gone));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    fn save_meta(&self) -> Result<(), SErr> {
        let bytes = serde_json::to_vec(&self.meta).map_err(|e| StorageIOError::write_vote(&e))?;
        write_atomically(self.fs.as_ref(), &self.dir, META_FILE, &bytes, true)
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    /// Queues a rewrite of `raft.log` with only the entries kept, when
    /// purged records are more than half of it (and more than 64 KiB): the
    /// file stays within about twice the unpurged log. The caller awaits
    /// the answer.
    fn compact(&mut self) -> Option<oneshot::Receiver<std::io::Result<()>>> {
        let first_offset = self.entries.values().next().map_or(self.len, |(o, _)| *o);
        if first_offset < 1 << 16 || first_offset < self.len / 2 {
            return None;
        }
        // Every entry was encoded once already when it was appended.
        let buf = rewrite(&self.header, &mut self.entries).ok()?;
        self.len = buf.len() as u64;
        Some(self.queue(|reply| Op::Replace(buf, reply)))
    }

    /// Queues an operation whose answer the caller awaits.
    fn queue(
        &self,
        op: impl FnOnce(oneshot::Sender<std::io::Result<()>>) -> Op,
    ) -> oneshot::Receiver<std::io::Result<()>> {
        let (tx, rx) = oneshot::channel();
        // If the writer is gone, `rx` reports it (its sender is dropped).
        let _ = self.writer.send(op(tx));
        rx
    }
}

/// The bytes of a log holding `entries` under `header`, as one write after
/// the header; each entry's offset is set to its place in them.
fn rewrite(
    header: &[u8; LOG_HEADER],
    entries: &mut BTreeMap<u64, (u64, Entry<TypeConfig>)>,
) -> std::io::Result<Vec<u8>> {
    let mut buf = header.to_vec();
    let mut offsets = Vec::with_capacity(entries.len());
    for (_, e) in entries.values() {
        offsets.push(buf.len() as u64);
        encode_entry(e, &mut buf)?;
    }
    for ((o, _), at) in entries.values_mut().zip(offsets) {
        *o = at;
    }
    seal_write(
        &mut buf[LOG_HEADER..],
        LOG_HEADER as u64,
        record_seed(header),
    );
    Ok(buf)
}

/// The writer's answer to a queued operation.
async fn answer(rx: oneshot::Receiver<std::io::Result<()>>) -> Result<(), SErr> {
    match rx.await {
        Ok(r) => r.map_err(io_err),
        Err(_) => Err(io_err(std::io::Error::other("the log writer stopped"))),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let inner = self.lock();
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (_, e))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let inner = self.lock();
        let last_purged = inner.meta.last_purged;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|(_, e)| e.log_id)
            .or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        let mut inner = self.lock();
        inner.meta.vote = Some(*vote);
        inner.save_meta()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        Ok(self.lock().meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        let mut inner = self.lock();
        inner.committed = committed;
        let bytes = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        write_atomically(inner.fs.as_ref(), &inner.dir, COMMITTED_FILE, &bytes, false)
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(self.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let mut buf = Vec::new();
        let mut encoded = Vec::new();
        for e in entries {
            let offset = inner.len + buf.len() as u64;
            encode_entry(&e, &mut buf).map_err(io_err)?;
            encoded.push((offset, e));
        }
        let n = encoded.len() as u64;
        // Readable at once (the leader may send an entry before its own
        // fsync; it counts itself only when `callback` reports it).
        for (offset, e) in encoded {
            inner.entries.insert(e.log_id.index, (offset, e));
        }
        inner.len += buf.len() as u64;
        self.stats.entries.fetch_add(n, Ordering::Relaxed);
        // The writer reports the entries flushed after its fsync; if it is
        // gone, dropping the callback tells openraft the IO failed.
        let _ = inner.writer.send(Op::Append(buf, callback));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let rx = {
            let mut inner = self.lock();
            let Some(offset) = inner.entries.get(&log_id.index).map(|(o, _)| *o) else {
                return Ok(());
            };
            inner.len = offset;
            let _ = inner.entries.split_off(&log_id.index);
            inner.queue(|reply| Op::Truncate(offset, reply))
        };
        answer(rx).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let snapshots = self.lock().snapshots.clone();
        if let Some(mut snapshot) = snapshots {
            let covered = |s: &Option<LogId<NodeId>>| s.is_some_and(|s| s.index >= log_id.index);
            let waited = tokio::time::timeout(PURGE_WAIT, snapshot.wait_for(covered)).await;
            if !matches!(waited, Ok(Ok(_))) {
                return Err(io_err(std::io::Error::other(format!(
                    "purge to {log_id}: no snapshot covering it was written within {PURGE_WAIT:?}"
                ))));
            }
        }
        let rx = {
            let mut inner = self.lock();
            inner.meta.last_purged = Some(log_id);
            inner.save_meta()?;
            let keep = inner.entries.split_off(&(log_id.index + 1));
            inner.entries = keep;
            if inner.entries.is_empty() {
                // Everything is purged (often: a snapshot was installed
                // past the end of the log): start the file again.
                let start = LOG_HEADER as u64;
                inner.len = start;
                Some(inner.queue(|reply| Op::Truncate(start, reply)))
            } else {
                inner.compact()
            }
        };
        match rx {
            Some(rx) => answer(rx).await,
            None => Ok(()),
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}
