//! Apache Kafka's producer snapshot files, read and written byte for byte.
//!
//! Kafka's broker writes one `<20-digit offset>.snapshot` file per log
//! segment: the producer state as of that log offset (exclusive). Version 1,
//! all integers big-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 2 | version, `i16`, must be 1 |
//! | 2 | 4 | CRC-32C of bytes 6 to the end of the file, `u32` |
//! | 6 | 4 | entry count, `i32` |
//! | 10 + 46 i | 46 | entry i |
//!
//! Entry: producer id `i64`, epoch `i16`, last sequence `i32`, last offset
//! `i64`, offset delta `i32`, timestamp `i64`, coordinator epoch `i32`,
//! current transaction first offset `i64` (-1: none). Kafka persists only
//! the last batch of each producer. Entry order is the iteration order of
//! the broker's `java.util.HashMap`, which [`sort_in_kafka_order`]
//! reproduces for a map filled in producer id order (files from other
//! histories hold the same entries in another order: compare them as sets).
//!
//! Two ways into a store, for its two semantics:
//!
//! - [`seed_kafka_store`] starts a [`Semantics::Kafka`] store from the files
//!   a Kafka broker left behind, losing nothing (open transactions,
//!   coordinator epochs, marker-only producers, marker timestamps), and
//!   [`export_store`] writes the files back byte for byte;
//! - [`seed_store`] starts a [`Semantics::Seed`] store, each producer one
//!   entry with one retained batch ([`to_entry`]), dropping what the seed
//!   rules have no place for; [`export`] writes a seed store's entries
//!   ([`from_entry`]) as Kafka tooling reads them.
//!
//! [`Semantics::Kafka`]: crate::Semantics::Kafka
//! [`Semantics::Seed`]: crate::Semantics::Seed

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::directory::names;
use crate::engine::entry::ProducerEntry;
use crate::engine::shards::Shards;
use crate::error::{Corruption, Error, Result};
use crate::fs::read_full;
use crate::fs::{FileSystem, StdFs};
use crate::id::ProducerId;
use crate::snapshot;

pub use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};
pub use crate::kafka_order::sort_in_kafka_order;

/// The only snapshot version Kafka reads and writes.
pub const VERSION: i16 = 1;
/// Bytes before the first entry.
pub const HEADER_LEN: usize = 10;
/// Bytes per entry.
pub const ENTRY_LEN: usize = 46;

/// The file name of a Kafka snapshot covering offsets below `offset`.
pub fn file_name(offset: u64) -> String {
    names::kafka_snapshot_name(offset)
}

/// The offset in a Kafka snapshot's file name (`<20 digits>.snapshot`).
pub fn parse_file_name(name: &str) -> Option<u64> {
    names::parse_kafka_snapshot_name(name)
}

fn put_entry(out: &mut Vec<u8>, e: &KafkaProducerEntry) {
    out.extend_from_slice(&e.producer_id.to_be_bytes());
    out.extend_from_slice(&e.epoch.to_be_bytes());
    out.extend_from_slice(&e.last_sequence.to_be_bytes());
    out.extend_from_slice(&e.last_offset.to_be_bytes());
    out.extend_from_slice(&e.offset_delta.to_be_bytes());
    out.extend_from_slice(&e.timestamp.to_be_bytes());
    out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
    out.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
}

