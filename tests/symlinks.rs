//! Store files that are symbolic links, and entries named like store files
//! that are not files at all, on the real file system.
//!
//! A segment or snapshot that recovery silently passed over would break
//! exactly-once: the appends it holds would be forgotten, and their
//! retries accepted a second time. So a name of the store's pattern is
//! either read (a symbolic link to a regular file is that file) or makes
//! the open fail naming it; it is never ignored.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use producer_state::{
    AppendOutcome, Error, FsyncPolicy, ProducerStateStore, RecoveryMode, StoreOptions,
};

fn opts() -> StoreOptions {
    StoreOptions::default()
        .fsync(FsyncPolicy::Always)
        .segment_size(1024)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
        .background_snapshots(false)
}

/// The files of `dir` ending in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    v
}

/// A store of `n` appends of key (1, 0), sequences 0..n, closed.
fn store(dir: &Path, o: StoreOptions, n: i32) {
    let s = ProducerStateStore::open_with(dir, o).unwrap();
    for seq in 0..n {
        assert_eq!(s.append(1u64, 0, 0, seq).unwrap(), AppendOutcome::Accepted);
    }
    s.close().unwrap();
}

/// Moves `file` into `elsewhere` and leaves a symbolic link to it in its place.
fn move_and_link(file: &Path, elsewhere: &Path) -> PathBuf {
    let target = elsewhere.join(file.file_name().unwrap());
    std::fs::rename(file, &target).unwrap();
    symlink(&target, file).unwrap();
    target
}

/// Every acknowledged append is still known: its retry is a duplicate,
/// and the next sequence is accepted (also across segment rolls).
fn assert_remembers(s: &ProducerStateStore, n: i32) {
    for seq in [0, n / 2, n - 1] {
        assert_eq!(
            s.append(1u64, 0, 0, seq).unwrap(),
            AppendOutcome::Duplicate,
            "retry of acknowledged sequence {seq}"
        );
    }
    for seq in n..n + 100 {
        assert_eq!(s.append(1u64, 0, 0, seq).unwrap(), AppendOutcome::Accepted);
    }
}

#[test]
fn a_symlinked_newest_segment_is_read_through_its_link() {
    let d = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    store(d.path(), opts(), 200);
    let segs = files(d.path(), ".wal");
    assert!(segs.len() > 2);
    let newest = segs.last().unwrap();
    let target = move_and_link(newest, elsewhere.path());
    let s = ProducerStateStore::open_with(d.path(), opts()).unwrap();
    assert_eq!(s.recovery_report().segments_read, segs.len());
    assert_eq!(s.recovery_report().next_position, 200);
    assert_eq!(s.get(1u64, 0).unwrap().last_sequence(), 199);
    assert_remembers(&s, 200);
    s.close().unwrap();
    // The link is still a link, to the same file, and appends went there.
    assert_eq!(std::fs::read_link(newest).unwrap(), target);
    let s = ProducerStateStore::open_with(d.path(), opts()).unwrap();
    assert_eq!(s.get(1u64, 0).unwrap().last_sequence(), 299);
}

#[test]
fn symlinked_snapshots_are_read_through_their_links() {
    let d = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let o = || opts().snapshot_every_records(Some(50)).keep_snapshots(2);
    store(d.path(), o(), 300);
    let snaps = files(d.path(), ".snap");
    assert_eq!(snaps.len(), 2);
    // Retention has deleted the log the older snapshots needed: a
    // snapshot passed over would leave nothing to recover from.
    assert!(!files(d.path(), ".wal")[0].ends_with("00000000000000000000.wal"));
    for snap in &snaps {
        move_and_link(snap, elsewhere.path());
    }
    let s = ProducerStateStore::open_with(d.path(), o()).unwrap();
    let used = s.recovery_report().snapshot.clone().expect("a snapshot");
    assert_eq!(&used.file, snaps.last().unwrap());
    assert!(s.recovery_report().skipped_snapshots.is_empty());
    assert_remembers(&s, 300);
}

