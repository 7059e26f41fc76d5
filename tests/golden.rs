//! Committed files pin the on-disk format (docs/format.md describes them
//! byte by byte): store directories written by a fixed history, each with
//! three log segments and a snapshot.
//!
//! - `store-v6` is what this version writes with `preallocate(false)` (with
//!   it, the same records with the header's preallocated flag, padded with
//!   zeros, checked below): the test checks that writing the history today
//!   produces exactly those bytes, and that they decode to the expected
//!   state. Segments hold a random store id and salt; the history is
//!   written with `fixed_ids_for_tests`, which derives both from a fixed
//!   seed, and a manual clock, so that the bytes are fixed too. Its
//!   history has every record kind of version 5 (clock records, an
//!   expiration, an eviction, a marker of an append accepted for an
//!   unknown producer at a sequence above 0) and, of version 6, a
//!   partition's truncation (kind 11).
//! - `store-v5` was written by the fifth version (the same records but
//!   kind 11, a version-4 snapshot): it must open to its history's state,
//!   and the bytes docs/format.md walks through are its.
//! - `store-v1` was written by the first format version (one append per
//!   record), `store-v2` by the second (no store id, salt or record
//!   offsets), `store-v3` by the third (no lifecycle records; a version-2
//!   snapshot). They must still open to their state, and a store
//!   continuing them writes new segments in the current version.
//! - `snapshot-v1` to `snapshot-v6` hold one snapshot of the same history
//!   of windows of every shape, in each snapshot version: the current one
//!   (6) must be written byte for byte, all must decode to the history's
//!   state. (`store-v5`'s snapshots are of snapshot version 4, regenerated
//!   when that version came, its segments unchanged; `store-v6`'s were
//!   regenerated as version 6 the same way; the older stores keep the
//!   snapshots they were written with.)
//!
//! Regenerate (only on a deliberate format change, with a new version):
//! `GOLDEN_REGENERATE=1 cargo test --test golden`; keep the old
//! directories, they pin what older stores left on disk.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::golden_dir::committed;
use common::model::{Model, ModelConfig};
use common::snapshot_bytes::snapshot_entries;
use common::store_util::{diff, matches};
use producer_state::fs::{FileSystem, SimFs};
use producer_state::{
    AppendRequest, Batch, Clock, FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions,
    UnknownProducer,
};

const GOLDEN_V1: &str = "tests/golden/store-v1";
const GOLDEN_V2: &str = "tests/golden/store-v2";
const GOLDEN_V3: &str = "tests/golden/store-v3";
const GOLDEN_V5: &str = "tests/golden/store-v5";
const GOLDEN: &str = "tests/golden/store-v6";
/// The seed of the golden store's ids (see `fixed_ids_for_tests`).
const IDS_SEED: u64 = 0x9013_de11;

/// One step of the fixed history.
enum Step {
    /// One append, then a snapshot if asked.
    One(AppendRequest, bool),
    /// One `append_all` call: its numeric single-sequence appends share a
    /// record.
    All(Vec<AppendRequest>),
    /// The clock moves to this time.
    Clock(i64),
    /// An expiration sweep.
    Expire,
    /// A partition exported, removed and imported back: two groups.
    Move(i32),
    /// A truncation to this offset.
    Truncate(i64),
    /// A partition's truncation to this offset.
    TruncatePartition(i32, i64),
}

/// The history of version 1: every record kind, a new session, a zombie, a retry.
fn history_v1() -> Vec<Step> {
    let mut h = Vec::new();
    let mut push = |r: AppendRequest, snapshot_after: bool| h.push(Step::One(r, snapshot_after));
    push(AppendRequest::single(42u64, 0, 0, 0), false);
    push(AppendRequest::single(42u64, 0, 0, 1), false);
    push(
        AppendRequest::batch(42u64, 1, 3, Batch::new(0, 4, 1000, 1_700_000_000_000)),
        false,
    );
    push(AppendRequest::single("p1", 0, 0, 0), false);
    push(
        AppendRequest::batch("p1", 0, 0, Batch::new(1, 2, 2000, 1_700_000_000_001)),
        true,
    );
    push(AppendRequest::single(42u64, 0, 0, 1), false); // a retry: writes nothing
    push(AppendRequest::single(42u64, 0, 1, 0), false); // a new session
    push(AppendRequest::single(42u64, 0, 0, 2), false); // a zombie: writes nothing
    for i in 0..40 {
        push(
            AppendRequest::batch(
                u64::MAX,
                -1,
                7,
                Batch::new(i * 2, i * 2 + 1, i64::from(i), -1),
            ),
            false,
        );
    }
    h
}

