//! What the store's one lock guards: the keys the rules see (the committed
//! state, the keys with appends in flight, the pre-images a running
//! snapshot needs) beside the log queue that orders their records.
//!
//! One lock for both, because the order in which appends are classified
//! must be the order of their records in the log.

use std::collections::HashMap;

use hashbrown::HashTable;

use super::commit::{Host, LogQueue};
use crate::batch::AppendRequest;
use crate::entry::ProducerEntry;
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::rules;
use crate::shards::{SHARDS, Shards, shard_of};

/// A key with appends in flight (queued or written, not yet durable).
struct Pending {
    hash: u64,
    id: ProducerId,
    partition: i32,
    /// The key's state once everything in flight is applied.
    entry: ProducerEntry,
    /// Position and group of the key's last record in flight.
    pos: u64,
    group: u64,
}

/// A queued record waiting to be applied once durable (`Always`).
pub(super) struct Queued {
    hash: u64,
    request: AppendRequest,
    /// The key's entry once this record is applied, as submitting it
    /// computed: installed as it is when the record is durable.
    entry: ProducerEntry,
    pos: u64,
}

/// A snapshot in progress: the position and which shards are encoded.
pub(super) struct Capture {
    pub(super) position: u64,
    pub(super) done: [bool; SHARDS],
    /// Per shard: entries as they were at `position`, for keys changed since
    /// (`None`: the key did not exist at `position`).
    pub(super) pre: Vec<HashMap<(ProducerId, i32), Option<ProducerEntry>>>,
}

impl Capture {
    /// A snapshot at `position`, no shard encoded yet.
    pub(super) fn new(position: u64) -> Capture {
        Capture {
            position,
            done: [false; SHARDS],
            pre: (0..SHARDS).map(|_| HashMap::new()).collect(),
        }
    }
}

/// What submitting one request under `Always` came to.
pub(super) enum Submit {
    Done(BatchOutcome),
    /// Accepted and queued at this position, in this group: wait for it.
    Queued {
        group: u64,
        pos: u64,
    },
    /// The key has records in flight up to this position (in this group)
    /// and the request is not their continuation: wait, then classify again.
    Wait {
        group: u64,
        pos: u64,
    },
}

/// The keys the rules see.
pub(super) struct Keys {
    /// Under `Always`, the state of the durable appends; under the
    /// buffered policies, of every accepted append.
    pub(super) shards: Shards,
    /// `Always`: the keys with records in flight.
    overlay: HashTable<Pending>,
    pub(super) capture: Option<Capture>,
}

impl Keys {
    pub(super) fn new(shards: Shards) -> Keys {
        Keys {
            shards,
            overlay: HashTable::new(),
            capture: None,
        }
    }

    fn overlay_find(&self, hash: u64, id: &ProducerId, partition: i32) -> Option<&Pending> {
        self.overlay
            .find(hash, |p| p.partition == partition && p.id == *id)
    }

    /// Saves the entry of a key about to change if a snapshot needs it as
    /// it was at the snapshot's position.
    fn save_pre_image(&mut self, hash: u64, id: &ProducerId, partition: i32, pos: u64) {
        let Some(c) = &mut self.capture else { return };
        let s = shard_of(hash);
        if c.done[s] || pos < c.position {
            return;
        }
        let shards = &self.shards;
        c.pre[s]
            .entry((id.clone(), partition))
            .or_insert_with(|| shards.get(hash, id, partition));
    }

    /// `Always`: installs a durable group in the committed state, each
    /// record's entry as submitting it computed. The entry was classified
    /// against the key's in-flight state, which is what the committed state
    /// has become once every record before it is applied: a request that
    /// does not continue a key's records in flight waits until they are
    /// durable.
    fn apply_durable(&mut self, group: Vec<Queued>) {
        for q in group {
            let r = &q.request;
            self.save_pre_image(q.hash, &r.producer_id, r.partition, q.pos);
            debug_assert_eq!(
                next_entry(self.shards.get(q.hash, &r.producer_id, r.partition), r).ok(),
                Some(q.entry),
                "the durable record at position {} does not apply to the committed state",
                q.pos
            );
            self.shards
                .install(q.hash, &r.producer_id, r.partition, &q.entry);
            if let Ok(entry) = self.overlay.find_entry(q.hash, |p| {
                p.partition == r.partition && p.id == r.producer_id
            }) && entry.get().pos == q.pos
            {
                entry.remove();
            }
        }
    }
}

/// Classifies `r` against `base` (the key's entry, if it has one): the
/// entry once `r` is applied if it is accepted, else the outcome.
#[inline]
fn next_entry(
    base: Option<ProducerEntry>,
    r: &AppendRequest,
) -> std::result::Result<ProducerEntry, BatchOutcome> {
    let outcome = rules::classify(
        base.map(|e| e.current()),
        r.epoch,
        r.first,
        r.last,
        |f, l| base.and_then(|e| e.find(f, l)),
    );
    if !outcome.is_accepted() {
        return Err(outcome);
    }
    Ok(match base {
        Some(mut e) => {
            e.accept(r.epoch > e.epoch(), r.epoch, r.first, r.last, r.metadata);
            e
        }
        None => ProducerEntry::start(r.epoch, r.first, r.last, r.metadata),
    })
}

