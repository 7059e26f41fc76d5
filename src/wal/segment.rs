//! Segment files: naming, header, and the streaming scan that recovery and
//! the inspector share.

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::Path;

use super::frame;
use super::op::{GroupKind, LogOp};
use super::prefix_crc::PrefixCrc;
use super::record::{self, Bad, Decoded};
use super::resume::{ROOM_CHECKED, ScanFrom, SeekFallback};
use super::window::{CHUNK, Window, read_past};
use crate::codec::{Dec, Put};
use crate::error::{Corruption, Error, Result};
use crate::fs::{ReadFile, read_full};

pub(crate) const MAGIC: &[u8; 8] = b"PSTATWAL";
/// The version this crate writes (the newest; it reads [`OLDEST_VERSION`]
/// on): version 5 with a partition's truncation group (kind 11).
pub(crate) const VERSION: u16 = 6;
/// Version 3's framing with the lifecycle records (kinds 6 to 10),
/// preallocated or not as its header's flags say (read; a store that opens
/// one rolls to a version-6 segment before it writes, as for every older
/// version).
pub(crate) const LIFECYCLE_VERSION: u16 = 5;
/// Header flag of versions 5 and 6: the segment is preallocated, and zeros from
/// the end of its records to the end of the file are its clean end.
pub(crate) const FLAG_PREALLOCATED: u16 = 1;
/// Header flag of versions 5 and 6: the store runs `Semantics::Kafka`; the
/// segment may hold the transaction records (kinds 16 to 20), and a store
/// opened under the strict rules refuses it (`Error::SemanticsMismatch`). A
/// strict store's segments have it clear: their bytes are what they were.
pub(crate) const FLAG_KAFKA: u16 = 2;
/// Version 3's bytes in a preallocated file (read, no longer written).
pub(crate) const PREALLOCATED_V4: u16 = 4;
/// Version 3: records state their offset, no lifecycle records, segments
/// grow by appends (read, no longer written).
pub(crate) const APPENDED_VERSION: u16 = 3;
/// Version 1 holds one append per kind-1 record; versions 1 and 2 have a
/// shorter header (no store id, no salt) and records without an offset.
pub(crate) const OLDEST_VERSION: u16 = 1;
/// The header of the current version.
pub(crate) const HEADER_LEN: usize = 40;
/// The header of versions 1 and 2, and the least any segment has.
const OLD_HEADER_LEN: usize = 24;
/// Where the header stores the segment's first position (every version).
pub(crate) const POSITION_AT: u64 = 12;

/// What makes a segment's checksums its own: the store it belongs to and
/// a value drawn for this segment alone (version 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    /// The same in every segment of a store.
    pub store: u64,
    /// Drawn afresh for each segment.
    pub salt: u64,
}

/// A parsed segment header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header {
    pub first_position: u64,
    pub version: u16,
    /// Zeros after the records are the clean end (version 4; version 5
    /// with [`FLAG_PREALLOCATED`]).
    pub preallocated: bool,
    /// The store id (version 3 on).
    pub store: Option<u64>,
    /// The CRC seed of its records (see [`frame::seed`]).
    pub seed: u32,
    /// Header bytes: where the records start.
    pub len: usize,
    /// [`FLAG_KAFKA`] (version 5).
    pub kafka: bool,
}

/// The header of a segment with first position `pos`, not preallocated
/// (tests write headers of versions 3 to 5 with it).
#[cfg(test)]
pub(crate) fn header(pos: u64, ids: Ids, version: u16) -> Vec<u8> {
    header_with(pos, ids, version, false, false)
}