/// The history of version 2: version 1's, then one call of four numeric
/// single-sequence appends: one record of four.
fn history_v2() -> Vec<Step> {
    let mut h = history_v1();
    h.push(Step::All(vec![
        AppendRequest::single(7u64, 1, 0, 0),
        AppendRequest::single(7u64, 2, 0, 0),
        AppendRequest::single(8u64, -1, 2, 0),
        AppendRequest::single(7u64, 1, 0, 1),
    ]));
    h
}

/// The history of version 5: version 2's, then the lifecycle: the clock
/// moves (clock records before single-sequence appends), a key expires,
/// a full table evicts (the cap is 7 keys), and an unknown producer is
/// accepted at sequence 5 (`UnknownProducer::AcceptAny`).
fn history_v5() -> Vec<Step> {
    let mut h = history_v2();
    let day = 24 * 60 * 60 * 1000;
    h.push(Step::Clock(1_700_000_000_000));
    h.push(Step::One(AppendRequest::single(7u64, 2, 0, 1), false));
    h.push(Step::One(AppendRequest::single(8u64, -1, 2, 1), false));
    h.push(Step::Clock(1_700_000_000_000 + day));
    h.push(Step::One(AppendRequest::single(8u64, -1, 2, 2), false));
    // Every key but 8/-1 was last active a day ago or more (the batches'
    // own timestamps count): they expire.
    h.push(Step::Expire);
    for k in 10..17u64 {
        h.push(Step::One(AppendRequest::single(k, 0, 0, 0), false));
    }
    h.push(Step::One(AppendRequest::single(99u64, 0, 3, 5), false));
    // A partition moved out and back in (a removal group, an import
    // group), then two batches and a truncation to position 68, that of
    // the append of 99/0: it cuts the batch at offset 5000 (a key set back
    // to what the import gave it) and the one at 6000 (a key removed), and
    // keeps 99/0 (the import, whose highest offset is -1, holds it): a
    // group of a removal and a key state.
    h.push(Step::Move(0));
    h.push(Step::One(
        AppendRequest::batch(12u64, 0, 0, Batch::new(1, 2, 5_000, 1_700_000_000_005)),
        false,
    ));
    h.push(Step::One(
        AppendRequest::batch(77u64, 5, 0, Batch::new(0, 0, 6_000, 1_700_000_000_006)),
        false,
    ));
    h.push(Step::Truncate(68));
    h
}

/// The history of version 6: version 5's, then a partition's truncation:
/// a batch of 50/3 at offset 10, and partition 3 cut back to 10: a group
/// of kind 11 (partition 3, one member, offset 10) and a removal of 50/3
/// (reason 4). (The store-wide offset is far above: 6,000 was appended to
/// partition 5, and stays.)
fn history_v6() -> Vec<Step> {
    let mut h = history_v5();
    h.push(Step::One(
        AppendRequest::batch(50u64, 3, 0, Batch::new(0, 0, 10, 1_700_000_000_010)),
        false,
    ));
    h.push(Step::TruncatePartition(3, 10));
    h
}

/// The cap of the version-5 history.
const CAP: usize = 7;

fn opts(fs: &SimFs) -> StoreOptions {
    StoreOptions::default()
        .file_system(Arc::new(fs.clone()))
        .fsync(FsyncPolicy::Always)
        .segment_size(1024)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
        .background_snapshots(false)
        // Version 6's history takes three snapshots: its segments stay.
        .keep_snapshots(3)
        .fixed_ids_for_tests(IDS_SEED)
        .clock(Arc::new(ManualClock::new(0)))
        .expiration_interval(None)
        // The committed files are appended segments; the preallocated ones
        // are checked against them below.
        .preallocate(false)
}

/// The options of the version-5 history: a cap, and rule 1 as Kafka's.
fn opts_v5(fs: &SimFs, clock: &ManualClock) -> StoreOptions {
    opts(fs)
        .clock(Arc::new(clock.clone()))
        .max_producers(Some(CAP))
        .unknown_producer(UnknownProducer::AcceptAny)
}

fn write_history(fs: &SimFs, dir: &Path, history: &[Step]) -> Model {
    write_history_with(fs, dir, history, opts_v5)
}

