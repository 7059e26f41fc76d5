//! Replaying the log's operations: what each record does to the keys, and
//! to the store-level state beside them, in log order.
//!
//! Recovery and truncation both read the log through this one function
//! of records to effects, so they cannot disagree about what a record
//! means. What is per key (an append, a removal, a key set to a state)
//! becomes a [`Rec`] for a sink, which may apply it on another thread;
//! what is not (the log clock single-sequence appends take as their
//! activity, the marker that lets the next append through rule 1 at any
//! sequence, the removed-key filter, the highest offset, atomic groups) is
//! decided here, in log order, and never by reading a clock: the records
//! say everything.
//!
//! Truncation replays with a target offset X: it passes over every append
//! at or above X (a single-sequence append's offset is its position), over
//! every earlier truncation group whose own offset is at or above X (its
//! key states could hold appends at or above X; without them the state is
//! already what it computed), and over every import whose highest offset
//! is at or above X (truncation undoes an import whole). Removals
//! (expiration, eviction, a removed partition) apply as logged. Its sink
//! drops appends that no longer apply (a key whose earlier append was
//! passed over). docs/lifecycle.md states the rule.

use crate::batch::AppendRequest;
use crate::engine::map::{Activity, Apply, hash_key};
use crate::engine::rules::UnknownProducer;
use crate::error::{Error, Result};
use crate::recovery::apply::{KeyOp, Rec};
use crate::recovery::reach::{self, Reach};
use crate::semantics::Semantics;
use crate::snapshot::meta::Meta;
use crate::wal::op::{GroupKind, LogOp, RemoveReason};

/// The offset truncation compares an append with: its batch's offset, or
/// for a single-sequence append (which has none) its log position.
#[inline]
pub(crate) fn append_offset(r: &crate::batch::AppendRequest, pos: u64) -> i64 {
    r.metadata.map_or(pos as i64, |m| m.offset)
}

/// Applies one record of a `Semantics::Kafka` log to its engine, in log
/// order, without classifying it: the log holds only accepted operations,
/// and applying each exactly as it was applied live gives the live state
/// (open transactions, coordinator epochs, aborted lists, where each key
/// lives). `high` follows the highest batch or marker offset.
fn kafka_op(meta: &mut Meta, op: &LogOp, only: Option<i32>) -> Result<()> {
    let Some(k) = meta.kafka.as_deref_mut() else {
        return Ok(());
    };
    if op_partition(op).is_some_and(|p| only.is_some_and(|o| o != p)) {
        return Ok(());
    }
    let mine = |p: i32| only.is_none_or(|o| o == p);
    let (high, ends) = (&mut meta.high, &mut meta.ends);
    match op {
        // A Kafka-mode store writes neither; harmless if present.
        LogOp::Clock(_) | LogOp::AcceptedUnknown => {}
        LogOp::Append(r) => {
            if let Some(m) = r.metadata {
                *high = (*high).max(m.offset);
                ends.note(r.partition, m.offset);
            }
            k.apply_kafka_batch(r, false);
        }
        LogOp::KafkaBatch {
            request,
            transactional,
        } => {
            if let Some(m) = request.metadata {
                *high = (*high).max(m.offset);
                ends.note(request.partition, m.offset);
            }
            k.apply_kafka_batch(request, *transactional);
        }
        LogOp::TxnMarker {
            producer_id,
            partition,
            epoch,
            marker,
        } => {
            *high = (*high).max(marker.offset);
            ends.note(*partition, marker.offset);
            k.apply_kafka_marker(producer_id, *partition, *epoch, marker);
        }
        LogOp::ForgetAborted { partition, offset } => k.forget_aborted_before(*partition, *offset),
        // An expiration (or eviction) removes exactly the logged keys and
        // remembers them in the filter, as in strict mode; a partition
        // removal's members name keys its group record already dropped.
        LogOp::Remove { reason, keys } => {
            let remember = matches!(reason, RemoveReason::Expired | RemoveReason::Evicted);
            for (id, p) in keys.iter().filter(|(_, p)| mine(*p)) {
                k.remove_kafka_key(id, *p);
                if remember {
                    meta.filter.insert(hash_key(id, *p));
                }
            }
        }
        // Handed over only once every member is read (the segment scan):
        // the partition goes whole at its group record.
        LogOp::Group {
            kind: GroupKind::RemovePartition,
            arg,
            ..
        } => {
            if let Ok(p) = i32::try_from(*arg)
                && mine(p)
            {
                k.remove_partition(p);
            }
        }
        // A truncation's or an import's group record: its members set the
        // partitions it changed (an import's one partition, which had no
        // state); the highest offset follows at its end (`finish`).
        LogOp::Group {
            kind: GroupKind::Truncate | GroupKind::Import | GroupKind::TruncatePartition { .. },
            ..
        } => {}
        LogOp::KafkaPartition {
            partition,
            reset,
            section,
        } => {
            // The record was checked when it was read (a valid section of
            // this partition only).
            if !mine(*partition) {
                return Ok(());
            }
            let add = crate::snapshot::kafka::decode_state(section).map_err(|_| {
                Error::Internal("a partition-state record that decoded once does not")
            })?;
            k.absorb_kafka_partition(*partition, *reset, add)?;
        }
        LogOp::Set { entries } => {
            for e in entries.iter().filter(|e| mine(e.partition)) {
                k.set_kafka_compact(&e.producer_id, e.partition, &e.entry);
            }
        }
    }
    Ok(())
}

