//! The store under `Semantics::Kafka`: Kafka's verdicts, transactions and
//! markers over the write-ahead log.
//!
//! The Kafka-mode state is one engine (`ProducerStateManager` under Kafka
//! semantics: the compact map, the side table, the transaction index),
//! kept with the store-level state behind the store's lock
//! (`Meta::kafka`); the seed shards stay empty. Every operation is
//! classified and, if accepted, applied to the engine and its record
//! queued under that lock, so the engine is always the state of every
//! record queued, in log order. Replay applies the same records without
//! classifying them (`replay.rs`), and a snapshot captures the engine with
//! the store-level state at a position (docs/transactions.md, "The durable store").
//!
//! Under `FsyncPolicy::Always` an answer waits until its record is
//! durable. An operation on a key with a record in flight is decided
//! against the queued state, which already holds that record: accepted, it
//! joins the next group commit; answered anything else (a retry that races
//! its original is `DUPLICATE`), the answer waits until the in-flight
//! record is durable, never before. So one producer's pipelined batches
//! on a partition share group commits, as different keys do.
//! Reads (`kafka_state`, the last stable offset, the aborted list) see
//! accepted operations once queued, as Kafka's producer state sees an
//! append once it is in the log, before it is replicated. A failed write
//! poisons the store as in strict mode: reopen to see what survived.

use super::append_all::settle;
use super::keys::Queued;
use super::state::State;
use super::{Shared, check_name};
use crate::batch::AppendRequest;
use crate::engine::ProducerStateManager;
use crate::engine::kafka::txn::{Marker, MarkerOutcome};
use crate::engine::map::hash_key;
use crate::error::{Error, Result};
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::recovery::replay::append_offset;
use crate::semantics::Semantics;
use crate::wal::op::{self, GroupKind, LogOp, RemoveReason};
use crate::wal::txn_op;

/// One Kafka-mode operation.
pub(super) enum KafkaOp<'a> {
    /// A data batch (its options in the request).
    Batch(&'a AppendRequest),
    /// An end-transaction marker.
    Marker {
        id: &'a ProducerId,
        partition: i32,
        epoch: i16,
        marker: Marker,
        origin: crate::batch::Origin,
    },
    /// Aborted transactions forgotten below an offset.
    Forget { partition: i32, offset: i64 },
    /// Kafka's `removeExpiredProducers` with the store's clock reading:
    /// the keys it drops are logged (kind 7, `Expired`), never decided
    /// again at replay.
    Expire { now_ms: i64, expiration_ms: i64 },
    /// Every key of a partition and its transactions (a group of kind
    /// `RemovePartition`).
    RemovePartition { partition: i32 },
}

impl KafkaOp<'_> {
    /// The key whose records must not overlap in flight.
    fn key(&self) -> Option<(ProducerId, i32)> {
        match self {
            KafkaOp::Batch(r) => Some((r.producer_id.clone(), r.partition)),
            KafkaOp::Marker { id, partition, .. } => Some(((*id).clone(), *partition)),
            KafkaOp::Forget { .. } | KafkaOp::Expire { .. } | KafkaOp::RemovePartition { .. } => {
                None
            }
        }
    }
}

/// What a Kafka-mode operation came to.
#[derive(Clone, Copy, Debug)]
pub(super) enum KafkaAnswer {
    Batch(BatchOutcome),
    Marker(MarkerOutcome),
    Done,
    /// How many keys a lifecycle operation removed.
    Removed(usize),
}

impl KafkaAnswer {
    pub(super) fn batch(self) -> BatchOutcome {
        match self {
            KafkaAnswer::Batch(o) => o,
            _ => BatchOutcome::Accepted,
        }
    }
}

/// What submitting a Kafka-mode operation came to.
pub(super) enum KafkaSubmit {
    /// Answered; nothing was written (a rejection, a duplicate, or a
    /// forget that forgot nothing).
    Done(KafkaAnswer),
    /// Accepted and queued at `pos` in `group`.
    Queued {
        answer: KafkaAnswer,
        group: u64,
        pos: u64,
    },
    /// `Always`: the key has a record in flight; wait for it, then submit
    /// again.
    Wait { group: u64, pos: u64 },
}

