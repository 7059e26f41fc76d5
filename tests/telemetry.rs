//! What the store reports through the `metrics` and `tracing` facades:
//! each metric against what the store did (its `StoreStats`, its recovery
//! report, the answers the test got, the files on disk), and each log
//! event where it must be and nowhere else.
//!
//! Recorders and subscribers are installed per test, on the test's thread
//! (`metrics::with_local_recorder`, `tracing::subscriber::with_default`),
//! so tests run in parallel without seeing each other. The store resolves
//! its metric handles when it opens, so the recorder only has to be in
//! place for `open`; events are caught on the thread that causes them (the
//! tests use inline snapshots, and a lone appender leads its own group).

#![cfg(feature = "metrics")]

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::store_util::{dir, path, sim_opts};
use producer_state::fs::{Fault, FileSystem, SimFs, Unsynced};
use producer_state::telemetry::testing::Capture;
use producer_state::telemetry::{METRICS, MetricKind};
use producer_state::{
    AppendOutcome, AppendRequest, Error, FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions,
};

/// Opens a store whose metrics go to `rec`.
fn open(rec: &Capture, opts: StoreOptions) -> ProducerStateStore {
    metrics::with_local_recorder(rec, || ProducerStateStore::open_with(dir(), opts)).unwrap()
}

fn counter(rec: &Capture, name: &str) -> u64 {
    rec.counter(name, &[])
        .unwrap_or_else(|| panic!("{name} not registered"))
}

fn appends(rec: &Capture, outcome: &str) -> u64 {
    rec.counter("producer_state_appends_total", &[("outcome", outcome)])
        .unwrap()
}

fn samples(rec: &Capture, name: &str) -> Vec<f64> {
    rec.samples(name, &[]).unwrap()
}

fn gauge(rec: &Capture) -> f64 {
    rec.gauge("producer_state_producers", &[]).unwrap()
}

/// Every append is counted once, by outcome, in the metrics and in
/// `StoreStats` alike: under `Always` (accepted appends counted as their
/// group is durable) and under a buffered policy (counted as applied).
#[test]
fn every_append_is_counted_once_by_outcome_in_metrics_and_stats_alike() {
    counts_every_answer(FsyncPolicy::Always);
    counts_every_answer(FsyncPolicy::Never);
}

