//! Inspecting one file: what it is, and each kind read with the store's
//! own readers (a snapshot, a log segment, a Kafka snapshot), plus the dry
//! run of a whole directory's recovery.

use std::io;
use std::path::Path;

use crate::directory::names;
use crate::engine::ProducerStateManager;
use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::info::ProducerInfo;
use crate::engine::kafka::entry::KafkaProducerEntry;
use crate::engine::kafka::side::KafkaProducerState;
use crate::engine::kafka::txn::AbortedTxn;
use crate::engine::shards::{SHARDS, Shards};
use crate::error::{Corruption, Error, Result};
use crate::fs::FileSystem;
use crate::id::ProducerId;
use crate::kafka;
use crate::recovery::{
    self,
    report::{RecoveryMode, RecoveryReport},
};
use crate::snapshot;
use crate::wal::segment::{self, End, HeaderError};

use crate::wal::op::LogOp;

/// Calls a progress callback every few thousand items.
pub(super) struct Ticker<'a> {
    n: u64,
    progress: &'a mut dyn FnMut(u64),
}

impl<'a> Ticker<'a> {
    pub(super) fn new(progress: &'a mut dyn FnMut(u64)) -> Self {
        Ticker { n: 0, progress }
    }

    /// One more item; reports `value` now and then.
    pub(super) fn tick(&mut self, value: u64) {
        self.n += 1;
        if self.n.is_multiple_of(4096) {
            (self.progress)(value);
        }
    }
}

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A snapshot of this crate (`<position>.snap`, magic `PSTATSNP`).
    Snapshot,
    /// A log segment of this crate (`<position>.wal`, magic `PSTATWAL`).
    Segment,
    /// An Apache Kafka producer snapshot (`<offset>.snapshot`, version 1).
    KafkaSnapshot,
}

/// What a finding means for the store, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Everything recovery reads verifies.
    Ok,
    /// Damage, but recovery opens the store: it repairs what it reads (cuts
    /// a torn tail, removes leftovers) and does without what it does not
    /// need (a damaged snapshot it skips, damage in the log before the
    /// snapshot it starts from, which a fallback to an older snapshot would
    /// need).
    Repairable,
    /// Recovery refuses to open the store (damage it must not guess past,
    /// or a file of a format version this build cannot read); for a file
    /// inspected on its own: it does not verify.
    Refused,
}

impl Verdict {
    /// The lowercase name (`ok`, `repairable`, `refused`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Repairable => "repairable",
            Verdict::Refused => "refused",
        }
    }
}

fn open(fs: &dyn FileSystem, path: &Path) -> Result<(Box<dyn crate::fs::ReadFile>, u64)> {
    let f = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    Ok((f, len))
}

/// What `path` holds, by its name and then by its first bytes; `None` for
/// anything else (including an empty file).
///
/// # Errors
///
/// [`Error::Io`] if the file cannot be opened or read.
pub fn detect(fs: &dyn FileSystem, path: &Path) -> Result<Option<FileKind>> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let (mut f, len) = open(fs, path)?;
    let mut head = [0u8; 8];
    let n = crate::fs::read_full(&mut f, &mut head).map_err(|e| Error::io("read", path, e))?;
    let head = head.get(..n).unwrap_or_default();
    Ok(
        if head == snapshot::MAGIC || names::parse_snapshot_name(name).is_some() {
            Some(FileKind::Snapshot)
        } else if head == segment::MAGIC || names::parse_segment_name(name).is_some() {
            Some(FileKind::Segment)
        } else if kafka::parse_file_name(name).is_some()
            || (head.get(..2) == Some(&[0, 1])
                && len >= kafka::HEADER_LEN as u64
                && (len - 10) % 46 == 0)
        {
            Some(FileKind::KafkaSnapshot)
        } else {
            None
        },
    )
}

/// A snapshot's header, once every byte verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotSummary {
    /// Its format version (1 to 6; docs/format.md, "Versions").
    pub version: u16,
    /// The log position it covers.
    pub position: u64,
    /// Version 6: the byte offset, in the log segment that holds
    /// `position`, where the first record the snapshot does not cover
    /// starts (recovery seeks there, docs/format.md, Recovering, step 3).
    pub log_point: Option<u64>,
    /// Number of entries.
    pub entries: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// The semantics of the store that wrote it (header flag bit 0): a
    /// Kafka-mode snapshot also holds a Kafka section (side table and
    /// aborted transactions), verified with the rest.
    pub semantics: crate::semantics::Semantics,
}

impl SnapshotSummary {
    /// What the verified header `h` of a file of `len` bytes says.
    fn of(h: &crate::snapshot::Header, len: u64) -> SnapshotSummary {
        SnapshotSummary {
            version: h.version,
            position: h.position,
            log_point: h.point.map(|p| u64::from(p.offset)),
            entries: h.entries,
            bytes: len,
            semantics: semantics_of(h.kafka),
        }
    }
}

