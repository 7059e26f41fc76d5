//! Counting the records of a produced batch, as Kafka's validator does.
//!
//! The broker stores a batch as it came and never needs its records, but
//! it must not believe the header's record count: a 1-record batch that
//! declares 1,000 would move the high watermark by 1,000. Kafka iterates
//! every record of a produced batch (`LogValidator`, through
//! `DefaultRecordBatch`'s record iterator) and refuses it with
//! `INVALID_RECORD` when the records run out before the declared count
//! ("Incorrect declared batch size, premature EOF reached") or bytes are
//! left after it ("records still remaining"), and when a record's fields
//! do not fill exactly the length it declares. This does the same walk:
//! each record is a zigzag varint length and that many bytes, holding
//! attributes (1 byte), timestamp delta (varlong), offset delta (varint),
//! key and value (varint length, -1 for null, then the bytes) and headers
//! (varint count, then each header's key, never null, and value). Nothing
//! is kept: bytes are skipped, not copied. A compressed batch is walked as
//! it is decompressed, a block at a time, so memory stays small whatever
//! the batch inflates to, and the work stops at
//! `max.decompressed.batch.bytes` ([`crate::limits`]).
//!
//! Codecs, by the attribute bits 0 to 2: 0 none, 1 gzip, 2 snappy (Kafka's
//! framing of the Java `snappy-java` stream, or raw snappy as librdkafka
//! may write it), 3 LZ4 (the frame format), 4 zstd. Another value is
//! refused as corrupt.

use std::io::{self, Read};

use crate::batch::{BatchHeader, HEADER_LEN};

/// The smallest record: attributes, timestamp delta, offset delta, key
/// length, value length and header count, one byte each at least.
pub const MIN_RECORD: u64 = 6;

/// Why a batch's records do not match its header.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    /// Fewer records than the header declares.
    #[error(
        "incorrect declared batch size, premature EOF reached: the header declares {declared} \
         records, {found} are there"
    )]
    TooFew {
        /// The header's record count.
        declared: i32,
        /// Records found.
        found: u64,
    },
    /// Bytes left after the declared number of records.
    #[error(
        "incorrect declared batch size, records still remaining: the header declares {declared} \
         records"
    )]
    TooMany {
        /// The header's record count.
        declared: i32,
    },
    /// A record's length field is not a valid length.
    #[error(
        "record {index} has length {length}, below the {MIN_RECORD} bytes of the smallest record"
    )]
    BadLength {
        /// Which record (from 0).
        index: u64,
        /// Its length field.
        length: i64,
    },
    /// A record's fields do not fill its length exactly.
    #[error("record {index} is invalid: {reason}")]
    BadRecord {
        /// Which record (from 0).
        index: u64,
        /// What is wrong.
        reason: String,
    },
    /// The compressed records do not decompress.
    #[error("the {codec} records do not decompress: {reason}")]
    Decompress {
        /// The codec.
        codec: &'static str,
        /// What the decompressor said.
        reason: String,
    },
    /// The records decompress to more than the broker walks.
    #[error("the records decompress to more than {limit} bytes (max.decompressed.batch.bytes)")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The attribute bits name no codec.
    #[error("unknown compression codec {0}")]
    UnknownCodec(i16),
}

/// Checks that the records of `batch` (a whole batch, its header parsed
/// and verified as `h`) are exactly as many as `h` declares. `limit`
/// bounds the bytes a compressed batch's records may decompress to.
pub fn check(batch: &[u8], h: &BatchHeader, limit: u64) -> Result<(), RecordsError> {
    let records = batch.get(HEADER_LEN..h.size).unwrap_or_default();
    let codec = h.attributes & 0x07;
    match codec {
        0 => walk(records, h.record_count, u64::MAX),
        1 => walk(flate2::read::GzDecoder::new(records), h.record_count, limit)
            .map_err(named("gzip")),
        2 => {
            walk(SnappyReader::new(records, limit), h.record_count, limit).map_err(named("snappy"))
        }
        3 => walk(
            lz4_flex::frame::FrameDecoder::new(records),
            h.record_count,
            limit,
        )
        .map_err(named("lz4")),
        4 => match ruzstd::decoding::StreamingDecoder::new(records) {
            Ok(d) => walk(d, h.record_count, limit).map_err(named("zstd")),
            Err(e) => Err(RecordsError::Decompress {
                codec: "zstd",
                reason: e.to_string(),
            }),
        },
        other => Err(RecordsError::UnknownCodec(other)),
    }
}