/// Encodes entries, in the order given, as a Kafka version 1 snapshot file.
///
/// ```
/// use producer_state::kafka;
/// // The empty snapshot: version 1, CRC-32C of four zero bytes, count 0.
/// assert_eq!(kafka::encode(&[]), [0, 1, 0x48, 0x67, 0x4b, 0xc7, 0, 0, 0, 0]);
/// ```
pub fn encode(entries: &[KafkaProducerEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * entries.len());
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for e in entries {
        put_entry(&mut out, e);
    }
    let crc = crc32c::crc32c(out.get(6..).unwrap_or_default());
    if let Some(field) = out.get_mut(2..6) {
        field.copy_from_slice(&crc.to_be_bytes());
    }
    out
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

fn parse_entry(b: &[u8]) -> KafkaProducerEntry {
    KafkaProducerEntry {
        producer_id: i64::from_be_bytes(be(b, 0)),
        epoch: i16::from_be_bytes(be(b, 8)),
        last_sequence: i32::from_be_bytes(be(b, 10)),
        last_offset: i64::from_be_bytes(be(b, 14)),
        offset_delta: i32::from_be_bytes(be(b, 22)),
        timestamp: i64::from_be_bytes(be(b, 26)),
        coordinator_epoch: i32::from_be_bytes(be(b, 34)),
        current_txn_first_offset: i64::from_be_bytes(be(b, 38)),
    }
}

/// Streams a Kafka snapshot of `file_len` bytes from `r`, handing each
/// entry to `each`, and verifies it: version 1, a count that matches the
/// file's length, no producer id twice, and the CRC-32C over bytes 6 to
/// the end, checked after the last entry (so `each` must not be trusted
/// until this returns `Ok`). Returns the number of entries.
///
/// Kafka writes a snapshot from a map keyed by producer id, so a producer
/// id that appears twice is damage, reported at the second entry. This is
/// also what bounds the work and memory spent on a file by what it really
/// holds: a count the file's length allows but its bytes do not back (a
/// sparse file, a hole of zeros) repeats one entry and stops at the second.
/// Memory: the read buffer, plus 8 bytes per distinct producer id.
///
/// # Errors
///
/// [`Error::Corrupt`] with the file, byte offset and kind for damaged or
/// missing bytes; [`Error::UnsupportedVersion`] for a version other than 1;
/// [`Error::Io`] if reading fails; whatever `each` returns.
pub fn read(
    path: &Path,
    mut r: impl Read,
    file_len: u64,
    mut each: impl FnMut(KafkaProducerEntry) -> Result<()>,
) -> Result<u64> {
    let io = |e| Error::io("read", path, e);
    let mut head = [0u8; HEADER_LEN];
    let n = read_full(&mut r, &mut head).map_err(io)?;
    if n < HEADER_LEN {
        return Err(Error::corrupt(
            path,
            n as u64,
            crate::codec::truncated(HEADER_LEN, n),
        ));
    }
    let version = i16::from_be_bytes(be(&head, 0));
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found: version as u16,
            supported: VERSION as u16,
        });
    }
    let stored = u32::from_be_bytes(be(&head, 2));
    let count = i32::from_be_bytes(be(&head, 6));
    if count < 0 {
        return Err(Error::corrupt(
            path,
            6,
            Corruption::BadField("entry count (negative)"),
        ));
    }
    let expected = HEADER_LEN as u64 + ENTRY_LEN as u64 * count as u64;
    if expected > file_len {
        return Err(Error::corrupt(
            path,
            file_len,
            Corruption::Truncated {
                needed: expected,
                available: file_len,
            },
        ));
    }
    if expected < file_len {
        return Err(Error::corrupt(
            path,
            expected,
            Corruption::TrailingBytes(file_len - expected),
        ));
    }
    let mut crc = crc32c::crc32c(head.get(6..).unwrap_or_default());
    let mut buf = vec![0u8; ENTRY_LEN * 4096];
    let mut left = count as u64;
    let mut offset = HEADER_LEN as u64;
    let mut seen = std::collections::HashSet::new();
    while left > 0 {
        let n = left.min(4096) as usize;
        let chunk = buf.get_mut(..n * ENTRY_LEN).unwrap_or_default();
        let got = read_full(&mut r, chunk).map_err(io)?;
        if got < chunk.len() {
            return Err(Error::corrupt(
                path,
                offset + got as u64,
                crate::codec::truncated(chunk.len(), got),
            ));
        }
        crc = crc32c::crc32c_append(crc, chunk);
        for (i, e) in chunk.chunks_exact(ENTRY_LEN).enumerate() {
            let e = parse_entry(e);
            if !seen.insert(e.producer_id) {
                return Err(Error::corrupt(
                    path,
                    offset + (i * ENTRY_LEN) as u64,
                    Corruption::DuplicateKey,
                ));
            }
            each(e)?;
        }
        left -= n as u64;
        offset += chunk.len() as u64;
    }
    if stored != crc {
        return Err(Error::corrupt(
            path,
            2,
            Corruption::ChecksumMismatch {
                stored,
                computed: crc,
            },
        ));
    }
    Ok(count as u64)
}

