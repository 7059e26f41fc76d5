//! Producer ids handed out by InitProducerId, durable across restarts.
//!
//! The file `producer-ids` holds the next id to hand out: 8 bytes
//! little-endian and their CRC-32C (4 bytes little-endian). Every
//! InitProducerId writes the incremented value to `producer-ids.tmp`,
//! fsyncs it, renames it over the file and fsyncs the directory before it
//! answers: an id once handed out is never handed out again, even after a
//! crash. Reusing one would be wrong, not just untidy: a new producer that
//! got an old id starts at sequence 0 against the old producer's state and
//! is answered `OUT_OF_ORDER` or, worse, `DUPLICATE` for data it never sent.
//!
//! As a second guard, the broker starts at least one past the highest
//! producer id it finds in any partition log.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::plog::sync_dir;

/// The durable allocator.
#[derive(Debug)]
pub struct ProducerIds {
    dir: PathBuf,
    next: i64,
}

const FILE: &str = "producer-ids";
const TMP: &str = "producer-ids.tmp";

impl ProducerIds {
    /// Reads the allocator in `dir` (none yet: ids start at 0).
    pub fn open(dir: &Path) -> Result<ProducerIds> {
        let path = dir.join(FILE);
        let next = match fs::read(&path) {
            Ok(b) => {
                let bad = |reason: String| Error::CorruptProducerIds {
                    path: path.clone(),
                    reason,
                };
                let (value, crc) = match (b.get(0..8), b.get(8..12), b.len()) {
                    (Some(v), Some(c), 12) => (v, c),
                    _ => return Err(bad(format!("{} bytes, expected 12", b.len()))),
                };
                let stored = u32::from_le_bytes(crc.try_into().unwrap_or_default());
                if crc32c::crc32c(value) != stored {
                    return Err(bad("CRC-32C mismatch".into()));
                }
                let next = i64::from_le_bytes(value.try_into().unwrap_or_default());
                if next < 0 {
                    return Err(bad(format!("negative next id {next}")));
                }
                next
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Error::io("read", path, e)),
        };
        Ok(ProducerIds {
            dir: dir.to_path_buf(),
            next,
        })
    }

    /// Makes sure ids are handed out above `seen` (an id found in a log).
    pub fn at_least_above(&mut self, seen: i64) {
        self.next = self.next.max(seen.saturating_add(1));
    }

    /// Hands out the next id, durably: it is on disk before this returns.
    pub fn allocate(&mut self) -> Result<i64> {
        let id = self.next;
        let next = id.checked_add(1).ok_or_else(|| Error::CorruptProducerIds {
            path: self.dir.join(FILE),
            reason: "producer ids exhausted".into(),
        })?;
        let mut bytes = next.to_le_bytes().to_vec();
        bytes.extend_from_slice(&crc32c::crc32c(&next.to_le_bytes()).to_le_bytes());
        let tmp = self.dir.join(TMP);
        let path = self.dir.join(FILE);
        fs::write(&tmp, &bytes)
            .and_then(|()| fs::File::open(&tmp)?.sync_all())
            .map_err(|e| Error::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e))?;
        sync_dir(&self.dir)?;
        self.next = next;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_handed_out_twice_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut ids = ProducerIds::open(dir.path()).unwrap();
        assert_eq!((ids.allocate().unwrap(), ids.allocate().unwrap()), (0, 1));
        drop(ids);
        let mut ids = ProducerIds::open(dir.path()).unwrap();
        assert_eq!(ids.allocate().unwrap(), 2);
        ids.at_least_above(10);
        assert_eq!(ids.allocate().unwrap(), 11);
        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[0] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        assert!(matches!(
            ProducerIds::open(dir.path()),
            Err(Error::CorruptProducerIds { .. })
        ));
    }
}