/// [`header`] of a version-5 segment that is `preallocated` (its flag).
pub(crate) fn header_with(
    pos: u64,
    ids: Ids,
    version: u16,
    preallocated: bool,
    kafka: bool,
) -> Vec<u8> {
    debug_assert!((APPENDED_VERSION..=VERSION).contains(&version));
    let mut flags = 0;
    if version >= LIFECYCLE_VERSION && preallocated {
        flags |= FLAG_PREALLOCATED;
    }
    if version >= LIFECYCLE_VERSION && kafka {
        flags |= FLAG_KAFKA;
    }
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.put_u16(version);
    h.put_u16(flags);
    h.put_u64(pos);
    h.put_u64(ids.store);
    h.put_u64(ids.salt);
    let c = crc32c::crc32c(&h);
    h.put_u32(c);
    h
}

/// What is wrong with a segment header, if anything.
pub(crate) enum HeaderError {
    /// The file is shorter than a header (a segment whose creation was cut off).
    Short(usize),
    /// The header is there but wrong.
    Bad(Error),
}

/// Whether the header CRC-32C stored at `at` covers `bytes[..at]`.
fn crc_ok(bytes: &[u8], at: usize) -> Option<(u32, u32)> {
    let stored = crate::codec::u32_at(bytes, at)?;
    let computed = crc32c::crc32c(bytes.get(..at)?);
    Some((stored, computed))
}

/// Parses a segment header (`bytes` holds the first [`HEADER_LEN`] bytes
/// of the file, or all of it if shorter).
pub(crate) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header, HeaderError> {
    if bytes.len() < OLD_HEADER_LEN {
        return Err(HeaderError::Short(bytes.len()));
    }
    let bad = |offset, kind| HeaderError::Bad(Error::corrupt(path, offset, kind));
    let mut d = Dec::new(bytes);
    let (version, flags) = d.magic_version_flags(MAGIC).map_err(|k| bad(0, k))?;
    let pos = d.u64().unwrap_or(0);
    // Versions 1 and 2 keep the header CRC at 20, version 3 (and every
    // later version) at 36.
    let (crc_at, len) = match version {
        OLDEST_VERSION..=2 => (20, OLD_HEADER_LEN),
        APPENDED_VERSION..=VERSION => (36, HEADER_LEN),
        _ => {
            // Another version is only believed if a checksum says so: a
            // damaged version field is damage.
            let sum = |at| crc_ok(bytes, at).filter(|(s, c)| s == c);
            if sum(20).is_some() || sum(36).is_some() {
                return Err(HeaderError::Bad(Error::UnsupportedVersion {
                    file: path.to_path_buf(),
                    found: version,
                    supported: VERSION,
                }));
            }
            let at = if bytes.len() >= HEADER_LEN { 36 } else { 20 };
            let (stored, computed) = crc_ok(bytes, at).unwrap_or((0, 0));
            return Err(bad(
                at as u64,
                Corruption::ChecksumMismatch { stored, computed },
            ));
        }
    };
    if bytes.len() < len {
        return Err(HeaderError::Short(bytes.len()));
    }
    let (stored, computed) = crc_ok(bytes, crc_at).unwrap_or((0, 0));
    if stored != computed {
        return Err(bad(
            crc_at as u64,
            Corruption::ChecksumMismatch { stored, computed },
        ));
    }
    let known_flags = if version >= LIFECYCLE_VERSION {
        FLAG_PREALLOCATED | FLAG_KAFKA
    } else {
        0
    };
    if flags & !known_flags != 0 {
        return Err(bad(10, Corruption::BadField("segment flags")));
    }
    let (store, seed) = if version >= 3 {
        (d.u64(), frame::seed(bytes.get(12..36).unwrap_or_default()))
    } else {
        (None, frame::seed(&pos.to_le_bytes()))
    };
    Ok(Header {
        first_position: pos,
        version,
        preallocated: version == PREALLOCATED_V4 || flags & FLAG_PREALLOCATED != 0,
        store,
        seed,
        len,
        kafka: flags & FLAG_KAFKA != 0,
    })
}

