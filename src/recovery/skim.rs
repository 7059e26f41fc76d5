//! A partition's replay that reads only the records placed for it
//! ([`crate::recovery::reach`]): each unit is read where its bytes lie,
//! and the other partitions' records between are neither read nor
//! checksummed, so the replay costs what the partition's own records
//! cost, whatever the others hold.
//!
//! Each record read is checked as any replay checks it (its checksum, and
//! the offset it states against the offset it was read at), so damage in
//! what the replay reads is an error; what lies between is not read, and
//! its damage is found by recovery, which reads every record. The units
//! come from what the store wrote or recovery read since the oldest
//! retained snapshot; a replay from an older base reads the log instead
//! (`recovery::truncate`).

use std::path::{Path, PathBuf};

use crate::directory::names;
use crate::error::{Corruption, Error, Result};
use crate::fs::{FileSystem, ReadFile, read_full};
use crate::recovery::apply::Sink;
use crate::recovery::reach::Placed;
use crate::recovery::replay::Replayer;
use crate::wal::record::{self, Bad, Layout};
use crate::wal::segment;

/// The fewest bytes one read takes (most records are far shorter).
const LEAST_READ: usize = 512;
/// The most bytes one read takes.
const MOST_READ: u64 = 1 << 20;
/// Units closer than this are read with one read, the bytes between
/// included: here a read costs what copying about 8 KiB does (a 512-byte
/// `pread` of cached data 640 ns, a 64 KiB one 5.6 KiB per 415 ns).
const GAP: u64 = 8 << 10;

/// One segment open for reading: its name and path, and its reader.
struct Open {
    named: u64,
    path: PathBuf,
    seed: u32,
    layout: Layout,
    reader: Forward,
}

/// A segment's bytes, read forward.
struct Forward {
    file: Box<dyn ReadFile>,
    /// Bytes the replay may read (a live log's last segment: what was
    /// written when the replay began).
    len: u64,
    /// The bytes last read (the first `held` of `buf`, which keeps its
    /// size between reads: growing it zeroes it, which would cost a
    /// megabyte's read as much again), and the offset of the first (they
    /// end at the file's read position).
    buf: Vec<u8>,
    held: usize,
    buf_at: u64,
    /// How many bytes the next read takes.
    read: usize,
}

impl Open {
    /// Opens segment `named` of `dir` (the first `limit` bytes of it, if
    /// given) and checks its header.
    fn new(fs: &dyn FileSystem, dir: &Path, named: u64, limit: Option<u64>) -> Result<Open> {
        let path = dir.join(names::segment_name(named));
        let mut file = fs
            .open_read(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let mut len = file.len().map_err(|e| Error::io("stat", &path, e))?;
        if let Some(l) = limit {
            len = len.min(l);
        }
        let (h, n) = segment::read_header(&path, &mut file)?;
        if h.first_position != named {
            let kind = Corruption::NameMismatch {
                named,
                header: h.first_position,
            };
            return Err(Error::corrupt(&path, segment::POSITION_AT, kind));
        }
        Ok(Open {
            named,
            path,
            seed: h.seed,
            layout: Layout::of(h.version).with_kafka(h.kafka),
            reader: Forward {
                file,
                len,
                buf: Vec::new(),
                held: 0,
                buf_at: n as u64,
                read: LEAST_READ,
            },
        })
    }
}

impl Forward {
    /// Whether the bytes from `at` on, `want` of them, are held.
    fn holds(&self, at: u64, want: u64) -> bool {
        at >= self.buf_at && at + want <= self.buf_at + self.held as u64
    }

