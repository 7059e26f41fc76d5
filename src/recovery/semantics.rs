//! Which semantics a directory was written under, read from its files'
//! headers before anything is replayed.
//!
//! A `Semantics::Kafka` store flags every segment it creates (segment
//! header flag [`FLAG_KAFKA`](crate::wal::segment::FLAG_KAFKA)) and every
//! snapshot it writes (snapshot header flag bit 0); a strict store flags
//! none, so its files are what they were before Kafka mode existed. The
//! store compares this with the semantics it was opened with and refuses a
//! mismatch before recovery reads or writes anything: replaying a log
//! under rules other than those that accepted it would not give the state
//! it recorded.
//!
//! A file whose header cannot be read says nothing here: recovery reports
//! it as the damage it is.

use std::path::{Path, PathBuf};

use crate::directory::names::{StoreFile, classify};
use crate::error::{Error, Result};
use crate::fs::FileSystem;
use crate::semantics::Semantics;
use crate::snapshot;
use crate::wal::segment::{self, HEADER_LEN};

/// The first file that states its semantics, and what it states; `None`
/// for a directory with no readable header (new, or only damage).
/// Files that disagree are [`Error::Corrupt`]: one store never writes
/// both.
pub(crate) fn stored(fs: &dyn FileSystem, dir: &Path) -> Result<Option<(Semantics, PathBuf)>> {
    let listing = match fs.list(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("list", dir, e)),
    };
    let mut found: Option<(Semantics, PathBuf)> = None;
    for e in &listing {
        // Only regular files are opened: a FIFO or device named like a
        // segment could block or harm a read, and recovery refuses it by
        // name (`Error::NotAFile`) right after this check.
        if e.kind != Some(crate::fs::EntryKind::File) {
            continue;
        }
        let path = dir.join(&e.name);
        let kafka = match classify(&e.name) {
            Some(StoreFile::Segment(_)) => {
                head(fs, &path).and_then(|h| match segment::parse_header(&path, &h) {
                    Ok(h) => Some(h.kafka),
                    Err(_) => None,
                })
            }
            Some(StoreFile::Snapshot(_)) => head(fs, &path)
                .and_then(|h| snapshot::parse_header(&path, &h).ok())
                .map(|h| h.kafka),
            _ => None,
        };
        let Some(kafka) = kafka else { continue };
        let s = if kafka {
            Semantics::Kafka
        } else {
            Semantics::Strict
        };
        match &found {
            None => found = Some((s, path)),
            Some((other, _)) if *other != s => {
                return Err(Error::corrupt(
                    &path,
                    10,
                    crate::error::Corruption::BadField(
                        "semantics flag (the directory's files disagree)",
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(found)
}

/// The first bytes of a file (a header's worth, or fewer), or `None` if
/// it cannot be read.
fn head(fs: &dyn FileSystem, path: &Path) -> Option<Vec<u8>> {
    let mut f = fs.open_read(path).ok()?;
    let mut buf = vec![0u8; HEADER_LEN.max(snapshot::HEADER_LEN)];
    let n = crate::fs::read_full(&mut f, &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Refuses to open `dir` under `requested` if its files say otherwise.
pub(crate) fn check(fs: &dyn FileSystem, dir: &Path, requested: Semantics) -> Result<()> {
    match stored(fs, dir)? {
        Some((stored, path)) if stored != requested => Err(Error::SemanticsMismatch {
            path,
            stored,
            requested,
        }),
        _ => Ok(()),
    }
}
