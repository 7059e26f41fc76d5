//! Paths that hold no store of their own: a broker's data directory or
//! one of its partition directories (the stores are elsewhere, and are
//! named), and a Kafka log segment (recognised, not read).
//!
//! The broker's layout (broker/src/lib.rs, partition.rs, catalog.rs;
//! docs/broker.md): a data directory holds `topics.catalog`, `topics/`,
//! `producer-ids`, the group and transaction logs and `state/`, the one
//! Kafka-mode store every partition shares (a store written under the
//! strict rules is moved aside to `state.strict-<millis>`). Each partition
//! directory `topics/<topic>-<partition>/` holds its log
//! `00000000000000000000.log`; an older broker also kept a store per
//! partition there, `state/` (`state.rebuild/` and `state.old/` while it
//! was being rebuilt), which the next open converts and removes.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use producer_state::inspect::classify;

/// The catalog of a data directory (and its temporary copy).
const CATALOG: &str = "topics.catalog";
/// The data directory's folder of partition directories.
const TOPICS: &str = "topics";
/// The shared producer state of a data directory.
const STATE: &str = "state";
/// The next producer id of a data directory.
const PRODUCER_IDS: &str = "producer-ids";
/// A strict-mode state moved aside: `state.strict-<millis>`.
const STATE_ASIDE: &str = "state.strict-";
/// A partition's store, as an older broker kept it.
const LEGACY_STATE: [&str; 3] = ["state", "state.rebuild", "state.old"];

/// A broker directory: which kind, and the stores it points to.
pub(crate) struct Broker {
    /// A data directory (else a partition directory).
    pub(crate) data: bool,
    /// The stores under it (for a partition directory: its own, from an
    /// older broker, and its data directory's shared one), in the order
    /// `--all` inspects them.
    pub(crate) stores: Vec<PathBuf>,
    /// A partition directory: the data directory's shared state, and the
    /// partition's key in it, as the catalog maps them (none if the
    /// catalog does not verify or does not name the partition).
    pub(crate) key: Option<(PathBuf, i32)>,
}

/// The largest catalog read (one short line a topic: far more topics
/// than a broker holds).
const MAX_CATALOG: u64 = 64 << 20;

/// The key of partition `index` of `topic` in the shared state, as the
/// data directory's catalog maps it (broker/src/catalog.rs: a header
/// line, one `name partitions first_key` line a topic, then `crc32c
/// <hex>` of everything before it; version 1 has no keys and gives them
/// in name order). `None` if the catalog is missing, does not verify or
/// does not name the partition: the tool never guesses a key.
fn catalog_key(data_dir: &Path, topic: &str, index: i32) -> Option<i32> {
    // Read no more than the bound, whatever the file claims or grows to.
    let mut text = String::new();
    fs::File::open(data_dir.join(CATALOG))
        .ok()?
        .take(MAX_CATALOG + 1)
        .read_to_string(&mut text)
        .ok()?;
    if text.len() as u64 > MAX_CATALOG {
        return None;
    }
    let text = text.strip_suffix('\n')?;
    let body_end = text.rfind('\n')? + 1;
    let (body, last) = text.split_at(body_end);
    let stored = last
        .strip_prefix("crc32c ")
        .filter(|h| h.len() == 8)
        .and_then(|h| u32::from_str_radix(h, 16).ok())?;
    if crc32c::crc32c(body.as_bytes()) != stored {
        return None;
    }
    let mut lines = body.lines();
    let v1 = match lines.next()? {
        "producer-state-broker topics 2" => false,
        "producer-state-broker topics 1" => true,
        _ => return None,
    };
    // Version 1: keys in name order, each topic after the one before.
    let mut topics: Vec<(&str, i32, Option<i32>)> = Vec::new();
    for line in lines {
        let mut f = line.split(' ');
        let name = f.next()?;
        let n: i32 = f.next()?.parse().ok()?;
        let first: Option<i32> = match v1 {
            true => None,
            false => Some(f.next()?.parse().ok()?),
        };
        topics.push((name, n, first));
    }
    topics.sort_by(|a, b| a.0.cmp(b.0));
    let mut next = 0i32;
    for (name, n, first) in topics {
        let first = first.unwrap_or(next);
        next = next.checked_add(n)?;
        if name == topic {
            return (0..n).contains(&index).then(|| first.checked_add(index))?;
        }
    }
    None
}

/// The names in `dir`, and whether each is a directory (following links).
fn names(dir: &Path) -> io::Result<Vec<(String, bool)>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let is_dir = fs::metadata(e.path()).is_ok_and(|m| m.is_dir());
        v.push((e.file_name().to_string_lossy().into_owned(), is_dir));
    }
    v.sort();
    Ok(v)
}

fn is_dir(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_dir())
}

