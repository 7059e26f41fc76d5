//! Reopen of 1M keys from a snapshot with nothing to replay, in the
//! configuration users run (default options: 64 MiB segments that grow
//! from 64 KiB, preallocated, `FsyncPolicy::Always`), with 1 and with 5
//! batches per key: the rows of the reopen goals (docs/performance.md),
//! as ratios measured in one run.
//!
//! `cargo run --release -p producer-state-bench --example reopen_bench`
//! (about a minute). `--keys N` changes the key count, `--rounds N` the
//! rounds (default 5; medians), `--dir PATH` the disk.
//!
//! Each store gets its keys' batches round-robin (as `snapshot_bench`,
//! batch `b` of key `k` at offset `b * keys + k`) in `append_all` calls of
//! 10,000, then one snapshot, wherever those appends put it (the bench
//! prints the segment and byte), then a clean close. From it:
//! - **mid**: the store as it is: its snapshot lies inside a 64 MiB
//!   segment, after millions of records;
//! - **start**: the same keys with the snapshot at a segment's start: the
//!   store reopened with a segment size below its last segment's length
//!   (so the next write rolls), one more batch appended to one key, a
//!   snapshot (one record into the new segment), closed;
//! - **full**: *mid* with its snapshot rewritten as version 5 (no log
//!   point; bytes 12 and 44 zeroed, the CRCs recomputed): the reopen
//!   before this build, which reads every record the snapshot covers;
//! - **crash**: *mid* without its close marker (the last 17 bytes of its
//!   records zeroed): an unclean restart, which reads the preallocated
//!   room to its end;
//! - **read**: the library's reader alone over *mid*'s snapshot (read,
//!   check the CRC, decode every entry): the goal's baseline.
//!
//! Rounds interleave the variants and the two stores. Kafka's load of the
//! same 1M producers, 138 ms (../shared/notes/kafka-psm-bench.md, measured
//! on this machine's class with Kafka's own code), is printed beside.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use producer_state::fs::StdFs;
use producer_state::{AppendRequest, Batch, ProducerStateStore, StoreOptions};
use producer_state_bench::{keys_rounds_dir, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const T0: i64 = 1_700_000_000_000;
const KAFKA_LOAD_MS: f64 = 138.0;

/// A fresh store of `keys` producers with `per_key` batches each, default
/// options, a snapshot after the last append, closed.
fn build(dir: &Path, keys: u64, per_key: u64) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let store = ProducerStateStore::open(dir)?;
    let mut chunk = Vec::with_capacity(10_000);
    for b in 0..per_key {
        for k in 0..keys {
            let at = (b * keys + k) as i64;
            let s = b as i32;
            chunk.push(AppendRequest::batch(k, 0, 0, Batch::new(s, s, at, T0 + at)));
            if chunk.len() == 10_000 || (b + 1 == per_key && k + 1 == keys) {
                for o in store.append_all(&chunk) {
                    if !o?.is_accepted() {
                        return Err("an append of the benchmark's store was not accepted".into());
                    }
                }
                chunk.clear();
            }
        }
    }
    // None: an automatic snapshot (default options take them) is at this
    // position already.
    store.snapshot()?;
    store.close()?;
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        std::fs::copy(e.path(), &dest)?;
        // Durable before the reopen, as a store's files are at a restart:
        // else the open's fsync of its last segment (Recovering, rule 7)
        // would write a fresh copy's 64 MiB and be timed with it.
        std::fs::File::open(&dest)?.sync_all()?;
    }
    Ok(())
}

fn files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    v.retain(|p| p.extension().is_some_and(|e| e == ext));
    v.sort();
    Ok(v)
}

/// *start*: the next write rolls, then one batch to key 0, a snapshot.
fn to_segment_start(dir: &Path, keys: u64, per_key: u64) -> Result<()> {
    // A segment size below what the last segment holds: it rolls.
    let small = StoreOptions::default().segment_size(1 << 16);
    let store = ProducerStateStore::open_with(dir, small)?;
    let s = per_key as i32;
    let at = (per_key * keys) as i64;
    let got = store.append_batch(0u64, 0, 0, Batch::new(s, s, at, T0 + at))?;
    if !got.is_accepted() {
        return Err("the extra batch was not accepted".into());
    }
    // None: an automatic snapshot (default options take them) is at this
    // position already.
    store.snapshot()?;
    store.close()?;
    Ok(())
}

/// *full*: the newest snapshot rewritten as version 5 (no log point).
fn without_point(dir: &Path) -> Result<()> {
    let snap = files(dir, "snap")?.pop().ok_or("no snapshot")?;
    let mut b = std::fs::read(&snap)?;
    if b[8..10] != 6u16.to_le_bytes() {
        return Err("the snapshot is not of version 6".into());
    }
    b[8..10].copy_from_slice(&5u16.to_le_bytes());
    b[12..16].fill(0);
    b[44..48].fill(0);
    let head = crc32c::crc32c(&b[..40]);
    b[40..44].copy_from_slice(&head.to_le_bytes());
    let n = b.len() - 4;
    let all = crc32c::crc32c(&b[..n]);
    b[n..].copy_from_slice(&all.to_le_bytes());
    std::fs::write(&snap, &b)?;
    std::fs::File::open(&snap)?.sync_all()?;
    Ok(())
}

