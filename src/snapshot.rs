//! Snapshot files: the whole state at one log position, checksummed.
//!
//! A snapshot is written as `<position>.snap.tmp`, streamed entry by entry
//! (the writer never holds a second copy of the state), its header filled in
//! last, fsync'ed, renamed to `<position>.snap`, and the directory fsync'ed.
//! The reader streams too and verifies the CRC over every byte before the
//! caller may use what it decoded. The layout is in docs/format.md.
//!
//! Version 4 frames the entries in blocks, each of one shard's keys with
//! its entry count and byte length: a reader can hand a whole block to
//! another thread (which owns that shard's table) without decoding it
//! first, so loading a big file uses two cores (`loader.rs`), and a block
//! is decoded where its keys are inserted.

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::codec::{Dec, Put, truncated};
use crate::directory::names;
use crate::engine::entry::{Head, ProducerEntry, RETAINED_BATCHES, Window};
use crate::entry_codec;
use crate::error::{Corruption, Error, Result};
use crate::fs::background_sync::BackgroundSync;
use crate::fs::read_full;
use crate::fs::{FileSystem, WriteFile};
use crate::id::ProducerId;
use crate::meta::Meta;

pub(crate) const MAGIC: &[u8; 8] = b"PSTATSNP";
/// The version this build writes: version 3's sections, then the entries
/// in blocks of one shard each, each entry's activity dropped when it is
/// its newest batch's timestamp. It reads this one, [`VERSION_3`],
/// [`VERSION_2`] and [`VERSION_1`].
pub(crate) const VERSION: u16 = 4;
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
const ID_NUMERIC: u8 = 0;
const ID_NAMED: u8 = 1;
const HAS_META: u8 = 1;
/// Header flag (bit 0): the state is a [`Semantics::Kafka`] state, and a
/// Kafka section (`kafka_snapshot.rs`) follows the store section. A file
/// with the bit clear is byte for byte what it was before Kafka mode.
///
/// [`Semantics::Kafka`]: crate::Semantics::Kafka
pub(crate) const FLAG_KAFKA: u16 = 1;

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
}

fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN);
    b.extend_from_slice(MAGIC);
    b.put_u16(h.version);
    b.put_u16(if h.kafka { FLAG_KAFKA } else { 0 });
    b.put_u32(0);
    b.put_u64(h.position);
    b.put_u64(h.entries);
    b.put_u64(h.body_len);
    let c = crc32c::crc32c(&b);
    b.put_u32(c);
    b.put_u32(0);
    b
}

/// Parses and checks a header (magic, version, its own CRC).
pub(crate) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Err(Error::corrupt(path, 0, truncated(HEADER_LEN, bytes.len())));
    };
    let mut d = Dec::new(h);
    if d.bytes(8) != Some(&MAGIC[..]) {
        return Err(Error::corrupt(path, 0, Corruption::BadMagic));
    }
    let version = d.u16().unwrap_or(0);
    let flags = d.u16().unwrap_or(0);
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
    if flags & !known_flags != 0 || reserved != 0 || reserved2 != 0 {
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
    })
}

/// Appends one entry's version-1 encoding to `buf` (kept to test the
/// reader of files older builds wrote).
#[cfg(test)]
pub(crate) fn encode_entry_v1(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    e: &ProducerEntry,
) {
    match id.as_numeric() {
        Some(n) => {
            buf.put_u8(ID_NUMERIC);
            buf.put_u64(n);
        }
        None => {
            let name = id.name_bytes().unwrap_or_default();
            buf.put_u8(ID_NAMED);
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
        }
    }
    buf.put_i32(partition);
    buf.put_i16(e.epoch());
    buf.put_i32(e.last_sequence());
    let batches = e.retained_batches();
    buf.put_u8(batches.len() as u8);
    for b in batches {
        buf.put_i32(b.first_sequence);
        buf.put_i32(b.last_sequence);
        match b.metadata {
            Some(m) => {
                buf.put_u8(HAS_META);
                buf.put_i64(m.offset);
                buf.put_i64(m.timestamp);
            }
            None => buf.put_u8(0),
        }
    }
}

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
            let act = legacy_activity(&e);
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

