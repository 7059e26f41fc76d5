//! Fetch and ListOffsets.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::*;
use tokio::sync::OwnedSemaphorePermit;

use super::Shared;
use crate::Broker;
use crate::partition::Partition;
use crate::plog::ReadRange;

/// The longest a fetch waits for data, whatever the client asks.
const MAX_FETCH_WAIT: Duration = Duration::from_secs(5);

pub(super) fn list_offsets(broker: &Arc<Broker>, req: ListOffsetsRequest) -> ListOffsetsResponse {
    // A read_committed consumer's "latest" is the last stable offset.
    let read_committed = req.isolation_level == 1;
    let mut r = ListOffsetsResponse::default();
    r.topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.topic(t.name.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let mut out = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_leader_epoch(-1)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    match topic.as_ref().and_then(|t| {
                        usize::try_from(p.partition_index)
                            .ok()
                            .and_then(|i| t.partitions.get(i))
                    }) {
                        Some(part) => {
                            let (offset, ts) = if read_committed && p.timestamp == -1 {
                                (part.last_stable_offset(), -1)
                            } else {
                                part.list_offset(p.timestamp)
                            };
                            out.offset = offset;
                            out.timestamp = ts;
                        }
                        None => out.error_code = ResponseError::UnknownTopicOrPartition.code(),
                    }
                    out
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    r
}

/// One partition a Fetch names: the last values given for it, at the
/// place it was first named (Kafka keeps a fetch's partitions in an
/// insertion-ordered map, so a partition named twice is fetched once).
struct Wanted {
    partition: i32,
    fetch_offset: i64,
    partition_max_bytes: i32,
}

/// The fetch's partitions by topic, each once, in the order first named.
fn wanted(req: &FetchRequest) -> Vec<(TopicName, Vec<Wanted>)> {
    let mut topics: Vec<(TopicName, Vec<Wanted>)> = Vec::new();
    let mut at: HashMap<(TopicName, i32), (usize, usize)> = HashMap::new();
    for t in &req.topics {
        for p in &t.partitions {
            let w = Wanted {
                partition: p.partition,
                fetch_offset: p.fetch_offset,
                partition_max_bytes: p.partition_max_bytes,
            };
            match at.entry((t.topic.clone(), p.partition)) {
                Entry::Occupied(e) => {
                    let (ti, pi) = *e.get();
                    topics[ti].1[pi] = w;
                }
                Entry::Vacant(e) => {
                    let ti = match topics.iter().position(|(n, _)| *n == t.topic) {
                        Some(ti) => ti,
                        None => {
                            topics.push((t.topic.clone(), Vec::new()));
                            topics.len() - 1
                        }
                    };
                    e.insert((ti, topics[ti].1.len()));
                    topics[ti].1.push(w);
                }
            }
        }
    }
    topics
}

/// What a fetch will read from one partition, decided before any record
/// byte is read or any memory taken for it.
enum Plan {
    Read {
        part: Arc<Partition>,
        range: Option<ReadRange>,
        high_watermark: i64,
        last_stable_offset: i64,
    },
    Error {
        code: i16,
        high_watermark: i64,
    },
}

/// Decides what each partition gives, by KIP-74: the response holds at
/// most `max_bytes` of records (the request's, bounded by
/// `fetch.max.bytes`) and each partition at most its `partition_max_bytes`,
/// except that the first partition with data gives its first batch whole,
/// however large, so a consumer always makes progress. Returns the plans
/// and the record bytes they read.
fn plan(
    broker: &Broker,
    topics: &[(TopicName, Vec<Wanted>)],
    max_bytes: usize,
    read_committed: bool,
) -> (Vec<Vec<Plan>>, usize) {
    let mut budget = max_bytes;
    let mut total = 0usize;
    let plans = topics
        .iter()
        .map(|(name, parts)| {
            let topic = broker.topic(name.0.as_str());
            parts
                .iter()
                .map(|w| {
                    let part = topic.as_ref().and_then(|t| {
                        usize::try_from(w.partition)
                            .ok()
                            .and_then(|i| t.partitions.get(i))
                    });
                    let Some(part) = part else {
                        return Plan::Error {
                            code: ResponseError::UnknownTopicOrPartition.code(),
                            high_watermark: -1,
                        };
                    };
                    let max = usize::try_from(w.partition_max_bytes)
                        .unwrap_or(0)
                        .min(budget);
                    match part.plan_isolated(w.fetch_offset, max, total == 0, read_committed) {
                        Ok((range, high_watermark, last_stable_offset)) => {
                            let n = range.map_or(0, |r| r.len);
                            budget = budget.saturating_sub(n);
                            total += n;
                            Plan::Read {
                                part: part.clone(),
                                range,
                                high_watermark,
                                last_stable_offset,
                            }
                        }
                        Err(code) => Plan::Error {
                            code,
                            high_watermark: part.high_watermark(),
                        },
                    }
                })
                .collect()
        })
        .collect();
    (plans, total)
}

/// Reads what `plans` decided into the response's topics. A
/// `read_committed` reader also gets the aborted transactions it must skip
/// in what it reads (from its fetch offset to the last stable offset).
fn read(
    topics: &[(TopicName, Vec<Wanted>)],
    plans: Vec<Vec<Plan>>,
    read_committed: bool,
) -> Vec<FetchableTopicResponse> {
    topics
        .iter()
        .zip(plans)
        .map(|((name, parts), plans)| {
            let partitions = parts
                .iter()
                .zip(plans)
                .map(|(w, plan)| {
                    let mut out = PartitionData::default()
                        .with_partition_index(w.partition)
                        .with_preferred_read_replica(BrokerId(-1));
                    let (code, hw, lso, records) = match plan {
                        Plan::Error {
                            code,
                            high_watermark,
                        } => (code, high_watermark, high_watermark, None),
                        Plan::Read {
                            part,
                            range,
                            high_watermark,
                            last_stable_offset,
                        } => {
                            if read_committed {
                                out.aborted_transactions = Some(
                                    part.aborted_between(w.fetch_offset, last_stable_offset)
                                        .into_iter()
                                        .map(|(pid, first)| {
                                            AbortedTransaction::default()
                                                .with_producer_id(ProducerId(pid))
                                                .with_first_offset(first)
                                        })
                                        .collect(),
                                );
                            }
                            let lso = last_stable_offset;
                            match range.map(|r| part.read_range(r)) {
                                None => (0, high_watermark, lso, Some(Bytes::new())),
                                Some(Ok(bytes)) => {
                                    (0, high_watermark, lso, Some(Bytes::from(bytes)))
                                }
                                Some(Err(code)) => (code, high_watermark, lso, None),
                            }
                        }
                    };
                    out.error_code = code;
                    out.high_watermark = hw;
                    out.last_stable_offset = lso;
                    out.records = records;
                    out
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(name.clone())
                .with_partitions(partitions)
        })
        .collect()
}

/// Plans, takes room for the record bytes in `fetch.max.bytes` (shared by
/// every connection), and reads. The room is held until the response is
/// written.
async fn plan_and_read(
    shared: &Arc<Shared>,
    topics: &Arc<Vec<(TopicName, Vec<Wanted>)>>,
    max_bytes: usize,
    read_committed: bool,
) -> (
    Vec<FetchableTopicResponse>,
    usize,
    Option<OwnedSemaphorePermit>,
) {
    let (b, t) = (shared.broker.clone(), topics.clone());
    let Ok((plans, total)) =
        tokio::task::spawn_blocking(move || plan(&b, &t, max_bytes, read_committed)).await
    else {
        return (Vec::new(), 0, None);
    };
    // Twice the bytes: the records read, and their copy in the encoded
    // response. Never more than the pool holds (one batch over
    // fetch.max.bytes waits for the pool to be empty, then goes alone).
    let pool = shared.limits.fetch_max_bytes.saturating_mul(2).max(1);
    let want = u32::try_from(total.saturating_mul(2).min(pool)).unwrap_or(u32::MAX);
    let held = shared.fetches.clone().acquire_many_owned(want).await.ok();
    let t = topics.clone();
    let topics = tokio::task::spawn_blocking(move || read(&t, plans, read_committed))
        .await
        .unwrap_or_default();
    (topics, total, held)
}

pub(super) async fn fetch(
    shared: &Arc<Shared>,
    req: FetchRequest,
) -> (FetchResponse, Option<OwnedSemaphorePermit>) {
    let broker = &shared.broker;
    let wait =
        Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0)).min(MAX_FETCH_WAIT);
    let max_bytes = usize::try_from(req.max_bytes)
        .unwrap_or(0)
        .min(shared.limits.fetch_max_bytes);
    let topics = Arc::new(wanted(&req));
    // Isolation level 1: READ_COMMITTED (a consumer with
    // isolation.level=read_committed): records below the last stable
    // offset only, with the aborted transactions among them.
    let read_committed = req.isolation_level == 1;
    drop(req);
    // Registered before reading, so a produce between the read and the
    // wait still wakes this fetch.
    let notified = broker.data.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let (mut responses, total, mut held) =
        plan_and_read(shared, &topics, max_bytes, read_committed).await;
    if total == 0 && !wait.is_zero() && tokio::time::timeout(wait, notified).await.is_ok() {
        drop(held);
        (responses, _, held) = plan_and_read(shared, &topics, max_bytes, read_committed).await;
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        let parts: Vec<(i32, i16, i64, i64, usize)> = responses
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| {
                let n = p.records.as_ref().map_or(0, |b| b.len());
                (
                    p.partition_index,
                    p.error_code,
                    p.high_watermark,
                    p.last_stable_offset,
                    n,
                )
            })
            .collect();
        tracing::debug!(
            read_committed,
            ?parts,
            "fetch answered: (partition, error, hw, lso, bytes)"
        );
    }
    let mut r = FetchResponse::default();
    r.responses = responses;
    (r, held)
}