/// Decodes a whole Kafka snapshot held in memory (see [`read`]).
///
/// # Errors
///
/// As [`read`]: [`Error::Corrupt`] naming the byte offset of the damage,
/// [`Error::UnsupportedVersion`] for a version other than 1.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<KafkaProducerEntry>> {
    let mut out = Vec::new();
    read(path, bytes, bytes.len() as u64, |e| {
        out.push(e);
        Ok(())
    })?;
    Ok(out)
}

/// The state of one Kafka entry in this crate's terms: a numeric producer
/// id, the epoch and last sequence, and the last batch as one retained batch
/// (first sequence derived as Kafka does: last sequence minus the offset
/// delta; offset = the batch's first offset; timestamp = the entry's). A
/// batch whose sequences would wrap past `2^31 - 1`, or that has no offset,
/// is not retained; the last sequence is. Transaction state is not modelled
/// (the coordinator epoch and an open transaction's offset are dropped):
/// this is the seed rules' view ([`seed_store`]); [`seed_kafka_store`]
/// keeps everything.
///
/// # Errors
///
/// [`Unrepresentable`] for an entry this crate cannot hold (a negative
/// producer id, an epoch or sequence out of range).
pub fn to_entry(
    e: &KafkaProducerEntry,
) -> std::result::Result<(ProducerId, ProducerEntry), Unrepresentable> {
    let Ok(producer_id) = u64::try_from(e.producer_id) else {
        return Err(Unrepresentable::NegativeProducerId);
    };
    if e.last_sequence < 0 {
        return Err(Unrepresentable::NoSequence);
    }
    let first = i64::from(e.last_sequence) - i64::from(e.offset_delta);
    let batch = (e.last_offset >= 0 && e.offset_delta >= 0 && first >= 0).then(|| RetainedBatch {
        first_sequence: first as i32,
        last_sequence: e.last_sequence,
        metadata: Some(BatchMetadata {
            offset: e.last_offset - i64::from(e.offset_delta),
            timestamp: e.timestamp,
        }),
    });
    let batches: &[RetainedBatch] = match &batch {
        Some(b) => std::slice::from_ref(b),
        None => &[],
    };
    let entry = ProducerEntry::from_parts(e.epoch, e.last_sequence, batches)
        .ok_or(Unrepresentable::NoSequence)?;
    Ok((ProducerId::numeric(producer_id), entry))
}

/// The Kafka entry for one of this crate's entries: `None` for named
/// producer ids and numeric ids above `i64::MAX`, which Kafka cannot hold.
/// The newest retained batch becomes Kafka's last batch; without one that
/// has an offset (single-sequence appends carry none), the last offset is
/// -1 and the timestamp -1, which Kafka reads as "no batch".
pub fn from_entry(id: &ProducerId, e: &ProducerEntry) -> Option<KafkaProducerEntry> {
    let producer_id = i64::try_from(id.as_numeric()?).ok()?;
    let last = e.retained_batches().last();
    let (last_offset, offset_delta, timestamp) = match last.and_then(|b| b.metadata.map(|m| (b, m)))
    {
        Some((b, m)) => {
            let delta = b.last_sequence - b.first_sequence;
            (m.offset + i64::from(delta), delta, m.timestamp)
        }
        None => (-1, 0, -1),
    };
    Some(KafkaProducerEntry {
        producer_id,
        epoch: e.epoch(),
        last_sequence: e.last_sequence(),
        last_offset,
        offset_delta,
        timestamp,
        coordinator_epoch: -1,
        current_txn_first_offset: -1,
    })
}

/// What [`seed_store`] or [`seed_kafka_store`] imported and what it could
/// not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeedReport {
    /// Entries imported.
    pub imported: u64,
    /// Entries not imported: the file, the producer id and why.
    pub skipped: Vec<(PathBuf, i64, String)>,
    /// The snapshot written.
    pub snapshot: PathBuf,
}

