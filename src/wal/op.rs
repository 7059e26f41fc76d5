//! The lifecycle records of format version 5: what the log holds besides
//! appends, and how their payloads are laid out.
//!
//! Every decision of the live store that changes state, or that replay
//! would otherwise have to make again, is a record: the clock reading
//! appends without a timestamp take as their activity (kind 6), the keys
//! an expiration or eviction removed (kind 7), an atomic group (kind 8)
//! of key removals and key states (kind 9) for truncation, partition
//! removal and import, and a marker saying the next append was accepted
//! for a key without state at a sequence other than 0 (kind 10). Kinds 11
//! to 15 are kept for more of these, 16 to 31 for transaction records (a
//! later version); this version reads any of them as damage. The bytes
//! are in docs/format.md.

#![deny(clippy::indexing_slicing)]

use super::frame::{AT_KIND, AT_LEN, HEADER};
use crate::batch::AppendRequest;
use crate::codec::{Dec, Put, decode_id, put_id, set_u32};
use crate::engine::info::ProducerInfo;
use crate::error::Corruption;
use crate::id::ProducerId;
use crate::snapshot::entry::{self as entry_codec, MAX_ENTRY};

pub(super) const KIND_CLOCK: u8 = 6;
pub(super) const KIND_REMOVE: u8 = 7;
pub(super) const KIND_GROUP: u8 = 8;
pub(super) const KIND_SET: u8 = 9;
pub(super) const KIND_ACCEPTED_UNKNOWN: u8 = 10;
/// A partition's truncation group (version 6).
pub(super) const KIND_PARTITION_GROUP: u8 = 11;

/// A clock record's length: header and an `i64`.
pub(super) const CLOCK_LEN: usize = HEADER + 8;
/// A group record's length: header, kind, member count, argument.
pub(super) const GROUP_LEN: usize = HEADER + 1 + 4 + 8;
/// A partition group record's length: header, partition, member count,
/// offset.
pub(super) const PARTITION_GROUP_LEN: usize = HEADER + 4 + 4 + 8;
/// Records of removals and key states are cut at this many bytes (one
/// entry longer than that gets a record of its own).
const SOFT_LEN: usize = 1 << 16;
/// The longest record version 5 allows: a set-entries record of one entry
/// with a name of 65,535 bytes and a full window.
pub(crate) const MAX_LEN: usize = HEADER + MAX_ENTRY;

/// Why keys were removed (kind 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoveReason {
    /// No append was accepted for the key for `producer_expiration`.
    Expired,
    /// The table was at `max_producers` and the key was the least recently
    /// active.
    Evicted,
    /// `remove_partition` (inside a group).
    PartitionRemoved,
    /// `truncate_to`: the key's every append was at or above the offset
    /// (inside a group).
    Truncated,
}

impl RemoveReason {
    fn code(self) -> u8 {
        match self {
            RemoveReason::Expired => 1,
            RemoveReason::Evicted => 2,
            RemoveReason::PartitionRemoved => 3,
            RemoveReason::Truncated => 4,
        }
    }

    fn from_code(c: u8) -> Option<RemoveReason> {
        Some(match c {
            1 => RemoveReason::Expired,
            2 => RemoveReason::Evicted,
            3 => RemoveReason::PartitionRemoved,
            4 => RemoveReason::Truncated,
            _ => return None,
        })
    }

    /// Whether such a removal is logged inside an atomic group.
    pub(crate) fn in_group(self) -> bool {
        matches!(
            self,
            RemoveReason::PartitionRemoved | RemoveReason::Truncated
        )
    }

    /// The lowercase name (`expired`, `evicted`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RemoveReason::Expired => "expired",
            RemoveReason::Evicted => "evicted",
            RemoveReason::PartitionRemoved => "partition removed",
            RemoveReason::Truncated => "truncated",
        }
    }
}

display_as_str!(RemoveReason);

/// What an atomic group of records does (kind 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupKind {
    /// `truncate_to(offset)`: the argument is the offset.
    Truncate,
    /// `remove_partition(partition)`: the argument is the partition.
    RemovePartition,
    /// `import_partition`: the argument is the highest batch offset the
    /// imported state holds (-1 for none), the offset truncation undoes the
    /// import at.
    Import,
    /// `truncate_to(partition, offset)`: the argument is the offset; the
    /// group changes only this partition (its own record kind, 11).
    TruncatePartition {
        /// The partition truncated.
        partition: i32,
    },
}

