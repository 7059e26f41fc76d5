//! The durable store's numbers, side by side, in one run on one disk.
//!
//! `cargo run --release -p producer-state-bench --example bench` (about eight minutes). Prints
//! markdown tables, writes `docs/bench-report.json` and draws
//! `docs/throughput.svg` from the numbers it measured. `--quick` shortens
//! every measurement (for a smoke run); `--dir PATH` puts the files on
//! another disk (default: a temporary directory); `--only SECTION` runs one
//! of `never`, `snapshot`, `recovery`, `lifecycle`; `--replot` redraws the SVG from the
//! last full run's JSON report.
//!
//! Timed runs are repeated (three rounds, interleaved where several
//! contenders are compared) and tables show medians: the machines this
//! runs on are shared and noisy.
//!
//! Measured:
//! - the physical limit: a bare loop of 64-byte `write` + `fdatasync`, and
//!   the same with N records per `fdatasync`; and the floor for one
//!   appender: 64-byte writes over a preallocated file (zeros written and
//!   fsync'ed first) + `fdatasync`, which commits no file-system metadata;
//! - the store with `FsyncPolicy::Always` at 1, 4, 16 and 64 appender
//!   threads: throughput, p50/p99 latency;
//! - SQLite doing the same validate-then-upsert, one transaction per append,
//!   WAL journal, `synchronous=FULL`, at the same thread counts;
//! - the engine alone (no disk) on the same workload;
//! - `FsyncPolicy::Never` against the engine, one append at a time and in
//!   `append_all` calls, and the bare writes of the same log bytes;
//! - a snapshot of 1M keys: its duration and the longest append pause
//!   while it runs;
//! - recovery of a store with 1M keys and 10M log records, against
//!   reading the same bytes (from the page cache and, with `O_DIRECT`,
//!   from the device);
//! - a bare group commit (no store: threads, a buffer, a flusher, futex
//!   wake-ups) at the same thread counts: the machine's floor for latency;
//! - the producer lifecycle (`--only lifecycle`; see `bench/lifecycle.rs`):
//!   10M distinct producer ids through a store capped at 1M keys (memory
//!   against the 1M-key store, throughput against an uncapped store), the
//!   longest append pause during a sweep that expires 1M keys, and
//!   `truncate_to` on a 1M-key store with a 10M-record log against its
//!   recovery.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use producer_state::{
    AppendOutcome, AppendRequest, FsyncPolicy, ProducerStateManager, ProducerStateStore,
    StoreOptions,
};
use producer_state_bench::{in_order_stream, median};
use serde_json::{Value, json};

#[path = "bench/lifecycle.rs"]
mod lifecycle;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const THREADS: [usize; 4] = [1, 4, 16, 64];

/// Rounds of each timed run; tables show the median of each figure.
const ROUNDS: usize = 3;

/// Runs `f` `n` times.
fn rounds<T>(n: usize, mut f: impl FnMut() -> Result<T>) -> Result<Vec<T>> {
    (0..n).map(|_| f()).collect()
}
const PARTITIONS: u64 = 16;

struct Cfg {
    run: Duration,
    dir: PathBuf,
}

