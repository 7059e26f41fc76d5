//! The transaction APIs (InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit), over
//! [`crate::txn_coordinator`]. Each runs on a blocking thread: it writes
//! the transaction log, and EndTxn the markers, before it answers.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;

use super::Shared;
use crate::group_coordinator::Committed;
use crate::txn_coordinator::{Caller, code};

/// The code an old epoch is answered with: `PRODUCER_FENCED` from the
/// request version that knows it (KIP-588), `INVALID_PRODUCER_EPOCH`
/// before, as Kafka's `KafkaApis` maps it.
fn fenced(version: i16, from: i16) -> i16 {
    if version >= from {
        code::PRODUCER_FENCED
    } else {
        code::INVALID_PRODUCER_EPOCH
    }
}

/// Runs `f` on a blocking thread; a thread that panicked is an unknown
/// server error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::result::Result<T, i16> + Send + 'static,
) -> std::result::Result<T, i16> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(code::UNKNOWN_SERVER_ERROR))
}

/// InitProducerId with a transactional id.
pub(super) async fn init_producer_id(
    shared: &Arc<Shared>,
    transactional_id: String,
    timeout_ms: i32,
) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    let broker = shared.broker.clone();
    let answer = blocking(move || {
        let b = &*broker;
        b.transactions(|c| {
            c.init_producer_id(&transactional_id, timeout_ms, b, &mut || {
                b.allocate_producer_id()
            })
        })
    })
    .await;
    match answer {
        Ok(i) => {
            r.producer_id = ProducerId(i.producer_id);
            r.producer_epoch = i.producer_epoch;
        }
        Err(e) => r.error_code = e,
    }
    r
}

pub(super) async fn add_partitions(
    shared: &Arc<Shared>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let broker = shared.broker.clone();
    let topics: Vec<(TopicName, Vec<i32>)> = req
        .v3_and_below_topics
        .iter()
        .map(|t| (t.name.clone(), t.partitions.clone()))
        .collect();
    // Partitions that do not exist fail the request: they are answered
    // UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED.
    let unknown: Vec<(String, i32)> = topics
        .iter()
        .flat_map(|(name, parts)| {
            let t = broker.topic(name.0.as_str());
            parts
                .iter()
                .filter(move |p| {
                    !t.as_ref()
                        .is_some_and(|t| usize::try_from(**p).is_ok_and(|i| i < t.partitions.len()))
                })
                .map(move |p| (name.0.to_string(), *p))
        })
        .collect();
    let result: std::result::Result<(), i16> = if unknown.is_empty() {
        let id = req.v3_and_below_transactional_id.0.to_string();
        let (pid, epoch) = (
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
        );
        let parts: Vec<(String, i32)> = topics
            .iter()
            .flat_map(|(n, ps)| ps.iter().map(|p| (n.0.to_string(), *p)))
            .collect();
        blocking(move || {
            let caller = Caller {
                transactional_id: &id,
                producer_id: pid,
                epoch,
                fenced: fenced(version, 2),
            };
            broker.transactions(|c| c.add(&caller, &parts, &[], crate::now_ms()))
        })
        .await
    } else {
        Err(ResponseError::OperationNotAttempted.code())
    };
    let mut r = AddPartitionsToTxnResponse::default();
    r.results_by_topic_v3_and_below = topics
        .into_iter()
        .map(|(name, parts)| {
            let results = parts
                .into_iter()
                .map(|p| {
                    let code = if unknown.contains(&(name.0.to_string(), p)) {
                        ResponseError::UnknownTopicOrPartition.code()
                    } else {
                        result.err().unwrap_or(0)
                    };
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(p)
                        .with_partition_error_code(code)
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(name)
                .with_results_by_partition(results)
        })
        .collect();
    r
}

pub(super) async fn add_offsets(
    shared: &Arc<Shared>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let broker = shared.broker.clone();
    let result = blocking(move || {
        let caller = Caller {
            transactional_id: req.transactional_id.0.as_str(),
            producer_id: req.producer_id.0,
            epoch: req.producer_epoch,
            fenced: fenced(version, 2),
        };
        broker.transactions(|c| c.add(&caller, &[], &[req.group_id.0.to_string()], crate::now_ms()))
    })
    .await;
    let mut r = AddOffsetsToTxnResponse::default();
    r.error_code = result.err().unwrap_or(0);
    r
}

pub(super) async fn end_txn(
    shared: &Arc<Shared>,
    req: EndTxnRequest,
    version: i16,
) -> EndTxnResponse {
    let broker = shared.broker.clone();
    let result = blocking(move || {
        let caller = Caller {
            transactional_id: req.transactional_id.0.as_str(),
            producer_id: req.producer_id.0,
            epoch: req.producer_epoch,
            fenced: fenced(version, 2),
        };
        let b = &*broker;
        b.transactions(|c| c.end_txn(&caller, req.committed, b))
    })
    .await;
    shared.broker.data.notify_waiters();
    let mut r = EndTxnResponse::default();
    r.error_code = result.err().unwrap_or(0);
    r
}

pub(super) async fn txn_offset_commit(
    shared: &Arc<Shared>,
    req: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let offsets: Vec<((String, i32), Committed)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    (t.name.0.to_string(), p.partition_index),
                    Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p
                            .committed_metadata
                            .as_ref()
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                    },
                )
            })
        })
        .collect();
    let code = if req.group_instance_id.is_some() {
        code::INVALID_REQUEST
    } else {
        let broker = shared.broker.clone();
        let (id, group, pid, epoch) = (
            req.transactional_id.0.to_string(),
            req.group_id.0.to_string(),
            req.producer_id.0,
            req.producer_epoch,
        );
        let (generation, member) = if version >= 3 {
            (req.generation_id, req.member_id.to_string())
        } else {
            (-1, String::new())
        };
        blocking(move || {
            let caller = Caller {
                transactional_id: &id,
                producer_id: pid,
                epoch,
                fenced: fenced(version, 3),
            };
            // The group must be in the producer's ongoing transaction
            // (AddOffsetsToTxn first), checked and written under the
            // coordinator's lock: an EndTxn cannot complete the transaction
            // between the two and leave these offsets pending for the
            // producer's next one.
            broker.transactions(|c| {
                c.in_transaction(&caller, &group)?;
                broker
                    .groups()
                    .txn_commit(&group, pid, generation, &member, &offsets)
            })
        })
        .await
        .err()
        .unwrap_or(0)
    };
    let mut r = TxnOffsetCommitResponse::default();
    r.topics = req
        .topics
        .into_iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .into_iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    r
}
