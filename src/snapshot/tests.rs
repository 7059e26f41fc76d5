//! The snapshot format's tests: round trips in every version, damage
//! found at its byte, blocks, sections.

#![allow(clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use super::entry as entry_codec;
use super::header::*;
use super::read::*;
use super::write::*;
use crate::batch::Batch;
use crate::batch::BatchMetadata;
use crate::engine::ProducerStateManager;
use crate::engine::entry::ProducerEntry;
use crate::error::Result;
use crate::fs::FileSystem;
use crate::fs::SimFs;
use crate::id::ProducerId;
use crate::snapshot::meta::Meta;
use std::io::Cursor;

/// A simulated file system with the directory `/d` in it.
fn sim_dir() -> (SimFs, PathBuf) {
    let fs = SimFs::new();
    let dir = PathBuf::from("/d");
    fs.create_dir_all(&dir).unwrap();
    (fs, dir)
}

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
    meta.ends.note(0, 77);
    meta.ends.note(3, 12);
    for k in 0..20u64 {
        meta.filter
            .insert(crate::engine::map::hash_key(&ProducerId::numeric(k), 0));
    }
    meta
}

/// The log point [`write`] records.
const POINT: LogPoint = LogPoint {
    offset: 0x0102_0304,
    seed: 0xa1b2_c3d4,
};

fn write(fs: &SimFs, dir: &Path, m: &ProducerStateManager, position: u64) -> PathBuf {
    write_with(fs, dir, m, position, Some(POINT))
}

/// [`write`], with `point` or none (a version-5 file).
fn write_with(
    fs: &SimFs,
    dir: &Path,
    m: &ProducerStateManager,
    position: u64,
    point: Option<LogPoint>,
) -> PathBuf {
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
        let shard = crate::engine::shards::shard_of(crate::engine::map::hash_key(&id, p)) as u16;
        blocks.push(shard, &id, p, &e, act(&e, p));
        if p == 1 {
            blocks.flush(&mut w).unwrap();
        }
    }
    blocks.flush(&mut w).unwrap();
    // Where the position lies in the log: the store writes one when it
    // knows it (version 6).
    if let Some(p) = point {
        w.set_point(p);
    }
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
    let (fs, dir) = sim_dir();
    let m = sample_state();
    // Without a point: a replica's state has no log of this store.
    let path = write_with(&fs, &dir, &m, 77, None);
    let file = fs.read_file(&path).unwrap();
    assert_eq!(&file[8..10], &VERSION_5.to_le_bytes());
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
    let (fs, dir) = sim_dir();
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
    assert_eq!(h.point, Some(POINT));
    // The offset under the header's CRC, the seed after it (under the
    // file's).
    assert_eq!(&bytes[12..16], &POINT.offset.to_le_bytes());
    assert_eq!(&bytes[44..48], &POINT.seed.to_le_bytes());
    assert_eq!(meta, sample_meta());
    assert_eq!(h.entries as usize, m.len());
    for (id, p, e, a) in entries {
        assert_eq!(a, act(&e, p));
        assert_eq!(m.get(id, p), Some(e));
    }
}

#[test]
fn every_truncation_and_bit_flip_is_an_error_never_a_panic() {
    let (fs, dir) = sim_dir();
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
        // Version 3's store section: no partition ends.
        let mut section = Vec::new();
        sample_meta().encode(&mut section);
        let ends = {
            let mut e = Vec::new();
            sample_meta().ends.encode(&mut e);
            e.len()
        };
        section.truncate(section.len() - ends);
        let len = (section.len() - 4) as u32;
        crate::codec::set_u32(&mut section, 0, len);
        body.extend_from_slice(&section);
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
        point: None,
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
    let v3 = Meta {
        ends: crate::snapshot::ends::Ends::derived([]),
        ..sample_meta()
    };
    assert_eq!(meta, v3, "no partition ends before version 5");
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
    let (fs, dir) = sim_dir();
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
