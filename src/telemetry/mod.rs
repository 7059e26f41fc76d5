//! Metrics and log events: every metric's name, and every report the store
//! makes through the `metrics` and `tracing` facades, in this one module.
//!
//! Names are an interface (dashboards and alerts are written against them),
//! so they are listed once, in [`METRICS`] (`names.rs`): the store
//! describes them to the recorder from that list, and `docs/metrics.md`
//! documents the same list (a test holds the two together). The store's
//! own files make one call into this module at each point where something
//! happens; what is reported there, and how, is decided here (`mod.rs`),
//! through the facade's handles or their no-op stand-ins (`handles.rs`).
//!
//! # What it costs
//!
//! A library's metrics must cost nothing when nobody listens and little
//! when somebody does:
//!
//! - Handles are resolved once, when a store opens: looking a metric up in
//!   the recorder at each use would cost more than an append. So install
//!   the recorder before opening stores; a store opened before sees no
//!   recorder and reports nothing (its [`StoreStats`] still count).
//!   Without a recorder every handle is a no-op: one branch.
//! - Per append: one counter increment (with a recorder, an atomic add
//!   in the recorder's storage). The outcome counts [`StoreStats`] reports
//!   are plain additions under the lock the append holds anyway (only an
//!   error answer, outside it, takes an atomic add). `append_all`
//!   increments per call, not per request.
//! - Per group commit: the records, bytes, write and fsync counters and one
//!   sample in each of two histograms (fsync latency, group size),
//!   recorded once the group's appenders have been woken. Nothing is
//!   recorded per append in a group.
//! - The live-producers gauge is the store's count of keys, taken under
//!   its lock after a group commit at most every 100 ms, and exactly at
//!   open, `sync`, every snapshot and close.
//! - No log event is per append: recovery, snapshots, expiration sweeps
//!   and the one failure that poisons a store.
//!
//! Several stores in one process add up: their counters and histograms
//! share one series each (unless [`StoreOptions::metric_label`] tells them
//! apart), and each store moves the gauge by the difference from what it
//! last reported, so the gauge is the sum of their keys and a closed store
//! takes its keys back out.
//!
//! With the `metrics` feature off every handle is a zero-sized no-op, and
//! with `tracing` off every event compiles to nothing; [`StoreStats`]
//! counts either way.
//!
//! [`StoreStats`]: crate::StoreStats
//! [`StoreOptions::metric_label`]: crate::StoreOptions::metric_label

mod handles;
mod names;
#[doc(hidden)]
#[cfg(feature = "metrics")]
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::outcome::{AppendOutcome, BatchOutcome};
use crate::recovery::report::RecoveryReport;
use handles::{Counter, Gauge, Histogram, appends, counter, describe, gauge, histogram, labels};
pub(crate) use names::check_labels;
use names::*;
pub use names::{METRICS, Metric, MetricKind, TARGET};

/// How often, at most, a group commit refreshes the live-producers gauge
/// (counting the keys takes the store's lock for a pass over its 256
/// shards' lengths).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The index of an answer in [`OUTCOMES`].
#[inline]
fn outcome_index(r: &Result<BatchOutcome>) -> usize {
    match r {
        Ok(o) => match o.outcome() {
            AppendOutcome::Accepted => 0,
            AppendOutcome::Duplicate => 1,
            AppendOutcome::OutOfOrder => 2,
            AppendOutcome::FencedEpoch => 3,
        },
        Err(_) => 4,
    }
}

/// One group commit, as the leader saw it.
pub(crate) struct Group {
    /// Records written (0: the group only fsync'ed).
    pub(crate) records: u64,
    /// Bytes of records written.
    pub(crate) bytes: u64,
    /// How long its fsync took, if it had one.
    pub(crate) fsync: Option<Duration>,
}

