//! The Kafka section of a snapshot: what a [`Semantics::Kafka`] state
//! holds beyond the compact map's entries.
//!
//! A Kafka-mode state is the compact map (plain producers, written as the
//! ordinary entries of the snapshot, byte for byte as under the strict rules)
//! plus the side table of keys the map cannot hold and the per-partition
//! lists of aborted transactions. This section carries the last two, after
//! the store section and before the entries, in snapshots whose header has
//! flag bit 0 set ([`crate::snapshot`]); a snapshot with the bit clear has
//! no such section and is exactly what it was before Kafka mode existed.
//! Open transactions and the last stable offset are not stored: they are
//! the side-table keys' open transactions, rebuilt as they are read.
//!
//! A section of its own, rather than a new entry shape among the compact
//! entries, keeps the compact entries' encoding (which changed in snapshot
//! version 4) independent of this one. The bytes are in docs/format.md ("Kafka
//! section").
//!
//! [`Semantics::Kafka`]: crate::Semantics::Kafka

#![deny(clippy::indexing_slicing)]

use std::collections::VecDeque;

use crate::batch::{BatchMetadata, RetainedBatch};
use crate::codec::{Dec, Put};
use crate::codec::{decode_id as get_id, put_id};
use crate::engine::entry::RETAINED_BATCHES;
use crate::engine::kafka::side::FullEntry;
use crate::engine::kafka::state::KafkaState;
use crate::engine::kafka::txn::AbortedTxn;
use crate::error::Corruption;

/// Appends the Kafka section of `k`: its length (`u64`, the bytes after
/// it), the side-table keys, then the aborted lists. Side-table keys are
/// written sorted (by partition, then id) and partitions in ascending
/// order, so a state writes the same bytes however its tables were filled.
pub(crate) fn encode(buf: &mut Vec<u8>, k: &KafkaState) {
    let start = buf.len();
    buf.put_u64(0);
    let mut side: Vec<_> = k.side().collect();
    side.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
    buf.put_u32(side.len() as u32);
    for (id, partition, e) in side {
        put_id(buf, id);
        buf.put_i32(partition);
        buf.put_i16(e.epoch);
        buf.put_i32(e.last_sequence);
        buf.put_i64(e.last_timestamp);
        buf.put_i32(e.coordinator_epoch);
        buf.put_u8(u8::from(e.txn_first_offset.is_some()));
        buf.put_i64(e.txn_first_offset.unwrap_or(-1));
        buf.put_u8(e.batches.len() as u8);
        for b in &e.batches {
            buf.put_i32(b.first_sequence);
            buf.put_i32(b.last_sequence);
            buf.put_u8(u8::from(b.metadata.is_some()));
            let m = b.metadata.unwrap_or(BatchMetadata {
                offset: 0,
                timestamp: 0,
            });
            buf.put_i64(m.offset);
            buf.put_i64(m.timestamp);
        }
    }
    let mut lists: Vec<_> = k.txns().aborted_lists().collect();
    lists.sort_by_key(|(p, _)| *p);
    buf.put_u32(lists.len() as u32);
    for (partition, list) in lists {
        buf.put_i32(partition);
        buf.put_u32(list.len() as u32);
        for t in list {
            put_id(buf, &t.producer_id);
            buf.put_i64(t.first_offset);
            buf.put_i64(t.last_offset);
            buf.put_i64(t.last_stable_offset);
        }
    }
    let len = (buf.len() - start - 8) as u64;
    if let Some(head) = buf.get_mut(start..start + 8) {
        head.copy_from_slice(&len.to_le_bytes());
    }
}

/// A Kafka section without its length field (what a partition-state
/// log record carries).
pub(crate) fn encode_body(k: &KafkaState) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(&mut buf, k);
    buf.split_off(8)
}

/// Decodes a Kafka section body into a state of its own.
pub(crate) fn decode_state(bytes: &[u8]) -> Result<KafkaState, (usize, Corruption)> {
    let mut k = KafkaState::default();
    decode(bytes, &mut k)?;
    Ok(k)
}