fn semantics_of(kafka: bool) -> crate::semantics::Semantics {
    if kafka {
        crate::semantics::Semantics::Kafka
    } else {
        crate::semantics::Semantics::Strict
    }
}

/// Reads and decodes every entry of a snapshot and verifies its checksums,
/// without building the state: the cost of reading the file, the floor of
/// loading it. A key that appears twice is found only by [`snapshot`],
/// which builds the state.
///
/// # Errors
///
/// As [`snapshot`].
pub fn decode_snapshot(fs: &dyn FileSystem, path: &Path) -> Result<SnapshotSummary> {
    let (f, len) = open(fs, path)?;
    let (h, _) = snapshot::read(
        path,
        io::BufReader::with_capacity(1 << 20, f),
        len,
        |_, _, e, _| {
            std::hint::black_box(e);
            Ok(())
        },
    )?;
    Ok(SnapshotSummary::of(&h, len))
}

/// Verifies a snapshot as recovery loads it (every byte, and no key twice)
/// and returns what it holds; nothing of a file that does not verify is
/// handed out. `progress(entries)` is called every few thousand entries.
///
/// # Errors
///
/// [`Error::Corrupt`] (file, byte offset, kind) if it does not verify,
/// [`Error::UnsupportedVersion`], or [`Error::Io`].
pub fn snapshot(
    fs: &dyn FileSystem,
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<(SnapshotSummary, RecoveredState)> {
    let (f, len) = open(fs, path)?;
    let mut t = Ticker::new(progress);
    let mut shards = Shards::default();
    let (h, _, kafka) = snapshot::read_kafka(
        path,
        io::BufReader::with_capacity(1 << 20, f),
        len,
        |id, p, e, act| {
            // The rule recovery's loader applies: a key twice is damage.
            // It also stops a body of zeros (a hole) at its second entry.
            if !shards.insert_new(HashedKey::new(&id, p), &e, act) {
                return Err(Error::corrupt(path, 0, Corruption::DuplicateKey));
            }
            t.tick(t.n + 1);
            Ok(())
        },
    )?;
    let state = match kafka {
        None => RecoveredState {
            shards,
            kafka: None,
        },
        // A Kafka-mode state, as recovery's loader builds it: the Kafka
        // section's side table, then the compact keys (a key in both is
        // damage).
        Some(side) => {
            let mut engine = ProducerStateManager::from_kafka_side(side, shards.len() as u64);
            for (id, p, e) in (0..SHARDS).flat_map(|i| shards.shard(i).iter()) {
                if !engine.insert_loaded(&id, p, &e) {
                    return Err(Error::corrupt(path, 0, Corruption::DuplicateKey));
                }
            }
            RecoveredState {
                shards: Shards::default(),
                kafka: Some(Box::new(engine)),
            }
        }
    };
    Ok((SnapshotSummary::of(&h, len), state))
}

/// How a segment's records end.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentEnd {
    /// Every byte is a valid record.
    Clean,
    /// The last write was torn by a crash: recovery would cut the segment at
    /// `offset` (if it is the store's last segment).
    TornTail {
        /// Where the torn bytes start.
        offset: u64,
        /// What is wrong with them.
        kind: Corruption,
    },
    /// Damage at `offset` is followed by a valid record at `later_write`,
    /// written when the damaged bytes were already durable: recovery would
    /// refuse.
    Damaged {
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        kind: Corruption,
        /// Where that valid record was found.
        later_write: u64,
    },
}

impl SegmentEnd {
    /// What this end means for a segment inspected on its own: a torn tail
    /// is what recovery cuts from the last segment; damage followed by a
    /// later write is what it refuses. (In a store directory the verdict
    /// also depends on where the segment is: see
    /// [`directory`](super::directory).)
    pub fn verdict(&self) -> Verdict {
        match self {
            SegmentEnd::Clean => Verdict::Ok,
            SegmentEnd::TornTail { .. } => Verdict::Repairable,
            SegmentEnd::Damaged { .. } => Verdict::Refused,
        }
    }
}

/// What a segment holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentSummary {
    /// Position of its first record.
    pub first_position: u64,
    /// Its format version (docs/format.md).
    pub version: u16,
    /// Valid appends before any damage.
    pub records: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// Bytes of header and valid records.
    pub valid_bytes: u64,
    /// Zeros at the end of a preallocated segment that no write reached:
    /// room for records to come (a clean end), or after a torn write. The
    /// bytes that hold something, header, records and any torn write, are
    /// `bytes - preallocated_bytes`. 0 for a segment that grows by
    /// appends, and for a segment with damage followed by a later write
    /// (its scan stops there).
    pub preallocated_bytes: u64,
    /// How the records end.
    pub end: SegmentEnd,
    /// The semantics of the store that wrote it (header flag bit 1).
    pub semantics: crate::semantics::Semantics,
}

