//! The broker at 1, 100, 1,000 and 10,000 partitions on this machine: for
//! each count, the broker's threads, RSS per idle partition, disk per empty
//! partition, produce throughput spread over all partitions (as a ratio to
//! the 1-partition run of the same process), and the time to be ready after
//! a clean shutdown and after `kill -9`. Then one partition's truncation in
//! the shared producer state, with the other partitions empty and holding
//! 100x its data (its batches, and its keys too); with another partition
//! removed or moved out and in after the appends; with one of its own
//! producers expired at the log's end (the worst case: the replay reads
//! to the end); and ten partitions cut one after the other.
//! `SCALE_COUNTS=none` runs the truncations alone.
//!
//! `cargo bench -p producer-state-broker --bench scale` (the release
//! build of the broker binary, started with its default options as
//! `producer-state-broker --dir D --listen 127.0.0.1:0 --partitions N`,
//! with `--max.partitions` raised to N). Everything runs on loopback, and
//! every loop is bounded in time and count. `SCALE_COUNTS=1,100` runs fewer
//! counts, `SCALE_SECS=2` shorter produce runs, `SCALE_RUNS=3` more runs
//! (medians are printed), `SCALE_STATE_SHARDS=2` the partitions over two
//! producer-state stores (`--state-shards`; the default is one).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use producer_state::{AppendOptions, Batch, ProducerStateStore};
use producer_state_broker::partition;

/// Client threads of the produce runs, each with its own connection and
/// producer id.
const CLIENTS: usize = 8;
/// Records per batch, and bytes per record value.
const RECORDS: usize = 10;
const VALUE: usize = 100;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Broker {
    child: Child,
    addr: SocketAddr,
    partitions: usize,
    /// From spawning to "listening on".
    ready_after: Duration,
}

