//! The inspect-snapshot tool, run as a real process (the binary
//! `cargo test` builds), on committed fixtures and on stores made, crashed
//! and damaged on purpose: its text, its JSON and its exit codes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{files, json, run, s, tool};

use producer_state::{Batch, ProducerStateStore, StoreOptions};
use serde_json::Value;

/// The string `field` of each element of the JSON array `v`.
fn strs<'a>(v: &'a Value, field: &str) -> Vec<&'a str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|e| {
            e[field]
                .as_str()
                .unwrap_or_else(|| panic!("no {field}: {e}"))
        })
        .collect()
}

/// A store with a few producers, closed cleanly.
fn store(dir: &Path, opts: StoreOptions) {
    let st = ProducerStateStore::open_with(dir, opts).unwrap();
    for p in 0..4 {
        for i in 0..30 {
            st.append_batch(
                100u64 + p,
                0,
                1,
                Batch::new(i * 2, i * 2 + 1, i64::from(i) * 10, 1_700_000_000_000),
            )
            .unwrap();
        }
    }
    st.append("p1", 7, 0, 0).unwrap();
    st.close().unwrap();
}

#[test]
fn a_clean_store_lists_its_files_and_state_and_verifies() {
    let d = tempfile::tempdir().unwrap();
    store(
        d.path(),
        StoreOptions::default().snapshot_every_records(Some(50)),
    );
    let (code, out, err) = run(&[s(d.path())]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("verdict:   OK, every checksum verifies"),
        "{out}"
    );
    assert!(out.contains("recovery (dry run: nothing written, no lock taken)"));
    assert!(out.contains("-> 5 keys"));
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("10") || l.starts_with("p1"))
        .collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(
        rows[0].starts_with("100") && rows[4].starts_with("p1"),
        "sorted by producer: {rows:?}"
    );
    assert!(
        rows[0].contains("2023-11-14 22:13:20.000 UTC"),
        "timestamps as UTC: {}",
        rows[0]
    );

    let (code, v) = json(&[s(d.path())]);
    assert_eq!(code, 0);
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["kind"], "store");
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["entry_count"], 5);
    assert_eq!(v["recovery"]["would_open"], true);
    // One segment from position 0: recovery would seek past every record
    // the snapshot covers, and read none of them.
    let seek = &v["recovery"]["seek"];
    assert_eq!(seek["fallback"], serde_json::Value::Null, "{v}");
    assert_eq!(
        seek["records_not_read"], v["recovery"]["snapshot"]["position"],
        "{v}"
    );
    assert_eq!(v["recovery"]["records_read_not_replayed"], 0, "{v}");
    assert!(out.contains("would seek to byte "), "{out}");
    assert_eq!(v["entries"].as_array().unwrap().len(), 5);
    assert_eq!(
        v["entries"][0]["retained_batches"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert!(
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "snapshot")
    );

    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""));

    // Filters.
    let (_, v) = json(&[s(d.path()), "--producer", "101"]);
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    let (_, v) = json(&[s(d.path()), "--producer", "p1", "--partition", "7"]);
    assert_eq!(v["entries"][0]["producer_id_kind"], "name");
    let (_, v) = json(&[s(d.path()), "--partition", "3"]);
    assert!(v["entries"].as_array().is_none_or(|e| e.is_empty()));

    // Each file on its own.
    let snap = files(d.path(), ".snap").pop().unwrap();
    let (code, v) = json(&[s(&snap)]);
    assert_eq!((code, v["kind"].as_str()), (0, Some("snapshot")));
    assert!(v["position"].as_u64().unwrap() > 0);
    let seg = files(d.path(), ".wal").pop().unwrap();
    let (code, v) = json(&[s(&seg)]);
    assert_eq!((code, v["kind"].as_str()), (0, Some("segment")));
    assert!(v["records"].as_array().is_some());
}

#[test]
fn a_live_store_is_inspected_without_its_lock() {
    let d = tempfile::tempdir().unwrap();
    let st = ProducerStateStore::open(d.path()).unwrap();
    st.append(1u64, 0, 0, 0).unwrap();
    let (code, v) = json(&[s(d.path())]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["entry_count"], 1);
    st.append(1u64, 0, 0, 1).unwrap();
}