/// Throughput and latency of one configuration.
#[derive(Clone, Copy)]
struct Stat {
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

impl Stat {
    fn from(mut lat_ns: Vec<u64>, elapsed: Duration) -> Stat {
        lat_ns.sort_unstable();
        let q = |p: f64| {
            lat_ns
                .get(((lat_ns.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0) as f64
                / 1e3
        };
        Stat {
            ops_per_s: lat_ns.len() as f64 / elapsed.as_secs_f64(),
            p50_us: q(0.50),
            p99_us: q(0.99),
            max_us: q(1.0),
        }
    }

    /// The median of each figure over several runs.
    fn median(runs: &[Stat]) -> Stat {
        let m = |f: fn(&Stat) -> f64| median(runs.iter().map(f).collect());
        Stat {
            ops_per_s: m(|s| s.ops_per_s),
            p50_us: m(|s| s.p50_us),
            p99_us: m(|s| s.p99_us),
            max_us: m(|s| s.max_us),
        }
    }

    fn json(&self) -> Value {
        json!({"ops_per_s": self.ops_per_s, "p50_us": self.p50_us, "p99_us": self.p99_us, "max_us": self.max_us})
    }
}

/// The next append of thread `t`: its own producer id, partitions round-robin.
fn next(t: usize, i: u64) -> (u64, i32, i32) {
    (t as u64, (i % PARTITIONS) as i32, (i / PARTITIONS) as i32)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    if arg("--child").as_deref() == Some("churn") {
        // One measurement of the lifecycle rows, in a process of its own.
        let dir = PathBuf::from(arg("--dir").ok_or("--dir")?);
        let keys = arg("--keys").ok_or("--keys")?.parse()?;
        let cap = arg("--cap").map(|c| c.parse()).transpose()?;
        // For profiling under callgrind, whose slowdown would spread the
        // wall clock's activities: a manual clock moved this many ms per
        // `append_all` call of 10,000, as the native run's clock moves.
        let step = arg("--clock-step-ms").map(|c| c.parse()).transpose()?;
        return lifecycle::churn_child(&dir, keys, cap, step);
    }
    if args.iter().any(|a| a == "--replot") {
        return replot();
    }
    let quick = args.iter().any(|a| a == "--quick");
    // `--only snapshot|recovery|never|threads|lifecycle|expiration`: run one
    // section (the files in docs/ are only written by a full run).
    let only = arg("--only");
    let tmp = tempfile::tempdir()?;
    let dir = arg("--dir").map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    let cfg = Cfg {
        run: Duration::from_millis(if quick { 300 } else { 2000 }),
        dir,
    };
    println!(
        "# producer-state benchmark ({}; files in {})\n",
        if quick { "quick" } else { "full" },
        cfg.dir.display()
    );
    match only.as_deref() {
        None | Some("threads") => full_run(&cfg, quick, only.is_none()),
        Some(section) => one_section(&cfg, quick, section),
    }
}

/// Redraws docs/throughput.svg from the last full run's report.
fn replot() -> Result<()> {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(docs("bench-report.json"))?)?;
    let series = |key: &str, n: &str| -> Vec<(usize, Stat)> {
        report[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|row| {
                let st = &row["stat"];
                let f = |k: &str| st[k].as_f64().unwrap_or(0.0);
                let stat = Stat {
                    ops_per_s: f("ops_per_s"),
                    p50_us: f("p50_us"),
                    p99_us: f("p99_us"),
                    max_us: f("max_us"),
                };
                (row[n].as_u64().unwrap_or(1) as usize, stat)
            })
            .collect()
    };
    let svg_text = svg(
        &series("disk", "records_per_fsync"),
        &series("store_always", "threads"),
        &series("sqlite", "threads"),
        &series("bare_group_commit", "threads"),
    );
    std::fs::write(docs("throughput.svg"), svg_text)?;
    println!("redrew docs/throughput.svg from docs/bench-report.json");
    Ok(())
}

/// `--only SECTION` (other than `threads`): that section alone, its rows
/// as JSON; nothing is written to docs/.
fn one_section(cfg: &Cfg, quick: bool, section: &str) -> Result<()> {
    let show = |v: Value| -> Result<()> {
        println!("{}", serde_json::to_string_pretty(&v)?);
        Ok(())
    };
    match section {
        "never" => {
            never_table(cfg, quick)?;
        }
        "snapshot" => show(snapshot_pause(cfg, 1_000_000)?)?,
        "recovery" => show(recovery(cfg, 1_000_000, 10_000_000)?)?,
        // The expiration sweeps alone (part of the lifecycle rows).
        "expiration" => {
            let keys = if quick { 100_000 } else { 1_000_000 };
            for policy in [FsyncPolicy::Never, FsyncPolicy::Always] {
                show(lifecycle::expiration_pause(&cfg.dir, keys, policy)?)?;
            }
        }
        "lifecycle" => show(lifecycle_rows(cfg, quick)?)?,
        other => return Err(format!("--only {other}: not a section").into()),
    }
    Ok(())
}

/// The store against the disk, SQLite and a bare group commit at each
/// thread count, with the ratios; then (unless `--only threads`) every
/// other section, and a full run's report in docs/.
fn full_run(cfg: &Cfg, quick: bool, all: bool) -> Result<()> {
    let (limit, overwrite) = disk_limit(cfg)?;
    let rows = thread_rows(cfg)?;
    let engine = engine_alone(cfg);
    println!(
        "\nthe engine alone (no disk) on the same workload, one thread: {:.1} million appends/s",
        engine / 1e6
    );
    let ratios = ratios_table(&limit, overwrite, &rows);
    if !all {
        return Ok(());
    }
    let never_rows = never_table(cfg, quick)?;
    let snap = snapshot_section(cfg, quick)?;
    let rec = recovery_section(cfg, quick)?;
    let life = lifecycle_section(cfg, quick)?;
    let report = json!({
        "quick": quick,
        "disk": limit.iter().map(|(n, s)| json!({"records_per_fsync": n, "stat": s.json()})).collect::<Vec<_>>(),
        "disk_overwrite_preallocated": overwrite.json(),
        "store_always": rows.store.iter().map(|(t, s)| json!({"threads": t, "stat": s.json()})).collect::<Vec<_>>(),
        "sqlite": rows.sqlite.iter().map(|(t, s)| json!({"threads": t, "stat": s.json()})).collect::<Vec<_>>(),
        "bare_group_commit": rows.bare.iter().map(|(t, s)| json!({"threads": t, "stat": s.json()})).collect::<Vec<_>>(),
        "engine_ops_per_s": engine,
        "ratios": ratios,
        "never_vs_engine": never_rows,
        "snapshot": snap,
        "recovery": rec,
        "lifecycle": life,
    });
    if !quick {
        std::fs::write(
            docs("bench-report.json"),
            serde_json::to_string_pretty(&report)? + "\n",
        )?;
        std::fs::write(
            docs("throughput.svg"),
            svg(&limit, &rows.store, &rows.sqlite, &rows.bare),
        )?;
        println!("\nwrote docs/bench-report.json and docs/throughput.svg");
    }
    Ok(())
}

/// The physical limit: 64-byte records N per fdatasync at each thread
/// count's N, and the floor for one appender (overwriting a preallocated
/// file).
fn disk_limit(cfg: &Cfg) -> Result<(Vec<(usize, Stat)>, Stat)> {
    println!("## The disk: 64-byte records, N per fdatasync\n");
    println!("| records per fdatasync | records/s | fdatasync p50 (us) | p99 (us) |");
    println!("|---:|---:|---:|---:|");
    let mut limit = Vec::new();
    for n in THREADS {
        let s = Stat::median(&rounds(ROUNDS, || bare_fsync_loop(cfg, n))?);
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} |",
            s.ops_per_s, s.p50_us, s.p99_us
        );
        limit.push((n, s));
    }
    let overwrite = Stat::median(&rounds(ROUNDS, || bare_overwrite_loop(cfg))?);
    println!(
        "\nthe floor for one appender, 64-byte writes over a preallocated file + fdatasync: {:.0} records/s (p50 {:.0} us, p99 {:.0} us)",
        overwrite.ops_per_s, overwrite.p50_us, overwrite.p99_us
    );
    Ok((limit, overwrite))
}

/// The store, SQLite (at its better way of connecting) and the bare group
/// commit, by thread count.
struct ThreadRows {
    store: Vec<(usize, Stat)>,
    sqlite: Vec<(usize, Stat)>,
    bare: Vec<(usize, Stat)>,
}