/// Names the codec in a decompression error.
fn named(codec: &'static str) -> impl Fn(RecordsError) -> RecordsError {
    move |e| match e {
        RecordsError::Decompress { reason, .. } => RecordsError::Decompress { codec, reason },
        e => e,
    }
}

/// Reads records from `r` until its end, counting them against
/// `declared`; at most `limit` bytes are read.
fn walk(r: impl Read, declared: i32, limit: u64) -> Result<(), RecordsError> {
    let mut r = Counted {
        inner: r,
        read: 0,
        limit,
    };
    let declared_n = u64::try_from(declared).unwrap_or(0);
    let mut found = 0u64;
    let mut skip = [0u8; 4096];
    while let Some(length) = read_varint(&mut r)? {
        if found == declared_n {
            return Err(RecordsError::TooMany { declared });
        }
        let length = match u64::try_from(length) {
            Ok(n) if n >= MIN_RECORD => n,
            _ => {
                return Err(RecordsError::BadLength {
                    index: found,
                    length,
                });
            }
        };
        let mut rec = Fields {
            r: &mut r,
            left: length,
            skip: &mut skip,
        };
        match rec.walk() {
            Ok(()) => {}
            Err(FieldError::Eof) => return Err(RecordsError::TooFew { declared, found }),
            Err(FieldError::Io(e)) => return Err(r.error(e)),
            Err(FieldError::Bad(reason)) => {
                return Err(RecordsError::BadRecord {
                    index: found,
                    reason,
                });
            }
        }
        found += 1;
    }
    if found != declared_n {
        return Err(RecordsError::TooFew { declared, found });
    }
    Ok(())
}

/// Why a record's fields could not be walked.
enum FieldError {
    /// The records ended inside it.
    Eof,
    /// The reader failed (decompression, or the limit).
    Io(io::Error),
    /// Its fields are not a record's.
    Bad(String),
}

/// One record's fields, read from `r` within the `left` bytes its length
/// gave it.
struct Fields<'a, R> {
    r: &'a mut Counted<R>,
    left: u64,
    skip: &'a mut [u8; 4096],
}

impl<R: Read> Fields<'_, R> {
    fn walk(&mut self) -> Result<(), FieldError> {
        self.skip_bytes(1)?; // attributes
        self.varint(10)?; // timestamp delta (varlong)
        self.varint(5)?; // offset delta
        for field in ["key", "value"] {
            let len = self.varint(5)?;
            self.bytes_of(len, true, field)?;
        }
        let headers = self.varint(5)?;
        if headers < 0 {
            return Err(FieldError::Bad(format!("{headers} headers")));
        }
        for _ in 0..headers {
            let key = self.varint(5)?;
            self.bytes_of(key, false, "header key")?;
            let value = self.varint(5)?;
            self.bytes_of(value, true, "header value")?;
        }
        if self.left != 0 {
            return Err(FieldError::Bad(format!(
                "its fields end {} bytes before its length",
                self.left
            )));
        }
        Ok(())
    }

    /// Skips a field of `len` bytes (-1: null, if `nullable`).
    fn bytes_of(&mut self, len: i64, nullable: bool, what: &str) -> Result<(), FieldError> {
        match u64::try_from(len) {
            Ok(n) => self.skip_bytes(n),
            Err(_) if nullable && len == -1 => Ok(()),
            Err(_) => Err(FieldError::Bad(format!("{what} length {len}"))),
        }
    }

    fn skip_bytes(&mut self, n: u64) -> Result<(), FieldError> {
        if n > self.left {
            return Err(FieldError::Bad(format!(
                "a field of {n} bytes passes its length ({} left)",
                self.left
            )));
        }
        let mut n = n;
        while n > 0 {
            let want = usize::try_from(n.min(self.skip.len() as u64)).unwrap_or(self.skip.len());
            let got = self
                .r
                .read(&mut self.skip[..want])
                .map_err(FieldError::Io)?;
            if got == 0 {
                return Err(FieldError::Eof);
            }
            n -= got as u64;
            self.left -= got as u64;
        }
        Ok(())
    }

    /// A zigzag varint of at most `max` bytes.
    fn varint(&mut self, max: u32) -> Result<i64, FieldError> {
        let mut value = 0u64;
        for i in 0..max {
            if self.left == 0 {
                return Err(FieldError::Bad("a field passes its length".into()));
            }
            let mut b = [0u8; 1];
            if self.r.read(&mut b).map_err(FieldError::Io)? == 0 {
                return Err(FieldError::Eof);
            }
            self.left -= 1;
            value |= u64::from(b[0] & 0x7f) << (7 * i);
            if b[0] & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        Err(FieldError::Bad(format!(
            "a varint of more than {max} bytes"
        )))
    }
}

