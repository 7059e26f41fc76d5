//! The samples in README.md and docs/inspect.md are the tool's real
//! output: every `$ cargo run --bin inspect-snapshot -- ARGS` line in a
//! `text` block of those files is run (the binary this package builds) on
//! the store it names, and what it prints must be what the block shows
//! below it, so a sample cannot drift from the tool.
//!
//! `/tmp/demo-store` is the demo's store (`cargo run --example demo --
//! --dir /tmp/demo-store`), built here with the demo's own steps: the
//! first session's appends, a producer process killed after 2000
//! acknowledged appends (a crash of a simulated disk, keeping what was
//! durable), recovery, the retries, the new session and the snapshot. A
//! manual clock moves one millisecond an append, so the clock records and
//! with them every byte count are fixed. `/tmp/demo-crashed` is a copy
//! whose last write was torn (17 bytes of a record), `/tmp/empty` an empty
//! directory, `/tmp/broker-data` a broker's data directory laid out as the
//! broker lays it out; `tests/...` paths are the repository's fixtures.
//!
//! Only what is genuinely variable is ignored: the paths (a temporary
//! directory here) and the LAST ACTIVITY time of a key appended without a
//! batch timestamp, which is the time of the run (the column is compared
//! for its format, not its value).
//!
//! After a deliberate change to the output, `INSPECT_BLESS_DOCS=1 cargo
//! test -p producer-state-inspect --test docs` rewrites the samples.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use producer_state::fs::{FileSystem, SimFs, Unsynced};
use producer_state::{Batch, ManualClock, ProducerStateStore, StoreOptions};

/// The repository's root: the samples' relative paths start there.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The demo's batch for `sequence` (examples/demo.rs, `batch`).
fn batch(sequence: i32) -> Batch {
    Batch::new(
        sequence,
        sequence,
        1_000 + i64::from(sequence),
        1_700_000_000_000 + i64::from(sequence),
    )
}

/// The demo's options, on the simulated disk `fs`, with `clock`.
fn options(fs: &SimFs, clock: &ManualClock) -> StoreOptions {
    StoreOptions::default()
        .file_system(Arc::new(fs.clone()))
        .clock(Arc::new(clock.clone()))
}

/// The demo's store, step by step as examples/demo.rs takes them, written
/// out to `out`.
fn demo_store(out: &Path) {
    let dir = Path::new("/demo-store");
    let clock = ManualClock::new(1_767_225_600_000); // 2026-01-01
    let tick = || clock.advance(Duration::from_millis(1));
    let fs = SimFs::new();
    // The four rules, through the durable store.
    let store = ProducerStateStore::open_with(dir, options(&fs, &clock)).unwrap();
    for (epoch, sequence) in [(0, 0), (0, 1), (0, 1), (0, 5), (1, 0), (0, 2)] {
        tick();
        store.append("p1", 0, epoch, sequence).unwrap();
    }
    store.close().unwrap();
    // The producer process, killed after 2000 acknowledged appends: only
    // what was durable survives (every append is fsync'ed before it is
    // acknowledged).
    let child = ProducerStateStore::open_with(dir, options(&fs, &clock)).unwrap();
    tick();
    child.append("orders", 0, 1, 0).unwrap();
    for i in 0..2000 {
        tick();
        let outcome = child
            .append_batch("orders", i % 4, 2, batch(i / 4))
            .unwrap();
        assert!(outcome.is_accepted());
    }
    let fs = fs.crash_image(Unsynced::Drop);
    drop(child);
    // Recovery, the retries, a zombie, the new session, the snapshot.
    let store = ProducerStateStore::open_with(dir, options(&fs, &clock)).unwrap();
    for partition in 0..4 {
        tick();
        store
            .append_batch("orders", partition, 2, batch(499))
            .unwrap();
    }
    for (epoch, sequence) in [(1, 0), (3, 0), (2, 500)] {
        tick();
        store.append("orders", 0, epoch, sequence).unwrap();
    }
    store.snapshot().unwrap().expect("a snapshot");
    store.close().unwrap();
    // Onto the real disk, for the tool.
    std::fs::create_dir_all(out).unwrap();
    for e in fs.list(dir).unwrap() {
        let path = dir.join(&e.name);
        let bytes = fs.read_file(&path).unwrap();
        std::fs::write(out.join(&e.name), bytes).unwrap();
    }
    // The lock file a store on a real disk leaves (locking on the
    // simulated disk makes none).
    std::fs::write(out.join("LOCK"), b"").unwrap();
}