/// The store, SQLite and a bare group commit at each thread count, the
/// same workload on the same disk, their rounds interleaved.
fn thread_rows(cfg: &Cfg) -> Result<ThreadRows> {
    println!("\n## Durable appends by thread count (same workload, same disk)\n");
    println!(
        "| threads | store appends/s | p50 (us) | p99 (us) | SQLite appends/s (better of shared, per-thread connections) | p50 (us) | p99 (us) | SQLite shared / per-thread appends/s | store / SQLite | bare group commit appends/s | p50 (us) | p99 (us) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = ThreadRows {
        store: Vec::new(),
        sqlite: Vec::new(),
        bare: Vec::new(),
    };
    for t in THREADS {
        // Rounds interleave the three, so drift hits them alike.
        let (mut ss, mut qs, mut qp, mut bs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            ss.push(store_threads(cfg, t)?);
            qs.push(sqlite_threads(cfg, t, Sharing::OneConnection)?);
            qp.push(sqlite_threads(cfg, t, Sharing::PerThread)?);
            bs.push(bare_group_commit(cfg, t)?);
        }
        let (s, b) = (Stat::median(&ss), Stat::median(&bs));
        // SQLite at its best: whichever way of connecting went faster.
        let (shared, per_thread) = (Stat::median(&qs), Stat::median(&qp));
        let q = if shared.ops_per_s >= per_thread.ops_per_s {
            shared
        } else {
            per_thread
        };
        println!(
            "| {t} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} / {:.0} | {:.1}x | {:.0} | {:.0} | {:.0} |",
            s.ops_per_s,
            s.p50_us,
            s.p99_us,
            q.ops_per_s,
            q.p50_us,
            q.p99_us,
            shared.ops_per_s,
            per_thread.ops_per_s,
            s.ops_per_s / q.ops_per_s,
            b.ops_per_s,
            b.p50_us,
            b.p99_us
        );
        rows.store.push((t, s));
        rows.sqlite.push((t, q));
        rows.bare.push((t, b));
    }
    Ok(rows)
}

/// The goals' ratios of this run, printed and returned for the report.
fn ratios_table(limit: &[(usize, Stat)], overwrite: Stat, rows: &ThreadRows) -> Value {
    let one_fsync = limit[0].1;
    let (s1, s64) = (rows.store[0].1, rows.store[3].1);
    let (q1, q64) = (rows.sqlite[0].1, rows.sqlite[3].1);
    let b64 = rows.bare[3].1;
    println!("\n## Ratios (this run)\n");
    println!("| measure | value | goal |");
    println!("|---|---:|---:|");
    println!(
        "| store, 1 thread / bare write+fdatasync | {:.2}x | (was the floor) |",
        s1.ops_per_s / one_fsync.ops_per_s
    );
    println!(
        "| store, 1 thread / bare overwrite of a preallocated file+fdatasync | {:.2}x | >= 0.9x |",
        s1.ops_per_s / overwrite.ops_per_s
    );
    println!(
        "| store, 1 thread / SQLite, 1 thread (its better connection) | {:.2}x | >= 1.0x |",
        s1.ops_per_s / q1.ops_per_s
    );
    println!(
        "| store, 64 threads / store, 1 thread | {:.1}x | >= 20x |",
        s64.ops_per_s / s1.ops_per_s
    );
    println!(
        "| store, 64 threads / SQLite, 64 threads | {:.1}x | >= 10x |",
        s64.ops_per_s / q64.ops_per_s
    );
    println!(
        "| store p99 at 64 threads / one fdatasync (p50) | {:.1}x | <= 3x |",
        s64.p99_us / one_fsync.p50_us
    );
    println!(
        "| bare group commit p99 at 64 threads / one fdatasync (p50) | {:.1}x | (the machine's floor) |",
        b64.p99_us / one_fsync.p50_us
    );
    println!(
        "| store p99 / bare group commit p99, 64 threads | {:.2}x | (what the store adds) |",
        s64.p99_us / b64.p99_us
    );
    json!({
        "store1_over_bare_fsync": s1.ops_per_s / one_fsync.ops_per_s,
        "store1_over_bare_overwrite": s1.ops_per_s / overwrite.ops_per_s,
        "store1_over_sqlite1": s1.ops_per_s / q1.ops_per_s,
        "store64_over_store1": s64.ops_per_s / s1.ops_per_s,
        "store64_over_sqlite64": s64.ops_per_s / q64.ops_per_s,
        "store64_p99_over_fsync_p50": s64.p99_us / one_fsync.p50_us,
        "bare_group_commit64_p99_over_fsync_p50": b64.p99_us / one_fsync.p50_us,
        "store64_p99_over_bare_group_commit64_p99": s64.p99_us / b64.p99_us,
    })
}

/// Prints a section's rows as a two-column table.
fn print_rows(rows: &Value) {
    println!("| measure | value |");
    println!("|---|---:|");
    for (k, v) in rows.as_object().into_iter().flatten() {
        println!("| {k} | {v} |");
    }
}

/// A snapshot of 1M keys and the pause appenders see.
fn snapshot_section(cfg: &Cfg, quick: bool) -> Result<Value> {
    let keys = if quick { 200_000 } else { 1_000_000 };
    println!("\n## Snapshot of {keys} keys\n");
    let snap = snapshot_pause(cfg, keys)?;
    print_rows(&snap);
    Ok(snap)
}

/// Recovery of 1M keys and 10M records.
fn recovery_section(cfg: &Cfg, quick: bool) -> Result<Value> {
    let (keys, records) = if quick {
        (100_000, 1_000_000)
    } else {
        (1_000_000, 10_000_000)
    };
    println!("\n## Recovery of {keys} keys and {records} log records\n");
    let rec = recovery(cfg, keys, records)?;
    print_rows(&rec);
    Ok(rec)
}

/// The producer lifecycle's rows.
fn lifecycle_section(cfg: &Cfg, quick: bool) -> Result<Value> {
    println!("\n## The producer lifecycle\n");
    let life = lifecycle_rows(cfg, quick)?;
    println!("| measure | value |");
    println!("|---|---:|");
    for (section, rows) in life.as_object().into_iter().flatten() {
        for (k, v) in rows.as_object().into_iter().flatten() {
            println!("| {section}: {k} | {v} |");
        }
    }
    Ok(life)
}