fn counts_every_answer(policy: FsyncPolicy) {
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(
        &rec,
        sim_opts(&fs).fsync(policy).snapshot_every_records(None),
    );
    // Single-sequence appends over five keys: mostly in order, with
    // retries, gaps, new sessions and zombies.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut keys = [(0i16, -1i32); 5];
    let reqs: Vec<(u64, i32, i16, i32)> = (0..600)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x % 5) as usize;
            let (epoch, last) = keys[k];
            let (e, seq) = match (x >> 8) % 100 {
                0..70 => (epoch, last + 1),
                70..80 => (epoch, last.max(0)),
                80..88 => (epoch, last + 3),
                88..94 => (epoch + 1, 0),
                _ => (epoch - 1, last + 1),
            };
            if (e, seq) == (epoch, last + 1) || (e > epoch && seq == 0) {
                keys[k] = (e, seq);
            }
            (k as u64, 0, e, seq)
        })
        .collect();
    // Every append method in turn: answers as the four words, or an error.
    let mut answers: Vec<Result<AppendOutcome, Error>> = Vec::new();
    let request = |&(k, p, e, seq): &(u64, i32, i16, i32)| AppendRequest::single(k, p, e, seq);
    for (i, chunk) in reqs.chunks(7).enumerate() {
        let batch: Vec<AppendRequest> = chunk.iter().map(request).collect();
        match i % 3 {
            0 => answers.extend(
                store
                    .append_all(&batch)
                    .into_iter()
                    .map(|a| a.map(|o| o.outcome())),
            ),
            1 => answers.extend(
                batch
                    .iter()
                    .map(|r| store.append_request(r).map(|o| o.outcome())),
            ),
            _ => answers.extend(
                chunk
                    .iter()
                    .map(|&(k, p, e, seq)| store.append(k, p, e, seq)),
            ),
        }
    }
    // A name the log cannot hold is an error answer.
    let long = "x".repeat(70_000);
    answers.push(store.append(long.as_str(), 0, 0, 0));
    assert!(answers.last().unwrap().is_err());

    let want = [
        ("accepted", Some(AppendOutcome::Accepted)),
        ("duplicate", Some(AppendOutcome::Duplicate)),
        ("out_of_order", Some(AppendOutcome::OutOfOrder)),
        ("fenced_epoch", Some(AppendOutcome::FencedEpoch)),
        ("error", None),
    ];
    // Under a buffered policy, records reach the log on sync.
    store.sync().unwrap();
    let s = store.stats();
    let stats = [s.accepted, s.duplicates, s.out_of_order, s.fenced, s.errors];
    for ((label, kind), from_stats) in want.into_iter().zip(stats) {
        let n = answers
            .iter()
            .filter(|a| a.as_ref().ok().copied() == kind)
            .count() as u64;
        assert!(n > 0, "the workload has {label} answers");
        assert_eq!(appends(&rec, label), n, "{label}");
        assert_eq!(from_stats, n, "{label} in StoreStats");
    }
    assert_eq!(
        s.records_written, s.accepted,
        "one record per accepted append"
    );
    assert!(s.bytes_written >= 18 * s.records_written);
    for (name, from_stats) in [
        ("producer_state_log_records_total", s.records_written),
        ("producer_state_log_bytes_total", s.bytes_written),
        ("producer_state_log_writes_total", s.groups_written),
        ("producer_state_log_fsyncs_total", s.log_fsyncs),
    ] {
        assert_eq!(counter(&rec, name), from_stats, "{name}");
    }
    let fsyncs = samples(&rec, "producer_state_fsync_duration_seconds");
    assert_eq!(fsyncs.len() as u64, s.log_fsyncs);
    let total: f64 = fsyncs.iter().sum();
    assert!((total - s.log_fsync_time.as_secs_f64()).abs() < 1e-6);
    store.close().unwrap();
}

/// The histograms of a group commit take one sample per group, never one
/// per append: under 16 appenders and a slow fsync, far fewer samples than
/// appends, and their sum is every record. (The close adds no group: it
/// has nothing left to write or fsync.)
#[test]
fn group_commit_histograms_take_one_sample_per_group() {
    let fs = SimFs::new();
    fs.set_sync_delay(Duration::from_millis(2));
    let rec = Capture::default();
    let store = Arc::new(open(&rec, sim_opts(&fs).snapshot_every_records(None)));
    let (threads, each) = (16u64, 25);
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                for seq in 0..each {
                    assert_eq!(store.append(t, 0, 0, seq).unwrap(), AppendOutcome::Accepted);
                }
            });
        }
    });
    let st = store.stats();
    let n = threads * each as u64;
    assert_eq!(st.records_written, n);
    // A group is reported just after its appenders are woken: by the
    // flusher thread, if it led the last one. Closing the store joins it.
    Arc::into_inner(store).unwrap().close().unwrap();
    let groups = samples(&rec, "producer_state_group_records");
    assert_eq!(groups.len() as u64, st.groups_written);
    assert!(
        (groups.len() as u64) < n / 2,
        "{} samples for {n} appends",
        groups.len()
    );
    assert_eq!(groups.iter().sum::<f64>(), n as f64);
    assert!(groups.iter().any(|&g| g > 1.0), "appenders shared groups");
    let fsyncs = samples(&rec, "producer_state_fsync_duration_seconds");
    assert_eq!(fsyncs.len() as u64, st.log_fsyncs);
    assert!(
        fsyncs.iter().all(|&d| d >= 0.002),
        "each sample is one fsync's latency: {fsyncs:?}"
    );
}

