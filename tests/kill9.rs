//! Real processes: a child appends and prints every acknowledged append;
//! the parent kills it with SIGKILL at random moments, reopens the store,
//! and checks that the state is exactly the acknowledged appends plus at
//! most the one in flight (a retry of each is a DUPLICATE), and that the
//! previous epoch is fenced. Also: a second process cannot open a live
//! store.
//!
//! What this proves, and what it does not: SIGKILL ends the process but
//! not the machine, so the page cache survives. It proves that nothing
//! acknowledged is lost to a process crash at any moment (in a write, a
//! segment roll, a snapshot); it cannot see a missing fsync. Machine
//! crashes, where only fsync'ed bytes survive, are the simulated file
//! system's tests (`tests/crash.rs`).
//!
//! The child is this test binary run again with an environment variable
//! set; `child_process` is its entry point and does nothing otherwise.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use producer_state::{AppendOutcome, Error, ProducerStateStore, StoreOptions};

const CHILD: &str = "PRODUCER_STATE_TEST_CHILD";
const KEYS: u64 = 8;

/// The child's entry point (a no-op unless run as the child).
#[test]
fn child_process() {
    let Ok(role) = std::env::var(CHILD) else {
        return;
    };
    let dir = std::env::var("STORE_DIR").unwrap();
    if role == "lock-probe" {
        let msg = match ProducerStateStore::open(&dir) {
            Err(Error::Locked { .. }) => "LOCKED",
            Ok(_) => "OPENED",
            Err(_) => "ERROR",
        };
        println!("{msg}");
        return;
    }
    let epoch: i16 = std::env::var("EPOCH").unwrap().parse().unwrap();
    let small = std::env::var("SMALL").is_ok();
    // Default options (fsync always); on some rounds small segments and
    // frequent snapshots, so kills also land in rolls and snapshots.
    let opts = if small {
        StoreOptions::default()
            .segment_size(16 << 10)
            .snapshot_every_records(Some(300))
    } else {
        StoreOptions::default()
    };
    let store = ProducerStateStore::open_with(&dir, opts).unwrap();
    let mut out = std::io::stdout().lock();
    for i in 0u64.. {
        let (key, seq) = (i % KEYS, (i / KEYS) as i32);
        let got = store.append(key, 0, epoch, seq).unwrap();
        assert_eq!(got, AppendOutcome::Accepted);
        writeln!(out, "ACK {key} {seq}").unwrap();
        out.flush().unwrap();
    }
}

fn child(role: &str, dir: &std::path::Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD, role)
    .env("STORE_DIR", dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    c
}

