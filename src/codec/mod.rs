//! Explicit little-endian encoding, shared by the log and the snapshots.
//!
//! Every on-disk integer is written with `to_le_bytes` by this module and
//! read back by [`Dec`], which never indexes out of bounds: a short read is
//! a `None` that the caller turns into a [`Corruption`] with the offset.
//! A producer id has one encoding wherever a format holds it by itself
//! ([`put_id`], [`decode_id`]), and [`crc`] is the CRC-32C arithmetic
//! the log's search for valid records runs on. This layer knows no file
//! and no format: the formats themselves are described byte by byte in
//! docs/format.md.

#![deny(clippy::indexing_slicing)]

pub mod crc;

use crate::error::Corruption;
use crate::id::ProducerId;

/// Appends little-endian fields to a buffer.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_i16(&mut self, v: i16) {
        self.put_u16(v as u16);
    }
    fn put_i32(&mut self, v: i32) {
        self.put_u32(v as u32);
    }
    fn put_i64(&mut self, v: i64) {
        self.put_u64(v as u64);
    }
}

impl Put for Vec<u8> {
    #[inline]
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    #[inline]
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Clone, Debug)]
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Dec { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let b = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(b)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Some(a)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    /// The start every file header of this crate shares: the 8-byte
    /// `magic`, then the format version and the flags (each 0 where the
    /// bytes end: the caller checks the length and the checksum).
    pub(crate) fn magic_version_flags(
        &mut self,
        magic: &[u8; 8],
    ) -> Result<(u16, u16), Corruption> {
        if self.bytes(8) != Some(&magic[..]) {
            return Err(Corruption::BadMagic);
        }
        Ok((self.u16().unwrap_or(0), self.u16().unwrap_or(0)))
    }

    pub(crate) fn i16(&mut self) -> Option<i16> {
        self.u16().map(|v| v as i16)
    }
    pub(crate) fn i32(&mut self) -> Option<i32> {
        self.u32().map(|v| v as i32)
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.u64().map(|v| v as i64)
    }
}

/// The `Truncated` corruption for a structure of `needed` bytes of which
/// `available` are present.
pub(crate) fn truncated(needed: usize, available: usize) -> Corruption {
    Corruption::Truncated {
        needed: needed as u64,
        available: available as u64,
    }
}

/// Reads the little-endian `u32` at `at`, if the slice has it.
pub(crate) fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Dec::new(buf.get(at..)?).u32()
}

/// Writes `v` little-endian over `buf[at..at + 4]` (the caller sized `buf`).
pub(crate) fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(dst) = buf.get_mut(at..at + 4) {
        dst.copy_from_slice(&v.to_le_bytes());
    }
}

/// A producer id as the log's removal records and the snapshot's Kafka
/// section hold it: `u8` 0 and `u64`, or `u8` 1, `u16` length and UTF-8.
pub(crate) fn put_id(buf: &mut Vec<u8>, id: &ProducerId) {
    match id.as_numeric() {
        Some(n) => {
            buf.put_u8(0);
            buf.put_u64(n);
        }
        None => {
            let name = id.name_bytes().unwrap_or_default();
            buf.put_u8(1);
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
        }
    }
}

/// Reads what [`put_id`] wrote.
pub(crate) fn decode_id(d: &mut Dec<'_>) -> Result<ProducerId, Corruption> {
    let short = || Corruption::BadField("producer id (too short)");
    let id = match d.u8().ok_or_else(short)? {
        0 => ProducerId::numeric(d.u64().ok_or_else(short)?),
        1 => {
            let n = d.u16().ok_or_else(short)? as usize;
            let name = d.bytes(n).ok_or_else(short)?;
            let name = std::str::from_utf8(name)
                .map_err(|_| Corruption::BadField("producer name (not UTF-8)"))?;
            ProducerId::named(name)
        }
        _ => return Err(Corruption::BadField("producer id kind")),
    };
    Ok(id)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_little_endian() {
        let mut b = Vec::new();
        b.put_u8(1);
        b.put_u16(0x0203);
        b.put_i32(-2);
        b.put_u64(0x0405_0607_0809_0a0b);
        b.put_i64(i64::MIN);
        assert_eq!(&b[..3], &[1, 3, 2]);
        let mut d = Dec::new(&b);
        assert_eq!(d.u8(), Some(1));
        assert_eq!(d.u16(), Some(0x0203));
        assert_eq!(d.i32(), Some(-2));
        assert_eq!(d.u64(), Some(0x0405_0607_0809_0a0b));
        assert_eq!(d.i64(), Some(i64::MIN));
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.u8(), None);
        assert_eq!(d.bytes(usize::MAX), None);
    }

    #[test]
    fn short_reads_are_none_not_panics() {
        let b = [1u8, 2, 3];
        let mut d = Dec::new(&b);
        assert_eq!(d.u32(), None);
        assert_eq!(d.pos(), 0);
        assert_eq!(u32_at(&b, 2), None);
        assert_eq!(u32_at(&b, 9), None);
        let mut m = [0u8; 3];
        set_u32(&mut m, 1, 7); // does not fit: ignored, no panic
        assert_eq!(m, [0, 0, 0]);
    }
}
