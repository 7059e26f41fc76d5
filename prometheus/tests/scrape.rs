//! The example's scrape text holds every metric the store reports, and the
//! values of the workload: what a Prometheus server would read.
//!
//! One test: the recorder is installed globally, once per process, as the
//! example installs it.

use producer_state::telemetry::{METRICS, MetricKind};

/// The value of the sample `name{labels}` whose labels include every one
/// of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| {
            let v = l.rsplit(' ').next().unwrap();
            v.parse().unwrap_or_else(|_| panic!("{l}"))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in:\n{text}");
    found[0]
}

#[test]
fn the_scrape_text_names_every_metric_with_the_workloads_values() {
    let handle = producer_state_prometheus::builder()
        .unwrap()
        .install_recorder()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, answers) = producer_state_prometheus::workload(dir.path()).unwrap();
    let text = handle.render();

    for m in METRICS {
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
            _ => unreachable!(),
        };
        assert!(
            text.contains(&format!("# TYPE {} {kind}\n", m.name)),
            "no {kind} {} in the scrape:\n{text}",
            m.name
        );
        assert!(
            text.contains(&format!("# HELP {} {}\n", m.name, m.help)),
            "{} undescribed",
            m.name
        );
    }
    let store_label = r#"store="orders""#;
    let appends = |outcome: &str| {
        let o = format!(r#"outcome="{outcome}""#);
        sample(&text, "producer_state_appends_total", &[store_label, &o])
    };
    let stats = store.stats();
    assert_eq!(
        appends("accepted"),
        answers.accepted as f64,
        "both opens together"
    );
    assert_eq!(appends("duplicate"), answers.duplicates as f64);
    assert_eq!(appends("out_of_order"), 1.0);
    assert_eq!(appends("fenced_epoch"), 1.0);
    assert_eq!(appends("error"), 0.0);
    assert_eq!(
        stats.accepted,
        producer_state_prometheus::PRODUCERS,
        "this open's"
    );

    let producers = sample(&text, "producer_state_producers", &[store_label]);
    assert_eq!(producers, store.len() as f64);
    assert_eq!(producers, producer_state_prometheus::PRODUCERS as f64);

    // Every accepted append is one record; histograms count each group.
    let records = sample(&text, "producer_state_log_records_total", &[store_label]);
    assert_eq!(records, answers.accepted as f64);
    let groups = sample(&text, "producer_state_log_writes_total", &[store_label]);
    let group_count = sample(&text, "producer_state_group_records_count", &[store_label]);
    let group_sum = sample(&text, "producer_state_group_records_sum", &[store_label]);
    assert_eq!(group_count, groups);
    assert_eq!(group_sum, records);
    let fsyncs = sample(&text, "producer_state_log_fsyncs_total", &[store_label]);
    let fsync_count = sample(
        &text,
        "producer_state_fsync_duration_seconds_count",
        &[store_label],
    );
    assert_eq!(fsync_count, fsyncs);
    assert!(fsyncs >= 1.0);
    let inf = sample(
        &text,
        "producer_state_fsync_duration_seconds_bucket",
        &[store_label, r#"le="+Inf""#],
    );
    assert_eq!(inf, fsyncs, "buckets, not a summary");

    assert_eq!(
        sample(&text, "producer_state_snapshots_total", &[store_label]),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "producer_state_recovery_duration_seconds_count",
            &[store_label]
        ),
        2.0,
        "two opens"
    );
    store.close().unwrap();
}
