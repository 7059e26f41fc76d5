//! A log segment: scanned record by record, each operation shown as one
//! record view per key it concerns, and how the segment ends.

use std::path::Path;

use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{self, GroupKind, LogOp, RemoveReason, SegmentEnd, Verdict};
use producer_state::{AppendRequest, MarkerKind};

use crate::filter::{Filter, Show};
use crate::progress::Progress;
use crate::view::*;

pub(crate) fn request_record(position: u64, at: u64, r: &AppendRequest) -> RecordView {
    RecordView {
        position,
        byte_offset: at,
        op: "append",
        producer_id: Some(id_view(&r.producer_id).0),
        partition: Some(r.partition),
        epoch: Some(r.epoch),
        first_sequence: Some(r.first_sequence()),
        last_sequence: Some(r.last_sequence()),
        offset: r.metadata().map(|m| m.offset),
        timestamp: r.metadata().map(|m| m.timestamp),
        detail: None,
    }
}

/// A record that concerns no one key.
pub(crate) fn store_record(position: u64, at: u64, op: &'static str, detail: String) -> RecordView {
    RecordView {
        position,
        byte_offset: at,
        op,
        producer_id: None,
        partition: None,
        epoch: None,
        first_sequence: None,
        last_sequence: None,
        offset: None,
        timestamp: None,
        detail: Some(detail),
    }
}

/// The records of one log operation that `f` keeps: one per key it
/// concerns (removals, key states), or one for the record.
pub(crate) fn op_records(
    position: u64,
    at: u64,
    op: &LogOp,
    f: &Filter,
    out: &mut Vec<RecordView>,
) {
    let unfiltered = f.producer.is_none() && f.partition.is_none();
    match op {
        LogOp::Append(r) if f.keeps(&r.producer_id, Some(r.partition)) => {
            out.push(request_record(position, at, r));
        }
        LogOp::Clock(ms) if unfiltered => {
            let t = utc(*ms).unwrap_or_else(|| ms.to_string());
            out.push(store_record(position, at, "clock", format!("{ms} ({t})")));
        }
        LogOp::AcceptedUnknown if unfiltered => {
            let d = "the next append was accepted for a producer without state".to_string();
            out.push(store_record(position, at, "accepted-unknown", d));
        }
        LogOp::Group { kind, members, arg } if unfiltered => {
            let what = match kind {
                GroupKind::Truncate => format!("truncate to offset {arg}"),
                GroupKind::RemovePartition => format!("remove partition {arg}"),
                GroupKind::Import => format!("import (highest offset {arg})"),
                _ => format!("{kind} {arg}"),
            };
            let d = format!("{what}: the next {members} record(s), all or none");
            out.push(store_record(position, at, "group", d));
        }
        LogOp::Remove { reason, keys } => {
            let op = match reason {
                RemoveReason::Expired => "expired",
                RemoveReason::Evicted => "evicted",
                RemoveReason::PartitionRemoved => "partition-removed",
                _ => "truncated",
            };
            for (id, p) in keys.iter().filter(|(id, p)| f.keeps(id, Some(*p))) {
                let mut v = store_record(position, at, op, String::new());
                v.producer_id = Some(id_view(id).0);
                v.partition = Some(*p);
                v.detail = None;
                out.push(v);
            }
        }
        LogOp::Set { entries } => {
            for i in entries
                .iter()
                .filter(|i| f.keeps(&i.producer_id, Some(i.partition)))
            {
                let newest = i.newest_batch();
                out.push(RecordView {
                    position,
                    byte_offset: at,
                    op: "key-state",
                    producer_id: Some(id_view(&i.producer_id).0),
                    partition: Some(i.partition),
                    epoch: Some(i.epoch()),
                    first_sequence: newest.map(|b| b.first_sequence),
                    last_sequence: Some(i.last_sequence()),
                    offset: newest.and_then(|b| b.metadata).map(|m| m.offset),
                    timestamp: Some(i.last_activity),
                    detail: Some(format!("{} retained batch(es)", i.retained_batches().len())),
                });
            }
        }
        _ => kafka_op_records(position, at, op, f, out),
    }
}

/// The records of a Kafka-mode operation (kinds 16 to 21) that `f` keeps.
fn kafka_op_records(position: u64, at: u64, op: &LogOp, f: &Filter, out: &mut Vec<RecordView>) {
    let unfiltered = f.producer.is_none() && f.partition.is_none();
    match op {
        LogOp::KafkaBatch {
            request,
            transactional,
        } if f.keeps(&request.producer_id, Some(request.partition)) => {
            let mut v = request_record(position, at, request);
            v.op = "kafka-batch";
            v.detail = transactional.then(|| "transactional".to_string());
            out.push(v);
        }
        LogOp::TxnMarker {
            producer_id,
            partition,
            epoch,
            marker,
        } if f.keeps(producer_id, Some(*partition)) => {
            let kind = match marker.kind {
                MarkerKind::Commit => "commit",
                _ => "abort",
            };
            let d = format!("{kind}, coordinator epoch {}", marker.coordinator_epoch);
            let mut v = store_record(position, at, "txn-marker", d);
            v.producer_id = Some(id_view(producer_id).0);
            v.partition = Some(*partition);
            v.epoch = Some(*epoch);
            v.offset = Some(marker.offset);
            v.timestamp = Some(marker.timestamp);
            out.push(v);
        }
        LogOp::KafkaPartition {
            partition,
            reset,
            section,
        } => partition_records(position, at, (*partition, *reset, section), f, out),
        LogOp::ForgetAborted { partition, offset } if unfiltered => {
            let d = format!("aborted transactions below offset {offset} forgotten");
            let mut v = store_record(position, at, "forget-aborted", d);
            v.partition = Some(*partition);
            out.push(v);
        }
        _ => {}
    }
}

