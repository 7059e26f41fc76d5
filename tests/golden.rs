//! Committed files pin the on-disk format (docs/format.md describes them
//! byte by byte): a store directory written by a fixed history, with three
//! log segments and a snapshot. The test checks that the committed bytes
//! still decode to the expected state and that writing the same history
//! today produces exactly the same bytes.
//!
//! Regenerate (only on a deliberate format change, with a new version):
//! `GOLDEN_REGENERATE=1 cargo test --test golden`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::model::Model;
use common::store_util::{diff, matches};
use producer_state::fs::{FileSystem, SimFs};
use producer_state::{AppendRequest, Batch, FsyncPolicy, ProducerStateStore, StoreOptions};

const GOLDEN: &str = "tests/golden/store-v1";

/// The fixed history: every record kind, a new session, a zombie, a retry.
fn history() -> Vec<(AppendRequest, bool)> {
    let mut h = Vec::new();
    let mut push = |r: AppendRequest, snapshot_after: bool| h.push((r, snapshot_after));
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

fn opts(fs: &SimFs) -> StoreOptions {
    StoreOptions::default()
        .file_system(Arc::new(fs.clone()))
        .fsync(FsyncPolicy::Always)
        .segment_size(1024)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
        .background_snapshots(false)
}

fn write_history(fs: &SimFs, dir: &Path) -> Model {
    let mut model = Model::default();
    let store = ProducerStateStore::open_with(dir, opts(fs)).unwrap();
    for (r, snap) in history() {
        assert_eq!(store.append_request(&r).unwrap(), model.append(&r));
        if snap {
            store.snapshot().unwrap().unwrap();
        }
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

#[test]
fn the_committed_files_decode_and_the_encoder_still_writes_them() {
    let fs = SimFs::new();
    let dir = PathBuf::from("/golden");
    let model = write_history(&fs, &dir);
    let fresh = store_files(&fs, &dir);
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".wal")).count(),
        3,
        "{:?}",
        fresh.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert_eq!(
        fresh.iter().filter(|(n, _)| n.ends_with(".snap")).count(),
        1
    );

    if std::env::var("GOLDEN_REGENERATE").is_ok() {
        let _ = std::fs::remove_dir_all(GOLDEN);
        std::fs::create_dir_all(GOLDEN).unwrap();
        for (name, bytes) in &fresh {
            std::fs::write(Path::new(GOLDEN).join(name), bytes).unwrap();
        }
    }

    // The committed bytes are exactly what the encoder writes today.
    let mut committed: Vec<(String, Vec<u8>)> = std::fs::read_dir(GOLDEN)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    committed.sort();
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

    // And they decode to the expected state.
    let golden_fs = SimFs::new();
    let gdir = PathBuf::from("/copy");
    golden_fs.create_dir_all(&gdir).unwrap();
    for (name, bytes) in &committed {
        golden_fs.overwrite(&gdir.join(name), bytes);
    }
    let store = ProducerStateStore::open_with(&gdir, opts(&golden_fs)).unwrap();
    assert!(matches(&store, &model), "{}", diff(&store, &model));
    let report = store.recovery_report();
    assert_eq!(report.snapshot.as_ref().map(|s| s.position), Some(5));
    assert_eq!(report.records_replayed, 41);
    assert_eq!(report.torn_bytes_dropped(), 0);
}

/// The entries of a snapshot, each as its bytes, sorted: split by an
/// independent reading of docs/format.md, so this also checks the document.
fn snapshot_entries(file: &[u8]) -> Vec<Vec<u8>> {
    let count = u64::from_le_bytes(file[24..32].try_into().unwrap()) as usize;
    let body_len = u64::from_le_bytes(file[32..40].try_into().unwrap()) as usize;
    assert_eq!(file.len(), 48 + body_len + 4);
    let body = &file[48..48 + body_len];
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let start = at;
        at += match body[at] {
            0 => 1 + 8,
            1 => 1 + 2 + u16::from_le_bytes(body[at + 1..at + 3].try_into().unwrap()) as usize,
            k => panic!("id kind {k}"),
        };
        at += 4 + 2 + 4; // partition, epoch, last sequence
        let batches = body[at];
        at += 1;
        for _ in 0..batches {
            at += 4 + 4;
            at += 1 + if body[at] == 1 { 16 } else { 0 };
        }
        out.push(body[start..at].to_vec());
    }
    assert_eq!(out.len(), count);
    out.sort();
    out
}

#[test]
fn the_first_bytes_are_as_documented() {
    // docs/format.md walks through these bytes.
    let seg = std::fs::read(Path::new(GOLDEN).join("00000000000000000000.wal")).unwrap();
    assert_eq!(&seg[..8], b"PSTATWAL");
    assert_eq!(&seg[8..12], &[1, 0, 0, 0]); // version 1, flags 0
    assert_eq!(&seg[12..20], &0u64.to_le_bytes()); // first position
    // First record: CRC, 31 bytes, numeric single-sequence (kind 1), 42/0/0/0.
    let seed = crc32c::crc32c(&0u64.to_le_bytes());
    assert_eq!(
        &seg[24..28],
        &crc32c::crc32c_append(seed, &seg[28..55]).to_le_bytes()
    );
    assert_eq!(&seg[28..32], &31u32.to_le_bytes());
    assert_eq!(&seg[32..36], &0u32.to_le_bytes()); // offset within its write
    assert_eq!(seg[36], 1);
    assert_eq!(&seg[37..45], &42u64.to_le_bytes());
    assert_eq!(&seg[45..55], &[0u8; 10]); // partition 0, epoch 0, sequence 0
    let snap = std::fs::read(Path::new(GOLDEN).join("00000000000000000005.snap")).unwrap();
    assert_eq!(&snap[..8], b"PSTATSNP");
    assert_eq!(&snap[16..24], &5u64.to_le_bytes()); // position
    assert_eq!(&snap[24..32], &3u64.to_le_bytes()); // entries
    let crc = crc32c::crc32c(&snap[..snap.len() - 4]);
    assert_eq!(&snap[snap.len() - 4..], &crc.to_le_bytes());
}