#[test]
fn a_torn_tail_is_repairable_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    // A segment that ends at its last record (not preallocated), so that
    // the bytes added below are its tail.
    store(d.path(), StoreOptions::default().preallocate(false));
    let seg = files(d.path(), ".wal").pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let good = bytes.len();
    bytes.extend_from_slice(&[0x5a; 17]); // half a record: a torn write
    std::fs::write(&seg, &bytes).unwrap();
    let (code, out, _) = run(&[s(d.path())]);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("would truncate 17 bytes of torn tail"),
        "{out}"
    );
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 4);
    assert!(out.is_empty());
    assert!(
        err.contains(&format!(
            "repairable: {} at byte {good}: torn tail",
            seg.display()
        )),
        "{err}"
    );
    let (code, v) = json(&[s(&seg)]);
    assert_eq!((code, v["verdict"].as_str()), (4, Some("repairable")));
    assert_eq!(v["damage"][0]["offset"], good);
    // Read-only: the torn bytes are still there.
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, good + 17);
}

#[test]
fn the_dry_run_prints_the_repairs_of_recoverys_plan_in_order() {
    // Appended segments (no preallocated room), so that the torn write
    // lands right after the records: the preallocated case is below.
    let d = tempfile::tempdir().unwrap();
    store(d.path(), StoreOptions::default().preallocate(false));
    let seg = files(d.path(), ".wal").pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let good = bytes.len();
    bytes.extend_from_slice(&[0x5a; 17]); // half a record: a torn write
    std::fs::write(&seg, &bytes).unwrap();
    let tmp = d.path().join("00000000000000000099.snap.tmp");
    std::fs::write(&tmp, b"a snapshot cut off before its rename").unwrap();

    let (code, out, _) = run(&[s(d.path())]);
    assert_eq!(code, 4, "{out}");
    let remove = format!(
        "would remove {} (a leftover temporary snapshot)",
        tmp.display()
    );
    let truncate = format!(
        "would truncate 17 bytes of torn tail from {} at byte {good}",
        seg.display()
    );
    let (r, t) = (out.find(&remove), out.find(&truncate));
    assert!(
        r.is_some() && t.is_some() && r < t,
        "in the plan's order: {out}"
    );

    let (_, v) = json(&[s(d.path())]);
    let repairs = v["recovery"]["repairs"].as_array().expect("repairs");
    assert_eq!(repairs.len(), 2, "{repairs:?}");
    assert_eq!(repairs[0]["repair"], "remove_temp");
    assert_eq!(repairs[0]["file"], s(&tmp));
    assert_eq!(repairs[1]["repair"], "truncate");
    assert_eq!(repairs[1]["file"], s(&seg));
    assert_eq!(repairs[1]["len"], good);
    assert_eq!(repairs[1]["bytes"], 17);
    // Read-only: nothing was repaired.
    assert!(tmp.exists());
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, good + 17);
}

/// A store with two snapshots.
fn store_with_snapshots() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    store(
        d.path(),
        StoreOptions::default()
            .snapshot_every_records(Some(40))
            .background_snapshots(false),
    );
    d
}

#[test]
fn a_bad_snapshot_checksum_is_skipped_with_fallback() {
    let d = store_with_snapshots();
    let snaps = files(d.path(), ".snap");
    assert_eq!(snaps.len(), 2);
    let newest = snaps.last().unwrap();
    let mut b = std::fs::read(newest).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(newest, &b).unwrap();
    let (code, out, _) = run(&[s(d.path())]);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("would skip"), "{out}");
    assert!(out.contains("-> 5 keys"), "nothing lost: {out}");
    let (code, out, err) = run(&[s(newest), "--verify"]);
    assert_eq!(code, 1, "on its own the file is damaged: {out}{err}");
    // Caught by the entry check or the CRC, whichever comes first.
    assert!(
        err.starts_with(&format!("damaged: {} at byte ", newest.display())),
        "{err}"
    );
}