/// Starts a new store in `dir` from Kafka snapshot files, for a store
/// opened with the default [`Semantics::Seed`](crate::Semantics::Seed):
/// each source is a Kafka `.snapshot` file and the partition it belongs to
/// (Kafka keeps one directory per partition). Writes the imported state as
/// this store's snapshot at position 0; open the store afterwards as usual.
///
/// Each producer becomes one entry with its newest batch ([`to_entry`]);
/// what the seed rules have no place for is dropped: coordinator epochs,
/// open transactions, and producers known only from transaction markers
/// (reported in [`SeedReport::skipped`]). A store that must keep those,
/// and give Kafka's verdicts, is seeded by [`seed_kafka_store`].
///
/// # Errors
///
/// [`Error::InvalidOptions`] if `dir` already holds store files or two
/// sources name the same producer and partition; [`Error::Locked`] if a
/// store is open on it; [`Error::InvalidPath`] and
/// [`Error::NotADirectory`] as for
/// [`ProducerStateStore::open`](crate::ProducerStateStore::open); what reading a file can
/// give ([`Error::Corrupt`] with the file and offset for damaged bytes).
pub fn seed_store(dir: &Path, sources: &[(PathBuf, i32)]) -> Result<SeedReport> {
    seed_store_with(&StdFs, dir, sources)
}

/// [`seed_store`] through a [`FileSystem`]: the Kafka files are read and
/// the store's snapshot written through `fs` (a [`crate::fs::SimFs`] in
/// tests).
///
/// Each file is verified whole (CRC, no producer twice) before any of its
/// entries is imported, and memory is bounded by what the files really
/// hold (see [`read`]).
///
/// # Errors
///
/// As [`seed_store`].
pub fn seed_store_with(
    fs: &dyn FileSystem,
    dir: &Path,
    sources: &[(PathBuf, i32)],
) -> Result<SeedReport> {
    let _lock = lock_new(fs, dir)?;
    let mut shards = Shards::default();
    let mut meta = crate::snapshot::meta::Meta::default();
    let mut report = SeedReport::default();
    for (path, partition) in sources {
        for k in read_verified(fs, path)? {
            match to_entry(&k) {
                Ok((id, e)) => {
                    // Kafka's lastTimestamp is the key's last activity;
                    // its offsets bound what truncation must undo.
                    meta.high = meta.high.max(k.last_offset);
                    if !shards.insert_new(&id, *partition, &e, k.timestamp) {
                        return Err(twice(k.producer_id, *partition));
                    }
                    report.imported += 1;
                }
                Err(why) => report
                    .skipped
                    .push((path.clone(), k.producer_id, why.to_string())),
            }
        }
    }
    let mut w = snapshot::Writer::create(fs, dir, 0)?;
    w.write_meta(&meta)?;
    let mut blocks = snapshot::Blocks::default();
    for i in 0..crate::engine::shards::SHARDS {
        for info in shards.infos(i) {
            blocks.push(
                i as u16,
                &info.producer_id,
                info.partition,
                &info.entry,
                info.last_activity,
            );
        }
    }
    blocks.flush(&mut w)?;
    report.snapshot = w.finish(fs, dir)?;
    Ok(report)
}