/// A zigzag varint (Kafka's record length), or `None` at a clean end.
fn read_varint(r: &mut Counted<impl Read>) -> Result<Option<i64>, RecordsError> {
    let mut value = 0u64;
    for i in 0..10 {
        let mut b = [0u8; 1];
        let n = r.read(&mut b).map_err(|e| r.error(e))?;
        if n == 0 {
            if i == 0 {
                return Ok(None);
            }
            return Err(RecordsError::Decompress {
                codec: "",
                reason: "the records end inside a record's length".into(),
            });
        }
        value |= u64::from(b[0] & 0x7f) << (7 * i);
        if b[0] & 0x80 == 0 {
            let signed = (value >> 1) as i64 ^ -((value & 1) as i64);
            return Ok(Some(signed));
        }
    }
    Err(RecordsError::Decompress {
        codec: "",
        reason: "a record's length is a varint of more than 10 bytes".into(),
    })
}

/// A reader that stops with [`RecordsError::TooLarge`] past `limit` bytes.
struct Counted<R> {
    inner: R,
    read: u64,
    limit: u64,
}

impl<R: Read> Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= self.limit {
            // One byte more would pass the limit: is there one?
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(TooLarge)),
            };
        }
        let room = usize::try_from(self.limit - self.read).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let n = self.inner.read(&mut buf[..want])?;
        self.read += n as u64;
        Ok(n)
    }

    fn error(&self, e: io::Error) -> RecordsError {
        if e.get_ref().is_some_and(|inner| inner.is::<TooLarge>()) {
            return RecordsError::TooLarge { limit: self.limit };
        }
        RecordsError::Decompress {
            codec: "",
            reason: e.to_string(),
        }
    }
}

#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("decompressed past the limit")
    }
}

impl std::error::Error for TooLarge {}

/// Kafka's snappy stream: the `snappy-java` framing (a 16-byte header,
/// then blocks of a 4-byte big-endian length and a raw snappy block), or,
/// without that header, one raw snappy block (what Java's reader falls
/// back to as well). Each block is decompressed whole, after its declared
/// size is checked against the bytes still allowed.
struct SnappyReader<'a> {
    input: &'a [u8],
    framed: bool,
    started: bool,
    block: Vec<u8>,
    at: usize,
    allowed: u64,
}

const SNAPPY_JAVA_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const SNAPPY_JAVA_HEADER: usize = 16;

impl<'a> SnappyReader<'a> {
    fn new(input: &'a [u8], allowed: u64) -> SnappyReader<'a> {
        let framed = input.starts_with(SNAPPY_JAVA_MAGIC);
        SnappyReader {
            input: if framed {
                input.get(SNAPPY_JAVA_HEADER..).unwrap_or_default()
            } else {
                input
            },
            framed,
            started: false,
            block: Vec::new(),
            at: 0,
            allowed,
        }
    }

    /// Decompresses the next block into `self.block`; false at the end.
    fn next_block(&mut self) -> io::Result<bool> {
        let compressed = if self.framed {
            if self.input.is_empty() {
                return Ok(false);
            }
            let (len, rest) = self
                .input
                .split_first_chunk::<4>()
                .ok_or_else(|| io::Error::other("a block length is cut short"))?;
            let len = u32::from_be_bytes(*len) as usize;
            let block = rest
                .get(..len)
                .ok_or_else(|| io::Error::other("a block is cut short"))?;
            self.input = rest.get(len..).unwrap_or_default();
            block
        } else {
            if self.started {
                return Ok(false);
            }
            std::mem::take(&mut self.input)
        };
        self.started = true;
        let size = snap::raw::decompress_len(compressed).map_err(io::Error::other)? as u64;
        if size > self.allowed {
            return Err(io::Error::other(TooLarge));
        }
        self.allowed -= size;
        self.block = snap::raw::Decoder::new()
            .decompress_vec(compressed)
            .map_err(io::Error::other)?;
        self.at = 0;
        Ok(true)
    }
}

impl Read for SnappyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at >= self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let rest = self.block.get(self.at..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(i: i64) -> Record {
        Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(bytes::Bytes::from(vec![b'x'; 100])),
            headers: Default::default(),
            delete_horizon: false,
        }
    }