/// The stores and directories the samples name, made in `tmp`: (the
/// sample's path, the real one).
fn places(tmp: &Path) -> Vec<(&'static str, PathBuf)> {
    let store = tmp.join("demo-store");
    demo_store(&store);
    // A copy whose last write was torn: 17 bytes of a record after the
    // last segment's records, in its preallocated room.
    let crashed = tmp.join("demo-crashed");
    std::fs::create_dir_all(&crashed).unwrap();
    for e in std::fs::read_dir(&store).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), crashed.join(e.file_name())).unwrap();
    }
    let last = common::files(&crashed, ".wal").pop().unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    bytes[end..end + 17].fill(0x5a);
    std::fs::write(&last, bytes).unwrap();
    let empty = tmp.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let broker = tmp.join("broker-data");
    broker_data(&broker);
    vec![
        ("/tmp/demo-store", store),
        ("/tmp/demo-crashed", crashed),
        ("/tmp/empty", empty),
        ("/tmp/broker-data", broker),
    ]
}

/// A broker's data directory as the broker lays it out (docs/broker.md):
/// the catalog (topic `orders`, 3 partitions, keys 0 to 2), the
/// producer-id file, the shared Kafka-mode state, the partitions' logs.
fn broker_data(dir: &Path) {
    let mut catalog = "producer-state-broker topics 2\norders 3 0\n".to_string();
    let crc = crc32c::crc32c(catalog.as_bytes());
    catalog.push_str(&format!("crc32c {crc:08x}\n"));
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("topics.catalog"), catalog).unwrap();
    std::fs::write(dir.join("producer-ids"), [0u8; 12]).unwrap();
    let opts = StoreOptions::default().semantics(producer_state::Semantics::Kafka);
    let st = ProducerStateStore::open_with(dir.join("state"), opts).unwrap();
    st.append_batch(1000u64, 2, 0, batch(0)).unwrap();
    st.close().unwrap();
    for p in 0..3 {
        let part = dir.join(format!("topics/orders-{p}"));
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("00000000000000000000.log"), b"").unwrap();
    }
}

/// One sample: a command line and the lines the file shows after it.
struct Sample {
    /// The line's index in the file.
    line: usize,
    command: String,
    expected: Vec<String>,
}

const PROMPT: &str = "$ cargo run --bin inspect-snapshot -- ";

/// The samples of `text`: each command of a `text` block that runs the
/// tool, with the lines up to the next command or the end of the block.
fn samples(text: &str) -> Vec<Sample> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<Sample> = Vec::new();
    let mut in_text = false;
    let mut current: Option<Sample> = None;
    for (i, l) in lines.iter().enumerate() {
        if !in_text {
            in_text = *l == "```text";
            continue;
        }
        if *l == "```" || l.starts_with("$ ") {
            out.extend(current.take());
        }
        if *l == "```" {
            in_text = false;
        } else if let Some(cmd) = l.strip_prefix(PROMPT) {
            current = Some(Sample {
                line: i,
                command: cmd.to_string(),
                expected: Vec::new(),
            });
        } else if let Some(s) = &mut current {
            s.expected.push(l.to_string());
        }
    }
    out
}

/// The lines of a sample without the blank lines that end it (they
/// separate it from the next command).
fn shown(lines: &[String]) -> &[String] {
    let n = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    &lines[..n]
}

/// Runs a sample's command: its stderr, then its stdout, then (for
/// `; echo $?`) the exit code, with the real paths shown as the sample's.
fn actual(command: &str, places: &[(&str, PathBuf)]) -> Vec<String> {
    let (args, echo) = match command.strip_suffix("; echo $?") {
        Some(a) => (a, true),
        None => (command, false),
    };
    let args: Vec<String> = args
        .split_whitespace()
        .map(|a| {
            // A place, or a path inside one.
            places
                .iter()
                .find_map(|(shown, real)| {
                    let rest = a.strip_prefix(shown)?;
                    (rest.is_empty() || rest.starts_with('/'))
                        .then(|| format!("{}{rest}", real.display()))
                })
                .unwrap_or_else(|| a.to_string())
        })
        .collect();
    let out = Command::new(common::tool())
        .args(&args)
        .current_dir(root())
        .output()
        .unwrap();
    // As a terminal shows them: the tool writes its lines on stderr
    // (damage, no store) before its output.
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    for (shown, real) in places {
        text = text.replace(&real.display().to_string(), shown);
    }
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if echo {
        lines.push(out.status.code().unwrap_or(-1).to_string());
    }
    lines
}