/// What a Kafka-mode operation came to before its answer is queued:
/// nothing to log (answered at once), or `n` records logged, the last at
/// `pos`.
enum Logged {
    No(KafkaAnswer),
    Yes {
        answer: KafkaAnswer,
        pos: u64,
        n: u64,
    },
}

/// The Kafka-mode engine a Kafka-mode store's state holds.
pub(super) fn engine_of(
    kafka: &mut Option<Box<ProducerStateManager>>,
) -> Result<&mut ProducerStateManager> {
    kafka.as_deref_mut().ok_or_else(engine_lost)
}

fn engine_lost() -> Error {
    Error::Internal("a Kafka-mode store has no Kafka-mode state")
}

impl State {
    /// Classifies `op` on the Kafka-mode engine, applies it if accepted
    /// and queues its record.
    #[inline]
    pub(super) fn submit_kafka(&mut self, op: &KafkaOp<'_>) -> Result<KafkaSubmit> {
        // Only `Always` tracks keys in flight: the other policies need no
        // copy of the key.
        let key = if self.life.always { op.key() } else { None };
        let in_flight = key
            .as_ref()
            .and_then(|k| self.keys.kafka_in_flight.get(k).copied());
        // A data batch whose key has a record in flight is classified
        // against the state with that record (Kafka mode applies every
        // record as it is queued), so one producer's pipelined batches
        // share a group commit; anything else waits for the record.
        if let Some((group, pos)) = in_flight
            && !matches!(op, KafkaOp::Batch(_))
        {
            return Ok(KafkaSubmit::Wait { group, pos });
        }
        let before = self.log.buffered();
        let mut records = 1;
        let engine = engine_of(&mut self.keys.meta.kafka)?;
        let (answer, high) = match op {
            KafkaOp::Batch(r) => {
                let o = engine.kafka_append_request(r);
                if !o.is_accepted() {
                    // A duplicate is never answered before its original
                    // is durable, nor a refusal decided on a record that
                    // may never be: wait for it, then classify again.
                    if let Some((group, pos)) = in_flight {
                        return Ok(KafkaSubmit::Wait { group, pos });
                    }
                    self.answered[o.outcome() as usize] += 1;
                    return Ok(KafkaSubmit::Done(KafkaAnswer::Batch(o)));
                }
                self.answered[o.outcome() as usize] += 1;
                let pos = if r.options.is_transactional() {
                    let offset = append_offset(r, self.log.next_position());
                    self.log.push_partition_op((r.partition, offset), |b| {
                        txn_op::encode_batch(b, r, true);
                    })
                } else {
                    self.log.push(r)
                };
                let high = r.metadata.map(|m| (r.partition, m.offset));
                ((KafkaAnswer::Batch(o), pos), high)
            }
            KafkaOp::Marker {
                id,
                partition,
                epoch,
                marker,
                origin,
            } => match self.kafka_marker(id, (*partition, *epoch), marker, *origin)? {
                Logged::No(answer) => return Ok(KafkaSubmit::Done(answer)),
                Logged::Yes { answer, pos, .. } => {
                    ((answer, pos), Some((*partition, marker.offset)))
                }
            },
            KafkaOp::Forget { partition, offset } => {
                match self.kafka_forget(*partition, *offset)? {
                    Logged::No(answer) => return Ok(KafkaSubmit::Done(answer)),
                    Logged::Yes { answer, pos, .. } => ((answer, pos), None),
                }
            }
            KafkaOp::Expire {
                now_ms,
                expiration_ms,
            } => match self.kafka_expire(*now_ms, *expiration_ms)? {
                Logged::No(answer) => return Ok(KafkaSubmit::Done(answer)),
                Logged::Yes { answer, pos, n } => {
                    records = n;
                    ((answer, pos), None)
                }
            },
            KafkaOp::RemovePartition { partition } => {
                match self.kafka_remove_partition(*partition)? {
                    Logged::No(answer) => return Ok(KafkaSubmit::Done(answer)),
                    Logged::Yes { answer, pos, n } => {
                        records = n;
                        ((answer, pos), None)
                    }
                }
            }
        };
        let (answer, pos) = answer;
        self.counted(before, records);
        if let Some((p, h)) = high {
            self.keys.meta.high = self.keys.meta.high.max(h);
            self.keys.meta.ends.note(p, h);
        }
        let group = self.log.group();
        if self.life.always
            && let Some(key) = key
        {
            self.keys.kafka_in_flight.insert(key.clone(), (group, pos));
            self.log.queue(Queued::KafkaSettle { key, pos });
        }
        Ok(KafkaSubmit::Queued { answer, group, pos })
    }