    /// A batch of `n` records encoded by the protocol crate, its records
    /// then compressed with `codec` by the crates the broker decompresses
    /// with (the protocol crate's own codecs are C libraries).
    fn batch(n: i64, codec: i16) -> Vec<u8> {
        use std::io::Write;
        let records: Vec<Record> = (0..n).map(record).collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let plain = buf.to_vec();
        let body = &plain[HEADER_LEN..];
        let packed = match codec {
            0 => body.to_vec(),
            1 => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(body).unwrap();
                e.finish().unwrap()
            }
            2 => {
                // The snappy-java framing, in blocks of 32 KiB.
                let mut out = SNAPPY_JAVA_MAGIC.to_vec();
                out.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
                for chunk in body.chunks(32 << 10) {
                    let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
                    out.extend_from_slice(&(block.len() as u32).to_be_bytes());
                    out.extend_from_slice(&block);
                }
                out
            }
            3 => {
                let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
                e.write_all(body).unwrap();
                e.finish().unwrap()
            }
            4 => {
                ruzstd::encoding::compress_to_vec(body, ruzstd::encoding::CompressionLevel::Fastest)
            }
            _ => unreachable!(),
        };
        let mut b = plain[..HEADER_LEN].to_vec();
        b.extend_from_slice(&packed);
        let len = (b.len() - crate::batch::LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[21..23].copy_from_slice(&codec.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Sets the header's record count and last offset delta to `count`
    /// (the lie), with a fresh CRC.
    fn declare(b: &mut [u8], count: i32) {
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn every_codec_counts_true_batches_and_refuses_lying_ones() {
        for c in 0..=4 {
            let mut b = batch(5, c);
            let h = crate::batch::parse(&b).unwrap();
            assert_eq!(check(&b, &h, 1 << 20), Ok(()), "{c:?}");
            declare(&mut b, 1000);
            let h = crate::batch::parse(&b).unwrap();
            assert_eq!(
                check(&b, &h, 1 << 20),
                Err(RecordsError::TooFew {
                    declared: 1000,
                    found: 5
                }),
                "{c:?}"
            );
            declare(&mut b, 3);
            let h = crate::batch::parse(&b).unwrap();
            assert_eq!(
                check(&b, &h, 1 << 20),
                Err(RecordsError::TooMany { declared: 3 }),
                "{c:?}"
            );
        }
    }

    #[test]
    fn a_batch_that_inflates_past_the_limit_is_refused() {
        for c in 1..=4 {
            let b = batch(2000, c);
            let h = crate::batch::parse(&b).unwrap();
            assert!(b.len() < 100_000, "{c:?} compresses: {}", b.len());
            assert_eq!(
                check(&b, &h, 100_000),
                Err(RecordsError::TooLarge { limit: 100_000 }),
                "{c:?}"
            );
            assert_eq!(check(&b, &h, 1 << 20), Ok(()), "{c:?}");
        }
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        let good = batch(3, 0);
        let h = crate::batch::parse(&good).unwrap();
        for codec in 0..8i16 {
            // The last byte is the last record's header count (0): 0xa5
            // makes it a varint running past the record.
            for cut in [HEADER_LEN, HEADER_LEN + 1, good.len() - 1] {
                let mut b = good[..cut].to_vec();
                b.extend(std::iter::repeat_n(0xa5, good.len() - cut));
                let h = BatchHeader {
                    attributes: codec,
                    ..h
                };
                assert!(check(&b, &h, 1 << 20).is_err(), "codec {codec} cut {cut}");
            }
        }
    }
}
