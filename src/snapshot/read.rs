//! Reading a snapshot: streamed, every entry decoded and checked, and the
//! CRC over every byte verified before the caller may keep what it built.
//! A version-4 body is read block by block, so that a loader can decode
//! each block on the thread that owns its shard.

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::Path;

use super::entry as entry_codec;
use super::header::*;
use crate::batch::{BatchMetadata, RetainedBatch};
use crate::codec::{Dec, truncated};
use crate::engine::entry::{ProducerEntry, RETAINED_BATCHES};
use crate::error::{Corruption, Error, Result};
use crate::fs::FileSystem;
use crate::fs::read_full;
use crate::id::ProducerId;
use crate::snapshot::meta::Meta;

/// Decodes one version-1 entry; `None` if the bytes end first (the caller
/// reads more), `Err` if they are not a valid entry.
fn decode_entry_v1(
    d: &mut Dec<'_>,
) -> Option<std::result::Result<(ProducerId, i32, ProducerEntry), Corruption>> {
    let kind = d.u8()?;
    let id = match kind {
        ID_NUMERIC => ProducerId::numeric(d.u64()?),
        ID_NAMED => {
            let n = d.u16()? as usize;
            match std::str::from_utf8(d.bytes(n)?) {
                Ok(s) => ProducerId::named(s),
                Err(_) => return Some(Err(Corruption::BadField("producer name (not UTF-8)"))),
            }
        }
        other => return Some(Err(Corruption::BadKind(other))),
    };
    let partition = d.i32()?;
    let epoch = d.i16()?;
    let last = d.i32()?;
    let count = d.u8()? as usize;
    if count > RETAINED_BATCHES {
        return Some(Err(Corruption::BadField("retained batch count")));
    }
    let mut batches = [RetainedBatch {
        first_sequence: 0,
        last_sequence: 0,
        metadata: None,
    }; RETAINED_BATCHES];
    for slot in batches.iter_mut().take(count) {
        let first_sequence = d.i32()?;
        let last_sequence = d.i32()?;
        let metadata = match d.u8()? {
            0 => None,
            HAS_META => Some(BatchMetadata {
                offset: d.i64()?,
                timestamp: d.i64()?,
            }),
            _ => return Some(Err(Corruption::BadField("retained batch flags"))),
        };
        *slot = RetainedBatch {
            first_sequence,
            last_sequence,
            metadata,
        };
    }
    let batches = batches.get(..count).unwrap_or_default();
    Some(match ProducerEntry::from_parts(epoch, last, batches) {
        Some(e) => Ok((id, partition, e)),
        None => Err(Corruption::BadField("entry (sequences inconsistent)")),
    })
}

/// Decodes one entry of `version` at the start of `buf`. Entries of
/// versions 1 and 2 have no activity: a key takes its newest retained
/// batch's timestamp, or 0 (docs/lifecycle.md, "Stores written before").
#[inline]
fn decode_entry(
    version: u16,
    buf: &[u8],
) -> Option<std::result::Result<entry_codec::Decoded, Corruption>> {
    let legacy = |r: std::result::Result<entry_codec::Decoded, Corruption>| {
        r.map(|(id, p, e, _, len)| {
            let act = e.activity_without_clock();
            (id, p, e, act, len)
        })
    };
    match version {
        VERSION_1 => {
            let mut d = Dec::new(buf);
            decode_entry_v1(&mut d).map(|r| legacy(r.map(|(id, p, e)| (id, p, e, 0, d.pos()))))
        }
        VERSION_2 => entry_codec::decode_entry(buf, false).map(legacy),
        _ => entry_codec::decode_entry(buf, true),
    }
}

