//! A transactional workload against the same batches without transactions:
//! the goal of transactions at >= 0.5x the non-transactional store.
//!
//! `cargo run --release -p producer-state-bench --example txn_bench`
//! (about a minute). `--batches N` batches per round (default 2,000,000; a hundredth under `Always`),
//! `--rounds N` (default 5; tables show medians), `--threads N` appenders
//! under `FsyncPolicy::Always` (default 8), `--policy never|always` one
//! policy only (default both), `--dir PATH` the disk, `--side
//! seed|plain|txn` one side only (for an instruction count per side under
//! callgrind; the ratio columns then say `-`).
//!
//! The data: producers `0..P` (P = 64), producer `p` writing partition `p`
//! at epoch 0, each batch 1 to 4 records, offsets counted per partition,
//! timestamps from 1.7e12. Three sides replay exactly these batches:
//! - `seed`: the default store (`Semantics::Strict`), `append_batch`;
//! - `kafka plain`: a `Semantics::Kafka` store, the same calls (Kafka's
//!   rules, no transactions);
//! - `kafka txn`: the Kafka store, every batch transactional
//!   (`append_with`, verified when it starts a transaction), and after
//!   every 10th batch of a producer a COMMIT marker from the coordinator
//!   (one more log record and offset). Throughput counts batches only: the
//!   markers are the transactions' cost.
//!
//! Under `Never` one thread appends (the CPU path: classify, log, apply);
//! under `Always` `--threads` threads each own `P / threads` producers and
//! append one batch at a time, each waiting for durability (group commit).
//! Rounds interleave the sides; every round starts from an empty
//! directory.

use std::path::Path;
use std::time::Instant;

use producer_state::{
    AppendOptions, Batch, FsyncPolicy, Marker, Origin, ProducerStateStore, Semantics, StoreOptions,
};
use producer_state_bench::{arg, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PRODUCERS: u64 = 64;
const T0: i64 = 1_700_000_000_000;
/// Batches per transaction.
const PER_TXN: u64 = 10;

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Seed,
    KafkaPlain,
    KafkaTxn,
}

impl Side {
    fn short(self) -> &'static str {
        match self {
            Side::Seed => "seed",
            Side::KafkaPlain => "plain",
            Side::KafkaTxn => "txn",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::Seed => "seed",
            Side::KafkaPlain => "kafka plain",
            Side::KafkaTxn => "kafka txn",
        }
    }
}

/// One producer's batches in order: (first sequence, last sequence) and
/// how many records, with a fixed pseudo-random size per batch.
fn batches_of(p: u64, n: u64) -> Vec<(i32, i32)> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (p + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut seq = 0i32;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 4) as i32 + 1;
            let b = (seq, seq + len - 1);
            seq += len;
            b
        })
        .collect()
}

/// Appends producer `p`'s batches through `store` as `side` says; returns
/// how many batches were accepted (all of them, or an error).
fn run_producer(
    store: &ProducerStateStore,
    side: Side,
    p: u64,
    batches: &[(i32, i32)],
) -> Result<()> {
    let partition = p as i32;
    let mut offset = 0i64;
    for (i, &(first, last)) in batches.iter().enumerate() {
        let batch = Batch::new(first, last, offset, T0 + offset);
        offset += i64::from(last - first + 1);
        let accepted = match side {
            Side::Seed | Side::KafkaPlain => {
                store.append_batch(p, partition, 0, batch)?.is_accepted()
            }
            Side::KafkaTxn => {
                let mut opts = AppendOptions::client().transactional();
                if (i as u64).is_multiple_of(PER_TXN) {
                    opts = opts.verified();
                }
                store
                    .append_with(p, partition, 0, batch, opts)?
                    .is_accepted()
            }
        };
        if !accepted {
            return Err(format!(
                "{}: batch {i} of producer {p} was not accepted",
                side.name()
            )
            .into());
        }
        if side == Side::KafkaTxn && (i as u64 + 1).is_multiple_of(PER_TXN) {
            let m = Marker::commit(0, offset, T0 + offset);
            offset += 1;
            let o = store.append_marker(p, partition, 0, m, Origin::Coordinator)?;
            if !o.is_accepted() {
                return Err(
                    format!("the marker after batch {i} of producer {p} was refused").into(),
                );
            }
        }
    }
    Ok(())
}

