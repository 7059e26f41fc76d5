//! Salvage run more than once on one store, on real files: what an earlier
//! salvage set aside is never replaced, each piece gets a fresh name, and
//! the report names the files it really wrote. Plus a crash at every step
//! of a salvage (simulated): every byte it moves aside survives somewhere.
//!
//! Records are found with the library's own reader
//! ([`inspect::segment`]), so these tests do not depend on the bytes of a
//! record.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::store_util::{dir, sim_opts};
use producer_state::fs::{Fault, SimFs, StdFs, Unsynced};
use producer_state::inspect;
use producer_state::{AppendOutcome, Error, ProducerStateStore, RecoveryMode, StoreOptions};

/// The byte offset of each record of a segment, by position, and the end
/// of its valid records.
fn record_offsets(seg: &Path) -> (BTreeMap<u64, u64>, u64) {
    let mut at = BTreeMap::new();
    let s = inspect::segment(
        &StdFs,
        seg,
        |position, offset, _| {
            at.insert(position, offset);
        },
        &mut |_| {},
    )
    .unwrap();
    (at, s.valid_bytes)
}

/// Flips a byte in the middle of the record at `position` of `seg`.
/// Returns the record's offset.
fn damage_record(seg: &Path, position: u64) -> u64 {
    let (at, end) = record_offsets(seg);
    let start = at[&position];
    let next = at.range(position + 1..).next().map_or(end, |(_, &o)| o);
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[((start + next) / 2) as usize] ^= 0x40;
    std::fs::write(seg, bytes).unwrap();
    start
}

/// Every file of `dir` whose name has `.discarded` in it, with its bytes.
fn discarded(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".discarded"))
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

/// A strict open refuses with `Corrupt`; a salvage opens. Returns the
/// store and the files the report says it moved aside.
fn salvage(dir: &Path, opts: &StoreOptions) -> (ProducerStateStore, Vec<PathBuf>) {
    match ProducerStateStore::open_with(dir, opts.clone()) {
        Err(e @ Error::Corrupt { .. }) => drop(e),
        other => panic!("a strict open refuses: {:?}", other.map(|_| ())),
    }
    let s =
        ProducerStateStore::open_with(dir, opts.clone().recovery(RecoveryMode::Salvage)).unwrap();
    let aside = s
        .recovery_report()
        .salvage
        .clone()
        .expect("reported")
        .discarded;
    (s, aside)
}

fn append_seqs(s: &ProducerStateStore, epoch: i16, seqs: std::ops::Range<i32>) {
    for seq in seqs {
        assert_eq!(
            s.append(0u64, 0, epoch, seq).unwrap(),
            AppendOutcome::Accepted
        );
    }
}

#[test]
fn salvage_twice_in_one_segment_keeps_both_discarded_tails() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let opts = StoreOptions::default();
    let s = ProducerStateStore::open_with(d, opts.clone()).unwrap();
    append_seqs(&s, 0, 0..50);
    s.close().unwrap();
    let seg = segments(d).remove(0);

    let cut = damage_record(&seg, 10) as usize;
    let damaged = std::fs::read(&seg).unwrap();
    let (s, first) = salvage(d, &opts);
    assert_eq!(s.get(0u64, 0).unwrap().last_sequence(), 9);
    assert_eq!(first.len(), 1);
    assert_eq!(std::fs::read(&first[0]).unwrap(), damaged[cut..]);
    append_seqs(&s, 0, 10..60);
    s.close().unwrap();
    let before = discarded(d);

    let cut = damage_record(&seg, 30) as usize;
    let damaged = std::fs::read(&seg).unwrap();
    let (s, second) = salvage(d, &opts);
    assert_eq!(s.get(0u64, 0).unwrap().last_sequence(), 29);
    assert_eq!(s.recovery_report().next_position, 30);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first, "a fresh name");
    assert_eq!(std::fs::read(&second[0]).unwrap(), damaged[cut..]);
    // The first tail is still there, unchanged.
    let after = discarded(d);
    for (p, bytes) in &before {
        assert_eq!(after.get(p), Some(bytes), "{} kept", p.display());
    }
    assert_eq!(after.len(), 2, "{:?}", after.keys());
    s.close().unwrap();
    // The names set aside are not taken for store files: a strict open
    // accepts the directory as it is.
    let s = ProducerStateStore::open_with(d, opts).unwrap();
    assert_eq!(s.get(0u64, 0).unwrap().last_sequence(), 29);
}