/// Why a store was poisoned, for the event.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) struct Poison<'a> {
    pub(crate) op: &'static str,
    pub(crate) path: &'a Path,
    pub(crate) error: &'a Error,
    /// Records lost with the failed group (and queued behind it).
    pub(crate) records: u64,
}

/// Sets this store's share of a gauge summed over the open stores to
/// `now`: moves it by the difference from what `published` says this store
/// last added.
fn move_by(gauge: &Gauge, published: &AtomicU64, now: usize) {
    let now = now as u64;
    let before = published.swap(now, Ordering::Relaxed);
    if now > before {
        gauge.increment((now - before) as f64);
    } else if now < before {
        gauge.decrement((before - now) as f64);
    }
}

/// One store's metric handles and event context.
pub(crate) struct Telemetry {
    /// Appends answered with an error. The other answers are counted by
    /// the store under its lock (`StoreStats`), where they are decided.
    errors: AtomicU64,
    appends: [Counter; 5],
    log_records: Counter,
    log_bytes: Counter,
    log_writes: Counter,
    log_fsyncs: Counter,
    fsync_seconds: Histogram,
    group_records: Histogram,
    snapshots: Counter,
    snapshot_failures: Counter,
    snapshot_seconds: Histogram,
    snapshot_bytes: Histogram,
    recovery_seconds: Histogram,
    recovery_records: Counter,
    recovery_torn_bytes: Counter,
    recovery_skipped: Counter,
    recovery_salvaged_bytes: Counter,
    poisoned: Counter,
    producers: Gauge,
    expirations: Counter,
    evictions: Counter,
    late_transactions: Gauge,
    /// The key count this store last added to the gauge.
    published: AtomicU64,
    /// The late-transaction count this store last added to its gauge.
    late_published: AtomicU64,
    /// The expired and evicted totals last counted (see `removed`).
    removed_published: [AtomicU64; 2],
    /// When a group commit next refreshes the gauge, in nanoseconds since
    /// `born`.
    next_sample: AtomicU64,
    born: Instant,
    /// The store's directory, a field of every event.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    dir: PathBuf,
}

impl Telemetry {
    /// Resolves the handles of the store in `dir` from the recorder
    /// installed now (globally, or on this thread for the duration of a
    /// `metrics::with_local_recorder`), each carrying `labels`.
    pub(crate) fn new(dir: &Path, labels_: &[(String, String)]) -> Telemetry {
        describe();
        let l = labels(labels_);
        Telemetry {
            errors: AtomicU64::new(0),
            appends: OUTCOMES.map(|o| appends(o, &l)),
            log_records: counter(LOG_RECORDS, &l),
            log_bytes: counter(LOG_BYTES, &l),
            log_writes: counter(LOG_WRITES, &l),
            log_fsyncs: counter(LOG_FSYNCS, &l),
            fsync_seconds: histogram(FSYNC_SECONDS, &l),
            group_records: histogram(GROUP_RECORDS, &l),
            snapshots: counter(SNAPSHOTS, &l),
            snapshot_failures: counter(SNAPSHOT_FAILURES, &l),
            snapshot_seconds: histogram(SNAPSHOT_SECONDS, &l),
            snapshot_bytes: histogram(SNAPSHOT_BYTES, &l),
            recovery_seconds: histogram(RECOVERY_SECONDS, &l),
            recovery_records: counter(RECOVERY_RECORDS, &l),
            recovery_torn_bytes: counter(RECOVERY_TORN_BYTES, &l),
            recovery_skipped: counter(RECOVERY_SKIPPED, &l),
            recovery_salvaged_bytes: counter(RECOVERY_SALVAGED_BYTES, &l),
            poisoned: counter(POISONED, &l),
            producers: gauge(PRODUCERS, &l),
            expirations: counter(EXPIRATIONS, &l),
            evictions: counter(EVICTIONS, &l),
            late_transactions: gauge(LATE_TRANSACTIONS, &l),
            published: AtomicU64::new(0),
            late_published: AtomicU64::new(0),
            removed_published: [AtomicU64::new(0), AtomicU64::new(0)],
            next_sample: AtomicU64::new(0),
            born: Instant::now(),
            dir: dir.to_path_buf(),
        }
    }