/// The store section of the snapshot at `path` (verifying its header, not
/// its entries: a truncation reads this to pick its base, then loads the
/// whole file, which verifies everything). A snapshot older than version 3
/// has none: [`Meta::legacy`].
pub(crate) fn read_meta(fs: &dyn FileSystem, path: &Path) -> Result<Meta> {
    let io = |e| Error::io("read", path, e);
    let mut f = fs.open_read(path).map_err(|e| Error::io("open", path, e))?;
    let mut head = [0u8; HEADER_LEN];
    let n = read_full(&mut f, &mut head).map_err(io)?;
    let header = parse_header(path, head.get(..n).unwrap_or_default())?;
    if header.version < VERSION_3 {
        return Ok(Meta::legacy());
    }
    let mut len = [0u8; 4];
    if read_full(&mut f, &mut len).map_err(io)? < 4 {
        return Err(Error::corrupt(path, HEADER_LEN as u64, truncated(4, 0)));
    }
    let n = u64::from(u32::from_le_bytes(len));
    if n + 4 > header.body_len {
        return Err(Error::corrupt(
            path,
            HEADER_LEN as u64,
            Corruption::BadLength(n),
        ));
    }
    let mut section = vec![0u8; n as usize];
    let got = read_full(&mut f, &mut section).map_err(io)?;
    if got < section.len() {
        return Err(Error::corrupt(
            path,
            HEADER_LEN as u64 + 4,
            truncated(section.len(), got),
        ));
    }
    Meta::decode(&section, header.version)
        .map_err(|k| Error::corrupt(path, HEADER_LEN as u64 + 4, k))
}

/// What a snapshot's reader hands its entries to.
pub(crate) trait Sink {
    /// Called once, with the header, before the first entry.
    fn begin(&mut self, _header: &Header) {}
    /// Called once, before the first entry, with the store section
    /// (versions 1 and 2 have none: the default).
    fn meta(&mut self, _meta: Meta) {}
    /// Called once, after the store section and before the first entry,
    /// with the Kafka section of a Kafka-mode state (see [`FLAG_KAFKA`]).
    /// The default sets it aside: a reader that wants only the entries.
    fn kafka(&mut self, _kafka: crate::engine::kafka::state::KafkaState) {}
    /// The one partition whose entries it wants, if it wants one: the
    /// others' entries of a version-4 file are then passed over by their
    /// framing ([`entry_codec::measure`]), neither decoded nor handed to
    /// [`Sink::entry`] (an older file's still are: the sink must filter).
    fn only(&self) -> Option<i32> {
        None
    }
    /// One decoded entry, the key's hash ([`crate::engine::map::hash_key`]) and
    /// its last activity; an error stops the read.
    fn entry(
        &mut self,
        hash: u64,
        id: ProducerId,
        partition: i32,
        e: ProducerEntry,
        act: i64,
    ) -> Result<()>;
}

struct Each<F>(F, Meta, Option<crate::engine::kafka::state::KafkaState>);

impl<F: FnMut(ProducerId, i32, ProducerEntry, i64) -> Result<()>> Sink for Each<F> {
    fn meta(&mut self, meta: Meta) {
        self.1 = meta;
    }

    fn kafka(&mut self, kafka: crate::engine::kafka::state::KafkaState) {
        self.2 = Some(kafka);
    }

    #[inline]
    fn entry(
        &mut self,
        _hash: u64,
        id: ProducerId,
        partition: i32,
        e: ProducerEntry,
        act: i64,
    ) -> Result<()> {
        (self.0)(id, partition, e, act)
    }
}

/// Streams a snapshot file, verifying its header, every entry and finally
/// the CRC over every byte. `each` sees entries as they are decoded; the
/// caller must discard what it built if this returns an error. Returns
/// the header and the store section.
pub(crate) fn read(
    path: &Path,
    r: impl Read,
    file_len: u64,
    each: impl FnMut(ProducerId, i32, ProducerEntry, i64) -> Result<()>,
) -> Result<(Header, Meta)> {
    read_kafka(path, r, file_len, each).map(|(h, m, _)| (h, m))
}

