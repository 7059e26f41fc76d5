//! A small durable log of records: what the transaction and group
//! coordinators write their state changes to.
//!
//! The file is a sequence of frames, each `len: u32 LE`, `crc: u32 LE`
//! (CRC-32C of the payload) and `len` payload bytes. An append writes one
//! or more frames and `fdatasync`s them before it returns, so a change is
//! acknowledged only once it is durable. Opening reads every frame from the
//! start: a frame that is cut short or fails its checksum *at the end* is a
//! torn tail, which is cut (only the last write can be torn); a damaged
//! frame with a valid one after it is damage, and opening refuses
//! ([`Error::CorruptLog`]), never guessing. A frame's length is checked
//! against the bytes left in the file before anything is allocated for it.
//!
//! The log only grows; its owner rewrites it ([`RecordsLog::rewrite`]:
//! a temporary file, fsync, rename, directory fsync) with the live records
//! when it holds many more than those.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::plog::sync_dir;

/// The largest payload a frame may hold.
pub const MAX_RECORD: usize = 16 << 20;
const FRAME: usize = 8;

/// An open log.
#[derive(Debug)]
pub struct RecordsLog {
    path: PathBuf,
    file: File,
    len: u64,
    records: u64,
}

impl RecordsLog {
    /// Opens (or creates) the log at `path` and returns every record in it,
    /// in order, after cutting a torn tail.
    pub fn open(path: &Path) -> Result<(RecordsLog, Vec<Vec<u8>>)> {
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        if !existed && let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| Error::io("read", path, e))?;
        let mut records = Vec::new();
        let mut at = 0usize;
        let mut bad = None;
        while at < bytes.len() {
            match frame_at(&bytes, at) {
                Ok((payload, next)) => {
                    records.push(payload.to_vec());
                    at = next;
                }
                Err(why) => {
                    bad = Some(why);
                    break;
                }
            }
        }
        if let Some(why) = bad {
            // Damage is a torn tail only if no valid frame starts after it.
            if (at + 1..bytes.len()).any(|p| frame_at(&bytes, p).is_ok()) {
                return Err(Error::CorruptLog {
                    path: path.to_path_buf(),
                    pos: at as u64,
                    reason: format!("{why}, with valid records after it"),
                });
            }
            tracing::warn!(path = %path.display(), pos = at, bytes = bytes.len() - at, reason = why, "cut a torn tail");
            file.set_len(at as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| Error::io("truncate torn tail of", path, e))?;
        } else if at > 0 {
            // What a killed process left in the page cache is made durable
            // before anything is answered from it.
            file.sync_data()
                .map_err(|e| Error::io("fdatasync", path, e))?;
        }
        let count = records.len() as u64;
        Ok((
            RecordsLog {
                path: path.to_path_buf(),
                file,
                len: at as u64,
                records: count,
            },
            records,
        ))
    }

    /// Appends `payloads` as frames and makes them durable. On an error the
    /// log must not be written again (its end is unknown; the next open
    /// cuts what was torn).
    pub fn append(&mut self, payloads: &[&[u8]]) -> Result<()> {
        let mut buf = Vec::new();
        for p in payloads {
            encode_frame(&mut buf, p);
        }
        self.file
            .write_all_at(&buf, self.len)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io("append", &self.path, e))?;
        self.len += buf.len() as u64;
        self.records += payloads.len() as u64;
        Ok(())
    }

    /// Records in the file (since the last rewrite).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Replaces the whole log with `payloads`, atomically (a temporary
    /// file, fsync, rename, directory fsync).
    pub fn rewrite(&mut self, payloads: &[Vec<u8>]) -> Result<()> {
        let mut tmp_name = self.path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let mut buf = Vec::new();
        for p in payloads {
            encode_frame(&mut buf, p);
        }
        let file = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(&buf)?;
            f.sync_all()?;
            OpenOptions::new().read(true).write(true).open(&tmp)
        })()
        .map_err(|e| Error::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| Error::io("rename", &tmp, e))?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        self.file = file;
        self.len = buf.len() as u64;
        self.records = payloads.len() as u64;
        Ok(())
    }
}

fn encode_frame(buf: &mut Vec<u8>, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    buf.extend_from_slice(payload);
}