/// Starts a new [`Semantics::Kafka`](crate::Semantics::Kafka) store in
/// `dir` from Kafka snapshot files, losing nothing a file holds: each
/// producer's epoch, newest batch (last sequence, last offset, offset
/// delta), timestamp (which may be a marker's), coordinator epoch and open
/// transaction (its first offset; the partition's last stable offset
/// stays below it), and producers known only from markers (no batch, last
/// sequence -1). The state is what Kafka's broker holds after loading the
/// same files: each producer's retry window is its one newest batch.
///
/// Writes the state as the store's snapshot at position 0, with the
/// Kafka flag; open the directory with
/// [`StoreOptions::semantics`](crate::StoreOptions::semantics)`(Semantics::Kafka)`
/// (opening it under the seed rules is refused), and
/// [`export_store`] writes the files back byte for byte as Kafka wrote
/// them (docs/transactions.md, "Seeding from Kafka's files").
///
/// Kafka keeps aborted transactions in its `.txnindex` files, not in
/// producer snapshots: the seeded store lists none. Unlike Kafka's reload,
/// the seed reads no clock: producers that would have expired are kept.
///
/// ```
/// use producer_state::{kafka, ProducerStateStore, Semantics, StoreOptions};
///
/// let dir = tempfile::tempdir()?;
/// let file = "tests/fixtures/kafka/small/00000000000000000041.snapshot";
/// let store_dir = dir.path().join("store");
/// let report = kafka::seed_kafka_store(&store_dir, &[(file.into(), 0)])?;
/// assert_eq!(report.imported, 6);
/// let opts = StoreOptions::default().semantics(Semantics::Kafka);
/// let store = ProducerStateStore::open_with(&store_dir, opts)?;
/// assert_eq!(store.first_unstable_offset(0), Some(17)); // 1001's open transaction
/// let out = dir.path().join(kafka::file_name(41));
/// kafka::export_store(&store, 0, &out)?;
/// assert_eq!(std::fs::read(&out)?, std::fs::read(file)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// As [`seed_store`]; a negative producer id is skipped and reported. A
/// file of no bytes, or one that lists a producer twice (Kafka writes a
/// map, so never does), is [`Error::Corrupt`] (`Corruption::DuplicateKey`
/// at the second entry) and no store is written; a valid file of no
/// producers seeds an empty store.
pub fn seed_kafka_store(dir: &Path, sources: &[(PathBuf, i32)]) -> Result<SeedReport> {
    seed_kafka_store_with(&StdFs, dir, sources)
}

/// [`seed_kafka_store`] through a [`FileSystem`].
///
/// # Errors
///
/// As [`seed_store`].
pub fn seed_kafka_store_with(
    fs: &dyn FileSystem,
    dir: &Path,
    sources: &[(PathBuf, i32)],
) -> Result<SeedReport> {
    let _lock = lock_new(fs, dir)?;
    let mut engine =
        crate::engine::ProducerStateManager::with_semantics(crate::semantics::Semantics::Kafka);
    let mut meta = crate::snapshot::meta::Meta::default();
    let mut report = SeedReport::default();
    for (path, partition) in sources {
        for k in read_verified(fs, path)? {
            match engine.add_kafka_entry(*partition, &k)? {
                Ok(true) => {
                    // The offsets a truncation must undo: the newest batch,
                    // and an open transaction's start.
                    meta.high = meta.high.max(k.last_offset).max(k.current_txn_first_offset);
                    report.imported += 1;
                }
                Ok(false) => return Err(twice(k.producer_id, *partition)),
                Err(why) => report
                    .skipped
                    .push((path.clone(), k.producer_id, why.to_string())),
            }
        }
    }
    // What the store's own snapshot of a Kafka-mode state holds: the store
    // section, the Kafka section (side table), then the compact keys.
    let mut w = snapshot::Writer::create(fs, dir, 0)?;
    w.write_meta(&meta)?;
    if let Some(side) = engine.kafka_side() {
        w.write_kafka(side)?;
    }
    let mut blocks = snapshot::Blocks::default();
    for (id, partition, e, activity) in engine.compact_entries() {
        blocks.push(snapshot::UNSHARDED, &id, partition, &e, activity);
    }
    blocks.flush(&mut w)?;
    report.snapshot = w.finish(fs, dir)?;
    Ok(report)
}

/// Takes the store's lock on `dir` and checks that it holds no store yet.
/// The lock is held while seeding: a store opened while the snapshot is
/// written would not see it until its next open, which would then replay
/// its log over it.
fn lock_new(fs: &dyn FileSystem, dir: &Path) -> Result<Box<dyn crate::fs::LockGuard>> {
    let lock = crate::directory::lock(fs, dir)?;
    let existing = fs.list(dir).map_err(|e| Error::io("list", dir, e))?;
    if existing.iter().any(|e| names::classify(&e.name).is_some()) {
        return Err(Error::InvalidOptions(format!(
            "{} already holds a store; seed only a new directory",
            dir.display()
        )));
    }
    Ok(lock)
}