/// The one partition an operation is about, if it is about one: an
/// append, a marker, forgetting aborted transactions. (Removals, key
/// states and partition states are filtered key by key.)
fn op_partition(op: &LogOp) -> Option<i32> {
    match op {
        LogOp::Append(r) => Some(r.partition),
        LogOp::KafkaBatch { request, .. } => Some(request.partition),
        LogOp::TxnMarker { partition, .. } | LogOp::ForgetAborted { partition, .. } => {
            Some(*partition)
        }
        _ => None,
    }
}

/// The partition a group member's keys belong to (an import's members are
/// all of its one partition).
fn member_partition(op: &LogOp) -> Option<i32> {
    match op {
        LogOp::Remove { keys, .. } => keys.first().map(|(_, p)| *p),
        LogOp::Set { entries } => entries.first().map(|e| e.partition),
        LogOp::KafkaPartition { partition, .. } => Some(*partition),
        _ => None,
    }
}

/// Applies one operation of a Kafka-mode log to `meta` as replay does:
/// the live store runs a truncation's members through it, so the live
/// state is what recovery will rebuild.
pub(crate) fn apply_kafka(meta: &mut Meta, op: &LogOp) -> Result<()> {
    kafka_op(meta, op, None)
}

/// The offset truncation compares a Kafka-mode operation with: a batch's
/// or marker's offset (a single-sequence append's position); `None` for
/// what is not cut by offset.
fn kafka_offset(op: &LogOp, pos: u64) -> Option<i64> {
    match op {
        LogOp::Append(r) => Some(append_offset(r, pos)),
        LogOp::KafkaBatch { request, .. } => Some(append_offset(request, pos)),
        LogOp::TxnMarker { marker, .. } => Some(marker.offset),
        _ => None,
    }
}

/// The state of a replay between records.
pub(crate) struct Replayer {
    /// The store-level state, as of the last record handled.
    pub meta: Meta,
    /// The next append was accepted for a key without state at any
    /// sequence (a marker was read).
    accept_any_next: bool,
    /// Truncation's target: appends at or above it are passed over.
    skip_from: Option<i64>,
    /// A partition's truncation: only this partition's state is rebuilt,
    /// every operation on another is passed over.
    only: Option<i32>,
    /// The partition of the current group's members (an import's).
    group_partition: Option<i32>,
    /// Member records of the current group still to pass over.
    skipping: u32,
    /// The current group being applied: its kind, argument and members to
    /// come.
    group: Option<(GroupKind, i64, u32)>,
    /// Operations taking a position that were handled.
    pub positions: u64,
    /// What a partition's truncation must read, learnt from the records
    /// replayed (recovery's replay only).
    pub reach: Option<Reach>,
}

impl Replayer {
    /// A replay from a base whose store-level state is `meta`; with
    /// `skip_from`, truncation's replay (see the module docs).
    pub(crate) fn new(meta: Meta, skip_from: Option<i64>) -> Replayer {
        Replayer {
            meta,
            accept_any_next: false,
            skip_from,
            only: None,
            group_partition: None,
            skipping: 0,
            group: None,
            positions: 0,
            reach: None,
        }
    }

