//! The topics the broker holds, and their partition counts: one small file,
//! replaced atomically, written before a topic's partitions are made.
//!
//! Creating a topic makes one directory per partition. A crash part-way
//! used to leave a topic with some of its partitions for good (the count
//! was read back from the directories found). Now the topic is first added
//! to `DIR/topics.catalog` (written to `topics.catalog.tmp`, fsync'ed,
//! renamed over the catalog, the directory fsync'ed), and only then are its
//! partitions created; opening the broker creates any partition of a
//! catalogued topic that is missing. A topic is thus all-or-nothing: absent
//! if the crash came before the rename, complete after the restart if it
//! came after.
//!
//! The file is text, one topic a line after a header line, and ends with
//! the CRC-32C of everything before that last line. Each topic line holds
//! the name, the partition count and the topic's first *key*: partition
//! `i` of the topic is partition `first + i` of the data directory's shared
//! producer state ([`crate::partition`]). Keys are handed out in order and
//! never reused, so no two partitions share one, and the map from (topic,
//! partition) to key changes only when the file is replaced, atomically:
//!
//! ```text
//! producer-state-broker topics 2
//! orders 4 0
//! payments 12 4
//! crc32c 5e0e3f1a
//! ```
//!
//! Version 1 (`producer-state-broker topics 1`, lines of a name and a
//! count, from when each partition had a store of its own) is read, given
//! keys in name order, and rewritten as version 2 at once.
//!
//! Topic names never hold white space ([`crate::valid_topic_name`]). A
//! catalog that does not parse or whose checksum does not match stops the
//! broker from opening, with the reason: it never guesses which topics
//! exist. A data directory from before the catalog (no file) gets one made
//! from the partition directories it holds.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::plog::sync_dir;

const FILE: &str = "topics.catalog";
const TMP: &str = "topics.catalog.tmp";
const HEADER: &str = "producer-state-broker topics 2";
const HEADER_V1: &str = "producer-state-broker topics 1";

/// A catalogued topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogTopic {
    /// Its partition count.
    pub partitions: i32,
    /// The shared state's key of its partition 0 (partition `i` has
    /// `first_key + i`).
    pub first_key: i32,
}

/// Topic names, partition counts and keys, durable.
#[derive(Debug)]
pub struct Catalog {
    dir: PathBuf,
    topics: BTreeMap<String, CatalogTopic>,
}

/// Keys in name order for topics that have none yet (a version-1 catalog,
/// or a data directory from before the catalog).
fn with_keys(
    counts: BTreeMap<String, i32>,
) -> std::result::Result<BTreeMap<String, CatalogTopic>, String> {
    let mut next = 0i32;
    let mut out = BTreeMap::new();
    for (name, partitions) in counts {
        let first_key = next;
        next = next
            .checked_add(partitions)
            .ok_or_else(|| format!("more than {} partitions", i32::MAX))?;
        out.insert(
            name,
            CatalogTopic {
                partitions,
                first_key,
            },
        );
    }
    Ok(out)
}