/// How a segment's records end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Every byte after the header belongs to a valid record.
    Clean,
    /// The bytes from `offset` on were never fsync'ed and were torn by a
    /// crash: no valid record written after they were durable follows.
    Torn { offset: u64, kind: Corruption },
    /// Damage at `offset` is followed by a valid record (at `later`) written
    /// when the damaged bytes were already durable: not a torn tail.
    MidLog {
        offset: u64,
        kind: Corruption,
        later: u64,
    },
}

/// The result of scanning one segment.
#[derive(Clone, Debug)]
pub(crate) struct Scan {
    pub first_position: u64,
    pub version: u16,
    pub records: u64,
    /// Bytes of header and valid records before any damage.
    pub valid_len: u64,
    pub file_len: u64,
    /// Zeros at the end of a preallocated segment, after its last byte
    /// that is not zero: room it was given and nothing was written to
    /// (0 for a segment that grows by appends, whose every byte was
    /// written). The rest of the file, `file_len - room`, holds the header,
    /// the records and any torn bytes.
    pub room: u64,
    pub end: End,
    /// The store id in the header (version 3 on).
    pub store: Option<u64>,
    /// The last valid record is a close marker: the store that wrote it
    /// was closed cleanly and wrote nothing after.
    pub closed: bool,
    /// The header's [`FLAG_KAFKA`].
    pub kafka: bool,
}

/// An atomic group being read: where it starts and what of it was read.
struct OpenGroup {
    /// The group record's offset and the positions before it.
    at: u64,
    records_before: u64,
    kind: GroupKind,
    /// Member records still to come.
    left: u32,
    /// The group record and its members so far: (position, offset, nth, op).
    ops: Vec<(u64, u64, u32, LogOp)>,
}

/// Whether `op`, a record inside an open group of `kind`, may be there.
fn member_ok(kind: GroupKind, op: &LogOp) -> bool {
    use super::op::RemoveReason as R;
    // A partition's truncation changes that partition only.
    if let GroupKind::TruncatePartition { partition } = kind {
        let only = match op {
            LogOp::Remove { keys, .. } => keys.iter().all(|(_, p)| *p == partition),
            LogOp::Set { entries } => entries.iter().all(|e| e.partition == partition),
            LogOp::KafkaPartition { partition: p, .. } => *p == partition,
            _ => true,
        };
        if !only {
            return false;
        }
    }
    match (kind, op) {
        (
            GroupKind::Truncate | GroupKind::TruncatePartition { .. },
            LogOp::Remove { reason, .. },
        ) => *reason == R::Truncated,
        (GroupKind::RemovePartition, LogOp::Remove { reason, .. }) => {
            *reason == R::PartitionRemoved
        }
        (
            GroupKind::Truncate | GroupKind::Import | GroupKind::TruncatePartition { .. },
            LogOp::Set { .. } | LogOp::KafkaPartition { .. },
        ) => true,
        _ => false,
    }
}

/// Whether `op` may stand outside a group.
fn alone_ok(op: &LogOp) -> bool {
    match op {
        LogOp::Remove { reason, .. } => !reason.in_group(),
        LogOp::Set { .. } | LogOp::KafkaPartition { .. } => false,
        _ => true,
    }
}

