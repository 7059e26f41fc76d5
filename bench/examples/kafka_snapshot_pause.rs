//! How long a `Semantics::Kafka` snapshot holds appenders back: 1M
//! producers, one in a hundred with a transaction open, one appender
//! thread appending one batch at a time to random producers while a
//! snapshot is taken. The goal is at most 10 ms at p99 of the appends
//! during the snapshot, as the strict store gives.
//!
//! `cargo run --release -p producer-state-bench --example kafka_snapshot_pause`
//! (`--producers N`, default 1,000,000; `--rounds N`, default 3; `--dir
//! PATH`). Default options otherwise (`FsyncPolicy::Always`), and once more
//! under `FsyncPolicy::Never` (the CPU path alone).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use producer_state::{
    AppendOptions, AppendRequest, Batch, FsyncPolicy, ProducerStateStore, Semantics, StoreOptions,
};
use producer_state_bench::{arg, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PARTITIONS: u64 = 16;

fn opts(policy: FsyncPolicy) -> StoreOptions {
    StoreOptions::default()
        .semantics(Semantics::Kafka)
        .fsync(policy)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
}

fn key(k: u64) -> (u64, i32) {
    (k, (k % PARTITIONS) as i32)
}

/// `producers` producers with one batch each, every hundredth in an open
/// transaction.
fn build(dir: &std::path::Path, producers: u64) -> Result<()> {
    let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Never))?;
    let txn = AppendOptions::client().transactional().verified();
    let mut chunk = Vec::with_capacity(1000);
    for k in 0..producers {
        let (id, p) = key(k);
        let r = AppendRequest::batch(id, p, 0, Batch::new(0, 0, k as i64, 1_700_000_000_000));
        chunk.push(if k % 100 == 0 { r.with_options(txn) } else { r });
        if chunk.len() == 1000 {
            for o in store.append_all(&chunk) {
                o?;
            }
            chunk.clear();
        }
    }
    for o in store.append_all(&chunk) {
        o?;
    }
    store.close()?;
    Ok(())
}

/// One snapshot while an appender runs: (snapshot ms, appends during it,
/// p99 and longest append during it in ms, longest otherwise).
fn round(dir: &std::path::Path, producers: u64, policy: FsyncPolicy) -> Result<[f64; 5]> {
    let store = Arc::new(ProducerStateStore::open_with(dir, opts(policy))?);
    let during = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (store, during, stop) = (store.clone(), during.clone(), stop.clone());
        std::thread::spawn(move || -> std::result::Result<(Vec<f64>, f64), String> {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = std::collections::HashMap::<u64, i32>::new();
            let (mut inside, mut outside) = (Vec::new(), 0f64);
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Plain producers only: a transactional one stays open.
                let k = (x % producers) | 1;
                let s = next.entry(k).or_insert(1);
                let (id, p) = key(k);
                let b = Batch::new(*s, *s, 0, 1_700_000_000_000);
                let t = Instant::now();
                let was_during = during.load(Ordering::Relaxed);
                store.append_batch(id, p, 0, b).map_err(|e| e.to_string())?;
                let took = t.elapsed().as_secs_f64() * 1e3;
                if was_during || during.load(Ordering::Relaxed) {
                    inside.push(took);
                } else {
                    outside = outside.max(took);
                }
                *s += 1;
            }
            Ok((inside, outside))
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    during.store(true, Ordering::Relaxed);
    let t = Instant::now();
    store.snapshot()?;
    let took = t.elapsed().as_secs_f64() * 1e3;
    during.store(false, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (mut inside, outside) = appender.join().map_err(|_| "appender panicked")??;
    inside.sort_by(f64::total_cmp);
    let n = inside.len();
    let p99 = inside
        .get((n * 99 / 100).min(n.saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let max = inside.last().copied().unwrap_or(0.0);
    Arc::try_unwrap(store)
        .map_err(|_| "store still shared")?
        .close()?;
    Ok([took, n as f64, p99, max, outside])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let producers: u64 = arg(&args, "--producers").map_or(Ok(1_000_000), |v| v.parse())?;
    let rounds: usize = arg(&args, "--rounds").map_or(Ok(3), |v| v.parse())?;
    let tmp = tempfile::tempdir()?;
    let dir = arg(&args, "--dir").map_or_else(|| tmp.path().join("kafka"), Into::into);
    let _ = std::fs::remove_dir_all(&dir);
    let t = Instant::now();
    build(&dir, producers)?;
    println!(
        "{producers} producers ({} with an open transaction), built in {:.1} s; {rounds} rounds, medians",
        producers.div_ceil(100),
        t.elapsed().as_secs_f64()
    );
    println!(
        "| policy | snapshot ms | appends during it | p99 append during it (ms) | longest during it (ms) | longest otherwise (ms) | goal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (name, policy) in [
        ("Always", FsyncPolicy::Always),
        ("Never", FsyncPolicy::Never),
    ] {
        let mut rows: Vec<[f64; 5]> = Vec::new();
        for _ in 0..rounds {
            rows.push(round(&dir, producers, policy)?);
        }
        let m = |i: usize| median(rows.iter().map(|r| r[i]).collect());
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | p99 <= 10 ms |",
            m(0),
            m(1),
            m(2),
            m(3),
            m(4)
        );
    }
    Ok(())
}