#[test]
fn a_snapshot_of_a_newer_version_is_refused_not_skipped() {
    let d = store_with_snapshots();
    let newest = files(d.path(), ".snap").pop().unwrap();
    // Version 9 with a header checksum that verifies: a newer build's file.
    let mut b = std::fs::read(&newest).unwrap();
    b[8..10].copy_from_slice(&9u16.to_le_bytes());
    let crc = crc32c::crc32c(&b[..40]);
    b[40..44].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&newest, &b).unwrap();
    let (code, out, _) = run(&[s(d.path())]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("unsupported: "), "{out}");
    assert!(out.contains("would REFUSE to open"), "{out}");
    let (_, v) = json(&[s(d.path())]);
    assert_eq!(v["damage"][0]["severity"], "refused");
    assert_eq!(v["recovery"]["would_open"], false);
}

#[test]
fn a_missing_segment_is_refused() {
    let d = tempfile::tempdir().unwrap();
    store(
        d.path(),
        StoreOptions::default()
            .segment_size(1024)
            .snapshot_every_records(None),
    );
    let segs = files(d.path(), ".wal");
    assert!(segs.len() >= 3);
    std::fs::remove_file(&segs[1]).unwrap();
    let (code, out, err) = run(&[s(d.path())]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("would REFUSE to open"), "{out}");
    assert!(err.contains("records missing"), "{err}");
    let (_, v) = json(&[s(d.path())]);
    assert_eq!(v["verdict"], "damaged");
    assert_eq!(v["recovery"]["would_open"], false);
}

#[test]
fn kafkas_own_snapshot_file() {
    let f = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/kafka/00000000000000000035.snapshot"
    );
    let (code, out, _) = run(&[f]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Apache Kafka producer snapshot, version 1"));
    assert!(out.contains("offset:    35"));
    let (code, v) = json(&[f]);
    assert_eq!((code, v["kind"].as_str()), (0, Some("kafka_snapshot")));
    let e = v["entries"].as_array().unwrap();
    assert_eq!(e.len(), 5);
    assert_eq!(e[1]["producer_id"], "1017");
    assert_eq!(e[1]["kafka"]["last_offset"], 5);
    assert_eq!(e[1]["retained_batches"][0]["first_sequence"], 2);
    let (_, v) = json(&[f, "--producer", "1051"]);
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    // A damaged copy.
    let d = tempfile::tempdir().unwrap();
    let copy = d.path().join("00000000000000000035.snapshot");
    let mut b = std::fs::read(f).unwrap();
    b[100] ^= 1;
    std::fs::write(&copy, &b).unwrap();
    let (code, _, err) = run(&[s(&copy), "--verify"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("at byte 2") && err.contains("checksum mismatch"),
        "{err}"
    );
}

#[test]
fn files_of_no_known_kind_never_crash_the_tool() {
    let d = tempfile::tempdir().unwrap();
    let empty = d.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let noise = d.path().join("noise.bin");
    let mut x = 0x1234_5678u64;
    let bytes: Vec<u8> = (0..10_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&noise, &bytes).unwrap();
    for f in [&empty, &noise] {
        let (code, out, err) = run(&[s(f)]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("unknown"), "{out}");
        let (code, v) = json(&[s(f)]);
        assert_eq!((code, v["kind"].as_str()), (1, Some("unknown")));
    }
    // Random bytes under a store file's name: a clear error, not a panic.
    for name in [
        "00000000000000000000.wal",
        "00000000000000000000.snap",
        "00000000000000000000.snapshot",
    ] {
        let p = d.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let (code, _, err) = run(&[s(&p), "--verify"]);
        assert_eq!(code, 1, "{name}: {err}");
        assert!(err.starts_with("damaged: "), "{name}: {err}");
        std::fs::remove_file(&p).unwrap();
    }
    // A directory of unrelated files: no store there (tests/places.rs).
    let (code, _, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 5);
    assert!(err.starts_with("no_store: "), "{err}");
    // A path that does not exist.
    let (code, _, err) = run(&[s(&d.path().join("nope"))]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot read"));
}

#[test]
fn help_explains_every_option() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for w in [
        "--json",
        "--verify",
        "--producer",
        "--partition",
        "--all",
        "--limit",
        "--now",
        "--transaction-max-timeout-ms",
        "Exit codes",
        "5 no store here",
    ] {
        assert!(out.contains(w), "{w}: {out}");
    }
    let (code, _, err) = run(&["--bogus"]);
    assert_eq!(code, 2, "{err}");
}

/// A store with enough keys that any listing of it overflows a pipe's
/// buffer (64 KiB) many times over.
fn big_store(dir: &Path) {
    let st = ProducerStateStore::open_with(
        dir,
        StoreOptions::default()
            .fsync(producer_state::FsyncPolicy::Never)
            .snapshot_every_records(Some(3000))
            .background_snapshots(false),
    )
    .unwrap();
    for k in 0..4000u64 {
        st.append_batch(k, 0, 0, Batch::new(0, 1, k as i64, 1_700_000_000_000))
            .unwrap();
    }
    st.close().unwrap();
}

/// Runs the tool with stdout a pipe that is closed after one line.
fn run_reading_one_line(args: &[&str]) -> (Option<i32>, String) {
    use std::io::BufRead;
    let mut child = Command::new(tool())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    assert!(!line.is_empty(), "{args:?}: the tool printed nothing");
    // The reader is dropped here: the pipe's read end closes.
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    let d = tempfile::tempdir().unwrap();
    big_store(d.path());
    let snap = files(d.path(), ".snap").pop().unwrap();
    let seg = files(d.path(), ".wal").pop().unwrap();
    for args in [
        vec![s(d.path())],
        vec![s(d.path()), "--json"],
        vec![s(&snap)],
        vec![s(&snap), "--json"],
        vec![s(&seg)],
    ] {
        let (code, err) = run_reading_one_line(&args);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_ne!(code, Some(101), "{args:?}: {err}");
        // Exits with the verdict (the store is clean), not killed.
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
}

/// Runs the tool with its address space limited to `mib` MiB.
fn run_limited(mib: u64, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {} && exec \"$0\" \"$@\"", mib * 1024))
        .arg(tool())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A sparse file: `head` then a hole up to `len` bytes.
fn sparse(path: &Path, head: &[u8], len: u64) {
    let f = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut &f, head).unwrap();
    f.set_len(len).unwrap();
}

