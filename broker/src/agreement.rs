//! The partition's producer state brought exactly to its log when the
//! partition opens.
//!
//! Both are prefixes of one history (the accepted batches in log order), so
//! after a crash a partition's state is either *behind* its log (its newest
//! records were not yet on disk: the common case) or *ahead* of it (its
//! records were flushed, the log's write was not done). On open:
//!
//! - *behind*: every idempotent batch of the log past the partition's end
//!   in the state ([`ProducerStateStore::partition_end_offset`]) is
//!   appended to the state again, in order, each of which must be
//!   `ACCEPTED` (anything else means the state is not a prefix of this log,
//!   and it is rebuilt). O(batches behind), read through the log's index;
//! - then the agreement check: the newest batch each producer has in the
//!   log must be exactly what the state holds as that producer's newest
//!   (epoch, last sequence, offset), the state must know no producer the
//!   log lacks (one the state expired itself is fine: the log still has
//!   its batches) and no batch at or past the log's end. O(the partition's
//!   producers);
//! - *ahead*: the partition's state is cut back to the log's end with
//!   [`ProducerStateStore::truncate_partition_to`], which reads a snapshot
//!   and the store's log after it, not this partition's whole log. A state
//!   left ahead would answer the client's retry of the lost batch with
//!   `DUPLICATE` and an offset the log never had, losing an acknowledged
//!   message;
//! - any other disagreement (a state directory replaced, say), or a
//!   truncation that cannot reach back (`TruncateBelowHistory`): the
//!   partition's state is removed ([`ProducerStateStore::remove_partition`],
//!   one logged group) and rebuilt from its whole log, O(log). A crash in
//!   the middle leaves it behind or as it was, and the next open goes on.
//!

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use producer_state::{AppendOptions, Batch, Marker, Origin, ProducerId, ProducerStateStore};

use crate::batch::{self, BatchHeader, ControlMarker};
use crate::error::{Error, Result};
use crate::partition::OpenReport;
use crate::plog::PartitionLog;

/// What a log says of one producer at its end: its newest epoch (of a
/// data batch or a marker) and its newest data batch (epoch, last
/// sequence, offset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LastBatch {
    epoch: i16,
    data: Option<(i16, i32, i64)>,
}

impl LastBatch {
    /// Notes a batch of the log (data or control) of this producer.
    pub(crate) fn note(&mut self, h: &BatchHeader) {
        self.epoch = h.producer_epoch;
        if !h.is_control() {
            self.data = Some((h.producer_epoch, h.last_sequence(), h.base_offset));
        }
    }
}

/// Applies a batch read back from the partition log (`h`, its bytes
/// `bytes`) to `store` as partition `key`, at the offset the log gave it,
/// as Kafka's log recovery does (the replication origin: what the log
/// holds was accepted once): a data batch with its transactional flag, a
/// control batch as its COMMIT or ABORT marker. `None` for a batch that
/// carries no producer state (not idempotent, or a control batch of
/// another kind).
fn append_logged(
    store: &ProducerStateStore,
    h: &BatchHeader,
    bytes: &[u8],
    name: &str,
    key: i32,
) -> Result<Option<std::result::Result<(), String>>> {
    if !h.is_idempotent() {
        return Ok(None);
    }
    let Ok(producer_id) = ProducerId::try_from(h.producer_id) else {
        return Ok(None);
    };
    let state = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    if h.is_control() {
        let Some(m) = batch::control_marker(bytes) else {
            return Ok(None);
        };
        let marker = marker_at(m, h.base_offset, h.max_timestamp);
        let outcome = store
            .append_marker(
                producer_id,
                key,
                h.producer_epoch,
                marker,
                Origin::Replication,
            )
            .map_err(state)?;
        return Ok(Some(if outcome.is_accepted() {
            Ok(())
        } else {
            Err(outcome.to_string())
        }));
    }
    let mut options = AppendOptions::replication();
    if h.is_transactional() {
        options = options.transactional().verified();
    }
    let outcome = store
        .append_with(
            producer_id,
            key,
            h.producer_epoch,
            to_batch(h, h.base_offset),
            options,
        )
        .map_err(state)?;
    Ok(Some(if outcome.is_accepted() {
        Ok(())
    } else {
        Err(outcome.to_string())
    }))
}