fn write_history_with(
    fs: &SimFs,
    dir: &Path,
    history: &[Step],
    opts: impl Fn(&SimFs, &ManualClock) -> StoreOptions,
) -> Model {
    let mut model = Model::default();
    let clock = ManualClock::new(0);
    model.config = ModelConfig {
        cap: Some(CAP),
        accept_any: true,
        // The store's default, a day.
        expiration_ms: Some(24 * 60 * 60 * 1000),
        ..ModelConfig::default()
    };
    let store = ProducerStateStore::open_with(dir, opts(fs, &clock)).unwrap();
    for step in history {
        match step {
            Step::One(r, snap) => {
                assert_eq!(
                    store.append_request(r).unwrap(),
                    model.append_at(r, clock.now_ms())
                );
                if *snap {
                    store.snapshot().unwrap().unwrap();
                }
            }
            Step::All(reqs) => {
                let now = clock.now_ms();
                for (got, r) in store.append_all(reqs).into_iter().zip(reqs) {
                    assert_eq!(got.unwrap(), model.append_at(r, now));
                }
            }
            Step::Clock(ms) => clock.set(*ms),
            Step::Expire => {
                assert_eq!(store.expire_now().unwrap(), model.expire(clock.now_ms()));
            }
            Step::Move(p) => {
                let export = store.export_partition(*p).unwrap();
                let mine: Vec<_> = model
                    .keys
                    .iter()
                    .filter(|((_, kp), _)| kp == p)
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect();
                model.remove_partition(*p);
                model.import(mine);
                store.remove_partition(*p).unwrap();
                assert_eq!(store.import_partition(&export).unwrap(), export.len());
            }
            Step::Truncate(offset) => {
                model.truncate(*offset).unwrap();
                store.truncate_to(*offset).unwrap();
            }
            Step::TruncatePartition(p, offset) => {
                model.truncate_partition(*p, *offset).unwrap();
                store.truncate_partition_to(*p, *offset).unwrap();
            }
        }
        model.next_pos = store.next_position();
    }
    store.close().unwrap();
    model
}

fn store_files(fs: &SimFs, dir: &Path) -> Vec<(String, Vec<u8>)> {
    fs.list(dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name != "LOCK")
        .map(|e| (e.name.clone(), fs.read_file(&dir.join(&e.name)).unwrap()))
        .collect()
}

/// A simulated copy of committed files.
fn copy(files: &[(String, Vec<u8>)]) -> (SimFs, PathBuf) {
    let fs = SimFs::new();
    let dir = PathBuf::from("/copy");
    fs.create_dir_all(&dir).unwrap();
    for (name, bytes) in files {
        fs.overwrite(&dir.join(name), bytes);
    }
    (fs, dir)
}

#[test]
fn the_committed_files_decode_and_the_encoder_still_writes_them() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/golden");
    let model = write_history(&fs, &dir, &history_v6());
    let fresh = store_files(&fs, &dir);
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".wal")).count(),
        4,
        "{:?}",
        fresh.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The one taken at position 5, and the one the store-wide truncation
    // asked for (a partition's truncation asks for none).
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".snap")).count(),
        2,
        "{:?}",
        fresh.iter().map(|f| &f.0).collect::<Vec<_>>()
    );

    if std::env::var("GOLDEN_REGENERATE").is_ok() {
        let _ = std::fs::remove_dir_all(GOLDEN);
        std::fs::create_dir_all(GOLDEN).unwrap();
        for (name, bytes) in &fresh {
            std::fs::write(Path::new(GOLDEN).join(name), bytes).unwrap();
        }
    }

    // The committed bytes are exactly what the encoder writes today.
    let committed = committed(GOLDEN);
    assert_eq!(committed.len(), fresh.len());
    for ((cn, cb), (fname, fb)) in committed.iter().zip(&fresh) {
        assert_eq!(cn, fname);
        if cn.ends_with(".snap") {
            // Entry order is unspecified (it follows the in-memory layout):
            // compare the header fields and the set of entries.
            assert_eq!(cb.len(), fb.len(), "{cn}");
            assert_eq!(cb[..40], fb[..40], "{cn}: header");
            assert_eq!(snapshot_entries(cb), snapshot_entries(fb), "{cn}: entries");
        } else {
            assert!(
                cb == fb,
                "{cn}: the encoder no longer writes the committed bytes (format change? see docs/format.md)"
            );
        }
    }

    // And they decode to the expected state, activities included, with
    // the clock anywhere (recovery never reads it).
    let (golden_fs, gdir) = copy(&committed);
    let far = ManualClock::new(i64::MAX / 2);
    let store = ProducerStateStore::open_with(&gdir, opts_v5(&golden_fs, &far)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    let report = store.recovery_report();
    // The newest snapshot, the one after the store-wide truncation: the
    // partition's truncation after it is replayed from the log.
    let newest = report.snapshot.as_ref().map(|s| s.position).unwrap();
    assert_eq!(newest, 78);
    assert_eq!(report.records_replayed, report.next_position - newest);
    assert_eq!(report.torn_bytes_dropped(), 0);
    assert_eq!(
        report.clean_shutdown,
        Some(true),
        "it ends with a close marker"
    );
}