fn is_file(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// Whether `dir` holds a file named as a store names its own (a segment,
/// a snapshot, or a temporary one): then it is a store, whatever else it
/// holds.
pub(crate) fn holds_store_files(dir: &Path) -> io::Result<bool> {
    Ok(names(dir)?.iter().any(|(n, _)| classify(n).is_some()))
}

/// Whether `dir` is a broker's data directory, by its markers: the
/// catalog, or a `topics/` folder beside the shared state or the
/// producer-id file (a data directory from before the catalog).
fn is_data_dir(dir: &Path) -> bool {
    is_file(&dir.join(CATALOG))
        || (is_dir(&dir.join(TOPICS))
            && (is_dir(&dir.join(STATE)) || is_file(&dir.join(PRODUCER_IDS))))
}

/// `<20 digits>.log`: a Kafka log segment's name (a broker partition's log).
pub(crate) fn is_log_name(name: &str) -> bool {
    name.strip_suffix(".log")
        .is_some_and(|d| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// A partition's legacy stores in `dir`, in name order.
fn legacy_stores(dir: &Path) -> Vec<PathBuf> {
    LEGACY_STATE
        .iter()
        .map(|n| dir.join(n))
        .filter(|p| is_dir(p))
        .collect()
}

/// The stores under a data directory: the shared state, the other stores
/// of a broker run with `--state-shards`, any strict-mode state moved
/// aside, then each partition's store of an older broker.
fn data_dir_stores(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut stores = Vec::new();
    if is_dir(&dir.join(STATE)) {
        stores.push(dir.join(STATE));
    }
    for (name, d) in names(dir)? {
        // The other stores of a broker started with `--state-shards N`
        // (`state-<i>`), and states moved aside (`state.strict-<millis>`,
        // `state-<i>.strict-<millis>`).
        let shard = name.strip_prefix("state-").is_some_and(|r| {
            r.split('.')
                .next()
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        if d && (name.starts_with(STATE_ASIDE) || shard) {
            stores.push(dir.join(name));
        }
    }
    let topics = dir.join(TOPICS);
    if is_dir(&topics) {
        for (name, d) in names(&topics)? {
            if d {
                stores.extend(legacy_stores(&topics.join(name)));
            }
        }
    }
    Ok(stores)
}

/// What `dir` is if it is a broker directory (and holds no store file of
/// its own: see [`holds_store_files`]).
pub(crate) fn broker(dir: &Path) -> io::Result<Option<Broker>> {
    if is_data_dir(dir) {
        return Ok(Some(Broker {
            data: true,
            stores: data_dir_stores(dir)?,
            key: None,
        }));
    }
    // A partition directory: its log (or an older broker's store) in a
    // `topics/` folder of a data directory, or both its log and a store
    // of its own wherever it was copied.
    let names = names(dir)?;
    let log = names.iter().any(|(n, d)| !d && is_log_name(n));
    let own = legacy_stores(dir);
    let data_dir = dir
        .parent()
        .filter(|t| t.file_name().is_some_and(|n| n == TOPICS))
        .and_then(Path::parent)
        .filter(|d| is_data_dir(d));
    let is_partition = match data_dir {
        Some(_) => log || !own.is_empty(),
        None => log && !own.is_empty(),
    };
    if !is_partition {
        return Ok(None);
    }
    let mut stores = own;
    let mut key = None;
    if let Some(d) = data_dir
        && is_dir(&d.join(STATE))
    {
        stores.push(d.join(STATE));
        // `<topic>-<partition>`: its key in the shared state.
        key = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(topic, i)| catalog_key(d, topic, i.parse().ok()?))
            .map(|k| (d.join(STATE), k));
    }
    Ok(Some(Broker {
        data: false,
        stores,
        key,
    }))
}

/// Kafka's record batch, format v2 (magic 2): base offset `i64`, batch
/// length `i32` (of the bytes after it), partition leader epoch `i32`,
/// magic `i8` at byte 16, CRC-32C `u32` of the bytes from 21 to the end
/// of the batch; 61 bytes of header in all (big-endian).
const BATCH_HEADER: usize = 61;
const MAGIC_AT: usize = 16;
/// The largest first batch this reads to check its CRC.
const MAX_BATCH: u64 = 16 << 20;

/// The first record batch of a Kafka log segment, as far as its header
/// and checksum say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct FirstBatch {
    pub(crate) base_offset: i64,
    /// Bytes in the batch, its first 12 included.
    pub(crate) len: u64,
    /// Whether the CRC-32C over its bytes verifies.
    pub(crate) crc_ok: bool,
}

/// The first record batch of `path` if its header is one of Kafka's
/// (magic 2, a length the file holds); every length is bounded by the
/// bytes the file has.
pub(crate) fn first_batch(path: &Path) -> io::Result<Option<FirstBatch>> {
    let mut f = fs::File::open(path)?;
    let file_len = f.metadata()?.len();
    let mut head = [0u8; BATCH_HEADER];
    if file_len < BATCH_HEADER as u64 {
        return Ok(None);
    }
    f.read_exact(&mut head)?;
    let be64 = |b: &[u8]| -> Option<i64> { Some(i64::from_be_bytes(b.try_into().ok()?)) };
    let be32 = |b: &[u8]| -> Option<u32> { Some(u32::from_be_bytes(b.try_into().ok()?)) };
    let (Some(base_offset), Some(length), Some(&magic), Some(stored)) = (
        head.get(0..8).and_then(be64),
        head.get(8..12).and_then(be32),
        head.get(MAGIC_AT),
        head.get(17..21).and_then(be32),
    ) else {
        return Ok(None);
    };
    let len = 12 + u64::from(length);
    if magic != 2 || len < BATCH_HEADER as u64 || len > file_len {
        return Ok(None);
    }
    let crc_ok = if len <= MAX_BATCH {
        let mut rest = vec![0u8; (len - BATCH_HEADER as u64) as usize];
        f.read_exact(&mut rest)?;
        let c = crc32c::crc32c_append(crc32c::crc32c(head.get(21..).unwrap_or_default()), &rest);
        c == stored
    } else {
        false
    };
    Ok(Some(FirstBatch {
        base_offset,
        len,
        crc_ok,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog as the broker writes it (broker/src/catalog.rs, `render`).
    fn catalog(header: &str, lines: &[&str]) -> String {
        let mut s = format!("{header}\n");
        for l in lines {
            s.push_str(l);
            s.push('\n');
        }
        let crc = crc32c::crc32c(s.as_bytes());
        s.push_str(&format!("crc32c {crc:08x}\n"));
        s
    }

    #[test]
    fn a_partitions_key_is_the_catalogs_and_never_a_guess() {
        let d = tempfile::tempdir().unwrap();
        let write = |s: &str| fs::write(d.path().join(CATALOG), s).unwrap();
        write(&catalog(
            "producer-state-broker topics 2",
            &["orders 4 0", "payments 12 4"],
        ));
        assert_eq!(catalog_key(d.path(), "orders", 3), Some(3));
        assert_eq!(catalog_key(d.path(), "payments", 0), Some(4));
        assert_eq!(catalog_key(d.path(), "payments", 11), Some(15));
        assert_eq!(catalog_key(d.path(), "payments", 12), None);
        assert_eq!(catalog_key(d.path(), "payments", -1), None);
        assert_eq!(catalog_key(d.path(), "nope", 0), None);
        // Version 1: keys in name order.
        write(&catalog(
            "producer-state-broker topics 1",
            &["zeta 2", "alpha 3"],
        ));
        assert_eq!(catalog_key(d.path(), "alpha", 2), Some(2));
        assert_eq!(catalog_key(d.path(), "zeta", 1), Some(4));
        // A catalog that does not verify names no key.
        let bad = catalog("producer-state-broker topics 2", &["orders 4 0"]).replacen(
            "orders 4 0",
            "orders 4 9",
            1,
        );
        write(&bad);
        assert_eq!(catalog_key(d.path(), "orders", 0), None);
        write("");
        assert_eq!(catalog_key(d.path(), "orders", 0), None);
    }

    #[test]
    fn a_log_name_is_twenty_digits_and_dot_log() {
        assert!(is_log_name("00000000000000000000.log"));
        assert!(is_log_name("00000000000000001234.log"));
        assert!(!is_log_name("0000000000000000000.log"));
        assert!(!is_log_name("0000000000000000000x.log"));
        assert!(!is_log_name("00000000000000000000.wal"));
        assert!(!is_log_name("00000000000000000000.log.torn-5"));
    }

    /// A Kafka v2 batch with `n` bytes of records after its header.
    fn batch(base: i64, n: usize) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&base.to_be_bytes());
        b.extend_from_slice(&((BATCH_HEADER - 12 + n) as u32).to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&[0; 4]);
        b.extend(std::iter::repeat_n(7u8, BATCH_HEADER - 21 + n));
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn a_kafka_batch_is_recognised_by_its_header_and_checksum() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        let mut b = batch(42, 30);
        fs::write(&p, &b).unwrap();
        let got = first_batch(&p).unwrap().unwrap();
        assert_eq!((got.base_offset, got.len, got.crc_ok), (42, 91, true));
        // A damaged byte: still a batch by its header, its CRC fails.
        b[70] ^= 1;
        fs::write(&p, &b).unwrap();
        assert!(!first_batch(&p).unwrap().unwrap().crc_ok);
        // A length past the end of the file, another magic, too short.
        fs::write(&p, &b[..80]).unwrap();
        assert_eq!(first_batch(&p).unwrap(), None);
        b[MAGIC_AT] = 1;
        fs::write(&p, &b).unwrap();
        assert_eq!(first_batch(&p).unwrap(), None);
        fs::write(&p, &b[..20]).unwrap();
        assert_eq!(first_batch(&p).unwrap(), None);
        // A length field of 2^32 - 1 in a small file: not read.
        let mut huge = batch(0, 0);
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        fs::write(&p, &huge).unwrap();
        assert_eq!(first_batch(&p).unwrap(), None);
    }
}
