//! Snapshots of 1M keys with 1 and with 5 retained batches each: the rows
//! of the snapshot goals (docs/performance.md), as ratios measured in one run.
//!
//! `cargo run --release -p producer-state-bench --example snapshot_bench`
//! (under a minute). `--keys N` changes the key count, `--rounds N` the
//! rounds (default 5; tables show medians), `--dir PATH` the disk.
//!
//! Each key gets its batches round-robin, as the Kafka comparison built
//! them (../shared/notes/kafka-psm-bench.md): batch `b` of key `k` is the
//! one-record batch `b` at offset and timestamp `b * keys + k`
//! (timestamps from 1.7e12). Both stores are built first; then each
//! round runs on the 1-batch store and then on the 5-batch store, so the
//! two are measured interleaved, under the same load. Per round:
//! - write: reopen, one more append, `sync`, `snapshot()` timed (it waits
//!   until the file is durable, and deletes the snapshot retention drops),
//!   close; also the CPU time of the thread that took it (the encoding and
//!   the write calls; not the fsyncs' wait, nor the thread that issues a
//!   big snapshot's fsyncs): on a host whose disk is the slower side the
//!   wall time follows the bytes, the CPU time what the encoder costs;
//! - read: the library's reader alone over that file (read, check the CRC,
//!   decode every entry; nothing inserted), timed: the goal's baseline;
//! - raw: `std::fs::read` of the file and its CRC-32C, nothing decoded
//!   (the floor under both);
//! - reopen: `open_with` timed. The log holds no record after the
//!   snapshot, and segments are 1 MiB so that retention leaves at most one
//!   segment of records the snapshot covers: the reopen is the snapshot's
//!   load (reading the segments a snapshot covers is measured elsewhere).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use producer_state::fs::StdFs;
use producer_state::{Batch, ProducerStateStore};
use producer_state_bench::snapshot_store::{T0, build, opts};
use producer_state_bench::{keys_rounds_dir, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Round {
    write: Duration,
    write_cpu: Duration,
    read: Duration,
    raw: Duration,
    reopen: Duration,
    bytes: u64,
}

fn round(dir: &Path, keys: u64, i: u64) -> Result<Round> {
    let store = ProducerStateStore::open_with(dir, opts())?;
    let k = i % keys;
    let e = store.get(k, 0).ok_or("key missing")?;
    let s = e.last_sequence().checked_add(1).unwrap_or(0);
    let at = (1_000 * keys + i) as i64;
    store.append_batch(k, 0, 0, Batch::new(s, s, at, T0 + at))?;
    store.sync()?;
    let t = Instant::now();
    let cpu = cpu_time::ThreadTime::now();
    let path: PathBuf = store.snapshot()?.ok_or("no snapshot")?;
    let write = t.elapsed();
    let write_cpu = cpu.elapsed();
    store.close()?;
    let bytes = std::fs::metadata(&path)?.len();

    let t = Instant::now();
    let summary = producer_state::inspect::decode_snapshot(&StdFs, &path)?;
    let read = t.elapsed();
    assert_eq!(summary.entries, keys);

    let t = Instant::now();
    let all = std::fs::read(&path)?;
    std::hint::black_box(crc32c::crc32c(&all));
    let raw = t.elapsed();
    drop(all);

    let t = Instant::now();
    let store = ProducerStateStore::open_with(dir, opts())?;
    let reopen = t.elapsed();
    let r = store.recovery_report();
    assert_eq!(r.records_replayed, 0);
    if std::env::var("SNAPSHOT_BENCH_DEBUG").is_ok() {
        eprintln!(
            "reopen {reopen:?}: recovery {:?}, {} segments read, {} skipped (wholly below the snapshot)",
            r.duration, r.segments_read, r.segments_skipped
        );
    }
    assert_eq!(store.len() as u64, keys);
    drop(store);
    Ok(Round {
        write,
        write_cpu,
        read,
        raw,
        reopen,
        bytes,
    })
}

fn main() -> Result<()> {
    let (keys, rounds, base, _tmp) = keys_rounds_dir(5)?;
    let per_keys = [1u64, 5];
    let dirs: Vec<PathBuf> = per_keys
        .iter()
        .map(|n| base.join(format!("snap-{n}")))
        .collect();
    for (dir, &n) in dirs.iter().zip(&per_keys) {
        build(dir, keys, n)?;
    }
    // Interleaved: round i of the 1-batch store, then of the 5-batch one.
    let mut rs: Vec<Vec<Round>> = per_keys.iter().map(|_| Vec::new()).collect();
    for i in 0..rounds {
        for (dir, out) in dirs.iter().zip(&mut rs) {
            out.push(round(dir, keys, i)?);
        }
    }
    let mut rows = Vec::new();
    for (rs, &per_key) in rs.iter().zip(&per_keys) {
        let ms = |f: fn(&Round) -> Duration| {
            median(rs.iter().map(|r| f(r).as_secs_f64() * 1e3).collect())
        };
        let row = (
            per_key,
            ms(|r| r.write),
            ms(|r| r.read),
            ms(|r| r.reopen),
            rs[0].bytes as f64 / keys as f64,
            ms(|r| r.write_cpu),
        );
        // The ratio of medians, and the median of each round's ratio.
        let per_round = median(
            rs.iter()
                .map(|r| r.reopen.as_secs_f64() / r.read.as_secs_f64())
                .collect(),
        );
        println!(
            "{per_key} batch(es)/key: write {:.1} ms (CPU {:.1} ms), read+decode {:.1} ms (raw read+CRC {:.1} ms), reopen {:.1} ms, {:.1} B/key ({} B); reopen/read {:.3} (median of rounds {:.3})",
            row.1,
            row.5,
            row.2,
            ms(|r| r.raw),
            row.3,
            row.4,
            rs[0].bytes,
            row.3 / row.2,
            per_round,
        );
        rows.push(row);
    }
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    let (one, five) = (rows[0], rows[1]);
    println!();
    println!("| goal | measured | target |");
    println!("|---|---:|---:|");
    println!(
        "| reopen / read+decode, 1 batch/key | {:.3} | <= 1.15 |",
        one.3 / one.2
    );
    println!(
        "| reopen / read+decode, 5 batches/key | {:.3} | <= 1.15 |",
        five.3 / five.2
    );
    println!(
        "| file bytes per key, 5 batches/key | {:.1} | <= 70 |",
        five.4
    );
    println!("| write 5 / write 1 | {:.3} | <= 1.3 |", five.1 / one.1);
    println!("| (write CPU 5 / write CPU 1: {:.3}) | | |", five.5 / one.5);
    println!("| reopen 5 / reopen 1 | {:.3} | <= 1.3 |", five.3 / one.3);
    Ok(())
}