    /// The same replayer, learning from position `from` on what a
    /// partition's truncation must read ([`Reach`]).
    pub(crate) fn tracking(self, from: u64) -> Replayer {
        Replayer {
            reach: Some(Reach::new(from)),
            ..self
        }
    }

    /// A partition's truncation replay: as [`Replayer::new`] with
    /// `skip_from`, for `partition` alone.
    pub(crate) fn for_partition(meta: Meta, skip_from: i64, partition: i32) -> Replayer {
        Replayer {
            only: Some(partition),
            ..Replayer::new(meta, Some(skip_from))
        }
    }

    /// Whether a group of `kind` and `arg` is passed over whole: a
    /// truncation or import that reaches the target offset, or a
    /// partition's truncation of another partition than the one rebuilt.
    fn undone(&self, kind: GroupKind, arg: i64) -> bool {
        let reaches = self.skip_from.is_some_and(|x| arg >= x);
        match kind {
            GroupKind::Truncate | GroupKind::Import => reaches,
            GroupKind::TruncatePartition { partition } => {
                reaches || self.only.is_some_and(|o| o != partition)
            }
            GroupKind::RemovePartition => false,
        }
    }

    /// The partition a partition's truncation rebuilds (`None`: all).
    pub(crate) fn only(&self) -> Option<i32> {
        self.only
    }

    /// Whether a key of `partition` is rebuilt.
    fn mine(&self, partition: i32) -> bool {
        self.only.is_none_or(|o| o == partition)
    }

    /// Handles the operation at position `pos` (its record at offset `at`,
    /// `nth` in it), handing what it does to keys to `push`.
    pub(crate) fn op(
        &mut self,
        pos: u64,
        at: u64,
        nth: u32,
        op: &LogOp,
        mut push: impl FnMut(Rec) -> Result<()>,
    ) -> Result<()> {
        self.positions += u64::from(op.takes_position());
        if let Some(reach) = &mut self.reach {
            if op.takes_position() {
                let one = op_partition(op).zip(kafka_offset(op, pos));
                let placed = !matches!(op, LogOp::Append(r) if !reach::placed(r));
                reach.note((pos, at, nth), op, one, placed);
            } else {
                reach.quiet_read(pos, at);
            }
        }
        if self.meta.kafka.is_some() {
            return self.kafka(pos, op);
        }
        let rec = |op: KeyOp| {
            let (id, p) = match &op {
                KeyOp::Append(r, _) => (&r.producer_id, r.partition),
                KeyOp::Remove(id, p) => (id, *p),
                KeyOp::Set(i) => (&i.producer_id, i.partition),
            };
            Rec {
                pos,
                at,
                nth,
                hash: hash_key(id, p),
                op,
            }
        };
        match op {
            LogOp::Clock(ms) => self.meta.clock = *ms,
            LogOp::AcceptedUnknown => self.accept_any_next = true,
            LogOp::Append(r) => {
                if let Some(how) = self.append(r, pos) {
                    push(rec(KeyOp::Append(r.clone(), how)))?;
                }
            }
            LogOp::Group { kind, members, arg } => {
                if self.undone(*kind, *arg) {
                    self.skipping = *members;
                } else if *members == 0 {
                    self.finish(*kind, *arg);
                } else {
                    self.group = Some((*kind, *arg, *members));
                }
            }
            LogOp::Remove { reason, keys } => {
                if self.skip_member() {
                    return Ok(());
                }
                self.note_member(op);
                let remember = matches!(reason, RemoveReason::Expired | RemoveReason::Evicted)
                    && self.skip_from.is_none();
                let only = self.only;
                for (id, p) in keys.iter().filter(|(_, p)| only.is_none_or(|o| o == *p)) {
                    if remember {
                        self.meta.filter.insert(hash_key(id, *p));
                    }
                    push(rec(KeyOp::Remove(id.clone(), *p)))?;
                }
                self.end_of_member();
            }
            LogOp::Set { entries } => {
                if self.skip_member() {
                    return Ok(());
                }
                self.note_member(op);
                for e in entries.iter().filter(|e| self.mine(e.partition)) {
                    push(rec(KeyOp::Set(Box::new(e.clone()))))?;
                }
                self.end_of_member();
            }
            // Only a Kafka-flagged segment decodes these, and a strict store
            // refuses such a segment before replay.
            LogOp::KafkaBatch { .. }
            | LogOp::TxnMarker { .. }
            | LogOp::ForgetAborted { .. }
            | LogOp::KafkaPartition { .. } => {
                return Err(Error::Unsupported {
                    what: "a transaction record",
                    semantics: Semantics::Strict,
                });
            }
        }
        Ok(())
    }