/// The library's marker for a control record at `offset`.
pub(crate) fn marker_at(m: ControlMarker, offset: i64, timestamp: i64) -> Marker {
    if m.commit {
        Marker::commit(m.coordinator_epoch, offset, timestamp)
    } else {
        Marker::abort(m.coordinator_epoch, offset, timestamp)
    }
}

/// Applies to `store` every idempotent batch of `log` past `after`, in
/// order: `Ok(Ok(n))` when each applied, `Ok(Err(why))` at the first that
/// did not (the state is not a prefix of this log).
fn replay(
    store: &ProducerStateStore,
    log: &PartitionLog,
    after: i64,
    name: &str,
    key: i32,
) -> Result<std::result::Result<u64, String>> {
    let mut n = 0u64;
    let mut refused = None;
    log.for_each_batch_after(after, |h, bytes| {
        if refused.is_some() {
            return Ok(());
        }
        match append_logged(store, h, bytes, name, key)? {
            None => {}
            Some(Ok(())) => n += 1,
            Some(Err(outcome)) => {
                refused = Some(format!(
                    "replaying the log past offset {after}: the batch at offset {} was {outcome}",
                    h.base_offset
                ));
            }
        }
        Ok(())
    })?;
    Ok(refused.map_or(Ok(n), Err))
}

/// Why the partition's state and its log disagree, or `None` if they
/// agree: every producer the state knows (`known`, and those of the log)
/// must be at the log's newest epoch for it, with the log's newest data
/// batch as its newest cached batch (or, with none cached, an epoch the
/// marker that bumped it set), and nothing at or past the log's end; a
/// producer of the log the state does not know must be one the state
/// removed itself (expired: `was_removed`).
fn disagreement(
    store: &ProducerStateStore,
    key: i32,
    known: &[ProducerId],
    log_last: &HashMap<i64, LastBatch>,
    log_end: i64,
) -> Option<String> {
    let mut ids: BTreeSet<i64> = log_last.keys().copied().collect();
    for id in known {
        match id.as_numeric().and_then(|p| i64::try_from(p).ok()) {
            Some(pid) => ids.insert(pid),
            None => {
                return Some(format!(
                    "the state holds producer {id}, which no Kafka client has"
                ));
            }
        };
    }
    for pid in ids {
        let Ok(id) = u64::try_from(pid) else { continue };
        let Some(st) = store.kafka_state(id, key) else {
            if log_last.contains_key(&pid) && !store.was_removed(id, key) {
                return Some(format!(
                    "the log has producer {pid}, which the state does not know and did not expire"
                ));
            }
            continue;
        };
        let newest = st
            .batches
            .last()
            .and_then(|b| b.metadata.map(|m| (st.epoch, b.last_sequence, m.offset)));
        if let Some((_, _, offset)) = newest
            && offset >= log_end
        {
            return Some(format!(
                "the state is ahead of the log: producer {pid} has a batch at offset {offset}, \
                 the log ends at {log_end}"
            ));
        }
        let Some(l) = log_last.get(&pid) else {
            return Some(format!("the state knows producer {pid}, the log does not"));
        };
        let agrees = l.epoch == st.epoch
            && match newest {
                Some(n) => l.data == Some(n),
                None => l.data.is_none_or(|(epoch, _, _)| epoch < st.epoch),
            };
        if !agrees {
            return Some(format!(
                "producer {pid}: the state's newest batch is {newest:?} at epoch {}, the log's {l:?}",
                st.epoch
            ));
        }
    }
    None
}

