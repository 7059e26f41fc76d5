//! What replication costs, and what many partitions cost, measured in one
//! run on one disk.
//!
//! `cargo run --release -p producer-state-raft --example replicated_bench`
//! (about ten minutes; `--quick` for a smoke run, `--dir PATH` for another
//! disk, `--only replication|processes|failover|scaling`). Prints markdown
//! tables; every figure is the median of three interleaved rounds, since
//! the machine is shared and noisy, and every comparison is a ratio within
//! the run.
//!
//! 1. **Replication.** With 1, 16 and 64 concurrent producers, each
//!    sending one batch at a time and waiting for its answer:
//!    - the single-node `ProducerStateStore` (`FsyncPolicy::Always`: an
//!      accepted append is fsync'ed before it returns), producers on
//!      threads;
//!    - three replicas in this process (in-memory network, no faults), the
//!      Raft log fsync'ed on every replica before it acknowledges, the
//!      state in memory (this crate's design), producers as tasks calling
//!      `Cluster::submit` (one entry per request);
//!    - the same with the producers' requests batched into shared entries
//!      by a `Proposer`;
//!    - the batched cluster with a second WAL per replica: every applied
//!      entry also goes through a `ProducerStateStore` with
//!      `FsyncPolicy::Always` in one `append_all` (the design not taken).
//! 2. **Three processes.** The single store, the batched cluster in one
//!    process, and three node processes on loopback with the producers
//!    going through a `Client`, at 1, 16 and 64 producers, in interleaved
//!    rounds.
//! 3. **Failover.** 24 kills (SIGKILL) of the leader of three node
//!    processes under 16 producers: the time from each kill to the first
//!    append acknowledged by a new leader.
//! 4. **Partitions.** P partitions with 64 producers each, as P stores
//!    (one per partition) or one store holding every partition: resident
//!    memory, threads and files after opening and filling them, and 16
//!    appender threads spread over the partitions: appends/s and log fsyncs
//!    per append.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use producer_state::{AppendRequest, Batch, ProducerStateStore, StoreOptions};
use producer_state_raft::{
    Append, Cluster, ClusterOptions, Command, Outcome, Proposer, ProposerOptions,
};

#[path = "replicated_bench/processes.rs"]
mod processes;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PRODUCERS: [usize; 3] = [1, 16, 64];
const ROUNDS: usize = 3;