/// Bytes of a block's header (version 4): shard, entry count, length.
pub(crate) const BLOCK_HEADER: usize = 10;
/// The shard field of a Kafka-mode file's blocks: its keys are not
/// grouped by shard (the Kafka engine has no shards).
pub(crate) const UNSHARDED: u16 = u16::MAX;
/// The writer closes a block once it holds this many bytes, so that a
/// block is a unit of work worth handing to another thread and a reader
/// never holds much more than this of one block.
const BLOCK_TARGET: usize = 1 << 20;
/// The longest block a reader accepts (it allocates the block before the
/// file's CRC can vouch for its length).
pub(crate) const MAX_BLOCK: u32 = 1 << 24;

/// Entries framed in version-4 blocks, built in memory before they are
/// written. A block is closed when the shard changes or it passes
/// [`BLOCK_TARGET`]; a shard's keys may span several blocks.
#[derive(Default)]
pub(crate) struct Blocks {
    buf: Vec<u8>,
    /// The open block: where its header is, its shard, its entries.
    open: Option<(usize, u16, u32)>,
    entries: u64,
}

impl Blocks {
    /// Appends one entry of the key in `shard` (a [`shards::shard_of`]
    /// index, or [`UNSHARDED`] in a Kafka-mode state).
    ///
    /// [`shards::shard_of`]: crate::engine::shards::shard_of
    #[inline]
    pub(crate) fn push(
        &mut self,
        shard: u16,
        id: &ProducerId,
        partition: i32,
        e: &ProducerEntry,
        activity: i64,
    ) {
        self.push_parts(shard, id, partition, &e.head, &e.window, activity);
    }

    /// [`Blocks::push`] of a key's head and window where they lie (in a
    /// map's arena).
    #[inline]
    pub(crate) fn push_parts(
        &mut self,
        shard: u16,
        id: &ProducerId,
        partition: i32,
        head: &Head,
        window: &Window,
        activity: i64,
    ) {
        let same = matches!(self.open, Some((start, s, _))
            if s == shard && self.buf.len() - start < BLOCK_TARGET);
        if !same {
            self.close();
            self.open = Some((self.buf.len(), shard, 0));
            self.buf.extend_from_slice(&[0u8; BLOCK_HEADER]);
        }
        entry_codec::encode_v4_parts(&mut self.buf, id, partition, head, window, activity);
        if let Some(open) = &mut self.open {
            open.2 += 1;
        }
        self.entries += 1;
    }

    /// Fills in the open block's header.
    fn close(&mut self) {
        if let Some((start, shard, count)) = self.open.take() {
            let len = (self.buf.len() - start - BLOCK_HEADER) as u32;
            let mut h = Vec::with_capacity(BLOCK_HEADER);
            h.put_u16(shard);
            h.put_u32(count);
            h.put_u32(len);
            if let Some(at) = self.buf.get_mut(start..start + BLOCK_HEADER) {
                at.copy_from_slice(&h);
            }
        }
    }

    /// The bytes held.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Closes the open block and writes every block held to `w`.
    pub(crate) fn flush(&mut self, w: &mut Writer) -> Result<()> {
        self.close();
        w.write(&self.buf, self.entries)?;
        self.buf.clear();
        self.entries = 0;
        Ok(())
    }

    /// Closes the open block: the bytes and their entry count.
    fn into_bytes(mut self) -> (Vec<u8>, u64) {
        self.close();
        (self.buf, self.entries)
    }
}

/// The activity of a key read from a file that kept none: its newest
/// retained batch's timestamp, else 0.
pub(crate) fn legacy_activity(e: &ProducerEntry) -> i64 {
    e.retained_batches()
        .filter_map(|b| b.metadata)
        .last()
        .map_or(0, |m| m.timestamp)
}

/// Streams a new snapshot to a temporary file.
pub(crate) struct Writer {
    file: Box<dyn WriteFile>,
    tmp: PathBuf,
    dest: PathBuf,
    position: u64,
    entries: u64,
    body_len: u64,
    body_crc: u32,
    unsynced: u64,
    kafka: bool,
    /// Issues the every-1-MiB fsyncs, if started (a big snapshot).
    syncer: Option<BackgroundSync>,
}