/// 64-byte appends to a file, `n` per `fdatasync`.
fn bare_fsync_loop(cfg: &Cfg, n: usize) -> Result<Stat> {
    let path = cfg.dir.join(format!("bare-{n}.bin"));
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let rec = [0xabu8; 64];
    let mut lat = Vec::new();
    let mut records = 0u64;
    let start = Instant::now();
    while start.elapsed() < cfg.run {
        let t = Instant::now();
        for _ in 0..n {
            f.write_all(&rec)?;
        }
        f.sync_data()?;
        lat.push(t.elapsed().as_nanos() as u64);
        records += n as u64;
    }
    let elapsed = start.elapsed();
    let mut s = Stat::from(lat, elapsed);
    s.ops_per_s = records as f64 / elapsed.as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(s)
}

/// 64-byte records written over a file whose blocks are allocated and
/// written (64 MiB of zeros, fsync'ed, first), one `fdatasync` each: with
/// no block to allocate and no length to change, the fdatasync commits
/// no file-system metadata. The floor for one durable appender.
fn bare_overwrite_loop(cfg: &Cfg) -> Result<Stat> {
    use std::os::unix::fs::FileExt;
    const SIZE: u64 = 64 << 20;
    let path = cfg.dir.join("bare-overwrite.bin");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..SIZE / zeros.len() as u64 {
        f.write_all(&zeros)?;
    }
    f.sync_all()?;
    let rec = [0xabu8; 64];
    let mut lat = Vec::new();
    let mut at = 0u64;
    let start = Instant::now();
    while start.elapsed() < cfg.run && at + 64 <= SIZE {
        let t = Instant::now();
        f.write_all_at(&rec, at)?;
        f.sync_data()?;
        lat.push(t.elapsed().as_nanos() as u64);
        at += 64;
    }
    let elapsed = start.elapsed();
    let mut s = Stat::from(lat, elapsed);
    s.ops_per_s = (at / 64) as f64 / elapsed.as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(s)
}

/// The least a blocking group commit costs on this machine: `threads`
/// appenders each put a 31-byte record into a shared buffer under a mutex
/// and sleep on a futex word until a flusher thread has written and
/// fdatasync'ed their group, the store's wake-up scheme with no
/// validation, state or encoding. The store's latency against this is
/// what the store adds; this against one fdatasync is what the machine
/// (two cores waking dozens of threads) and the disk cost.
fn bare_group_commit(cfg: &Cfg, threads: usize) -> Result<Stat> {
    struct Queue {
        buf: Vec<u8>,
        next: u64,
        group: u64,
        idle: bool,
    }
    struct Commit {
        queue: Mutex<Queue>,
        done: AtomicU64,
        words: [AtomicU32; 4],
        flusher: Mutex<Option<std::thread::Thread>>,
        stop: AtomicBool,
    }
    let path = cfg.dir.join("bare-group-commit.bin");
    let mut file = File::create(&path)?;
    let c = Arc::new(Commit {
        queue: Mutex::new(Queue {
            buf: Vec::new(),
            next: 0,
            group: 0,
            idle: true,
        }),
        done: AtomicU64::new(0),
        words: Default::default(),
        flusher: Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    let flusher = {
        let c = c.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            loop {
                let mut q = c.queue.lock().expect("queue");
                if q.buf.is_empty() {
                    q.idle = true;
                    drop(q);
                    if c.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    std::thread::park();
                    continue;
                }
                let buf = std::mem::take(&mut q.buf);
                let group = q.group;
                q.group += 1;
                drop(q);
                file.write_all(&buf)?;
                file.sync_data()?;
                c.done.store(group + 1, Ordering::Release);
                let w = &c.words[group as usize % 4];
                w.fetch_add(1, Ordering::Release);
                atomic_wait::wake_all(w);
            }
        })
    };
    *c.flusher.lock().expect("flusher") = Some(flusher.thread().clone());
    let a = c.clone();
    let stat = drive(cfg, threads, move |_, _| {
        let mut q = a.queue.lock().expect("queue");
        q.buf.extend_from_slice(&[0xab; 31]);
        q.next += 1;
        let group = q.group;
        if std::mem::take(&mut q.idle)
            && let Some(t) = &*a.flusher.lock().expect("flusher")
        {
            t.unpark();
        }
        drop(q);
        let w = &a.words[group as usize % 4];
        loop {
            let seen = w.load(Ordering::Acquire);
            if a.done.load(Ordering::Acquire) > group {
                return AppendOutcome::Accepted;
            }
            atomic_wait::wait(w, seen);
        }
    });
    c.stop.store(true, Ordering::Release);
    flusher.thread().unpark();
    flusher.join().expect("flusher")?;
    std::fs::remove_file(path)?;
    Ok(stat)
}

/// Runs `threads` appender threads for `cfg.run`, each calling
/// `append(thread, i)` for i = 0, 1, ... and timing every call.
fn drive(
    cfg: &Cfg,
    threads: usize,
    append: impl Fn(usize, u64) -> AppendOutcome + Send + Sync + 'static,
) -> Stat {
    let append = Arc::new(append);
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (append, stop, barrier) = (append.clone(), stop.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                barrier.wait();
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let s = Instant::now();
                    let o = append(t, i);
                    lat.push(s.elapsed().as_nanos() as u64);
                    assert_eq!(o, AppendOutcome::Accepted);
                }
                lat
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(cfg.run);
    stop.store(true, Ordering::Relaxed);
    let lat: Vec<u64> = hs
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect();
    Stat::from(lat, start.elapsed())
}

/// The store, `FsyncPolicy::Always`, `threads` appenders for `cfg.run`.
fn store_threads(cfg: &Cfg, threads: usize) -> Result<Stat> {
    let dir = cfg.dir.join(format!("store-{threads}"));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(ProducerStateStore::open(&dir)?);
    let s = store.clone();
    let stat = drive(cfg, threads, move |t, i| {
        let (p, part, seq) = next(t, i);
        s.append(p, part, 0, seq).expect("append")
    });
    let st = store.stats();
    eprintln!(
        "  store, {threads} threads: {:.1} records per fsync",
        st.records_written as f64 / st.log_fsyncs.max(1) as f64
    );
    drop(store);
    std::fs::remove_dir_all(&dir)?;
    Ok(stat)
}

