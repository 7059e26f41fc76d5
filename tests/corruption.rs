//! Bad bytes on disk: every truncation and every bit flip of a small log
//! and of a small snapshot either recovers a prefix of the true history
//! (and the report says what was cut) or is `Error::Corrupt`; never a
//! panic, never a state the history did not contain. Plus the named cases:
//! a bad snapshot with fallback, a missing segment, a snapshot whose log is
//! gone, leftover temporary files, and salvage.

mod common;

use std::path::PathBuf;

use common::model::Model;
use common::store_util::{dir, matches, path, workload};
use producer_state::fs::{FileSystem, SimFs};
use producer_state::{
    AppendOutcome, AppendRequest, Corruption, Error, ProducerStateStore, RecoveryMode, Salvage,
    StoreOptions,
};

fn opts(fs: &SimFs) -> StoreOptions {
    // Appended segments (version 3): the suite cuts and flips every byte
    // of a log that ends at its last record. Preallocated segments have
    // tests of their own below.
    common::store_util::sim_opts(fs)
        .snapshot_every_records(None)
        .preallocate(false)
}

/// The model after each prefix of the accepted appends.
fn prefixes(reqs: &[AppendRequest]) -> Vec<Model> {
    let mut m = Model::default();
    let mut out = vec![m.clone()];
    for r in reqs {
        if m.append(r).is_accepted() {
            out.push(m.clone());
        }
    }
    out
}

fn build(reqs: &[AppendRequest], o: impl Fn(&SimFs) -> StoreOptions) -> SimFs {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), o(&fs)).unwrap();
    for r in reqs {
        s.append_request(r).unwrap();
    }
    s.close().unwrap();
    fs
}

/// As [`build`], but in `append_all` calls of 8 requests: numeric
/// single-sequence appends in a row then share a record.
fn build_packed(reqs: &[AppendRequest]) -> SimFs {
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    for chunk in reqs.chunks(8) {
        for r in s.append_all(chunk) {
            r.unwrap();
        }
    }
    s.close().unwrap();
    fs
}

