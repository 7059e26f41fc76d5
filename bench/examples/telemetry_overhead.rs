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
//! variants back to back in a rotated order, and the table shows the
//! median rate of each and the median of the per-round ratios to the
//! baseline (the machines this runs on are shared and noisy).
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
use std::time::Instant;

use producer_state::{AppendRequest, FsyncPolicy, ProducerStateStore, StoreOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const WORKLOADS: [&str; 4] = ["never-append", "never-append-all", "always-1", "always-16"];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(w) = arg("--measure") {
        if args.iter().any(|a| a == "--recorder") {
            install_recorder()?;
        }
        let dir = tempfile::tempdir()?;
        let reps = if w.starts_with("never") { 5 } else { 3 };
        let mut best = 0f64;
        for i in 0..reps {
            best = best.max(measure(&w, &dir.path().join(i.to_string()))?);
        }
        println!("{best}");
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
    // rates[workload][variant][round]
    let mut rates = vec![vec![Vec::new(); variants.len()]; WORKLOADS.len()];
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
                let rate: f64 = String::from_utf8(out.stdout)?.trim().parse()?;
                rates[w][v].push(rate);
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    for (w, workload) in WORKLOADS.iter().enumerate() {
        for (v, (name, ..)) in variants.iter().enumerate() {
            let r: Vec<String> = rates[w][v].iter().map(|&x| human(x)).collect();
            eprintln!("{workload}, {name}: {}", r.join(" "));
        }
    }
    println!("\n## Append throughput with the store's metrics ({rounds} rounds, medians)\n");
    println!(
        "| workload | {} | {} | ratio | {} | ratio |",
        variants[0].0, variants[1].0, variants[2].0
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (w, workload) in WORKLOADS.iter().enumerate() {
        let r = &rates[w];
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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

/// Appends per second of `workload` on a new store in `dir`.
fn measure(workload: &str, dir: &Path) -> Result<f64> {
    let rate = |n: usize, t: Instant| n as f64 / t.elapsed().as_secs_f64();
    match workload {
        "never-append" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Never))?;
            let (keys, n) = (1_000u64, 5_000_000usize);
            let t = Instant::now();
            for i in 0..n as u64 {
                std::hint::black_box(store.append(i % keys, 0, 0, (i / keys) as i32)?);
            }
            let r = rate(n, t);
            store.close()?;
            Ok(r)
        }
        "never-append-all" => {
            let (keys, n) = (1_000_000u64, 2_000_000usize);
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut seqs = vec![0i32; keys as usize];
            let reqs: Vec<AppendRequest> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = x % keys;
                    let s = seqs[k as usize];
                    seqs[k as usize] += 1;
                    AppendRequest::single(k, 0, 0, s)
                })
                .collect();
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Never))?;
            let t = Instant::now();
            for chunk in reqs.chunks(1000) {
                std::hint::black_box(store.append_all(chunk));
            }
            let r = rate(n, t);
            store.close()?;
            Ok(r)
        }
        "always-1" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Always))?;
            let n = 1_000;
            let t = Instant::now();
            for i in 0..n {
                std::hint::black_box(store.append(7u64, 0, 0, i)?);
            }
            let r = rate(n as usize, t);
            store.close()?;
            Ok(r)
        }
        "always-16" => {
            let store = ProducerStateStore::open_with(dir, opts(FsyncPolicy::Always))?;
            let (threads, each) = (16u64, 200i32);
            let t = Instant::now();
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
            let r = rate((threads * each as u64) as usize, t);
            store.close()?;
            Ok(r)
        }
        other => Err(format!("unknown workload {other}; one of {WORKLOADS:?}").into()),
    }
}