/// Streams a segment, handing each operation of each valid record
/// (position, byte offset of the record, operation: an append, a clock
/// reading, removed keys, an atomic group and its key states) to `each`,
/// and says how its records end. An error only for a damaged or truncated
/// header, or IO. `progress(bytes)` is called every few thousand
/// operations. Each record is verified before its operations are handed
/// out; an atomic group only once it is complete.
///
/// # Errors
///
/// [`Error::Corrupt`] for a damaged or truncated header,
/// [`Error::UnsupportedVersion`], or [`Error::Io`].
pub fn segment(
    fs: &dyn FileSystem,
    path: &Path,
    mut each: impl FnMut(u64, u64, &LogOp),
    progress: &mut dyn FnMut(u64),
) -> Result<SegmentSummary> {
    let (f, len) = open(fs, path)?;
    let mut t = Ticker::new(progress);
    let scan = segment::scan(
        path,
        io::BufReader::with_capacity(1 << 20, f),
        len,
        |_| Ok(()),
        |pos, at, _, r| {
            each(pos, at, r);
            t.tick(at);
            Ok(())
        },
    );
    let s = match scan {
        Ok(s) => s,
        Err(HeaderError::Short(got)) => {
            return Err(Error::corrupt(
                path,
                got as u64,
                crate::codec::truncated(segment::HEADER_LEN, got),
            ));
        }
        Err(HeaderError::Bad(e)) => return Err(e),
    };
    Ok(SegmentSummary {
        first_position: s.first_position,
        version: s.version,
        records: s.records,
        bytes: s.file_len,
        valid_bytes: s.valid_len,
        preallocated_bytes: s.room,
        semantics: semantics_of(s.kafka),
        end: match s.end {
            End::Clean => SegmentEnd::Clean,
            End::Torn { offset, kind } => SegmentEnd::TornTail { offset, kind },
            End::MidLog {
                offset,
                kind,
                later,
            } => SegmentEnd::Damaged {
                offset,
                kind,
                later_write: later,
            },
        },
    })
}

/// Verifies a Kafka snapshot (see [`kafka::read`]: the CRC, and no producer
/// twice) and returns its entries in file order; nothing of a file that
/// does not verify is handed out.
///
/// # Errors
///
/// As [`kafka::read`], and [`Error::Io`] if the file cannot be opened.
pub fn kafka_snapshot(
    fs: &dyn FileSystem,
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<KafkaProducerEntry>> {
    let (f, len) = open(fs, path)?;
    let mut t = Ticker::new(progress);
    let mut out = Vec::new();
    kafka::read(path, io::BufReader::with_capacity(1 << 20, f), len, |e| {
        out.push(e);
        t.tick(t.n + 1);
        Ok(())
    })?;
    Ok(out)
}

/// What a partition-state record ([`LogOp::KafkaPartition`], kind 21)
/// carries, decoded: the Kafka-mode side-table keys it adds to its
/// partition (each as [`KafkaProducerState`], sorted by producer id) and the
/// aborted transactions it appends to the partition's list, in list order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionSection {
    /// The side-table keys (Kafka's `ProducerStateEntry`), sorted by id.
    pub keys: Vec<(ProducerId, KafkaProducerState)>,
    /// The aborted transactions, oldest marker first.
    pub aborted: Vec<AbortedTxn>,
}

/// Decodes the section of a partition-state record of `partition` with the
/// reader replay uses (the segment scan verified it once already).
///
/// # Errors
///
/// [`Error::Corrupt`] (naming "partition-state record" and the byte offset
/// in the section) for bytes that are not a section of `partition`.
pub fn partition_section(partition: i32, section: &[u8]) -> Result<PartitionSection> {
    let file = || std::path::PathBuf::from("partition-state record");
    let state = crate::snapshot::kafka::decode_state(section)
        .map_err(|(at, kind)| Error::corrupt(file(), at as u64, kind))?;
    if !state.only_partition(partition) {
        let kind = Corruption::BadField("partition state of another partition");
        return Err(Error::corrupt(file(), 0, kind));
    }
    let (side, aborted) = state.partition_side(partition);
    Ok(PartitionSection {
        keys: side.into_iter().map(|(id, e)| (id, e.view())).collect(),
        aborted,
    })
}