#[test]
fn a_second_salvage_never_replaces_segments_a_first_one_moved_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // A fixed clock: the log's clock records, and so where segments roll,
    // do not depend on timing.
    let opts = StoreOptions::default()
        .segment_size(1024)
        .clock(std::sync::Arc::new(producer_state::ManualClock::new(0)));
    let s = ProducerStateStore::open_with(d, opts.clone()).unwrap();
    append_seqs(&s, 0, 0..200);
    s.close().unwrap();
    let segs = segments(d);
    assert!(segs.len() >= 4, "{segs:?}");

    damage_record(&segs[0], 2);
    let moved: Vec<Vec<u8>> = segs[1..]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let (s, first) = salvage(d, &opts);
    assert_eq!(s.recovery_report().next_position, 2);
    assert_eq!(first.len(), segs.len(), "a tail and every later segment");
    for (aside, bytes) in first[1..].iter().zip(&moved) {
        assert_eq!(&std::fs::read(aside).unwrap(), bytes);
    }
    append_seqs(&s, 1, 0..198);
    s.close().unwrap();
    let before = discarded(d);
    assert_eq!(before.len(), first.len());

    // The log rolled at the same positions: the same names are back.
    let again = segments(d);
    assert_eq!(again, segs);
    let mut header = std::fs::read(&again[2]).unwrap();
    header[0] ^= 0xff;
    std::fs::write(&again[2], header).unwrap();
    let moved: Vec<Vec<u8>> = again[2..]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let (s, second) = salvage(d, &opts);
    assert_eq!(second.len(), moved.len());
    for (aside, bytes) in second.iter().zip(&moved) {
        assert!(!before.contains_key(aside), "{} is fresh", aside.display());
        assert_eq!(&std::fs::read(aside).unwrap(), bytes);
    }
    let after = discarded(d);
    for (p, bytes) in &before {
        assert_eq!(after.get(p), Some(bytes), "{} kept", p.display());
    }
    assert_eq!(after.len(), before.len() + second.len());
    s.close().unwrap();
}

/// True when every byte of `originals` (segment path -> bytes) is in
/// `img`: in the segment, or in the segment's prefix followed by a piece
/// set aside (`<segment>.discarded...`), or in a piece alone. The store
/// may have written after its prefix once salvage was done (a clean
/// close's marker), so the segment need only start with that prefix.
fn nothing_lost(img: &SimFs, originals: &BTreeMap<PathBuf, Vec<u8>>) -> bool {
    originals.iter().all(|(seg, bytes)| {
        let kept = img.read_file(seg).unwrap_or_default();
        let prefix = format!("{}.discarded", seg.display());
        kept == *bytes
            || img
                .files()
                .iter()
                .filter(|(p, _)| p.to_string_lossy().starts_with(&prefix))
                .any(|(p, _)| {
                    let piece = img.read_file(p).unwrap();
                    let cut = bytes.len().saturating_sub(piece.len());
                    bytes.ends_with(&piece) && kept.starts_with(&bytes[..cut])
                })
    })
}

#[test]
fn a_crash_during_salvage_loses_no_byte_it_moves_aside() {
    // Damage in the middle of the first of several segments: salvage
    // copies its tail aside, cuts it and renames every later segment.
    // Crash at every operation of that open.
    let base = SimFs::new();
    let opts = |fs: &SimFs| sim_opts(fs).segment_size(1024);
    let s = ProducerStateStore::open_with(dir(), opts(&base)).unwrap();
    append_seqs(&s, 0, 0..120);
    s.close().unwrap();
    let seg = dir().join("00000000000000000000.wal");
    let mut bytes = base.read_file(&seg).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    base.overwrite(&seg, &bytes);
    let originals: BTreeMap<PathBuf, Vec<u8>> = base
        .files()
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "wal"))
        .map(|(p, _)| {
            let b = base.read_file(&p).unwrap();
            (p, b)
        })
        .collect();
    assert!(originals.len() >= 3, "{:?}", originals.keys());

    let salvage =
        |fs: &SimFs| ProducerStateStore::open_with(dir(), opts(fs).recovery(RecoveryMode::Salvage));
    let probe = base.crash_image(Unsynced::Keep);
    let s = salvage(&probe).unwrap();
    assert_eq!(
        s.recovery_report()
            .salvage
            .as_ref()
            .unwrap()
            .discarded
            .len(),
        originals.len()
    );
    s.close().unwrap();
    let total = probe.ops();
    let mut crashed = 0;
    for n in 0..total {
        let fs = base.crash_image(Unsynced::Keep);
        fs.set_fault(n, Fault::Crash);
        if salvage(&fs).is_ok_and(|s| s.close().is_ok()) && !fs.crashed() {
            continue;
        }
        crashed += 1;
        let images = [Unsynced::Drop, Unsynced::Keep]
            .into_iter()
            .map(|u| fs.crash_image(u))
            .chain((0..16).map(|seed| fs.crash_image_reordered(Unsynced::Drop, seed)));
        for (i, img) in images.enumerate() {
            assert!(
                nothing_lost(&img, &originals),
                "crash at op {n}, image {i}: bytes lost: {:?}",
                img.files()
            );
            // And the image opens (salvaging again if it must).
            salvage(&img).unwrap();
        }
    }
    assert!(crashed > 3, "{crashed} of {total} operations crashed");
}