#[test]
fn a_sparse_file_claiming_gigabytes_is_corruption_within_a_memory_limit() {
    let d = tempfile::tempdir().unwrap();
    // A snapshot header that verifies, claiming a 4 GiB body; the file's
    // length agrees (a hole of zeros), so only reading can tell.
    let body: u64 = 4 << 30;
    let mut h = Vec::new();
    h.extend_from_slice(b"PSTATSNP");
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&[0; 6]);
    h.extend_from_slice(&0u64.to_le_bytes()); // position
    h.extend_from_slice(&(body / 20).to_le_bytes()); // entries
    h.extend_from_slice(&body.to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(&[0; 4]);
    let snap = d.path().join("00000000000000000000.snap");
    sparse(&snap, &h, 48 + body + 4);
    // A Kafka snapshot claiming as many entries as its length allows.
    let count = ((4u64 << 30) / 46) as u32;
    let mut k = vec![0, 1, 0, 0, 0, 0];
    k.extend_from_slice(&count.to_be_bytes());
    let kafka = d.path().join("00000000000000000000.snapshot");
    sparse(&kafka, &k, 10 + 46 * u64::from(count));
    for f in [&snap, &kafka] {
        for extra in [None, Some("--json"), Some("--verify")] {
            let mut args = vec![s(f)];
            args.extend(extra);
            let (code, out, err) = run_limited(256, &args);
            assert_eq!(code, Some(1), "{args:?}: {out}{err}");
            assert!(
                err.starts_with(&format!("damaged: {}", f.display())),
                "{args:?}: {err}"
            );
            assert!(!err.contains("memory allocation"), "{args:?}: {err}");
        }
    }
}

/// A store with two kept snapshots and small segments: the newest
/// snapshot's position, and the segments in order.
fn store_with_kept_log(dir: &Path) -> (u64, Vec<PathBuf>) {
    store(
        dir,
        StoreOptions::default()
            .segment_size(1024)
            .snapshot_every_records(Some(40))
            .background_snapshots(false),
    );
    let snaps = files(dir, ".snap");
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    let pos = |p: &Path| -> u64 {
        p.file_name().unwrap().to_str().unwrap()[..20]
            .parse()
            .unwrap()
    };
    (pos(snaps.last().unwrap()), files(dir, ".wal"))
}