/// Strict and salvage opens both refuse, naming `culprit`, and change nothing.
fn assert_refused(dir: &Path, culprit: &Path, what: &str) {
    let before = files(dir, "");
    let lens: Vec<u64> = before
        .iter()
        .map(|p| std::fs::symlink_metadata(p).unwrap().len())
        .collect();
    for mode in [RecoveryMode::Strict, RecoveryMode::Salvage] {
        match ProducerStateStore::open_with(dir, opts().recovery(mode)) {
            Err(e @ Error::NotAFile { .. }) => {
                let Error::NotAFile { path, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(path, culprit, "{mode:?}");
                let msg = e.to_string();
                assert!(msg.contains(what), "{mode:?}: {msg}");
                assert!(msg.contains(&culprit.display().to_string()), "{msg}");
            }
            other => panic!("{mode:?}: {:?}", other.map(|_| "opened")),
        }
        // Nothing moved aside, cut or removed (the lock file aside).
        let after: Vec<PathBuf> = files(dir, "");
        assert_eq!(after, before, "{mode:?}");
        let now: Vec<u64> = after
            .iter()
            .map(|p| std::fs::symlink_metadata(p).unwrap().len())
            .collect();
        assert_eq!(now, lens, "{mode:?}");
    }
}

/// `name` in `dir`, or if a file of the store has it (where the log's
/// segments roll depends on its records' sizes, and a record's size on the
/// clock it stamps), the next position with the same extension that none has.
fn free_name(dir: &Path, name: &str) -> PathBuf {
    let (digits, ext) = name.split_at(20);
    let mut position: u64 = digits.parse().unwrap();
    loop {
        let p = dir.join(format!("{position:020}{ext}"));
        if std::fs::symlink_metadata(&p).is_err() {
            return p;
        }
        position += 1;
    }
}

#[test]
fn a_store_name_that_is_not_a_file_is_refused_by_name() {
    let elsewhere = tempfile::tempdir().unwrap();
    // Each case: what to create in a store of 200 appends, and the words
    // the error must use.
    type Make = fn(&Path, &Path);
    let cases: [(&str, Make, &str); 6] = [
        (
            "00000000000000000150.wal",
            |p, _| std::fs::create_dir(p).unwrap(),
            "a directory",
        ),
        (
            "00000000000000000200.wal",
            |p, e| symlink(e.join("gone.wal"), p).unwrap(),
            "a symbolic link to nothing",
        ),
        (
            "00000000000000000100.snap",
            |p, _| std::fs::create_dir(p).unwrap(),
            "a directory",
        ),
        (
            "00000000000000000100.snap",
            |p, e| symlink(e, p).unwrap(),
            "a directory",
        ),
        (
            "00000000000000000100.snap",
            |p, e| symlink(e.join("gone.snap"), p).unwrap(),
            "a symbolic link to nothing",
        ),
        (
            "00000000000000000100.snap.tmp",
            |p, _| std::fs::create_dir(p).unwrap(),
            "a directory",
        ),
    ];
    for (name, make, what) in cases {
        let d = tempfile::tempdir().unwrap();
        store(d.path(), opts(), 200);
        let culprit = free_name(d.path(), name);
        make(&culprit, elsewhere.path());
        assert_refused(d.path(), &culprit, what);
        // Taken away, the store opens with everything it had.
        if culprit.is_dir() && !culprit.is_symlink() {
            std::fs::remove_dir(&culprit).unwrap();
        } else {
            std::fs::remove_file(&culprit).unwrap();
        }
        let s = ProducerStateStore::open_with(d.path(), opts()).unwrap();
        assert_remembers(&s, 200);
    }
}

#[test]
fn a_fifo_named_like_a_segment_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    store(d.path(), opts(), 50);
    let culprit = d.path().join("00000000000000000999.wal");
    let made = std::process::Command::new("mkfifo")
        .arg(&culprit)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("no mkfifo here: skipped");
        return;
    }
    assert_refused(d.path(), &culprit, "not a regular file");
}

#[test]
fn other_names_that_are_not_files_are_left_alone() {
    let d = tempfile::tempdir().unwrap();
    store(d.path(), opts(), 50);
    std::fs::create_dir(d.path().join("backup.wal")).unwrap();
    symlink(d.path().join("nowhere"), d.path().join("notes")).unwrap();
    let s = ProducerStateStore::open_with(d.path(), opts()).unwrap();
    assert_remembers(&s, 50);
}