#[test]
fn every_acknowledged_append_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    // Kill moments differ from run to run; the seed is printed to replay one.
    let mut seed = std::env::var("KILL9_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    eprintln!("KILL9_SEED={seed}");
    let mut total_acks = 0usize;
    // Reopens that sought past the records their snapshot covers.
    let mut seeks = 0usize;
    const ROUNDS: i16 = 12;
    const MIN_ACKS: usize = 90;
    const MAX_WAIT: Duration = Duration::from_secs(20);
    for epoch in 0..ROUNDS {
        let mut cmd = child("appender", dir.path());
        cmd.env("EPOCH", epoch.to_string());
        if epoch % 2 == 1 {
            cmd.env("SMALL", "1");
        }
        let mut proc = cmd.spawn().unwrap();
        let stdout = proc.stdout.take().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let seen_by_reader = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut acked: Vec<(u64, i32)> = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest prints "test child_process ... " before the
                // child's first line.
                if let Some(rest) = line.split_once("ACK ").map(|(_, r)| r) {
                    let mut it = rest.split(' ');
                    let key: u64 = it.next().unwrap().parse().unwrap();
                    let seq: i32 = it.next().unwrap().parse().unwrap();
                    acked.push((key, seq));
                    seen_by_reader.store(acked.len(), Ordering::Relaxed);
                }
            }
            acked
        });
        // Let it run a random while, and at least until it has
        // acknowledged MIN_ACKS appends (so that a slow disk or a loaded
        // machine still kills it mid-work, never before it started), but
        // never longer than MAX_WAIT.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(150 + seed % 250);
        let start = Instant::now();
        while (start.elapsed() < wait || seen.load(Ordering::Relaxed) < MIN_ACKS)
            && start.elapsed() < MAX_WAIT
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        proc.kill().unwrap(); // SIGKILL
        proc.wait().unwrap();
        let acks = reader.join().unwrap();
        // The child appends (i % KEYS, i / KEYS) for i = 0, 1, ...: the
        // first `n` were acknowledged and append `n` may have been in
        // flight; nothing else of this epoch can exist.
        let n = acks.len() as u64;
        for (i, &(key, seq)) in acks.iter().enumerate() {
            assert_eq!((key, seq), (i as u64 % KEYS, (i as u64 / KEYS) as i32));
        }
        total_acks += acks.len();
        let in_flight = (n % KEYS, (n / KEYS) as i32);

        let store =
            ProducerStateStore::open(dir.path()).unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
        // A kill loses no byte written (the page cache keeps it): the log
        // point of the snapshot recovery starts from always checks out.
        if let Some(s) = &store.recovery_report().seek {
            assert_eq!(s.fallback, None, "epoch {epoch}: {s:?}");
            seeks += 1;
        }
        let mut ahead = 0;
        for key in 0..KEYS {
            let max = (key < n).then(|| ((n - 1 - key) / KEYS) as i32);
            let got = store
                .get(key, 0)
                .filter(|e| e.epoch() == epoch)
                .map(|e| e.last_sequence());
            if got != max {
                assert_eq!(
                    (key, got),
                    (in_flight.0, Some(in_flight.1)),
                    "epoch {epoch}, {n} acknowledged: key {key} acked up to {max:?}, recovered {got:?}"
                );
                ahead += 1;
            }
            let Some(max) = max else { continue };
            for seq in (0..=max).rev().step_by(7) {
                assert_eq!(
                    store.append(key, 0, epoch, seq).unwrap(),
                    AppendOutcome::Duplicate,
                    "key {key} seq {seq}"
                );
            }
            if epoch > 0 {
                assert_eq!(
                    store.append(key, 0, epoch - 1, max + 7).unwrap(),
                    AppendOutcome::FencedEpoch
                );
            }
        }
        assert!(ahead <= 1, "at most the one append in flight");
        store.close().unwrap();
    }
    assert!(
        total_acks > 1000,
        "the children made progress: {total_acks} acknowledged appends"
    );
    // The rounds with small segments and frequent snapshots reopen from a
    // snapshot whose position lies inside a segment.
    eprintln!("{seeks} of {ROUNDS} reopens sought past their snapshot's records");
    assert!(seeks > 0, "no reopen sought past its snapshot's records");
}

#[test]
fn a_second_process_cannot_open_a_live_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = ProducerStateStore::open(dir.path()).unwrap();
    let probe = |d: &std::path::Path| {
        let out = child("lock-probe", d).output().unwrap();
        // libtest prints "test child_process ... " before the child's word.
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        ["LOCKED", "OPENED", "ERROR"]
            .into_iter()
            .find(|w| text.contains(w))
            .map(str::to_string)
    };
    assert_eq!(probe(dir.path()).as_deref(), Some("LOCKED"));
    // In this process too.
    assert!(matches!(
        ProducerStateStore::open(dir.path()),
        Err(Error::Locked { .. })
    ));
    store.close().unwrap();
    assert_eq!(probe(dir.path()).as_deref(), Some("OPENED"));
}

#[test]
fn opening_a_regular_file_is_a_clear_error() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = ProducerStateStore::open(f.path()).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
    assert!(err.to_string().contains("is not a directory"));
}