/// [`read`], also returning the Kafka section of a Kafka-mode state.
pub(crate) fn read_kafka(
    path: &Path,
    r: impl Read,
    file_len: u64,
    each: impl FnMut(ProducerId, i32, ProducerEntry, i64) -> Result<()>,
) -> Result<(
    Header,
    Meta,
    Option<crate::engine::kafka::state::KafkaState>,
)> {
    let mut sink = Each(each, Meta::default(), None);
    let h = read_into(path, r, file_len, &mut sink)?;
    Ok((h, sink.1, sink.2))
}

/// [`read`], handing the header and then the entries to `sink`.
pub(crate) fn read_into(
    path: &Path,
    mut r: impl Read,
    file_len: u64,
    sink: &mut impl Sink,
) -> Result<Header> {
    let mut pre = read_prelude(path, &mut r, file_len, sink)?;
    read_rest(path, r, &mut pre, sink)?;
    Ok(pre.header)
}

/// The entries after [`read_prelude`], handed to `sink`, then the trailer.
pub(crate) fn read_rest(
    path: &Path,
    r: impl Read,
    pre: &mut Prelude,
    sink: &mut impl Sink,
) -> Result<()> {
    if pre.header.version >= VERSION_4 {
        let only = sink.only();
        read_blocks(path, r, pre, |b| {
            decode_block(path, b, only, |hash, id, p, e, act| {
                sink.entry(hash, id, p, e, act)
            })
        })
    } else {
        read_stream(path, r, pre, sink)
    }
}

/// Where a reader is once it has read a file's header and sections.
pub(crate) struct Prelude {
    pub header: Header,
    /// The CRC of every byte read so far.
    crc: u32,
    /// The file offset of the next byte.
    offset: u64,
    /// Body bytes not read yet.
    remaining: u64,
}

/// Refuses a file whose length is not what its header says: a header,
/// `body_len` bytes and the trailer.
fn check_len(path: &Path, header: &Header, file_len: u64) -> Result<()> {
    let expected_len = (HEADER_LEN as u64)
        .checked_add(header.body_len)
        .and_then(|l| l.checked_add(TRAILER_LEN as u64));
    match expected_len {
        Some(l) if l == file_len => Ok(()),
        Some(l) if l > file_len => Err(Error::corrupt(
            path,
            file_len,
            Corruption::Truncated {
                needed: l,
                available: file_len,
            },
        )),
        Some(l) => Err(Error::corrupt(
            path,
            l,
            Corruption::TrailingBytes(file_len - l),
        )),
        None => Err(Error::corrupt(
            path,
            32,
            Corruption::BadLength(header.body_len),
        )),
    }
}

/// Reads and checks the header (and the file's length against it), then
/// the store and Kafka sections, handing them to `sink`.
pub(crate) fn read_prelude(
    path: &Path,
    mut r: impl Read,
    file_len: u64,
    sink: &mut impl Sink,
) -> Result<Prelude> {
    let io = |e| Error::io("read", path, e);
    let mut head = [0u8; HEADER_LEN];
    let n = read_full(&mut r, &mut head).map_err(io)?;
    let header = parse_header(path, head.get(..n).unwrap_or_default())?;
    check_len(path, &header, file_len)?;
    sink.begin(&header);
    let mut crc = crc32c::crc32c(&head);
    let mut remaining = header.body_len; // body bytes not yet read from the file
    let mut offset = HEADER_LEN as u64;
    if header.version < VERSION_3 {
        sink.meta(Meta::legacy());
    } else {
        // The store section: its length, then that many bytes. Not
        // trusted before the file's CRC is checked (at the end): only its
        // length bounds what is read.
        let mut len = [0u8; 4];
        let got = read_full(&mut r, &mut len).map_err(io)?;
        let n = u64::from(u32::from_le_bytes(len));
        if got < 4 || remaining < 4 + n {
            return Err(Error::corrupt(
                path,
                offset,
                Corruption::BadLength(remaining.min(4 + n)),
            ));
        }
        let mut section = vec![0u8; n as usize];
        let got = read_full(&mut r, &mut section).map_err(io)?;
        if got < section.len() {
            return Err(Error::corrupt(path, offset, truncated(section.len(), got)));
        }
        crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, &len), &section);
        let meta = Meta::decode(&section, header.version)
            .map_err(|k| Error::corrupt(path, offset + 4, k))?;
        sink.meta(meta);
        remaining -= 4 + n;
        offset += 4 + n;
    }
    if header.kafka {
        // The Kafka section, read like the store section: its length
        // bounds what is read, and nothing is trusted before the CRC.
        let mut len = [0u8; 8];
        let got = read_full(&mut r, &mut len).map_err(io)?;
        let n = u64::from_le_bytes(len);
        if got < 8 || remaining.saturating_sub(8) < n {
            return Err(Error::corrupt(
                path,
                offset,
                Corruption::BadLength(n.min(remaining)),
            ));
        }
        let mut section = vec![0u8; n as usize];
        let got = read_full(&mut r, &mut section).map_err(io)?;
        if got < section.len() {
            return Err(Error::corrupt(path, offset, truncated(section.len(), got)));
        }
        crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, &len), &section);
        let mut k = crate::engine::kafka::state::KafkaState::default();
        crate::snapshot::kafka::decode(&section, &mut k)
            .map_err(|(at, kind)| Error::corrupt(path, offset + 8 + at as u64, kind))?;
        sink.kafka(k);
        remaining -= 8 + n;
        offset += 8 + n;
    }
    Ok(Prelude {
        header,
        crc,
        offset,
        remaining,
    })
}

