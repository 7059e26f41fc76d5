//! Produce and InitProducerId.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::Shared;
use crate::Broker;
use crate::partition::Produced;

pub(super) async fn init_producer_id(
    broker: &Arc<Broker>,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    if req.transactional_id.is_some() {
        r.error_code = ResponseError::InvalidRequest.code();
        return r;
    }
    // Like Kafka for a producer without a transactional id: always a new
    // id at epoch 0, also when the client asks to bump the epoch of its
    // current one (KIP-360); its old id's state is then simply unused.
    let b = broker.clone();
    match tokio::task::spawn_blocking(move || b.allocate_producer_id()).await {
        Ok(Ok(id)) => {
            tracing::info!(producer_id = id, "handed out a producer id");
            r.producer_id = ProducerId(id);
            r.producer_epoch = 0;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "storing the next producer id failed");
            r.error_code = ResponseError::UnknownServerError.code();
        }
        Err(e) => {
            tracing::error!(error = %e, "producer id task failed");
            r.error_code = ResponseError::UnknownServerError.code();
        }
    }
    r
}

/// One partition's part of a produce request.
struct Job {
    topic: usize,
    topic_name: String,
    partition: i32,
    target: Option<Arc<crate::partition::Partition>>,
    records: Option<Bytes>,
}

/// Threads one produce request uses at most: its partitions are
/// independent and each waits for its log's fsync, so a few run at once;
/// a request naming thousands of partitions must not start thousands of
/// threads.
const PRODUCE_THREADS: usize = 8;

/// What producing one partition's records came to: the size and record
/// checks that need no partition, then [`crate::partition::Partition::produce`].
fn produce_one(j: &Job, shared: &Shared, transactional_id: Option<&str>) -> Produced {
    let limits = &shared.limits;
    let refuse = |e: ResponseError, message: String| Produced::Refused {
        code: e.code(),
        message,
    };
    let (Some(p), Some(records)) = (&j.target, &j.records) else {
        return match j.target {
            None => refuse(
                ResponseError::UnknownTopicOrPartition,
                "unknown topic or partition".into(),
            ),
            Some(_) => refuse(ResponseError::InvalidRecord, "no records".into()),
        };
    };
    if records.len() > limits.message_max_bytes {
        return refuse(
            ResponseError::MessageTooLarge,
            format!(
                "a {}-byte batch is more than message.max.bytes ({})",
                records.len(),
                limits.message_max_bytes
            ),
        );
    }
    // Refusals of the header itself (CRC, length, magic, count fields) are
    // the partition's, with the rest of the produce path's answers.
    if let Ok(h) = crate::batch::parse(records)
        && h.size == records.len()
    {
        if let Err(e) =
            crate::records::check(records, &h, limits.max_decompressed_batch_bytes as u64)
        {
            return refuse(ResponseError::InvalidRecord, e.to_string());
        }
        // KIP-890: a transactional batch is verified with the transaction
        // coordinator (its producer added this partition to its ongoing
        // transaction), under the partition's lock (see TxnView). Without
        // a transactional id nothing can be verified (the producer state
        // then refuses a batch that would open one).
        if h.is_transactional()
            && !h.is_control()
            && let Some(id) = transactional_id
        {
            let view = shared.broker.txn_view();
            let (pid, epoch) = (h.producer_id, h.producer_epoch);
            let check = move || view.verify(id, pid, epoch, &j.topic_name, j.partition);
            return p.produce_verified(&mut records.to_vec(), &check);
        }
    }
    p.produce(&mut records.to_vec())
}

