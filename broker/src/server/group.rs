//! FindCoordinator and the consumer group APIs, over
//! [`crate::group_coordinator`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{NODE_ID, Shared};
use crate::group_coordinator::{Committed, JoinRequest};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// `INVALID_REQUEST`: what a field this broker does not serve (a
/// `group.instance.id`) is answered with.
const INVALID_REQUEST: i16 = 42;

/// FindCoordinator: this broker coordinates every group and every
/// transactional id.
pub(super) fn find_coordinator(
    shared: &Shared,
    req: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let cfg = shared.broker.config();
    let mut r = FindCoordinatorResponse::default();
    let ours = |key: StrBytes| {
        Coordinator::default()
            .with_key(key)
            .with_node_id(BrokerId(NODE_ID))
            .with_host(s(&cfg.advertised_host))
            .with_port(cfg.advertised_port)
    };
    // Key types: 0 a group, 1 a transactional id; anything else is not a
    // coordinator this protocol knows.
    let known = matches!(req.key_type, 0 | 1);
    if version < 4 {
        if known {
            r.node_id = BrokerId(NODE_ID);
            r.host = s(&cfg.advertised_host);
            r.port = cfg.advertised_port;
        } else {
            r.error_code = INVALID_REQUEST;
            r.node_id = BrokerId(-1);
        }
    } else {
        r.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|k| {
                if known {
                    ours(k)
                } else {
                    ours(k)
                        .with_node_id(BrokerId(-1))
                        .with_error_code(INVALID_REQUEST)
                }
            })
            .collect();
    }
    r
}

pub(super) async fn join_group(
    shared: &Arc<Shared>,
    req: JoinGroupRequest,
    version: i16,
    client_id: &str,
) -> JoinGroupResponse {
    let mut r = JoinGroupResponse::default();
    r.generation_id = -1;
    r.member_id = req.member_id.clone();
    if req.group_instance_id.is_some() {
        r.error_code = INVALID_REQUEST;
        return r;
    }
    let joined = shared
        .broker
        .groups()
        .join(
            JoinRequest {
                group: req.group_id.0.to_string(),
                member_id: req.member_id.to_string(),
                client_id: client_id.to_string(),
                session_timeout: Duration::from_millis(req.session_timeout_ms.max(0) as u64),
                // Version 0 has no rebalance timeout: the session timeout.
                rebalance_timeout: Duration::from_millis(
                    if version == 0 {
                        req.session_timeout_ms
                    } else {
                        req.rebalance_timeout_ms
                    }
                    .max(0) as u64,
                ),
                protocol_type: req.protocol_type.to_string(),
                protocols: req
                    .protocols
                    .into_iter()
                    .map(|p| (p.name.to_string(), p.metadata))
                    .collect(),
                require_known_member_id: version >= 4,
            },
            Instant::now(),
        )
        .await;
    r.error_code = joined.error;
    r.generation_id = joined.generation;
    r.protocol_type = joined.protocol_type.as_deref().map(s);
    r.protocol_name = joined.protocol.as_deref().map(s);
    r.leader = s(&joined.leader);
    r.member_id = s(&joined.member_id);
    r.members = joined
        .members
        .into_iter()
        .map(|(id, meta)| {
            JoinGroupResponseMember::default()
                .with_member_id(s(&id))
                .with_metadata(meta)
        })
        .collect();
    r
}

pub(super) async fn sync_group(shared: &Arc<Shared>, req: SyncGroupRequest) -> SyncGroupResponse {
    let mut r = SyncGroupResponse::default();
    if req.group_instance_id.is_some() {
        r.error_code = INVALID_REQUEST;
        return r;
    }
    let (code, assignment) = shared
        .broker
        .groups()
        .sync(
            req.group_id.0.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            req.assignments
                .into_iter()
                .map(|a| (a.member_id.to_string(), a.assignment))
                .collect(),
            Instant::now(),
        )
        .await;
    r.error_code = code;
    r.assignment = assignment;
    r.protocol_type = req.protocol_type;
    r.protocol_name = req.protocol_name;
    r
}

pub(super) fn heartbeat(shared: &Shared, req: HeartbeatRequest) -> HeartbeatResponse {
    let mut r = HeartbeatResponse::default();
    r.error_code = if req.group_instance_id.is_some() {
        INVALID_REQUEST
    } else {
        shared.broker.groups().heartbeat(
            req.group_id.0.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            Instant::now(),
        )
    };
    r
}

pub(super) fn leave_group(
    shared: &Shared,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let mut r = LeaveGroupResponse::default();
    let ids: Vec<String> = if version < 3 {
        vec![req.member_id.to_string()]
    } else {
        req.members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    };
    let codes = shared
        .broker
        .groups()
        .leave(req.group_id.0.as_str(), &ids, Instant::now());
    if version < 3 {
        r.error_code = codes.first().copied().unwrap_or(0);
    } else {
        r.members = ids
            .iter()
            .zip(codes)
            .map(|(id, code)| {
                MemberResponse::default()
                    .with_member_id(s(id))
                    .with_error_code(code)
            })
            .collect();
    }
    r
}

