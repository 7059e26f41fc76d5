//! Metadata: the broker, the topics asked for, and their creation.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::NODE_ID;
use crate::Broker;

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub(super) async fn metadata(
    broker: &Arc<Broker>,
    req: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let b = broker.clone();
    let topics = tokio::task::spawn_blocking(move || {
        let wanted: Option<Vec<String>> = match req.topics {
            Some(t) if !(version == 0 && t.is_empty()) => {
                // Each name once, in the order first asked (as Kafka's
                // set of names does): a request naming one topic a
                // million times gets one answer for it.
                let mut seen = std::collections::HashSet::new();
                Some(
                    t.into_iter()
                        .filter_map(|t| t.name.map(|n| n.0.to_string()))
                        .filter(|n| seen.insert(n.clone()))
                        .collect(),
                )
            }
            _ => None,
        };
        let create =
            (version < 4 || req.allow_auto_topic_creation) && b.config().limits.auto_create_topics;
        match wanted {
            None => b
                .topics()
                .into_iter()
                .map(|(n, t)| (n, Ok(t)))
                .collect::<Vec<_>>(),
            Some(names) => names
                .into_iter()
                .map(|n| {
                    let t = if !crate::valid_topic_name(&n) {
                        Err(ResponseError::InvalidTopicException.code())
                    } else if create {
                        b.topic_or_create(&n).map_err(|e| match e {
                            crate::Error::TooManyPartitions { .. } => {
                                tracing::warn!(topic = %n, error = %e, "not creating a topic");
                                ResponseError::PolicyViolation.code()
                            }
                            e => {
                                tracing::error!(topic = %n, error = %e, "creating a topic failed");
                                ResponseError::KafkaStorageError.code()
                            }
                        })
                    } else {
                        b.topic(&n)
                            .ok_or(ResponseError::UnknownTopicOrPartition.code())
                    };
                    (n, t)
                })
                .collect(),
        }
    })
    .await
    .unwrap_or_default();
    let cfg = broker.config();
    let mut r = MetadataResponse::default();
    r.brokers = vec![
        MetadataResponseBroker::default()
            .with_node_id(BrokerId(NODE_ID))
            .with_host(str_bytes(&cfg.advertised_host))
            .with_port(cfg.advertised_port),
    ];
    r.cluster_id = Some(StrBytes::from_static_str("producer-state-broker"));
    r.controller_id = BrokerId(NODE_ID);
    r.topics = topics
        .into_iter()
        .map(|(name, t)| {
            let mut topic =
                MetadataResponseTopic::default().with_name(Some(TopicName(str_bytes(&name))));
            match t {
                Ok(t) => {
                    topic.partitions = (0..t.partitions.len() as i32)
                        .map(|i| {
                            MetadataResponsePartition::default()
                                .with_partition_index(i)
                                .with_leader_id(BrokerId(NODE_ID))
                                .with_leader_epoch(-1)
                                .with_replica_nodes(vec![BrokerId(NODE_ID)])
                                .with_isr_nodes(vec![BrokerId(NODE_ID)])
                        })
                        .collect();
                }
                Err(code) => topic.error_code = code,
            }
            topic
        })
        .collect();
    r
}