#[test]
fn the_gauge_follows_the_keys_and_a_closed_store_leaves_it() {
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs));
    assert_eq!(gauge(&rec), 0.0);
    for k in 0..10u64 {
        store.append(k, 0, 0, 0).unwrap();
    }
    store.sync().unwrap();
    assert_eq!(gauge(&rec), 10.0, "exact after sync");
    store.append(10u64, 0, 0, 0).unwrap();
    store.snapshot().unwrap();
    assert_eq!(gauge(&rec), 11.0, "exact after a snapshot");
    store.close().unwrap();
    assert_eq!(gauge(&rec), 0.0, "a closed store takes its keys out");

    // Reopened: the recovered keys are back at once.
    let store = open(&rec, sim_opts(&fs));
    assert_eq!(gauge(&rec), 11.0);
    drop(store);
    assert_eq!(gauge(&rec), 0.0, "dropping closes too");
}

/// The late-transaction gauge is what the last check found, and a closed
/// store takes its share out.
#[test]
fn the_late_transaction_gauge_is_set_by_each_check() {
    use producer_state::{AppendOptions, Batch, Semantics};
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs).semantics(Semantics::Kafka));
    let late = || rec.gauge("producer_state_partitions_with_late_transactions", &[]);
    let txn = AppendOptions::client().transactional().verified();
    for p in 0..3 {
        store
            .append_with(1u64, p, 0, Batch::new(0, 0, 0, 1_000), txn)
            .unwrap();
    }
    let max = 900_000;
    assert!(store.late_transactions(1_000, max).is_empty());
    assert_eq!(late(), Some(0.0));
    assert_eq!(store.late_transactions(i64::MAX, max).len(), 3);
    assert_eq!(late(), Some(3.0));
    assert!(store.late_transactions(1_000, max).is_empty());
    assert_eq!(late(), Some(0.0), "each check sets it, down too");
    assert_eq!(store.late_transactions(i64::MAX, max).len(), 3);
    store.close().unwrap();
    assert_eq!(late(), Some(0.0), "a closed store takes its share out");
}

/// Expirations and evictions are counted as the group commit that writes
/// their removal records runs, exactly as `StoreStats` counts them.
#[test]
fn expirations_and_evictions_are_counted_as_the_store_counts_them() {
    let fs = SimFs::new();
    let rec = Capture::default();
    let clock = ManualClock::new(1_000);
    let opts = sim_opts(&fs)
        .snapshot_every_records(None)
        .max_producers(Some(4))
        .producer_expiration(Some(Duration::from_secs(60)))
        .expiration_interval(None)
        .clock(Arc::new(clock.clone()));
    let store = open(&rec, opts);
    assert_eq!(counter(&rec, "producer_state_evictions_total"), 0);
    for k in 0..10u64 {
        assert_eq!(store.append(k, 0, 0, 0).unwrap(), AppendOutcome::Accepted);
    }
    let evicted = store.stats().evicted;
    assert!(evicted >= 6, "ten keys through a cap of four: {evicted}");
    assert_eq!(counter(&rec, "producer_state_evictions_total"), evicted);
    assert_eq!(counter(&rec, "producer_state_expirations_total"), 0);

    clock.advance(Duration::from_secs(120));
    let expired = store.expire_now().unwrap() as u64;
    assert_eq!(expired, 10 - evicted, "every key left was idle");
    assert_eq!(store.stats().expired, expired);
    assert_eq!(counter(&rec, "producer_state_expirations_total"), expired);
    assert_eq!(counter(&rec, "producer_state_evictions_total"), evicted);
}

/// A group commit refreshes the gauge by itself (at most every 100 ms).
#[test]
fn the_gauge_is_refreshed_by_group_commits() {
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs).snapshot_every_records(None));
    store.append(0u64, 0, 0, 0).unwrap();
    assert_eq!(gauge(&rec), 1.0, "the first group after open samples");
    for k in 1..5u64 {
        store.append(k, 0, 0, 0).unwrap();
    }
    std::thread::sleep(Duration::from_millis(120));
    store.append(5u64, 0, 0, 0).unwrap();
    assert_eq!(gauge(&rec), 6.0, "sampled again once the interval passed");
}