/// A snapshot is fsync'ed every this many bytes as it is written, so the
/// disk never has one huge flush to do at the end, during which the log's
/// fsyncs (and so durable appends) would wait (measured: the longest append
/// pause during a 1M-key snapshot went from 10 ms to about 2 ms). A big
/// snapshot issues them on a thread of its own
/// ([`Writer::sync_in_background`]).
const SYNC_EVERY: u64 = 1 << 20;

impl Writer {
    /// Creates `<position>.snap.tmp` in `dir` with a placeholder header.
    pub(crate) fn create(fs: &dyn FileSystem, dir: &Path, position: u64) -> Result<Writer> {
        let dest = dir.join(names::snapshot_name(position));
        let tmp = dir.join(names::snapshot_tmp_name(position));
        if fs
            .kind(&tmp)
            .map_err(|e| Error::io("stat", &tmp, e))?
            .is_some()
        {
            fs.remove_file(&tmp)
                .map_err(|e| Error::io("remove", &tmp, e))?;
        }
        let mut file = fs
            .create_new(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        file.write_all(&[0u8; HEADER_LEN])
            .map_err(|e| Error::io("write", &tmp, e))?;
        Ok(Writer {
            file,
            tmp,
            dest,
            position,
            entries: 0,
            body_len: 0,
            body_crc: 0,
            unsynced: 0,
            kafka: false,
            syncer: None,
        })
    }

    /// Issues the every-1-MiB fsyncs on a thread of their own from now on
    /// (`background_sync.rs`): for a big snapshot, whose encoding then
    /// goes on while the disk flushes. Without a thread (it could not be
    /// started, or this is never called) they are issued inline.
    pub(crate) fn sync_in_background(&mut self) {
        if let Ok(handle) = self.file.try_clone()
            && let Ok(s) = BackgroundSync::start(handle)
        {
            self.syncer = Some(s);
        }
    }

    /// Writes the store section; before any entry.
    pub(crate) fn write_meta(&mut self, meta: &Meta) -> Result<()> {
        let mut b = Vec::new();
        meta.encode(&mut b);
        self.write(&b, 0)
    }

    /// Writes the Kafka section (a Kafka-mode state); after the store
    /// section, before any entry. Sets the header's [`FLAG_KAFKA`].
    pub(crate) fn write_kafka(
        &mut self,
        k: &crate::engine::kafka::state::KafkaState,
    ) -> Result<()> {
        let mut b = Vec::new();
        crate::kafka_snapshot::encode(&mut b, k);
        self.kafka = true;
        self.write(&b, 0)
    }

    /// Appends encoded bytes of the body holding `entries` entries (see
    /// [`Blocks::flush`]).
    pub(crate) fn write(&mut self, bytes: &[u8], entries: u64) -> Result<()> {
        self.file
            .write_all(bytes)
            .map_err(|e| Error::io("write", &self.tmp, e))?;
        self.body_crc = crc32c::crc32c_append(self.body_crc, bytes);
        self.body_len += bytes.len() as u64;
        self.entries += entries;
        self.unsynced += bytes.len() as u64;
        if self.unsynced >= SYNC_EVERY {
            match &self.syncer {
                Some(s) => s.request((HEADER_LEN as u64) + self.body_len),
                None => self.file.sync_data(),
            }
            .map_err(|e| Error::io("fsync", &self.tmp, e))?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// The keys written so far, and the bytes the file has once finished.
    pub(crate) fn size(&self) -> (u64, u64) {
        let framing = (HEADER_LEN + TRAILER_LEN) as u64;
        (self.entries, framing + self.body_len)
    }

    /// Writes the trailer and the real header, fsyncs, renames into place
    /// and fsyncs the directory. Returns the final path.
    pub(crate) fn finish(mut self, fs: &dyn FileSystem, dir: &Path) -> Result<PathBuf> {
        let header = encode_header(&Header {
            version: VERSION,
            position: self.position,
            entries: self.entries,
            body_len: self.body_len,
            kafka: self.kafka,
        });
        let crc = crc32c::crc32c_combine(
            crc32c::crc32c(&header),
            self.body_crc,
            self.body_len as usize,
        );
        let tmp = self.tmp.clone();
        let io = |op, e| Error::io(op, &tmp, e);
        if let Some(s) = self.syncer.take() {
            s.finish().map_err(|e| io("fsync", e))?;
        }
        self.file
            .write_all(&crc.to_le_bytes())
            .map_err(|e| io("write", e))?;
        self.file
            .write_all_at(0, &header)
            .map_err(|e| io("write", e))?;
        self.file.sync_data().map_err(|e| io("fsync", e))?;
        drop(self.file);
        fs.rename(&self.tmp, &self.dest)
            .map_err(|e| Error::io("rename", &self.dest, e))?;
        fs.sync_dir(dir)
            .map_err(|e| Error::io("fsync directory", dir, e))?;
        Ok(self.dest)
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
    Meta::decode(&section).map_err(|k| Error::corrupt(path, HEADER_LEN as u64 + 4, k))
}

/// A whole snapshot (header, entries, trailer) in memory, byte for byte
/// what [`Writer`] puts in a file at `position`: for a caller that keeps
/// or ships the state by other means (a replicated state machine's
/// snapshot transfer).
pub(crate) fn encode_to_vec(
    position: u64,
    meta: &Meta,
    kafka: Option<&crate::engine::kafka::state::KafkaState>,
    entries: impl Iterator<Item = (ProducerId, i32, ProducerEntry, i64)>,
) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    meta.encode(&mut out);
    let mut blocks = Blocks::default();
    if let Some(k) = kafka {
        crate::kafka_snapshot::encode(&mut out, k);
        for (id, partition, e, activity) in entries {
            blocks.push(UNSHARDED, &id, partition, &e, activity);
        }
    } else {
        // Blocks of one shard each: every key encoded into its shard's
        // blocks (the encoded bytes, not the entries, are what is held
        // apart), then the shards in order.
        let mut shards: Vec<Blocks> = (0..crate::engine::shards::SHARDS)
            .map(|_| Blocks::default())
            .collect();
        for (id, p, e, a) in entries {
            let shard = crate::engine::shards::shard_of(crate::engine::map::hash_key(&id, p));
            if let Some(b) = shards.get_mut(shard) {
                b.push(shard as u16, &id, p, &e, a);
            }
        }
        for b in shards {
            let (bytes, count) = b.into_bytes();
            blocks.buf.extend_from_slice(&bytes);
            blocks.entries += count;
        }
    }
    let (bytes, count) = blocks.into_bytes();
    out.extend_from_slice(&bytes);
    let body_len = (out.len() - HEADER_LEN) as u64;
    let header = encode_header(&Header {
        version: VERSION,
        position,
        entries: count,
        body_len,
        kafka: kafka.is_some(),
    });
    if let Some(head) = out.get_mut(..HEADER_LEN) {
        head.copy_from_slice(&header);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
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
    if pre.header.version >= VERSION {
        read_blocks(path, r, pre, |b| {
            decode_block(path, b, |hash, id, p, e, act| {
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
    let expected_len = (HEADER_LEN as u64)
        .checked_add(header.body_len)
        .and_then(|l| l.checked_add(TRAILER_LEN as u64));
    match expected_len {
        Some(l) if l == file_len => {}
        Some(l) if l > file_len => {
            return Err(Error::corrupt(
                path,
                file_len,
                Corruption::Truncated {
                    needed: l,
                    available: file_len,
                },
            ));
        }
        Some(l) => {
            return Err(Error::corrupt(
                path,
                l,
                Corruption::TrailingBytes(file_len - l),
            ));
        }
        None => {
            return Err(Error::corrupt(
                path,
                32,
                Corruption::BadLength(header.body_len),
            ));
        }
    }
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
        let meta = Meta::decode(&section).map_err(|k| Error::corrupt(path, offset + 4, k))?;
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
        crate::kafka_snapshot::decode(&section, &mut k)
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

/// Decodes every entry of a block, checking that they fill it exactly,
/// number what it says, and belong to its shard; hands each to `each`
/// with its key's hash.
#[inline]
pub(crate) fn decode_block(
    path: &Path,
    b: &Block,
    mut each: impl FnMut(u64, ProducerId, i32, ProducerEntry, i64) -> Result<()>,
) -> Result<()> {
    let mut at = 0usize;
    let mut n = 0u32;
    while let Some(rest) = b.bytes.get(at..).filter(|r| !r.is_empty()) {
        let here = b.at + at as u64;
        match entry_codec::decode(rest, entry_codec::Form::V4) {
            Some(Ok((id, partition, e, act, len))) => {
                let hash = crate::engine::map::hash_key(&id, partition);
                if b.shard != UNSHARDED
                    && crate::engine::shards::shard_of(hash) != usize::from(b.shard)
                {
                    return Err(Error::corrupt(
                        path,
                        here,
                        Corruption::BadField("entry (key of another shard than its block's)"),
                    ));
                }
                each(hash, id, partition, e, act)?;
                at += len;
                n += 1;
            }
            Some(Err(kind)) => return Err(Error::corrupt(path, here, kind)),
            None => {
                return Err(Error::corrupt(
                    path,
                    here,
                    Corruption::BadLength(rest.len() as u64),
                ));
            }
        }
    }
    check_count(path, b, n)
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
        let (new, (len, partition)) =
            shard.load_new(
                |w| match entry_codec::decode_into(rest, entry_codec::Form::V4, w) {
                    Some(Ok((id, partition, head, act, len))) => {
                        let hash = crate::engine::map::hash_key(&id, partition);
                        if b.shard != UNSHARDED
                            && crate::engine::shards::shard_of(hash) != usize::from(b.shard)
                        {
                            return Err(Error::corrupt(
                                path,
                                here,
                                Corruption::BadField(
                                    "entry (key of another shard than its block's)",
                                ),
                            ));
                        }
                        Ok((hash, id, partition, head, act, (len, partition)))
                    }
                    Some(Err(kind)) => Err(Error::corrupt(path, here, kind)),
                    None => Err(Error::corrupt(
                        path,
                        here,
                        Corruption::BadLength(rest.len() as u64),
                    )),
                },
            )?;
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

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::Batch;
    use crate::engine::ProducerStateManager;
    use crate::fs::SimFs;
    use std::io::Cursor;

    fn sample_state() -> ProducerStateManager {
        let mut m = ProducerStateManager::new();
        for pid in 0..50u64 {
            m.append(pid, 1, 0, 0);
            m.append(pid, 1, 0, 1);
        }
        for i in 0..7 {
            m.append_batch(
                "batcher",
                2,
                3,
                Batch::new(i * 4, i * 4 + 3, i64::from(i) * 10, -1),
            );
        }
        m.append("x".repeat(1000), -5, i16::MAX, 0);
        m
    }

    /// A key's activity in these tests.
    fn act(e: &ProducerEntry, p: i32) -> i64 {
        i64::from(e.last_sequence()) * 1_000 + i64::from(p)
    }

    fn sample_meta() -> Meta {
        let mut meta = Meta {
            clock: 1_700_000_000_123,
            high: 77,
            ..Meta::default()
        };
        for k in 0..20u64 {
            meta.filter
                .insert(crate::engine::map::hash_key(&ProducerId::numeric(k), 0));
        }
        meta
    }

    fn write(fs: &SimFs, dir: &Path, m: &ProducerStateManager, position: u64) -> PathBuf {
        let mut w = Writer::create(fs, dir, position).unwrap();
        w.write_meta(&sample_meta()).unwrap();
        // By shard, as the store writes them; a flush after each shard
        // (so a shard's keys may span blocks, which readers accept).
        let mut keys: Vec<_> = m.iter().collect();
        keys.sort_by_key(|(id, p, _)| {
            crate::engine::shards::shard_of(crate::engine::map::hash_key(id, *p))
        });
        let mut blocks = Blocks::default();
        for (id, p, e) in keys {
            let shard =
                crate::engine::shards::shard_of(crate::engine::map::hash_key(&id, p)) as u16;
            blocks.push(shard, &id, p, &e, act(&e, p));
            if p == 1 {
                blocks.flush(&mut w).unwrap();
            }
        }
        blocks.flush(&mut w).unwrap();
        w.finish(fs, dir).unwrap()
    }

    type Entries = Vec<(ProducerId, i32, ProducerEntry, i64)>;

    fn load(bytes: &[u8]) -> Result<(Header, Meta, Entries)> {
        let mut out = Vec::new();
        let (h, meta) = read(
            Path::new("s"),
            Cursor::new(bytes),
            bytes.len() as u64,
            |id, p, e, a| {
                out.push((id, p, e, a));
                Ok(())
            },
        )?;
        Ok((h, meta, out))
    }

    #[test]
    fn the_in_memory_encoding_is_the_file_byte_for_byte() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let m = sample_state();
        let path = write(&fs, &dir, &m, 77);
        let file = fs.read_file(&path).unwrap();
        let with_act = m.iter().map(|(id, p, e)| {
            let a = act(&e, p);
            (id, p, e, a)
        });
        assert_eq!(encode_to_vec(77, &sample_meta(), None, with_act), file);
        let empty = encode_to_vec(3, &Meta::default(), None, std::iter::empty());
        let (h, meta, entries) = load(&empty).unwrap();
        assert_eq!((h.position, h.entries, entries.len()), (3, 0, 0));
        assert_eq!(meta, Meta::default());
    }

    #[test]
    fn a_snapshot_round_trips_every_entry() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let m = sample_state();
        let path = write(&fs, &dir, &m, 77);
        assert_eq!(path, dir.join("00000000000000000077.snap"));
        assert!(
            fs.read_file(&dir.join("00000000000000000077.snap.tmp"))
                .is_none()
        );
        let bytes = fs.read_file(&path).unwrap();
        let (h, meta, entries) = load(&bytes).unwrap();
        assert_eq!((h.position, h.version), (77, VERSION));
        assert_eq!(meta, sample_meta());
        assert_eq!(h.entries as usize, m.len());
        for (id, p, e, a) in entries {
            assert_eq!(a, act(&e, p));
            assert_eq!(m.get(id, p), Some(e));
        }
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error_never_a_panic() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let mut m = ProducerStateManager::new();
        m.append(1u64, 0, 0, 0);
        m.append_batch("n", 0, 0, Batch::new(0, 3, 5, 6));
        // A full window with deltas of several widths and a gap in its
        // metadata, so flips land in every field of version 2.
        for (i, (o, t)) in [(9, 1), (300, -1), (70_000, 1 << 33), (1, 0), (2, 2)]
            .into_iter()
            .enumerate()
        {
            let i = i as i32;
            if i == 3 {
                m.append(2u64, 1, 0, 3 * i);
            } else {
                m.append_batch(
                    2u64,
                    1,
                    0,
                    Batch::new(3 * i, 3 * i + 2 - (i == 4) as i32 * 2, o, t),
                );
            }
            if i == 3 {
                m.append_batch(2u64, 1, 0, Batch::new(3 * i + 1, 3 * i + 2, o, t));
            }
        }
        let bytes = fs.read_file(&write(&fs, &dir, &m, 3)).unwrap();
        assert_eq!(&bytes[8..10], &VERSION.to_le_bytes());
        assert_eq!(m.get(2u64, 1).unwrap().retained_batches().len(), 5);
        assert_eq!(load(&bytes).unwrap().2.len(), 3);
        for cut in 0..bytes.len() {
            let err = load(&bytes[..cut]).unwrap_err();
            assert!(err.is_corruption(), "cut {cut}: {err}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            let err = load(&b).unwrap_err();
            assert!(err.is_corruption(), "bit {bit}: {err}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(load(&longer).unwrap_err().is_corruption());
    }

    /// A file of `m`'s entries in an older version (1, 2 or 3), as the
    /// builds before version 4 wrote it (before version 3: no store
    /// section, no activity).
    fn old_file(m: &ProducerStateManager, position: u64, version: u16) -> Vec<u8> {
        let mut body = Vec::new();
        if version == VERSION_3 {
            sample_meta().encode(&mut body);
        }
        for (id, p, e) in m.iter() {
            match version {
                VERSION_1 => encode_entry_v1(&mut body, &id, p, &e),
                VERSION_2 => entry_codec::encode_entry(&mut body, &id, p, &e, None),
                _ => entry_codec::encode_entry(&mut body, &id, p, &e, Some(act(&e, p))),
            }
        }
        let mut b = encode_header(&Header {
            version,
            position,
            entries: m.len() as u64,
            body_len: body.len() as u64,
            kafka: false,
        });
        b.extend_from_slice(&body);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn version_1_2_and_3_files_still_read_to_the_same_state() {
        let m = sample_state();
        let bytes = old_file(&m, 12, VERSION_3);
        let (h, meta, entries) = load(&bytes).unwrap();
        assert_eq!((h.version, h.position), (VERSION_3, 12));
        assert_eq!(meta, sample_meta());
        assert_eq!(entries.len(), m.len());
        for (id, p, e, a) in entries {
            assert_eq!(a, act(&e, p));
            assert_eq!(m.get(id, p), Some(e));
        }
        for version in [VERSION_1, VERSION_2] {
            let bytes = old_file(&m, 12, version);
            let (h, meta, entries) = load(&bytes).unwrap();
            assert_eq!((h.version, h.position), (version, 12));
            assert_eq!(
                meta,
                Meta::legacy(),
                "no store section: an unknown highest offset"
            );
            assert_eq!(entries.len(), m.len());
            for (id, p, e, a) in entries {
                // No activity on file: the newest batch's timestamp, or 0.
                let want = if id == ProducerId::from("batcher") {
                    -1
                } else {
                    0
                };
                assert_eq!(a, want, "{id}");
                assert_eq!(m.get(id, p), Some(e));
            }
        }
    }

    #[test]
    fn a_damaged_store_section_is_corruption() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let bytes = fs.read_file(&write(&fs, &dir, &sample_state(), 5)).unwrap();
        // The section's length claims more than the body holds.
        let mut b = bytes.clone();
        b[HEADER_LEN + 3] = 0x7f;
        assert!(load(&b).unwrap_err().is_corruption());
    }

    #[test]
    fn steady_full_windows_take_few_bytes() {
        // Five one-record batches, a million offsets and milliseconds
        // apart: 21 fixed bytes, 16 for the newest batch, 4 x 6 of deltas.
        let mut e = ProducerEntry::start(0, 0, 0, None);
        for b in 0..5 {
            let o = b * 1_000_000 + 77;
            let meta = Some(BatchMetadata {
                offset: o,
                timestamp: 1_700_000_000_000 + o,
            });
            e.accept(b == 0, 0, b as i32, b as i32, meta);
        }
        let mut buf = Vec::new();
        entry_codec::encode_entry(&mut buf, &ProducerId::numeric(5), 0, &e, None);
        assert_eq!(buf.len(), 21 + 16 + 4 * 6);
        // Version 3 adds the activity: 8 bytes.
        buf.clear();
        entry_codec::encode_entry(&mut buf, &ProducerId::numeric(5), 0, &e, Some(1));
        assert_eq!(buf.len(), 29 + 16 + 4 * 6);
        // Version 4 drops it again when it is the newest batch's timestamp
        // (the store's activity of a key whose last append was a batch).
        let ts = 1_700_000_000_000 + 4_000_077;
        buf.clear();
        entry_codec::encode_entry_v4(&mut buf, &ProducerId::numeric(5), 0, &e, ts);
        assert_eq!(buf.len(), 21 + 16 + 4 * 6);
        buf.clear();
        entry_codec::encode_entry_v4(&mut buf, &ProducerId::numeric(5), 0, &e, ts + 1);
        assert_eq!(buf.len(), 29 + 16 + 4 * 6);
    }
}