/// How the SQLite appenders reach the database.
#[derive(Clone, Copy)]
enum Sharing {
    /// One connection behind a mutex: SQLite admits one writer at a time,
    /// and sharing the connection avoids its busy-retry sleeps.
    OneConnection,
    /// A connection per thread, SQLite's own locking between them (a busy
    /// writer waits up to 10 s).
    PerThread,
}

/// SQLite at equal durability: WAL journal, `synchronous=FULL`, one
/// transaction per append doing the same validate-then-upsert. Measured
/// both ways of connecting; the comparison takes the better.
fn sqlite_threads(cfg: &Cfg, threads: usize, sharing: Sharing) -> Result<Stat> {
    let path = cfg.dir.join(format!("sqlite-{threads}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let connect = || -> Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(&path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(10))?;
        Ok(conn)
    };
    let first = connect()?;
    first.execute_batch(
        "CREATE TABLE producer_state (producer_id INTEGER NOT NULL, partition INTEGER NOT NULL,
         epoch INTEGER NOT NULL, last_seq INTEGER NOT NULL, PRIMARY KEY (producer_id, partition)) WITHOUT ROWID;",
    )?;
    let conns: Vec<Mutex<rusqlite::Connection>> = match sharing {
        Sharing::OneConnection => vec![Mutex::new(first)],
        Sharing::PerThread => {
            let mut v = vec![Mutex::new(first)];
            for _ in 1..threads {
                v.push(Mutex::new(connect()?));
            }
            v
        }
    };
    let conns = Arc::new(conns);
    Ok(drive(cfg, threads, move |t, i| {
        let (p, part, seq) = next(t, i);
        let conn = &conns[t % conns.len()];
        sqlite_append(conn, p, part, 0, seq).expect("sqlite append")
    }))
}

/// The four rules as one SQLite transaction.
fn sqlite_append(
    conn: &Mutex<rusqlite::Connection>,
    pid: u64,
    part: i32,
    epoch: i16,
    seq: i32,
) -> rusqlite::Result<AppendOutcome> {
    let mut conn = conn.lock().expect("connection");
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let cur: Option<(i64, i64)> = tx
        .prepare_cached(
            "SELECT epoch, last_seq FROM producer_state WHERE producer_id = ?1 AND partition = ?2",
        )?
        .query_row((pid as i64, part), |r| Ok((r.get(0)?, r.get(1)?)))
        .map(Some)
        .or_else(|e| {
            if e == rusqlite::Error::QueryReturnedNoRows {
                Ok(None)
            } else {
                Err(e)
            }
        })?;
    let (e, s) = (i64::from(epoch), i64::from(seq));
    let outcome = match cur {
        None if s == 0 => AppendOutcome::Accepted,
        None => AppendOutcome::OutOfOrder,
        Some((ce, _)) if e < ce => AppendOutcome::FencedEpoch,
        Some((ce, _)) if e > ce => {
            if s == 0 {
                AppendOutcome::Accepted
            } else {
                AppendOutcome::OutOfOrder
            }
        }
        Some((_, last))
            if s == if last == i64::from(i32::MAX) {
                0
            } else {
                last + 1
            } =>
        {
            AppendOutcome::Accepted
        }
        Some((_, last)) if s <= last => AppendOutcome::Duplicate,
        Some(_) => AppendOutcome::OutOfOrder,
    };
    if outcome == AppendOutcome::Accepted {
        tx.prepare_cached(
            "INSERT INTO producer_state (producer_id, partition, epoch, last_seq) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (producer_id, partition) DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq",
        )?
        .execute((pid as i64, part, e, s))?;
    }
    tx.commit()?;
    Ok(outcome)
}

