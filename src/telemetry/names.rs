//! The names of the store's metrics and of its events' target, listed
//! once: what dashboards and
//! alerts are written against, what the store describes to the recorder,
//! and what docs/metrics.md documents (a test holds the two together).

/// The `target` of every event the store logs: `RUST_LOG=producer_state=debug`
/// (with `tracing-subscriber`'s env filter) shows them all.
pub const TARGET: &str = "producer_state";

/// What a metric measures over time.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (`_total`): rate it.
    Counter,
    /// Goes up and down: read it.
    Gauge,
    /// A distribution of samples: quantiles, or buckets in Prometheus.
    Histogram,
}

/// One metric the store reports.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    /// Its name, Prometheus style.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The unit of its values: `seconds`, `bytes`, or `count`.
    pub unit: &'static str,
    /// Labels it carries besides those of [`StoreOptions::metric_label`](crate::StoreOptions::metric_label).
    pub labels: &'static [&'static str],
    /// What it counts, and when it moves.
    pub help: &'static str,
}

pub(super) const APPENDS: &str = "producer_state_appends_total";
pub(super) const LOG_RECORDS: &str = "producer_state_log_records_total";
pub(super) const LOG_BYTES: &str = "producer_state_log_bytes_total";
pub(super) const LOG_WRITES: &str = "producer_state_log_writes_total";
pub(super) const LOG_FSYNCS: &str = "producer_state_log_fsyncs_total";
pub(super) const FSYNC_SECONDS: &str = "producer_state_fsync_duration_seconds";
pub(super) const GROUP_RECORDS: &str = "producer_state_group_records";
pub(super) const SNAPSHOTS: &str = "producer_state_snapshots_total";
pub(super) const SNAPSHOT_FAILURES: &str = "producer_state_snapshot_failures_total";
pub(super) const SNAPSHOT_SECONDS: &str = "producer_state_snapshot_duration_seconds";
pub(super) const SNAPSHOT_BYTES: &str = "producer_state_snapshot_size_bytes";
pub(super) const RECOVERY_SECONDS: &str = "producer_state_recovery_duration_seconds";
pub(super) const RECOVERY_RECORDS: &str = "producer_state_recovery_records_total";
pub(super) const RECOVERY_TORN_BYTES: &str = "producer_state_recovery_torn_bytes_total";
pub(super) const RECOVERY_SKIPPED: &str = "producer_state_recovery_skipped_snapshots_total";
pub(super) const RECOVERY_SALVAGED_BYTES: &str = "producer_state_recovery_salvaged_bytes_total";
pub(super) const POISONED: &str = "producer_state_poisoned_total";
pub(super) const PRODUCERS: &str = "producer_state_producers";
pub(super) const EXPIRATIONS: &str = "producer_state_expirations_total";
pub(super) const EVICTIONS: &str = "producer_state_evictions_total";
pub(super) const LATE_TRANSACTIONS: &str = "producer_state_partitions_with_late_transactions";

/// The label of [`APPENDS`] and its values, in the order of the
/// store's answers (`AppendOutcome`, then errors).
pub(super) const OUTCOME: &str = "outcome";
pub(super) const OUTCOMES: [&str; 5] = [
    "accepted",
    "duplicate",
    "out_of_order",
    "fenced_epoch",
    "error",
];

const fn metric(
    name: &'static str,
    kind: MetricKind,
    unit: &'static str,
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        unit,
        labels: &[],
        help,
    }
}

use MetricKind::{Counter as C, Gauge as G, Histogram as H};