#[test]
fn labels_keep_stores_apart_and_without_them_they_add_up() {
    let rec = Capture::default();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let opts = || StoreOptions::default().snapshot_every_records(None);
    let open_at = |i: usize, o: StoreOptions| {
        metrics::with_local_recorder(&rec, || ProducerStateStore::open_with(dirs[i].path(), o))
            .unwrap()
    };
    {
        let a = open_at(0, opts().metric_label("partition", "0"));
        let b = open_at(1, opts().metric_label("partition", "1"));
        a.append(1u64, 0, 0, 0).unwrap();
        b.append(1u64, 1, 0, 0).unwrap();
        b.append(2u64, 1, 0, 0).unwrap();
        b.append(2u64, 1, 0, 0).unwrap();
        let accepted = |p| {
            rec.counter(
                "producer_state_appends_total",
                &[("outcome", "accepted"), ("partition", p)],
            )
        };
        assert_eq!((accepted("0"), accepted("1")), (Some(1), Some(2)));
        let dup = rec.counter(
            "producer_state_appends_total",
            &[("outcome", "duplicate"), ("partition", "1")],
        );
        assert_eq!(dup, Some(1));
        a.sync().unwrap();
        b.sync().unwrap();
        let producers = |p| rec.gauge("producer_state_producers", &[("partition", p)]);
        assert_eq!((producers("0"), producers("1")), (Some(1.0), Some(2.0)));
    }
    // Unlabelled stores share each series.
    let a = open_at(0, opts());
    let b = open_at(1, opts());
    assert_eq!(gauge(&rec), 3.0, "the keys of both stores");
    a.append(1u64, 0, 0, 1).unwrap();
    b.append(1u64, 1, 0, 1).unwrap();
    assert_eq!(appends(&rec, "accepted"), 2);
    assert_eq!(
        samples(&rec, "producer_state_recovery_duration_seconds").len(),
        2,
        "one sample per recovery"
    );
    drop(a);
    assert_eq!(gauge(&rec), 2.0);
}

#[test]
fn a_store_opened_before_the_recorder_reports_nothing_but_its_stats_count() {
    let fs = SimFs::new();
    let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    let rec = Capture::default();
    metrics::with_local_recorder(&rec, || store.append(1u64, 0, 0, 0).unwrap());
    assert!(rec.keys().is_empty(), "{:?}", rec.keys());
    assert_eq!(store.stats().accepted, 1);
}

#[test]
fn snapshots_report_their_size_duration_and_failures() {
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs).snapshot_every_records(None));
    for k in 0..20u64 {
        store.append(k, 0, 0, 0).unwrap();
    }
    let file = store.snapshot().unwrap().unwrap();
    assert_eq!(counter(&rec, "producer_state_snapshots_total"), 1);
    let size = fs.read_file(&file).unwrap().len() as f64;
    assert_eq!(samples(&rec, "producer_state_snapshot_size_bytes"), [size]);
    assert_eq!(
        samples(&rec, "producer_state_snapshot_duration_seconds").len(),
        1
    );
    assert_eq!(store.snapshot().unwrap(), None, "nothing new: no snapshot");
    assert_eq!(counter(&rec, "producer_state_snapshots_total"), 1);

    // A snapshot whose temporary file's name is taken by a directory
    // fails, and is counted.
    store.append(20u64, 0, 0, 0).unwrap();
    fs.create_dir_all(&path("00000000000000000021.snap.tmp"))
        .unwrap();
    assert!(store.snapshot().is_err());
    assert_eq!(counter(&rec, "producer_state_snapshot_failures_total"), 1);
    assert_eq!(store.stats().snapshots_written, 1);
}

