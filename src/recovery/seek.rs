//! Where replay starts in the segment that holds its base snapshot's
//! position: at the snapshot's log point once its checks pass
//! (docs/format.md, Recovering, step 3). Recovery and truncation's replay
//! both start there.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs::FileSystem;
use crate::recovery::report::LogSeek;
use crate::snapshot::LogPoint;
use crate::wal::resume::Resume;
use crate::wal::segment;

/// Checks `point`, recorded by a snapshot whose position lies `below`
/// records into the segment at `path`, against the first `bound` bytes of
/// that segment (all of it with `None`; a live log's last segment may be
/// written past what a replay reads): what was found, and where a scan
/// starts if the checks pass.
pub(crate) fn checked(
    fs: &dyn FileSystem,
    path: &Path,
    point: LogPoint,
    below: u64,
    bound: Option<u64>,
) -> Result<(LogSeek, Option<Resume>)> {
    let offset = u64::from(point.offset);
    let file = fs.open_read(path).map_err(Error::at("open", path))?;
    let len = file.len().map_err(Error::at("stat", path))?;
    let len = bound.map_or(len, |b| len.min(b));
    let probed =
        segment::probe(path, file, len, (offset, point.seed)).map_err(Error::at("read", path))?;
    let fallback = probed.err();
    let resume = fallback.is_none().then_some(Resume {
        offset,
        records: below,
    });
    let seek = LogSeek {
        segment: path.to_path_buf(),
        offset,
        records_not_read: if fallback.is_none() { below } else { 0 },
        fallback,
    };
    Ok((seek, resume))
}