/// *crash*: the close marker (the last record, 17 bytes) zeroed.
fn without_marker(dir: &Path) -> Result<()> {
    let last = files(dir, "wal")?.pop().ok_or("no segment")?;
    let mut b = std::fs::read(&last)?;
    let end = b.iter().rposition(|&x| x != 0).ok_or("an empty segment")? + 1;
    if b[end - 1] != 5 {
        return Err("the last record is not a close marker".into());
    }
    b[end - 17..end].fill(0);
    std::fs::write(&last, &b)?;
    std::fs::File::open(&last)?.sync_all()?;
    Ok(())
}

/// Reopens `dir` (default options), timed; checks the key count.
fn reopen(dir: &Path, keys: u64) -> Result<(Duration, producer_state::RecoveryReport)> {
    let t = Instant::now();
    let store = ProducerStateStore::open(dir)?;
    let took = t.elapsed();
    let r = store.recovery_report().clone();
    if std::env::var("REOPEN_BENCH_DEBUG").is_ok() {
        eprintln!(
            "reopen {took:?}, {} replay thread(s):\n{r}\n",
            r.replay_threads
        );
    }
    if store.len() as u64 != keys {
        return Err(format!("{} keys after reopen, not {keys}", store.len()).into());
    }
    // Not closed: a close writes a marker, and the next round must find
    // the directory as it was. Dropped, the store fsyncs nothing more; the
    // variants are copied afresh each round.
    drop(store);
    Ok((took, r))
}

#[derive(Default)]
struct Times {
    mid: Vec<f64>,
    start: Vec<f64>,
    full: Vec<f64>,
    crash: Vec<f64>,
    read: Vec<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let (keys, rounds, base, _tmp) = keys_rounds_dir(5)?;
    let per_keys = [1u64, 5];
    let built: Vec<PathBuf> = per_keys
        .iter()
        .map(|n| base.join(format!("built-{n}")))
        .collect();
    for (dir, &n) in built.iter().zip(&per_keys) {
        build(dir, keys, n)?;
    }
    let work = base.join("work");
    let mut times: Vec<Times> = per_keys.iter().map(|_| Times::default()).collect();
    let mut first_report = Vec::new();
    for round in 0..rounds {
        for ((dir, &n), t) in built.iter().zip(&per_keys).zip(&mut times) {
            // mid
            copy_dir(dir, &work)?;
            let (d, r) = reopen(&work, keys)?;
            if r.records_read_not_replayed != 0 || r.records_replayed != 0 {
                return Err(format!("mid: {r}").into());
            }
            t.mid.push(ms(d));
            if round == 0 {
                first_report.push((n, r));
            }
            let snap = files(&work, "snap")?.pop().ok_or("no snapshot")?;
            let t0 = Instant::now();
            let s = producer_state::inspect::decode_snapshot(&StdFs, &snap)?;
            t.read.push(ms(t0.elapsed()));
            if s.entries != keys {
                return Err("the snapshot does not hold every key".into());
            }
            // start
            copy_dir(dir, &work)?;
            to_segment_start(&work, keys, n)?;
            let (d, r) = reopen(&work, keys)?;
            if r.records_read_not_replayed != 0 {
                return Err(format!("start: {r}").into());
            }
            t.start.push(ms(d));
            // full
            copy_dir(dir, &work)?;
            without_point(&work)?;
            let (d, r) = reopen(&work, keys)?;
            if r.seek.is_some() || r.records_read_not_replayed == 0 {
                return Err(format!("full: {r}").into());
            }
            t.full.push(ms(d));
            // crash
            copy_dir(dir, &work)?;
            without_marker(&work)?;
            let (d, r) = reopen(&work, keys)?;
            if r.clean_shutdown != Some(false) || r.records_read_not_replayed != 0 {
                return Err(format!("crash: {r}").into());
            }
            t.crash.push(ms(d));
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    for dir in &built {
        let _ = std::fs::remove_dir_all(dir);
    }
    for (n, r) in &first_report {
        let seek = r.seek.as_ref().ok_or("no seek")?;
        println!(
            "{n} batch(es)/key: snapshot at position {} lies at byte {} of {} ({} records of that segment below it, not read; {} segment(s) wholly below, not read)",
            r.snapshot.as_ref().map_or(0, |s| s.position),
            seek.offset,
            seek.segment
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("?"),
            seek.records_not_read,
            r.segments_skipped,
        );
    }
    println!();
    println!(
        "| batches/key | read+decode ms | reopen mid ms | reopen start ms | before (full read) ms | crash ms | mid/start | mid/read | Kafka load |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut goals = Vec::new();
    for (t, n) in times.iter().zip(&per_keys) {
        let m = |v: &Vec<f64>| median(v.clone());
        let (read, mid, start) = (m(&t.read), m(&t.mid), m(&t.start));
        println!(
            "| {n} | {read:.1} | {mid:.1} | {start:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {KAFKA_LOAD_MS:.0} ms ({:.2}x of it) |",
            m(&t.full),
            m(&t.crash),
            mid / start,
            mid / read,
            mid / KAFKA_LOAD_MS,
        );
        goals.push((*n, mid / start, mid / read));
    }
    println!();
    println!("| goal | measured | target |");
    println!("|---|---:|---:|");
    for (n, mid_start, mid_read) in goals {
        println!(
            "| reopen mid-segment / at a segment start, {n} batch(es)/key | {mid_start:.3} | <= 1.1 |"
        );
        println!(
            "| reopen / read+decode of the snapshot, {n} batch(es)/key | {mid_read:.3} | <= 1.3 |"
        );
    }
    Ok(())
}