impl Broker {
    fn start(dir: &Path, partitions: usize) -> Broker {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_producer-state-broker"))
            .args(["--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(["--partitions", &partitions.to_string()])
            .args(["--max.partitions", &partitions.max(1000).to_string()])
            // `SCALE_STATE_SHARDS=N`: the partitions over N producer-state
            // stores (default 1, the broker's default).
            .args([
                "--state-shards",
                &std::env::var("SCALE_STATE_SHARDS").unwrap_or_else(|_| "1".into()),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the broker binary");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the broker said {line:?}"))
            .parse()
            .unwrap();
        Broker {
            child,
            addr,
            partitions,
            ready_after: started.elapsed(),
        }
    }

    fn status(&self, field: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    fn threads(&self) -> u64 {
        self.status("Threads:")
    }

    /// The threads by name (`/proc/PID/task/*/comm`), for the report.
    fn thread_names(&self) -> String {
        let mut names = std::collections::BTreeMap::<String, usize>::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) {
            for t in tasks.flatten() {
                let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                *names.entry(name.trim().to_string()).or_default() += 1;
            }
        }
        names
            .iter()
            .map(|(n, c)| format!("{c} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn rss_kib(&self) -> u64 {
        self.status("VmRSS:")
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// SIGTERM, and waits for the clean shutdown.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the broker did not stop within 120 s");
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// Bytes the directory takes on disk (allocated blocks, not lengths).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// `CLIENTS` threads produce for `secs` seconds, thread `t` to partitions
/// `t, t + CLIENTS, ...` in turn (all to partition 0 when there is one),
/// one batch of `RECORDS` records per request. Returns records per second
/// acknowledged, and each partition's acknowledged end.
fn produce(addr: SocketAddr, partitions: usize, secs: f64) -> (f64, Vec<i64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let value = "v".repeat(VALUE);
    let handles: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (stop, acked, barrier, value) =
                (stop.clone(), acked.clone(), barrier.clone(), value.clone());
            std::thread::spawn(move || {
                let mut c = common::Client::connect(addr);
                let pid = common::producer_id(&mut c);
                let mine: Vec<usize> = if partitions == 1 {
                    vec![0]
                } else {
                    (t..partitions).step_by(CLIENTS).collect()
                };
                let mut seq = vec![0i32; mine.len()];
                let mut ends = Vec::new();
                let values: Vec<&str> = (0..RECORDS).map(|_| value.as_str()).collect();
                barrier.wait();
                let mut i = 0usize;
                // Bounded by time (the flag) and by count.
                while !stop.load(Ordering::Relaxed) && i < 50_000_000 {
                    let k = i % mine.len();
                    let b = common::batch(pid, 0, seq[k], &values);
                    // The client panics when the connection goes (the
                    // kill -9 run): what was acknowledged before counts.
                    let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        common::produce(&mut c, "load", mine[k] as i32, b)
                    }));
                    let Ok((code, offset)) = sent else { break };
                    assert_eq!(code, 0, "produce to partition {}", mine[k]);
                    seq[k] += RECORDS as i32;
                    acked.fetch_add(RECORDS as u64, Ordering::Relaxed);
                    ends.push((mine[k], offset + RECORDS as i64));
                    i += 1;
                }
                ends
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut ends = vec![0i64; partitions];
    for h in handles {
        for (p, e) in h.join().unwrap() {
            ends[p] = ends[p].max(e);
        }
    }
    let rate = acked.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    (rate, ends)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Row {
    partitions: usize,
    threads_idle: u64,
    threads_empty: u64,
    fds: usize,
    rss_per_partition: f64,
    disk_per_partition: f64,
    create_secs: f64,
    rate: f64,
    clean_restart: f64,
    kill9_restart: f64,
}

fn one_count(partitions: usize, secs: f64, runs: usize) -> Row {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let b = Broker::start(&dir, partitions);
    // A broker with no topic, then with the topic's partitions created and
    // idle (the runtime's blocking threads retire after 10 s idle).
    let mut c = common::Client::connect(b.addr);
    assert_eq!(
        c.call(&kafka_protocol::messages::ApiVersionsRequest::default(), 3)
            .error_code,
        0
    );
    std::thread::sleep(Duration::from_secs(11));
    let (threads_empty, rss_empty, disk_empty) = (b.threads(), b.rss_kib(), disk_bytes(&dir));
    let t = Instant::now();
    assert_eq!(common::create_topic(&mut c, "load"), partitions);
    let create_secs = t.elapsed().as_secs_f64();
    drop(c);
    std::thread::sleep(Duration::from_secs(11));
    let (threads_idle, rss_idle, disk_idle) = (b.threads(), b.rss_kib(), disk_bytes(&dir));
    println!(
        "{partitions} partitions, idle: threads {}",
        b.thread_names()
    );
    let fds = b.fds();
    let n = partitions as f64;
    let rss_per_partition = (rss_idle.saturating_sub(rss_empty) * 1024) as f64 / n;
    let disk_per_partition = disk_idle.saturating_sub(disk_empty) as f64 / n;
    let rates: Vec<f64> = (0..runs)
        .map(|_| produce(b.addr, partitions, secs).0)
        .collect();
    let rate = median(rates);
    // A clean restart: SIGTERM, start, ready.
    let n_parts = b.partitions;
    b.stop();
    let b = Broker::start(&dir, n_parts);
    let clean_restart = b.ready_after.as_secs_f64();
    // Load, kill -9 mid-load, start, ready; every acknowledged batch is there.
    let addr = b.addr;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(secs.min(2.0)));
        b.kill9();
    });
    let ends = {
        // The clients' requests fail once the broker is gone (quietly: the
        // client panics, and its thread stops there).
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let (_, ends) = produce(addr, partitions, secs.min(2.0) + 1.0);
        killer.join().unwrap();
        std::panic::set_hook(hook);
        ends
    };
    let b = Broker::start(&dir, n_parts);
    let kill9_restart = b.ready_after.as_secs_f64();
    let mut c = common::Client::connect(b.addr);
    for (p, &end) in ends.iter().enumerate().take(200) {
        let got = common::latest_offset(&mut c, "load", p as i32);
        assert!(
            got >= end,
            "partition {p}: acknowledged up to {end}, {got} after kill -9"
        );
    }
    drop(c);
    b.stop();
    Row {
        partitions,
        threads_idle,
        threads_empty,
        fds,
        rss_per_partition,
        disk_per_partition,
        create_secs,
        rate,
        clean_restart,
        kill9_restart,
    }
}

/// One partition's truncation in a Kafka-mode store with default options:
/// partition 0 holds `batches` batches of `producers` producers; the
/// others hold `others_factor` times as many, spread over 100 partitions
/// of `producers` producers each and interleaved with partition 0's
/// appends. Partition 0 is cut at its middle. Returns the median seconds
/// of `runs` runs (a fresh store each).
/// What the log holds after the appends, when partition 0 is cut.
#[derive(Clone, Copy, PartialEq)]
enum Tail {
    /// Nothing more.
    Nothing,
    /// Partition 100 removed: a record that touches another partition
    /// alone, which partition 0's replay need not read.
    OtherRemoved,
    /// Partition 100 moved out and back in (exported, removed, imported):
    /// records of partition 100 alone, as for the removal.
    OtherImported,
    /// Partition 0's first producer expired (its batches are two days
    /// older than the others', and the store's clock is set between): a
    /// removal that touches partition 0 at the log's end, so the replay
    /// reads to the end and passes over every other partition's record
    /// after the base. The worst case.
    OwnExpired,
}

/// The batches' timestamp, and the store's clock in the `OwnExpired` case.
const T0: i64 = 1_700_000_000_000;
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// A store with the broker's own options (Kafka mode, background fsync)
/// holding `batches` batches of `producers` producers on partition 0,
/// each followed by `others_factor` batches of the other 100 partitions
/// (their producers numbered from 10), then `tail`; synced, and its
/// automatic snapshots written.
fn crowded_store(
    batches: usize,
    others_factor: usize,
    producers: usize,
    tail: Tail,
) -> (tempfile::TempDir, ProducerStateStore) {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = partition::state_options(partition::PRODUCER_ID_EXPIRATION);
    if tail == Tail::OwnExpired {
        opts = opts.clock(Arc::new(producer_state::ManualClock::new(T0 + DAY_MS / 24)));
    }
    let store = ProducerStateStore::open_with(tmp.path(), opts).unwrap();
    let mut seq = std::collections::HashMap::<(u64, i32), i32>::new();
    let mut offsets = vec![0i64; 101];
    let mut append = |pid: u64, p: i32| {
        let s = seq.entry((pid, p)).or_default();
        let o = &mut offsets[p as usize];
        let old = tail == Tail::OwnExpired && (pid, p) == (0, 0);
        let b = Batch::new(*s, *s, *o, if old { T0 - 2 * DAY_MS } else { T0 });
        assert!(
            store
                .append_with(pid, p, 0, b, AppendOptions::client())
                .unwrap()
                .is_accepted()
        );
        *s += 1;
        *o += 1;
    };
    for i in 0..batches {
        append((i % producers) as u64, 0);
        for j in 0..others_factor {
            let k = i * others_factor + j;
            let producer = ((k / 100) % producers) as u64 + 10;
            append(producer, 1 + (k % 100) as i32);
        }
    }
    match tail {
        Tail::Nothing => {}
        Tail::OtherRemoved | Tail::OtherImported if others_factor > 0 => {
            let export = store.export_partition(100).unwrap();
            store.remove_partition(100).unwrap();
            if tail == Tail::OtherImported {
                store.import_partition(&export).unwrap();
            }
        }
        Tail::OtherRemoved | Tail::OtherImported => {}
        Tail::OwnExpired => assert_eq!(store.expire_now().unwrap(), 1),
    }
    store.sync().unwrap();
    settle(&store);
    (tmp, store)
}

/// Where partition 0 is cut, in thousandths of its batches. The store's
/// first automatic snapshot is asked for at position 1,000,000, where the
/// 100x store holds about 9,900 of its 20,000 batches, and is taken a
/// little later, as far later as the snapshot thread starts late: 52%
/// lies just above it, whatever that lag, so the base is that snapshot
/// and the replay reads about 2% of partition 0's history. 75% lies half
/// a snapshot interval above it: the replay reads a quarter of it, and
/// the other partitions' records among it.
const JUST_ABOVE_A_SNAPSHOT: usize = 520;
const HALF_AN_INTERVAL_ABOVE: usize = 750;

/// The median time to cut partition 0 of a [`crowded_store`] at
/// `per_mille` thousandths of its batches.
fn truncation(
    (batches, per_mille): (usize, usize),
    others_factor: usize,
    producers: usize,
    runs: usize,
    tail: Tail,
) -> f64 {
    let times: Vec<f64> = (0..runs)
        .map(|_| {
            let (_tmp, store) = crowded_store(batches, others_factor, producers, tail);
            let cut = (batches * per_mille / 1000) as i64;
            let t = Instant::now();
            store.truncate_partition_to(0, cut).unwrap();
            let took = t.elapsed().as_secs_f64();
            assert_eq!(store.partition_end_offset(0), cut);
            took
        })
        .collect();
    median(times)
}

/// The median time of each of ten partitions (1 to 10) of a crowded store
/// (4 producers a partition, 100x) cut just above the snapshot one after
/// the other, as a broker whose crash cut many partition logs does at
/// start.
fn truncations_in_a_row(batches: usize, runs: usize) -> f64 {
    let mut times = Vec::new();
    for _ in 0..runs {
        let (_tmp, store) = crowded_store(batches, 100, 4, Tail::Nothing);
        let cut = (batches * JUST_ABOVE_A_SNAPSHOT / 1000) as i64;
        for p in 1..=10 {
            let t = Instant::now();
            store.truncate_partition_to(p, cut).unwrap();
            times.push(t.elapsed().as_secs_f64());
            assert_eq!(store.partition_end_offset(p), cut);
        }
    }
    median(times)
}

/// Waits, at most 60 s, until the automatic snapshots the appends asked
/// for are written: one per 1,000,000 positions (the default
/// `snapshot_every_records`, which the broker keeps; at this bench's record
/// size it is reached before the bytes threshold). A snapshot still being
/// taken holds the snapshot book a truncation needs, and its replay
/// competes for the two cores: the time measured would be the snapshot's.
fn settle(store: &ProducerStateStore) {
    let due = store.next_position() / 1_000_000;
    let until = Instant::now() + Duration::from_secs(60);
    while store.stats().snapshots_written < due && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let counts: Vec<usize> = std::env::var("SCALE_COUNTS")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 1_000, 10_000]);
    let secs: f64 = env_or("SCALE_SECS", 4.0);
    let runs: usize = env_or("SCALE_RUNS", 3);
    println!(
        "broker scale: {CLIENTS} clients, batches of {RECORDS} x {VALUE} B, {secs} s per run, median of {runs}"
    );
    let rows: Vec<Row> = counts.iter().map(|&n| one_count(n, secs, runs)).collect();
    let base = rows.iter().find(|r| r.partitions == 1).map(|r| r.rate);
    println!(
        "{:>10} {:>8} {:>8} {:>7} {:>12} {:>12} {:>9} {:>12} {:>7} {:>10} {:>10}",
        "partitions",
        "threads",
        "(empty)",
        "fds",
        "RSS/part B",
        "disk/part B",
        "create s",
        "records/s",
        "ratio",
        "clean s",
        "kill-9 s"
    );
    for r in &rows {
        println!(
            "{:>10} {:>8} {:>8} {:>7} {:>12.0} {:>12.0} {:>9.2} {:>12.0} {:>7} {:>10.2} {:>10.2}",
            r.partitions,
            r.threads_idle,
            r.threads_empty,
            r.fds,
            r.rss_per_partition,
            r.disk_per_partition,
            r.create_secs,
            r.rate,
            base.map_or("-".into(), |b| format!("{:.2}", r.rate / b)),
            r.clean_restart,
            r.kill9_restart
        );
    }
    let batches: usize = env_or("SCALE_TRUNCATE_BATCHES", 20_000);
    let near = (batches, JUST_ABOVE_A_SNAPSHOT);
    let show = |what: &str, alone: f64, crowded: f64| {
        println!(
            "truncate partition 0 ({batches} batches), {what}: others empty {:.1} ms, \
             others holding 100x {:.1} ms, ratio {:.2}",
            alone * 1e3,
            crowded * 1e3,
            crowded / alone
        );
    };
    // 4 producers a partition: the others hold 100x the batches; 400: and
    // 100x the keys (40,000 against 400).
    let alone = truncation(near, 0, 4, runs, Tail::Nothing);
    show(
        "4 producers, cut just above a snapshot",
        alone,
        truncation(near, 100, 4, runs, Tail::Nothing),
    );
    show(
        "400 producers, cut just above a snapshot",
        truncation(near, 0, 400, runs, Tail::Nothing),
        truncation(near, 100, 400, runs, Tail::Nothing),
    );
    show(
        "4 producers, cut half a snapshot interval above one",
        truncation((batches, HALF_AN_INTERVAL_ABOVE), 0, 4, runs, Tail::Nothing),
        truncation(
            (batches, HALF_AN_INTERVAL_ABOVE),
            100,
            4,
            runs,
            Tail::Nothing,
        ),
    );
    for (tail, what) in [
        (Tail::OtherRemoved, "then another partition removed"),
        (
            Tail::OtherImported,
            "then another partition moved out and in",
        ),
    ] {
        show(what, alone, truncation(near, 100, 4, runs, tail));
    }
    show(
        "then one of its producers expired (the replay reads to the end)",
        truncation(near, 0, 4, runs, Tail::OwnExpired),
        truncation(near, 100, 4, runs, Tail::OwnExpired),
    );
    let each = truncations_in_a_row(batches, runs);
    println!(
        "ten other partitions of the 100x store cut one after the other: {:.1} ms each, \
         ratio to partition 0 alone {:.2}",
        each * 1e3,
        each / alone
    );
}
