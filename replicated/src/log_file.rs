//! The bytes of `raft.log` (docs/format.md, "A replica of
//! `producer-state-raft`"): its header, its records, and the rule that tells
//! a write torn by a crash from damage to a write that was acknowledged.
//! [`LogStore`](crate::LogStore) keeps the entries and the file in step;
//! this module only turns entries into bytes and bytes into entries.
//!
//! - The file starts with a 24-byte header: magic, version, a random salt
//!   and a CRC of those. Every record's CRC is seeded by the header's, so
//!   bytes a producer chose (a name) never pass for a record.
//! - Then records `[len u32][crc32c u32][payload]`, one per entry; the
//!   payload is the entry's log id, the file offset where the write it went
//!   out in began, its kind and its bytes.
//!
//! Every record states where its write began. On open, damage (a record
//! cut short or failing its checksum) at offset X followed by nothing
//! valid, or only by records of writes that began at or before X, is what
//! a crash leaves of a write whose fsync never returned: never
//! acknowledged, it is cut there. Damage followed by a record of a write
//! that began after X is refused as corruption: a write starts only after
//! the one before it was fsync'ed, so X was durable and acknowledged, and a
//! replica must not forget entries a majority may have counted. An offset,
//! not an index, names the write: a truncation cuts the file and the next
//! write begins at the cut, whatever indices the records left before it
//! carry.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use producer_state::crc::RangeCrc;

use crate::TypeConfig;
use crate::command::{self, Command, MAX_COMMAND_BYTES, Reader};

/// Every entry of a log with the file offset of its record, by index.
pub(crate) type Entries = BTreeMap<u64, (u64, Entry<TypeConfig>)>;

pub(crate) const LOG_FILE: &str = "raft.log";
const RECORD_HEADER: usize = 8;
const LOG_MAGIC: &[u8; 8] = b"PSRAFTLG";
/// Version 3: command tags 3 to 5 (the lifecycle commands) may appear.
/// Version 2 logs are read and rewritten as version 3 when opened
/// (docs/format.md, "Versions").
const LOG_VERSION: u16 = 3;
const LOG_VERSION_2: u16 = 2;
/// `raft.log` starts with magic, version, reserved, a salt, and a CRC of
/// those.
pub(crate) const LOG_HEADER: usize = 24;

/// The header of a log file: magic, version, salt, CRC.
pub(crate) type Header = [u8; LOG_HEADER];

fn log_header(salt: u64) -> Header {
    let mut h = [0u8; LOG_HEADER];
    h[..8].copy_from_slice(LOG_MAGIC);
    h[8..10].copy_from_slice(&LOG_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32c::crc32c(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A header of this version: reserved bytes zero, its CRC right.
fn log_header_valid(h: &Header) -> bool {
    h[10..12] == [0, 0] && h[20..24] == crc32c::crc32c(&h[..20]).to_le_bytes()
}

/// The seed of every record's checksum in a log with this header: the
/// header's own CRC, so a function of its random salt. Bytes a producer
/// chose (a name) cannot pass for a record, since it cannot know the
/// salt, and neither can a record of another log.
pub(crate) fn record_seed(header: &Header) -> u32 {
    u32::from_le_bytes([header[20], header[21], header[22], header[23]])
}

/// The header of a new log in `dir`, with a salt that is random (std's
/// hasher keys come from the OS), mixed with the time and the place.
pub(crate) fn new_header(dir: &Path) -> Header {
    use std::hash::{BuildHasher, RandomState};
    let salt = RandomState::new().hash_one((std::time::SystemTime::now(), std::process::id(), dir));
    log_header(salt)
}

/// A record's payload is at most this long: the entry's head and the
/// longest command `Command::validate` lets through (membership entries
/// are far shorter). `append` refuses a longer entry rather than write a
/// record that `open` would not read back.
const MAX_PAYLOAD: u32 = MIN_PAYLOAD + MAX_COMMAND_BYTES as u32;

const KIND_BLANK: u8 = 0;
const KIND_NORMAL: u8 = 1;
const KIND_MEMBERSHIP: u8 = 2;

/// Appends the record of `e` to `out`; `Err` (and `out` as it was) if its
/// payload would be longer than [`MAX_PAYLOAD`].
pub(crate) fn encode_entry(e: &Entry<TypeConfig>, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER]);
    out.extend_from_slice(&e.log_id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&e.log_id.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&e.log_id.index.to_le_bytes());
    // Where the write this record goes out in begins.
    out.extend_from_slice(&0u64.to_le_bytes());
    if let Err(e) = encode_payload(&e.payload, out) {
        out.truncate(start);
        return Err(e);
    }
    let payload_len = out.len() - start - RECORD_HEADER;
    let Some(len) = u32::try_from(payload_len)
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
    else {
        out.truncate(start);
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "entry {} takes {payload_len} bytes, more than a record holds ({MAX_PAYLOAD}); \
                 propose commands that pass Command::validate",
                e.log_id
            ),
        ));
    };
    // The write start and the CRC are filled in by `seal_write` once the
    // write is formed.
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Appends an entry's kind and payload (a record's bytes after its write
/// start; the wire carries the same bytes): nothing more for a blank
/// entry, the command's bytes, or a membership as openraft's serde shape
/// in JSON (membership entries are rare and small).
pub(crate) fn encode_payload(
    payload: &EntryPayload<TypeConfig>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    match payload {
        EntryPayload::Blank => out.push(KIND_BLANK),
        EntryPayload::Normal(c) => {
            out.push(KIND_NORMAL);
            c.encode(out);
        }
        EntryPayload::Membership(m) => {
            out.push(KIND_MEMBERSHIP);
            out.extend_from_slice(&serde_json::to_vec(m).map_err(std::io::Error::other)?);
        }
    }
    Ok(())
}