/// The entries of a file of version 1 to 3, streamed, then the trailer.
fn read_stream(
    path: &Path,
    mut r: impl Read,
    pre: &mut Prelude,
    sink: &mut impl Sink,
) -> Result<()> {
    let io = |e| Error::io("read", path, e);
    let version = pre.header.version;
    let mut buf: Vec<u8> = Vec::new();
    let mut consumed = 0usize; // bytes of `buf` already decoded
    let mut found = 0u64;
    const CHUNK: usize = 1 << 20;
    loop {
        match decode_entry(version, buf.get(consumed..).unwrap_or_default()) {
            Some(Ok((id, partition, e, act, len))) => {
                consumed += len;
                pre.offset += len as u64;
                found += 1;
                let hash = crate::engine::map::hash_key(&id, partition);
                sink.entry(hash, id, partition, e, act)?;
                continue;
            }
            Some(Err(kind)) => return Err(Error::corrupt(path, pre.offset, kind)),
            None if pre.remaining == 0 => {
                if consumed < buf.len() {
                    return Err(Error::corrupt(
                        path,
                        pre.offset,
                        Corruption::BadLength((buf.len() - consumed) as u64),
                    ));
                }
                break;
            }
            None => {}
        }
        // Need more bytes: drop what was decoded and read the next chunk.
        buf.drain(..consumed);
        consumed = 0;
        let want = pre.remaining.min(CHUNK as u64) as usize;
        let old = buf.len();
        buf.resize(old + want, 0);
        let got = read_full(&mut r, buf.get_mut(old..).unwrap_or_default()).map_err(io)?;
        if got < want {
            return Err(Error::corrupt(path, pre.offset, truncated(want, got)));
        }
        pre.crc = crc32c::crc32c_append(pre.crc, buf.get(old..).unwrap_or_default());
        pre.remaining -= want as u64;
    }
    read_trailer(path, r, pre, found)
}

/// Checks the trailer against the CRC of everything read, and the entries
/// found against the header's count.
fn read_trailer(path: &Path, mut r: impl Read, pre: &Prelude, found: u64) -> Result<()> {
    let mut trailer = [0u8; TRAILER_LEN];
    let got = read_full(&mut r, &mut trailer).map_err(|e| Error::io("read", path, e))?;
    if got < TRAILER_LEN {
        return Err(Error::corrupt(
            path,
            pre.offset,
            truncated(TRAILER_LEN, got),
        ));
    }
    let stored = u32::from_le_bytes(trailer);
    if stored != pre.crc {
        return Err(Error::corrupt(
            path,
            pre.offset,
            Corruption::ChecksumMismatch {
                stored,
                computed: pre.crc,
            },
        ));
    }
    if found != pre.header.entries {
        return Err(Error::corrupt(
            path,
            24,
            Corruption::CountMismatch {
                stated: pre.header.entries,
                found,
            },
        ));
    }
    Ok(())
}