/// The offsets of an OffsetCommit or TxnOffsetCommit, flattened.
type Offsets = Vec<((String, i32), Committed)>;

pub(super) async fn offset_commit(
    shared: &Arc<Shared>,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let offsets: Offsets = req
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
        INVALID_REQUEST
    } else {
        let sh = shared.clone();
        let group = req.group_id.0.to_string();
        let member = req.member_id.to_string();
        let generation = req.generation_id_or_member_epoch;
        let offs = offsets.clone();
        tokio::task::spawn_blocking(move || {
            sh.broker
                .groups()
                .commit(&group, generation, &member, &offs, Instant::now())
        })
        .await
        .unwrap_or(Err(crate::group_coordinator::code::KAFKA_STORAGE_ERROR))
        .err()
        .unwrap_or(0)
    };
    let mut r = OffsetCommitResponse::default();
    r.topics = req
        .topics
        .into_iter()
        .map(|t| {
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .into_iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    r
}

pub(super) fn offset_fetch(
    shared: &Shared,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let groups = shared.broker.groups();
    let mut r = OffsetFetchResponse::default();
    if version >= 8 {
        r.groups = req
            .groups
            .into_iter()
            .map(|g| {
                let asked: Option<Vec<(String, i32)>> = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .flat_map(|t| {
                            t.partition_indexes
                                .iter()
                                .map(|p| (t.name.0.to_string(), *p))
                        })
                        .collect()
                });
                let found =
                    groups.fetch(g.group_id.0.as_str(), asked.as_deref(), req.require_stable);
                let mut topics: Vec<OffsetFetchResponseTopics> = Vec::new();
                for ((topic, partition), c, code) in found {
                    let p = OffsetFetchResponsePartitions::default()
                        .with_partition_index(partition)
                        .with_committed_offset(c.as_ref().map_or(-1, |c| c.offset))
                        .with_committed_leader_epoch(c.as_ref().map_or(-1, |c| c.leader_epoch))
                        .with_metadata(Some(s(c.as_ref().map_or("", |c| c.metadata.as_str()))))
                        .with_error_code(code);
                    match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                        Some(t) => t.partitions.push(p),
                        None => topics.push(
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(s(&topic)))
                                .with_partitions(vec![p]),
                        ),
                    }
                }
                kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(topics)
            })
            .collect();
        return r;
    }
    let asked: Option<Vec<(String, i32)>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .flat_map(|t| {
                t.partition_indexes
                    .iter()
                    .map(|p| (t.name.0.to_string(), *p))
            })
            .collect()
    });
    let found = groups.fetch(
        req.group_id.0.as_str(),
        asked.as_deref(),
        req.require_stable,
    );
    for ((topic, partition), c, code) in found {
        let p = OffsetFetchResponsePartition::default()
            .with_partition_index(partition)
            .with_committed_offset(c.as_ref().map_or(-1, |c| c.offset))
            .with_committed_leader_epoch(c.as_ref().map_or(-1, |c| c.leader_epoch))
            .with_metadata(Some(s(c.as_ref().map_or("", |c| c.metadata.as_str()))))
            .with_error_code(code);
        match r.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(p),
            None => r.topics.push(
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(s(&topic)))
                    .with_partitions(vec![p]),
            ),
        }
    }
    r
}

pub(super) fn describe_groups(
    shared: &Shared,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let groups = shared.broker.groups();
    let mut r = DescribeGroupsResponse::default();
    r.groups = req
        .groups
        .into_iter()
        .map(|g| {
            let d = groups.describe(g.0.as_str());
            let mut out = kafka_protocol::messages::describe_groups_response::DescribedGroup::default()
                .with_group_id(g)
                .with_group_state(s(d.as_ref().map_or("Dead", |d| d.state.name())))
                .with_protocol_type(s(if d.is_some() { "consumer" } else { "" }))
                .with_protocol_data(s(d.as_ref().and_then(|d| d.protocol.as_deref()).unwrap_or("")));
            out.members = d
                .map(|d| {
                    d.members
                        .into_iter()
                        .map(|(id, client)| {
                            kafka_protocol::messages::describe_groups_response::DescribedGroupMember::default()
                                .with_member_id(s(&id))
                                .with_client_id(s(&client))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out
        })
        .collect();
    r
}

pub(super) fn list_groups(shared: &Shared) -> ListGroupsResponse {
    let groups = shared.broker.groups();
    let mut r = ListGroupsResponse::default();
    r.groups = groups
        .names()
        .into_iter()
        .map(|name| {
            let state = groups.describe(&name).map_or("Dead", |d| d.state.name());
            ListedGroup::default()
                .with_group_id(GroupId(s(&name)))
                .with_protocol_type(s("consumer"))
                .with_group_state(s(state))
                .with_group_type(s("classic"))
        })
        .collect();
    r
}
