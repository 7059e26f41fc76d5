//! The store's metrics as Prometheus sees them: a recorder from
//! `metrics-exporter-prometheus` with buckets for the store's histograms,
//! and a small workload that moves every metric a store reports without
//! the producer lifecycle.
//!
//! `cargo run -p producer-state-prometheus --example prometheus` installs
//! the recorder, runs [`workload`] in a temporary directory and prints the
//! scrape text. A workspace member of its own, so that the exporter and
//! its dependencies are never built for the library or its demo.

use std::path::Path;
use std::sync::Arc;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use producer_state::{
    AppendOutcome, Batch, BatchOutcome, FsyncPolicy, ProducerStateStore, StoreOptions,
};

/// A `PrometheusBuilder` with histogram buckets for the store's metrics
/// (otherwise the exporter renders histograms as summaries): latencies
/// from 50 µs to 5 s, group sizes from 1 to 4,096 records, snapshot sizes
/// from 1 KiB to 1 GiB.
///
/// # Errors
///
/// Never with these buckets; the exporter's setters return a
/// [`BuildError`] for an empty list.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    let seconds = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0, 2.5, 5.0,
    ];
    let records: Vec<f64> = (0..=12).map(|i| f64::from(1u32 << i)).collect();
    let bytes: Vec<f64> = (0..=10).map(|i| f64::from(1u32 << (10 + 2 * i))).collect();
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)?
        .set_buckets_for_metric(
            Matcher::Full("producer_state_group_records".into()),
            &records,
        )?
        .set_buckets_for_metric(Matcher::Suffix("_size_bytes".into()), &bytes)
}

/// What the workload's store answered, to check the scrape against.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Answers {
    /// Appends answered ACCEPTED, DUPLICATE, OUT_OF_ORDER, FENCED_EPOCH.
    pub accepted: u64,
    /// Appends answered DUPLICATE.
    pub duplicates: u64,
    /// Appends answered OUT_OF_ORDER.
    pub out_of_order: u64,
    /// Appends answered FENCED_EPOCH.
    pub fenced: u64,
}

impl Answers {
    fn count(&mut self, o: AppendOutcome) {
        match o {
            AppendOutcome::Accepted => self.accepted += 1,
            AppendOutcome::Duplicate => self.duplicates += 1,
            AppendOutcome::OutOfOrder => self.out_of_order += 1,
            AppendOutcome::FencedEpoch => self.fenced += 1,
        }
    }
}

/// Producers (threads) of the workload, and batches each appends.
pub const PRODUCERS: u64 = 4;
/// Batches each producer appends.
pub const BATCHES: i32 = 200;

/// Runs a small workload on a store in `dir` labelled `store="orders"`,
/// with the recorder installed now: [`PRODUCERS`] threads append
/// [`BATCHES`] batches each with fsync before every acknowledgement (so
/// they share group commits), retry some (duplicates), skip ahead once
/// (out of order) and send one zombie (fenced); then a snapshot, a close,
/// and a reopen (recovery) that appends a little more. Returns the open
/// store and what it answered since it was first opened.
///
/// # Errors
///
/// The store's, if any call fails.
pub fn workload(dir: &Path) -> producer_state::Result<(ProducerStateStore, Answers)> {
    let opts = || {
        StoreOptions::default()
            .fsync(FsyncPolicy::Always)
            .metric_label("store", "orders")
    };
    let store = Arc::new(ProducerStateStore::open_with(dir, opts())?);
    let answers = std::thread::scope(|s| {
        let workers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let store = &store;
                s.spawn(move || {
                    let mut a = Answers::default();
                    for i in 0..BATCHES {
                        let (first, last) = (i * 10, i * 10 + 9);
                        let offset = i64::from(i) * 10;
                        let batch = Batch::new(first, last, offset, 1_700_000_000_000 + offset);
                        a.count(store.append_batch(p, 0, 1, batch)?.outcome());
                        if i % 10 == 0 {
                            // A retry of the batch just acknowledged.
                            let retry = store.append_batch(p, 0, 1, batch)?;
                            assert!(matches!(retry, BatchOutcome::Duplicate { .. }));
                            a.count(retry.outcome());
                        }
                    }
                    Ok::<_, producer_state::Error>(a)
                })
            })
            .collect();
        let mut total = Answers::default();
        for w in workers {
            let a = w.join().expect("a workload thread panicked")?;
            total.accepted += a.accepted;
            total.duplicates += a.duplicates;
        }
        Ok::<_, producer_state::Error>(total)
    });
    let mut answers = answers?;
    answers.count(store.append(0u64, 0, 1, BATCHES * 10 + 5)?); // a gap
    answers.count(store.append(0u64, 0, 0, 0)?); // a zombie of epoch 0
    store.snapshot()?;
    Arc::into_inner(store)
        .expect("the workload threads are done")
        .close()?;

    // Reopened: recovery from the snapshot, then a new session.
    let store = ProducerStateStore::open_with(dir, opts())?;
    for p in 0..PRODUCERS {
        answers.count(store.append(p, 0, 2, 0)?);
    }
    Ok((store, answers))
}
