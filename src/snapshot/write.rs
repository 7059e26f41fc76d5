//! Writing a snapshot: entries framed in version-4 blocks, streamed to a
//! temporary file that is fsync'ed as it grows, then renamed into place;
//! or the same bytes in memory.

#![deny(clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use super::entry as entry_codec;
use super::header::*;
use crate::codec::Put;
use crate::directory::names;
use crate::engine::entry::{Head, ProducerEntry, Window};
use crate::error::{Error, Result};
use crate::fs::background_sync::BackgroundSync;
use crate::fs::{FileSystem, WriteFile};
use crate::id::ProducerId;
use crate::snapshot::meta::Meta;

/// The writer closes a block once it holds this many bytes, so that a
/// block is a unit of work worth handing to another thread and a reader
/// never holds much more than this of one block.
const BLOCK_TARGET: usize = 1 << 20;
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
    /// Where the position lies in the log, if known (version 6).
    point: Option<LogPoint>,
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
            point: None,
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
        crate::snapshot::kafka::encode(&mut b, k);
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

    /// Records where the snapshot's position lies in the log: the file is
    /// then of version 6, which lets recovery seek there. Without it the
    /// file is of version 5.
    pub(crate) fn set_point(&mut self, point: LogPoint) {
        self.point = Some(point);
    }

    /// Writes the trailer and the real header, fsyncs, renames into place
    /// and fsyncs the directory. Returns the final path.
    pub(crate) fn finish(mut self, fs: &dyn FileSystem, dir: &Path) -> Result<PathBuf> {
        let header = encode_header(&Header {
            version: if self.point.is_some() {
                VERSION
            } else {
                VERSION_5
            },
            position: self.position,
            entries: self.entries,
            body_len: self.body_len,
            kafka: self.kafka,
            point: self.point,
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
        crate::snapshot::kafka::encode(&mut out, k);
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
    // No log holds this state's position: no point, version 5.
    let header = encode_header(&Header {
        version: VERSION_5,
        position,
        entries: count,
        body_len,
        kafka: kafka.is_some(),
        point: None,
    });
    if let Some(head) = out.get_mut(..HEADER_LEN) {
        head.copy_from_slice(&header);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
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