#[test]
fn damage_in_the_kept_log_a_fallback_needs_reaches_the_verdict() {
    let d = tempfile::tempdir().unwrap();
    let (newest, segs) = store_with_kept_log(d.path());
    let pos = |p: &Path| -> u64 {
        p.file_name().unwrap().to_str().unwrap()[..20]
            .parse()
            .unwrap()
    };
    // The segment the newest snapshot's replay starts in, and the one
    // before it: recovery does not read that one now, a fallback would.
    let at = segs.iter().rposition(|p| pos(p) <= newest).unwrap();
    assert!(at >= 1, "{segs:?}");
    let before = &segs[at - 1];
    let len = std::fs::metadata(before).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(before)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 4, "the store opens, but damaged: {out}{err}");
    assert!(err.contains(&before.display().to_string()), "{err}");
    let (code, v) = json(&[s(d.path())]);
    assert_eq!((code, v["verdict"].as_str()), (4, Some("repairable")));
    assert_eq!(v["recovery"]["would_open"], true);
    // Without the newest snapshot recovery needs that segment, and refuses.
    std::fs::remove_file(files(d.path(), ".snap").pop().unwrap()).unwrap();
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(ProducerStateStore::open(d.path()).is_err());
}

#[test]
fn files_recovery_does_not_read_do_not_decide_the_verdict() {
    let d = tempfile::tempdir().unwrap();
    store(d.path(), StoreOptions::default());
    // Damaged bytes under names recovery does not read: Kafka's snapshot
    // name, and a name that merely ends in `.snap`.
    for name in ["00000000000000000001.snapshot", "notes.snap", "x.wal"] {
        std::fs::write(d.path().join(name), b"\0\x01garbage garbage garbage").unwrap();
    }
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 0, "recovery opens this store: {out}{err}");
    let (code, v) = json(&[s(d.path())]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("ok")));
    let listed = strs(&v["files"], "name");
    assert!(
        listed.contains(&"notes.snap"),
        "listed, as ignored: {listed:?}"
    );
    // And recovery agrees.
    ProducerStateStore::open(d.path()).unwrap().close().unwrap();
}

#[test]
fn a_symlinked_segment_is_read_and_a_store_name_that_is_not_a_file_refused() {
    // The newest segment moved out of the directory and linked back: the
    // tool reads it through the link, like recovery, instead of passing
    // over it (which would report a store that forgets its last appends).
    let d = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    store(d.path(), StoreOptions::default().segment_size(1024));
    let segs = files(d.path(), ".wal");
    assert!(segs.len() >= 2, "{segs:?}");
    let newest = segs.last().unwrap();
    let name = newest.file_name().unwrap().to_str().unwrap().to_owned();
    let moved = elsewhere.path().join(&name);
    std::fs::rename(newest, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, newest).unwrap();
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, v) = json(&[s(d.path())]);
    let file = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed: {v}"));
    assert_eq!(file["kind"], "segment", "{file}");
    assert!(file["entries"].as_u64().unwrap() > 0, "{file}");
    // Recovery's dry run reads through the link: every append of the
    // history (4 producers x 30 batches, and one more).
    assert_eq!(v["recovery"]["next_position"], 121, "{v}");
    // A dangling link under a store name: refused, naming it.
    std::fs::remove_file(&moved).unwrap();
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        format!("{out}{err}").contains(&name),
        "the refusal names the entry: {out}{err}"
    );
}

