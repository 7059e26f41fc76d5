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
//! the CRC-32C of everything before that last line:
//!
//! ```text
//! producer-state-broker topics 1
//! orders 4
//! payments 12
//! crc32c 5e0e3f1a
//! ```
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
const HEADER: &str = "producer-state-broker topics 1";

/// Topic names and partition counts, durable.
#[derive(Debug)]
pub struct Catalog {
    dir: PathBuf,
    topics: BTreeMap<String, i32>,
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
        match fs::read(&path) {
            Ok(bytes) => Ok(Catalog {
                topics: parse(&bytes).map_err(|reason| Error::CorruptCatalog {
                    path: path.clone(),
                    reason,
                })?,
                dir: dir.to_path_buf(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let c = Catalog {
                    dir: dir.to_path_buf(),
                    topics: legacy()?,
                };
                c.write(&c.topics)?;
                Ok(c)
            }
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    /// Every topic and its partition count.
    pub fn topics(&self) -> &BTreeMap<String, i32> {
        &self.topics
    }

    /// Partitions over all topics.
    pub fn partitions(&self) -> usize {
        self.topics
            .values()
            .map(|&n| usize::try_from(n).unwrap_or(0))
            .sum()
    }

    /// Adds `topic` with `partitions` partitions, durably (a topic already
    /// there keeps its count).
    pub fn add(&mut self, topic: &str, partitions: i32) -> Result<()> {
        if self.topics.contains_key(topic) {
            return Ok(());
        }
        let mut next = self.topics.clone();
        next.insert(topic.to_string(), partitions);
        self.write(&next)?;
        self.topics = next;
        Ok(())
    }

    fn write(&self, topics: &BTreeMap<String, i32>) -> Result<()> {
        let tmp = self.dir.join(TMP);
        let path = self.dir.join(FILE);
        fs::write(&tmp, render(topics))
            .and_then(|()| fs::File::open(&tmp)?.sync_all())
            .map_err(|e| Error::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &tmp, e))?;
        sync_dir(&self.dir)
    }
}

fn render(topics: &BTreeMap<String, i32>) -> String {
    let mut s = format!("{HEADER}\n");
    for (name, n) in topics {
        s.push_str(&format!("{name} {n}\n"));
    }
    let crc = crc32c::crc32c(s.as_bytes());
    s.push_str(&format!("crc32c {crc:08x}\n"));
    s
}

fn parse(bytes: &[u8]) -> std::result::Result<BTreeMap<String, i32>, String> {
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
    if lines.next() != Some(HEADER) {
        return Err(format!("the first line is not {HEADER:?}"));
    }
    let mut topics = BTreeMap::new();
    for (i, line) in lines.enumerate() {
        let bad = || {
            format!(
                "line {}: {line:?} is not a topic and a partition count",
                i + 2
            )
        };
        let (name, n) = line.split_once(' ').ok_or_else(bad)?;
        let n: i32 = n.parse().map_err(|_| bad())?;
        if !crate::valid_topic_name(name) || n < 1 || topics.insert(name.to_string(), n).is_some() {
            return Err(bad());
        }
    }
    Ok(topics)
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
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("orders", 4), ("payments.eu", 12)]
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
            b"producer-state-broker topics 1\nc 1\n",
        )
        .unwrap();
        let c = Catalog::open(dir.path(), || panic!()).unwrap();
        assert_eq!(c.partitions(), 5);
        assert!(!dir.path().join(TMP).exists());
    }
}
