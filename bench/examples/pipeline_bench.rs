//! One producer writing one partition with five batches in flight (as
//! librdkafka does by default, `max.in.flight` 5) against the same producer
//! with one batch in flight: the goal is at least 3x the
//! batches per second, with the batches sharing group commits.
//!
//! `cargo run --release -p producer-state-bench --example pipeline_bench`
//! (about 30 s). `--batches N` per round (default 2,000), `--rounds N`
//! (default 5; the table shows medians), `--dir PATH` the disk (default a
//! temporary directory), `--in-flight N` the deeper side (default 5: the
//! goal's; others show how batches per commit follow the depth),
//! `--dispatch` to run the deeper side as one connection would with
//! `append_pipelined` (below).
//!
//! Default options (`FsyncPolicy::Always`, 64 MiB segments), in both
//! semantics. One in flight: one thread appends sequence after sequence,
//! each waiting for durability. Five in flight: thread `t` owns sequences
//! `t, t + 5, ...` and hands each to the store in sequence order (after
//! its predecessor was handed over, as a broker dispatches a connection's
//! requests in the order they came); a batch that still reaches the store
//! before its predecessor is answered OUT_OF_ORDER and sent again. With
//! `--dispatch`, one thread hands the batches over with `append_pipelined`,
//! keeping N handed over and not yet answered, and answers them in order
//! with `Pending::wait`, handing the next over as each is answered. Rounds
//! interleave the sides; each starts from an empty directory.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use producer_state::{Batch, BatchOutcome, ProducerStateStore, Semantics, StoreOptions};
use producer_state_bench::{arg, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One round: batches per second and batches per group commit.
fn round(dir: &Path, semantics: Semantics, in_flight: i32, batches: i32) -> Result<(f64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    let store = Arc::new(ProducerStateStore::open_with(
        dir,
        StoreOptions::default().semantics(semantics),
    )?);
    // The first batch goes alone, as a client's does (under Kafka's rules
    // an unknown producer's first batch may have any sequence).
    store.append_batch(7u64, 0, 0, Batch::new(0, 0, 0, 1_700_000_000_000))?;
    let before = store.stats();
    // Each round is bounded in time as well as in count.
    let deadline = Instant::now() + Duration::from_secs(120);
    let start = Instant::now();
    // The sequence last handed to the store: a broker hands a
    // connection's requests over in the order they came.
    let issued = Arc::new((Mutex::new(0i32), Condvar::new()));
    let hs: Vec<_> = (0..in_flight)
        .map(|t| {
            let (store, issued) = (store.clone(), issued.clone());
            std::thread::spawn(move || -> std::result::Result<(), String> {
                for seq in (1 + t..=batches).step_by(in_flight as usize) {
                    let b = Batch::new(seq, seq, i64::from(seq), 1_700_000_000_000);
                    {
                        let (last, turn) = &*issued;
                        let mut last = last.lock().map_err(|_| "poisoned")?;
                        while *last != seq - 1 {
                            let (l, _) = turn
                                .wait_timeout(last, Duration::from_secs(1))
                                .map_err(|_| "poisoned")?;
                            last = l;
                            if Instant::now() > deadline {
                                return Err(format!("sequence {seq}: out of time"));
                            }
                        }
                        *last = seq;
                        turn.notify_all();
                    }
                    // Handed over just after its predecessor: rarely, it
                    // reaches the store first and is sent again.
                    loop {
                        if Instant::now() > deadline {
                            return Err(format!("sequence {seq}: out of time"));
                        }
                        match store
                            .append_batch(7u64, 0, 0, b)
                            .map_err(|e| e.to_string())?
                        {
                            BatchOutcome::Accepted => break,
                            BatchOutcome::OutOfOrder { .. } => std::thread::yield_now(),
                            other => return Err(format!("sequence {seq}: {other:?}")),
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in hs {
        h.join().map_err(|_| "appender panicked")??;
    }
    Ok(rates(&store, &before, start, batches))
}

/// One round of one connection that pipelines: it hands `depth` batches
/// over in order with `append_pipelined` and answers them in order, handing
/// the next over as each is answered. Batches per second and per commit.
fn dispatch_round(
    dir: &Path,
    semantics: Semantics,
    depth: usize,
    batches: i32,
) -> Result<(f64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    let store = ProducerStateStore::open_with(dir, StoreOptions::default().semantics(semantics))?;
    store.append_batch(7u64, 0, 0, Batch::new(0, 0, 0, 1_700_000_000_000))?;
    let before = store.stats();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    let mut pending = std::collections::VecDeque::new();
    let mut next = 1;
    while next <= batches || !pending.is_empty() {
        while pending.len() < depth && next <= batches {
            let r = producer_state::AppendRequest::batch(
                7u64,
                0,
                0,
                Batch::new(next, next, i64::from(next), 1_700_000_000_000),
            );
            pending.push_back((next, store.append_pipelined(&r)));
            next += 1;
        }
        if let Some((seq, p)) = pending.pop_front() {
            match p.wait()? {
                BatchOutcome::Accepted => {}
                other => return Err(format!("sequence {seq}: {other:?}").into()),
            }
        }
        if Instant::now() > deadline {
            return Err("out of time".into());
        }
    }
    Ok(rates(&store, &before, start, batches))
}

/// Batches per second since `start` and batches per group commit since
/// `before`, once every one of `batches` was written.
fn rates(
    store: &ProducerStateStore,
    before: &producer_state::StoreStats,
    start: Instant,
    batches: i32,
) -> (f64, f64) {
    let secs = start.elapsed().as_secs_f64();
    let st = store.stats();
    let fsyncs = (st.log_fsyncs - before.log_fsyncs).max(1);
    let written = st.records_written - before.records_written;
    assert_eq!(written, batches as u64, "every batch written once");
    (f64::from(batches) / secs, written as f64 / fsyncs as f64)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let batches: i32 = arg(&args, "--batches").map_or(Ok(2_000), |v| v.parse())?;
    let rounds: usize = arg(&args, "--rounds").map_or(Ok(5), |v| v.parse())?;
    let depth: i32 = arg(&args, "--in-flight").map_or(Ok(5), |v| v.parse())?;
    let dispatch = args.iter().any(|a| a == "--dispatch");
    let tmp = tempfile::tempdir()?;
    let base = arg(&args, "--dir").map_or_else(|| tmp.path().to_path_buf(), Into::into);
    println!(
        "one producer, one partition, {batches} batches per round, {rounds} rounds, default options (Always)"
    );
    println!(
        "| semantics | 1 in flight batches/s | {depth} in flight batches/s | {depth} / 1 | batches per group commit, 1 / {depth} in flight | goal |"
    );
    println!("|---|---|---|---|---|---|");
    for semantics in [Semantics::Strict, Semantics::Kafka] {
        let (mut one, mut five, mut per1, mut per5) = (vec![], vec![], vec![], vec![]);
        for r in 0..rounds {
            let dir = base.join(format!("round-{r}"));
            let (rate, per) = round(&dir, semantics, 1, batches)?;
            one.push(rate);
            per1.push(per);
            let (rate, per) = if dispatch {
                dispatch_round(&dir, semantics, depth as usize, batches)?
            } else {
                round(&dir, semantics, depth, batches)?
            };
            five.push(rate);
            per5.push(per);
        }
        let ratios: Vec<f64> = five.iter().zip(&one).map(|(f, o)| f / o).collect();
        println!(
            "| {semantics:?} | {:.0} | {:.0} | {:.2}x | {:.2} / {:.2} | >= 3x |",
            median(one),
            median(five),
            median(ratios),
            median(per1),
            median(per5),
        );
    }
    Ok(())
}