impl Catalog {
    /// Reads the catalog of the data directory `dir`. Without one, makes it
    /// from `legacy` (the topics found as partition directories) and writes
    /// it.
    pub fn open(
        dir: &Path,
        legacy: impl FnOnce() -> Result<BTreeMap<String, i32>>,
    ) -> Result<Catalog> {
        let path = dir.join(FILE);
        // A temporary file is a write that never finished: the catalog it
        // would have replaced still holds.
        match fs::remove_file(dir.join(TMP)) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", dir.join(TMP), e)),
        }
        let corrupt = |reason| Error::CorruptCatalog {
            path: path.clone(),
            reason,
        };
        match fs::read(&path) {
            Ok(bytes) => {
                let (topics, old) = parse(&bytes).map_err(corrupt)?;
                let c = Catalog {
                    topics,
                    dir: dir.to_path_buf(),
                };
                if old {
                    c.write(&c.topics)?;
                    tracing::info!(path = %path.display(), "the topic catalog is now version 2 (keys of the shared producer state)");
                }
                Ok(c)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let c = Catalog {
                    dir: dir.to_path_buf(),
                    topics: with_keys(legacy()?).map_err(corrupt)?,
                };
                c.write(&c.topics)?;
                Ok(c)
            }
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    /// Every topic, its partition count and first key.
    pub fn topics(&self) -> &BTreeMap<String, CatalogTopic> {
        &self.topics
    }

    /// Partitions over all topics.
    pub fn partitions(&self) -> usize {
        self.topics
            .values()
            .map(|t| usize::try_from(t.partitions).unwrap_or(0))
            .sum()
    }

    /// The first key no topic holds.
    fn next_key(&self) -> i64 {
        self.topics
            .values()
            .map(|t| i64::from(t.first_key) + i64::from(t.partitions))
            .max()
            .unwrap_or(0)
    }

    /// Adds `topic` with `partitions` partitions and the next free keys,
    /// durably (a topic already there keeps its count and keys).
    pub fn add(&mut self, topic: &str, partitions: i32) -> Result<CatalogTopic> {
        if let Some(t) = self.topics.get(topic) {
            return Ok(*t);
        }
        let first = self.next_key();
        let first_key = i32::try_from(first)
            .ok()
            .filter(|f| f.checked_add(partitions).is_some())
            .ok_or(Error::TooManyPartitions {
                topic: topic.to_string(),
                partitions,
                held: self.partitions(),
                max: i32::MAX as usize,
            })?;
        let t = CatalogTopic {
            partitions,
            first_key,
        };
        let mut next = self.topics.clone();
        next.insert(topic.to_string(), t);
        self.write(&next)?;
        self.topics = next;
        Ok(t)
    }

    fn write(&self, topics: &BTreeMap<String, CatalogTopic>) -> Result<()> {
        let tmp = self.dir.join(TMP);
        let path = self.dir.join(FILE);
        fs::write(&tmp, render(topics))
            .and_then(|()| fs::File::open(&tmp)?.sync_all())
            .map_err(|e| Error::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &tmp, e))?;
        sync_dir(&self.dir)
    }
}

fn render(topics: &BTreeMap<String, CatalogTopic>) -> String {
    let mut s = format!("{HEADER}\n");
    for (name, t) in topics {
        s.push_str(&format!("{name} {} {}\n", t.partitions, t.first_key));
    }
    let crc = crc32c::crc32c(s.as_bytes());
    s.push_str(&format!("crc32c {crc:08x}\n"));
    s
}