/// Scans a segment from its first byte, calling `header` with its header
/// (an error there stops the scan before any record), then
/// `each(position, offset, nth, op)` for every operation of every valid
/// record in order (`offset` is the record's, `nth` the operation's index
/// in it; an operation that takes no position gets the position of the
/// next one that does), and says how the records end.
///
/// An atomic group (version 5: a group record and the member records it
/// announces) is handed to `each` only once its last member is read. A
/// group the records end inside of (cleanly, or at damage) is not part of
/// the history: the valid records end where it starts, and a clean end
/// inside it reads as a torn tail there (its records were one write,
/// never acknowledged). A record that verifies but cannot stand where it
/// is (a group inside a group, a member of the wrong kind, a member
/// outside a group) is damage at its offset, like a misplaced record.
///
/// After the first bad record the rest of the file is searched for valid
/// records (each candidate offset is checked cheaply first, then by CRC).
/// Each record says how far it was written past the segment's durable end
/// (the bytes known to be fsync'ed when its write was issued). If no valid
/// record found after the damage was written when the damaged bytes were
/// already durable, the damage lies in bytes that were never fsync'ed
/// before the end of the log: a crash tore them (a write cut short, sectors
/// persisted out of order, or several unsynced writes persisted in part),
/// and nothing after them was ever acknowledged as durable. Otherwise
/// durable bytes were damaged: damage in the middle of the log. A valid
/// record found at another offset than the one it states (version 3) is
/// damage too, wherever it is: a crash never moves bytes.
// Over 100 lines on purpose: one loop over the segment's records keeps the
// reading window, the open atomic group and the switch from reading to
// searching for valid records in its own locals; the decisions it makes
// from them (torn tail or damage mid-log) read best where they are made.
// The parts that stand alone (the header, `parse_header`; the search for
// a later valid record, `later_write`; the zeros of a preallocated end,
// `first_nonzero_from`) are functions of their own.
pub(crate) fn scan(
    path: &Path,
    reader: impl Read,
    file_len: u64,
    header: impl FnOnce(&Header) -> Result<()>,
    each: impl FnMut(u64, u64, u32, &LogOp) -> Result<()>,
) -> Result<Scan, HeaderError> {
    let w = Window::new(reader, read_past);
    scan_window(path, w, file_len, ScanFrom::default(), header, each)
}

/// [`scan`] of the first `file_len` bytes of a segment file (a live log's
/// last segment may be written past them), from where `from` says: the
/// reads it skips are seeks ([`ReadFile::skip`]).
pub(crate) fn scan_file(
    path: &Path,
    file: Box<dyn ReadFile>,
    file_len: u64,
    from: ScanFrom,
    header: impl FnOnce(&Header) -> Result<()>,
    each: impl FnMut(u64, u64, u32, &LogOp) -> Result<()>,
) -> Result<Scan, HeaderError> {
    let bounded = Read::take(file, file_len);
    let w = Window::new(bounded, |r, n| {
        r.get_mut().skip(n)?;
        r.set_limit(r.limit().saturating_sub(n));
        Ok(())
    });
    scan_window(path, w, file_len, from, header, each)
}

/// Reads and parses the header at the start of `file` (the segment at
/// `path`); returns it and the bytes read, which leave the file's read
/// position after a full header.
pub(crate) fn read_header(path: &Path, file: &mut impl Read) -> Result<(Header, usize)> {
    let mut head = [0u8; HEADER_LEN];
    let n = read_full(file, &mut head).map_err(|e| Error::io("read", path, e))?;
    match parse_header(path, head.get(..n).unwrap_or_default()) {
        Ok(h) => Ok((h, n)),
        Err(HeaderError::Bad(e)) => Err(e),
        Err(HeaderError::Short(got)) => Err(Error::corrupt(
            path,
            got as u64,
            crate::codec::truncated(HEADER_LEN, got),
        )),
    }
}