impl GroupKind {
    fn code(self) -> u8 {
        match self {
            GroupKind::Truncate => 1,
            GroupKind::RemovePartition => 2,
            GroupKind::Import => 3,
            // Its own record kind (11) says what it is.
            GroupKind::TruncatePartition { .. } => 4,
        }
    }

    fn from_code(c: u8) -> Option<GroupKind> {
        Some(match c {
            1 => GroupKind::Truncate,
            2 => GroupKind::RemovePartition,
            3 => GroupKind::Import,
            _ => return None,
        })
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Truncate => "truncate",
            GroupKind::RemovePartition => "remove partition",
            GroupKind::Import => "import",
            GroupKind::TruncatePartition { .. } => "truncate partition",
        }
    }
}

display_as_str!(GroupKind);

/// One operation of the log, as a record holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogOp {
    /// An accepted append (kinds 1 to 4).
    Append(AppendRequest),
    /// The store's clock: appends after it that carry no timestamp take
    /// this time as their key's last activity (kind 6). Takes no position.
    Clock(i64),
    /// The next append was accepted for a key without state at a sequence
    /// other than 0 (`UnknownProducer::AcceptAny`): replay accepts it the
    /// same way (kind 10). Takes no position.
    AcceptedUnknown,
    /// Keys removed (kind 7).
    Remove {
        /// Why.
        reason: RemoveReason,
        /// The keys.
        keys: Vec<(ProducerId, i32)>,
    },
    /// The first record of an atomic group: the next `members` records
    /// (removals and key states) apply together or not at all (kind 8).
    Group {
        /// What the group does.
        kind: GroupKind,
        /// Records in the group after this one.
        members: u32,
        /// The offset, partition or highest offset (see [`GroupKind`]).
        arg: i64,
    },
    /// Keys set to these states (kind 9, inside a group).
    Set {
        /// The keys and their states.
        entries: Vec<ProducerInfo>,
    },
    /// An accepted Kafka-mode data batch with its transactional flag
    /// (kinds 16 and 17, in segments of a `Semantics::Kafka` store; plain
    /// batches there use kinds 1 to 4).
    KafkaBatch {
        /// The batch.
        request: AppendRequest,
        /// It belongs to a transaction (opens one, or continues it).
        transactional: bool,
    },
    /// An accepted end-transaction marker (kinds 18 and 19).
    TxnMarker {
        /// The producer.
        producer_id: ProducerId,
        /// The partition.
        partition: i32,
        /// The producer epoch the marker was written at.
        epoch: i16,
        /// The marker.
        marker: crate::engine::kafka::txn::Marker,
    },
    /// The partition's aborted transactions whose marker is below
    /// `offset` were forgotten (kind 20).
    ForgetAborted {
        /// The partition.
        partition: i32,
        /// The offset.
        offset: i64,
    },
    /// Part of a partition's state as a Kafka-mode truncation left it
    /// (kind 21, inside a truncation or import group): with `reset`, the partition's
    /// keys and transactions are dropped first; then the side-table keys
    /// and aborted transactions of `section` (the layout of a snapshot's
    /// Kafka section, after its length) are added. The partition's compact
    /// keys follow as key-state records (kind 9).
    KafkaPartition {
        /// The partition.
        partition: i32,
        /// Drop the partition's state first (its first such record).
        reset: bool,
        /// The Kafka section bytes (validated when decoded).
        section: Vec<u8>,
    },
}

impl LogOp {
    /// Whether the operation takes a log position (appends, removals, key
    /// states and group records do; clock records and markers do not).
    pub fn takes_position(&self) -> bool {
        !matches!(self, LogOp::Clock(_) | LogOp::AcceptedUnknown)
    }
}

/// Starts a record of `kind` at the end of `buf`; returns its start.
pub(super) fn begin(buf: &mut Vec<u8>, kind: u8) -> usize {
    let start = buf.len();
    let mut head = [0u8; HEADER];
    if let Some(k) = head.get_mut(AT_KIND) {
        *k = kind;
    }
    buf.extend_from_slice(&head);
    start
}

