//! DescribeProducers (KIP-664): the producers each partition's state holds,
//! as Kafka's `kafka-transactions.sh describe-producers` shows them, read
//! from the shared producer state ([`crate::partition`]).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use crate::Broker;

/// Answers every partition asked for: its producers (id, epoch, last
/// sequence, last timestamp, coordinator epoch, the first offset of its
/// open transaction or -1), or UNKNOWN_TOPIC_OR_PARTITION. A topic is not
/// created by being described.
pub(super) fn describe_producers(
    broker: &Arc<Broker>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.topic(&t.name.0);
            let partitions = t
                .partition_indexes
                .into_iter()
                .map(|index| {
                    let p = topic.as_ref().and_then(|topic| {
                        usize::try_from(index)
                            .ok()
                            .and_then(|i| topic.partitions.get(i))
                    });
                    let Some(p) = p else {
                        return PartitionResponse::default()
                            .with_partition_index(index)
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(Some(StrBytes::from_static_str(
                                "This server does not host this topic-partition.",
                            )));
                    };
                    let active = p
                        .producers()
                        .into_iter()
                        .map(|(pid, st)| {
                            ProducerState::default()
                                .with_producer_id(pid.into())
                                .with_producer_epoch(i32::from(st.epoch))
                                .with_last_sequence(st.last_sequence)
                                .with_last_timestamp(st.last_timestamp)
                                .with_coordinator_epoch(st.coordinator_epoch)
                                .with_current_txn_start_offset(
                                    st.current_txn_first_offset.unwrap_or(-1),
                                )
                        })
                        .collect();
                    PartitionResponse::default()
                        .with_partition_index(index)
                        .with_active_producers(active)
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