/// Whether a scan of the first `file_len` bytes of the segment `file` (a
/// live log's last segment may be written past them) may start at byte
/// `offset`: its
/// header verifies, its records' CRC seed is `seed` (the segment the point
/// was recorded in, not one written since under the same name), and at
/// `offset` lies a record that verifies under that seed and states that
/// offset, or nothing (the file ends there), or zeros (a preallocated
/// segment's end; the scan then reads them by the usual rules). Reads the
/// header and at most one record's bytes.
pub(crate) fn probe(
    path: &Path,
    mut file: Box<dyn ReadFile>,
    file_len: u64,
    (offset, seed): (u64, u32),
) -> std::io::Result<std::result::Result<(), SeekFallback>> {
    let mut head = vec![0u8; HEADER_LEN];
    let n = read_full(&mut file, &mut head)?;
    head.truncate(n);
    let h = match parse_header(path, &head) {
        Ok(h) if h.seed == seed => h,
        _ => return Ok(Err(SeekFallback::OtherSegment)),
    };
    // The cursor is where the header read stopped: `n` bytes in, which is
    // past a short header (versions 1 and 2, never given a point).
    let read = n as u64;
    if offset < (h.len as u64).max(read) || offset > file_len {
        return Ok(Err(SeekFallback::OutOfRange));
    }
    file.skip(offset - read)?;
    let want =
        usize::try_from(file_len - offset).map_or(record::MAX_LEN, |n| n.min(record::MAX_LEN));
    let mut bytes = vec![0u8; want];
    let n = read_full(&mut file, &mut bytes)?;
    bytes.truncate(n);
    let layout = record::Layout::of(h.version).with_kafka(h.kafka);
    let zeros = h.preallocated && first_nonzero(&bytes).is_none();
    if bytes.is_empty() || zeros || record::decode(&bytes, seed, layout, offset).is_ok() {
        Ok(Ok(()))
    } else {
        Ok(Err(SeekFallback::NoRecord))
    }
}

