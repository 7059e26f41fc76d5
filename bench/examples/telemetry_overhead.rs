//! What the store's metrics cost: append throughput with the library's
//! metrics and events compiled out (the baseline), compiled in with no
//! recorder installed, and with the Prometheus recorder installed, in one
//! run, interleaved round by round.
//!
//! ```sh
//! bench/telemetry-overhead.sh            # builds both binaries, then runs this
//! ```
//!
//! The script builds this example twice: without the bench member's
//! default `telemetry` feature (the library without its `metrics` and
//! `tracing` features) as the baseline, then with it, and runs the second
//! with `--baseline <first>`. Every measurement runs in a process of its
//! own (`--measure <workload>`), so that the three variants start alike,
//! and reports the best of a few repetitions (interference from the
//! machine's other work only ever slows a run down); each round runs the
//! variants back to back in a rotated order, and the tables show the
//! median of each and the median of the per-round ratios to the baseline.
//!
//! Two measures: appends per second of wall time, and appends per second
//! of the process's CPU time (every thread's: the appenders', the
//! flusher's, the kernel's work for them). On a shared 2-core machine
//! with a load of 4 to 5, wall time varies by 2x from run to run and
//! cannot resolve a cost of a few percent; CPU time, which other
//! processes' work does not add to, can. For the `Always` workloads CPU
//! time is the cost the metrics add (their wall time is the disk's).
//!
//! Workloads, each on a fresh store in a temporary directory:
//! - `never-append`: `FsyncPolicy::Never`, one `append` call per append on
//!   1,000 hot keys, one thread: the least work per append, so where a
//!   per-append cost shows most;
//! - `never-append-all`: `FsyncPolicy::Never`, `append_all` calls of 1,000
//!   requests on 1M random keys;
//! - `always-1`: `FsyncPolicy::Always`, one appender (one fsync per append);
//! - `always-16`: `FsyncPolicy::Always`, 16 appender threads sharing group
//!   commits (the histograms' per-group samples).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cpu_time::ProcessTime;
use producer_state::{AppendRequest, FsyncPolicy, ProducerStateStore, StoreOptions};
use producer_state_bench::{arg, in_order_stream, median};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const WORKLOADS: [&str; 4] = ["never-append", "never-append-all", "always-1", "always-16"];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| arg(&args, name);
    if let Some(w) = arg("--measure") {
        if args.iter().any(|a| a == "--recorder") {
            install_recorder()?;
        }
        let dir = tempfile::tempdir()?;
        let reps = if w.starts_with("never") { 5 } else { 3 };
        let (mut wall, mut cpu) = (0f64, 0f64);
        for i in 0..reps {
            let (n, took) = measure(&w, &dir.path().join(i.to_string()))?;
            wall = wall.max(n as f64 / took.wall.as_secs_f64());
            cpu = cpu.max(n as f64 / took.cpu.as_secs_f64());
        }
        println!("{wall} {cpu}");
        return Ok(());
    }
    let Some(baseline) = arg("--baseline") else {
        return Err("usage: telemetry_overhead --baseline <binary built without telemetry> [--rounds N] (see bench/telemetry-overhead.sh)".into());
    };
    let rounds: usize = arg("--rounds").map_or(Ok(11), |r| r.parse())?;
    let me = std::env::current_exe()?;
    let me = me.to_string_lossy();
    let variants: [(&str, &str, &[&str]); 3] = [
        ("baseline: metrics and events compiled out", &baseline, &[]),
        ("compiled in, no recorder", &me, &[]),
        ("Prometheus recorder installed", &me, &["--recorder"]),
    ];
    // rates[measure][workload][variant][round], measure 0 wall, 1 CPU
    let mut rates = vec![vec![vec![Vec::new(); variants.len()]; WORKLOADS.len()]; 2];
    for round in 0..rounds {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            for k in 0..variants.len() {
                let v = (round + k) % variants.len();
                let (_, bin, extra) = variants[v];
                let out = Command::new(bin)
                    .args(["--measure", workload])
                    .args(extra)
                    .output()?;
                if !out.status.success() {
                    return Err(format!(
                        "{bin} --measure {workload} {extra:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                    .into());
                }
                let out = String::from_utf8(out.stdout)?;
                for (m, rate) in out.split_whitespace().enumerate() {
                    rates[m][w][v].push(rate.parse::<f64>()?);
                }
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    for (m, measure) in ["wall", "CPU"].iter().enumerate() {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            for (v, (name, ..)) in variants.iter().enumerate() {
                let r: Vec<String> = rates[m][w][v].iter().map(|&x| human(x)).collect();
                eprintln!("{measure}, {workload}, {name}: {}", r.join(" "));
            }
        }
    }
    for (m, measure) in ["second of wall time", "second of CPU time (all threads)"]
        .iter()
        .enumerate()
    {
        println!("\n## Appends per {measure} ({rounds} rounds, medians)\n");
        println!(
            "| workload | {} | {} | ratio | {} | ratio |",
            variants[0].0, variants[1].0, variants[2].0
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for (w, workload) in WORKLOADS.iter().enumerate() {
            let r = &rates[m][w];
            let ratio = |v: usize| median(r[v].iter().zip(&r[0]).map(|(a, b)| a / b).collect());
            println!(
                "| {workload} | {} | {} | {:.3}x | {} | {:.3}x |",
                human(median(r[0].clone())),
                human(median(r[1].clone())),
                ratio(1),
                human(median(r[2].clone())),
                ratio(2),
            );
        }
    }
    Ok(())
}

#[cfg(feature = "telemetry")]
fn install_recorder() -> Result<()> {
    metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    Ok(())
}

#[cfg(not(feature = "telemetry"))]
fn install_recorder() -> Result<()> {
    Err("built without the telemetry feature: no recorder to install".into())
}

fn human(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2} M/s", rate / 1e6)
    } else {
        format!("{:.1} k/s", rate / 1e3)
    }
}

fn opts(fsync: FsyncPolicy) -> StoreOptions {
    StoreOptions::default()
        .fsync(fsync)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
}

/// The wall and CPU time of a measurement.
struct Took {
    wall: Duration,
    cpu: Duration,
}

/// A clock of both.
struct Clock(Instant, ProcessTime);

impl Clock {
    fn start() -> Clock {
        Clock(Instant::now(), ProcessTime::now())
    }
    fn stop(&self) -> Took {
        Took {
            wall: self.0.elapsed(),
            cpu: self.1.elapsed(),
        }
    }
}

/// Runs `workload` on a new store in `dir`: the appends made and the time
/// they took.
fn measure(workload: &str, dir: &Path) -> Result<(usize, Took)> {
    match workload {
        "never-append" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Never))?;
            let (keys, n) = (1_000u64, 5_000_000usize);
            let t = Clock::start();
            for i in 0..n as u64 {
                std::hint::black_box(store.append(i % keys, 0, 0, (i / keys) as i32)?);
            }
            let r = (n, t.stop());
            store.close()?;
            Ok(r)
        }
        "never-append-all" => {
            let (keys, n) = (1_000_000u64, 2_000_000usize);
            let reqs: Vec<AppendRequest> = in_order_stream(keys, n)
                .into_iter()
                .map(|(k, s)| AppendRequest::single(k, 0, 0, s))
                .collect();
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Never))?;
            let t = Clock::start();
            for chunk in reqs.chunks(1000) {
                std::hint::black_box(store.append_all(chunk));
            }
            let r = (n, t.stop());
            store.close()?;
            Ok(r)
        }
        "always-1" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Always))?;
            let n = 1_000;
            let t = Clock::start();
            for i in 0..n {
                std::hint::black_box(store.append(7u64, 0, 0, i)?);
            }
            let r = (n as usize, t.stop());
            store.close()?;
            Ok(r)
        }
        "always-16" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Always))?;
            let (threads, each) = (16u64, 200i32);
            let t = Clock::start();
            std::thread::scope(|s| {
                for p in 0..threads {
                    let store = &store;
                    s.spawn(move || {
                        for i in 0..each {
                            std::hint::black_box(store.append(p, 0, 0, i).expect("append"));
                        }
                    });
                }
            });
            let r = ((threads * each as u64) as usize, t.stop());
            store.close()?;
            Ok(r)
        }
        other => Err(format!("unknown workload {other}; one of {WORKLOADS:?}").into()),
    }
}