#[derive(Clone, Copy, Debug, Default)]
struct Run {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Raft-log fsyncs per append on the leader (replicated runs).
    fsyncs_per_append: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn summarise(runs: &[Run]) -> Run {
    Run {
        per_sec: median(runs.iter().map(|r| r.per_sec).collect()),
        p50_us: median(runs.iter().map(|r| r.p50_us).collect()),
        p99_us: median(runs.iter().map(|r| r.p99_us).collect()),
        fsyncs_per_append: median(runs.iter().map(|r| r.fsyncs_per_append).collect()),
    }
}

fn percentiles(mut lat: Vec<Duration>, n: u64, took: Duration) -> Run {
    lat.sort();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    };
    Run {
        per_sec: n as f64 / took.as_secs_f64(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        fsyncs_per_append: 0.0,
    }
}

fn batch(n: i32) -> Batch {
    Batch::new(n * 4, n * 4 + 3, i64::from(n), 1_700_000_000_000)
}

/// The single-node store: `producers` threads, each appending its own
/// batches one at a time for `time`.
fn single(dir: &Path, producers: usize, time: Duration) -> Result<Run> {
    let store = Arc::new(ProducerStateStore::open(dir)?);
    let start = Instant::now();
    let deadline = start + time;
    let handles: Vec<_> = (0..producers as u64)
        .map(|p| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut n = 0;
                while Instant::now() < deadline && n < 1_000_000 {
                    let t = Instant::now();
                    let o = store.append_batch(p, 0, 0, batch(n)).expect("append");
                    lat.push(t.elapsed());
                    assert_eq!(o, producer_state::BatchOutcome::Accepted);
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().map_err(|_| "producer thread panicked")?);
    }
    let took = start.elapsed();
    Ok(percentiles(lat.clone(), lat.len() as u64, took))
}

/// Three replicas; with `second_wal`, each replica also writes every
/// applied entry through a durable store.
async fn replicated(
    dir: &Path,
    producers: usize,
    time: Duration,
    batched: Option<usize>,
    second_wal: bool,
) -> Result<Run> {
    let mut options = ClusterOptions {
        snapshot_every: 20_000,
        keep_logs: 1_000,
        ..ClusterOptions::default()
    };
    if second_wal {
        let stores: Vec<Mutex<ProducerStateStore>> = (1..=3)
            .map(|id| ProducerStateStore::open(dir.join(format!("wal-{id}"))).map(Mutex::new))
            .collect::<std::result::Result<_, _>>()?;
        let stores = Arc::new(stores);
        options.observer = Some(Arc::new(
            move |node, index, cmd: Option<&Command>, _r: &_| {
                let Some(cmd) = cmd else { return };
                let requests: Vec<AppendRequest> = cmd
                    .appends()
                    .iter()
                    .enumerate()
                    .map(|(slot, a)| {
                        let id = match &a.producer {
                            producer_state_raft::Producer::Id(n) => *n,
                            producer_state_raft::Producer::Name(_) => 0,
                        };
                        let offset =
                            producer_state_raft::command::offset_of(index, slot).unwrap_or(0);
                        AppendRequest::batch(
                            id,
                            a.partition,
                            a.epoch,
                            Batch::new(
                                a.first_sequence,
                                a.last_sequence,
                                offset,
                                a.timestamp.unwrap_or(0),
                            ),
                        )
                    })
                    .collect();
                let store = stores[(node - 1) as usize]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                for r in store.append_all(&requests) {
                    r.expect("second WAL append");
                }
            },
        ));
    }
    let cluster = Arc::new(Cluster::start(dir, options).await?);
    let proposer = batched
        .map(|n| Proposer::with_options(cluster.clone(), ProposerOptions::default().in_flight(n)));
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    let before = cluster.replica(leader).ok_or("no leader")?;
    let f0 = before.log_stats().fsyncs.load(Ordering::Relaxed);
    let (c, pr) = (cluster.clone(), proposer.clone());
    let (lat, took) = drive(producers, time, move |_, cmd| {
        let (cluster, proposer) = (c.clone(), pr.clone());
        async move {
            match &proposer {
                Some(p) => p.submit(cmd).await.expect("answered").response,
                None => cluster.submit(cmd).await.expect("answered").1,
            }
        }
    })
    .await?;
    let f1 = before.log_stats().fsyncs.load(Ordering::Relaxed);
    drop(proposer);
    cluster.shutdown().await;
    let n = lat.len() as u64;
    let mut run = percentiles(lat, n, took);
    run.fsyncs_per_append = (f1 - f0) as f64 / n.max(1) as f64;
    Ok(run)
}

/// `producers` tasks for `time`, producer `p` sending its own batches one
/// at a time through `submit(p, command)`, every answer `ACCEPTED`: each
/// answer's latency, and the time taken.
async fn drive<F, Fut>(
    producers: usize,
    time: Duration,
    submit: F,
) -> Result<(Vec<Duration>, Duration)>
where
    F: Fn(u64, Command) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = producer_state_raft::Response> + Send,
{
    let start = Instant::now();
    let deadline = start + time;
    let tasks: Vec<_> = (0..producers as u64)
        .map(|p| {
            let submit = submit.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n = 0;
                while Instant::now() < deadline && n < 1_000_000 {
                    let t = Instant::now();
                    let r = submit(p, batch_of(p, n)).await;
                    lat.push(t.elapsed());
                    assert!(matches!(r.outcomes[0], Outcome::Accepted { .. }));
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    Ok((lat, start.elapsed()))
}

/// Batch `n` of producer `p` as a command.
fn batch_of(p: u64, n: i32) -> Command {
    let b = batch(n);
    Command::Append(Append::batch(
        p,
        0,
        0,
        b.first_sequence,
        b.last_sequence,
        b.timestamp,
    ))
}

fn fresh(base: &Path, name: &str) -> Result<PathBuf> {
    let d = base.join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Proposals in flight compared in the second table (the default is one
/// of them).
const IN_FLIGHT: [usize; 3] = [1, 2, 4];

async fn replication(base: &Path, time: Duration) -> Result<()> {
    println!("## Replication: three replicas against the single-node store\n");
    println!(
        "Each producer sends one batch at a time and waits for its answer; {} s per run, \
         median of {ROUNDS} interleaved rounds; the Proposer with its default options \
         ({} in flight).\n",
        time.as_secs_f64(),
        ProposerOptions::default().in_flight,
    );
    println!(
        "| producers | single store appends/s | p50 µs | p99 µs \
         | 3 replicas, an entry per request: appends/s | p50 µs | p99 µs | leader fsyncs per append \
         | 3 replicas, batched proposals: appends/s | p50 µs | p99 µs | leader fsyncs per append \
         | batched / single | + a second WAL per replica: appends/s | p99 µs | second WAL / Raft log only |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let default = ProposerOptions::default().in_flight;
    let mut in_flight_rows = Vec::new();
    for &producers in &PRODUCERS {
        let (mut s, mut r, mut w) = (Vec::new(), Vec::new(), Vec::new());
        let mut b: Vec<Vec<Run>> = vec![Vec::new(); IN_FLIGHT.len()];
        for round in 0..ROUNDS {
            let d = |name: &str| fresh(base, &format!("{name}-{producers}-{round}"));
            s.push(single(&d("single")?, producers, time)?);
            r.push(replicated(&d("raft")?, producers, time, None, false).await?);
            for (i, &n) in IN_FLIGHT.iter().enumerate() {
                let dir = d(&format!("batched-{n}"))?;
                b[i].push(replicated(&dir, producers, time, Some(n), false).await?);
            }
            w.push(replicated(&d("wal")?, producers, time, Some(default), true).await?);
            let _ = std::fs::remove_dir_all(base);
            std::fs::create_dir_all(base)?;
        }
        let (s, r, w) = (summarise(&s), summarise(&r), summarise(&w));
        let b: Vec<Run> = b.iter().map(|runs| summarise(runs)).collect();
        let d = IN_FLIGHT
            .iter()
            .position(|&n| n == default)
            .map_or(Run::default(), |i| b[i]);
        println!(
            "| {producers} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {:.3} | {:.2}x | {:.0} | {:.0} | {:.2}x |",
            s.per_sec,
            s.p50_us,
            s.p99_us,
            r.per_sec,
            r.p50_us,
            r.p99_us,
            r.fsyncs_per_append,
            d.per_sec,
            d.p50_us,
            d.p99_us,
            d.fsyncs_per_append,
            d.per_sec / s.per_sec,
            w.per_sec,
            w.p99_us,
            w.per_sec / d.per_sec
        );
        in_flight_rows.push((producers, s, b));
    }
    println!("\nThe Proposer's proposals in flight, in the same rounds:\n");
    println!(
        "| producers | in flight | appends/s | p50 µs | p99 µs | leader fsyncs per append | / single store |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (producers, s, b) in in_flight_rows {
        for (run, n) in b.iter().zip(IN_FLIGHT) {
            println!(
                "| {producers} | {n} | {:.0} | {:.0} | {:.0} | {:.3} | {:.2}x |",
                run.per_sec,
                run.p50_us,
                run.p99_us,
                run.fsyncs_per_append,
                run.per_sec / s.per_sec
            );
        }
    }
    println!();
    Ok(())
}

fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// P partitions of 64 producers: P stores or one. Returns (RSS KiB,
/// threads, files, appends/s, fsyncs per append).
fn partitions(
    base: &Path,
    p: u64,
    per_partition: bool,
    time: Duration,
) -> Result<(u64, u64, u64, f64, f64)> {
    // 1 MiB segments for both layouts: at the default 64 MiB, P stores
    // would preallocate P x 64 MiB of zeros.
    let opts = || StoreOptions::default().segment_size(1 << 20);
    let (rss0, threads0, files0) = (
        status_field("VmRSS:"),
        status_field("Threads:"),
        open_files(),
    );
    let stores: Vec<ProducerStateStore> = if per_partition {
        (0..p)
            .map(|i| ProducerStateStore::open_with(base.join(format!("p{i}")), opts()))
            .collect::<std::result::Result<_, _>>()?
    } else {
        vec![ProducerStateStore::open_with(base.join("all"), opts())?]
    };
    // Fill: 64 producers per partition, one batch each, in append_all
    // groups per store.
    for i in 0..p {
        let store = &stores[if per_partition { i as usize } else { 0 }];
        let reqs: Vec<_> = (0..64u64)
            .map(|pid| AppendRequest::batch(pid, i as i32, 0, Batch::new(0, 0, 0, 0)))
            .collect();
        for r in store.append_all(&reqs) {
            r?;
        }
    }
    let (rss, threads, files) = (
        status_field("VmRSS:").saturating_sub(rss0),
        status_field("Threads:").saturating_sub(threads0),
        open_files().saturating_sub(files0),
    );
    let fsyncs0: u64 = stores.iter().map(|s| s.stats().log_fsyncs).sum();
    let stores = Arc::new(stores);
    let start = Instant::now();
    let deadline = start + time;
    let handles: Vec<_> = (0..16u64)
        .map(|t| {
            let stores = stores.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut seq = vec![0i32; p as usize];
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                while Instant::now() < deadline && n < 10_000_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let part = (x % p) as usize;
                    let store = &stores[if stores.len() > 1 { part } else { 0 }];
                    // Producer 64 + t owns its own key in every partition.
                    let o = store
                        .append(64 + t, part as i32, 0, seq[part])
                        .expect("append");
                    assert_eq!(o, producer_state::AppendOutcome::Accepted);
                    seq[part] += 1;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut n = 0;
    for h in handles {
        n += h.join().map_err(|_| "appender panicked")?;
    }
    let took = start.elapsed();
    let fsyncs: u64 = stores.iter().map(|s| s.stats().log_fsyncs).sum::<u64>() - fsyncs0;
    Ok((
        rss,
        threads,
        files,
        n as f64 / took.as_secs_f64(),
        fsyncs as f64 / n as f64,
    ))
}

fn scaling(base: &Path, time: Duration) -> Result<()> {
    println!("## Partitions: one store per partition against one store for all\n");
    println!(
        "64 producers per partition; then 16 appender threads on random partitions, fsync before every answer; median of {ROUNDS} rounds.\n"
    );
    println!(
        "| partitions | layout | resident KiB | threads | open files | appends/s | log fsyncs per append |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in [16u64, 256] {
        for per_partition in [true, false] {
            let mut rows = Vec::new();
            for round in 0..ROUNDS {
                let dir = fresh(base, &format!("parts-{p}-{per_partition}-{round}"))?;
                rows.push(partitions(&dir, p, per_partition, time)?);
                let _ = std::fs::remove_dir_all(&dir);
            }
            println!(
                "| {p} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} |",
                if per_partition {
                    "a store per partition"
                } else {
                    "one store"
                },
                median(rows.iter().map(|r| r.0 as f64).collect()),
                median(rows.iter().map(|r| r.1 as f64).collect()),
                median(rows.iter().map(|r| r.2 as f64).collect()),
                median(rows.iter().map(|r| r.3).collect()),
                median(rows.iter().map(|r| r.4).collect()),
            );
        }
    }
    println!();
    Ok(())
}

async fn across_processes(base: &Path, time: Duration) -> Result<()> {
    println!("## Three processes against three replicas in one process and the single store\n");
    println!(
        "Each producer sends one batch at a time and waits for its answer; {} s per run, \
         median of {ROUNDS} interleaved rounds. In one process: the cluster and a Proposer \
         (default options). Across processes: three `producer-state-node` processes on \
         loopback (default options, but one runtime thread each: three nodes share the \
         machine's cores; one disk), producers in this process through one `Client` \
         (default options).\n",
        time.as_secs_f64(),
    );
    println!(
        "| producers | single store appends/s | p50 µs | p99 µs \
         | in one process: appends/s | p50 µs | p99 µs | / single \
         | 3 processes: appends/s | p50 µs | p99 µs | leader fsyncs per append | / single |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let default = ProposerOptions::default().in_flight;
    for &producers in &PRODUCERS {
        let (mut s, mut r, mut p) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let d = |name: &str| fresh(base, &format!("{name}-{producers}-{round}"));
            s.push(single(&d("single")?, producers, time)?);
            r.push(replicated(&d("raft")?, producers, time, Some(default), false).await?);
            p.push(processes::run(&d("processes")?, producers, time).await?);
            let _ = std::fs::remove_dir_all(base);
            std::fs::create_dir_all(base)?;
        }
        let (s, r, p) = (summarise(&s), summarise(&r), summarise(&p));
        println!(
            "| {producers} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}x | {:.0} | {:.0} | {:.0} | {:.3} | {:.2}x |",
            s.per_sec,
            s.p50_us,
            s.p99_us,
            r.per_sec,
            r.p50_us,
            r.p99_us,
            r.per_sec / s.per_sec,
            p.per_sec,
            p.p50_us,
            p.p99_us,
            p.fsyncs_per_append,
            p.per_sec / s.per_sec,
        );
    }
    println!();
    Ok(())
}

async fn failover(base: &Path, kills: usize) -> Result<()> {
    println!("## Failover: from a leader's kill -9 to the next acknowledged append\n");
    let producers = 16;
    let mut took = processes::failover(&fresh(base, "failover")?, kills, producers).await?;
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    println!(
        "{kills} kills of the leader of three processes (default options: heartbeat 50 ms, \
         elections after 150 to 300 ms past a 300 ms lease) under {producers} producers, each \
         restarted 0.5 s later:\n"
    );
    println!("| min ms | p10 | median | p90 | max | over 2 s |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
        at(0.0),
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0),
        took.iter().filter(|d| d.as_secs_f64() > 2.0).count()
    );
    println!(
        "\nEach, ms: {}\n",
        took.iter()
            .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

fn main() -> Result<()> {
    // Started again as one of the processes' nodes.
    if let Some(code) = processes::node_main() {
        std::process::exit(code);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let tmp = tempfile::tempdir()?;
    let base = args
        .iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&base)?;
    let time = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(3)
    };
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if wanted("replication") {
        replication(&base.join("replication"), time).await?;
    }
    if wanted("processes") {
        across_processes(&base.join("processes"), time).await?;
    }
    if wanted("failover") {
        failover(&base.join("failover"), if quick { 3 } else { 24 }).await?;
    }
    if wanted("scaling") {
        scaling(&base.join("scaling"), time / 2)?;
    }
    Ok(())
}
