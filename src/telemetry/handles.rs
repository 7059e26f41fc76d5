//! The facade's handles, or zero-sized no-ops when the `metrics` feature
//! is off: the store's calls are written once and compile to nothing
//! without it.

#[cfg(feature = "metrics")]
#[cfg(feature = "metrics")]
use super::names::{APPENDS, METRICS, MetricKind, OUTCOME, TARGET};

#[cfg(feature = "metrics")]
pub(super) use metrics::{Counter, Gauge, Histogram};
#[cfg(not(feature = "metrics"))]
pub(super) use off::{Counter, Gauge, Histogram};

/// Labels every metric of one store carries.
#[cfg(feature = "metrics")]
pub(super) type Labels = Vec<metrics::Label>;
#[cfg(not(feature = "metrics"))]
pub(super) type Labels = off::Labels;

#[cfg(feature = "metrics")]
pub(super) fn labels(pairs: &[(String, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| metrics::Label::new(k.clone(), v.clone()))
        .collect()
}

#[cfg(feature = "metrics")]
pub(super) fn counter(name: &'static str, labels: &Labels) -> Counter {
    metrics::counter!(target: TARGET, name, labels.clone())
}

#[cfg(feature = "metrics")]
pub(super) fn gauge(name: &'static str, labels: &Labels) -> Gauge {
    metrics::gauge!(target: TARGET, name, labels.clone())
}

#[cfg(feature = "metrics")]
pub(super) fn histogram(name: &'static str, labels: &Labels) -> Histogram {
    metrics::histogram!(target: TARGET, name, labels.clone())
}

/// The counter of appends answered with outcome `outcome`.
#[cfg(feature = "metrics")]
pub(super) fn appends(outcome: &'static str, labels: &Labels) -> Counter {
    let mut l = labels.clone();
    l.push(metrics::Label::new(OUTCOME, outcome));
    metrics::counter!(target: TARGET, APPENDS, l)
}

/// Tells the recorder what every metric is (Prometheus prints it as
/// `# HELP`).
#[cfg(feature = "metrics")]
pub(super) fn describe() {
    for m in METRICS {
        let unit = match m.unit {
            "seconds" => metrics::Unit::Seconds,
            "bytes" => metrics::Unit::Bytes,
            _ => metrics::Unit::Count,
        };
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, unit, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, unit, m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, unit, m.help),
        }
    }
}

/// Zero-sized stand-ins for the facade's handles when the `metrics`
/// feature is off: the store's calls compile to nothing.
#[cfg(not(feature = "metrics"))]
mod off {
    pub(crate) struct Labels;
    pub(crate) struct Counter;
    pub(crate) struct Gauge;
    pub(crate) struct Histogram;

    impl Counter {
        #[inline(always)]
        pub(crate) fn increment(&self, _: u64) {}
    }

    impl Gauge {
        #[inline(always)]
        pub(crate) fn increment(&self, _: f64) {}
        #[inline(always)]
        pub(crate) fn decrement(&self, _: f64) {}
    }

    impl Histogram {
        #[inline(always)]
        pub(crate) fn record(&self, _: f64) {}
    }
}

#[cfg(not(feature = "metrics"))]
pub(super) fn labels(_: &[(String, String)]) -> Labels {
    off::Labels
}
#[cfg(not(feature = "metrics"))]
pub(super) fn counter(_: &'static str, _: &Labels) -> Counter {
    Counter
}
#[cfg(not(feature = "metrics"))]
pub(super) fn gauge(_: &'static str, _: &Labels) -> Gauge {
    Gauge
}
#[cfg(not(feature = "metrics"))]
pub(super) fn histogram(_: &'static str, _: &Labels) -> Histogram {
    Histogram
}
#[cfg(not(feature = "metrics"))]
pub(super) fn appends(_: &'static str, _: &Labels) -> Counter {
    Counter
}
#[cfg(not(feature = "metrics"))]
pub(super) fn describe() {}