/// One version-4 block as read: checked against the body's bounds, not
/// yet decoded (nor vouched for by the file's CRC, which is checked after
/// the last block).
pub(crate) struct Block {
    /// The shard of every key in it, or [`UNSHARDED`] (Kafka mode).
    pub shard: u16,
    /// The entries it says it holds (at least 1).
    pub count: u32,
    /// The file offset of its first entry.
    pub at: u64,
    /// Its entries' bytes.
    pub bytes: Vec<u8>,
}

/// Reads the blocks of a version-4 body, handing each to `each` as it is
/// read (its bytes are read into the same buffer again after `each`
/// returns, unless `each` takes them), then checks the trailer and the
/// entry count. The reader checks each block's header (shard, count,
/// length within the body and [`MAX_BLOCK`]); `each` decodes it (see
/// [`decode_block`]).
pub(crate) fn read_blocks(
    path: &Path,
    mut r: impl Read,
    pre: &mut Prelude,
    mut each: impl FnMut(&mut Block) -> Result<()>,
) -> Result<()> {
    let io = |e| Error::io("read", path, e);
    let mut found = 0u64;
    let mut block = Block {
        shard: 0,
        count: 0,
        at: 0,
        bytes: Vec::new(),
    };
    while pre.remaining > 0 {
        let mut head = [0u8; BLOCK_HEADER];
        if pre.remaining < BLOCK_HEADER as u64 {
            return Err(Error::corrupt(
                path,
                pre.offset,
                Corruption::BadLength(pre.remaining),
            ));
        }
        let got = read_full(&mut r, &mut head).map_err(io)?;
        if got < BLOCK_HEADER {
            return Err(Error::corrupt(
                path,
                pre.offset,
                truncated(BLOCK_HEADER, got),
            ));
        }
        pre.crc = crc32c::crc32c_append(pre.crc, &head);
        let mut d = Dec::new(&head);
        let shard = d.u16().unwrap_or(0);
        let count = d.u32().unwrap_or(0);
        let len = d.u32().unwrap_or(0);
        let room = pre.remaining - BLOCK_HEADER as u64;
        let shard_ok = if pre.header.kafka {
            shard == UNSHARDED
        } else {
            usize::from(shard) < crate::engine::shards::SHARDS
        };
        if !shard_ok {
            return Err(Error::corrupt(
                path,
                pre.offset,
                Corruption::BadField("block shard"),
            ));
        }
        if count == 0 || len == 0 || len > MAX_BLOCK || u64::from(len) > room {
            return Err(Error::corrupt(
                path,
                pre.offset,
                Corruption::BadLength(u64::from(len)),
            ));
        }
        block.shard = shard;
        block.count = count;
        block.at = pre.offset + BLOCK_HEADER as u64;
        block.bytes.resize(len as usize, 0);
        let got = read_full(&mut r, &mut block.bytes).map_err(io)?;
        if got < block.bytes.len() {
            return Err(Error::corrupt(
                path,
                block.at,
                truncated(block.bytes.len(), got),
            ));
        }
        pre.crc = crc32c::crc32c_append(pre.crc, &block.bytes);
        pre.remaining = room - u64::from(len);
        pre.offset = block.at + u64::from(len);
        found += u64::from(count);
        each(&mut block)?;
    }
    read_trailer(path, r, pre, found)
}

/// The hash of a key read at byte `here` of block `b`, which must be the
/// block's shard's (any shard in a Kafka-mode file's unsharded blocks).
#[inline]
fn hash_in(path: &Path, here: u64, b: &Block, id: &ProducerId, partition: i32) -> Result<u64> {
    let hash = crate::engine::map::hash_key(id, partition);
    if b.shard != UNSHARDED && crate::engine::shards::shard_of(hash) != usize::from(b.shard) {
        return Err(Error::corrupt(
            path,
            here,
            Corruption::BadField("entry (key of another shard than its block's)"),
        ));
    }
    Ok(hash)
}