/// Every metric the store reports (`docs/metrics.md` explains each).
pub const METRICS: &[Metric] = &[
    Metric {
        labels: &[OUTCOME],
        ..metric(
            APPENDS,
            C,
            "count",
            "Appends answered, by outcome: accepted, duplicate, out_of_order, fenced_epoch, or error (the call returned an error)",
        )
    },
    metric(LOG_RECORDS, C, "count", "Records written to the log"),
    metric(LOG_BYTES, C, "bytes", "Bytes of records written to the log"),
    metric(
        LOG_WRITES,
        C,
        "count",
        "Writes of record groups to the log (one per group commit)",
    ),
    metric(
        LOG_FSYNCS,
        C,
        "count",
        "fsyncs of the log by group commits and sync",
    ),
    metric(
        FSYNC_SECONDS,
        H,
        "seconds",
        "Latency of each fsync of the log",
    ),
    metric(
        GROUP_RECORDS,
        H,
        "count",
        "Records per group written to the log (group commit size)",
    ),
    metric(SNAPSHOTS, C, "count", "Snapshots written"),
    metric(
        SNAPSHOT_FAILURES,
        C,
        "count",
        "Snapshots that failed (the log is unaffected)",
    ),
    metric(
        SNAPSHOT_SECONDS,
        H,
        "seconds",
        "Time to write a snapshot, from its start to its file being durable",
    ),
    metric(SNAPSHOT_BYTES, H, "bytes", "Size of each snapshot written"),
    metric(
        RECOVERY_SECONDS,
        H,
        "seconds",
        "Time recovery took when a store opened",
    ),
    metric(
        RECOVERY_RECORDS,
        C,
        "count",
        "Log records recovery replayed on top of its snapshot",
    ),
    metric(
        RECOVERY_TORN_BYTES,
        C,
        "bytes",
        "Bytes of torn log tail recovery cut off (never durable, never acknowledged)",
    ),
    metric(
        RECOVERY_SKIPPED,
        C,
        "count",
        "Damaged snapshots recovery passed over for an older one",
    ),
    metric(
        RECOVERY_SALVAGED_BYTES,
        C,
        "bytes",
        "Bytes of damaged log salvage moved aside (their appends are forgotten)",
    ),
    metric(
        POISONED,
        C,
        "count",
        "Stores poisoned by a failed write or fsync (they refuse appends until reopened)",
    ),
    metric(
        PRODUCERS,
        G,
        "count",
        "Keys (producer id, partition) with state, summed over the open stores",
    ),
    metric(EXPIRATIONS, C, "count", "Keys expired for inactivity"),
    metric(
        EVICTIONS,
        C,
        "count",
        "Keys evicted to keep the table within its cap",
    ),
    metric(
        LATE_TRANSACTIONS,
        G,
        "count",
        "Partitions whose oldest open transaction is late (hanging), at the last check, summed over the open stores",
    ),
];

/// Refuses labels a Prometheus scrape could not carry: a name that is
/// not `[a-zA-Z_][a-zA-Z0-9_]*` or starts with `__` (reserved), one given
/// twice, or `outcome` (the label
/// of the appends counter). Whatever the features: options that open with
/// them on must open with them off.
pub(crate) fn check_labels(labels: &[(String, String)]) -> std::result::Result<(), String> {
    for (i, (k, _)) in labels.iter().enumerate() {
        let b = k.as_bytes();
        let valid = b
            .first()
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
        if !valid {
            return Err(format!(
                "metric label {k:?} is not a label name (letters, digits and _, not starting with a digit)"
            ));
        }
        if k.starts_with("__") {
            return Err(format!(
                "metric label {k:?} starts with __, which Prometheus reserves"
            ));
        }
        if k == OUTCOME {
            return Err(format!(
                "metric label {k:?} is the store's own label of {APPENDS}"
            ));
        }
        if labels[..i].iter().any(|(earlier, _)| earlier == k) {
            return Err(format!("metric label {k:?} is given twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_prometheus_style_and_listed_once() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        for m in METRICS {
            assert!(m.name.starts_with("producer_state_"), "{}", m.name);
            assert!(
                m.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                m.name
            );
            assert_eq!(
                m.kind == MetricKind::Counter,
                m.name.ends_with("_total"),
                "counters, and only they, end in _total: {}",
                m.name
            );
            if m.unit == "seconds" || m.unit == "bytes" {
                let suffix = format!("_{}", m.unit);
                assert!(
                    m.name.ends_with(&suffix) || m.name.ends_with(&format!("{suffix}_total")),
                    "the unit is in the name: {}",
                    m.name
                );
            }
            assert!(!m.help.is_empty());
        }
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name listed twice");
    }
}