/// [`scan`] through a window.
// Over 100 lines on purpose: see `scan`.
fn scan_window<R: Read>(
    path: &Path,
    mut w: Window<R>,
    file_len: u64,
    start: ScanFrom,
    header: impl FnOnce(&Header) -> Result<()>,
    mut each: impl FnMut(u64, u64, u32, &LogOp) -> Result<()>,
) -> Result<Scan, HeaderError> {
    let io_err = |e| HeaderError::Bad(Error::io("read", path, e));
    let head = w.at(0, HEADER_LEN).map_err(io_err)?;
    let h = parse_header(path, head.get(..HEADER_LEN).unwrap_or(head))?;
    header(&h).map_err(HeaderError::Bad)?;
    let (first_position, version, seed) = (h.first_position, h.version, h.seed);
    let layout = record::Layout::of(version).with_kafka(h.kafka);
    let mut at = h.len as u64;
    let mut records = 0u64;
    if let Some(r) = start.resume.filter(|r| r.offset > at) {
        w.skip_to(r.offset).map_err(io_err)?;
        (at, records) = (r.offset, r.records);
    }
    let mut closed = false;
    let mut group: Option<OpenGroup> = None;
    // The last operation read was an accepted-unknown record: the next
    // append is read whatever its partition (`ScanFrom::only_partition`).
    let mut after_unknown = false;
    // The scan's result; a group still open at the end is not kept.
    let done =
        |records: u64, at: u64, end: End, closed: bool, group: Option<OpenGroup>, room: u64| {
            let (records, valid_len, end, closed) = match group {
                None => (records, at, end, closed),
                Some(g) => {
                    let end = match end {
                        End::Clean => End::Torn {
                            offset: g.at,
                            kind: Corruption::IncompleteGroup,
                        },
                        End::Torn { kind, .. } => End::Torn { offset: g.at, kind },
                        mid => mid,
                    };
                    (g.records_before, g.at, end, false)
                }
            };
            Scan {
                first_position,
                version,
                records,
                valid_len,
                file_len,
                room,
                end,
                store: h.store,
                closed,
                kafka: h.kafka,
            }
        };
    let misplaced = |at: u64, kind: Corruption| End::MidLog {
        offset: at,
        kind,
        later: at,
    };
    loop {
        if start
            .stop_at
            .is_some_and(|s| group.is_none() && first_position + records >= s)
        {
            return Ok(done(records, at, End::Clean, false, None, 0));
        }
        let bytes = w.at(at, record::MAX_LEN).map_err(io_err)?;
        if bytes.is_empty() {
            return Ok(done(records, at, End::Clean, closed, group, 0));
        }
        if let Some(only) = start.only_partition
            && group.is_none()
            && !after_unknown
            && let (passed @ 1.., len) = record::pass_over(bytes, seed, layout, at, only)
        {
            records += passed;
            closed = false;
            at += len as u64;
            continue;
        }
        match record::decode(bytes, seed, layout, at) {
            Ok(Decoded {
                ops, len, close, ..
            }) => {
                for (nth, op) in ops.enumerate() {
                    after_unknown = matches!(op, LogOp::AcceptedUnknown);
                    let pos = first_position + records;
                    let nth = nth as u32;
                    match (&mut group, &op) {
                        (None, LogOp::Group { kind, members, .. }) => {
                            group = Some(OpenGroup {
                                at,
                                records_before: records,
                                kind: *kind,
                                left: *members,
                                ops: Vec::new(),
                            });
                        }
                        (Some(_), LogOp::Group { .. }) => {
                            let kind = Corruption::BadField("group record inside a group");
                            return Ok(done(records, at, misplaced(at, kind), false, group, 0));
                        }
                        (Some(g), op) if !member_ok(g.kind, op) => {
                            let kind =
                                Corruption::BadField("record of another kind inside a group");
                            return Ok(done(records, at, misplaced(at, kind), false, group, 0));
                        }
                        (None, op) if !alone_ok(op) => {
                            let kind = Corruption::BadField("group member outside a group");
                            return Ok(done(records, at, misplaced(at, kind), false, group, 0));
                        }
                        (Some(g), _) => g.left -= 1,
                        (None, op) => {
                            each(pos, at, nth, op).map_err(HeaderError::Bad)?;
                            records += u64::from(op.takes_position());
                            continue;
                        }
                    }
                    // A group record, or a member of the open group: held
                    // until the group is complete.
                    if let Some(g) = &mut group {
                        g.ops.push((pos, at, nth, op.clone()));
                        records += u64::from(op.takes_position());
                        if g.left == 0 {
                            for (pos, at, nth, op) in std::mem::take(&mut g.ops) {
                                each(pos, at, nth, &op).map_err(HeaderError::Bad)?;
                            }
                            group = None;
                        }
                    }
                }
                closed = close;
                at += len as u64;
            }
            Err(Bad::Misplaced(kind)) => {
                return Ok(done(records, at, misplaced(at, kind), false, group, 0));
            }
            Err(Bad::Incomplete(kind)) | Err(Bad::Invalid(kind)) => {
                // The search for later writes starts after the damage, or
                // (preallocated segments) where the zeros after it end: no
                // record's length field lies wholly in zeros.
                let mut from = at + 1;
                if h.preallocated {
                    w.track_from(at);
                    let limit = (start.bounded_room_after_close && closed)
                        .then_some(at.saturating_add(ROOM_CHECKED));
                    match first_nonzero_from(&mut w, at, limit).map_err(io_err)? {
                        // A preallocated segment: its records end here,
                        // the rest is the room it was given.
                        None => {
                            let room = file_len.saturating_sub(at);
                            return Ok(done(records, at, End::Clean, closed, group, room));
                        }
                        Some(nonzero) => from = from.max(nonzero.saturating_sub(7)),
                    }
                }
                let mut prefixes = PrefixCrc::new(record::MAX_LEN);
                let end = match later_write(&mut w, at, from, seed, layout, &mut prefixes)
                    .map_err(io_err)?
                {
                    None => End::Torn { offset: at, kind },
                    Some(later) => End::MidLog {
                        offset: at,
                        kind,
                        later,
                    },
                };
                // A torn tail: the search read the file to its end, so the
                // zeros after the last written byte are known (the room a
                // preallocated segment had left).
                let room = match (&end, w.written_end) {
                    (End::Torn { .. }, Some(written)) => file_len.saturating_sub(written),
                    _ => 0,
                };
                return Ok(done(records, at, end, false, group, room));
            }
        }
    }
}