/// Reads what [`encode_payload`] wrote; it must use every byte.
/// `Err(Some(why))` when the command does not decode, `Err(None)` for any
/// other damage.
pub(crate) fn decode_payload(
    bytes: &[u8],
) -> Result<EntryPayload<TypeConfig>, Option<&'static str>> {
    let mut p = Reader(bytes);
    Ok(match p.u8().map_err(|_| None)? {
        KIND_BLANK if p.0.is_empty() => EntryPayload::Blank,
        KIND_NORMAL => EntryPayload::Normal(Command::decode(p.0).map_err(Some)?),
        KIND_MEMBERSHIP => EntryPayload::Membership(serde_json::from_slice(p.0).map_err(|_| None)?),
        _ => return Err(None),
    })
}

/// Where a record's write-start field is: after length, CRC, term, node
/// and index.
const WRITE_AT: usize = RECORD_HEADER + 24;

/// Sets the write-start field of the record at the start of `rec` and
/// its CRC (seeded with `seed`); returns the record's length.
fn seal_record(rec: &mut [u8], write_start: u64, seed: u32) -> usize {
    let len = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
    rec[WRITE_AT..WRITE_AT + 8].copy_from_slice(&write_start.to_le_bytes());
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(seed, &rec[..4]),
        &rec[RECORD_HEADER..RECORD_HEADER + len],
    );
    rec[4..8].copy_from_slice(&crc.to_le_bytes());
    RECORD_HEADER + len
}

/// Marks every record in `buf` (whole records, as `encode_entry` wrote
/// them) as part of one write that begins at file offset `write_start`,
/// and checksums them with the log's `seed` ([`record_seed`]). The writer
/// calls it on each write before it is written: after a crash, records of
/// one write that did not reach the disk whole can be told from damage to
/// an earlier, fsync'ed write (`LogStore::open`).
pub(crate) fn seal_write(buf: &mut [u8], write_start: u64, seed: u32) {
    let mut at = 0;
    while at < buf.len() {
        at += seal_record(&mut buf[at..], write_start, seed);
    }
}

/// What the bytes at an offset of the log are.
enum Decoded {
    /// A whole valid record: the entry and the record's length.
    Record(Entry<TypeConfig>, usize),
    /// Not a whole valid record (cut short, or its checksum fails).
    NotARecord,
    /// A whole record, checksummed by this log, whose command this build
    /// does not read: written by a later build (a tag added since).
    /// Neither damage nor a torn write, and never cut: a replica that
    /// dropped it would apply a different log than the others.
    UnknownCommand,
}