/// The topics of a catalog, and whether it was version 1 (keys given in
/// name order: to be written back as version 2).
fn parse(bytes: &[u8]) -> std::result::Result<(BTreeMap<String, CatalogTopic>, bool), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not text: {e}"))?;
    let text = text.strip_suffix('\n').ok_or("no newline at the end")?;
    let body_end = text.rfind('\n').map(|i| i + 1).ok_or("no checksum line")?;
    let (body, last) = text.split_at(body_end);
    let stored = last
        .strip_prefix("crc32c ")
        .filter(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| format!("the last line is not a checksum: {last:?}"))?;
    let actual = crc32c::crc32c(body.as_bytes());
    if stored != actual {
        return Err(format!(
            "CRC-32C mismatch: stored {stored:08x}, computed {actual:08x}"
        ));
    }
    let mut lines = body.lines();
    let v1 = match lines.next() {
        Some(HEADER) => false,
        Some(HEADER_V1) => true,
        _ => return Err(format!("the first line is not {HEADER:?}")),
    };
    let mut counts = BTreeMap::new();
    let mut topics = BTreeMap::new();
    let mut used: Vec<(i64, i64)> = Vec::new();
    for (i, line) in lines.enumerate() {
        let bad = || {
            format!(
                "line {}: {line:?} is not a topic, a partition count and a first key",
                i + 2
            )
        };
        let mut fields = line.split(' ');
        let name = fields.next().ok_or_else(bad)?;
        let n: i32 = fields.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
        if !crate::valid_topic_name(name) || n < 1 || counts.insert(name.to_string(), n).is_some() {
            return Err(bad());
        }
        if v1 {
            if fields.next().is_some() {
                return Err(bad());
            }
            continue;
        }
        let first_key: i32 = fields.next().and_then(|k| k.parse().ok()).ok_or_else(bad)?;
        if fields.next().is_some() || first_key < 0 || first_key.checked_add(n).is_none() {
            return Err(bad());
        }
        used.push((i64::from(first_key), i64::from(first_key) + i64::from(n)));
        topics.insert(
            name.to_string(),
            CatalogTopic {
                partitions: n,
                first_key,
            },
        );
    }
    if v1 {
        return Ok((with_keys(counts)?, true));
    }
    used.sort_unstable();
    if used.windows(2).any(|w| w[0].1 > w[1].0) {
        return Err("two topics share keys".into());
    }
    Ok((topics, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_reads_back_what_was_added_and_refuses_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Catalog::open(dir.path(), || Ok(BTreeMap::new())).unwrap();
        c.add("orders", 4).unwrap();
        c.add("payments.eu", 12).unwrap();
        c.add("orders", 9).unwrap();
        let c = Catalog::open(dir.path(), || panic!("not a new directory")).unwrap();
        assert_eq!(
            c.topics()
                .iter()
                .map(|(k, v)| (k.as_str(), v.partitions, v.first_key))
                .collect::<Vec<_>>(),
            [("orders", 4, 0), ("payments.eu", 12, 4)]
        );
        assert_eq!(c.partitions(), 16);
        let path = dir.path().join(FILE);
        let good = fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).unwrap();
            assert!(
                matches!(
                    Catalog::open(dir.path(), || panic!("read, not made")),
                    Err(Error::CorruptCatalog { .. })
                ),
                "byte {i}"
            );
        }
        fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(Catalog::open(dir.path(), || panic!()).is_err());
    }

    #[test]
    fn an_unfinished_write_leaves_the_catalog_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Catalog::open(dir.path(), || Ok(BTreeMap::from([("a".into(), 2)]))).unwrap();
        c.add("b", 3).unwrap();
        fs::write(
            dir.path().join(TMP),
            b"producer-state-broker topics 2\nc 1 5\n",
        )
        .unwrap();
        let c = Catalog::open(dir.path(), || panic!()).unwrap();
        assert_eq!(c.partitions(), 5);
        assert!(!dir.path().join(TMP).exists());
    }

    #[test]
    fn a_version_1_catalog_gets_keys_in_name_order_and_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let mut v1 = String::from("producer-state-broker topics 1\nzeta 2\nalpha 3\n");
        let crc = crc32c::crc32c(v1.as_bytes());
        v1.push_str(&format!("crc32c {crc:08x}\n"));
        fs::write(dir.path().join(FILE), v1).unwrap();
        let mut c = Catalog::open(dir.path(), || panic!()).unwrap();
        let keys: Vec<_> = c.topics().values().map(|t| t.first_key).collect();
        assert_eq!(keys, [0, 3], "alpha 0..3, zeta 3..5");
        assert_eq!(c.add("new", 4).unwrap().first_key, 5);
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(
            text.starts_with("producer-state-broker topics 2\nalpha 3 0\nnew 4 5\nzeta 2 3\n"),
            "{text}"
        );
    }

    #[test]
    fn overlapping_keys_are_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut body = String::from("producer-state-broker topics 2\na 3 0\nb 2 2\n");
        let crc = crc32c::crc32c(body.as_bytes());
        body.push_str(&format!("crc32c {crc:08x}\n"));
        fs::write(dir.path().join(FILE), body).unwrap();
        assert!(matches!(
            Catalog::open(dir.path(), || panic!()),
            Err(Error::CorruptCatalog { .. })
        ));
    }
}