    /// The bytes from offset `at` on: at least `want` of them unless the
    /// readable bytes end first. Reads only forward: what is held always
    /// ends where the file's read position is.
    fn at(&mut self, path: &Path, at: u64, want: usize) -> Result<&[u8]> {
        let end = self.buf_at + self.held as u64;
        if at < self.buf_at {
            return Err(Error::Internal("a partition's replay read behind itself"));
        }
        if at + want as u64 > end && end < self.len {
            let kept = if at >= end {
                self.file
                    .skip(at - end)
                    .map_err(|e| Error::io("seek", path, e))?;
                0
            } else {
                let from = (at - self.buf_at) as usize;
                self.buf.copy_within(from..self.held, 0);
                self.held - from
            };
            self.buf_at = at;
            let room = self.len.saturating_sub(at + kept as u64);
            let n = (want.saturating_sub(kept).max(self.read) as u64).min(room) as usize;
            if self.buf.len() < kept + n {
                self.buf.resize(kept + n, 0);
            }
            let got = read_full(&mut self.file, &mut self.buf[kept..kept + n])
                .map_err(|e| Error::io("read", path, e))?;
            self.held = kept + got;
        }
        let rel = usize::try_from(at - self.buf_at).unwrap_or(usize::MAX);
        Ok(self.buf.get(rel..self.held).unwrap_or_default())
    }
}

/// Replays the records of `units` (ascending) from the `segments` of `dir`
/// (first positions, ascending; of the last, the first `last_len` bytes)
/// into `replayer` and `sink`: operations at positions before `end`, and
/// those that take none.
pub(crate) fn replay_units(
    fs: &dyn FileSystem,
    dir: &Path,
    (segments, last_len): (&[u64], u64),
    units: &[Placed],
    end: u64,
    replayer: &mut Replayer,
    sink: &mut dyn Sink,
) -> Result<bool> {
    let mut open: Option<Open> = None;
    // Positions below this one were read (a unit inside one read before).
    let mut read_to = 0u64;
    for (i_unit, u) in units.iter().enumerate() {
        if u.pos < read_to {
            continue;
        }
        let Some(i) = segment_of(segments, u.pos) else {
            let kind = Corruption::LogGone {
                needed: u.pos,
                oldest: segments.first().copied(),
            };
            return Err(Error::corrupt(dir, 0, kind));
        };
        let named = segments[i];
        if open.as_ref().is_none_or(|o| o.named != named) {
            if let Some(o) = &open {
                sink.drain(&o.path)?;
            }
            let limit = (i + 1 == segments.len()).then_some(last_len);
            let o = Open::new(fs, dir, named, limit)?;
            // Only records that state their own offset (format version 3
            // on) are read where a unit says: the offset they state checks
            // the place. A segment's version is never below an earlier
            // one's (the writer rolls to the current version), so only
            // the first segment opened can be older, before anything is
            // replayed.
            if !o.layout.positioned() {
                return match open {
                    None => Ok(false),
                    Some(_) => Err(Error::Internal(
                        "a log segment of an older format after a newer one",
                    )),
                };
            }
            open = Some(o);
        }
        let Some(Open {
            path,
            seed,
            layout,
            reader,
            ..
        }) = open.as_mut()
        else {
            return Err(Error::Internal("a partition's replay lost its segment"));
        };
        let path = path.as_path();
        // When the next read starts at this unit: one read for it and
        // those that follow it closely.
        if !reader.holds(u.at, LEAST_READ as u64) {
            reader.read = reach_of(&units[i_unit..], i, segments) as usize;
        }
        let mut at = u.at;
        let mut pos = u.pos;
        while pos <= u.last {
            let head = reader.at(path, at, layout.header())?;
            let want = record::stated_len(head).unwrap_or(0).max(layout.header());
            let bytes = reader.at(path, at, want)?;
            let decoded = match record::decode(bytes, *seed, *layout, at) {
                Ok(d) => d,
                Err(Bad::Incomplete(kind) | Bad::Invalid(kind) | Bad::Misplaced(kind)) => {
                    return Err(Error::corrupt(path, at, kind));
                }
            };
            let len = decoded.len;
            for (nth, op) in decoded.ops.enumerate() {
                if pos < end || !op.takes_position() {
                    replayer.op(pos, at, nth as u32, &op, |rec| sink.push(rec, path))?;
                }
                pos += u64::from(op.takes_position());
            }
            at += len as u64;
        }
        read_to = pos;
    }
    if let Some(o) = &open {
        sink.drain(&o.path)?;
    }
    Ok(true)
}

/// How many bytes to read from the first of `units` (of the `i`th
/// segment): through the last that follows it, unit after unit, in that
/// segment, each less than [`GAP`] after the one before, and a short read
/// past it.
fn reach_of(units: &[Placed], i: usize, segments: &[u64]) -> u64 {
    let Some(first) = units.first() else {
        return LEAST_READ as u64;
    };
    let mut last = first.at;
    for u in units.iter().skip(1) {
        let near = u.at >= last && u.at - last < GAP && u.at - first.at < MOST_READ;
        if !near || segment_of(segments, u.pos) != Some(i) {
            break;
        }
        last = u.at;
    }
    last - first.at + LEAST_READ as u64
}

/// The index in `segments` (first positions, ascending) of the segment
/// holding `pos`.
fn segment_of(segments: &[u64], pos: u64) -> Option<usize> {
    segments.partition_point(|&s| s <= pos).checked_sub(1)
}