fn flag(d: &mut Dec<'_>, what: &'static str) -> Result<bool, Corruption> {
    match d.u8() {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        Some(_) => Err(Corruption::BadField(what)),
        None => Err(Corruption::BadField("Kafka section (too short)")),
    }
}

/// Decodes a Kafka section (after its length field: exactly `bytes`) into
/// `k`, which must be empty. A key listed twice is
/// [`Corruption::DuplicateKey`]; the error's second field is the offset in
/// `bytes` where decoding failed.
pub(crate) fn decode(bytes: &[u8], k: &mut KafkaState) -> Result<(), (usize, Corruption)> {
    let mut d = Dec::new(bytes);
    decode_from(&mut d, k).map_err(|kind| (d.pos(), kind))
}

fn decode_from(d: &mut Dec<'_>, k: &mut KafkaState) -> Result<(), Corruption> {
    let short = || Corruption::BadField("Kafka section (too short)");
    let keys = d.u32().ok_or_else(short)?;
    for _ in 0..keys {
        let id = get_id(d)?;
        let partition = d.i32().ok_or_else(short)?;
        let epoch = d.i16().ok_or_else(short)?;
        let last_sequence = d.i32().ok_or_else(short)?;
        let last_timestamp = d.i64().ok_or_else(short)?;
        let coordinator_epoch = d.i32().ok_or_else(short)?;
        let has_txn = flag(d, "open-transaction flag")?;
        let txn = d.i64().ok_or_else(short)?;
        if !has_txn && txn != -1 {
            return Err(Corruption::BadField("open-transaction offset"));
        }
        let n = d.u8().ok_or_else(short)? as usize;
        if n > RETAINED_BATCHES {
            return Err(Corruption::BadField("cached batch count"));
        }
        let mut batches = VecDeque::with_capacity(n);
        for _ in 0..n {
            let first_sequence = d.i32().ok_or_else(short)?;
            let last_sequence = d.i32().ok_or_else(short)?;
            let has_meta = flag(d, "batch metadata flag")?;
            let offset = d.i64().ok_or_else(short)?;
            let timestamp = d.i64().ok_or_else(short)?;
            if !has_meta && (offset, timestamp) != (0, 0) {
                return Err(Corruption::BadField("batch without metadata"));
            }
            batches.push_back(RetainedBatch {
                first_sequence,
                last_sequence,
                metadata: has_meta.then_some(BatchMetadata { offset, timestamp }),
            });
        }
        let e = FullEntry {
            epoch,
            last_sequence,
            last_timestamp,
            coordinator_epoch,
            txn_first_offset: has_txn.then_some(txn),
            batches,
        };
        if !k.insert_side(id, partition, e) {
            return Err(Corruption::DuplicateKey);
        }
    }
    let partitions = d.u32().ok_or_else(short)?;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..partitions {
        let partition = d.i32().ok_or_else(short)?;
        if !seen.insert(partition) {
            return Err(Corruption::DuplicateKey);
        }
        let n = d.u32().ok_or_else(short)?;
        // Each aborted transaction takes at least 27 bytes: bound the
        // allocation by what is there.
        let mut list = Vec::with_capacity((n as usize).min(d.remaining() / 27));
        for _ in 0..n {
            let producer_id = get_id(d)?;
            list.push(AbortedTxn {
                producer_id,
                first_offset: d.i64().ok_or_else(short)?,
                last_offset: d.i64().ok_or_else(short)?,
                last_stable_offset: d.i64().ok_or_else(short)?,
            });
        }
        if list.is_empty() {
            return Err(Corruption::BadField("aborted list of no transaction"));
        }
        k.txns_mut().set_aborted(partition, list);
    }
    if d.remaining() != 0 {
        return Err(Corruption::TrailingBytes(d.remaining() as u64));
    }
    Ok(())
}
