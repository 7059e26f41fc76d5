//! Snapshot files: the whole state at one log position, checksummed.
//!
//! A snapshot is written as `<position>.snap.tmp`, streamed entry by entry
//! (the writer never holds a second copy of the state), its header filled in
//! last, fsync'ed, renamed to `<position>.snap`, and the directory fsync'ed.
//! The reader streams too and verifies the CRC over every byte before the
//! caller may use what it decoded. The layout is in docs/format.md.

#![deny(clippy::indexing_slicing)]

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::codec::{Dec, Put, truncated};
use crate::entry::{ProducerEntry, RETAINED_BATCHES};
use crate::error::{Corruption, Error, Result};
use crate::fs::{FileSystem, WriteFile};
use crate::id::ProducerId;
use crate::wal::segment::{parse_numbered, read_full};

pub(crate) const MAGIC: &[u8; 8] = b"PSTATSNP";
/// The version this build writes. It reads this one and [`VERSION_1`].
pub(crate) const VERSION: u16 = 2;
/// Entries with every retained batch in full (fixed 25 bytes per batch).
pub(crate) const VERSION_1: u16 = 1;
/// Where the header stores the position the snapshot covers.
pub(crate) const POSITION_AT: u64 = 16;
pub(crate) const HEADER_LEN: usize = 48;
pub(crate) const TRAILER_LEN: usize = 4;
pub(crate) const EXTENSION: &str = "snap";
pub(crate) const TMP_SUFFIX: &str = ".tmp";
const ID_NUMERIC: u8 = 0;
const ID_NAMED: u8 = 1;
const HAS_META: u8 = 1;

/// The file name of the snapshot at `position`.
pub(crate) fn file_name(position: u64) -> String {
    format!("{position:020}.{EXTENSION}")
}

/// The position in a snapshot's file name (`<20 digits>.snap`).
pub(crate) fn parse_name(name: &str) -> Option<u64> {
    parse_numbered(name, EXTENSION)
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
}

fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN);
    b.extend_from_slice(MAGIC);
    b.put_u16(h.version);
    b.put_u16(0);
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
    if version != VERSION && version != VERSION_1 {
        return Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if flags != 0 || reserved != 0 || reserved2 != 0 {
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

// Version 2 (docs/format.md, "Entries, version 2").
const SHAPE_NAMED: u8 = 1 << 3;
/// Bytes of a span for each span width class.
const SPAN_BYTES: [usize; 4] = [0, 1, 2, 4];
/// Bytes of an offset or timestamp delta for each delta width class.
const DELTA_BYTES: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 8];

/// The smallest class of `table` whose width holds `v`.
#[inline]
fn class_of(v: u64, table: &[usize]) -> usize {
    let need = (64 - v.leading_zeros() as usize).div_ceil(8);
    table.iter().position(|&b| b >= need).unwrap_or(0)
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// Appends the low `w` bytes of `v`, little-endian.
#[inline]
fn put_uint(buf: &mut Vec<u8>, v: u64, w: usize) {
    buf.extend_from_slice(v.to_le_bytes().get(..w).unwrap_or_default());
}

/// The `w`-byte little-endian integer at `at`. The caller checked that
/// `buf` holds it; with 8 bytes to spare this is one load and a mask.
#[inline(always)]
fn uint_at(buf: &[u8], at: usize, w: usize) -> u64 {
    let mut a = [0u8; 8];
    match buf.get(at..at + 8) {
        Some(b) => a.copy_from_slice(b),
        None => {
            if let (Some(dst), Some(src)) = (a.get_mut(..w), buf.get(at..at + w)) {
                dst.copy_from_slice(src);
            }
        }
    }
    u64::from_le_bytes(a) & ((1u128 << (8 * w)) - 1) as u64
}

/// Appends one entry's encoding (the current version) to `buf`.
pub(crate) fn encode_entry(buf: &mut Vec<u8>, id: &ProducerId, partition: i32, e: &ProducerEntry) {
    // The retained batches, newest first.
    let mut batches = [RetainedBatch {
        first_sequence: 0,
        last_sequence: 0,
        metadata: None,
    }; RETAINED_BATCHES];
    let mut n = 0;
    for (slot, b) in batches.iter_mut().zip(e.retained_batches()) {
        *slot = b;
        n += 1;
    }
    let batches = batches.get_mut(..n).unwrap_or_default();
    batches.reverse();
    let mut max_span = 0u32;
    let mut mask = 0u16;
    let mut metas = [(0i64, 0i64); RETAINED_BATCHES];
    let mut m = 0;
    for (k, b) in batches.iter().enumerate() {
        max_span = max_span.max(b.last_sequence.wrapping_sub(b.first_sequence) as u32);
        if let (Some(meta), Some(slot)) = (b.metadata, metas.get_mut(m)) {
            mask |= 1 << k;
            *slot = (meta.offset, meta.timestamp);
            m += 1;
        }
    }
    let metas = metas.get(..m).unwrap_or_default();
    let deltas = |(a, b): (&(i64, i64), &(i64, i64))| {
        (zigzag(a.0.wrapping_sub(b.0)), zigzag(a.1.wrapping_sub(b.1)))
    };
    let (mut max_do, mut max_dt) = (0u64, 0u64);
    for (d_o, d_t) in metas.iter().zip(metas.iter().skip(1)).map(deltas) {
        max_do |= d_o;
        max_dt |= d_t;
    }
    let s = class_of(u64::from(max_span), &SPAN_BYTES);
    let (o, t) = (
        class_of(max_do, &DELTA_BYTES),
        class_of(max_dt, &DELTA_BYTES),
    );
    let named = id.as_numeric().is_none();
    buf.put_u8(n as u8 | if named { SHAPE_NAMED } else { 0 } | (s as u8) << 4);
    match id.as_numeric() {
        Some(v) => buf.put_u64(v),
        None => {
            let name = id.name_bytes().unwrap_or_default();
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
        }
    }
    buf.put_i32(partition);
    buf.put_i16(e.epoch());
    buf.put_i32(e.last_sequence());
    if n == 0 {
        return;
    }
    buf.put_u16(mask | (o as u16) << 5 | (t as u16) << 8);
    let (sw, ow, tw) = (
        SPAN_BYTES.get(s).copied().unwrap_or(4),
        DELTA_BYTES.get(o).copied().unwrap_or(8),
        DELTA_BYTES.get(t).copied().unwrap_or(8),
    );
    for b in batches.iter() {
        put_uint(
            buf,
            u64::from(b.last_sequence.wrapping_sub(b.first_sequence) as u32),
            sw,
        );
    }
    if let Some(&(offset, timestamp)) = metas.first() {
        buf.put_i64(offset);
        buf.put_i64(timestamp);
    }
    for (d_o, d_t) in metas.iter().zip(metas.iter().skip(1)).map(deltas) {
        put_uint(buf, d_o, ow);
        put_uint(buf, d_t, tw);
    }
}

/// A decoded entry and the bytes it took.
type Decoded = (ProducerId, i32, ProducerEntry, usize);

/// Decodes one version-2 entry at the start of `buf`; `None` if the bytes
/// end first (the caller reads more), `Err` if they are not a valid entry.
/// Once the shape says how long the entry is, one length check covers
/// every field, and each field is then a load and a mask.
#[inline]
fn decode_entry_v2(buf: &[u8]) -> Option<std::result::Result<Decoded, Corruption>> {
    let shape = *buf.first()?;
    let n = usize::from(shape & 7);
    if shape & 0xc0 != 0 || n > RETAINED_BATCHES {
        return Some(Err(Corruption::BadField("entry shape")));
    }
    let (id, mut at) = if shape & SHAPE_NAMED == 0 {
        (ProducerId::numeric(uint_at(buf, 1, 8)), 9)
    } else {
        let len = usize::from(u16::from_le_bytes([*buf.get(1)?, *buf.get(2)?]));
        match std::str::from_utf8(buf.get(3..3 + len)?) {
            Ok(name) => (ProducerId::named(name), 3 + len),
            Err(_) => return Some(Err(Corruption::BadField("producer name (not UTF-8)"))),
        }
    };
    if buf.len() < at + 10 {
        return None;
    }
    let partition = uint_at(buf, at, 4) as u32 as i32;
    let epoch = uint_at(buf, at + 4, 2) as u16 as i16;
    let last = uint_at(buf, at + 6, 4) as u32 as i32;
    at += 10;
    let mut spans = [0u32; RETAINED_BATCHES];
    let mut meta = [(0i64, 0i64); RETAINED_BATCHES];
    let mut mask = 0u8;
    if n > 0 {
        if buf.len() < at + 2 {
            return None;
        }
        let layout = uint_at(buf, at, 2) as u16;
        at += 2;
        mask = (layout & 0x1f) as u8;
        let m = mask.count_ones() as usize;
        let sw = SPAN_BYTES
            .get(usize::from(shape >> 4 & 3))
            .copied()
            .unwrap_or(4);
        let ow = DELTA_BYTES
            .get(usize::from(layout >> 5 & 7))
            .copied()
            .unwrap_or(8);
        let tw = DELTA_BYTES
            .get(usize::from(layout >> 8 & 7))
            .copied()
            .unwrap_or(8);
        if layout >> 11 != 0 || mask >> n != 0 || (m < 2 && ow + tw != 0) {
            return Some(Err(Corruption::BadField("entry layout")));
        }
        let need = n * sw + if m > 0 { 16 + (m - 1) * (ow + tw) } else { 0 };
        if buf.len() < at + need {
            return None;
        }
        for span in spans.iter_mut().take(n) {
            *span = uint_at(buf, at, sw) as u32;
            at += sw;
        }
        let mut prev = (uint_at(buf, at, 8) as i64, uint_at(buf, at + 8, 8) as i64);
        at += if m > 0 { 16 } else { 0 };
        let mut j = 0;
        for (k, slot) in meta.iter_mut().enumerate().take(n) {
            if mask >> k & 1 == 0 {
                continue;
            }
            if j > 0 {
                let d_o = unzigzag(uint_at(buf, at, ow));
                let d_t = unzigzag(uint_at(buf, at + ow, tw));
                at += ow + tw;
                prev = (prev.0.wrapping_sub(d_o), prev.1.wrapping_sub(d_t));
            }
            *slot = prev;
            j += 1;
        }
    }
    Some(
        match ProducerEntry::from_newest_first(epoch, last, n, mask, &spans, &meta) {
            Some(e) => Ok((id, partition, e, at)),
            None => Err(Corruption::BadField("entry (sequences inconsistent)")),
        },
    )
}

/// Decodes one entry of `version` at the start of `buf`.
#[inline]
fn decode_entry(version: u16, buf: &[u8]) -> Option<std::result::Result<Decoded, Corruption>> {
    if version == VERSION_1 {
        let mut d = Dec::new(buf);
        decode_entry_v1(&mut d).map(|r| r.map(|(id, p, e)| (id, p, e, d.pos())))
    } else {
        decode_entry_v2(buf)
    }
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
}

/// A snapshot is fsync'ed every this many bytes as it is written, so the
/// disk never has one huge flush to do at the end, during which the log's
/// fsyncs (and so durable appends) would wait (measured: the longest append
/// pause during a 1M-key snapshot went from 10 ms to about 2 ms).
const SYNC_EVERY: u64 = 1 << 20;

impl Writer {
    /// Creates `<position>.snap.tmp` in `dir` with a placeholder header.
    pub(crate) fn create(fs: &dyn FileSystem, dir: &Path, position: u64) -> Result<Writer> {
        let dest = dir.join(file_name(position));
        let tmp = dir.join(format!("{}{TMP_SUFFIX}", file_name(position)));
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
        })
    }

    /// Appends encoded entries (from [`encode_entry`]).
    pub(crate) fn write(&mut self, bytes: &[u8], entries: u64) -> Result<()> {
        self.file
            .write_all(bytes)
            .map_err(|e| Error::io("write", &self.tmp, e))?;
        self.body_crc = crc32c::crc32c_append(self.body_crc, bytes);
        self.body_len += bytes.len() as u64;
        self.entries += entries;
        self.unsynced += bytes.len() as u64;
        if self.unsynced >= SYNC_EVERY {
            self.file
                .sync_data()
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
        });
        let crc = crc32c::crc32c_combine(
            crc32c::crc32c(&header),
            self.body_crc,
            self.body_len as usize,
        );
        let tmp = self.tmp.clone();
        let io = |op, e| Error::io(op, &tmp, e);
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

/// A whole snapshot (header, entries, trailer) in memory, byte for byte
/// what [`Writer`] puts in a file at `position`: for a caller that keeps
/// or ships the state by other means (a replicated state machine's
/// snapshot transfer).
pub(crate) fn encode_to_vec(
    position: u64,
    entries: impl Iterator<Item = (ProducerId, i32, ProducerEntry)>,
) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    let mut count = 0u64;
    for (id, partition, e) in entries {
        encode_entry(&mut out, &id, partition, &e);
        count += 1;
    }
    let body_len = (out.len() - HEADER_LEN) as u64;
    let header = encode_header(&Header {
        version: VERSION,
        position,
        entries: count,
        body_len,
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
    /// One decoded entry; an error stops the read.
    fn entry(&mut self, id: ProducerId, partition: i32, e: ProducerEntry) -> Result<()>;
}

struct Each<F>(F);

impl<F: FnMut(ProducerId, i32, ProducerEntry) -> Result<()>> Sink for Each<F> {
    #[inline]
    fn entry(&mut self, id: ProducerId, partition: i32, e: ProducerEntry) -> Result<()> {
        (self.0)(id, partition, e)
    }
}

/// Streams a snapshot file, verifying its header, every entry and finally
/// the CRC over every byte. `each` sees entries as they are decoded; the
/// caller must discard what it built if this returns an error.
pub(crate) fn read(
    path: &Path,
    r: impl Read,
    file_len: u64,
    each: impl FnMut(ProducerId, i32, ProducerEntry) -> Result<()>,
) -> Result<Header> {
    read_into(path, r, file_len, &mut Each(each))
}

/// [`read`], handing the header and then the entries to `sink`.
pub(crate) fn read_into(
    path: &Path,
    mut r: impl Read,
    file_len: u64,
    sink: &mut impl Sink,
) -> Result<Header> {
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
    let mut buf: Vec<u8> = Vec::new();
    let mut consumed = 0usize; // bytes of `buf` already decoded
    let mut remaining = header.body_len; // body bytes not yet read from the file
    let mut offset = HEADER_LEN as u64; // file offset of buf[consumed]
    let mut found = 0u64;
    const CHUNK: usize = 1 << 20;
    loop {
        match decode_entry(header.version, buf.get(consumed..).unwrap_or_default()) {
            Some(Ok((id, partition, e, len))) => {
                consumed += len;
                offset += len as u64;
                found += 1;
                sink.entry(id, partition, e)?;
                continue;
            }
            Some(Err(kind)) => return Err(Error::corrupt(path, offset, kind)),
            None if remaining == 0 => {
                if consumed < buf.len() {
                    return Err(Error::corrupt(
                        path,
                        offset,
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
        let want = remaining.min(CHUNK as u64) as usize;
        let old = buf.len();
        buf.resize(old + want, 0);
        let got = read_full(&mut r, buf.get_mut(old..).unwrap_or_default()).map_err(io)?;
        if got < want {
            return Err(Error::corrupt(path, offset, truncated(want, got)));
        }
        crc = crc32c::crc32c_append(crc, buf.get(old..).unwrap_or_default());
        remaining -= want as u64;
    }
    let mut trailer = [0u8; TRAILER_LEN];
    let got = read_full(&mut r, &mut trailer).map_err(io)?;
    if got < TRAILER_LEN {
        return Err(Error::corrupt(path, offset, truncated(TRAILER_LEN, got)));
    }
    let stored = u32::from_le_bytes(trailer);
    if stored != crc {
        return Err(Error::corrupt(
            path,
            offset,
            Corruption::ChecksumMismatch {
                stored,
                computed: crc,
            },
        ));
    }
    if found != header.entries {
        return Err(Error::corrupt(
            path,
            24,
            Corruption::CountMismatch {
                stated: header.entries,
                found,
            },
        ));
    }
    Ok(header)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::Batch;
    use crate::fs::SimFs;
    use crate::manager::ProducerStateManager;
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

    fn write(fs: &SimFs, dir: &Path, m: &ProducerStateManager, position: u64) -> PathBuf {
        let mut w = Writer::create(fs, dir, position).unwrap();
        for (id, p, e) in m.iter() {
            let mut b = Vec::new();
            encode_entry(&mut b, &id, p, &e);
            w.write(&b, 1).unwrap();
        }
        w.finish(fs, dir).unwrap()
    }

    type Entries = Vec<(ProducerId, i32, ProducerEntry)>;

    fn load(bytes: &[u8]) -> Result<(Header, Entries)> {
        let mut out = Vec::new();
        let h = read(
            Path::new("s"),
            Cursor::new(bytes),
            bytes.len() as u64,
            |id, p, e| {
                out.push((id, p, e));
                Ok(())
            },
        )?;
        Ok((h, out))
    }

    #[test]
    fn the_in_memory_encoding_is_the_file_byte_for_byte() {
        let fs = SimFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let m = sample_state();
        let path = write(&fs, &dir, &m, 77);
        let file = fs.read_file(&path).unwrap();
        assert_eq!(encode_to_vec(77, m.iter()), file);
        let empty = encode_to_vec(3, std::iter::empty());
        let (h, entries) = load(&empty).unwrap();
        assert_eq!((h.position, h.entries, entries.len()), (3, 0, 0));
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
        let (h, entries) = load(&bytes).unwrap();
        assert_eq!(h.position, 77);
        assert_eq!(h.entries as usize, m.len());
        for (id, p, e) in entries {
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
        assert_eq!(load(&bytes).unwrap().1.len(), 3);
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

    /// A version-1 file of `m`'s entries, as the build before version 2
    /// wrote it.
    fn v1_file(m: &ProducerStateManager, position: u64) -> Vec<u8> {
        let mut body = Vec::new();
        for (id, p, e) in m.iter() {
            encode_entry_v1(&mut body, &id, p, &e);
        }
        let mut b = encode_header(&Header {
            version: VERSION_1,
            position,
            entries: m.len() as u64,
            body_len: body.len() as u64,
        });
        b.extend_from_slice(&body);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn version_1_files_still_read_to_the_same_state() {
        let m = sample_state();
        let bytes = v1_file(&m, 12);
        let (h, entries) = load(&bytes).unwrap();
        assert_eq!((h.version, h.position), (VERSION_1, 12));
        assert_eq!(entries.len(), m.len());
        for (id, p, e) in entries {
            assert_eq!(m.get(id, p), Some(e));
        }
    }

    /// Entries of every shape: window sizes 0 to 5, metadata anywhere,
    /// spans and gaps of every width, wrapped sequences, both id kinds.
    fn entries_of_every_shape() -> Vec<(ProducerId, i32, ProducerEntry)> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut out = Vec::new();
        for i in 0..3000u64 {
            let n = (rnd() % 6) as usize;
            let width = |r: u64| match r % 5 {
                0 => 0,
                1 => r >> 60,
                2 => r >> 48,
                3 => r >> 33,
                _ => r,
            };
            let mut batches = Vec::new();
            let mut seq = if i % 7 == 0 {
                i32::MAX - 3
            } else {
                (rnd() >> 40) as i32
            };
            let (mut o, mut t) = (rnd() as i64, rnd() as i64);
            for _ in 0..n {
                let meta = rnd() % 4 != 0;
                let span = if meta {
                    (width(rnd()) % 100_000) as i32
                } else {
                    0
                };
                let first = seq;
                let last = first.saturating_add(span);
                o = o.wrapping_sub(width(rnd()) as i64);
                t = t.wrapping_add(width(rnd()) as i64);
                batches.push(RetainedBatch {
                    first_sequence: first,
                    last_sequence: last,
                    metadata: meta.then_some(BatchMetadata {
                        offset: o,
                        timestamp: t,
                    }),
                });
                seq = crate::rules::next_sequence(last);
            }
            let last = batches
                .last()
                .map_or((rnd() >> 33) as i32, |b| b.last_sequence);
            let e = ProducerEntry::from_parts((rnd() >> 48) as i16, last, &batches)
                .unwrap_or_else(|| panic!("{batches:?}"));
            let id = if i % 3 == 0 {
                ProducerId::named(&"n".repeat((i % 40) as usize))
            } else {
                ProducerId::numeric(rnd())
            };
            out.push((id, rnd() as i32, e));
        }
        out
    }

    #[test]
    fn version_2_entries_of_every_shape_round_trip_even_at_the_end_of_the_buffer() {
        for (id, p, e) in entries_of_every_shape() {
            let mut b = Vec::new();
            encode_entry(&mut b, &id, p, &e);
            // Exactly the entry (no bytes to spare for the wide loads),
            // then with bytes after it.
            let (did, dp, de, len) = decode_entry_v2(&b).unwrap().unwrap();
            assert_eq!((&did, dp, &de, len), (&id, p, &e, b.len()));
            let mut longer = b.clone();
            longer.extend_from_slice(&[0xff; 9]);
            let (_, _, de, len) = decode_entry_v2(&longer).unwrap().unwrap();
            assert_eq!((de, len), (e, b.len()));
            for cut in 0..b.len() {
                assert!(
                    decode_entry_v2(&b[..cut]).is_none_or(|r| r.is_err()),
                    "cut {cut}"
                );
            }
            // And the same state re-encodes to the same bytes.
            let mut again = Vec::new();
            encode_entry(&mut again, &did, dp, &de);
            assert_eq!(again, b);
        }
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
        encode_entry(&mut buf, &ProducerId::numeric(5), 0, &e);
        assert_eq!(buf.len(), 21 + 16 + 4 * 6);
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_name(&file_name(9)), Some(9));
        assert_eq!(parse_name("00000000000000000009.snap.tmp"), None);
        assert_eq!(parse_name("00000000000000000009.wal"), None);
    }
}