/// The record at the start of `bytes`, file offset `at`.
fn decode_record(bytes: &[u8], at: usize, seed: u32) -> Decoded {
    let mut r = Reader(bytes);
    let (Ok(len), Ok(crc)) = (r.u32(), r.u32()) else {
        return Decoded::NotARecord;
    };
    if len > MAX_PAYLOAD {
        return Decoded::NotARecord;
    }
    let Ok(payload) = r.take(len as usize) else {
        return Decoded::NotARecord;
    };
    let computed = crc32c::crc32c_append(crc32c::crc32c_append(seed, &len.to_le_bytes()), payload);
    if computed != crc {
        return Decoded::NotARecord;
    }
    match decode_record_payload(payload, at) {
        Ok(entry) => Decoded::Record(entry, RECORD_HEADER + len as usize),
        Err(Some(command::UNKNOWN_TAG)) => Decoded::UnknownCommand,
        Err(_) => Decoded::NotARecord,
    }
}

/// A checksummed record's payload; `Err(Some(why))` when its command does
/// not decode.
fn decode_record_payload(
    payload: &[u8],
    at: usize,
) -> Result<Entry<TypeConfig>, Option<&'static str>> {
    let mut p = Reader(payload);
    let term = p.u64().map_err(|_| None)?;
    let node_id = p.u64().map_err(|_| None)?;
    let index = p.u64().map_err(|_| None)?;
    let write_start = p.u64().map_err(|_| None)?;
    if !(LOG_HEADER as u64..=at as u64).contains(&write_start) {
        return Err(None);
    }
    let payload = decode_payload(p.0)?;
    Ok(Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, node_id), index),
        payload,
    })
}

/// Whether the bytes of `bytes` from `at` (where no valid record starts)
/// are what a crash leaves of the last write: nothing valid after `at`,
/// or only records of writes that began at or before `at`, so that `at`
/// was part of the write they went out in. A write is acknowledged only
/// after its fsync, and the next write starts only after that fsync, so a
/// record of a write that began after `at` proves `at` was fsync'ed: that
/// damage is refused.
///
/// Every offset after `at` is a candidate, tested at a constant cost
/// ([`write_start_at`]), so the search is linear in the bytes after the
/// damage whatever they hold.
fn torn_write(bytes: &[u8], at: usize, seed: u32) -> bool {
    let from = at + 1;
    let after = bytes.get(from..).unwrap_or_default();
    let crcs = RangeCrc::new(after);
    (0..after.len())
        .filter_map(|s| write_start_at(after, &crcs, s, from, seed))
        .all(|write_start| write_start <= at as u64)
}

/// The least payload: term, node, index, write start, kind.
const MIN_PAYLOAD: u32 = 33;

/// Where the write of the record at `s` in `bytes` (file offset `base +
/// s`) began, if a record that could have been written starts there: a
/// plausible length, kind and write start, and a checksum that verifies,
/// computed in O(1) from `crcs` (the prefix CRCs of `bytes`) whatever
/// length the record claims. The fields read are under the checksum; the
/// rest of the payload is not decoded (a record with a valid checksum was
/// written whole, which is all the search asks).
fn write_start_at(bytes: &[u8], crcs: &RangeCrc, s: usize, base: usize, seed: u32) -> Option<u64> {
    let field = |at: usize| -> Option<[u8; 8]> { bytes.get(s + at..s + at + 8)?.try_into().ok() };
    let head = field(0)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&len) {
        return None;
    }
    let kind = *bytes.get(s + RECORD_HEADER + 32)?;
    if kind > KIND_MEMBERSHIP || (kind == KIND_BLANK && len != MIN_PAYLOAD) {
        return None;
    }
    let write_start = u64::from_le_bytes(field(WRITE_AT)?);
    if !(LOG_HEADER as u64..=(base + s) as u64).contains(&write_start) {
        return None;
    }
    let seed = crc32c::crc32c_append(seed, &head[..4]);
    (crcs.crc_append(seed, s + RECORD_HEADER, len as usize)? == stored).then_some(write_start)
}