    /// How the append at `pos` applies, with the accept-any flag the
    /// record before it left (which it clears); `None` when it is passed
    /// over: at or above a truncation's offset, or of a partition this
    /// replay does not rebuild. Moves the highest offset and the
    /// partition's end to it.
    fn append(&mut self, r: &AppendRequest, pos: u64) -> Option<Apply<Activity>> {
        let unknown = if std::mem::take(&mut self.accept_any_next) {
            UnknownProducer::AcceptAny
        } else {
            UnknownProducer::RequireZero
        };
        let offset = append_offset(r, pos);
        if self.skip_from.is_some_and(|x| offset >= x) || !self.mine(r.partition) {
            return None;
        }
        self.meta.high = self.meta.high.max(offset);
        self.meta.ends.note(r.partition, offset);
        let act = r.metadata.map_or(self.meta.clock, |m| m.timestamp);
        Some(Apply {
            unknown,
            x: Activity::new(act),
        })
    }

    /// A Kafka-mode operation: as the strict path for groups and for what
    /// truncation passes over (operations at or above its offset, groups
    /// that reach it), then [`kafka_op`].
    fn kafka(&mut self, pos: u64, op: &LogOp) -> Result<()> {
        if let LogOp::Group { kind, members, arg } = op {
            if self.undone(*kind, *arg) {
                self.skipping = *members;
                return Ok(());
            }
            kafka_op(&mut self.meta, op, self.only)?;
            if *members == 0 {
                self.finish(*kind, *arg);
            } else {
                self.group = Some((*kind, *arg, *members));
            }
            return Ok(());
        }
        let member = matches!(
            op,
            LogOp::Remove { .. } | LogOp::Set { .. } | LogOp::KafkaPartition { .. }
        ) && (self.skipping > 0 || self.group.is_some());
        if member {
            if self.skip_member() {
                return Ok(());
            }
            self.note_member(op);
            kafka_op(&mut self.meta, op, self.only)?;
            self.end_of_member();
            return Ok(());
        }
        if let (Some(x), Some(o)) = (self.skip_from, kafka_offset(op, pos))
            && o >= x
        {
            return Ok(());
        }
        kafka_op(&mut self.meta, op, self.only)
    }

    /// A member of the current group is applied: its partition is the
    /// group's (an import's members are of its one partition).
    fn note_member(&mut self, op: &LogOp) {
        if self.group.is_some() && self.group_partition.is_none() {
            self.group_partition = member_partition(op);
        }
    }

    /// True (and one fewer to go) if a member of a group being passed
    /// over.
    fn skip_member(&mut self) -> bool {
        if self.skipping > 0 {
            self.skipping -= 1;
            return true;
        }
        false
    }

    /// A member of the current group was applied: after its last, the
    /// group's own effect.
    fn end_of_member(&mut self) {
        let Some((kind, arg, left)) = &mut self.group else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 {
            let (kind, arg) = (*kind, *arg);
            self.group = None;
            self.finish(kind, arg);
        }
    }

    /// What a complete group does to the store-level state.
    fn finish(&mut self, kind: GroupKind, arg: i64) {
        let partition = self.group_partition.take();
        group_done(&mut self.meta, kind, arg, partition);
    }
}

/// What a complete group of `kind` and `arg` does to the store-level state
/// (`partition`: an import's, from its members): the highest offset and the
/// partitions' ends. The live store calls it too, so both agree.
pub(crate) fn group_done(meta: &mut Meta, kind: GroupKind, arg: i64, partition: Option<i32>) {
    match kind {
        GroupKind::Truncate => {
            meta.high = arg.saturating_sub(1);
            meta.ends.cut_all(arg);
        }
        GroupKind::Import => {
            meta.high = meta.high.max(arg);
            if let Some(p) = partition
                && arg >= 0
            {
                meta.ends.note(p, arg);
            }
        }
        GroupKind::TruncatePartition { partition } => meta.ends.cut(partition, arg),
        GroupKind::RemovePartition => {
            if let Ok(p) = i32::try_from(arg) {
                meta.ends.remove(p);
            }
        }
    }
}