    /// A marker: classified, applied and logged if accepted.
    fn kafka_marker(
        &mut self,
        id: &ProducerId,
        (partition, epoch): (i32, i16),
        marker: &Marker,
        origin: crate::batch::Origin,
    ) -> Result<Logged> {
        let engine = engine_of(&mut self.keys.meta.kafka)?;
        let o = engine.append_marker(id, partition, epoch, *marker, origin)?;
        if !matches!(o, MarkerOutcome::Accepted { .. }) {
            return Ok(Logged::No(KafkaAnswer::Marker(o)));
        }
        let pos = self.log.push_partition_op((partition, marker.offset), |b| {
            txn_op::encode_marker(b, id, partition, epoch, marker);
        });
        Ok(Logged::Yes {
            answer: KafkaAnswer::Marker(o),
            pos,
            n: 1,
        })
    }

    /// Forgets the partition's aborted transactions below `offset`, logged
    /// if any was forgotten.
    fn kafka_forget(&mut self, partition: i32, offset: i64) -> Result<Logged> {
        let engine = engine_of(&mut self.keys.meta.kafka)?;
        let had = engine.aborted_transactions(partition).len();
        engine.forget_aborted_before(partition, offset);
        if engine.aborted_transactions(partition).len() == had {
            return Ok(Logged::No(KafkaAnswer::Done));
        }
        let (pos, ()) = self.log.push_marked_op(
            |b| {
                txn_op::encode_forget(b, partition, offset);
                (1, ())
            },
            |reach, last| reach.touch(partition, last),
        );
        Ok(Logged::Yes {
            answer: KafkaAnswer::Done,
            pos,
            n: 1,
        })
    }

    /// A Kafka-mode expiration sweep: the keys Kafka's rule expires (but
    /// not one with a record in flight), removed and logged as one
    /// removal record each 64 KiB.
    fn kafka_expire(&mut self, now_ms: i64, expiration_ms: i64) -> Result<Logged> {
        let engine = engine_of(&mut self.keys.meta.kafka)?;
        // Verification states expire by their own age, in memory only
        // (nothing of them is logged: docs/format.md).
        engine.expire_verification_states(now_ms, expiration_ms);
        let in_flight = &self.keys.kafka_in_flight;
        let mut gone = engine.kafka_expired_keys(now_ms, expiration_ms);
        // As in strict mode: a key whose record is not yet durable
        // is left for the next sweep.
        gone.retain(|k| !in_flight.contains_key(k));
        if gone.is_empty() {
            return Ok(Logged::No(KafkaAnswer::Removed(0)));
        }
        gone.sort();
        for (id, p) in &gone {
            engine.remove_kafka_key(id, *p);
            self.keys.meta.filter.insert(hash_key(id, *p));
        }
        self.life_stats.expired += gone.len() as u64;
        let (first, n) = self.log.push_marked_op(
            |b| {
                let c = op::encode_removes(
                    b,
                    RemoveReason::Expired,
                    gone.iter().map(|(id, p)| (id, *p)),
                );
                (c.len() as u64, c.len() as u64)
            },
            |reach, last| {
                for (_, p) in &gone {
                    reach.touch(*p, last);
                }
            },
        );
        Ok(Logged::Yes {
            answer: KafkaAnswer::Removed(gone.len()),
            pos: first + n - 1,
            n,
        })
    }

