//! Starting a store from the files a Kafka broker left behind, under
//! either semantics: [`seed_store`] (the strict rules' view, one entry per
//! producer) and [`seed_kafka_store`] (losing nothing).

use std::path::{Path, PathBuf};

use super::file::{read, to_entry};
use crate::directory::names;
use crate::engine::hash::HashedKey;
use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};
use crate::engine::shards::Shards;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::snapshot;
use crate::snapshot::meta::Meta;

/// A Kafka entry a seed did not import: where it was, whose it was, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkippedEntry {
    /// The Kafka snapshot file it was read from.
    pub file: PathBuf,
    /// Kafka's producer id.
    pub producer_id: i64,
    /// Why this crate's state has no place for it.
    pub reason: Unrepresentable,
}

/// What [`seed_store`] or [`seed_kafka_store`] imported and what it could
/// not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeedReport {
    /// Entries imported.
    pub imported: u64,
    /// Entries not imported, in the order read.
    pub skipped: Vec<SkippedEntry>,
    /// The snapshot written.
    pub snapshot: PathBuf,
}

/// Starts a new store in `dir` from Kafka snapshot files, for a store
/// opened with the default [`Semantics::Strict`](crate::Semantics::Strict):
/// each source is a Kafka `.snapshot` file and the partition it belongs to
/// (Kafka keeps one directory per partition). Writes the imported state as
/// this store's snapshot at position 0; open the store afterwards as usual.
///
/// Each producer becomes one entry with its newest batch ([`to_entry`]);
/// what the strict rules have no place for is dropped: coordinator epochs,
/// open transactions, and producers known only from transaction markers
/// (reported in [`SeedReport::skipped`]). A store that must keep those,
/// and give Kafka's verdicts, is seeded by [`seed_kafka_store`].
///
/// ```
/// use producer_state::{kafka, AppendOutcome, ProducerStateStore};
///
/// let dir = tempfile::tempdir()?;
/// // The producer snapshot Kafka left in partition 3's directory.
/// let file = "tests/fixtures/kafka/00000000000000000035.snapshot";
/// let report = kafka::seed_store(&dir.path().join("store"), &[(file.into(), 3)])?;
/// assert_eq!((report.imported, report.skipped.len()), (5, 0));
/// let store = ProducerStateStore::open(dir.path().join("store"))?;
/// // Producer 1017 was at epoch 1: a zombie of epoch 0 is fenced.
/// assert_eq!(store.append(1017u64, 3, 0, 0)?, AppendOutcome::FencedEpoch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`Error::SeedTargetNotEmpty`] if `dir` already holds store files;
/// [`Error::SeedDuplicateProducer`] if two sources name the same producer
/// and partition; [`Error::Locked`] if a
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
    let (meta, mut report) = import(fs, sources, |partition, k| {
        let (id, e) = match to_entry(k) {
            Ok(entry) => entry,
            Err(reason) => return Ok(Err(reason)),
        };
        // Kafka's lastTimestamp is the key's last activity; its offsets
        // bound what truncation must undo.
        if !shards.insert_new(HashedKey::new(&id, partition), &e, k.timestamp) {
            return Err(twice(k.producer_id, partition));
        }
        Ok(Ok(k.last_offset))
    })?;
    report.snapshot = write_snapshot(fs, dir, &meta, |w| {
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
        blocks.flush(w)
    })?;
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
/// (opening it under the strict rules is refused), and
/// [`export_store`](super::export_store) writes the files back byte for byte as Kafka wrote
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
    let (meta, mut report) = import(fs, sources, |partition, k| {
        match engine.add_kafka_entry(partition, k)? {
            // The offsets a truncation must undo: the newest batch, and an
            // open transaction's start.
            Ok(true) => Ok(Ok(k.last_offset.max(k.current_txn_first_offset))),
            Ok(false) => Err(twice(k.producer_id, partition)),
            Err(reason) => Ok(Err(reason)),
        }
    })?;
    // What the store's own snapshot of a Kafka-mode state holds: the store
    // section, the Kafka section (side table), then the compact keys.
    report.snapshot = write_snapshot(fs, dir, &meta, |w| {
        if let Some(side) = engine.kafka_side() {
            w.write_kafka(side)?;
        }
        let mut blocks = snapshot::Blocks::default();
        for (id, partition, e, activity) in engine.compact_entries() {
            blocks.push(snapshot::UNSHARDED, &id, partition, &e, activity);
        }
        blocks.flush(w)
    })?;
    Ok(report)
}

/// Hands every entry of `sources` (each file verified whole first) to
/// `add` with its partition, and counts what it says: the highest offset
/// a truncation must undo for an imported entry, or why the entry has no
/// place in the store (reported as skipped). Gives the store section the
/// imported entries make and the report so far.
fn import(
    fs: &dyn FileSystem,
    sources: &[(PathBuf, i32)],
    mut add: impl FnMut(i32, &KafkaProducerEntry) -> Result<Result<i64, Unrepresentable>>,
) -> Result<(Meta, SeedReport)> {
    let mut meta = Meta::default();
    let mut report = SeedReport::default();
    for (path, partition) in sources {
        for k in read_verified(fs, path)? {
            match add(*partition, &k)? {
                Ok(high) => {
                    meta.high = meta.high.max(high);
                    meta.ends.note(*partition, high);
                    report.imported += 1;
                }
                Err(reason) => report.skipped.push(SkippedEntry {
                    file: path.clone(),
                    producer_id: k.producer_id,
                    reason,
                }),
            }
        }
    }
    Ok((meta, report))
}

/// Writes the seeded store's snapshot at position 0: the store section
/// `meta`, then what `body` writes. Gives its path.
fn write_snapshot(
    fs: &dyn FileSystem,
    dir: &Path,
    meta: &Meta,
    body: impl FnOnce(&mut snapshot::Writer) -> Result<()>,
) -> Result<PathBuf> {
    let mut w = snapshot::Writer::create(fs, dir, 0)?;
    w.write_meta(meta)?;
    body(&mut w)?;
    w.finish(fs, dir)
}

/// Takes the store's lock on `dir` and checks that it holds no store yet.
/// The lock is held while seeding: a store opened while the snapshot is
/// written would not see it until its next open, which would then replay
/// its log over it.
fn lock_new(fs: &dyn FileSystem, dir: &Path) -> Result<Box<dyn crate::fs::LockGuard>> {
    let lock = crate::directory::lock(fs, dir)?;
    let existing = fs.list(dir).map_err(|e| Error::io("list", dir, e))?;
    if existing.iter().any(|e| names::classify(&e.name).is_some()) {
        return Err(Error::SeedTargetNotEmpty {
            path: dir.to_path_buf(),
        });
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
    Error::SeedDuplicateProducer {
        producer_id,
        partition,
    }
}