/// The store of version 5 (written before the partition's truncation
/// existed) opens to its history's state, with each partition's end
/// derived from its version-4 snapshot and exact after replay; a store
/// continuing it writes a version-6 segment, whose partition truncation
/// the next open replays.
#[test]
fn a_version_5_store_opens_and_continues_in_the_current_version() {
    let model = write_history(&SimFs::new(), Path::new("/model"), &history_v5());
    let files = committed(GOLDEN_V5);
    assert!(
        files
            .iter()
            .all(|(n, b)| !n.ends_with(".wal") || b[8..10] == [5, 0])
    );
    let (fs, dir) = copy(&files);
    let clock = ManualClock::new(1_700_000_000_000 + 24 * 60 * 60 * 1000);
    let store = ProducerStateStore::open_with(&dir, opts_v5(&fs, &clock)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    assert_eq!(store.recovery_report().clean_shutdown, Some(true));
    let mut model = model;
    for (first, offset) in [(0, 7_000), (1, 7_010)] {
        let now = clock.now_ms();
        let r = AppendRequest::batch(60u64, 9, 0, Batch::new(first, first, offset, now));
        let got = store.append_request(&r).unwrap();
        assert!(got.is_accepted(), "{got:?}");
        assert_eq!(got, model.append_at(&r, now));
    }
    assert_eq!(store.partition_end_offset(9), 7_011);
    store.truncate_partition_to(9, 7_010).unwrap();
    model.truncate_partition(9, 7_010).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    store.close().unwrap();
    let newest = fs
        .list(&dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name.ends_with(".wal"))
        .map(|e| e.name)
        .max()
        .unwrap();
    assert_eq!(
        &fs.read_file(&dir.join(&newest)).unwrap()[8..10],
        &[6, 0],
        "{newest}"
    );
    let store = ProducerStateStore::open_with(&dir, opts_v5(&fs, &clock)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    assert_eq!(store.partition_end_offset(9), 7_010);
}

/// With preallocation the encoder writes the committed bytes with the
/// header's preallocated flag (and its CRC), and the last segment followed
/// by zeros up to the segment size. Every segment before it ends at its
/// last record. Opening it gives the same state and report.
#[test]
fn a_preallocated_store_holds_the_committed_records_and_zeros() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/golden");
    let committed = committed(GOLDEN);
    let model = write_history_with(&fs, &dir, &history_v6(), |f, c| {
        opts_v5(f, c).preallocate(true)
    });
    let fresh = store_files(&fs, &dir);
    assert_eq!(committed.len(), fresh.len());
    let last = committed
        .iter()
        .rposition(|(n, _)| n.ends_with(".wal"))
        .unwrap();
    for (i, ((cn, cb), (fname, fb))) in committed.iter().zip(&fresh).enumerate() {
        assert_eq!(cn, fname);
        if !cn.ends_with(".wal") {
            continue;
        }
        let mut want = cb.clone();
        want[10..12].copy_from_slice(&1u16.to_le_bytes());
        let crc = crc32c::crc32c(&want[..36]);
        want[36..40].copy_from_slice(&crc.to_le_bytes());
        if i == last {
            assert!(cb.len() < 1024);
            want.resize(1024, 0);
        }
        let at = want.iter().zip(fb.iter()).position(|(a, b)| a != b);

        assert!(
            want == *fb,
            "{cn}: not the committed records, preallocated (first difference at {at:?}, lengths {} {})",
            want.len(),
            fb.len()
        );
    }
    let clock = ManualClock::new(0);
    let store =
        ProducerStateStore::open_with(&dir, opts_v5(&fs, &clock).preallocate(true)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    let report = store.recovery_report();
    assert_eq!(report.torn_bytes_dropped(), 0, "zeros are not a torn tail");
    assert!(report.torn_tail.is_none());
    assert_eq!(
        report.clean_shutdown,
        Some(true),
        "it ends with a close marker"
    );
    drop(store);
    // The open kept the room; the file is still preallocated.
    assert_eq!(
        fs.read_file(&dir.join(&committed[last].0)).unwrap().len(),
        1024
    );
}

/// An older store opens to its history's state, and a store continuing it
/// writes new segments in the current version.
fn an_older_store_opens_and_continues(
    golden: &str,
    version: u16,
    history: Vec<Step>,
    clean: Option<bool>,
) {
    // The expected state comes from the model, not from today's encoder.
    let mut model = Model::default();
    let mut appends = 0;
    for step in history {
        let reqs = match step {
            Step::One(r, _) => vec![r],
            Step::All(reqs) => reqs,
            _ => unreachable!("no lifecycle in older histories"),
        };
        for r in reqs {
            appends += u64::from(model.append(&r).is_accepted());
        }
    }
    let files = committed(golden);
    assert_eq!(
        &files[0].1[8..10],
        &version.to_le_bytes(),
        "the {golden} files are version {version}"
    );
    let (fs, dir) = copy(&files);
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    // Replay starts at the snapshot, position 5.
    assert_eq!(store.recovery_report().records_replayed, appends - 5);
    assert_eq!(store.recovery_report().next_position, appends);
    assert_eq!(store.recovery_report().clean_shutdown, clean);

    // Appends after it go to a new segment of the current version: the
    // last old segment is left as it was.
    let last_old = files.iter().rfind(|(n, _)| n.ends_with(".wal")).unwrap();
    let more = [
        AppendRequest::single(9u64, 0, 0, 0),
        AppendRequest::single(9u64, 0, 0, 1),
    ];
    for r in store.append_all(&more) {
        r.unwrap();
    }
    for r in &more {
        model.append(r);
    }
    store.close().unwrap();
    assert_eq!(fs.read_file(&dir.join(&last_old.0)).unwrap(), last_old.1);
    let name = format!("{appends:020}.wal");
    let new = fs.read_file(&dir.join(&name)).unwrap();
    assert_eq!(&new[8..10], &[6, 0]);
    assert_eq!(
        new.len(),
        40 + 35 + 18 + 17,
        "one record of two appends and a close marker"
    );
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    assert_eq!(store.recovery_report().clean_shutdown, Some(true));
    drop(store);

    // An old segment that holds no record yet (its creation was the last
    // thing before a crash) is replaced by a current one.
    let mut files = committed(golden);
    let header_len = if version >= 3 { 36 } else { 20 };
    let mut empty = files[0].1[..header_len].to_vec();
    empty[12..20].copy_from_slice(&appends.to_le_bytes());
    let crc = crc32c::crc32c(&empty);
    empty.extend_from_slice(&crc.to_le_bytes());
    files.push((name.clone(), empty));
    let (fs, dir) = copy(&files);
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    assert_eq!(store.recovery_report().next_position, appends);
    store.append(9u64, 0, 0, 0).unwrap();
    store.close().unwrap();
    let new = fs.read_file(&dir.join(&name)).unwrap();
    assert_eq!(&new[8..10], &[6, 0]);
    assert_eq!(new.len(), 40 + 35 + 17);
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    assert_eq!(store.recovery_report().records_replayed, appends - 5 + 1);
}

#[test]
fn a_version_1_store_opens_and_continues_in_the_current_version() {
    an_older_store_opens_and_continues(GOLDEN_V1, 1, history_v1(), None);
}

#[test]
fn a_version_2_store_opens_and_continues_in_the_current_version() {
    an_older_store_opens_and_continues(GOLDEN_V2, 2, history_v2(), None);
}

#[test]
fn a_version_3_store_opens_and_continues_in_the_current_version() {
    // Version 3 writes close markers: the committed store was closed.
    an_older_store_opens_and_continues(GOLDEN_V3, 3, history_v2(), Some(true));
}

#[test]
fn the_first_bytes_are_as_documented() {
    // docs/format.md walks through these bytes.
    let seg = std::fs::read(Path::new(GOLDEN_V5).join("00000000000000000000.wal")).unwrap();
    assert_eq!(&seg[..8], b"PSTATWAL");
    assert_eq!(&seg[8..12], &[5, 0, 0, 0]); // version 5, flags 0
    assert_eq!(&seg[12..20], &0u64.to_le_bytes()); // first position
    let store_id = &seg[20..28];
    assert_eq!(&seg[36..40], &crc32c::crc32c(&seg[..36]).to_le_bytes());
    // First record: CRC, 35 bytes, at offset 40, numeric single-sequence
    // (kind 1), 42/0/0/0. The CRC is seeded by header bytes 12..36.
    let seed = crc32c::crc32c(&seg[12..36]);
    assert_eq!(
        &seg[40..44],
        &crc32c::crc32c_append(seed, &seg[44..75]).to_le_bytes()
    );
    assert_eq!(&seg[44..48], &35u32.to_le_bytes());
    assert_eq!(&seg[48..52], &40u32.to_le_bytes()); // its offset
    assert_eq!(&seg[52..56], &0u32.to_le_bytes()); // distance from the durable end
    assert_eq!(seg[56], 1);
    assert_eq!(&seg[57..65], &42u64.to_le_bytes());
    assert_eq!(&seg[65..75], &[0u8; 10]); // partition 0, epoch 0, sequence 0
    let snap = std::fs::read(Path::new(GOLDEN_V5).join("00000000000000000005.snap")).unwrap();
    assert_eq!(&snap[..8], b"PSTATSNP");
    assert_eq!(&snap[16..24], &5u64.to_le_bytes()); // position
    assert_eq!(&snap[24..32], &3u64.to_le_bytes()); // entries
    let crc = crc32c::crc32c(&snap[..snap.len() - 4]);
    assert_eq!(&snap[snap.len() - 4..], &crc.to_le_bytes());
    // Version 4: the store section (17 bytes), then the first block
    // (shard 3, one entry, 34 bytes): the key p1/0 with its activity
    // flagged as its batch's timestamp.
    assert_eq!(&snap[8..10], &[4, 0]);
    assert_eq!(&snap[48..52], &17u32.to_le_bytes());
    let block = 48 + 4 + 17;
    assert_eq!(&snap[block..block + 10], &[3, 0, 1, 0, 0, 0, 34, 0, 0, 0]);
    assert_eq!(&snap[block + 10..block + 15], &[0x99, 2, 0, b'p', b'1']);
    assert_eq!(
        &snap[block + 10 + 34 - 8..block + 10 + 34],
        &1_700_000_000_001i64.to_le_bytes()
    );

    // The segment at position 38: the same store id, another salt. At
    // offset 480 the four appends of one `append_all` call share a record:
    // 17 header bytes and 18 per append.
    let seg = std::fs::read(Path::new(GOLDEN_V5).join("00000000000000000038.wal")).unwrap();
    assert_eq!(&seg[12..20], &38u64.to_le_bytes());
    assert_eq!(&seg[20..28], store_id);
    let seed = crc32c::crc32c(&seg[12..36]);
    let record = |at: usize| {
        let len = u32::from_le_bytes(seg[at + 4..at + 8].try_into().unwrap()) as usize;
        assert_eq!(&seg[at + 8..at + 12], &(at as u32).to_le_bytes(), "offset");
        assert_eq!(
            &seg[at..at + 4],
            &crc32c::crc32c_append(seed, &seg[at + 4..at + len]).to_le_bytes(),
            "crc"
        );
        (seg[at + 16], &seg[at + 17..at + len])
    };
    let at = 480;
    let (kind, payload) = record(at);
    assert_eq!((kind, payload.len()), (1, 4 * 18));
    let entry = |i: usize| &payload[18 * i..18 * (i + 1)];
    assert_eq!(&entry(0)[..8], &7u64.to_le_bytes());
    assert_eq!(&entry(0)[8..12], &1i32.to_le_bytes()); // partition
    assert_eq!(&entry(2)[..8], &8u64.to_le_bytes());
    assert_eq!(
        &entry(2)[8..18],
        &[0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0]
    ); // -1, epoch 2, seq 0
    assert_eq!(&entry(3)[14..18], &1i32.to_le_bytes()); // sequence 1
    // Then the clock moves: a clock record (kind 6, 25 bytes) before the
    // next single-sequence append.
    let (kind, payload) = record(569);
    assert_eq!(kind, 6);
    assert_eq!(payload, &1_700_000_000_000i64.to_le_bytes());
    // The expiration: one removal record (kind 7) per shard holding
    // expired keys; the first, of key 42/0, reason 1 (expired).
    let (kind, payload) = record(724);
    assert_eq!(kind, 7);
    assert_eq!(payload[0], 1, "expired");
    assert_eq!(payload[1], 0, "numeric id");
    assert_eq!(&payload[2..10], &42u64.to_le_bytes());
    assert_eq!(&payload[10..14], &0i32.to_le_bytes());

    // The last segment: an eviction of the named key p1/0 (reason 2); the
    // marker of an append accepted for an unknown producer at a sequence
    // above 0 (kind 10, at 199) before that append (99/0, sequence 5); the
    // partition moved out and in: a group record (kind 8: group kind 2,
    // members 1, argument the partition 0) and one removal (reason 3),
    // then a group (kind 3, import; argument the highest offset, -1) and
    // one record of key states (kind 9, version-3 entries); later the
    // truncation to 68: a group (kind 1, argument 68) and a removal
    // (reason 4) of 77/5; the close marker last.
    let (name, seg) = committed(GOLDEN_V5)
        .into_iter()
        .rfind(|(n, _)| n.ends_with(".wal"))
        .unwrap();
    let first: u64 = name[..20].parse().unwrap();
    assert_eq!(&seg[12..20], &first.to_le_bytes());
    assert_eq!(&seg[20..28], store_id);
    let seed = crc32c::crc32c(&seg[12..36]);
    let mut records = Vec::new();
    let mut at = 40;
    while at < seg.len() {
        let len = u32::from_le_bytes(seg[at + 4..at + 8].try_into().unwrap()) as usize;
        assert_eq!(&seg[at + 8..at + 12], &(at as u32).to_le_bytes());
        assert_eq!(
            &seg[at..at + 4],
            &crc32c::crc32c_append(seed, &seg[at + 4..at + len]).to_le_bytes()
        );
        records.push((at, seg[at + 16], seg[at + 17..at + len].to_vec()));
        at += len;
    }
    assert_eq!(at, seg.len());
    let find = |kind: u8, payload: &[u8]| {
        records
            .iter()
            .position(|(_, k, p)| *k == kind && p.starts_with(payload))
            .unwrap_or_else(|| panic!("no record of kind {kind} starting {payload:?}"))
    };
    assert_eq!(records[0].1, 7);
    assert_eq!(records[0].2, [2, 1, 2, 0, b'p', b'1', 0, 0, 0, 0]);
    let unknown = find(10, &[]);
    assert_eq!(records[unknown].0, 199);
    assert_eq!(records[unknown + 1].1, 1);
    assert_eq!(&records[unknown + 1].2[..8], &99u64.to_le_bytes());
    assert_eq!(&records[unknown + 1].2[14..18], &5i32.to_le_bytes());
    let group = |kind: u8, members: u32, arg: i64| {
        let mut p = vec![kind];
        p.extend_from_slice(&members.to_le_bytes());
        p.extend_from_slice(&arg.to_le_bytes());
        p
    };
    let removal = find(8, &group(2, 1, 0));
    assert_eq!(records[removal + 1].1, 7);
    assert_eq!(records[removal + 1].2[0], 3, "partition removed");
    let import = find(8, &group(3, 1, -1));
    assert_eq!(records[import + 1].1, 9);
    let truncate = find(8, &group(1, 1, 68));
    assert_eq!(records[truncate + 1].1, 7);
    let mut cut = vec![4, 0];
    cut.extend_from_slice(&77u64.to_le_bytes());
    cut.extend_from_slice(&5i32.to_le_bytes());
    assert_eq!(records[truncate + 1].2, cut, "77/5 truncated");
    assert_eq!(records.last().map(|r| (r.1, r.2.len())), Some((5, 0)));
}

const SNAP_V1: &str = "tests/golden/snapshot-v1";
const SNAP_V2: &str = "tests/golden/snapshot-v2";
const SNAP_V3: &str = "tests/golden/snapshot-v3";
const SNAP_V4: &str = "tests/golden/snapshot-v4";
const SNAP_V5: &str = "tests/golden/snapshot-v5";
const SNAP_V6: &str = "tests/golden/snapshot-v6";

/// A history whose snapshot holds windows of every shape the encoding
/// distinguishes: full windows with small, large, negative and extreme
/// gaps, batches without metadata, a wrapped sequence, a long batch, a new
/// session, window-less keys, short and long names.
fn history_windows() -> Vec<AppendRequest> {
    let mut h = Vec::new();
    let t0 = 1_700_000_000_000i64;
    // Steady one-record batches, gaps of a few offsets and milliseconds.
    for i in 0..7 {
        h.push(AppendRequest::batch(
            1u64,
            0,
            0,
            Batch::new(i, i, 100 + 3 * i64::from(i), t0 + 2 * i64::from(i)),
        ));
    }
    // Long batches, offsets falling and jumping, no timestamps.
    let mut first = 0;
    for (span, offset) in [
        (0, 5_000_000_000),
        (70_000, 4_000),
        (2, 1 << 40),
        (300, -7),
        (1, 1 << 20),
    ] {
        h.push(AppendRequest::batch(
            9u64,
            3,
            2,
            Batch::new(first, first + span, offset, -1),
        ));
        first += span + 1;
    }
    // Single appends between batches: a window with gaps in its metadata,
    // the newest batch without any.
    h.push(AppendRequest::batch(2u64, 5, 0, Batch::new(0, 2, 10, t0)));
    h.push(AppendRequest::single(2u64, 5, 0, 3));
    h.push(AppendRequest::batch(
        2u64,
        5,
        0,
        Batch::new(4, 9, 20, t0 - 5),
    ));
    h.push(AppendRequest::single(2u64, 5, 0, 10));
    h.push(AppendRequest::single(2u64, 5, 0, 11));
    // Extremes: offsets and timestamps at both ends of i64.
    for (i, (o, t)) in [
        (i64::MAX, i64::MIN),
        (i64::MIN, i64::MAX),
        (0, 0),
        (i64::MAX, -1),
    ]
    .into_iter()
    .enumerate()
    {
        let i = i as i32;
        h.push(AppendRequest::batch(5u64, 0, 1, Batch::new(i, i, o, t)));
    }
    // A sequence that wraps after i32::MAX.
    h.push(AppendRequest::batch(
        3u64,
        1,
        0,
        Batch::new(0, i32::MAX - 2, 1, 1),
    ));
    h.push(AppendRequest::batch(
        3u64,
        1,
        0,
        Batch::new(i32::MAX - 1, i32::MAX, 2, 2),
    ));
    h.push(AppendRequest::batch(3u64, 1, 0, Batch::new(0, 3, 3, 3)));
    // A new session keeps only its own batch.
    h.push(AppendRequest::batch(4u64, 0, 0, Batch::new(0, 0, 1, 1)));
    h.push(AppendRequest::batch(4u64, 0, 0, Batch::new(1, 1, 2, 2)));
    h.push(AppendRequest::batch(4u64, 0, 1, Batch::new(0, 4, 30, 31)));
    // Keys without a window.
    h.push(AppendRequest::single(u64::MAX, -1, i16::MAX, 0));
    h.push(AppendRequest::single(u64::MAX, -1, i16::MAX, 1));
    h.push(AppendRequest::single(0u64, i32::MIN, -3, 0));
    h.push(AppendRequest::single("s", 0, 0, 0));
    // Names, short and long, with windows.
    for i in 0..3 {
        h.push(AppendRequest::batch(
            "p1",
            0,
            0,
            Batch::new(i, i, 1000 + i64::from(i), t0 + 1000 * i64::from(i)),
        ));
    }
    for i in 0..6 {
        h.push(AppendRequest::batch(
            "a-name-longer-than-twenty-four-bytes",
            2,
            0,
            Batch::new(2 * i, 2 * i + 1, 50 + i64::from(i), t0 - 300 * i64::from(i)),
        ));
    }
    h
}

/// Decodes a snapshot file through the library's reader and checks it
/// against the model, key by key.
fn check_snapshot_against(path: &Path, model: &Model) -> producer_state::inspect::SnapshotSummary {
    let (summary, state) =
        producer_state::inspect::snapshot(&producer_state::fs::StdFs, path, &mut |_| {})
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut seen = 0;
    for (id, p, e) in state.iter() {
        let m = model
            .entry(&(id.clone(), p))
            .unwrap_or_else(|| panic!("{}: key {id}/{p} not in the history", path.display()));
        assert!(
            common::model::same_entry(&e, m),
            "{}: {id}/{p}: {e:?} != {m:?}",
            path.display()
        );
        seen += 1;
    }
    assert_eq!(seen, model.keys.len(), "{}", path.display());
    summary
}

#[test]
fn snapshots_of_full_windows_are_written_as_committed_and_every_version_decodes() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/windows");
    let mut model = Model::default();
    let store = ProducerStateStore::open_with(&dir, opts(&fs)).unwrap();
    for r in history_windows() {
        let got = store.append_request(&r).unwrap();
        assert!(got.is_accepted(), "{r:?}: {got:?}");
        assert_eq!(got, model.append(&r));
    }
    let written = store.snapshot().unwrap().unwrap();
    store.close().unwrap();
    let name = written.file_name().unwrap().to_owned();
    let fresh = fs.read_file(&written).unwrap();

    if std::env::var("GOLDEN_REGENERATE").is_ok() {
        let _ = std::fs::remove_dir_all(SNAP_V6);
        std::fs::create_dir_all(SNAP_V6).unwrap();
        std::fs::write(Path::new(SNAP_V6).join(&name), &fresh).unwrap();
    }

    // Byte for byte, entry order included: every key of this history lies
    // in a shard of its own, so the order is the shards' (fixed by the
    // hash), not the hash tables'.
    let committed = std::fs::read(Path::new(SNAP_V6).join(&name)).unwrap();
    assert!(
        committed == fresh,
        "the encoder no longer writes the committed snapshot (format change? see docs/format.md)"
    );
    assert_eq!(&committed[8..10], &[6, 0], "written as version 6");
    // Version 6 is version 5 with where the position lies in the log.
    let v5 = std::fs::read(Path::new(SNAP_V5).join(&name)).unwrap();
    assert_eq!(committed[16..40], v5[16..40]);
    assert_eq!(committed[48..committed.len() - 4], v5[48..v5.len() - 4]);

    // The files of versions 1 to 3, written by older builds from the same
    // history, still decode to the same state; and every version's
    // entries split as docs/format.md says.
    for (dir, version) in [
        (SNAP_V1, 1u8),
        (SNAP_V2, 2),
        (SNAP_V3, 3),
        (SNAP_V4, 4),
        (SNAP_V5, 5),
        (SNAP_V6, 6),
    ] {
        let path = Path::new(dir).join(&name);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[8..10], &[version, 0], "{dir}");
        let s = check_snapshot_against(&path, &model);
        assert_eq!(s.entries as usize, model.keys.len());
        assert_eq!(s.bytes, bytes.len() as u64);
        assert_eq!(snapshot_entries(&bytes).len(), model.keys.len(), "{dir}");
    }
}