#[test]
fn bytes_after_a_preallocated_segments_room_are_a_torn_tail_not_a_crash_of_the_tool() {
    // A preallocated segment ends in zeros; bytes written after them (a
    // torn write past the room) once made the scan read behind its
    // window and panic (exit 101).
    let d = tempfile::tempdir().unwrap();
    store(d.path(), StoreOptions::default());
    let seg = files(d.path(), ".wal").pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let room = bytes.len();
    bytes.extend_from_slice(&[0x5a; 17]);
    std::fs::write(&seg, &bytes).unwrap();
    let (code, out, err) = run(&[s(d.path())]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.contains("torn tail"), "{out}");
    // Recovery cuts at the end of the records, zeros and bytes after them.
    let st = ProducerStateStore::open(d.path()).unwrap();
    let torn = st.recovery_report().torn_tail.clone().expect("a torn tail");
    assert!(torn.offset < room as u64, "{torn:?}");
    assert_eq!(st.get("p1", 7).map(|e| e.last_sequence()), Some(0));
    st.close().unwrap();
}

#[test]
fn a_snapshot_is_shown_with_the_version_its_header_states() {
    // This build writes snapshot version 6 (with its log point); the
    // committed golden file of version 1 must still say 1.
    let d = tempfile::tempdir().unwrap();
    store(
        d.path(),
        StoreOptions::default().snapshot_every_records(Some(50)),
    );
    let snap = files(d.path(), ".snap").pop().unwrap();
    let (code, out, _) = run(&[s(&snap)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("producer-state snapshot, version 6"), "{out}");
    assert!(out.contains("log point: byte "), "{out}");
    let v1 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/golden/snapshot-v1/00000000000000000040.snap"
    );
    let (code, v) = json(&[v1]);
    assert_eq!((code, v["version"].as_u64()), (0, Some(1)), "{v}");
    let v3 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/golden/snapshot-v3/00000000000000000040.snap"
    );
    let (code, v) = json(&[v3]);
    assert_eq!((code, v["version"].as_u64()), (0, Some(3)), "{v}");
}

#[test]
fn a_segment_shows_its_lifecycle_records() {
    // The committed version-5 store holds every kind of lifecycle record.
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/store-v5");
    let ops = |name: &str| -> Vec<String> {
        let (code, v) = json(&[&format!("{golden}/{name}")]);
        assert_eq!(code, 0, "{v}");
        strs(&v["records"], "op")
            .into_iter()
            .map(str::to_string)
            .collect()
    };
    let mid = ops("00000000000000000038.wal");
    assert!(
        mid.iter().any(|o| o == "clock") && mid.iter().any(|o| o == "expired"),
        "{mid:?}"
    );
    let last = ops("00000000000000000063.wal");
    for op in [
        "evicted",
        "accepted-unknown",
        "group",
        "partition-removed",
        "key-state",
        "truncated",
        "append",
    ] {
        assert!(last.iter().any(|o| o == op), "{op} not in {last:?}");
    }
    // Filtered by producer: only that key's records, none of the store's.
    let (code, v) = json(&[
        &format!("{golden}/00000000000000000063.wal"),
        "--producer",
        "77",
    ]);
    assert_eq!(code, 0);
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 2, "{v}");
    assert!(recs.iter().all(|r| r["producer_id"] == "77"));
    assert_eq!(recs[1]["op"], "truncated");
    // The table shows the operation and what a group does.
    let (code, out, _) = run(&[&format!("{golden}/00000000000000000063.wal")]);
    assert_eq!(code, 0);
    assert!(out.contains("truncate to offset 68"), "{out}");
    assert!(out.contains("OP"), "{out}");
}