/// The engine on the same workload, one thread, no disk.
fn engine_alone(cfg: &Cfg) -> f64 {
    let mut m = ProducerStateManager::new();
    let mut n = 0u64;
    let start = Instant::now();
    while start.elapsed() < cfg.run / 4 {
        for _ in 0..100_000 {
            let (p, part, seq) = next(0, n);
            assert_eq!(m.append(p, part, 0, seq), AppendOutcome::Accepted);
            n += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Prints and returns the `Never` rows.
fn never_table(cfg: &Cfg, quick: bool) -> Result<Vec<Value>> {
    println!("\n## FsyncPolicy::Never against the in-memory engine (one thread)\n");
    println!(
        "| workload | engine | store, append | ratio | store, append_all | ratio | log writes alone | ratio | log writes + segment fsyncs | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (name, keys) in [("1k hot keys", 1_000u64), ("1M keys, random", 1_000_000)] {
        let n = never_vs_engine(cfg, keys, if quick { 1_000_000 } else { 5_000_000 })?;
        let m = |v: f64| v / 1e6;
        println!(
            "| {name} | {:.1} M/s | {:.1} M/s | {:.2}x | {:.1} M/s | {:.2}x | {:.1} M/s | {:.2}x | {:.1} M/s | {:.2}x |",
            m(n.engine),
            m(n.single),
            n.single / n.engine,
            m(n.batched),
            n.batched / n.engine,
            m(n.write_floor),
            n.write_floor / n.engine,
            m(n.disk_floor),
            n.disk_floor / n.engine
        );
        rows.push(json!({
            "workload": name,
            "appends": n.ops,
            "log_bytes_per_append": n.bytes_per_append,
            "engine_ops_per_s": n.engine,
            "store_never_append_ops_per_s": n.single,
            "store_never_append_all_ops_per_s": n.batched,
            "log_writes_alone_records_per_s": n.write_floor,
            "log_writes_and_segment_fsyncs_records_per_s": n.disk_floor,
            "append_over_engine": n.single / n.engine,
            "append_all_over_engine": n.batched / n.engine,
            "log_writes_alone_over_engine": n.write_floor / n.engine,
            "log_writes_and_segment_fsyncs_over_engine": n.disk_floor / n.engine,
        }));
    }
    Ok(rows)
}

/// `FsyncPolicy::Never` against the engine on one workload, appends/s.
struct Never {
    ops: usize,
    engine: f64,
    single: f64,
    batched: f64,
    /// Bytes of log the store wrote per append.
    bytes_per_append: f64,
    /// Appends per second whose log bytes 64 KiB `write`s hand to the OS:
    /// the least any store that logs every append pays.
    write_floor: f64,
    /// The same with an `fdatasync` per 64 MiB (the default segment size),
    /// as a store that fsyncs each segment it leaves must: in a long run,
    /// the disk's write bandwidth.
    disk_floor: f64,
}

/// The log bytes of a store directory.
fn wal_bytes(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().ends_with(".wal") {
            n += e.metadata()?.len();
        }
    }
    Ok(n)
}

/// In-order appends to random keys of `keys`, `ops` of them: the engine,
/// the store one append at a time and in `append_all` calls of 1,000
/// (requests built as a broker would decode them; until the last call
/// returns, with at most 1 MiB of log still buffered), and the bare
/// writes of the same log bytes, without and with the segment fsyncs.
/// Medians of 5 interleaved rounds.
fn never_vs_engine(cfg: &Cfg, keys: u64, ops: usize) -> Result<Never> {
    let stream = in_order_stream(keys, ops);
    let opts = || {
        StoreOptions::default()
            .fsync(FsyncPolicy::Never)
            .snapshot_every_records(None)
            .snapshot_every_bytes(None)
    };
    let rate = |t: Instant| ops as f64 / t.elapsed().as_secs_f64();
    let (mut engine, mut single, mut batched) = (vec![], vec![], vec![]);
    let (mut floor, mut disk) = (vec![], vec![]);
    let mut log_bytes = 0;
    for _ in 0..5 {
        let mut m = ProducerStateManager::new();
        let t = Instant::now();
        for &(k, s) in &stream {
            std::hint::black_box(m.append(k, 0, 0, s));
        }
        engine.push(rate(t));
        drop(m);

        let dir = cfg.dir.join("never");
        let _ = std::fs::remove_dir_all(&dir);
        let store = ProducerStateStore::open_with(&dir, opts())?;
        let t = Instant::now();
        for &(k, s) in &stream {
            std::hint::black_box(store.append(k, 0, 0, s)?);
        }
        single.push(rate(t));
        store.close()?;
        std::fs::remove_dir_all(&dir)?;

        let store = ProducerStateStore::open_with(&dir, opts())?;
        let mut reqs = Vec::with_capacity(1000);
        let t = Instant::now();
        for chunk in stream.chunks(1000) {
            reqs.clear();
            reqs.extend(
                chunk
                    .iter()
                    .map(|&(k, s)| AppendRequest::single(k, 0, 0, s)),
            );
            std::hint::black_box(store.append_all(&reqs));
        }
        batched.push(rate(t));
        store.close()?;
        log_bytes = wal_bytes(&dir)?;
        std::fs::remove_dir_all(&dir)?;

        for fsyncs in [false, true] {
            let path = cfg.dir.join("never-floor.bin");
            let mut f = File::create(&path)?;
            let block = vec![0xabu8; 64 << 10];
            let mut left = log_bytes as usize;
            let mut since_sync = 0;
            let t = Instant::now();
            while left > 0 {
                let n = left.min(block.len());
                f.write_all(&block[..n])?;
                left -= n;
                since_sync += n;
                if fsyncs && since_sync >= 64 << 20 {
                    f.sync_data()?;
                    since_sync = 0;
                }
            }
            if fsyncs {
                disk.push(rate(t))
            } else {
                floor.push(rate(t))
            }
            drop(f);
            std::fs::remove_file(&path)?;
        }
    }
    Ok(Never {
        ops,
        engine: median(engine),
        single: median(single),
        batched: median(batched),
        bytes_per_append: log_bytes as f64 / ops as f64,
        write_floor: median(floor),
        disk_floor: median(disk),
    })
}

/// The lifecycle rows (see `bench/lifecycle.rs`).
fn lifecycle_rows(cfg: &Cfg, quick: bool) -> Result<Value> {
    let (keys, records) = if quick {
        (100_000, 1_000_000)
    } else {
        (1_000_000, 10_000_000)
    };
    let churn = lifecycle::churn(&cfg.dir, quick)?;
    let sweep_never = lifecycle::expiration_pause(&cfg.dir, keys, FsyncPolicy::Never)?;
    let sweep_always = lifecycle::expiration_pause(&cfg.dir, keys, FsyncPolicy::Always)?;
    let truncation = lifecycle::truncation(&cfg.dir, keys, records)?;
    Ok(json!({
        "churn": churn,
        "expiration_sweep_never": sweep_never,
        "expiration_sweep_always": sweep_always,
        "truncation": truncation,
    }))
}

/// Builds a store with `keys` keys through buffered bulk appends.
fn build(dir: &Path, keys: u64, per_key: u64, opts: StoreOptions) -> Result<ProducerStateStore> {
    let _ = std::fs::remove_dir_all(dir);
    let store = ProducerStateStore::open_with(dir, opts)?;
    append_rounds(&store, 0..keys, per_key)?;
    Ok(store)
}

/// `rounds` single-sequence appends to each key of `keys` (numeric ids,
/// sequence = round), in `append_all` calls of 10,000.
fn append_rounds(
    store: &ProducerStateStore,
    keys: std::ops::Range<u64>,
    rounds: u64,
) -> Result<()> {
    let mut chunk = Vec::with_capacity(10_000);
    for round in 0..rounds {
        for k in keys.clone() {
            chunk.push(AppendRequest::single(
                k,
                (k % PARTITIONS) as i32,
                0,
                round as i32,
            ));
            if chunk.len() == 10_000 {
                for o in store.append_all(&chunk) {
                    assert!(o?.is_accepted());
                }
                chunk.clear();
            }
        }
    }
    for o in store.append_all(&chunk) {
        assert!(o?.is_accepted());
    }
    Ok(())
}

/// Snapshot duration and the longest append pause while it runs.
fn snapshot_pause(cfg: &Cfg, keys: u64) -> Result<Value> {
    let dir = cfg.dir.join("snapshot");
    let opts = |p| {
        StoreOptions::default()
            .fsync(p)
            .snapshot_every_records(None)
            .snapshot_every_bytes(None)
    };
    let store = build(&dir, keys, 1, opts(FsyncPolicy::Never))?;
    store.sync()?;
    store.close()?;
    // Three rounds, medians: a single maximum on a shared machine is noise.
    let mut rounds: Vec<serde_json::Map<String, Value>> = Vec::new();
    for _ in 0..3 {
        let mut out = serde_json::Map::new();
        // A snapshot on its own (something to snapshot: one more append).
        let store = ProducerStateStore::open_with(&dir, opts(FsyncPolicy::Never))?;
        let k = 0u64;
        let next = store
            .get(k, (k % PARTITIONS) as i32)
            .map_or(0, |e| e.last_sequence() + 1);
        store.append(k, (k % PARTITIONS) as i32, 0, next)?;
        store.sync()?;
        let t = Instant::now();
        let path = store.snapshot()?.ok_or("no snapshot")?;
        out.insert("snapshot_ms_alone".into(), json!(ms(t.elapsed())));
        out.insert(
            "snapshot_bytes".into(),
            json!(std::fs::metadata(&path)?.len()),
        );
        store.close()?;
        for (name, policy) in [
            ("never", FsyncPolicy::Never),
            ("always", FsyncPolicy::Always),
        ] {
            for (k, v) in snapshot_with_appender(&dir, keys, opts(policy))? {
                out.insert(format!("{name}_{k}"), v);
            }
        }
        rounds.push(out);
    }
    std::fs::remove_dir_all(&dir)?;
    let mut out = serde_json::Map::new();
    out.insert("keys".into(), json!(keys));
    out.insert("rounds".into(), json!(rounds.len()));
    for k in rounds[0].keys() {
        let v = median(rounds.iter().filter_map(|r| r[k].as_f64()).collect());
        out.insert(k.clone(), json!(round2(v)));
    }
    Ok(Value::Object(out))
}

fn ms(d: Duration) -> f64 {
    round2(d.as_secs_f64() * 1e3)
}

/// One snapshot while an appender runs: its duration, the appends during
/// it, and the longest append during it and outside it.
fn snapshot_with_appender(
    dir: &Path,
    keys: u64,
    opts: StoreOptions,
) -> Result<Vec<(&'static str, Value)>> {
    let store = Arc::new(ProducerStateStore::open_with(dir, opts)?);
    let mut next: HashMap<u64, i32> = HashMap::new();
    let mut x = 12345u64;
    let ((), took, p) = while_appending(
        &store,
        move |store| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % keys;
            let s = next.entry(k).or_insert_with(|| {
                store
                    .get(k, (k % PARTITIONS) as i32)
                    .map_or(0, |e| e.last_sequence() + 1)
            });
            *s += 1;
            (k, (k % PARTITIONS) as i32, *s - 1)
        },
        || store.snapshot().map(drop).map_err(Into::into),
    )?;
    let out = vec![
        ("snapshot_ms_with_appender", json!(ms(took))),
        ("appends_during_snapshot", json!(p.appends_during)),
        (
            "longest_append_ms_during_snapshot",
            json!(p.longest_during_ms),
        ),
        ("longest_append_ms_otherwise", json!(p.longest_otherwise_ms)),
    ];
    Arc::try_unwrap(store)
        .map_err(|_| "store still shared")?
        .close()?;
    Ok(out)
}

/// Runs `work` while a thread appends (one `append` at a time) the
/// (key, partition, sequence) that `next` gives, from 300 ms before to
/// 300 ms after: what `work` returned, how long it took, and what the
/// appender saw meanwhile.
fn while_appending<T>(
    store: &Arc<ProducerStateStore>,
    mut next: impl FnMut(&ProducerStateStore) -> (u64, i32, i32) + Send + 'static,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Duration, Pauses)> {
    let stop = Arc::new(AtomicBool::new(false));
    let h = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut log = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (k, p, s) = next(&store);
                let t = Instant::now();
                let o = store.append(k, p, 0, s).expect("append");
                assert_eq!(o, AppendOutcome::Accepted);
                log.push((t, t.elapsed().as_nanos() as u64));
            }
            log
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let out = work();
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let log = h.join().map_err(|_| "appender panicked")?;
    Ok((out?, t1 - t0, Pauses::of(&log, t0, t1)))
}