    /// A Kafka-mode partition removal: its producers, open transactions
    /// and aborted list dropped, logged as one group.
    fn kafka_remove_partition(&mut self, partition: i32) -> Result<Logged> {
        let engine = engine_of(&mut self.keys.meta.kafka)?;
        // Its verification states go too, in memory (never logged), even
        // when nothing else of the partition is left to log.
        engine.forget_partition_verifications(partition);
        let ids = engine.kafka_keys_of(partition);
        let aborted = !engine.aborted_transactions(partition).is_empty();
        // A partition with an end but no state left (its keys expired) is
        // removed too: its end goes with it.
        let end = self.keys.meta.ends.get(partition) >= 0;
        if ids.is_empty() && !aborted && !end {
            return Ok(Logged::No(KafkaAnswer::Removed(0)));
        }
        engine.remove_partition(partition);
        self.keys.meta.ends.remove(partition);
        self.life_stats.partition_removed += ids.len() as u64;
        // One group: the group record and the keys' removals (none
        // when only aborted transactions were left). Replay drops
        // the whole partition at the group record, which the log
        // hands over only once every member is read.
        let (first, n) = self.log.push_marked_op(
            |b| {
                let mut scratch = Vec::new();
                let members = if ids.is_empty() {
                    0
                } else {
                    op::encode_removes(
                        &mut scratch,
                        RemoveReason::PartitionRemoved,
                        ids.iter().map(|id| (id, partition)),
                    )
                    .len()
                };
                op::encode_group(
                    b,
                    GroupKind::RemovePartition,
                    members as u32,
                    i64::from(partition),
                );
                b.extend_from_slice(&scratch);
                let n = 1 + members as u64;
                (n, n)
            },
            // The group and its members are the partition's alone.
            |reach, last| reach.touch(partition, last),
        );
        Ok(Logged::Yes {
            answer: KafkaAnswer::Removed(ids.len()),
            pos: first + n - 1,
            n,
        })
    }
}

impl State {
    /// Logs a Kafka-mode truncation to `offset` whose state is `cut`: one
    /// group whose members set every partition whose view differs from
    /// the live one to its state in `cut` (partition-state records, then
    /// key-state records), applied to the live engine through the same
    /// function replay uses. Returns the last member's position.
    pub(super) fn log_kafka_truncation(
        &mut self,
        offset: i64,
        cut: &ProducerStateManager,
        only: Option<i32>,
    ) -> Result<u64> {
        let engine = self.keys.meta.kafka.as_deref().ok_or_else(engine_lost)?;
        let partitions = match only {
            Some(p) => std::collections::BTreeSet::from([p]),
            None => {
                let mut all = engine.kafka_partitions();
                all.extend(cut.kafka_partitions());
                all
            }
        };
        let mut ops = Vec::new();
        let mut changed = 0u64;
        for p in partitions {
            if engine.kafka_partition_view(p) != cut.kafka_partition_view(p) {
                ops.extend(txn_op::kafka_partition_ops(cut, p)?);
                changed += 1;
            }
        }
        let kind = match only {
            Some(partition) => GroupKind::TruncatePartition { partition },
            None => GroupKind::Truncate,
        };
        let last = self.log_kafka_group(kind, offset, &ops, None)?;
        self.life_stats.truncations += 1;
        self.life_stats.truncated_keys += changed;
        Ok(last)
    }

    /// Logs one Kafka-mode group of `kind` and `arg` whose members are
    /// `ops` (partition-state and key-state records), and applies the
    /// group record and each member to the live engine through the
    /// function replay uses, so the live state is what recovery rebuilds.
    /// Returns the last member's position (the group record's, if none).
    pub(super) fn log_kafka_group(
        &mut self,
        kind: GroupKind,
        arg: i64,
        ops: &[LogOp],
        partition: Option<i32>,
    ) -> Result<u64> {
        let mut scratch = Vec::new();
        let mut members = 0usize;
        for o in ops {
            members += match o {
                LogOp::KafkaPartition {
                    partition,
                    reset,
                    section,
                } => {
                    txn_op::encode_partition(&mut scratch, *partition, *reset, section);
                    1
                }
                LogOp::Set { entries } => op::encode_sets(&mut scratch, entries.iter()).len(),
                _ => return Err(Error::Internal("a Kafka-mode group of another record kind")),
            };
        }
        let group = LogOp::Group {
            kind,
            members: members as u32,
            arg,
        };
        let before = self.log.buffered();
        let (first, ()) = self.log.push_marked_op(
            |b| {
                op::encode_group(b, kind, members as u32, arg);
                b.extend_from_slice(&scratch);
                (1 + members as u64, ())
            },
            // Marked as recovery marks them: the group record, then each
            // member, by the one rule.
            |reach, last| {
                for o in std::iter::once(&group).chain(ops) {
                    reach.mark(last, o);
                }
            },
        );
        self.counted(before, 1 + members as u64);
        // The live engine takes exactly what replay will.
        let meta = &mut self.keys.meta;
        crate::recovery::replay::apply_kafka(meta, &group)?;
        for o in ops {
            crate::recovery::replay::apply_kafka(meta, o)?;
        }
        crate::recovery::replay::group_done(meta, kind, arg, partition);
        Ok(first + members as u64)
    }
}

