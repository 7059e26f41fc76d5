//! The keys and aborted transactions of a recovered state (a snapshot's,
//! or a directory's dry run), as entry views.

use producer_state::inspect::{self};
use producer_state::{KafkaProducerState, ProducerId};

use crate::filter::{Filter, Show};
use crate::view::*;

pub(crate) fn entries_of(
    state: &inspect::RecoveredState,
    f: &Filter,
    list: bool,
) -> Vec<EntryView> {
    if !list {
        return Vec::new();
    }
    let mut v: Vec<EntryView> = state
        .infos()
        .filter(|i| f.keeps(&i.producer_id, Some(i.partition)))
        .map(
            |i| match state.kafka_state(i.producer_id.clone(), i.partition) {
                // A Kafka-mode key: Kafka's view, every cached batch.
                Some(k) => kafka_state_entry(&i.producer_id, i.partition, &k),
                None => {
                    let mut v = entry_of(&i.producer_id, Some(i.partition), &i.entry);
                    v.last_activity = Some(i.last_activity);
                    v
                }
            },
        )
        .collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

/// A key of a Kafka-mode state, with the fields Kafka's snapshot would
/// hold for it (its newest batch's last offset and delta).
pub(crate) fn kafka_state_entry(
    id: &ProducerId,
    partition: i32,
    k: &KafkaProducerState,
) -> EntryView {
    let (producer_id, producer_id_kind, mut key) = id_view(id);
    key.3 = Some(partition);
    let newest = k.batches.last().and_then(|b| {
        let m = b.metadata?;
        let delta = i64::from(b.last_sequence.wrapping_sub(b.first_sequence)) & 0x7fff_ffff;
        Some((m.offset.wrapping_add(delta), delta as i32))
    });
    EntryView {
        producer_id,
        producer_id_kind,
        partition: Some(partition),
        epoch: k.epoch,
        last_sequence: k.last_sequence,
        last_activity: None,
        retained_batches: k.batches.iter().map(batch_view).collect(),
        kafka: Some(KafkaFields {
            last_offset: newest.map_or(-1, |n| n.0),
            offset_delta: newest.map_or(0, |n| n.1),
            timestamp: k.last_timestamp,
            coordinator_epoch: k.coordinator_epoch,
            current_txn_first_offset: k.current_txn_first_offset.unwrap_or(-1),
        }),
        key,
    }
}

pub(crate) fn aborted_of(
    state: &inspect::RecoveredState,
    f: &Filter,
    list: bool,
) -> Vec<AbortedView> {
    if !list {
        return Vec::new();
    }
    state
        .aborted_transactions()
        .into_iter()
        .filter(|(p, t)| f.keeps(&t.producer_id, Some(*p)))
        .map(|(partition, t)| AbortedView {
            partition,
            producer_id: id_view(&t.producer_id).0,
            first_offset: t.first_offset,
            last_offset: t.last_offset,
            last_stable_offset: t.last_stable_offset,
        })
        .collect()
}

/// A Kafka-mode state's late (hanging) transactions at `--now`.
pub(crate) fn late_of(state: &inspect::RecoveredState, show: &Show<'_>) -> Vec<LateView> {
    if !show.list {
        return Vec::new();
    }
    state
        .late_transactions(show.now_ms, show.max_transaction_timeout_ms)
        .into_iter()
        .filter(|t| show.filter.keeps(&t.producer_id, Some(t.partition)))
        .map(|t| LateView {
            partition: t.partition,
            producer_id: id_view(&t.producer_id).0,
            first_offset: t.first_offset,
            last_timestamp: t.last_timestamp,
            idle_ms: show.now_ms.saturating_sub(t.last_timestamp),
        })
        .collect()
}