/// The two ways of writing a log: one record per append, and packed.
fn both_builds(reqs: &[AppendRequest]) -> [(&'static str, SimFs); 2] {
    [
        ("one append per record", build(reqs, opts)),
        ("packed", build_packed(reqs)),
    ]
}

/// Record boundaries of a segment (the header's end, then each record's
/// end, per its length field) and the appends before each: a kind-1
/// record holds (length - header) / 18 of them, a close marker (kind 5)
/// none. Version 3 has a 40-byte segment header and 17-byte record
/// headers, versions 1 and 2 24 and 13 (docs/format.md).
fn boundaries(bytes: &[u8]) -> Vec<(usize, usize)> {
    let (head, rec) = if bytes[8] >= 3 { (40, 17) } else { (24, 13) };
    let mut out = vec![(head, 0usize)];
    while out.last().unwrap().0 < bytes.len() {
        let (at, n) = *out.last().unwrap();
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let appends = match bytes[at + rec - 1] {
            1 => (len - rec) / 18,
            5 => 0,
            _ => 1,
        };
        out.push((at + len, n + appends));
    }
    assert_eq!(out.last().unwrap().0, bytes.len());
    out
}

fn files(fs: &SimFs, ext: &str) -> Vec<PathBuf> {
    fs.files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect()
}

/// Opens `fs` strictly, which must refuse, then with
/// [`RecoveryMode::Salvage`], which must open it and report a salvage:
/// the refusal, the salvaged store and what it discarded.
fn refused_then_salvaged(fs: &SimFs) -> (Error, ProducerStateStore, Salvage) {
    let Err(err) = ProducerStateStore::open_with(dir(), opts(fs)) else {
        panic!("a strict open refuses");
    };
    let s = ProducerStateStore::open_with(dir(), opts(fs).recovery(RecoveryMode::Salvage)).unwrap();
    let salvage = s.recovery_report().salvage.clone().expect("reported");
    (err, s, salvage)
}

/// Opens `fs` and checks the outcome: a prefix of the history, or Corrupt.
/// Returns the index of the prefix recovered, if any.
fn check(fs: &SimFs, history: &[Model], what: &str) -> Option<usize> {
    match ProducerStateStore::open_with(dir(), opts(fs)) {
        Ok(s) => {
            let i = history.iter().position(|m| matches(&s, m));
            assert!(
                i.is_some(),
                "{what}: recovered a state that is not a prefix of the history"
            );
            i
        }
        Err(e) => {
            assert!(e.is_corruption(), "{what}: {e}");
            None
        }
    }
}

#[test]
fn truncating_the_log_at_every_byte_recovers_the_longest_complete_prefix() {
    let reqs = workload(40);
    let history = prefixes(&reqs);
    for (how, fs) in both_builds(&reqs) {
        truncate_everywhere(&fs, &history, how);
    }
}

fn truncate_everywhere(fs: &SimFs, history: &[Model], how: &str) {
    let seg = files(fs, ".wal").remove(0);
    let bytes = fs.read_file(&seg).unwrap();
    let boundaries = boundaries(&bytes);
    if how == "packed" {
        assert!(
            boundaries.len() - 1 < history.len() - 1,
            "some records hold several appends"
        );
    }
    let mut last = 0;
    for cut in 0..=bytes.len() {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        t.overwrite(&seg, &bytes[..cut]);
        let s = ProducerStateStore::open_with(dir(), opts(&t)).unwrap_or_else(|e| {
            panic!("{how}, cut at {cut}: a truncation is a torn tail, not {e}")
        });
        let got = history
            .iter()
            .position(|m| matches(&s, m))
            .expect("a prefix");
        assert!(
            got >= last,
            "cut at {cut}: recovered less than a shorter cut"
        );
        last = got;
        // The report says exactly what was cut.
        let r = s.recovery_report();
        if cut < 40 {
            assert_eq!(r.files_removed, vec![seg.clone()], "cut at {cut}");
        } else {
            let (kept, appends) = boundaries
                .iter()
                .copied()
                .filter(|&(b, _)| b <= cut)
                .max()
                .unwrap();
            assert_eq!(
                r.torn_bytes_dropped() as usize,
                cut - kept,
                "{how}, cut at {cut}"
            );
            assert_eq!(got, appends, "{how}, cut at {cut}");
        }
    }
    assert_eq!(last, history.len() - 1);
}

#[test]
fn flipping_every_bit_of_a_log_is_a_prefix_or_corrupt() {
    let reqs = workload(12);
    let history = prefixes(&reqs);
    for (how, fs) in both_builds(&reqs) {
        let seg = files(&fs, ".wal").remove(0);
        let bytes = fs.read_file(&seg).unwrap();
        let (mut prefix, mut corrupt) = (0, 0);
        for bit in 0..bytes.len() * 8 {
            let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            t.overwrite(&seg, &b);
            match check(&t, &history, &format!("{how}, bit {bit}")) {
                Some(_) => prefix += 1,
                None => corrupt += 1,
            }
        }
        // Flips in the last record are torn tails; the rest is refused.
        assert!(
            prefix > 0 && corrupt > 0,
            "{how}: {prefix} prefixes, {corrupt} refusals"
        );
    }
}

#[test]
fn flipping_every_bit_of_a_snapshot_falls_back_and_loses_nothing() {
    let reqs = workload(30);
    let history = prefixes(&reqs);
    let full = history.len() - 1;
    let fs = build(&reqs, |f| opts(f).snapshot_every_records(Some(10)));
    let snaps = files(&fs, ".snap");
    assert_eq!(snaps.len(), 2);
    let newest = snaps.last().unwrap().clone();
    let bytes = fs.read_file(&newest).unwrap();
    assert_eq!(&bytes[8..10], &[6, 0], "the current snapshot version");
    // Windows of several batches, so flips land in spans and deltas too.
    assert!(
        bytes[48..].iter().any(|&shape| shape & 7 >= 3),
        "some key retains several batches"
    );
    for bit in 0..bytes.len() * 8 {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        t.overwrite(&newest, &b);
        let s = ProducerStateStore::open_with(dir(), opts(&t))
            .unwrap_or_else(|e| panic!("bit {bit}: {e}"));
        assert!(matches(&s, &history[full]), "bit {bit}");
        let r = s.recovery_report();
        assert_eq!(
            r.skipped_snapshots.len(),
            1,
            "bit {bit}: the report says it fell back"
        );
        assert_ne!(
            r.snapshot.as_ref().map(|u| u.file.clone()),
            Some(newest.clone())
        );
    }
}

#[test]
fn truncating_a_snapshot_anywhere_falls_back_and_loses_nothing() {
    let reqs = workload(30);
    let history = prefixes(&reqs);
    let full = history.len() - 1;
    let fs = build(&reqs, |f| opts(f).snapshot_every_records(Some(10)));
    let newest = files(&fs, ".snap").last().unwrap().clone();
    let bytes = fs.read_file(&newest).unwrap();
    assert_eq!(&bytes[8..10], &[6, 0], "the current snapshot version");
    for cut in 0..bytes.len() {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        t.overwrite(&newest, &bytes[..cut]);
        let s = ProducerStateStore::open_with(dir(), opts(&t))
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert!(matches(&s, &history[full]), "cut {cut}");
        assert_eq!(s.recovery_report().skipped_snapshots.len(), 1, "cut {cut}");
    }
}

#[test]
fn a_missing_segment_in_the_middle_is_corrupt_and_salvage_keeps_the_prefix() {
    let reqs = workload(200);
    let history = prefixes(&reqs);
    let fs = build(&reqs, |f| opts(f).segment_size(1024));
    let segs = files(&fs, ".wal");
    assert!(segs.len() >= 4, "{segs:?}");
    fs.delete(&segs[2]);
    let (err, s, salvage) = refused_then_salvaged(&fs);
    assert!(
        matches!(
            &err,
            Error::Corrupt {
                kind: Corruption::MissingRecords { .. },
                ..
            }
        ),
        "{err}"
    );
    // Salvage keeps the history up to the gap and moves the rest aside.
    let i = history
        .iter()
        .position(|m| matches(&s, m))
        .expect("a prefix");
    assert!(i > 0 && i < history.len() - 1);
    assert!(
        salvage.cause.to_string().contains("records missing"),
        "{}",
        salvage.cause
    );
    assert!(!salvage.discarded.is_empty() && salvage.bytes > 0);
    assert!(fs.read_file(&salvage.discarded[0]).is_some());
    // Appends continue and a strict reopen accepts the salvaged directory.
    let mut m = history[i].clone();
    let next = AppendRequest::single("after-salvage", 0, 0, 0);
    assert!(s.append_request(&next).unwrap().is_accepted());
    m.append(&next);
    drop(s);
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert!(matches(&s, &m));
}

/// Found by a mutation audit: nothing damaged the end of a segment that
/// has later segments, so cutting it as if it were a torn tail (and
/// losing every later segment) went unnoticed. Only the last segment can
/// be torn; a shortened or zeroed end anywhere else is corruption.
#[test]
fn a_damaged_end_of_a_segment_that_is_not_the_last_is_corrupt() {
    let reqs = workload(200);
    let history = prefixes(&reqs);
    for (how, cut) in [("shortened", true), ("zeroed", false)] {
        let fs = build(&reqs, |f| opts(f).segment_size(1024));
        let segs = files(&fs, ".wal");
        assert!(segs.len() >= 3, "{segs:?}");
        let mut b = fs.read_file(&segs[1]).unwrap();
        let end = b.len();
        if cut {
            b.truncate(end - 7);
        } else {
            b[end - 7..].fill(0);
        }
        fs.overwrite(&segs[1], &b);
        let (err, s, salvage) = refused_then_salvaged(&fs);
        assert!(
            matches!(&err, Error::Corrupt { file, .. } if *file == segs[1]),
            "{how}: {err}"
        );
        // Salvage keeps a prefix that ends in that segment, and says so.
        let i = history
            .iter()
            .position(|m| matches(&s, m))
            .expect("a prefix");
        assert!(i < history.len() - 1, "{how}: nothing was lost?");
        assert!(salvage.discarded.len() >= 2, "{how}: {salvage:?}");
    }
}

#[test]
fn damage_in_the_middle_of_the_log_is_corrupt_with_file_and_offset() {
    let reqs = workload(50);
    let history = prefixes(&reqs);
    let fs = build(&reqs, opts);
    let seg = files(&fs, ".wal").remove(0);
    let mut b = fs.read_file(&seg).unwrap();
    b[40 + 35 * 3 + 20] ^= 0xff;
    fs.overwrite(&seg, &b);
    let (err, s, _) = refused_then_salvaged(&fs);
    match err {
        Error::Corrupt { file, offset, kind } => {
            assert_eq!(file, seg);
            assert!((40..40 + 35 * 6).contains(&offset), "{offset}");
            assert_eq!(kind, Corruption::DamagedMidLog);
        }
        e => panic!("{e}"),
    }
    let i = history
        .iter()
        .position(|m| matches(&s, m))
        .expect("a prefix");
    assert!(i < history.len() - 1);
}

/// A found bug: when a snapshot's position fell inside a packed record
/// and an append after it did not apply, salvage cut the log before the
/// record but had the writer count the record's appends before the
/// snapshot as still there; the next appends were then numbered into the
/// snapshot's past and silently skipped by the following recovery.
#[test]
fn salvage_from_a_snapshot_inside_a_packed_record_loses_no_later_append() {
    // Log: one packed record, key 1 at sequences 0..9 (positions 0..9).
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let reqs: Vec<_> = (0..10)
        .map(|i| AppendRequest::single(1u64, 0, 0, i))
        .collect();
    for o in s.append_all(&reqs) {
        assert!(o.unwrap().is_accepted());
    }
    s.close().unwrap();
    // A snapshot at position 5 that does not belong to it: key 1 at
    // sequence 3, so the append at position 5 (sequence 5) does not apply.
    let other = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&other)).unwrap();
    for i in 0..4 {
        s.append(1u64, 0, 0, i).unwrap();
    }
    s.append(9u64, 0, 0, 0).unwrap();
    let snap = s.snapshot().unwrap().unwrap();
    s.close().unwrap();
    fs.overwrite(&snap, &other.read_file(&snap).unwrap());

    let (e, s, _) = refused_then_salvaged(&fs);
    assert!(
        matches!(
            e,
            Error::Corrupt {
                offset: 40,
                kind: Corruption::RecordDoesNotApply { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(s.get(1u64, 0).unwrap().last_sequence(), 3);
    let more: Vec<(u64, i32)> = [(1, 4), (1, 5), (7, 0)]
        .into_iter()
        .chain((100..105).map(|k| (k, 0)))
        .collect();
    for &(k, seq) in &more {
        assert_eq!(s.append(k, 0, 0, seq).unwrap(), AppendOutcome::Accepted);
    }
    s.close().unwrap();
    // Every append acknowledged after the salvage is there.
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert_eq!(s.get(1u64, 0).unwrap().last_sequence(), 5);
    assert_eq!(s.get(9u64, 0).unwrap().last_sequence(), 0);
    for &(k, seq) in &more[2..] {
        assert_eq!(s.get(k, 0).map(|e| e.last_sequence()), Some(seq), "key {k}");
    }
}

/// A found bug: salvage moved a segment whose header disagrees with its
/// name aside, but only after replay had applied its records, so keys
/// from another log stayed in the state.
#[test]
fn a_segment_of_another_log_is_refused_and_salvage_keeps_none_of_it() {
    let small = |fs: &SimFs| opts(fs).segment_size(1024);
    let ours = build(
        &(0..40u64)
            .map(|k| AppendRequest::single(k, 0, 0, 0))
            .collect::<Vec<_>>(),
        small,
    );
    let theirs = build(
        &(1000..1040u64)
            .map(|k| AppendRequest::batch(k, 0, 0, producer_state::Batch::new(0, 0, 1, 1)))
            .collect::<Vec<_>>(),
        small,
    );
    let (our_logs, their_logs) = (files(&ours, "wal"), files(&theirs, "wal"));
    assert!(our_logs.len() >= 2 && their_logs.len() >= 2);
    let (last, foreign) = (our_logs.last().unwrap(), their_logs.last().unwrap());
    assert_ne!(last.file_name(), foreign.file_name());
    ours.overwrite(last, &theirs.read_file(foreign).unwrap());

    let (e, s, _) = refused_then_salvaged(&ours);
    assert!(
        matches!(
            e,
            Error::Corrupt {
                offset: 12,
                kind: Corruption::NameMismatch { .. },
                ..
            }
        ),
        "{e}"
    );
    let keys: Vec<u64> = s.iter().filter_map(|(id, _, _)| id.as_numeric()).collect();
    assert!(
        keys.iter().all(|&k| k < 40),
        "keys of the other log: {keys:?}"
    );
    // Ours up to the segment moved aside.
    let kept = keys.len() as u64;
    assert!(kept > 0);
    for k in 0..kept {
        assert!(s.get(k, 0).is_some(), "key {k}");
    }
}

/// Rewrites the `u16` version at offset 8 of the file at `path`, with
/// the header checksum (`crc_at`, over the bytes before it) recomputed:
/// a valid file of another format version.
fn set_version(fs: &SimFs, path: &std::path::Path, version: u16, crc_at: usize) {
    let mut b = fs.read_file(path).unwrap();
    b[8..10].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&b[..crc_at]);
    b[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    fs.overwrite(path, &b);
}

#[test]
fn a_file_of_a_newer_version_is_refused_even_by_salvage_and_left_alone() {
    let reqs = workload(300);
    for (what, ext, crc_at) in [("segment", "wal", 20), ("snapshot", "snap", 40)] {
        let fs = build(&reqs, |fs| {
            opts(fs)
                .segment_size(2048)
                .snapshot_every_records(Some(100))
        });
        let target = files(&fs, ext).last().cloned().unwrap();
        set_version(&fs, &target, 9, crc_at);
        let before = fs.files();
        for mode in [RecoveryMode::Strict, RecoveryMode::Salvage] {
            match ProducerStateStore::open_with(dir(), opts(&fs).recovery(mode)) {
                Err(Error::UnsupportedVersion { file, found: 9, .. }) => {
                    assert_eq!(file, target, "{what} {mode:?}")
                }
                other => panic!("{what} {mode:?}: {:?}", other.map(|_| "opened")),
            }
            assert_eq!(fs.files(), before, "{what} {mode:?}: files changed");
        }
    }
}

#[test]
fn a_snapshot_whose_log_is_gone_is_corrupt() {
    let reqs = workload(300);
    let fs = build(&reqs, |f| {
        opts(f).segment_size(1024).snapshot_every_records(Some(50))
    });
    let segs = files(&fs, ".wal");
    // Delete the segment the newest snapshot needs (and everything before).
    let snaps = files(&fs, ".snap");
    for s in &snaps {
        fs.delete(s);
    }
    let (err, s, salvage) = refused_then_salvaged(&fs);
    assert!(
        matches!(
            &err,
            Error::Corrupt {
                kind: Corruption::LogGone { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(segs.len() > 1);
    // Salvage starts over rather than invent a state from a partial log.
    assert!(s.is_empty());
    assert_eq!(salvage.discarded.len(), segs.len());
}

#[test]
fn leftover_temporary_files_are_removed_and_unknown_files_left_alone() {
    let reqs = workload(20);
    let history = prefixes(&reqs);
    let fs = build(&reqs, opts);
    fs.overwrite(&path("00000000000000000007.snap.tmp"), b"half a snapshot");
    fs.overwrite(&path("notes.txt"), b"operator notes");
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert!(matches(&s, history.last().unwrap()));
    assert_eq!(
        s.recovery_report().files_removed,
        vec![path("00000000000000000007.snap.tmp")]
    );
    assert!(
        fs.read_file(&path("00000000000000000007.snap.tmp"))
            .is_none()
    );
    assert!(fs.read_file(&path("notes.txt")).is_some());
}

#[test]
fn open_refuses_a_regular_file_and_a_locked_directory() {
    let fs = SimFs::new();
    fs.create_dir_all(&dir()).unwrap();
    fs.overwrite(&path("plain"), b"x");
    let err = ProducerStateStore::open_with(path("plain"), opts(&fs)).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
    let a = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    let err = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("close that one first"));
    drop(a);
    ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
}

#[test]
fn crafted_bytes_after_damage_cost_no_more_than_zeros() {
    // Behind the last record, 4 MiB of `ff` bytes (no offset claims a
    // record: one cheap test per byte; zeros would not do, the search
    // steps over a run of them at once), or of `03 ff 00 00` repeated:
    // then every fourth offset claims a 65,283-byte named record, which a
    // search checking each claim in full pays 64 KiB of checksum for. Both
    // are a torn tail, and both must recover in about the same time: the
    // crafted bytes at most 3 times as long (the best of five opens of
    // each, interleaved, in this run, against noise).
    const TAIL: usize = 4 << 20;
    let reqs = workload(40);
    let history = prefixes(&reqs);
    let fs = build(&reqs, opts);
    let seg = files(&fs, ".wal").pop().unwrap();
    let good = fs.read_file(&seg).unwrap();
    let open = |tail: &[u8]| {
        let mut bytes = good.clone();
        bytes.extend_from_slice(tail);
        fs.overwrite(&seg, &bytes);
        let t = std::time::Instant::now();
        let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
        let took = t.elapsed();
        let torn = s.recovery_report().torn_tail.clone().expect("a torn tail");
        assert_eq!((torn.offset, torn.bytes), (good.len() as u64, TAIL as u64));
        assert!(matches(&s, history.last().unwrap()));
        took
    };
    let zeros = vec![0xffu8; TAIL];
    let crafted = [0x03u8, 0xff, 0, 0].repeat(TAIL / 4);
    let (mut z, mut c) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        z.push(open(&zeros));
        c.push(open(&crafted));
    }
    let (z, c) = (z.into_iter().min().unwrap(), c.into_iter().min().unwrap());
    eprintln!("recovery behind {TAIL} bytes: ff bytes {z:?}, crafted {c:?}");
    assert!(
        c <= 3 * z,
        "crafted bytes took {c:?} to recover, ff bytes {z:?}: more than 3 times as long"
    );
}

#[test]
fn a_snapshot_beyond_a_damaged_log_end_is_named_and_nothing_is_cut() {
    // A snapshot at the very end of the log, then the log cut inside its
    // last record. The snapshot proves the record was durable (a snapshot
    // is written only once its log is), so this is not a torn tail: strict
    // open refuses, naming the snapshot, where it states its position,
    // and where the log ends, and cuts nothing. (The snapshot records that
    // its position lies at the end of that record; the file is shorter,
    // so recovery cannot seek there and reads the segment, which is how
    // it finds the log's end. A bit flipped in that record with the file
    // whole is damage below the seek point, which recovery does not read:
    // `tests/seek.rs`.)
    let reqs = workload(40);
    let history = prefixes(&reqs);
    let full = history.len() - 1;
    let fs = SimFs::new();
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    for r in &reqs {
        s.append_request(r).unwrap();
    }
    let snap = s.snapshot().unwrap().expect("a snapshot");
    s.close().unwrap();
    let seg = files(&fs, ".wal").pop().unwrap();
    let mut bytes = fs.read_file(&seg).unwrap();
    let bounds = boundaries(&bytes);
    // The last record that holds appends; the clean close's marker after
    // it is cut off (as after a crash), or it would prove the damaged
    // record durable by itself.
    let (last, before, end) = bounds
        .windows(2)
        .rev()
        .find(|w| w[1].1 > w[0].1)
        .map(|w| (w[0].0, w[0].1, w[1].0))
        .unwrap();
    assert!(end > last + 20);
    bytes.truncate(last + 20);
    fs.overwrite(&seg, &bytes);
    let first = segment_first(&seg);
    let before_files = fs.files();
    let (err, s, salvage) = refused_then_salvaged_keeping(&fs, &before_files);
    match &err {
        Error::Corrupt {
            file,
            offset,
            kind:
                Corruption::SnapshotBeyondLog {
                    snapshot,
                    log_end,
                    ends_in,
                },
        } => {
            assert_eq!(file, &snap);
            assert_eq!(*offset, 16, "the snapshot header's position field");
            assert_eq!(*snapshot, full as u64);
            assert_eq!(*log_end, first + before as u64);
            assert_eq!(ends_in, &Some((seg.clone(), last as u64)));
        }
        other => panic!("{other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&snap.display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("at byte {last} of {}", seg.display())),
        "{msg}"
    );
    // Salvage keeps the snapshot's state, moves the damaged record aside
    // and continues at the snapshot's position.
    assert!(matches(&s, &history[full]));
    assert_eq!(salvage.bytes, (bytes.len() - last) as u64);
    assert_eq!(s.recovery_report().next_position, full as u64);
    assert!(s.recovery_report().torn_tail.is_none());
}

/// The first position of a segment, from its name.
fn segment_first(seg: &std::path::Path) -> u64 {
    seg.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

/// As [`refused_then_salvaged`], and the strict open changed no file.
fn refused_then_salvaged_keeping(
    fs: &SimFs,
    before: &[(PathBuf, usize)],
) -> (Error, ProducerStateStore, Salvage) {
    let Err(err) = ProducerStateStore::open_with(dir(), opts(fs)) else {
        panic!("a strict open refuses");
    };
    assert_eq!(fs.files(), before, "the strict open changed files");
    let s = ProducerStateStore::open_with(dir(), opts(fs).recovery(RecoveryMode::Salvage)).unwrap();
    let salvage = s.recovery_report().salvage.clone().expect("reported");
    (err, s, salvage)
}

/// Appends of keys `keys`, one each, one record each.
fn one_each(keys: std::ops::Range<u64>) -> Vec<AppendRequest> {
    keys.map(|k| AppendRequest::single(k, 0, 0, 0)).collect()
}

/// Before format version 3 records carried no position, so removing one from the middle
/// of a segment (every checksum still valid) opened to a state that was
/// never acknowledged. Each record states its offset: what follows the
/// hole is not where it was written.
#[test]
fn a_record_removed_from_the_middle_of_a_segment_is_corrupt_at_its_offset() {
    let reqs = one_each(0..30);
    let history = prefixes(&reqs);
    let fs = build(&reqs, opts);
    let seg = files(&fs, ".wal").remove(0);
    assert_eq!(files(&fs, ".wal").len(), 1, "the last segment");
    let bytes = fs.read_file(&seg).unwrap();
    let b = boundaries(&bytes);
    let (from, to) = (b[10].0, b[11].0);
    let mut cut = bytes.clone();
    cut.drain(from..to);
    fs.overwrite(&seg, &cut);
    let (err, s, _) = refused_then_salvaged(&fs);
    match err {
        Error::Corrupt { file, offset, kind } => {
            assert_eq!((file, offset), (seg, from as u64));
            assert_eq!(
                kind,
                Corruption::MisplacedRecord {
                    written_at: to as u64
                }
            );
        }
        e => panic!("{e}"),
    }
    // Salvage keeps the ten appends before the hole.
    assert!(matches(&s, &history[10]));
}

#[test]
fn a_repeated_record_is_corrupt_before_it_is_applied() {
    let reqs = one_each(0..30);
    let fs = build(&reqs, opts);
    let seg = files(&fs, ".wal").remove(0);
    let bytes = fs.read_file(&seg).unwrap();
    let b = boundaries(&bytes);
    let (from, to) = (b[10].0, b[11].0);
    let mut twice = bytes.clone();
    twice.splice(to..to, bytes[from..to].to_vec());
    fs.overwrite(&seg, &twice);
    match ProducerStateStore::open_with(dir(), opts(&fs)) {
        Err(Error::Corrupt { file, offset, kind }) => {
            assert_eq!((file, offset), (seg, to as u64));
            assert_eq!(
                kind,
                Corruption::MisplacedRecord {
                    written_at: from as u64
                }
            );
        }
        other => panic!("{:?}", other.map(|_| "opened")),
    }
}

/// A segment of another store under the same name: its records verify
/// (they are its own) but it is not this log's. Both stores wrote the same
/// number of records of the same sizes, so the names match.
#[test]
fn a_segment_copied_from_another_store_under_the_same_name_is_corrupt() {
    let small = |fs: &SimFs| opts(fs).segment_size(1024);
    let ours = build(&one_each(0..60), small);
    let theirs = build(&one_each(1000..1060), small);
    let (our_logs, their_logs) = (files(&ours, "wal"), files(&theirs, "wal"));
    assert!(our_logs.len() >= 2);
    assert_eq!(our_logs, their_logs, "the same names");
    let last = our_logs.last().unwrap();
    ours.overwrite(last, &theirs.read_file(last).unwrap());
    let (err, s, _) = refused_then_salvaged(&ours);
    assert!(
        matches!(&err, Error::Corrupt { file, offset: 20, kind: Corruption::ForeignSegment { .. } } if file == last),
        "{err}"
    );
    let keys: Vec<u64> = s.iter().filter_map(|(id, _, _)| id.as_numeric()).collect();
    assert!(!keys.is_empty() && keys.iter().all(|&k| k < 60), "{keys:?}");
}

#[test]
fn the_report_tells_a_clean_shutdown_from_a_crash() {
    let reqs = one_each(0..20);
    let fs = build(&reqs, opts);
    let s = ProducerStateStore::open_with(dir(), opts(&fs)).unwrap();
    assert_eq!(s.recovery_report().clean_shutdown, Some(true));
    assert!(
        s.recovery_report()
            .to_string()
            .contains("previous shutdown: clean")
    );
    s.append(99u64, 0, 0, 0).unwrap();
    // A crash: the store is never closed.
    let img = fs.crash_image(producer_state::fs::Unsynced::Keep);
    drop(s);
    let s = ProducerStateStore::open_with(dir(), opts(&img)).unwrap();
    assert_eq!(s.recovery_report().clean_shutdown, Some(false));
    assert!(
        s.recovery_report()
            .to_string()
            .contains("previous shutdown: unclean")
    );
    assert!(s.get(99u64, 0).is_some());
    s.close().unwrap();
    // A new store cannot tell.
    let s = ProducerStateStore::open_with(dir(), opts(&SimFs::new())).unwrap();
    assert_eq!(s.recovery_report().clean_shutdown, None);
}

/// The options of a store whose segments are preallocated (version 4).
fn preallocated(fs: &SimFs) -> StoreOptions {
    common::store_util::sim_opts(fs).snapshot_every_records(None)
}

/// Every byte of a preallocated segment: the zeros after its last record
/// are its clean end (nothing cut, the room kept, a clean shutdown still
/// seen); any of them not zero is a torn tail cut at the last record,
/// losing nothing; every byte of the records flipped gives a prefix or a
/// refusal; and damage followed by a valid record is still refused.
#[test]
fn every_byte_of_a_preallocated_segment_is_its_records_or_room_that_must_be_zeros() {
    let reqs = workload(12);
    let history = prefixes(&reqs);
    let all = history.last().unwrap();
    let fs = build(&reqs, preallocated);
    let seg = files(&fs, ".wal").pop().unwrap();
    let bytes = fs.read_file(&seg).unwrap();
    assert_eq!(&bytes[8..12], &[6, 0, 1, 0], "version 6, preallocated");
    assert_eq!(bytes.len(), 4096, "preallocated to the segment size");
    // The records end where a length of zero is read.
    let mut end = 40;
    let mut records = Vec::new();
    while let len @ 1.. = u32::from_le_bytes(bytes[end + 4..end + 8].try_into().unwrap()) {
        records.push((end, len as usize));
        end += len as usize;
    }
    assert!(bytes[end..].iter().all(|&b| b == 0) && end < 1024);
    let open = |img: &SimFs| ProducerStateStore::open_with(dir(), preallocated(img));

    // As written.
    let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
    let s = open(&t).unwrap();
    assert!(matches(&s, all), "{}", common::store_util::diff(&s, all));
    let r = s.recovery_report();
    assert!(r.torn_tail.is_none() && r.torn_bytes_dropped() == 0);
    assert_eq!(r.clean_shutdown, Some(true));
    drop(s);
    assert_eq!(t.read_file(&seg).unwrap().len(), 4096, "the room is kept");

    // A byte of the room that is not zero.
    for at in end..bytes.len() {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let mut b = bytes.clone();
        b[at] = 0x5a;
        t.overwrite(&seg, &b);
        let s = open(&t).unwrap_or_else(|e| panic!("byte {at}: refused: {e}"));
        assert!(
            matches(&s, all),
            "byte {at}: {}",
            common::store_util::diff(&s, all)
        );
        let torn = s.recovery_report().torn_tail.clone().expect("a torn tail");
        assert_eq!(torn.offset as usize, end, "byte {at}");
        assert_eq!(torn.bytes as usize, bytes.len() - end, "byte {at}");
    }

    // A bit of the records.
    let (mut prefix, mut corrupt) = (0, 0);
    for bit in 40 * 8..end * 8 {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        t.overwrite(&seg, &b);
        match check(&t, &history, &format!("bit {bit}")) {
            Some(_) => prefix += 1,
            None => corrupt += 1,
        }
    }
    assert!(prefix > 0 && corrupt > 0, "{prefix} prefixes, {corrupt}");

    // Zeros where a record was, with records after it: not the end.
    for &(at, len) in &records[..records.len() - 1] {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let mut b = bytes.clone();
        b[at..at + len].fill(0);
        t.overwrite(&seg, &b);
        let Err(e) = open(&t) else {
            panic!("record at {at}: a strict open refuses")
        };
        assert!(
            matches!(&e, Error::Corrupt { offset, .. } if *offset as usize == at),
            "record at {at}: {e}"
        );
    }
}

/// A snapshot big enough to load on two threads (over 4 MiB: 70,000 keys
/// with full windows), damaged in its first block (which the helper
/// thread takes) or in its last (the reading thread's, or the helper's):
/// recovery refuses it, falls back to the older snapshot and replays the
/// log to the same state as the undamaged file gives.
#[test]
fn a_damaged_block_of_a_big_snapshot_falls_back_and_loses_nothing() {
    let fs = SimFs::new();
    let keys = 70_000u64;
    let s = ProducerStateStore::open_with(dir(), opts(&fs).keep_snapshots(2)).unwrap();
    let mut reqs = Vec::new();
    for b in 0..5i32 {
        for k in 0..keys {
            let at = i64::from(b) * keys as i64 + k as i64;
            reqs.push(AppendRequest::batch(
                k,
                0,
                0,
                producer_state::Batch::new(b, b, at, 1_700_000_000_000 + at),
            ));
        }
        if b == 3 {
            for r in s.append_all(&reqs) {
                assert!(r.unwrap().is_accepted());
            }
            reqs.clear();
            s.snapshot().unwrap();
        }
    }
    for r in s.append_all(&reqs) {
        assert!(r.unwrap().is_accepted());
    }
    let newest = s.snapshot().unwrap().unwrap();
    s.close().unwrap();
    let bytes = fs.read_file(&newest).unwrap();
    assert!(bytes.len() > 4 << 20, "{} bytes", bytes.len());
    let whole = {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let s = ProducerStateStore::open_with(dir(), opts(&t)).unwrap();
        assert!(s.recovery_report().skipped_snapshots.is_empty());
        let mut all: Vec<_> = s.iter().map(|(id, p, e)| (id.to_string(), p, e)).collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    };
    assert_eq!(whole.len(), keys as usize);
    // The first block's entries start after the header, the store section
    // and the block's own header; the last block ends before the trailer.
    let section = u32::from_le_bytes(bytes[48..52].try_into().unwrap()) as usize;
    let first_entry = 48 + 4 + section + 10;
    for at in [first_entry + 100, bytes.len() - 4 - 100] {
        let t = fs.crash_image(producer_state::fs::Unsynced::Drop);
        let mut b = bytes.clone();
        b[at] ^= 0x40;
        t.overwrite(&newest, &b);
        let s = ProducerStateStore::open_with(dir(), opts(&t))
            .unwrap_or_else(|e| panic!("byte {at}: {e}"));
        let r = s.recovery_report();
        assert_eq!(r.skipped_snapshots.len(), 1, "byte {at}: it fell back");
        assert!(r.records_replayed > 0);
        let mut all: Vec<_> = s.iter().map(|(id, p, e)| (id.to_string(), p, e)).collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        assert!(all == whole, "byte {at}: the state after the fallback");
    }
}