pub(crate) fn to_batch(h: &BatchHeader, offset: i64) -> Batch {
    Batch::new(h.base_sequence, h.last_sequence(), offset, h.max_timestamp)
}

/// Rebuilds the partition's state from its whole log: the partition is
/// removed from the shared state (one logged group), then every batch of
/// the log is appended, in order. A crash part-way leaves the state as it
/// was (the removal not durable) or behind the log, and the next open
/// rebuilds again or catches up. O(log).
fn rebuild(store: &ProducerStateStore, log_path: &Path, name: &str, key: i32) -> Result<()> {
    let state_err = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    store.remove_partition(key).map_err(state_err)?;
    PartitionLog::for_each_batch(log_path, |h, bytes| {
        match append_logged(store, h, bytes, name, key)? {
            None | Some(Ok(())) => Ok(()),
            Some(Err(outcome)) => Err(Error::Rebuild {
                partition: name.to_string(),
                offset: h.base_offset,
                outcome,
            }),
        }
    })
}

/// Brings partition `key`'s state (`name` in messages) exactly to its log
/// `log` at `log_path`, as the module docs say: replays what the state is
/// behind, checks that the two agree (`known`: the producers the store knew
/// of the partition when the broker opened; `log_last`: what the log says
/// of each producer), cuts a state that is ahead back to the log's end,
/// and rebuilds one that disagrees otherwise. Notes what it did in
/// `report`.
pub(crate) fn bring_to_log(
    store: &ProducerStateStore,
    (log, log_path): (&PartitionLog, &Path),
    (name, key): (&str, i32),
    (known, log_last): (&[ProducerId], &HashMap<i64, LastBatch>),
    report: &mut OpenReport,
) -> Result<()> {
    let state_err = |source| Error::State {
        partition: name.to_string(),
        source,
    };
    // Behind: catch up with the log. Nothing to replay when the state
    // agrees or is ahead (its end is then past the log's newest
    // batch, or past the log's end).
    let end = store.partition_end_offset(key) - 1;
    let refused = match replay(store, log, end, name, key)? {
        Ok(n) => {
            if n > 0 {
                tracing::debug!(partition = %name, batches = n, after = end, "replayed the partition log into the producer state, which was behind it");
            }
            report.replayed = n;
            None
        }
        Err(why) => Some(why),
    };
    let log_end = log.next_offset();
    let mut why = refused.or_else(|| disagreement(store, key, known, log_last, log_end));
    // Ahead: cut the partition's state back to the log's end.
    if let Some(w) = &why
        && store.partition_end_offset(key) > log_end
    {
        match store.truncate_partition_to(key, log_end) {
            Ok(()) => {
                let now: Vec<ProducerId> = store
                    .kafka_producers(key)
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect();
                match disagreement(store, key, &now, log_last, log_end) {
                    None => {
                        tracing::warn!(partition = %name, reason = %w, to = log_end, "the producer state was ahead of the partition log; truncated it to the log's end");
                        report.truncated = Some(w.clone());
                        why = None;
                    }
                    Some(still) => why = Some(format!("{w}; truncated to {log_end}: {still}")),
                }
            }
            Err(producer_state::Error::TruncateBelowHistory { lowest, .. }) => {
                why = Some(format!("{w}; truncation reaches back to {lowest} only"));
            }
            Err(e) => return Err(state_err(e)),
        }
    }
    if let Some(why) = why {
        tracing::warn!(partition = %name, reason = %why, "rebuilding the producer state from the partition log");
        rebuild(store, log_path, name, key)?;
        let now: Vec<ProducerId> = store
            .kafka_producers(key)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if let Some(still) = disagreement(store, key, &now, log_last, log_end) {
            return Err(Error::Rebuild {
                partition: name.to_string(),
                offset: log_end,
                outcome: format!("a rebuilt state that still disagrees: {still}"),
            });
        }
        report.rebuilt = Some(why);
    }
    Ok(())
}