/// The payload of the frame at `at`, and where the next one starts.
fn frame_at(bytes: &[u8], at: usize) -> std::result::Result<(&[u8], usize), &'static str> {
    let head = bytes
        .get(at..at + FRAME)
        .ok_or("a frame header cut short")?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len > MAX_RECORD {
        return Err("a frame longer than a record may be");
    }
    let payload = bytes
        .get(at + FRAME..at + FRAME + len)
        .ok_or("a frame cut short")?;
    if crc32c::crc32c(payload) != crc {
        return Err("a frame whose CRC-32C does not match");
    }
    Ok((payload, at + FRAME + len))
}

/// Writing a record's fields, little-endian, in order.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A new record starting with its kind.
    pub fn new(kind: u8) -> Writer {
        Writer(vec![kind])
    }
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends an `i16`.
    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends an `i32`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends an `i64`.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A string: `u32` byte length, then UTF-8.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    /// Bytes: `u32` length, then the bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
}

/// Reading a record's fields; every length is checked against the bytes
/// left before anything is allocated.
pub struct Reader<'a>(pub &'a [u8]);

/// Why a record's bytes are not a record.
pub type Malformed = &'static str;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err("a record cut short");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    /// Reads a byte.
    pub fn u8(&mut self) -> std::result::Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    /// Reads an `i16`.
    pub fn i16(&mut self) -> std::result::Result<i16, Malformed> {
        let b = self.take(2)?;
        Ok(i16::from_le_bytes([b[0], b[1]]))
    }
    /// Reads an `i32`.
    pub fn i32(&mut self) -> std::result::Result<i32, Malformed> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Reads an `i64`.
    pub fn i64(&mut self) -> std::result::Result<i64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
    /// Reads bytes written by [`Writer::bytes`].
    pub fn bytes(&mut self) -> std::result::Result<&'a [u8], Malformed> {
        let n = self.i32()? as u32 as usize;
        self.take(n)
    }
    /// Reads a string written by [`Writer::str`].
    pub fn str(&mut self) -> std::result::Result<String, Malformed> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_string)
            .map_err(|_| "a string that is not UTF-8")
    }
    /// A count of items each at least `min_bytes` long: refused if the
    /// bytes left cannot hold that many.
    pub fn count(&mut self, min_bytes: usize) -> std::result::Result<usize, Malformed> {
        let n = self.i32()? as u32 as usize;
        if n.saturating_mul(min_bytes.max(1)) > self.0.len() {
            return Err("a count larger than the record holds");
        }
        Ok(n)
    }
    /// True once every byte was read.
    pub fn done(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_a_torn_tail_is_cut_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let (mut log, got) = RecordsLog::open(&path).unwrap();
        assert!(got.is_empty());
        log.append(&[b"one", b"two"]).unwrap();
        log.append(&[b"three"]).unwrap();
        drop(log);
        let (_, got) = RecordsLog::open(&path).unwrap();
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
        let whole = std::fs::read(&path).unwrap();
        // Every cut inside the last frame is a torn tail.
        for cut in whole.len() - 12..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (_, got) = RecordsLog::open(&path).unwrap();
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                (whole.len() - 13) as u64
            );
        }
        // A flipped bit in the first frame, with frames after it: refused.
        let mut bad = whole.clone();
        bad[9] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(
            RecordsLog::open(&path),
            Err(Error::CorruptLog { pos: 0, .. })
        ));
        // A huge length is not allocated.
        let mut huge = whole.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        assert!(RecordsLog::open(&path).is_err());
    }

    #[test]
    fn a_rewrite_replaces_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let (mut log, _) = RecordsLog::open(&path).unwrap();
        log.append(&[b"a", b"b", b"c"]).unwrap();
        log.rewrite(&[b"c".to_vec()]).unwrap();
        log.append(&[b"d"]).unwrap();
        assert_eq!(log.records(), 2);
        drop(log);
        let (_, got) = RecordsLog::open(&path).unwrap();
        assert_eq!(got, [b"c".to_vec(), b"d".to_vec()]);
    }

    #[test]
    fn a_reader_refuses_lengths_past_its_bytes() {
        let mut w = Writer::new(1);
        w.str("hello").i64(-5).i32(3);
        let mut r = Reader(&w.0);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.str().as_deref(), Ok("hello"));
        assert_eq!(r.i64(), Ok(-5));
        assert_eq!(r.count(8), Err("a count larger than the record holds"));
        let mut r = Reader(&[0xff, 0xff, 0xff, 0x7f, 1]);
        assert!(r.bytes().is_err());
    }
}