/// A Kafka snapshot's entries, in file order, once the whole file is
/// verified (see [`read`]).
fn read_verified(fs: &dyn FileSystem, path: &Path) -> Result<Vec<KafkaProducerEntry>> {
    let file = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let len = file.len().map_err(|e| Error::io("stat", path, e))?;
    let mut entries = Vec::new();
    read(path, std::io::BufReader::new(file), len, |e| {
        entries.push(e);
        Ok(())
    })?;
    Ok(entries)
}

fn twice(producer_id: i64, partition: i32) -> Error {
    Error::InvalidOptions(format!(
        "producer {producer_id} appears twice for partition {partition}"
    ))
}

/// Writes the entries of one partition of a store's state (for example from
/// [`ProducerStateStore::iter`](crate::ProducerStateStore::iter)) as a Kafka
/// snapshot file at `path`, in Kafka's order ([`sort_in_kafka_order`]).
/// Returns how many entries were written and how many could not be (named
/// ids). For a [`Semantics::Kafka`](crate::Semantics::Kafka) store, whose
/// transactions and coordinator epochs these entries do not carry, use
/// [`export_store`].
///
/// The file is replaced atomically, as the store writes its snapshots: it
/// is written to `<path>.tmp`, fsync'ed, renamed over `path`, and the
/// directory fsync'ed. A crash leaves the old file or the new one, never a
/// part of the new one under the final name (a stale `<path>.tmp` may be
/// left; the next export replaces it).
///
/// # Errors
///
/// [`Error::Io`] naming the operation and path that failed.
pub fn export(
    entries: impl IntoIterator<Item = (ProducerId, i32, ProducerEntry)>,
    partition: i32,
    path: &Path,
) -> Result<(usize, usize)> {
    export_with(&StdFs, entries, partition, path)
}

/// [`export`] through a [`FileSystem`].
///
/// # Errors
///
/// As [`export`].
pub fn export_with(
    fs: &dyn FileSystem,
    entries: impl IntoIterator<Item = (ProducerId, i32, ProducerEntry)>,
    partition: i32,
    path: &Path,
) -> Result<(usize, usize)> {
    let mut out = Vec::new();
    let mut skipped = 0;
    for (id, p, e) in entries {
        if p != partition {
            continue;
        }
        match from_entry(&id, &e) {
            Some(k) => out.push(k),
            None => skipped += 1,
        }
    }
    write_file(fs, out, path).map(|n| (n, skipped))
}

/// Writes one partition of a store as a Kafka snapshot file at `path`,
/// whatever the store's semantics: under
/// [`Semantics::Kafka`](crate::Semantics::Kafka) every field Kafka keeps
/// ([`ProducerStateStore::kafka_snapshot_entries`](crate::ProducerStateStore::kafka_snapshot_entries):
/// coordinator epochs, open transactions, marker timestamps, marker-only
/// producers), under the seed rules as [`export`]. Entries come in Kafka's
/// order ([`sort_in_kafka_order`]), so a file read by [`seed_kafka_store`]
/// comes back byte for byte. The file is replaced atomically, as by
/// [`export`]. Returns how many entries were written and how many keys of
/// the partition could not be (named ids, ids above `i64::MAX`).
///
/// # Errors
///
/// [`Error::Io`] naming the operation and path that failed.
pub fn export_store(
    store: &crate::store::ProducerStateStore,
    partition: i32,
    path: &Path,
) -> Result<(usize, usize)> {
    export_store_with(&StdFs, store, partition, path)
}

/// [`export_store`] through a [`FileSystem`] (the file is written through
/// `fs`, whatever the store's own).
///
/// # Errors
///
/// As [`export_store`].
pub fn export_store_with(
    fs: &dyn FileSystem,
    store: &crate::store::ProducerStateStore,
    partition: i32,
    path: &Path,
) -> Result<(usize, usize)> {
    if store.semantics() != crate::semantics::Semantics::Kafka {
        return export_with(fs, store.iter(), partition, path);
    }
    let entries = store.kafka_snapshot_entries(partition)?;
    let kafka_ids = |id: &ProducerId| id.as_numeric().is_some_and(|n| i64::try_from(n).is_ok());
    let skipped = store
        .iter()
        .filter(|(id, p, _)| *p == partition && !kafka_ids(id))
        .count();
    write_file(fs, entries, path).map(|n| (n, skipped))
}