/// What an appender saw while some work ran from `t0` to `t1`, from its
/// log of (start, nanoseconds) per append.
struct Pauses {
    longest_during_ms: f64,
    longest_otherwise_ms: f64,
    appends_during: usize,
}

impl Pauses {
    fn of(log: &[(Instant, u64)], t0: Instant, t1: Instant) -> Pauses {
        let overlaps = |(t, d): &&(Instant, u64)| *t + Duration::from_nanos(*d) >= t0 && *t <= t1;
        let longest = |during: bool| {
            log.iter()
                .filter(|e| overlaps(e) == during)
                .map(|(_, d)| *d)
                .max()
                .unwrap_or(0) as f64
                / 1e6
        };
        Pauses {
            longest_during_ms: longest(true),
            longest_otherwise_ms: longest(false),
            appends_during: log.iter().filter(|(t, _)| *t >= t0 && *t <= t1).count(),
        }
    }
}

/// Recovery time of `keys` keys and `records` records, against reading the bytes.
fn recovery(cfg: &Cfg, keys: u64, records: u64) -> Result<Value> {
    let dir = cfg.dir.join("recovery");
    let opts = || {
        StoreOptions::default()
            .fsync(FsyncPolicy::Never)
            .snapshot_every_records(None)
            .snapshot_every_bytes(None)
    };
    let t = Instant::now();
    let store = build(&dir, keys, records / keys, opts())?;
    store.close()?;
    let built = t.elapsed();
    // Reading the same bytes (warm page cache, like the recovery after it).
    let t = Instant::now();
    let mut log_bytes = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "wal") {
            let mut f = File::open(&p)?;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                log_bytes += n as u64;
            }
        }
    }
    let read = t.elapsed();
    let direct = read_direct(&dir)?;
    // Three recoveries, the median: one run on a shared machine is noise.
    let mut replays = Vec::new();
    let mut threads = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let store = ProducerStateStore::open_with(&dir, opts())?;
        replays.push(t.elapsed().as_secs_f64());
        let r = store.recovery_report();
        assert_eq!(r.records_replayed, records);
        assert_eq!(store.len() as u64, keys);
        threads = r.replay_threads;
        store.close()?;
    }
    let replay = Duration::from_secs_f64(median(replays));
    // The engine applying the same appends, in the same order, from
    // memory on one thread: the work replay cannot avoid, with no bytes
    // to read or decode.
    let mut applies = Vec::new();
    for _ in 0..3 {
        let mut m = ProducerStateManager::new();
        let t = Instant::now();
        for round in 0..records / keys {
            for k in 0..keys {
                let o = m.append(k, (k % PARTITIONS) as i32, 0, round as i32);
                debug_assert_eq!(o, AppendOutcome::Accepted);
                std::hint::black_box(o);
            }
        }
        applies.push(t.elapsed().as_secs_f64());
        assert_eq!(m.len() as u64, keys);
    }
    let apply = Duration::from_secs_f64(median(applies));
    let store = ProducerStateStore::open_with(&dir, opts())?;
    store.snapshot()?;
    store.close()?;
    let mut from_snapshot = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let store = ProducerStateStore::open_with(&dir, opts())?;
        from_snapshot.push(t.elapsed().as_secs_f64());
        assert_eq!(store.recovery_report().records_replayed, 0);
        store.close()?;
    }
    let from_snapshot = Duration::from_secs_f64(median(from_snapshot));
    std::fs::remove_dir_all(&dir)?;
    Ok(json!({
        "keys": keys,
        "records": records,
        "log_bytes": log_bytes,
        "build_s": round2(built.as_secs_f64()),
        "read_log_ms": round2(read.as_secs_f64() * 1e3),
        "read_log_from_device_ms": direct.map(|d| round2(d.as_secs_f64() * 1e3)),
        "recover_by_replay_ms": round2(replay.as_secs_f64() * 1e3),
        "replay_threads": threads,
        "replay_over_read": round2(replay.as_secs_f64() / read.as_secs_f64()),
        "replay_over_read_from_device": direct.map(|d| round2(replay.as_secs_f64() / d.as_secs_f64())),
        "engine_apply_in_memory_ms": round2(apply.as_secs_f64() * 1e3),
        "replay_over_engine_apply": round2(replay.as_secs_f64() / apply.as_secs_f64()),
        "recover_from_snapshot_ms": round2(from_snapshot.as_secs_f64() * 1e3),
    }))
}