/// A state rebuilt from files: what recovery would rebuild, or what a
/// snapshot holds. Under [`Semantics::Kafka`](crate::Semantics::Kafka)
/// it is the Kafka engine's state: every key (compact and side-table),
/// with its transaction and coordinator epoch
/// ([`RecoveredState::kafka_state`]) and the aborted transactions.
#[derive(Clone, Debug)]
pub struct RecoveredState {
    /// The strict rules' keys (empty under Kafka semantics).
    shards: Shards,
    /// The Kafka-mode state (`None` under the strict rules).
    kafka: Option<Box<ProducerStateManager>>,
}

impl RecoveredState {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.shards.len() + self.kafka.as_ref().map_or(0, |k| k.len())
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The semantics of the store whose files these are.
    pub fn semantics(&self) -> crate::semantics::Semantics {
        semantics_of(self.kafka.is_some())
    }

    /// Every key and its entry, in no particular order (a Kafka-mode key
    /// outside the compact map as the nearest entry: see
    /// [`ProducerStateManager::iter`]).
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, i32, ProducerEntry)> + '_ {
        (0..SHARDS)
            .flat_map(move |i| self.shards.shard(i).iter())
            .chain(self.kafka.iter().flat_map(|k| k.iter()))
    }

    /// Every key with its entry and last activity (snapshot versions 3
    /// and 4; older snapshots kept none: a key's newest batch timestamp,
    /// or 0), in no particular order. A Kafka-mode state keeps no
    /// activity: a key's is its Kafka last timestamp (of its last batch or
    /// marker; -1 for none), what Kafka's expiration goes by.
    pub fn infos(&self) -> impl Iterator<Item = ProducerInfo> + '_ {
        let kafka = self.kafka.iter().flat_map(|k| {
            k.iter().map(|(producer_id, partition, entry)| {
                let last_activity = k
                    .kafka_state(producer_id.clone(), partition)
                    .map_or(-1, |s| s.last_timestamp);
                ProducerInfo {
                    producer_id,
                    partition,
                    entry,
                    last_activity,
                }
            })
        });
        (0..SHARDS)
            .flat_map(move |i| self.shards.infos(i))
            .chain(kafka)
    }

    /// One key's state as Kafka holds it (its open transaction, coordinator
    /// epoch, every cached batch); `None` without state and for a state of
    /// the strict rules.
    pub fn kafka_state(
        &self,
        producer_id: impl Into<ProducerId>,
        partition: i32,
    ) -> Option<KafkaProducerState> {
        self.kafka.as_ref()?.kafka_state(producer_id, partition)
    }

    /// Each partition's oldest open transaction that is late at `now_ms`
    /// (a hanging transaction), as
    /// [`ProducerStateManager::late_transactions`](crate::engine::ProducerStateManager::late_transactions);
    /// empty for a state of the strict rules.
    pub fn late_transactions(
        &self,
        now_ms: i64,
        max_transaction_timeout_ms: i64,
    ) -> Vec<crate::engine::kafka::txn::LateTransaction> {
        self.kafka
            .as_ref()
            .map(|k| k.late_transactions(now_ms, max_transaction_timeout_ms))
            .unwrap_or_default()
    }

    /// Every partition's aborted transactions (a Kafka-mode state), by
    /// partition, each partition's in the order their markers came.
    pub fn aborted_transactions(&self) -> Vec<(i32, AbortedTxn)> {
        let Some(side) = self.kafka.as_ref().and_then(|k| k.kafka_side()) else {
            return Vec::new();
        };
        let mut lists: Vec<_> = side.txns().aborted_lists().collect();
        lists.sort_by_key(|(p, _)| *p);
        lists
            .into_iter()
            .flat_map(|(p, list)| list.iter().map(move |t| (p, t.clone())))
            .collect()
    }
}

/// What opening a store directory would do, found without writing a byte
/// or taking the lock: recovery run in strict mode on a read-only view.
/// `Ok((report, state))`: it would open, after making the repairs the
/// report lists ([`RecoveryReport::repairs`]: truncating a torn tail,
/// removing leftover files), which are recovery's own plan; `Err`: it
/// would refuse with this error.
///
/// # Errors
///
/// What strict recovery would refuse with: [`Error::Corrupt`],
/// [`Error::UnsupportedVersion`], or [`Error::Io`]; [`Error::InvalidPath`]
/// and [`Error::NotADirectory`] for a path that cannot be a store directory.
pub fn dry_run(fs: &dyn FileSystem, dir: &Path) -> Result<(RecoveryReport, RecoveredState)> {
    crate::directory::check(fs, dir)?;
    let rec = recovery::recover_dry(fs, dir, RecoveryMode::Strict)?;
    Ok((
        rec.report,
        RecoveredState {
            shards: rec.shards,
            kafka: rec.meta.kafka,
        },
    ))
}
