//! Writing one partition of a store as a Kafka snapshot file, atomically
//! and in Kafka's entry order: [`export`] (entries as the strict rules keep
//! them) and [`export_store`] (whatever the store's semantics; byte for
//! byte what Kafka wrote for a seeded Kafka-mode store).

use std::path::{Path, PathBuf};

#[cfg(doc)]
use super::seed::seed_kafka_store;

use super::file::{encode, from_entry};
use super::order::sort_in_kafka_order;
use crate::engine::entry::ProducerEntry;
use crate::engine::kafka::entry::KafkaProducerEntry;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::id::ProducerId;

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
/// ```
/// use producer_state::{kafka, Batch, ProducerStateStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = ProducerStateStore::open(dir.path().join("store"))?;
/// store.append_batch(7u64, 0, 2, Batch::new(0, 3, 100, 55))?;
/// store.append("named", 0, 0, 0)?; // Kafka's producer ids are numbers
/// let path = dir.path().join(kafka::file_name(104));
/// assert_eq!(kafka::export(store.iter(), 0, &path)?, (1, 1)); // written, left out
/// let entries = kafka::decode(&path, &std::fs::read(&path)?)?;
/// assert_eq!((entries[0].producer_id, entries[0].last_offset), (7, 103));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
/// producers), under the strict rules as [`export`]. Entries come in Kafka's
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