/// One round of one side: batches per second.
fn round(
    dir: &Path,
    side: Side,
    policy: FsyncPolicy,
    threads: usize,
    work: &[Vec<(i32, i32)>],
) -> Result<f64> {
    let _ = std::fs::remove_dir_all(dir);
    let mut opts = StoreOptions::default()
        .fsync(policy)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None);
    if side != Side::Seed {
        opts = opts.semantics(Semantics::Kafka);
    }
    let store = ProducerStateStore::open_with(dir, opts)?;
    let total: usize = work.iter().map(Vec::len).sum();
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = &store;
                s.spawn(move || -> std::result::Result<(), String> {
                    for p in (t..work.len()).step_by(threads) {
                        run_producer(store, side, p as u64, &work[p]).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "an appender panicked")??;
        }
        Ok(())
    })?;
    let rate = total as f64 / t.elapsed().as_secs_f64();
    store.close()?;
    std::fs::remove_dir_all(dir)?;
    Ok(rate)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let num = |name: &str, default: u64| -> Result<u64> {
        Ok(match arg(&args, name) {
            Some(v) => v.parse()?,
            None => default,
        })
    };
    let batches = num("--batches", 2_000_000)?;
    let rounds = num("--rounds", 5)? as usize;
    let threads = num("--threads", 8)? as usize;
    let tmp = tempfile::tempdir()?;
    let dir = match arg(&args, "--dir") {
        Some(d) => std::path::PathBuf::from(d).join("txn-bench"),
        None => tmp.path().join("txn-bench"),
    };
    if threads == 0 || threads as u64 > PRODUCERS {
        return Err(format!("--threads must be 1 to {PRODUCERS}").into());
    }
    let per_producer = (batches / PRODUCERS).div_ceil(PER_TXN) * PER_TXN;
    let work: Vec<Vec<(i32, i32)>> = (0..PRODUCERS)
        .map(|p| batches_of(p, per_producer))
        .collect();
    let sides = [Side::Seed, Side::KafkaPlain, Side::KafkaTxn];
    println!(
        "# Transactions against plain batches: {} producers, {} batches each, a COMMIT every {PER_TXN} (medians of {rounds} rounds)\n",
        PRODUCERS, per_producer
    );
    println!(
        "| policy | appenders | seed | kafka plain | kafka txn | txn / seed | txn / kafka plain |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    // Always waits for the disk on every batch: a hundredth of the data.
    let only = arg(&args, "--policy");
    let side = arg(&args, "--side");
    if let Some(s) = &side
        && !sides.iter().any(|x| x.short() == s)
    {
        return Err("--side must be seed, plain or txn".into());
    }
    let runs = |s: Side| side.as_deref().is_none_or(|o| o == s.short());
    for (policy, threads, share) in [
        (FsyncPolicy::Never, 1, 1),
        (FsyncPolicy::Always, threads, 100),
    ] {
        let name = if policy == FsyncPolicy::Never {
            "never"
        } else {
            "always"
        };
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let work: Vec<Vec<(i32, i32)>> = work
            .iter()
            .map(|b| {
                b[..(b.len() / share as usize / PER_TXN as usize * PER_TXN as usize)
                    .max(PER_TXN as usize)]
                    .to_vec()
            })
            .collect();
        let mut rates = vec![Vec::new(); sides.len()];
        let mut ratios = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let mut this = [0.0; 3];
            // Rotate the order so no side always runs first.
            for k in 0..sides.len() {
                let i = (k + r) % sides.len();
                if !runs(sides[i]) {
                    continue;
                }
                this[i] = round(&dir, sides[i], policy, threads, &work)?;
                rates[i].push(this[i]);
            }
            ratios.0.push(this[2] / this[0]);
            ratios.1.push(this[2] / this[1]);
        }
        let k = |v: &Vec<f64>| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0} k/s", median(v.clone()) / 1e3)
            }
        };
        let x = |v: Vec<f64>| {
            if side.is_some() {
                "-".to_string()
            } else {
                format!("{:.2}x", median(v))
            }
        };
        println!(
            "| {} | {threads} | {} | {} | {} | {} | {} |",
            if policy == FsyncPolicy::Never {
                "Never"
            } else {
                "Always"
            },
            k(&rates[0]),
            k(&rates[1]),
            k(&rates[2]),
            x(ratios.0),
            x(ratios.1),
        );
    }
    println!("\n(batches per second; ratios are medians of per-round ratios)");
    Ok(())
}