/// Decodes every entry of a block, checking that they fill it exactly,
/// number what it says, and belong to its shard; hands each to `each`
/// with its key's hash. With `only`, the other partitions' entries are
/// measured and passed over ([`Sink::only`]): they count, and must fill
/// the block, but are not decoded, checked against the shard or handed on.
#[inline]
pub(crate) fn decode_block(
    path: &Path,
    b: &Block,
    only: Option<i32>,
    mut each: impl FnMut(u64, ProducerId, i32, ProducerEntry, i64) -> Result<()>,
) -> Result<()> {
    let mut at = 0usize;
    let mut n = 0u32;
    while let Some(rest) = b.bytes.get(at..).filter(|r| !r.is_empty()) {
        let here = b.at + at as u64;
        n += 1;
        if let Some(p) = only {
            let (partition, len) = entry_at(path, here, rest, entry_codec::measure)?;
            if partition != p {
                at += len;
                continue;
            }
        }
        let (id, partition, e, act, len) = entry_at(path, here, rest, entry_codec::decode)?;
        let hash = hash_in(path, here, b, &id, partition)?;
        each(hash, id, partition, e, act)?;
        at += len;
    }
    check_count(path, b, n)
}

/// What `read` makes of the version-4 entry at the start of `rest` (byte
/// `here` of the file), or the error that says where it is wrong.
#[inline(always)]
fn entry_at<T>(
    path: &Path,
    here: u64,
    rest: &[u8],
    read: impl FnOnce(&[u8], entry_codec::Form) -> Option<std::result::Result<T, Corruption>>,
) -> Result<T> {
    match read(rest, entry_codec::Form::V4) {
        Some(Ok(t)) => Ok(t),
        Some(Err(kind)) => Err(Error::corrupt(path, here, kind)),
        None => Err(Error::corrupt(
            path,
            here,
            Corruption::BadLength(rest.len() as u64),
        )),
    }
}

/// A block's stated key count against the keys its bytes held.
fn check_count(path: &Path, b: &Block, n: u32) -> Result<()> {
    if n != b.count {
        return Err(Error::corrupt(
            path,
            b.at - BLOCK_HEADER as u64,
            Corruption::CountMismatch {
                stated: u64::from(b.count),
                found: u64::from(n),
            },
        ));
    }
    Ok(())
}

/// [`decode_block`] straight into the block's shard: each key's window
/// is decoded into the slot of the shard's arena it will own (see
/// [`crate::engine::map::StateMap::load_new`]); the same checks, the same errors,
/// and a key already in the shard is [`Corruption::DuplicateKey`].
pub(crate) fn load_block(
    path: &Path,
    b: &Block,
    shard: &mut crate::engine::shards::ShardMut<'_>,
) -> Result<()> {
    let mut at = 0usize;
    let mut n = 0u32;
    // The partition of the keys inserted since it changed, and how many:
    // counted in the shard's partitions once per run.
    let mut run = (0i32, 0u32);
    while let Some(rest) = b.bytes.get(at..).filter(|r| !r.is_empty()) {
        let here = b.at + at as u64;
        let (new, (len, partition)) = shard.load_new(|w| {
            let (id, partition, head, act, len) = entry_at(path, here, rest, |r, form| {
                entry_codec::decode_into(r, form, w)
            })?;
            let hash = hash_in(path, here, b, &id, partition)?;
            Ok::<_, Error>((hash, id, partition, head, act, (len, partition)))
        })?;
        if !new {
            return Err(Error::corrupt(path, 0, Corruption::DuplicateKey));
        }
        if partition != run.0 {
            shard.count_loaded(run.0, run.1);
            run = (partition, 0);
        }
        run.1 += 1;
        at += len;
        n += 1;
    }
    shard.count_loaded(run.0, run.1);
    check_count(path, b, n)
}
