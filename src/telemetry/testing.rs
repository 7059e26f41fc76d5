//! A recorder that keeps every value it is given, for tests of what the
//! store reports (this crate's, and an embedder's). Not part of the API.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// One series: a counter's count, a gauge's value (as `f64` bits), or a
/// histogram's samples.
#[derive(Default)]
struct Series {
    value: AtomicU64,
    samples: Mutex<Vec<f64>>,
}

impl CounterFn for Series {
    fn increment(&self, v: u64) {
        self.value.fetch_add(v, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.value.fetch_max(v, Ordering::Relaxed);
    }
}

impl GaugeFn for Series {
    fn increment(&self, v: f64) {
        let _ = self
            .value
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((f64::from_bits(b) + v).to_bits())
            });
    }
    fn decrement(&self, v: f64) {
        GaugeFn::increment(self, -v);
    }
    fn set(&self, v: f64) {
        self.value.store(v.to_bits(), Ordering::Relaxed);
    }
}

impl HistogramFn for Series {
    fn record(&self, v: f64) {
        lock(&self.samples).push(v);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each metric's unit and description, by name.
type Descriptions = BTreeMap<String, (Option<Unit>, String)>;

/// The recorder: series by `name{label="value",...}` (labels sorted),
/// and the descriptions given. Clones share the series.
#[derive(Clone, Default)]
pub struct Capture {
    series: Arc<Mutex<BTreeMap<String, Arc<Series>>>>,
    described: Arc<Mutex<Descriptions>>,
}

/// `name{k="v",...}` with the labels sorted, as [`Capture`] keys series.
pub fn series_key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    l.sort();
    format!("{name}{{{}}}", l.join(","))
}

impl Capture {
    fn series(&self, key: &Key) -> Arc<Series> {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let k = series_key(key.name(), &labels);
        lock(&self.series).entry(k).or_default().clone()
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<Arc<Series>> {
        lock(&self.series).get(&series_key(name, labels)).cloned()
    }

    /// A counter's count (`None`: never registered).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        self.get(name, labels)
            .map(|s| s.value.load(Ordering::Relaxed))
    }

    /// A gauge's value (`None`: never registered).
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.get(name, labels)
            .map(|s| f64::from_bits(s.value.load(Ordering::Relaxed)))
    }

    /// A histogram's samples (`None`: never registered).
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Option<Vec<f64>> {
        self.get(name, labels).map(|s| lock(&s.samples).clone())
    }

    /// Every series registered, as `name{labels}`.
    pub fn keys(&self) -> Vec<String> {
        lock(&self.series).keys().cloned().collect()
    }

    /// The unit and description a metric was described with.
    pub fn description(&self, name: &str) -> Option<(Option<Unit>, String)> {
        lock(&self.described).get(name).cloned()
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        lock(&self.described).insert(key.as_str().to_owned(), (unit, text.into_owned()));
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.series(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.series(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.series(key))
    }
}