/// Sets the length of the record that starts at `start` and ends `buf`.
pub(super) fn end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    set_u32(buf, start + AT_LEN, len);
}

/// Appends a clock record.
pub(crate) fn encode_clock(buf: &mut Vec<u8>, ms: i64) {
    let s = begin(buf, KIND_CLOCK);
    buf.put_i64(ms);
    end(buf, s);
}

/// Appends an accepted-unknown marker.
pub(crate) fn encode_accepted_unknown(buf: &mut Vec<u8>) {
    let s = begin(buf, KIND_ACCEPTED_UNKNOWN);
    end(buf, s);
}

/// Appends a group record (kind 8, or kind 11 for a partition's
/// truncation).
pub(crate) fn encode_group(buf: &mut Vec<u8>, kind: GroupKind, members: u32, arg: i64) {
    if let GroupKind::TruncatePartition { partition } = kind {
        let s = begin(buf, KIND_PARTITION_GROUP);
        buf.put_i32(partition);
        buf.put_u32(members);
        buf.put_i64(arg);
        end(buf, s);
        return;
    }
    let s = begin(buf, KIND_GROUP);
    buf.put_u8(kind.code());
    buf.put_u32(members);
    buf.put_i64(arg);
    end(buf, s);
}

fn put_key(buf: &mut Vec<u8>, id: &ProducerId, partition: i32) {
    if let Some(n) = id.as_numeric() {
        // The bytes `put_id` and `put_i32` write, in one copy: a removal
        // record of an eviction pass lists thousands of numeric keys.
        let mut key = [0u8; 13];
        let (id_bytes, p_bytes) = key.split_at_mut(9);
        id_bytes
            .get_mut(1..)
            .unwrap_or_default()
            .copy_from_slice(&n.to_le_bytes());
        p_bytes.copy_from_slice(&partition.to_le_bytes());
        buf.extend_from_slice(&key);
        return;
    }
    put_id(buf, id);
    buf.put_i32(partition);
}

/// Appends removal records for `keys` (as many as their bytes need, each
/// at most 64 KiB unless one key alone is longer); returns how many keys
/// each record holds. Names fit the format (the store checks them before
/// they get state).
pub(crate) fn encode_removes<'a>(
    buf: &mut Vec<u8>,
    reason: RemoveReason,
    keys: impl IntoIterator<Item = (&'a ProducerId, i32)>,
) -> Vec<usize> {
    let mut records = Vec::new();
    let mut open: Option<usize> = None;
    for (id, p) in keys {
        let key_len = 1 + id.name_bytes().map_or(8, |n| 2 + n.len()) + 4;
        if let Some(s) = open
            && buf.len() - s + key_len > SOFT_LEN
        {
            end(buf, s);
            open = None;
        }
        if open.is_none() {
            let s = begin(buf, KIND_REMOVE);
            buf.put_u8(reason.code());
            open = Some(s);
            records.push(0);
        }
        put_key(buf, id, p);
        if let Some(n) = records.last_mut() {
            *n += 1;
        }
    }
    if let Some(s) = open {
        end(buf, s);
    }
    records
}

/// Appends key-state records for `entries` (cut like [`encode_removes`]);
/// returns how many entries each record holds.
pub(crate) fn encode_sets<'a>(
    buf: &mut Vec<u8>,
    entries: impl IntoIterator<Item = &'a ProducerInfo>,
) -> Vec<usize> {
    let mut records = Vec::new();
    let mut open: Option<usize> = None;
    let mut one = Vec::new();
    for i in entries {
        one.clear();
        entry_codec::encode_entry(
            &mut one,
            &i.producer_id,
            i.partition,
            &i.entry,
            Some(i.last_activity),
        );
        if let Some(s) = open
            && buf.len() - s + one.len() > SOFT_LEN
        {
            end(buf, s);
            open = None;
        }
        if open.is_none() {
            open = Some(begin(buf, KIND_SET));
            records.push(0);
        }
        buf.extend_from_slice(&one);
        if let Some(n) = records.last_mut() {
            *n += 1;
        }
    }
    if let Some(s) = open {
        end(buf, s);
    }
    records
}