    /// One append was answered `r`.
    #[inline]
    pub(crate) fn answered(&self, r: &Result<BatchOutcome>) {
        let i = outcome_index(r);
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.appends[i].increment(1);
    }

    /// An `append_all` call was answered `out`: one increment per outcome.
    pub(crate) fn answered_all(&self, out: &[Result<BatchOutcome>]) {
        let mut n = [0u64; 5];
        for r in out {
            n[outcome_index(r)] += 1;
        }
        if n[4] > 0 {
            self.errors.fetch_add(n[4], Ordering::Relaxed);
        }
        for (i, n) in n.into_iter().enumerate().filter(|&(_, n)| n > 0) {
            self.appends[i].increment(n);
        }
    }

    /// Appends answered with an error so far.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// A group commit is done: its appenders are awake.
    pub(crate) fn group(&self, g: &Group) {
        if g.records > 0 {
            self.log_writes.increment(1);
            self.log_records.increment(g.records);
            self.log_bytes.increment(g.bytes);
            self.group_records.record(g.records as f64);
        }
        if let Some(d) = g.fsync {
            self.log_fsyncs.increment(1);
            self.fsync_seconds.record(d.as_secs_f64());
        }
    }

    /// After a group commit, under the store's lock: true if it is time to
    /// count the keys for the gauge (at most every [`SAMPLE_EVERY`];
    /// never without the `metrics` feature).
    #[inline]
    pub(crate) fn producers_due(&self) -> bool {
        if !cfg!(feature = "metrics") {
            return false;
        }
        let now = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now < self.next_sample.load(Ordering::Relaxed) {
            return false;
        }
        let every = SAMPLE_EVERY.as_nanos() as u64;
        self.next_sample
            .store(now.saturating_add(every), Ordering::Relaxed);
        true
    }

    /// The store holds `live` keys: moves the gauge by the difference from
    /// what this store last reported.
    pub(crate) fn producers(&self, live: usize) {
        move_by(&self.producers, &self.published, live);
    }

    /// A check found `late` partitions with a late transaction: moves the
    /// gauge as [`Telemetry::producers`] does.
    pub(crate) fn late_transactions(&self, late: usize) {
        move_by(&self.late_transactions, &self.late_published, late);
    }

    /// The store opened: what recovery found and did.
    pub(crate) fn recovered(&self, r: &RecoveryReport) {
        self.recovery_seconds.record(r.duration.as_secs_f64());
        self.recovery_records.increment(r.records_replayed);
        self.recovery_torn_bytes.increment(r.torn_bytes_dropped());
        self.recovery_skipped
            .increment(r.skipped_snapshots.len() as u64);
        if let Some(s) = &r.salvage {
            self.recovery_salvaged_bytes.increment(s.bytes);
        }
        self.producers(r.keys);
        #[cfg(feature = "tracing")]
        {
            let dir = self.dir.display();
            for s in &r.skipped_snapshots {
                tracing::warn!(
                    target: TARGET,
                    %dir,
                    file = %s.file.display(),
                    offset = s.offset,
                    damage = %s.kind,
                    "snapshot failed verification; recovery fell back to an older one"
                );
            }
            if let Some(t) = &r.torn_tail {
                tracing::warn!(
                    target: TARGET,
                    %dir,
                    file = %t.file.display(),
                    offset = t.offset,
                    bytes = t.bytes,
                    preallocated = t.preallocated,
                    "recovery cut a torn tail off the log (bytes never durable: no acknowledged append was in them)"
                );
            }
            if let Some(s) = &r.salvage {
                tracing::error!(
                    target: TARGET,
                    %dir,
                    cause = %s.cause,
                    bytes = s.bytes,
                    discarded = ?s.discarded,
                    "salvage moved damaged log aside: the appends in it are forgotten"
                );
            }
            for f in &r.files_removed {
                tracing::debug!(
                    target: TARGET,
                    %dir,
                    file = %f.display(),
                    "recovery removed a leftover file"
                );
            }
            tracing::info!(
                target: TARGET,
                %dir,
                snapshot_position = r.snapshot.as_ref().map(|s| s.position),
                records_replayed = r.records_replayed,
                segments_read = r.segments_read,
                keys = r.keys,
                next_position = r.next_position,
                clean_shutdown = r.clean_shutdown,
                duration_ms = r.duration.as_secs_f64() * 1e3,
                "store recovered"
            );
        }
    }

