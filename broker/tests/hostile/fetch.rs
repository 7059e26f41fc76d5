//! Fetch and KIP-74: a response holds what the request allows.

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::Broker;
use super::common::{self, Client};

fn fetch(
    topic: &str,
    partitions: &[(i32, i64)],
    max_bytes: i32,
    partition_max: i32,
) -> FetchRequest {
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = 0;
    r.max_bytes = max_bytes;
    r.session_epoch = -1;
    r.topics = vec![
        FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.into())))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&(p, offset)| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(partition_max)
                    })
                    .collect(),
            ),
    ];
    r
}

/// Fills partitions 0 and 1 of `topic` with `batches` batches of about
/// 64 KiB each; returns one batch's size.
fn fill(c: &mut Client, topic: &str, batches: i32) -> usize {
    common::create_topic(c, topic);
    let pid = common::producer_id(c);
    let value = "f".repeat(64 << 10);
    let mut size = 0;
    for p in 0..2 {
        for seq in 0..batches {
            let batch = common::batch(pid, 0, seq, &[value.as_str()]);
            size = batch.len();
            assert_eq!(common::produce(c, topic, p, batch).0, 0);
        }
    }
    size
}

fn record_bytes(r: &FetchResponse) -> Vec<usize> {
    r.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.records.as_ref().map_or(0, |b| b.len()))
        .collect()
}

/// The request that returned 200 MiB: max_bytes 1, one partition named 200
/// times. The partition is answered once, with one whole batch (the first
/// batch of the first partition with data goes whatever its size).
pub fn one_partition_many_times(b: &mut Broker) {
    let mut c = b.client();
    let one = fill(&mut c, "kip74", 40);
    let named: Vec<(i32, i64)> = vec![(0, 0); 200];
    let r = c.call(&fetch("kip74", &named, 1, 1 << 30), 11);
    assert_eq!(r.responses.len(), 1);
    assert_eq!(record_bytes(&r), [one]);
}

/// max_bytes across partitions: the first partition with data fills the
/// budget, the next gets none; per-partition limits hold for all but that
/// first batch.
pub fn max_bytes_across_partitions(b: &mut Broker) {
    let mut c = b.client();
    let one = fill(&mut c, "kip74b", 4);
    let both = [(0, 0), (1, 0)];
    // Budget for three batches: partition 0 gives three, 1 none.
    let r = c.call(&fetch("kip74b", &both, (3 * one) as i32, 1 << 30), 11);
    assert_eq!(record_bytes(&r), [3 * one, 0]);
    // Budget for five: partition 0 gives four (all), 1 gives one.
    let r = c.call(&fetch("kip74b", &both, (5 * one) as i32, 1 << 30), 11);
    assert_eq!(record_bytes(&r), [4 * one, one]);
    // Per-partition limit of one byte: the first batch of the first
    // partition, nothing of the second.
    let r = c.call(&fetch("kip74b", &both, 1 << 30, 1), 11);
    assert_eq!(record_bytes(&r), [one, 0]);
    // The first partition at its end: the second is the first with data.
    let r = c.call(&fetch("kip74b", &[(0, 4), (1, 0)], 1, 1), 11);
    assert_eq!(record_bytes(&r), [0, one]);
}