/// The index of the first byte that is not zero.
fn first_nonzero(bytes: &[u8]) -> Option<usize> {
    // Eight at a time, then the byte.
    let words = bytes.chunks_exact(8);
    let skip = words.take_while(|w| w.iter().all(|&b| b == 0)).count() * 8;
    bytes
        .get(skip..)?
        .iter()
        .position(|&b| b != 0)
        .map(|i| skip + i)
}

/// The offset of the first byte from `at` on that is not zero (`None`:
/// zeros to the end of the file, or, with a `limit`, to past it: the
/// bytes read are whole windows, so the search may look further).
/// Consecutive windows overlap by 8 bytes, so the window never moves past
/// the 8 bytes before that byte: the search for later writes may start up
/// to 7 bytes before it.
fn first_nonzero_from<R: Read>(
    w: &mut Window<R>,
    mut at: u64,
    limit: Option<u64>,
) -> std::io::Result<Option<u64>> {
    loop {
        let bytes = w.at(at, CHUNK)?;
        if let Some(i) = first_nonzero(bytes) {
            return Ok(Some(at + i as u64));
        }
        if bytes.len() < CHUNK || limit.is_some_and(|l| at + bytes.len() as u64 >= l) {
            return Ok(None);
        }
        at += (bytes.len() - 8) as u64;
    }
}

/// The offset of the first valid record after `damage` that was written
/// when the bytes at `damage` were already durable, or that is not where
/// it was written (version 3), if any.
///
/// Every offset is a candidate that [`record::claimed_len`] accepts and
/// whose checksum verifies; a candidate that verifies is stepped over
/// whole (its bytes cannot hold the start of another record). A checksum
/// that verifies is what the search trusts: the length and the unsynced
/// offset it reads are under it, and the rest of the record does not
/// change the answer (a record with a valid checksum and an invalid
/// payload was not torn: it is counted like any other, which can only
/// turn a torn tail into a refusal, never the reverse).
///
/// Linear in the bytes after `damage`, whatever they hold: each offset is
/// tested once, and the checksum of a candidate comes from CRCs of
/// prefixes ([`PrefixCrc`]) into which each byte is fed once, so crafted
/// bytes whose every fourth offset claims a 64 KiB record cost what zeros
/// cost, not 64 KiB of CRC per offset.
fn later_write<R: Read>(
    w: &mut Window<R>,
    damage: u64,
    from: u64,
    seed: u32,
    layout: record::Layout,
    prefixes: &mut PrefixCrc,
) -> std::io::Result<Option<u64>> {
    let mut at = from;
    loop {
        let bytes = w.at(at, record::MAX_LEN)?;
        if bytes.len() < frame::MIN_LEN {
            return Ok(None);
        }
        // Zeros hold no candidate (a record's length, bytes 4..8, is never
        // zero): step over a run of them at once, as over the room left
        // in a preallocated segment.
        if bytes.get(4..8) == Some(&[0u8; 4][..]) {
            let nonzero = first_nonzero(bytes.get(4..).unwrap_or_default());
            at += nonzero.map_or(bytes.len() as u64 - 7, |i| i.max(4) as u64 - 3);
            continue;
        }
        if let Some(len) = record::claimed_len(bytes, layout)
            && let Some(stored) = frame::stored_crc(bytes)
            && let Some(computed) = prefixes.crc(
                seed,
                bytes,
                at,
                at + frame::CRC_FROM as u64,
                len - frame::CRC_FROM,
            )
            && stored == computed
        {
            // A valid record that is not where it states it was written
            // was moved or repeated, or records before it are missing:
            // never a crash.
            if record::stated_offset(bytes, layout).is_some_and(|o| u64::from(o) != at) {
                return Ok(Some(at));
            }
            let since_durable = record::unsynced_offset(bytes, layout).unwrap_or(0);
            let durable_end = at.saturating_sub(u64::from(since_durable));
            if durable_end > damage {
                return Ok(Some(at));
            }
            at += len as u64;
            continue;
        }
        at += 1;
    }
}

#[cfg(test)]
#[path = "segment_tests.rs"]
mod tests;