    /// A failed write or fsync poisoned the store (once per store).
    pub(crate) fn poisoned(&self, p: &Poison<'_>) {
        self.poisoned.increment(1);
        #[cfg(feature = "tracing")]
        tracing::error!(
            target: TARGET,
            dir = %self.dir.display(),
            op = p.op,
            path = %p.path.display(),
            error = %p.error,
            records_lost = p.records,
            "the store is poisoned: a {} of the log failed; it refuses appends until reopened, and the appends waiting on it got the error",
            p.op
        );
        #[cfg(not(feature = "tracing"))]
        let _ = p;
    }

    /// A snapshot is durable.
    pub(crate) fn snapshot_written(&self, position: u64, keys: u64, bytes: u64, took: Duration) {
        self.snapshots.increment(1);
        self.snapshot_seconds.record(took.as_secs_f64());
        self.snapshot_bytes.record(bytes as f64);
        #[cfg(feature = "tracing")]
        tracing::info!(
            target: TARGET,
            dir = %self.dir.display(),
            position,
            producers = keys,
            bytes,
            duration_ms = took.as_secs_f64() * 1e3,
            "snapshot written"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = (position, keys);
    }

    /// A snapshot failed; `automatic` if no caller gets the error (a
    /// threshold started it), which is then logged.
    pub(crate) fn snapshot_failed(&self, e: &Error, automatic: bool) {
        self.snapshot_failures.increment(1);
        #[cfg(feature = "tracing")]
        if automatic {
            tracing::warn!(
                target: TARGET,
                dir = %self.dir.display(),
                error = %e,
                "automatic snapshot failed; the log is unaffected and the next threshold tries again"
            );
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (e, automatic);
    }

    /// A partition's truncation failed to read its records where the store
    /// placed them (`e`) and read the log from its base instead.
    pub(crate) fn skim_failed(&self, partition: i32, e: &Error) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: TARGET,
            dir = %self.dir.display(),
            partition,
            error = %e,
            "a partition's truncation could not read its records where they were placed; it read the log from its base instead"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = (partition, e);
    }

    /// The store's running totals of expired and evicted keys: counts
    /// what is new since the highest totals seen (two leaders may report
    /// out of order; a stale total adds nothing).
    pub(crate) fn removed(&self, expired: u64, evicted: u64) {
        let before = self.removed_published[0].fetch_max(expired, Ordering::Relaxed);
        self.expired(expired.saturating_sub(before));
        let before = self.removed_published[1].fetch_max(evicted, Ordering::Relaxed);
        self.evicted(evicted.saturating_sub(before));
    }

    /// An expiration sweep removed `keys` keys.
    fn expired(&self, keys: u64) {
        if keys == 0 {
            return;
        }
        self.expirations.increment(keys);
        #[cfg(feature = "tracing")]
        {
            tracing::debug!(
                target: TARGET,
                dir = %self.dir.display(),
                keys,
                "producers expired"
            );
        }
    }

    /// `keys` keys were evicted to keep the table within its cap (no
    /// event: evictions come with appends).
    fn evicted(&self, keys: u64) {
        if keys > 0 {
            self.evictions.increment(keys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_per_call_and_per_batch() {
        let t = Telemetry::new(Path::new("/s"), &[]);
        t.answered(&Ok(BatchOutcome::Accepted));
        t.answered(&Err(Error::Internal("x")));
        let dup = BatchOutcome::Duplicate { original: None };
        t.answered_all(&[
            Ok(dup),
            Ok(BatchOutcome::Accepted),
            Ok(dup),
            Err(Error::Internal("y")),
        ]);
        assert_eq!(t.errors(), 2);
    }

    /// A store's handles, resolved from a fresh capturing recorder.
    #[cfg(feature = "metrics")]
    fn captured(labels: &[(String, String)]) -> (Telemetry, testing::Capture) {
        let rec = testing::Capture::default();
        let t = metrics::with_local_recorder(&rec, || Telemetry::new(Path::new("/s"), labels));
        (t, rec)
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn every_metric_is_registered_and_described_at_open() {
        let (_t, rec) = captured(&[("partition".into(), "7".into())]);
        for m in METRICS {
            let (unit, help) = rec.description(m.name).expect(m.name);
            assert_eq!(help, m.help);
            let unit = unit.map(|u| u.as_str());
            assert_eq!(unit, Some(m.unit), "{}", m.name);
            let registered = rec
                .keys()
                .into_iter()
                .filter(|k| k.starts_with(&format!("{}{{", m.name)))
                .collect::<Vec<_>>();
            let want = if m.name == APPENDS { OUTCOMES.len() } else { 1 };
            assert_eq!(registered.len(), want, "{}: {registered:?}", m.name);
            assert!(registered.iter().all(|k| k.contains("partition=\"7\"")));
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn expirations_and_evictions_count_what_they_are_given() {
        let (t, rec) = captured(&[]);
        t.expired(3);
        t.expired(0);
        t.evicted(2);
        t.evicted(5);
        assert_eq!(rec.counter(EXPIRATIONS, &[]), Some(3));
        assert_eq!(rec.counter(EVICTIONS, &[]), Some(7));
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn stores_add_up_in_the_gauge_and_a_closed_one_leaves_it() {
        let rec = testing::Capture::default();
        let (a, b) = metrics::with_local_recorder(&rec, || {
            let new = || Telemetry::new(Path::new("/s"), &[]);
            (new(), new())
        });
        let gauge = || rec.gauge(PRODUCERS, &[]).unwrap();
        a.producers(10);
        b.producers(5);
        assert_eq!(gauge(), 15.0);
        a.producers(4);
        assert_eq!(gauge(), 9.0);
        b.producers(0);
        assert_eq!(gauge(), 4.0);
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn a_group_is_one_sample_per_histogram_whatever_its_size() {
        let (t, rec) = captured(&[]);
        let g = |records, fsync| Group {
            records,
            bytes: records * 18,
            fsync,
        };
        t.group(&g(100, Some(Duration::from_millis(2))));
        t.group(&g(3, None));
        t.group(&g(0, Some(Duration::from_millis(1))));
        assert_eq!(rec.samples(GROUP_RECORDS, &[]), Some(vec![100.0, 3.0]));
        assert_eq!(rec.samples(FSYNC_SECONDS, &[]), Some(vec![0.002, 0.001]));
        assert_eq!(rec.counter(LOG_RECORDS, &[]), Some(103));
        assert_eq!(rec.counter(LOG_BYTES, &[]), Some(103 * 18));
        assert_eq!(rec.counter(LOG_WRITES, &[]), Some(2));
        assert_eq!(rec.counter(LOG_FSYNCS, &[]), Some(2));
    }

    #[test]
    fn the_gauge_is_sampled_at_most_every_interval() {
        let t = Telemetry::new(Path::new("/s"), &[]);
        assert_eq!(t.producers_due(), cfg!(feature = "metrics"));
        assert!(!t.producers_due(), "again within the interval");
        t.next_sample.store(0, Ordering::Relaxed);
        assert_eq!(t.producers_due(), cfg!(feature = "metrics"));
    }
}
