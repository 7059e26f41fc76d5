//! The state behind the store's one lock, and how a change gets into
//! it: an append or a lifecycle change is decided against the keys
//! (`keys.rs`), its records are queued in log order, and it is applied at
//! once (buffered policies) or once durable (`Always`, through
//! [`Host::apply_durable`]). The lifecycle's limits and counts live here
//! too: they are decided under the same lock.

use super::commit::{Host, LogQueue};
use crate::batch::AppendRequest;
use crate::engine::hash::HashedKey;
use crate::engine::info::ProducerInfo;
use crate::engine::map::{Activity, Apply};
use crate::engine::rules::UnknownProducer;
use crate::engine::shards::{KeyTarget, SHARDS, WARM_CHUNK};
use crate::error::Error;
use crate::id::ProducerId;
use crate::outcome::BatchOutcome;
use crate::recovery::replay::append_offset;
use crate::wal::op::{self, GroupKind, RemoveReason};

use super::keys::{Keys, Queued, next_entry, remembered};

/// What submitting one request came to.
pub(super) enum Submit {
    Done(BatchOutcome),
    /// `Always`: accepted and queued at this position, in this group: wait
    /// for it.
    Queued {
        group: u64,
        pos: u64,
    },
    /// `Always`: the key has records in flight up to this position (in
    /// this group) and the request is not their continuation, or a full
    /// table has no key to evict but keys in flight: wait, then submit
    /// again.
    Wait {
        group: u64,
        pos: u64,
    },
    /// Refused before anything was written.
    Refused(Error),
}

/// What the lifecycle options say, as the lock's holder needs them.
pub(super) struct Life {
    pub(super) always: bool,
    pub(super) unknown: UnknownProducer,
    pub(super) cap: Option<usize>,
    /// At the cap: refuse new keys instead of evicting.
    pub(super) refuse: bool,
}

impl Life {
    /// Keys one eviction pass removes at a cap of `cap`: a 256th of the
    /// cap, at least one (docs/lifecycle.md).
    pub(super) fn evict_batch(cap: usize) -> usize {
        (cap / SHARDS).max(1)
    }
}

/// Counters of the lifecycle operations since the store was opened.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LifeStats {
    pub(super) expired: u64,
    pub(super) evicted: u64,
    pub(super) partition_removed: u64,
    pub(super) truncations: u64,
    pub(super) truncated_keys: u64,
    pub(super) skimmed_truncations: u64,
    pub(super) imported: u64,
}

/// Everything behind the store's lock.
pub(super) struct State {
    pub(super) keys: Keys,
    pub(super) log: LogQueue<Queued>,
    /// Positions and bytes of log since the last snapshot.
    pub(super) since_snapshot: (u64, u64),
    /// The automatic snapshot thresholds (positions, bytes).
    pub(super) snapshot_every: (Option<u64>, Option<u64>),
    /// A threshold was crossed and the snapshot has not started yet.
    pub(super) snapshot_requested: bool,
    pub(super) snapshots_written: u64,
    /// The log clock once every record queued is applied.
    pub(super) spec_clock: i64,
    /// Keys with state once every record queued is applied.
    pub(super) spec_len: usize,
    pub(super) life: Life,
    pub(super) life_stats: LifeStats,
    /// Appends answered accepted, duplicate, out of order, fenced (in
    /// [`AppendOutcome`](crate::AppendOutcome) order), counted where they
    /// are decided: under this lock, for nothing. Under `Always` an
    /// accepted append is counted when its record is durable (it is
    /// answered `ACCEPTED` exactly then).
    pub(super) answered: [u64; 4],
}

impl State {
    pub(super) fn new(keys: Keys, log: LogQueue<Queued>, life: Life) -> State {
        State {
            spec_clock: keys.meta.clock,
            spec_len: keys.shards.len(),
            keys,
            log,
            since_snapshot: (0, 0),
            snapshot_every: (None, None),
            snapshot_requested: false,
            snapshots_written: 0,
            life,
            life_stats: LifeStats::default(),
            answered: [0; 4],
        }
    }

    /// Counts what was just queued toward the snapshot thresholds.
    pub(super) fn counted(&mut self, bytes_before: usize, positions: u64) {
        self.since_snapshot.0 += positions;
        self.since_snapshot.1 += (self.log.buffered() - bytes_before) as u64;
    }

    fn enqueue_record(&mut self, r: &AppendRequest) -> u64 {
        let before = self.log.buffered();
        let pos = self.log.push(r);
        self.counted(before, 1);
        pos
    }