/// A partition-state record (kind 21, a Kafka-mode truncation's or
/// import's member): one `partition-state` record saying what it does to
/// the partition, then one `kafka-key-state` per side-table key and one
/// `aborted-txn` per aborted transaction it carries.
pub(crate) fn partition_records(
    position: u64,
    at: u64,
    (partition, reset, section): (i32, bool, &[u8]),
    f: &Filter,
    out: &mut Vec<RecordView>,
) {
    let decoded = inspect::partition_section(partition, section);
    if f.producer.is_none() && f.keeps_partition(Some(partition)) {
        let what = match &decoded {
            Ok(s) => format!(
                "{}{} side-table key(s), {} aborted transaction(s)",
                if reset {
                    "the partition's keys and transactions dropped, then "
                } else {
                    ""
                },
                s.keys.len(),
                s.aborted.len()
            ),
            Err(e) => format!("undecodable section: {e}"),
        };
        let mut v = store_record(position, at, "partition-state", what);
        v.partition = Some(partition);
        out.push(v);
    }
    let Ok(s) = decoded else { return };
    for (id, k) in s.keys.iter().filter(|(id, _)| f.keeps(id, Some(partition))) {
        let newest = k.batches.last();
        let txn = k.current_txn_first_offset.map_or_else(
            || "no open transaction".to_string(),
            |o| format!("open transaction from offset {o}"),
        );
        out.push(RecordView {
            position,
            byte_offset: at,
            op: "kafka-key-state",
            producer_id: Some(id_view(id).0),
            partition: Some(partition),
            epoch: Some(k.epoch),
            first_sequence: newest.map(|b| b.first_sequence),
            last_sequence: Some(k.last_sequence),
            offset: newest.and_then(|b| b.metadata).map(|m| m.offset),
            timestamp: Some(k.last_timestamp),
            detail: Some(format!(
                "coordinator epoch {}, {txn}, {} cached batch(es)",
                k.coordinator_epoch,
                k.batches.len()
            )),
        });
    }
    for t in s
        .aborted
        .iter()
        .filter(|t| f.keeps(&t.producer_id, Some(partition)))
    {
        let d = format!(
            "aborted offsets {}..={}, last stable offset {}",
            t.first_offset, t.last_offset, t.last_stable_offset
        );
        let mut v = store_record(position, at, "aborted-txn", d);
        v.producer_id = Some(id_view(&t.producer_id).0);
        v.partition = Some(partition);
        v.offset = Some(t.first_offset);
        out.push(v);
    }
}

pub(crate) fn inspect(path: &Path, out: &mut Output, show: &Show<'_>) -> Result<(), Unreadable> {
    let (f, list) = (show.filter, show.list);
    *out = Output::new(path, "segment", "producer-state log segment");
    let mut p = Progress::new("scanning segment: byte");
    // `--limit`: the first records are kept, the rest only counted (a
    // 64 MiB segment's records would take hundreds of MB).
    let limit = show.limit.unwrap_or(usize::MAX);
    let (mut records, mut lines, mut total) = (Vec::new(), Vec::new(), 0u64);
    let result = inspect::segment(
        &ReadOnlyFs(StdFs),
        path,
        |pos, at, op| {
            if list {
                op_records(pos, at, op, f, &mut lines);
                total += lines.len() as u64;
                let room = limit.saturating_sub(records.len());
                records.extend(lines.drain(..).take(room));
            }
        },
        &mut |b| p.tick(b),
    );
    settle(out, result, |out, s| {
        out.position = Some(s.first_position);
        out.version = Some(s.version);
        out.semantics = Some(semantics_name(s.semantics));
        out.entry_count = Some(s.records);
        out.bytes = Some(s.bytes);
        out.used_bytes = Some(s.bytes.saturating_sub(s.preallocated_bytes));
        out.preallocated_bytes = Some(s.preallocated_bytes);
        let (offset, kind) = match &s.end {
            SegmentEnd::TornTail { offset, kind } => (
                *offset,
                format!("torn tail ({kind}); recovery cuts it if this is the last segment"),
            ),
            SegmentEnd::Damaged {
                offset,
                kind,
                later_write,
            } => (
                *offset,
                format!(
                    "{kind}; a valid record written after it was durable follows at byte {later_write}"
                ),
            ),
            _ => (0, String::new()),
        };
        if s.end.verdict() != Verdict::Ok {
            out.damage.push(Damage {
                file: path.display().to_string(),
                offset: Some(offset),
                kind,
                severity: s.end.verdict(),
            });
        }
        if total > records.len() as u64 {
            out.records_total = Some(total);
        }
        out.records = records;
    })
}
