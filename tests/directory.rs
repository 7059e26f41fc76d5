//! The store directory, on real files: which paths can be one (refused
//! before anything is created), and the lock that keeps a second store
//! out even when the `LOCK` file is deleted or replaced.
//!
//! The empty path is tried in a child process (this test binary run again)
//! whose working directory is a fresh temporary one, so that what it
//! leaves behind can be seen without touching the crate's own directory.

use std::path::Path;
use std::process::{Command, Stdio};

use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::{AppendOutcome, Error, ProducerStateStore, inspect, kafka};

const CHILD: &str = "PRODUCER_STATE_TEST_EMPTY_PATH";

/// A word for an error, for the child's output.
fn word(r: Result<(), Error>) -> String {
    match r {
        Err(Error::InvalidPath { .. }) => "INVALID_PATH".into(),
        Err(e) => format!("OTHER({e})"),
        Ok(()) => "OK".into(),
    }
}

/// The child's entry point (a no-op unless run as the child).
#[test]
fn child_process() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let empty = Path::new("");
    println!("open {}", word(ProducerStateStore::open(empty).map(|_| ())));
    println!("seed {}", word(kafka::seed_store(empty, &[]).map(|_| ())));
    println!(
        "dry_run {}",
        word(inspect::dry_run(&ReadOnlyFs(StdFs), empty).map(|_| ()))
    );
}

#[test]
fn an_empty_path_is_refused_before_anything_is_created() {
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .current_dir(cwd.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for call in ["open", "seed", "dry_run"] {
        assert!(
            text.contains(&format!("{call} INVALID_PATH")),
            "{call}: {text}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "created in the working directory: {left:?}"
    );
}

#[test]
fn the_error_for_an_empty_path_says_what_is_wrong() {
    // Refused before any file system call, so safe in this process.
    let err = inspect::dry_run(&ReadOnlyFs(StdFs), Path::new("")).unwrap_err();
    assert!(matches!(err, Error::InvalidPath { .. }), "{err}");
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn a_regular_file_is_not_a_directory_for_every_entry_point() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = ProducerStateStore::open(f.path()).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
    let err = kafka::seed_store(f.path(), &[]).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
    let err = inspect::dry_run(&ReadOnlyFs(StdFs), f.path()).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
    assert_eq!(std::fs::read(f.path()).unwrap(), b"", "left alone");
}

#[test]
fn deleting_or_replacing_lock_does_not_let_a_second_store_in() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let a = ProducerStateStore::open(d).unwrap();
    let lock = d.join("LOCK");
    std::fs::remove_file(&lock).unwrap();
    let err = ProducerStateStore::open(d).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    // A new file under the name does not help either.
    std::fs::write(&lock, b"").unwrap();
    let err = ProducerStateStore::open(d).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    // The first store was never disturbed, and is the only writer.
    assert_eq!(a.append(1u64, 0, 0, 0).unwrap(), AppendOutcome::Accepted);
    a.close().unwrap();
    let b = ProducerStateStore::open(d).unwrap();
    assert_eq!(b.get(1u64, 0).unwrap().last_sequence(), 0);
}

#[test]
fn seeding_a_store_takes_the_same_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("store");
    std::fs::create_dir(&d).unwrap();
    // Whoever holds the directory's lock (an open store does: the rule in
    // docs/format.md) keeps a seeding out.
    let held = std::fs::File::open(&d).unwrap();
    held.try_lock().unwrap();
    let err = kafka::seed_store(&d, &[]).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "nothing written");
    drop(held);
    kafka::seed_store(&d, &[]).unwrap();
    ProducerStateStore::open(&d).unwrap();
}
