//! A snapshot's header (magic, version, flags, position, counts, its own
//! CRC) and the constants of its layout, which the reader, the writer,
//! recovery and the inspector share.

#![deny(clippy::indexing_slicing)]

use std::path::Path;

use crate::codec::{Dec, Put, truncated};
use crate::error::{Corruption, Error, Result};

pub(crate) const MAGIC: &[u8; 8] = b"PSTATSNP";
/// The version this build writes when it knows where the snapshot's
/// position lies in the log: version 5 with a [`LogPoint`] in the header.
/// It reads this one, [`VERSION_5`] (which it still writes for a state
/// that no log of this store holds: a replica's, a seeded one),
/// [`VERSION_4`], [`VERSION_3`], [`VERSION_2`] and [`VERSION_1`].
pub(crate) const VERSION: u16 = 6;
/// Each partition's end in the store section.
pub(crate) const VERSION_5: u16 = 5;
/// Version 3's sections, then the entries in blocks of one shard each,
/// each entry's activity dropped when it is its newest batch's timestamp.
pub(crate) const VERSION_4: u16 = 4;
/// A store section (the log clock, the highest offset, the removed-key
/// filter) before the entries, and each entry's last activity.
pub(crate) const VERSION_3: u16 = 3;
/// Entries with spans and deltas, no activity, no store section.
pub(crate) const VERSION_2: u16 = 2;
/// Entries with every retained batch in full (fixed 25 bytes per batch).
pub(crate) const VERSION_1: u16 = 1;
/// Where the header stores the position the snapshot covers.
pub(crate) const POSITION_AT: u64 = 16;
pub(crate) const HEADER_LEN: usize = 48;
pub(crate) const TRAILER_LEN: usize = 4;
pub(super) const ID_NUMERIC: u8 = 0;
pub(super) const ID_NAMED: u8 = 1;
pub(super) const HAS_META: u8 = 1;
/// Header flag (bit 0): the state is a [`Semantics::Kafka`] state, and a
/// Kafka section (`kafka_snapshot.rs`) follows the store section. A file
/// with the bit clear is byte for byte what it was before Kafka mode.
///
/// [`Semantics::Kafka`]: crate::Semantics::Kafka
pub(crate) const FLAG_KAFKA: u16 = 1;

/// Where a snapshot's position lies in its log (version 6): the byte
/// offset, in the segment that holds the position, of the first record
/// the snapshot does not cover, and that segment's CRC seed, which comes
/// from its first position, store id and salt and so names that one file.
/// Recovery seeks there instead of reading the records below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogPoint {
    /// Never 0 (the segment's header comes first).
    pub offset: u32,
    pub seed: u32,
}

/// What a snapshot's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The format version of the entries.
    pub version: u16,
    /// The state reflects every log record before this position, none after.
    pub position: u64,
    pub entries: u64,
    pub body_len: u64,
    /// [`FLAG_KAFKA`]: a Kafka-mode state (version 3 on).
    pub kafka: bool,
    /// Where the position lies in the log (version 6 only).
    pub point: Option<LogPoint>,
}

/// The header's bytes; `version` decides whether `point` is written (6) or
/// the two fields that hold it are 0 (before 6).
pub(super) fn encode_header(h: &Header) -> Vec<u8> {
    let point = h.point.filter(|_| h.version >= VERSION_6);
    let mut b = Vec::with_capacity(HEADER_LEN);
    b.extend_from_slice(MAGIC);
    b.put_u16(h.version);
    b.put_u16(if h.kafka { FLAG_KAFKA } else { 0 });
    b.put_u32(point.map_or(0, |p| p.offset));
    b.put_u64(h.position);
    b.put_u64(h.entries);
    b.put_u64(h.body_len);
    let c = crc32c::crc32c(&b);
    b.put_u32(c);
    b.put_u32(point.map_or(0, |p| p.seed));
    b
}

/// A snapshot with a [`LogPoint`] in its header.
pub(crate) const VERSION_6: u16 = 6;

/// Parses and checks a header (magic, version, its own CRC).
pub(crate) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Err(Error::corrupt(path, 0, truncated(HEADER_LEN, bytes.len())));
    };
    let mut d = Dec::new(h);
    let (version, flags) = d
        .magic_version_flags(MAGIC)
        .map_err(|k| Error::corrupt(path, 0, k))?;
    let reserved = d.u32().unwrap_or(0);
    let position = d.u64().unwrap_or(0);
    let entries = d.u64().unwrap_or(0);
    let body_len = d.u64().unwrap_or(0);
    let stored = d.u32().unwrap_or(0);
    let reserved2 = d.u32().unwrap_or(0);
    let computed = crc32c::crc32c(h.get(..40).unwrap_or_default());
    if stored != computed {
        return Err(Error::corrupt(
            path,
            40,
            Corruption::ChecksumMismatch { stored, computed },
        ));
    }
    if !(VERSION_1..=VERSION).contains(&version) {
        return Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    let known_flags = if version >= VERSION_3 { FLAG_KAFKA } else { 0 };
    let (offset, seed) = (reserved, reserved2);
    let point = if version >= VERSION_6 {
        // A file without a point is a version-5 file: 0 here is damage.
        if offset == 0 {
            return Err(Error::corrupt(
                path,
                12,
                Corruption::BadField("log point offset"),
            ));
        }
        Some(LogPoint { offset, seed })
    } else {
        None
    };
    if flags & !known_flags != 0 || (point.is_none() && (reserved != 0 || reserved2 != 0)) {
        return Err(Error::corrupt(
            path,
            10,
            Corruption::BadField("reserved header fields"),
        ));
    }
    Ok(Header {
        version,
        position,
        entries,
        body_len,
        kafka: flags & FLAG_KAFKA != 0,
        point,
    })
}

/// Bytes of a block's header (version 4): shard, entry count, length.
pub(crate) const BLOCK_HEADER: usize = 10;
/// The shard field of a Kafka-mode file's blocks: its keys are not
/// grouped by shard (the Kafka engine has no shards).
pub(crate) const UNSHARDED: u16 = u16::MAX;
/// The longest block a reader accepts (it allocates the block before the
/// file's CRC can vouch for its length).
pub(crate) const MAX_BLOCK: u32 = 1 << 24;