/// Reads every segment in `dir` with `O_DIRECT`, past the page cache: what
/// reading the log costs after a reboot. `None` where unsupported.
fn read_direct(dir: &Path) -> Result<Option<Duration>> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        const O_DIRECT: i32 = 0o40000;
        // O_DIRECT wants a buffer aligned to the device's blocks: take a
        // 4 KiB-aligned window of a larger vector.
        let mut raw = vec![0u8; (4 << 20) + 4096];
        let skew = raw.as_ptr().align_offset(4096);
        let buf = &mut raw[skew..skew + (4 << 20)];
        let t = Instant::now();
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "wal") {
                let Ok(mut f) = OpenOptions::new()
                    .read(true)
                    .custom_flags(O_DIRECT)
                    .open(&p)
                else {
                    return Ok(None);
                };
                loop {
                    match f.read(buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(_) => return Ok(None),
                    }
                }
            }
        }
        Ok(Some(t.elapsed()))
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = dir;
        Ok(None)
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Throughput against threads, log-log, drawn from the measured numbers.
fn svg(
    limit: &[(usize, Stat)],
    store: &[(usize, Stat)],
    sqlite: &[(usize, Stat)],
    bare: &[(usize, Stat)],
) -> String {
    let (w, h, left, right, top, bottom) = (880.0, 440.0, 80.0, 300.0, 30.0, 60.0);
    let series = [
        ("disk limit (N per fdatasync)", "#888888", limit),
        ("store, FsyncPolicy::Always", "#1f77b4", store),
        ("SQLite, WAL + synchronous=FULL", "#d62728", sqlite),
        ("bare group commit (no store)", "#2ca02c", bare),
    ];
    let all = series
        .iter()
        .flat_map(|s| s.2.iter().map(|(_, st)| st.ops_per_s));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (ylo, yhi) = (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil()),
    );
    let x = |t: usize| left + (t as f64).log2() / 6.0 * (w - left - right);
    let y =
        |v: f64| top + (yhi.log10() - v.log10()) / (yhi.log10() - ylo.log10()) * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{left}\" y=\"18\" font-size=\"14\">Durable appends per second against appender threads (log-log)</text>\n"
    );
    let mut d = ylo;
    while d <= yhi * 1.0001 {
        s += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            w - right,
            left - 6.0,
            y(d) + 4.0,
            if d >= 1e6 {
                format!("{}M", d / 1e6)
            } else if d >= 1e3 {
                format!("{}k", d / 1e3)
            } else {
                format!("{d}")
            },
            y = y(d)
        );
        d *= 10.0;
    }
    for t in THREADS {
        s += &format!(
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{t}</text>\n",
            h - bottom,
            h - bottom + 18.0,
            x = x(t)
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">appender threads (disk limit: records per fdatasync)</text>\n",
        (left + w - right) / 2.0,
        h - 18.0
    );
    for (i, (name, color, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(t, st)| format!("{:.1},{:.1}", x(*t), y(st.ops_per_s)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        );
        for (t, st) in pts.iter() {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n",
                x(*t),
                y(st.ops_per_s)
            );
        }
        let ly = top + 20.0 + 22.0 * i as f64;
        s += &format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            w - right + 10.0,
            w - right + 30.0,
            w - right + 34.0,
            ly + 4.0
        );
    }
    s + "</svg>\n"
}

/// A file in the repository's `docs/`, wherever the bench is started from.
fn docs(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name)
}