    /// The time an append takes as its key's activity: its batch's
    /// timestamp, or the log clock, which a reading `now` moves forward.
    #[inline]
    fn activity(&self, r: &AppendRequest, now: i64) -> i64 {
        r.metadata.map_or(self.spec_clock.max(now), |m| m.timestamp)
    }

    /// Logs the clock before an accepted single-sequence append at `act`
    /// if it moved.
    #[inline]
    fn log_clock(&mut self, r: &AppendRequest, act: i64) {
        if r.metadata.is_some() || act == self.spec_clock {
            return;
        }
        let before = self.log.buffered();
        self.log.push_op(|b| {
            op::encode_clock(b, act);
            (0, ())
        });
        self.counted(before, 0);
        self.spec_clock = act;
        if self.life.always {
            self.log.queue(Queued::Clock(act));
        } else {
            self.keys.meta.clock = act;
        }
    }

    /// Logs the marker that lets replay accept an append for a key without
    /// state at a sequence other than 0.
    fn log_accepted_unknown(&mut self) {
        let before = self.log.buffered();
        self.log.push_op(|b| {
            op::encode_accepted_unknown(b);
            (0, ())
        });
        self.counted(before, 0);
    }

    /// `Always`: classifies against the in-flight state if the key has one,
    /// else the committed state; makes room for a new key at the cap;
    /// queues an accepted request (after its clock record, if the clock
    /// moved).
    pub(super) fn submit_durable(&mut self, hash: u64, r: &AppendRequest, now: i64) -> Submit {
        let (base, in_flight) = self.keys.spec(hash, &r.producer_id, r.partition);
        let entry = match next_entry(base.map(|(e, _)| e), r, self.life.unknown) {
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
        let new_key = base.is_none();
        if new_key && let Err(s) = self.make_room(hash, r) {
            return s;
        }
        let act = self.activity(r, now);
        self.log_clock(r, act);
        if new_key && r.first != 0 {
            self.log_accepted_unknown();
        }
        let pos = self.enqueue_record(r);
        let group = self.log.group();
        self.log.queue(Queued::Append {
            hash,
            request: r.clone(),
            entry,
            act,
            pos,
        });
        self.keys.set_spec(
            (hash, &r.producer_id, r.partition),
            Some((entry, act)),
            None,
            (pos, group),
        );
        self.spec_len += usize::from(new_key);
        Submit::Queued { group, pos }
    }

    /// Buffered policies: classify, apply and queue the record at once.
    #[inline]
    pub(super) fn submit_buffered(
        &mut self,
        hash: u64,
        r: &AppendRequest,
        now: i64,
    ) -> Result<BatchOutcome, Error> {
        if self.life.cap.is_some_and(|cap| self.spec_len >= cap)
            && !self.keys.shards.contains(hash, &r.producer_id, r.partition)
        {
            // A new key in a full table: rule 1 alone decides.
            if let Err(outcome) = next_entry(None, r, self.life.unknown) {
                return Ok(outcome);
            }
            if let Err(s) = self.make_room(hash, r) {
                return match s {
                    Submit::Refused(e) => Err(e),
                    _ => Err(Error::Internal("a buffered append waited for room")),
                };
            }
        }
        let pos = self.log.next_position();
        if self.keys.capture.is_some() {
            // If the append is rejected, the pre-image equals the current
            // entry, which is harmless.
            self.keys
                .save_pre_image(hash, &r.producer_id, r.partition, pos);
        }
        let act = self.activity(r, now);
        let how = Apply {
            unknown: self.life.unknown,
            x: Activity::new(act),
        };
        let (outcome, new_key) = self.keys.append_now(hash, r, how);
        self.answered[outcome.outcome() as usize] += 1;
        if outcome.is_accepted() {
            self.log_clock(r, act);
            if new_key && r.first != 0 {
                self.log_accepted_unknown();
            }
            let pos = self.enqueue_record(r);
            let offset = append_offset(r, pos);
            self.keys.meta.high = self.keys.meta.high.max(offset);
            self.keys.meta.ends.note(r.partition, offset);
            self.spec_len += usize::from(new_key);
        }
        Ok(outcome)
    }

    /// Before a new key is added: at the cap, evicts the least recently
    /// active keys (none of them `r`'s, none with records in flight) or
    /// refuses. `Err` is what the submit comes to instead.
    fn make_room(&mut self, hash: u64, r: &AppendRequest) -> Result<(), Submit> {
        let Some(cap) = self.life.cap else {
            return Ok(());
        };
        if self.spec_len < cap {
            return Ok(());
        }
        if self.life.refuse {
            return Err(Submit::Refused(Error::TooManyProducers { max: cap }));
        }
        // A pass evicts a batch; more if the cap was lowered since the
        // table filled.
        let n = Life::evict_batch(cap).max(self.spec_len + 1 - cap);
        let mut order = self.keys.order.take().unwrap_or_default();
        // Buffered, and no snapshot needing the victims' states as they
        // were: removed from the table as they are found (their records
        // and the filter follow in `log_removal`).
        let at_once = !self.life.always && self.keys.capture.is_none();
        let Keys {
            shards, overlay, ..
        } = &mut self.keys;
        let excluded = |h: u64, id: &ProducerId, p: i32| {
            (h == hash && *id == r.producer_id && p == r.partition)
                || (!overlay.is_empty()
                    && overlay
                        .find(h, |q| q.partition == p && q.id == *id)
                        .is_some())
        };
        let victims = if at_once {
            order.remove_victims(shards, n, excluded)
        } else {
            order.victims(shards, n, excluded)
        };
        self.keys.order = Some(order);
        if victims.is_empty() {
            // Every key is in flight: wait for them.
            return Err(match self.log.last_queued() {
                Some((group, pos)) => Submit::Wait { group, pos },
                None => Submit::Refused(Error::Internal(
                    "a full table has no key to evict and none in flight",
                )),
            });
        }
        self.life_stats.evicted += victims.len() as u64;
        self.log_removal_of(RemoveReason::Evicted, victims, at_once);
        Ok(())
    }

    /// Logs the removal of `keys` (a record per 64 KiB of keys) and
    /// applies it: at once (buffered policies) or once durable (`Always`,
    /// the keys' speculative states removed meanwhile). Returns the last
    /// record's position.
    pub(super) fn log_removal(
        &mut self,
        reason: RemoveReason,
        keys: Vec<(u64, ProducerId, i32)>,
    ) -> u64 {
        self.log_removal_of(reason, keys, false)
    }

    /// [`State::log_removal`]; `removed`: the buffered policies only, the
    /// keys are already gone from the table (`Order::remove_victims`), and
    /// no snapshot is capturing.
    fn log_removal_of(
        &mut self,
        reason: RemoveReason,
        keys: Vec<(u64, ProducerId, i32)>,
        removed: bool,
    ) -> u64 {
        let encode = |b: &mut Vec<u8>, keys: &[(u64, ProducerId, i32)]| {
            op::encode_removes(b, reason, keys.iter().map(|(_, id, p)| (id, *p)))
        };
        let of = |(_, _, p): &(u64, ProducerId, i32)| *p;
        self.log_chunks((keys, of), encode, |st, chunk, pos, group| {
            if st.life.always {
                for (hash, id, p) in &chunk {
                    let removed_as = (!reason.in_group()).then_some(reason);
                    st.keys
                        .set_spec((*hash, id, *p), None, removed_as, (pos, group));
                }
                st.spec_len -= chunk.len();
                st.log.queue(Queued::Remove {
                    reason,
                    keys: chunk,
                    pos,
                });
                return;
            }
            // The filter first, in a loop of its own: its blocks' cache
            // misses overlap, where between two table removals they would
            // not.
            if remembered(reason) {
                st.keys
                    .meta
                    .filter
                    .insert_all(chunk.iter().map(|(hash, _, _)| *hash));
            }
            if removed {
                st.spec_len -= chunk.len();
                return;
            }
            let mut hashes = [0u64; WARM_CHUNK];
            for part in chunk.chunks(WARM_CHUNK) {
                // Bring their slots in first: their cache misses overlap
                // (see `Shards::warm_hashes`).
                for (h, (hash, _, _)) in hashes.iter_mut().zip(part) {
                    *h = *hash;
                }
                st.keys
                    .shards
                    .warm_hashes(hashes.get(..part.len()).unwrap_or_default());
                for (hash, id, p) in part {
                    st.keys.save_pre_image(*hash, id, *p, pos);
                    if st.keys.forget(*hash, id, *p) {
                        st.spec_len -= 1;
                    }
                }
            }
        })
    }

    /// Logs `items` as the records `encode` writes (it says how many items
    /// each record holds), then hands each record's items to `each` with
    /// the record's position and group; returns the last record's
    /// position.
    fn log_chunks<T>(
        &mut self,
        (items, partition_of): (Vec<T>, fn(&T) -> i32),
        encode: impl FnOnce(&mut Vec<u8>, &[T]) -> Vec<usize>,
        mut each: impl FnMut(&mut State, Vec<T>, u64, u64),
    ) -> u64 {
        let before = self.log.buffered();
        let (first, counts) = self.log.push_marked_op(
            |b| {
                let c = encode(b, &items);
                (c.len() as u64, c)
            },
            |reach, last| {
                for item in &items {
                    reach.touch(partition_of(item), last);
                }
            },
        );
        self.counted(before, counts.len() as u64);
        let group = self.log.group();
        let mut items = items.into_iter();
        let mut pos = first;
        for (i, n) in counts.iter().enumerate() {
            pos = first + i as u64;
            let chunk: Vec<T> = items.by_ref().take(*n).collect();
            each(self, chunk, pos, group);
        }
        pos
    }

    /// Logs key states (a record per 64 KiB) and applies them, like
    /// [`State::log_removal`].
    pub(super) fn log_sets(&mut self, entries: Vec<(u64, ProducerInfo)>) -> u64 {
        let encode = |b: &mut Vec<u8>, entries: &[(u64, ProducerInfo)]| {
            op::encode_sets(b, entries.iter().map(|(_, i)| i))
        };
        let of = |(_, info): &(u64, ProducerInfo)| info.partition;
        self.log_chunks((entries, of), encode, |st, chunk, pos, group| {
            if st.life.always {
                for (hash, info) in &chunk {
                    let (was, _) = st.keys.spec(*hash, &info.producer_id, info.partition);
                    st.spec_len += usize::from(was.is_none());
                    let state = Some((info.entry, info.last_activity));
                    st.keys.set_spec(
                        (*hash, &info.producer_id, info.partition),
                        state,
                        None,
                        (pos, group),
                    );
                }
                st.log.queue(Queued::Set {
                    entries: chunk,
                    pos,
                });
                return;
            }
            for (hash, info) in &chunk {
                st.keys
                    .save_pre_image(*hash, &info.producer_id, info.partition, pos);
                let k = HashedKey::hashed(*hash, &info.producer_id, info.partition);
                let new = st.keys.install(k, &info.entry, info.last_activity);
                st.spec_len += usize::from(new);
            }
        })
    }

    /// Logs an atomic group: the group record, then what `members` logs
    /// (removals and key states, `count` records of them), then the
    /// group's own effect. All of it is queued under this one lock hold,
    /// so it is written in one write. Returns the last position.
    pub(super) fn log_group(
        &mut self,
        (kind, arg, partition): (GroupKind, i64, Option<i32>),
        removals: (RemoveReason, Vec<(u64, ProducerId, i32)>),
        sets: Vec<(u64, ProducerInfo)>,
    ) -> u64 {
        // How many records the members take: encode them once to count.
        let mut scratch = Vec::new();
        let (reason, removed) = removals;
        let members = op::encode_removes(
            &mut scratch,
            reason,
            removed.iter().map(|(_, id, p)| (id, *p)),
        )
        .len()
            + op::encode_sets(&mut scratch, sets.iter().map(|(_, i)| i)).len();
        let before = self.log.buffered();
        let (mut last, ()) = self.log.push_marked_op(
            |b| {
                op::encode_group(b, kind, members as u32, arg);
                (1, ())
            },
            |reach, last| reach.group(kind, arg, members as u32, last),
        );
        self.counted(before, 1);
        if !removed.is_empty() {
            last = self.log_removal(reason, removed);
        }
        if !sets.is_empty() {
            last = self.log_sets(sets);
        }
        if self.life.always {
            self.log.queue(Queued::GroupDone {
                kind,
                arg,
                partition,
            });
        } else {
            self.keys.group_done(kind, arg, partition);
        }
        last
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
        let appends = items
            .iter()
            .filter(|q| matches!(q, Queued::Append { .. }))
            .count();
        self.answered[0] += appends as u64;
        self.keys.apply_durable(items);
    }

    fn discard_in_flight(&mut self) {
        self.keys.overlay.clear();
        self.keys.kafka_in_flight.clear();
        self.spec_len = self.keys.shards.len();
        self.spec_clock = self.keys.meta.clock;
    }

    fn after_group(&mut self) -> bool {
        self.note_snapshot_due()
    }

    fn removed_keys(&self) -> (u64, u64) {
        (self.life_stats.expired, self.life_stats.evicted)
    }

    fn live_keys(&self) -> usize {
        self.keys.shards.len()
    }
}