/// Everything behind the store's lock.
pub(super) struct State {
    pub(super) keys: Keys,
    pub(super) log: LogQueue<Queued>,
    /// Records and bytes of log since the last snapshot.
    pub(super) since_snapshot: (u64, u64),
    /// The automatic snapshot thresholds (records, bytes).
    pub(super) snapshot_every: (Option<u64>, Option<u64>),
    /// A threshold was crossed and the snapshot has not started yet.
    pub(super) snapshot_requested: bool,
    pub(super) snapshots_written: u64,
    /// Appends answered accepted, duplicate, out of order, fenced (in
    /// [`AppendOutcome`](crate::AppendOutcome) order), counted where they
    /// are decided: under this lock, for nothing. Under `Always` an
    /// accepted append is counted when its record is durable (it is
    /// answered `ACCEPTED` exactly then).
    pub(super) answered: [u64; 4],
}

impl State {
    fn enqueue_record(&mut self, r: &AppendRequest) -> u64 {
        let before = self.log.buffered();
        let pos = self.log.push(r);
        self.since_snapshot.0 += 1;
        self.since_snapshot.1 += (self.log.buffered() - before) as u64;
        pos
    }

    /// `Always`: classifies against the in-flight state if the key has one,
    /// else the committed state; queues an accepted request.
    pub(super) fn submit_durable(&mut self, hash: u64, r: &AppendRequest) -> Submit {
        let keys = &self.keys;
        let (base, in_flight) = match keys.overlay_find(hash, &r.producer_id, r.partition) {
            Some(p) => (Some(p.entry), Some((p.group, p.pos))),
            None => (keys.shards.get(hash, &r.producer_id, r.partition), None),
        };
        let entry = match next_entry(base, r) {
            Ok(e) => e,
            Err(outcome) => {
                return match in_flight {
                    Some((group, pos)) => Submit::Wait { group, pos },
                    None => {
                        self.answered[outcome.outcome() as usize] += 1;
                        Submit::Done(outcome)
                    }
                };
            }
        };
        let pos = self.enqueue_record(r);
        let group = self.log.group();
        self.log.queue(Queued {
            hash,
            request: r.clone(),
            entry,
            pos,
        });
        match self.keys.overlay.find_mut(hash, |p| {
            p.partition == r.partition && p.id == r.producer_id
        }) {
            Some(p) => {
                p.entry = entry;
                p.pos = pos;
                p.group = group;
            }
            None => {
                self.keys.overlay.insert_unique(
                    hash,
                    Pending {
                        hash,
                        id: r.producer_id.clone(),
                        partition: r.partition,
                        entry,
                        pos,
                        group,
                    },
                    |p| p.hash,
                );
            }
        }
        Submit::Queued { group, pos }
    }

    /// Buffered policies: classify, apply and queue the record at once.
    #[inline]
    pub(super) fn submit_buffered(&mut self, hash: u64, r: &AppendRequest) -> BatchOutcome {
        if self.keys.capture.is_some() {
            // If the append is rejected, the pre-image equals the current
            // entry, which is harmless.
            let pos = self.log.next_position();
            self.keys
                .save_pre_image(hash, &r.producer_id, r.partition, pos);
        }
        let outcome = self.keys.shards.append(hash, r);
        self.answered[outcome.outcome() as usize] += 1;
        if outcome.is_accepted() {
            self.enqueue_record(r);
        }
        outcome
    }

    /// True (once) when an automatic snapshot threshold has been crossed.
    pub(super) fn note_snapshot_due(&mut self) -> bool {
        let (records, bytes) = self.since_snapshot;
        let (every_records, every_bytes) = self.snapshot_every;
        let due =
            every_records.is_some_and(|n| records >= n) || every_bytes.is_some_and(|n| bytes >= n);
        if due && !self.snapshot_requested && self.log.failed().is_none() {
            self.snapshot_requested = true;
            return true;
        }
        false
    }
}

impl Host for State {
    type Item = Queued;

    #[inline]
    fn log(&mut self) -> &mut LogQueue<Queued> {
        &mut self.log
    }

    fn apply_durable(&mut self, items: Vec<Queued>) {
        self.answered[0] += items.len() as u64;
        self.keys.apply_durable(items);
    }

    fn discard_in_flight(&mut self) {
        self.keys.overlay.clear();
    }

    fn after_group(&mut self) -> bool {
        self.note_snapshot_due()
    }

    fn live_keys(&self) -> usize {
        self.keys.shards.len()
    }
}