/// The bytes of a log holding `entries` under `header`, as one write after
/// the header; each entry's offset is set to its place in them.
pub(crate) fn rewrite(header: &Header, entries: &mut Entries) -> std::io::Result<Vec<u8>> {
    let mut buf = header.to_vec();
    let mut offsets = Vec::with_capacity(entries.len());
    for (_, e) in entries.values() {
        offsets.push(buf.len() as u64);
        encode_entry(e, &mut buf)?;
    }
    for ((o, _), at) in entries.values_mut().zip(offsets) {
        *o = at;
    }
    seal_write(
        &mut buf[LOG_HEADER..],
        LOG_HEADER as u64,
        record_seed(header),
    );
    Ok(buf)
}

/// What [`scan`] read from a log file's bytes.
pub(crate) struct Scanned {
    /// The file's header.
    pub(crate) header: Header,
    /// Every entry after the last purged one.
    pub(crate) entries: Entries,
    /// Where the valid records end: bytes after it are a torn write.
    pub(crate) end: usize,
}

/// Bytes of a log file that are not what this build wrote, or not what a
/// crash can leave of it.
#[derive(Debug)]
pub(crate) struct Damage {
    /// Where.
    pub(crate) offset: u64,
    /// What is wrong.
    pub(crate) what: &'static str,
}

/// Reads a whole log file (header and records), skipping records up to
/// index `last_purged`; a torn last write is left out (`end` says where the
/// valid records stop), any other damage refused (module docs).
pub(crate) fn scan(bytes: &[u8], last_purged: Option<u64>) -> Result<Scanned, Damage> {
    let damage = |offset: usize, what| Damage {
        offset: offset as u64,
        what,
    };
    let header: Header = match bytes.get(..LOG_HEADER) {
        Some(h) if h[..8] != LOG_MAGIC[..] => None,
        Some(h)
            if h[8..10] != LOG_VERSION.to_le_bytes() && h[8..10] != LOG_VERSION_2.to_le_bytes() =>
        {
            return Err(damage(8, "a log version this build does not read"));
        }
        Some(h) => h.try_into().ok().filter(log_header_valid),
        None => None,
    }
    .ok_or_else(|| damage(0, "not a producer-state-raft log (header)"))?;
    let seed = record_seed(&header);
    let mut entries = BTreeMap::new();
    let mut at = LOG_HEADER;
    let mut prev: Option<u64> = None;
    while at < bytes.len() {
        match decode_record(&bytes[at..], at, seed) {
            // Records up to the last purged one are skipped whatever
            // their order: a purge to a snapshot's log id can pass the
            // end of the log (an installed snapshot), and the next
            // record then follows the snapshot, not the last record.
            Decoded::Record(e, n) if last_purged.is_some_and(|p| e.log_id.index <= p) => {
                at += n;
            }
            Decoded::Record(e, n) if prev.is_none_or(|p| e.log_id.index == p + 1) => {
                prev = Some(e.log_id.index);
                entries.insert(e.log_id.index, (at as u64, e));
                at += n;
            }
            Decoded::UnknownCommand => {
                return Err(damage(
                    at,
                    "a command this build does not read (written by a later build: \
                     upgrade this replica)",
                ));
            }
            Decoded::Record(..) => return Err(damage(at, "a record out of index order")),
            Decoded::NotARecord => {
                if !torn_write(bytes, at, seed) {
                    return Err(damage(
                        at,
                        "a damaged record followed by a later write's records",
                    ));
                }
                break;
            }
        }
    }
    Ok(Scanned {
        header,
        entries,
        end: at,
    })
}

/// The header a version-2 log is rewritten under (the same salt, this
/// version), or `None` for a log of this version. A build that reads only
/// version 2 then refuses the rewritten file by its version, rather than
/// cut a lifecycle command it cannot read as a torn write.
pub(crate) fn upgraded(header: &Header) -> Option<Header> {
    (header[8..10] == LOG_VERSION_2.to_le_bytes()).then(|| {
        let salt = u64::from_le_bytes(header[12..20].try_into().unwrap_or_default());
        log_header(salt)
    })
}
