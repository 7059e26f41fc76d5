//! An Apache Kafka producer snapshot file: verified, its entries.

use std::path::Path;

use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{self};
use producer_state::kafka::{self, KafkaProducerEntry};

use crate::filter::Show;
use crate::progress::Progress;
use crate::view::*;

pub(crate) fn kafka_entry(k: &KafkaProducerEntry, partition: Option<i32>) -> EntryView {
    // The batch as this crate reads it (none if it cannot be represented).
    let first = kafka::to_entry(k)
        .ok()
        .and_then(|(_, e)| e.retained_batches().next());
    EntryView {
        // Kafka's id is an i64 and shown as it is, negative ones included
        // (-1 is Kafka's "no producer"; seeding a store skips those).
        producer_id: k.producer_id.to_string(),
        producer_id_kind: "numeric",
        partition,
        epoch: k.epoch,
        last_sequence: k.last_sequence,
        last_activity: None,
        retained_batches: first.map(|b| batch_view(&b)).into_iter().collect(),
        kafka: Some(KafkaFields {
            last_offset: k.last_offset,
            offset_delta: k.offset_delta,
            timestamp: k.timestamp,
            coordinator_epoch: k.coordinator_epoch,
            current_txn_first_offset: k.current_txn_first_offset,
        }),
        key: (false, i128::from(k.producer_id), String::new(), partition),
    }
}

/// Kafka keeps a partition's files in `<topic>-<partition>`.
pub(crate) fn kafka_partition(path: &Path) -> Option<i32> {
    let dir = path.parent()?.file_name()?.to_str()?;
    dir.rsplit_once('-')?.1.parse().ok()
}

pub(crate) fn inspect(path: &Path, out: &mut Output, show: &Show<'_>) -> Result<(), Unreadable> {
    let (f, list) = (show.filter, show.list);
    *out = Output::new(path, "kafka_snapshot", "Apache Kafka producer snapshot");
    out.version = Some(1);
    out.position = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(kafka::parse_file_name);
    let partition = kafka_partition(path);
    let mut p = Progress::new("verifying Kafka snapshot: entries");
    let result = inspect::kafka_snapshot(&ReadOnlyFs(StdFs), path, &mut |n| p.tick(n));
    settle(out, result, |out, entries| {
        out.entry_count = Some(entries.len() as u64);
        if list {
            out.entries = entries
                .iter()
                .filter(|k| f.keeps_kafka(k.producer_id, partition))
                .map(|k| kafka_entry(k, partition))
                .collect();
            out.entries.sort_by(|a, b| a.key.cmp(&b.key));
            out.limit_entries(show.limit);
        }
    })
}