/// A `Semantics::Kafka` store (the committed golden one): the dry run and
/// its snapshot show every key, side-table keys with their transaction and
/// coordinator epoch, and the aborted transactions; its segments show the
/// transaction records.
#[test]
fn a_kafka_mode_store_shows_its_transactions() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/golden/store-kafka-v5"
    );
    let (code, v) = json(&[dir]);
    assert_eq!(code, 0, "{v}");
    let e = v["entries"].as_array().unwrap();
    assert_eq!(e.len(), 6, "compact and side-table keys");
    let seven = e.iter().find(|e| e["producer_id"] == "7").unwrap();
    assert_eq!(seven["kafka"]["current_txn_first_offset"], 12);
    assert_eq!(seven["kafka"]["coordinator_epoch"], 3);
    assert_eq!(seven["retained_batches"].as_array().unwrap().len(), 3);
    let aborted = v["aborted_transactions"].as_array().unwrap();
    assert_eq!(aborted.len(), 1);
    assert_eq!(
        (&aborted[0]["producer_id"], &aborted[0]["first_offset"]),
        (&Value::from("7"), &Value::from(8))
    );
    let (code, out, _) = run(&[dir, "--producer", "tx-named"]);
    assert_eq!(code, 0);
    assert!(out.contains("COORD EPOCH"), "{out}");
    assert!(!out.contains("aborted transactions"), "filtered: {out}");

    let snap = format!("{dir}/00000000000000000012.snap");
    let (code, out, _) = run(&[&snap]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(and 3 keys in the Kafka section)"), "{out}");
    let (_, v) = json(&[&snap]);
    assert_eq!(v["entries"].as_array().unwrap().len(), 5);
    assert_eq!(v["kafka_section_keys"], 3);
    assert_eq!(v["aborted_transactions"].as_array().unwrap().len(), 2);

    let (code, v) = json(&[&format!("{dir}/00000000000000000000.wal")]);
    assert_eq!(code, 0);
    let ops = strs(&v["records"], "op");
    for op in ["kafka-batch", "txn-marker", "forget-aborted"] {
        assert!(ops.contains(&op), "{op}: {ops:?}");
    }
}