#[test]
fn recovery_reports_what_it_replayed_and_what_it_cut() {
    let fs = SimFs::new();
    let named = |k: usize, seq: i32| AppendRequest::single(format!("p{k}"), 0, 0, seq);
    let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    let a: Vec<_> = (0..4).map(|k| named(k, 0)).collect();
    for r in store.append_all(&a) {
        r.unwrap();
    }
    // The next group is written and never fsync'ed; a crash keeps it with
    // one record damaged: a torn tail.
    fs.set_fault(fs.ops() + 1, Fault::Crash);
    assert!(
        store
            .append_all(&[named(0, 1), named(1, 1)])
            .iter()
            .all(|r| r.is_err())
    );
    let img = fs.crash_image(Unsynced::Keep);
    drop(store);
    let seg = path("00000000000000000000.wal");
    let mut bytes = img.read_file(&seg).unwrap();
    bytes[40 + 4 * 31 + 20] ^= 0x55;
    img.overwrite(&seg, &bytes);

    let rec = Capture::default();
    let store = open(&rec, sim_opts(&img));
    let report = store.recovery_report().clone();
    assert!(report.torn_bytes_dropped() > 0, "{report}");
    assert_eq!(report.records_replayed, 4);
    assert_eq!(counter(&rec, "producer_state_recovery_records_total"), 4);
    assert_eq!(
        counter(&rec, "producer_state_recovery_torn_bytes_total"),
        report.torn_bytes_dropped()
    );
    assert_eq!(
        counter(&rec, "producer_state_recovery_skipped_snapshots_total"),
        0
    );
    let took = samples(&rec, "producer_state_recovery_duration_seconds");
    assert_eq!(took, [report.duration.as_secs_f64()]);
    assert_eq!(gauge(&rec), 4.0);
}

/// Writes two snapshots and damages the newer; returns the file system.
fn store_with_a_damaged_newest_snapshot() -> SimFs {
    let fs = SimFs::new();
    let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    store.append(1u64, 0, 0, 0).unwrap();
    store.snapshot().unwrap().unwrap();
    store.append(1u64, 0, 0, 1).unwrap();
    let newest = store.snapshot().unwrap().unwrap();
    store.close().unwrap();
    let mut bytes = fs.read_file(&newest).unwrap();
    let last = bytes.len() - 6;
    bytes[last] ^= 0xff;
    fs.overwrite(&newest, &bytes);
    fs
}

#[test]
fn a_snapshot_passed_over_is_counted() {
    let fs = store_with_a_damaged_newest_snapshot();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs));
    assert_eq!(store.recovery_report().skipped_snapshots.len(), 1);
    assert_eq!(
        counter(&rec, "producer_state_recovery_skipped_snapshots_total"),
        1
    );
    assert_eq!(counter(&rec, "producer_state_recovery_records_total"), 1);
}

/// The failed group's appends are errors; the poisoning is counted once
/// however many appends are refused after it.
#[test]
fn a_failed_fsync_poisons_once_and_every_refusal_is_an_error_answer() {
    let fs = SimFs::new();
    let rec = Capture::default();
    let store = open(&rec, sim_opts(&fs).snapshot_every_records(None));
    store.append(1u64, 0, 0, 0).unwrap();
    fs.set_fault(fs.ops() + 1, Fault::Error(io::ErrorKind::Other));
    assert!(matches!(store.append(1u64, 0, 0, 1), Err(Error::Io { .. })));
    for seq in 2..5 {
        assert!(matches!(
            store.append(1u64, 0, 0, seq),
            Err(Error::Poisoned { .. })
        ));
    }
    assert_eq!(counter(&rec, "producer_state_poisoned_total"), 1);
    assert_eq!(appends(&rec, "error"), 4);
    assert_eq!(appends(&rec, "accepted"), 1);
    assert_eq!(store.stats().errors, 4);
}

/// `docs/metrics.md` documents every metric of [`METRICS`], with its type,
/// and nothing else named like one.
#[test]
fn the_metrics_doc_lists_exactly_the_metrics() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    for m in METRICS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}`", m.name)))
            .unwrap_or_else(|| panic!("docs/metrics.md has no row for {}", m.name));
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
            _ => unreachable!(),
        };
        assert!(row.contains(&format!("| {kind} |")), "{}: {row}", m.name);
        for l in m.labels {
            assert!(
                row.contains(&format!("`{l}`")),
                "{}: label {l}: {row}",
                m.name
            );
        }
    }
    let mut named: Vec<&str> = doc
        .split('`')
        .filter(|w| w.starts_with("producer_state_") && !w.contains(' '))
        .map(|w| w.split('{').next().unwrap())
        .collect();
    named.sort_unstable();
    named.dedup();
    for n in named {
        assert!(
            METRICS
                .iter()
                .any(|m| m.name == n || format!("{}_", m.name) == n),
            "docs/metrics.md names {n}, which the store does not report"
        );
    }
}