/// `YYYY-MM-DD HH:MM:SS.mmm UTC`, by its shape.
fn is_time(s: &str) -> bool {
    let shape = "dddd-dd-dd dd:dd:dd.ddd UTC";
    s.len() == shape.len()
        && s.bytes().zip(shape.bytes()).all(|(c, p)| match p {
            b'd' => c.is_ascii_digit(),
            p => c == p,
        })
}

/// `lines` with each time in a LAST ACTIVITY column replaced by
/// `<time>` (a time of the run); a cell that is not a time is kept, so
/// that a change of its format still fails.
fn masked(lines: &[String]) -> Vec<String> {
    let mut column: Option<usize> = None;
    lines
        .iter()
        .map(|l| {
            if l.is_empty() {
                column = None;
            } else if let Some(c) = l.find("LAST ACTIVITY") {
                column = Some(c);
            } else if let Some(c) = column
                && let Some(cell) = l.get(c..c + 27)
                && is_time(cell)
            {
                return format!("{}<time>{}", &l[..c], &l[c + 27..]);
            }
            l.clone()
        })
        .collect()
}

/// Replaces each sample's lines in `text` with what the tool printed.
fn bless(text: &str, found: &[(Sample, Vec<String>)]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    for (s, actual) in found {
        while i <= s.line {
            out.push(lines[i].to_string());
            i += 1;
        }
        out.extend(actual.iter().cloned());
        // The blank lines after the sample stay.
        out.extend(s.expected[shown(&s.expected).len()..].iter().cloned());
        i += s.expected.len();
    }
    out.extend(lines[i..].iter().map(|l| l.to_string()));
    let mut t = out.join("\n");
    t.push('\n');
    t
}

#[test]
fn the_samples_in_the_readme_and_docs_are_the_tools_output() {
    let tmp = tempfile::tempdir().unwrap();
    let places = places(tmp.path());
    let bless_mode = std::env::var_os("INSPECT_BLESS_DOCS").is_some();
    let mut failures = Vec::new();
    for doc in ["README.md", "docs/inspect.md"] {
        let path = root().join(doc);
        let text = std::fs::read_to_string(&path).unwrap();
        let found: Vec<(Sample, Vec<String>)> = samples(&text)
            .into_iter()
            .map(|s| {
                let a = actual(&s.command, &places);
                (s, a)
            })
            .collect();
        assert!(
            found
                .iter()
                .any(|(s, _)| s.command.starts_with("/tmp/demo-store")),
            "{doc} shows no sample of the demo's store"
        );
        for (s, a) in &found {
            if masked(shown(&s.expected)) != masked(a) {
                failures.push(format!(
                    "{doc}:{}: `{}` printed\n{}\n\nbut the sample shows\n{}",
                    s.line + 1,
                    s.command,
                    a.join("\n"),
                    s.expected.join("\n")
                ));
            }
        }
        if bless_mode {
            std::fs::write(&path, bless(&text, &found)).unwrap();
        }
    }
    assert!(
        failures.is_empty() || bless_mode,
        "{}\n\n(INSPECT_BLESS_DOCS=1 rewrites the samples)",
        failures.join("\n\n----\n\n")
    );
}

#[test]
fn the_masking_keeps_everything_but_the_time_of_last_activity() {
    let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let table = l(&[
        "PRODUCER  LAST ACTIVITY                RETAINED",
        "p1        2026-01-01 00:00:00.003 UTC  -",
        "q         2027-05-05 10:00:00.000 UTC  1..1 @5 2023-11-14 22:13:20.000 UTC",
        "",
        "x         2026-01-01 00:00:00.003 UTC  -",
    ]);
    let m = masked(&table);
    assert_eq!(m[1], "p1        <time>  -");
    assert_eq!(
        m[2],
        "q         <time>  1..1 @5 2023-11-14 22:13:20.000 UTC"
    );
    assert_eq!(m[4], table[4], "not in the table");
    // Another format is not a time: it fails the comparison.
    let other = l(&[
        "PRODUCER  LAST ACTIVITY                RETAINED",
        "p1        1767225600003                -",
    ]);
    assert_eq!(masked(&other), other);
}