#[test]
fn a_kafka_truncation_lists_its_partition_state() {
    use producer_state::{AppendOptions, Marker, Origin, Semantics};
    let d = tempfile::tempdir().unwrap();
    let opts = StoreOptions::default().semantics(Semantics::Kafka);
    let st = ProducerStateStore::open_with(d.path(), opts).unwrap();
    let txn = AppendOptions::client().transactional().verified();
    // Producer 5 aborts a transaction at 0..=2; producer 6 opens one at 3
    // and appends again at 5; producer 7 is plain.
    st.append_with(5u64, 2, 1, Batch::new(0, 1, 0, 1_000), txn)
        .unwrap();
    st.append_marker(5u64, 2, 1, Marker::abort(4, 2, 1_001), Origin::Coordinator)
        .unwrap();
    st.append_with(6u64, 2, 0, Batch::new(0, 1, 3, 1_002), txn)
        .unwrap();
    st.append_batch(7u64, 2, 0, Batch::new(0, 0, 4, 1_003))
        .unwrap();
    st.append_with(6u64, 2, 0, Batch::new(2, 2, 5, 1_004), txn)
        .unwrap();
    // Cut the second batch of producer 6: the partition is set again.
    st.truncate_to(5).unwrap();
    st.close().unwrap();
    let mut recs = Vec::new();
    for wal in files(d.path(), "wal") {
        let (code, v) = json(&[s(&wal)]);
        assert_eq!(code, 0, "{v}");
        recs.extend(v["records"].as_array().unwrap().iter().cloned());
    }
    let ops: Vec<&str> = recs.iter().map(|r| r["op"].as_str().unwrap()).collect();
    let at = ops
        .iter()
        .position(|o| *o == "partition-state")
        .unwrap_or_else(|| panic!("no partition-state in {ops:?}"));
    assert_eq!(ops[at - 1], "group", "{ops:?}");
    assert!(
        recs[at - 1]["detail"]
            .as_str()
            .unwrap()
            .contains("truncate to offset 5")
    );
    assert_eq!(recs[at]["partition"], 2);
    assert!(
        recs[at]["detail"]
            .as_str()
            .unwrap()
            .contains("dropped, then 2 side-table key(s), 1 aborted transaction(s)"),
        "{}",
        recs[at]
    );
    // The side-table keys, by id: 5 (the aborted one), 6 (still open, its
    // first batch only).
    let keys: Vec<&Value> = recs
        .iter()
        .filter(|r| r["op"] == "kafka-key-state")
        .collect();
    assert_eq!(keys.len(), 2, "{recs:?}");
    assert_eq!(keys[0]["producer_id"], "5");
    assert_eq!(keys[0]["epoch"], 1);
    assert!(
        keys[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("coordinator epoch 4, no open transaction"),
        "{}",
        keys[0]
    );
    assert_eq!(keys[1]["producer_id"], "6");
    assert_eq!(
        (
            keys[1]["last_sequence"].as_i64(),
            keys[1]["offset"].as_i64()
        ),
        (Some(1), Some(3))
    );
    assert!(
        keys[1]["detail"]
            .as_str()
            .unwrap()
            .contains("open transaction from offset 3, 1 cached batch(es)"),
        "{}",
        keys[1]
    );
    let aborted: Vec<&Value> = recs.iter().filter(|r| r["op"] == "aborted-txn").collect();
    assert_eq!(aborted.len(), 1);
    assert_eq!(
        (
            aborted[0]["producer_id"].as_str(),
            aborted[0]["offset"].as_i64()
        ),
        (Some("5"), Some(0))
    );
    assert!(aborted[0]["detail"].as_str().unwrap().contains("0..=2"));
    // The plain producer follows as a key state.
    assert!(
        recs.iter()
            .any(|r| r["op"] == "key-state" && r["producer_id"] == "7"),
        "{recs:?}"
    );
    // Filtered by producer: only that key's lines of the record.
    let wal = files(d.path(), "wal").pop().unwrap();
    let (_, v) = json(&[s(&wal), "--producer", "6"]);
    let ops = strs(&v["records"], "op");
    assert!(
        ops.contains(&"kafka-key-state")
            && !ops.contains(&"partition-state")
            && !ops.contains(&"aborted-txn"),
        "{ops:?}"
    );
    // The table names the record.
    let (code, out, _) = run(&[s(&wal)]);
    assert_eq!(code, 0);
    assert!(
        out.contains("partition-state") && out.contains("open transaction from offset 3"),
        "{out}"
    );
}

/// A Kafka-mode store's hanging transactions: each partition's oldest open
/// transaction whose producer has been idle past
/// `transaction.max.timeout.ms` + 5 min at `--now` (Kafka's
/// `hasLateTransaction`), in the store and in its snapshot, in the text
/// and the JSON; none before that time, and none once a marker ends it.
#[test]
fn late_transactions_are_shown_at_the_time_asked() {
    use producer_state::{AppendOptions, Marker, Origin, Semantics};
    let dir = tempfile::tempdir().unwrap();
    let t0: i64 = 1_700_000_000_000;
    let st = ProducerStateStore::open_with(
        dir.path(),
        StoreOptions::default().semantics(Semantics::Kafka),
    )
    .unwrap();
    let txn = AppendOptions::client().transactional().verified();
    st.append_with(7u64, 3, 0, Batch::new(0, 0, 40, t0), txn)
        .unwrap();
    st.append_with(8u64, 4, 0, Batch::new(0, 0, 50, t0), txn)
        .unwrap();
    st.append_marker(8u64, 4, 0, Marker::commit(0, 51, t0), Origin::Coordinator)
        .unwrap();
    let snap = st.snapshot().unwrap().unwrap();
    st.close().unwrap();
    let late_at = (t0 + 900_000 + 300_000 + 1).to_string();
    let on_time = (t0 + 900_000 + 300_000).to_string();
    for path in [dir.path(), snap.as_path()] {
        let (code, out, err) = run(&[s(path), "--now", &late_at]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("late (hanging) transactions"), "{out}");
        let (_, v) = json(&[s(path), "--now", &late_at]);
        let late = v["late_transactions"].as_array().unwrap();
        assert_eq!(late.len(), 1, "{v}");
        assert_eq!(late[0]["partition"], 3);
        assert_eq!(late[0]["producer_id"], "7");
        assert_eq!(late[0]["first_offset"], 40);
        assert_eq!(late[0]["idle_ms"], 1_200_001);
        // A longer timeout, or an earlier time: not late.
        let (_, v) = json(&[s(path), "--now", &on_time]);
        assert!(v.get("late_transactions").is_none(), "{v}");
        let (_, v) = json(&[
            s(path),
            "--now",
            &late_at,
            "--transaction-max-timeout-ms",
            "3600000",
        ]);
        assert!(v.get("late_transactions").is_none(), "{v}");
        // The filter applies.
        let (_, v) = json(&[s(path), "--now", &late_at, "--partition", "4"]);
        assert!(v.get("late_transactions").is_none(), "{v}");
    }
}