/// Whether `len` can be the length of a record of lifecycle `kind`.
pub(super) fn len_ok(kind: u8, len: usize) -> bool {
    match kind {
        KIND_CLOCK => len == CLOCK_LEN,
        KIND_ACCEPTED_UNKNOWN => len == HEADER,
        KIND_GROUP => len == GROUP_LEN,
        KIND_PARTITION_GROUP => len == PARTITION_GROUP_LEN,
        // A reason and at least one numeric key (13 bytes) or named key (7).
        KIND_REMOVE => (HEADER + 1 + 7..=MAX_LEN).contains(&len),
        // At least one entry (21 bytes).
        KIND_SET => (HEADER + 21..=MAX_LEN).contains(&len),
        _ => false,
    }
}

/// Whether `kind` is a lifecycle kind of a segment whose layout has
/// `partition_groups` (version 6) or not (version 5).
pub(super) fn is_kind(kind: u8, partition_groups: bool) -> bool {
    (KIND_CLOCK..=KIND_ACCEPTED_UNKNOWN).contains(&kind)
        || (partition_groups && kind == KIND_PARTITION_GROUP)
}

/// Decodes the payload of a lifecycle record of `kind` (after the header).
pub(super) fn decode_payload(kind: u8, d: &mut Dec<'_>) -> Result<LogOp, Corruption> {
    let short = || Corruption::BadField("lifecycle record (too short)");
    let op = match kind {
        KIND_CLOCK => LogOp::Clock(d.i64().ok_or_else(short)?),
        KIND_ACCEPTED_UNKNOWN => LogOp::AcceptedUnknown,
        KIND_GROUP => {
            let code = d.u8().ok_or_else(short)?;
            let kind = GroupKind::from_code(code).ok_or(Corruption::BadField("group kind"))?;
            let members = d.u32().ok_or_else(short)?;
            let arg = d.i64().ok_or_else(short)?;
            LogOp::Group { kind, members, arg }
        }
        KIND_PARTITION_GROUP => {
            let partition = d.i32().ok_or_else(short)?;
            let members = d.u32().ok_or_else(short)?;
            let arg = d.i64().ok_or_else(short)?;
            LogOp::Group {
                kind: GroupKind::TruncatePartition { partition },
                members,
                arg,
            }
        }
        KIND_REMOVE => {
            let code = d.u8().ok_or_else(short)?;
            let reason =
                RemoveReason::from_code(code).ok_or(Corruption::BadField("removal reason"))?;
            let mut keys = Vec::new();
            while d.remaining() > 0 {
                keys.push(decode_key(d)?);
            }
            if keys.is_empty() {
                return Err(Corruption::BadField("removal of no key"));
            }
            LogOp::Remove { reason, keys }
        }
        KIND_SET => {
            let rest = d.bytes(d.remaining()).unwrap_or_default();
            let entries = entry_codec::decode_infos(rest, |_| Ok(())).map_err(|(_, kind)| kind)?;
            if entries.is_empty() {
                return Err(Corruption::BadField("key-state record of no key"));
            }
            LogOp::Set { entries }
        }
        other => return Err(Corruption::BadKind(other)),
    };
    if d.remaining() != 0 {
        return Err(Corruption::BadLength(d.remaining() as u64));
    }
    Ok(op)
}

fn decode_key(d: &mut Dec<'_>) -> Result<(ProducerId, i32), Corruption> {
    let id = decode_id(d)?;
    let short = || Corruption::BadField("removed key (too short)");
    Ok((id, d.i32().ok_or_else(short)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numeric_key_is_written_as_its_id_then_its_partition() {
        for (n, p) in [
            (0u64, 0i32),
            (7, -1),
            (u64::MAX, i32::MIN),
            (0x0102_0304_0506_0708, 9),
        ] {
            let id = ProducerId::numeric(n);
            let mut fast = Vec::new();
            put_key(&mut fast, &id, p);
            let mut want = Vec::new();
            put_id(&mut want, &id);
            want.put_i32(p);
            assert_eq!(fast, want);
            assert_eq!(fast.len(), 13);
        }
    }
}