impl Shared {
    pub(super) fn kafka_refused(&self) -> Error {
        Error::Unsupported {
            what: "transactions, markers and origins",
            semantics: Semantics::Strict,
        }
    }

    /// Runs one Kafka-mode operation to its answer: durable under
    /// `Always` before it returns.
    #[inline]
    pub(super) fn kafka_run(&self, op: KafkaOp<'_>) -> Result<KafkaAnswer> {
        if !self.kafka {
            return Err(self.kafka_refused());
        }
        let mut st = self.lock_to_write(false)?;
        loop {
            match st.submit_kafka(&op)? {
                KafkaSubmit::Done(a) => return Ok(a),
                KafkaSubmit::Queued { answer, group, pos } => {
                    if !self.is_always() {
                        self.after_buffered(st);
                        return Ok(answer);
                    }
                    self.commit(st);
                    self.await_durable(group, pos)?;
                    return Ok(answer);
                }
                KafkaSubmit::Wait { group, pos } => st = self.relock_after(st, group, pos)?,
            }
        }
    }

    /// `append_all` in Kafka mode: every request classified in order under
    /// the lock, the accepted ones sharing one write and one fsync (a
    /// request for a key with a record in flight waits for it).
    pub(super) fn kafka_all(&self, requests: &[AppendRequest]) -> Vec<Result<BatchOutcome>> {
        let mut st = self.lock_state();
        if !self.is_always() {
            st = self.room(st);
        }
        let mut out: Vec<Result<BatchOutcome>> = Vec::with_capacity(requests.len());
        let mut queued: Vec<(usize, u64, u64)> = Vec::new();
        let mut accepted = false;
        for (i, r) in requests.iter().enumerate() {
            if let Err(e) = check_name(r).and_then(|()| check_kafka(r)) {
                out.push(Err(e));
                continue;
            }
            out.push(loop {
                if let Some(f) = st.log.failed() {
                    break Err(f.error_for(None));
                }
                match st.submit_kafka(&KafkaOp::Batch(r)) {
                    Err(e) => break Err(e),
                    Ok(KafkaSubmit::Done(a)) => break Ok(a.batch()),
                    Ok(KafkaSubmit::Queued { answer, group, pos }) => {
                        accepted = true;
                        if self.is_always() {
                            queued.push((i, group, pos));
                        }
                        break Ok(answer.batch());
                    }
                    Ok(KafkaSubmit::Wait { group, pos }) => {
                        let waited;
                        (st, waited) = self.commit_and_relock(st, group, pos);
                        if let Err(e) = waited {
                            break Err(e);
                        }
                    }
                }
            });
        }
        if !self.is_always() {
            if accepted {
                self.after_buffered(st);
            }
            return out;
        }
        settle(self, st, &queued, &mut out);
        out
    }
}

/// A transactional batch needs its offset (the transaction opens there):
/// a single-sequence request cannot be one.
pub(super) fn check_kafka(r: &AppendRequest) -> Result<()> {
    if r.options.is_transactional() && r.metadata.is_none() {
        return Err(Error::InvalidOptions(
            "a transactional append must be a batch with its offset, not a single sequence".into(),
        ));
    }
    Ok(())
}