#[cfg(feature = "tracing")]
mod events {
    //! The log events, caught by a subscriber that keeps them.
    //!
    //! The subscriber is the global default, installed once, and keeps the
    //! events of threads inside [`catch`] only. Scoped subscribers
    //! (`with_default`) on parallel test threads miss events: tracing
    //! caches whether a call site is wanted, and a thread without one can
    //! cache "never" while another thread has one.

    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::fmt;
    use std::sync::Once;

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    use super::*;

    #[derive(Debug, Clone)]
    struct Caught {
        level: Level,
        target: String,
        fields: BTreeMap<String, String>,
    }

    impl Caught {
        fn message(&self) -> &str {
            &self.fields["message"]
        }
        fn field(&self, name: &str) -> &str {
            self.fields
                .get(name)
                .unwrap_or_else(|| panic!("no field {name} in {self:?}"))
        }
    }

    thread_local! {
        /// The events of this thread, while it is inside [`catch`].
        static CAUGHT: RefCell<Option<Vec<Caught>>> = const { RefCell::new(None) };
    }

    struct Catch;

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name().into(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }
    }

    impl Subscriber for Catch {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            CAUGHT.with_borrow_mut(|caught| {
                let Some(caught) = caught else { return };
                let mut fields = BTreeMap::new();
                e.record(&mut Fields(&mut fields));
                let m = e.metadata();
                caught.push(Caught {
                    level: *m.level(),
                    target: m.target().into(),
                    fields,
                });
            });
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Runs `f` with the events of this thread caught; returns them.
    fn catch<T>(f: impl FnOnce() -> T) -> (T, Vec<Caught>) {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| tracing::subscriber::set_global_default(Catch).unwrap());
        CAUGHT.set(Some(Vec::new()));
        let out = f();
        (out, CAUGHT.take().unwrap_or_default())
    }

    fn only<'a>(events: &'a [Caught], level: Level, starts: &str) -> &'a Caught {
        let found: Vec<_> = events
            .iter()
            .filter(|e| e.level == level && e.message().starts_with(starts))
            .collect();
        assert_eq!(found.len(), 1, "one {level} {starts:?} in {events:#?}");
        found[0]
    }

    #[test]
    fn a_clean_open_logs_its_summary_and_appends_log_nothing() {
        let fs = SimFs::new();
        let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
        for k in 0..3u64 {
            store.append(k, 0, 0, 0).unwrap();
        }
        store.close().unwrap();
        let (store, events) = catch(|| {
            let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
            for k in 0..3u64 {
                store.append(k, 0, 0, 1).unwrap();
                store.append(k, 0, 0, 1).unwrap();
            }
            store
        });
        assert_eq!(events.len(), 1, "{events:#?}");
        let e = only(&events, Level::INFO, "store recovered");
        assert_eq!(e.target, "producer_state");
        assert_eq!(e.field("keys"), "3");
        assert_eq!(e.field("records_replayed"), "3");
        assert_eq!(e.field("clean_shutdown"), "true");
        assert_eq!(e.field("dir"), "/store");
        drop(store);
    }

    #[test]
    fn a_torn_tail_is_a_warning_before_the_summary() {
        let fs = SimFs::new();
        let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
        store.append(1u64, 0, 0, 0).unwrap();
        fs.set_fault(fs.ops() + 1, Fault::Crash);
        assert!(store.append(1u64, 0, 0, 1).is_err());
        let img = fs.crash_image(Unsynced::Keep);
        drop(store);
        let seg = path("00000000000000000000.wal");
        let mut bytes = img.read_file(&seg).unwrap();
        // The second record (18 bytes after a numeric key's first 35...
        // wherever it is: its last byte before the zeros).
        let end = bytes.iter().rposition(|&b| b != 0).unwrap();
        bytes[end] ^= 0x55;
        img.overwrite(&seg, &bytes);
        let (store, events) = catch(|| ProducerStateStore::open_with(dir(), sim_opts(&img)));
        let store = store.unwrap();
        let torn = store
            .recovery_report()
            .torn_tail
            .clone()
            .expect("a torn tail");
        let e = only(&events, Level::WARN, "recovery cut a torn tail");
        assert_eq!(e.field("bytes"), torn.bytes.to_string());
        assert_eq!(e.field("offset"), torn.offset.to_string());
        assert_eq!(
            events.last().unwrap().message(),
            "store recovered",
            "the summary comes last"
        );
        assert_eq!(events.last().unwrap().field("clean_shutdown"), "false");
    }

    #[test]
    fn a_snapshot_passed_over_is_a_warning_naming_its_damage() {
        let fs = store_with_a_damaged_newest_snapshot();
        let (store, events) = catch(|| ProducerStateStore::open_with(dir(), sim_opts(&fs)));
        let store = store.unwrap();
        let skipped = &store.recovery_report().skipped_snapshots[0];
        let e = only(&events, Level::WARN, "snapshot failed verification");
        assert_eq!(e.field("file"), skipped.file.display().to_string());
        assert_eq!(e.field("damage"), skipped.kind.to_string());
        let summary = only(&events, Level::INFO, "store recovered");
        assert_eq!(summary.field("snapshot_position"), "1");
    }

    #[test]
    fn poisoning_is_one_error_event_with_the_failed_operation() {
        let fs = SimFs::new();
        let store =
            ProducerStateStore::open_with(dir(), sim_opts(&fs).snapshot_every_records(None))
                .unwrap();
        store.append(1u64, 0, 0, 0).unwrap();
        let (_, events) = catch(|| {
            fs.set_fault(fs.ops() + 1, Fault::Error(io::ErrorKind::Other));
            assert!(store.append(1u64, 0, 0, 1).is_err());
            assert!(store.append(1u64, 0, 0, 1).is_err());
            assert!(store.sync().is_err());
        });
        assert_eq!(events.len(), 1, "{events:#?}");
        let e = only(&events, Level::ERROR, "the store is poisoned");
        assert!(["write", "fsync"].contains(&e.field("op")), "{e:?}");
        assert_eq!(e.field("records_lost"), "1");
    }

    #[test]
    fn snapshots_written_are_info_and_only_automatic_failures_warn() {
        let fs = SimFs::new();
        let opts = sim_opts(&fs).snapshot_every_records(Some(5));
        let store = ProducerStateStore::open_with(dir(), opts).unwrap();
        let (_, events) = catch(|| {
            for k in 0..5u64 {
                store.append(k, 0, 0, 0).unwrap();
            }
        });
        let e = only(&events, Level::INFO, "snapshot written");
        assert_eq!(e.field("position"), "5");
        assert_eq!(e.field("producers"), "5");
        let size = fs
            .read_file(&path("00000000000000000005.snap"))
            .unwrap()
            .len();
        assert_eq!(e.field("bytes"), size.to_string());

        // The next automatic snapshot (at position 10) cannot create its
        // file (a directory has its name): nobody gets its error, so it is
        // logged.
        fs.create_dir_all(&path("00000000000000000010.snap.tmp"))
            .unwrap();
        let (_, events) = catch(|| {
            for k in 0..5u64 {
                store.append(k, 0, 0, 1).unwrap();
            }
        });
        let e = only(&events, Level::WARN, "automatic snapshot failed");
        assert!(
            e.field("error").contains("00000000000000000010.snap.tmp"),
            "{e:?}"
        );
        assert!(store.last_snapshot_error().is_some());

        // A snapshot asked for returns its error instead.
        store.append(9u64, 0, 0, 0).unwrap();
        fs.create_dir_all(&path("00000000000000000011.snap.tmp"))
            .unwrap();
        let (res, events) = catch(|| store.snapshot());
        assert!(res.is_err());
        assert!(events.is_empty(), "{events:#?}");
    }
}