/// Encodes `entries` in Kafka's order and replaces `path` with them
/// atomically (see [`export`]); returns how many were written.
fn write_file(
    fs: &dyn FileSystem,
    mut entries: Vec<KafkaProducerEntry>,
    path: &Path,
) -> Result<usize> {
    sort_in_kafka_order(&mut entries);
    let bytes = encode(&entries);
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if fs.kind(&tmp).map_err(Error::at("stat", &tmp))?.is_some() {
        fs.remove_file(&tmp).map_err(Error::at("remove", &tmp))?;
    }
    let mut f = fs.create_new(&tmp).map_err(Error::at("create", &tmp))?;
    f.write_all(&bytes).map_err(Error::at("write", &tmp))?;
    f.sync_data().map_err(Error::at("fsync", &tmp))?;
    drop(f);
    fs.rename(&tmp, path).map_err(Error::at("rename", path))?;
    fs.sync_dir(dir)
        .map_err(Error::at("fsync directory", dir))?;
    Ok(entries.len())
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_test_vectors_from_the_notes() {
        assert_eq!(encode(&[]), hex("0001 48674bc7 00000000"));
        let one = KafkaProducerEntry {
            producer_id: 1,
            epoch: 0,
            last_sequence: 1,
            last_offset: 1,
            offset_delta: 0,
            timestamp: 1000,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let bytes = hex(
            "0001 f9ce379c 00000001 0000000000000001 0000 00000001 0000000000000001 00000000 00000000000003e8 ffffffff ffffffffffffffff",
        );
        assert_eq!(encode(&[one]), bytes);
        assert_eq!(decode(Path::new("v"), &bytes).unwrap(), vec![one]);
        assert!(
            decode(Path::new("v"), &hex("0001 48674bc7 00000000"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error() {
        let e = KafkaProducerEntry {
            producer_id: 7,
            epoch: 2,
            last_sequence: 9,
            last_offset: 100,
            offset_delta: 3,
            timestamp: 5,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let bytes = encode(&[
            e,
            KafkaProducerEntry {
                producer_id: 8,
                ..e
            },
        ]);
        for cut in 0..bytes.len() {
            assert!(
                decode(Path::new("k"), &bytes[..cut])
                    .unwrap_err()
                    .is_corruption(),
                "cut {cut}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(Path::new("k"), &b).unwrap_err().is_corruption(),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn entries_map_to_one_retained_batch_and_back() {
        let k = KafkaProducerEntry {
            producer_id: 1017,
            epoch: 1,
            last_sequence: 4,
            last_offset: 5,
            offset_delta: 2,
            timestamp: 1_700_000_000_003,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let (id, e) = to_entry(&k).unwrap();
        assert_eq!(id, ProducerId::from(1017u64));
        let b: Vec<_> = e.retained_batches().collect();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].first_sequence, b[0].last_sequence), (2, 4));
        assert_eq!(
            b[0].metadata,
            Some(BatchMetadata {
                offset: 3,
                timestamp: 1_700_000_000_003
            })
        );
        assert_eq!(from_entry(&id, &e), Some(k));
        // Not representable, or not fully.
        assert_eq!(
            to_entry(&KafkaProducerEntry {
                producer_id: -1,
                ..k
            }),
            Err(Unrepresentable::NegativeProducerId)
        );
        assert_eq!(
            to_entry(&KafkaProducerEntry {
                last_sequence: -1,
                last_offset: -1,
                ..k
            }),
            Err(Unrepresentable::NoSequence)
        );
        let wrapped = to_entry(&KafkaProducerEntry {
            offset_delta: 20,
            ..k
        })
        .unwrap()
        .1;
        assert_eq!(
            (wrapped.last_sequence(), wrapped.retained_batches().len()),
            (4, 0)
        );
        assert_eq!(from_entry(&ProducerId::from("p1"), &e), None);
    }
}