pub(super) async fn produce(shared: &Arc<Shared>, req: ProduceRequest) -> Option<ProduceResponse> {
    let broker = &shared.broker;
    let acks = req.acks;
    let mut names = Vec::new();
    let mut jobs = Vec::new();
    for (ti, t) in req.topic_data.into_iter().enumerate() {
        let topic = broker.topic(t.name.0.as_str());
        let topic_name = t.name.0.to_string();
        names.push(t.name);
        for p in t.partition_data {
            let target = topic
                .as_ref()
                .and_then(|t| {
                    usize::try_from(p.index)
                        .ok()
                        .and_then(|i| t.partitions.get(i))
                })
                .cloned();
            jobs.push(Job {
                topic: ti,
                topic_name: topic_name.clone(),
                partition: p.index,
                target,
                records: p.records,
            });
        }
    }
    let results: Vec<(usize, i32, Produced)> = if !matches!(acks, -1..=1) {
        // Kafka's answer to acks other than -1, 0 and 1, for every
        // partition (nothing is written).
        let code = ResponseError::InvalidRequiredAcks.code();
        jobs.iter()
            .map(|j| {
                let message = format!("acks {acks}: only -1, 0 and 1 are valid");
                (j.topic, j.partition, Produced::Refused { code, message })
            })
            .collect()
    } else {
        let s = shared.clone();
        let txn_id = req.transactional_id.map(|t| t.0.to_string());
        tokio::task::spawn_blocking(move || run_jobs(&s, jobs, txn_id.as_deref()))
            .await
            .unwrap_or_default()
    };
    broker.data.notify_waiters();
    if acks == 0 {
        return None;
    }
    let mut r = ProduceResponse::default();
    r.responses = names
        .into_iter()
        .map(|n| TopicProduceResponse::default().with_name(n))
        .collect();
    for (ti, partition, outcome) in results {
        let mut p = PartitionProduceResponse::default()
            .with_index(partition)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(0);
        match outcome {
            Produced::Appended { base_offset } | Produced::Duplicate { base_offset } => {
                p.base_offset = base_offset;
            }
            Produced::Refused { code, message } => {
                p.error_code = code;
                p.base_offset = -1;
                p.error_message = Some(StrBytes::from_string(message));
            }
        }
        if let Some(t) = r.responses.get_mut(ti) {
            t.partition_responses.push(p);
        }
    }
    Some(r)
}

/// Produces every job, on at most [`PRODUCE_THREADS`] threads, and returns
/// the outcomes in the jobs' order.
fn run_jobs(
    shared: &Shared,
    jobs: Vec<Job>,
    transactional_id: Option<&str>,
) -> Vec<(usize, i32, Produced)> {
    let b = &shared.broker;
    let run = |j: &Job| -> Produced {
        let outcome = produce_one(j, shared, transactional_id);
        let name = j.target.as_ref().map(|p| p.name().to_string());
        match &outcome {
            Produced::Appended { .. } => {
                b.stats.batches_appended.fetch_add(1, Ordering::Relaxed);
            }
            Produced::Duplicate { base_offset } => {
                b.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                tracing::info!(partition = ?name, base_offset, "DUPLICATE produce answered with the original offset");
            }
            Produced::Refused { code, message } => {
                b.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = ?name, code, %message, "produce refused");
            }
        }
        outcome
    };
    let threads = jobs.len().min(PRODUCE_THREADS);
    let outcomes: Vec<Produced> = if threads <= 1 {
        jobs.iter().map(run).collect()
    } else {
        // Partitions are independent: classify and fsync them in parallel,
        // thread t taking jobs t, t + threads, ...
        let mut slots: Vec<Option<Produced>> = vec![None; jobs.len()];
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (jobs, run) = (&jobs, &run);
                    s.spawn(move || {
                        jobs.iter()
                            .enumerate()
                            .skip(t)
                            .step_by(threads)
                            .map(|(i, j)| (i, run(j)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                for (i, o) in h.join().unwrap_or_default() {
                    if let Some(slot) = slots.get_mut(i) {
                        *slot = Some(o);
                    }
                }
            }
        });
        slots
            .into_iter()
            .map(|o| {
                o.unwrap_or(Produced::Refused {
                    code: ResponseError::UnknownServerError.code(),
                    message: "the produce thread failed".into(),
                })
            })
            .collect()
    };
    jobs.iter()
        .zip(outcomes)
        .map(|(j, o)| (j.topic, j.partition, o))
        .collect()
}
