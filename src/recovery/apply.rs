//! Applying the records replay decodes to the state, on one thread or two.
//!
//! What reaches here is per key: an append (with the activity and rule-1
//! policy it takes), a key removed, a key set to a state. What is not per
//! key (the log clock, the removed-key filter, the highest offset, atomic
//! groups, truncation's skipping) is decided in log order by the replay
//! that feeds these sinks ([`crate::recovery`]'s `Replayer`).
//!
//! Replaying a long log into a large state is bound by cache misses: every
//! record looks its key up in a table far bigger than the caches. Two
//! things help. Records are applied in batches, each first looked up in a
//! branch-light pass whose misses the CPU overlaps, so the apply loop finds
//! its slots in cache. And, on a machine with a second core, a helper
//! thread applies the records of most shards while the replaying thread
//! decodes the next batch and applies the rest: shards are disjoint, and
//! each key's records stay in log order within its shard.
//!
//! The two differ in what a record that does not apply (a log that does not
//! belong to its snapshot) leaves behind. [`Sequential`] stops at it and
//! says where it is, so recovery can report its offset or cut its plan
//! before it. [`Parallel`] may already have applied later records of other
//! shards, so it only says that something failed. Either way the state
//! holds more than the history recovery keeps (the appends of the record
//! before the failing one, or later ones), and recovery replays its
//! shortened plan again from a fresh base.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::Scope;

use crate::batch::AppendRequest;
use crate::engine::info::ProducerInfo;
use crate::engine::map::{Activity, Apply};
use crate::engine::shards::{KeyTarget, SHARDS, Shards, ShardsPart};
use crate::error::{Corruption, Error, Result};
use crate::id::ProducerId;
use crate::recovery::report::Damage;

/// What a replayed record does to one key.
pub(crate) enum KeyOp {
    /// An append, applied with this activity and rule-1 policy; it must be
    /// accepted (unless the sink drops what does not apply).
    Append(AppendRequest, Apply<Activity>),
    /// The key is removed (nothing if it has no state).
    Remove(ProducerId, i32),
    /// The key is set to this state (boxed: rare, and a record's size is
    /// what a replay batch moves).
    Set(Box<ProducerInfo>),
}

impl KeyOp {
    fn key(&self) -> (&ProducerId, i32) {
        match self {
            KeyOp::Append(r, _) => (&r.producer_id, r.partition),
            KeyOp::Remove(id, p) => (id, *p),
            KeyOp::Set(i) => (&i.producer_id, i.partition),
        }
    }
}

/// A decoded operation on one key.
pub(crate) struct Rec {
    /// Its log position.
    pub pos: u64,
    /// The offset of its record in the segment.
    pub at: u64,
    /// Its index among the appends of its record.
    pub nth: u32,
    pub hash: u64,
    pub op: KeyOp,
}

/// Applies one operation; false if an append was not accepted.
#[inline]
fn apply_one(
    target: &mut impl KeyTarget,
    rec: &Rec,
) -> std::result::Result<(), crate::outcome::BatchOutcome> {
    match &rec.op {
        KeyOp::Append(r, how) => {
            let o = target.apply(rec.hash, r, *how);
            if o.is_accepted() { Ok(()) } else { Err(o) }
        }
        KeyOp::Remove(id, p) => {
            target.remove(rec.hash, id, *p);
            Ok(())
        }
        KeyOp::Set(i) => {
            target.install_info(rec.hash, i);
            Ok(())
        }
    }
}

/// Looks every key of `recs` up once before they are applied (see
/// [`crate::engine::shards::warm`]).
#[inline]
fn warm(recs: &[Rec], target: &impl KeyTarget) {
    let found = recs
        .iter()
        .filter(|r| {
            let (id, p) = r.op.key();
            target.contains(r.hash, id, p)
        })
        .count();
    std::hint::black_box(found);
}

/// Records decoded before they are applied, sequentially.
const BATCH: usize = 256;

/// Records looked up ahead of applying them (see [`warm`]): a whole batch
/// of 16K records looked up at once no longer fits L2 by the time the
/// apply loop comes back to its first slots.
const WARM_CHUNK: usize = 256;

/// Records handed to the helper thread at a time.
const PARALLEL_BATCH: usize = 16 << 10;

/// Shards the replaying thread applies itself; the helper, which decodes
/// nothing, takes the rest. Measured on 1M keys and 10M records: at an
/// eighth the helper was the one waited for; 5/16 and 3/8 balance the two
/// (a quarter and 3/16 were 9% and 27% slower).
const OWN_SHARDS: usize = SHARDS * 5 / 16;

/// Where replayed records go.
pub(crate) trait Sink {
    /// Takes one record of the segment at `path`; may apply it later.
    fn push(&mut self, rec: Rec, path: &Path) -> Result<()>;
    /// Applies every record taken.
    fn drain(&mut self, path: &Path) -> Result<()>;
    /// Where an append did not apply, if one did not (once).
    fn take_failure(&mut self) -> Option<Failed>;
    /// Records applied so far.
    #[cfg(test)]
    fn applied(&self) -> u64;
}

/// An append that did not apply, as far as a sink can tell.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The append is in the record at offset `at`, whose first append has
    /// position `first`. The state holds every append before `first`, and
    /// those of the record before the one that failed.
    At {
        at: u64,
        first: u64,
        /// What the failing append's position and the rules' answer were.
        damage: Damage,
    },
    /// Somewhere: the state may also hold later appends of other shards.
    Somewhere,
}

/// Applies records one batch at a time, in log order, stopping at the
/// first that does not apply (or, dropping, passing over it).
pub(crate) struct Sequential<'a> {
    shards: &'a mut Shards,
    batch: Vec<Rec>,
    failed: Option<Failed>,
    applied: u64,
    /// Appends that do not apply are dropped, not a failure (truncation's
    /// replay: an append whose key lost earlier appends).
    drop: bool,
}

impl<'a> Sequential<'a> {
    pub(crate) fn new(shards: &'a mut Shards) -> Self {
        Sequential {
            shards,
            batch: Vec::with_capacity(BATCH),
            failed: None,
            applied: 0,
            drop: false,
        }
    }

    /// A sink that drops appends that do not apply.
    pub(crate) fn dropping(shards: &'a mut Shards) -> Self {
        Sequential {
            drop: true,
            ..Sequential::new(shards)
        }
    }
}

impl Sink for Sequential<'_> {
    fn push(&mut self, rec: Rec, path: &Path) -> Result<()> {
        self.batch.push(rec);
        if self.batch.len() == BATCH {
            self.drain(path)?;
        }
        Ok(())
    }

    fn drain(&mut self, path: &Path) -> Result<()> {
        let shards = &mut *self.shards;
        warm(&self.batch, shards);
        for rec in self.batch.drain(..) {
            if let Err(outcome) = apply_one(shards, &rec) {
                if self.drop {
                    continue;
                }
                let kind = Corruption::RecordDoesNotApply {
                    position: rec.pos,
                    outcome,
                };
                self.failed = Some(Failed::At {
                    at: rec.at,
                    first: rec.pos - u64::from(rec.nth),
                    damage: Damage::new(path, rec.at, kind.clone()),
                });
                return Err(Error::corrupt(path, rec.at, kind));
            }
            self.applied += 1;
        }
        Ok(())
    }

    fn take_failure(&mut self) -> Option<Failed> {
        self.failed.take()
    }

    #[cfg(test)]
    fn applied(&self) -> u64 {
        self.applied
    }
}

/// Applies records of `part`'s shards, in order; false if one did not
/// apply (unless `drop`: then it is passed over).
fn apply_part(part: &mut ShardsPart<'_>, batch: &[Rec], drop: bool) -> bool {
    for chunk in batch.chunks(WARM_CHUNK) {
        warm(chunk, part);
        for r in chunk {
            if apply_one(part, r).is_err() && !drop {
                return false;
            }
        }
    }
    true
}

/// Applies records on two threads: a helper applies most shards while the
/// caller decodes the next batch and applies the others. Records are
/// sorted to their thread as they arrive, so neither reads the other's.
pub(crate) struct Parallel<'a> {
    own: ShardsPart<'a>,
    /// Records of the caller's shards, applied at each hand-off.
    mine: Vec<Rec>,
    /// Records of the helper's shards, handed over `PARALLEL_BATCH` at a
    /// time.
    theirs: Vec<Rec>,
    /// A buffer the helper gave back, for the next batch.
    spare: Option<Vec<Rec>>,
    to_helper: Option<SyncSender<Vec<Rec>>>,
    from_helper: Receiver<(Vec<Rec>, bool)>,
    /// Whether the helper is working on a batch.
    in_flight: bool,
    ok: bool,
    applied: u64,
    drop: bool,
}

impl<'a> Parallel<'a> {
    /// Splits `shards` and starts the helper in `scope`; it ends when the
    /// sink is dropped. With `drop`, appends that do not apply are passed
    /// over (see [`Sequential::dropping`]).
    pub(crate) fn new<'scope>(
        scope: &'scope Scope<'scope, '_>,
        shards: &'a mut Shards,
        drop: bool,
    ) -> Self
    where
        'a: 'scope,
    {
        let (own, mut theirs) = shards.split_mut(OWN_SHARDS);
        let (to_helper, work) = sync_channel::<Vec<Rec>>(1);
        let (done, from_helper) = sync_channel(1);
        scope.spawn(move || {
            let mut ok = true;
            for batch in work {
                ok = ok && apply_part(&mut theirs, &batch, drop);
                if done.send((batch, ok)).is_err() {
                    return;
                }
            }
        });
        Parallel {
            own,
            mine: Vec::with_capacity(PARALLEL_BATCH),
            theirs: Vec::with_capacity(PARALLEL_BATCH),
            spare: None,
            to_helper: Some(to_helper),
            from_helper,
            in_flight: false,
            ok: true,
            applied: 0,
            drop,
        }
    }

    /// Waits for the helper's batch and keeps its buffer.
    fn settle(&mut self) {
        if !std::mem::take(&mut self.in_flight) {
            return;
        }
        match self.from_helper.recv() {
            Ok((mut batch, ok)) => {
                self.ok &= ok;
                batch.clear();
                self.spare = Some(batch);
            }
            Err(_) => self.ok = false,
        }
    }

    /// Hands the helper's records over and applies the caller's.
    fn hand_off(&mut self) {
        self.settle();
        if !self.theirs.is_empty() {
            let next = self
                .spare
                .take()
                .unwrap_or_else(|| Vec::with_capacity(PARALLEL_BATCH));
            let batch = std::mem::replace(&mut self.theirs, next);
            self.applied += batch.len() as u64;
            let sent = self
                .to_helper
                .as_ref()
                .is_some_and(|t| t.send(batch).is_ok());
            self.ok &= sent;
            self.in_flight = sent;
        }
        self.ok = self.ok && apply_part(&mut self.own, &self.mine, self.drop);
        self.applied += self.mine.len() as u64;
        self.mine.clear();
    }
}

impl Sink for Parallel<'_> {
    fn push(&mut self, rec: Rec, _path: &Path) -> Result<()> {
        // Either side full hands off: memory stays bounded whichever
        // shards the keys fall in.
        let full = if self.own.owns(rec.hash) {
            self.mine.push(rec);
            self.mine.len()
        } else {
            self.theirs.push(rec);
            self.theirs.len()
        };
        if full == PARALLEL_BATCH {
            self.hand_off();
        }
        Ok(())
    }

    fn drain(&mut self, path: &Path) -> Result<()> {
        self.hand_off();
        self.settle();
        if self.ok {
            Ok(())
        } else {
            // Not a prefix: the caller replays again, sequentially.
            Err(Error::corrupt(
                path,
                0,
                Corruption::BadField("record that does not apply"),
            ))
        }
    }

    fn take_failure(&mut self) -> Option<Failed> {
        (!self.ok).then_some(Failed::Somewhere)
    }

    #[cfg(test)]
    fn applied(&self) -> u64 {
        self.applied
    }
}

impl Drop for Parallel<'_> {
    fn drop(&mut self) {
        // Ends the helper's loop; the scope joins it.
        self.to_helper = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::map::hash_key;

    /// An append alone in its record (records of 31 bytes).
    fn rec(pos: u64, key: u64, seq: i32) -> Rec {
        let request = AppendRequest::single(key, 0, 0, seq);
        Rec {
            pos,
            at: pos * 31,
            nth: 0,
            hash: hash_key(&request.producer_id, 0),
            op: KeyOp::Append(
                request,
                Apply {
                    unknown: crate::engine::rules::UnknownProducer::RequireZero,
                    x: Activity::new(pos as i64),
                },
            ),
        }
    }

    /// Records for 100 keys, 3 each in order; `gap` (if any) skips a sequence.
    fn history(gap: Option<u64>) -> Vec<Rec> {
        history_of(100, 3, gap)
    }

    /// Records for `keys` keys, `each` each, round-robin; `gap` (if any)
    /// skips a sequence at that position.
    fn history_of(keys: u64, each: u64, gap: Option<u64>) -> Vec<Rec> {
        (0..keys * each)
            .map(|i| rec(i, i % keys, (i / keys) as i32 + i32::from(Some(i) == gap)))
            .collect()
    }

    fn same_state(one: &Shards, two: &Shards) {
        for i in 0..SHARDS {
            let mut a: Vec<_> = one.shard(i).iter_full().collect();
            let mut b: Vec<_> = two.shard(i).iter_full().collect();
            a.sort_by_key(|(id, p, _, _)| (id.as_numeric(), *p));
            b.sort_by_key(|(id, p, _, _)| (id.as_numeric(), *p));
            assert_eq!(a, b, "shard {i}");
        }
    }

    fn run(sink: &mut dyn Sink, recs: Vec<Rec>) -> Result<()> {
        let path = Path::new("x.wal");
        for r in recs {
            sink.push(r, path)?;
        }
        sink.drain(path)
    }

    #[test]
    fn both_sinks_apply_a_history_alike() {
        let mut one = Shards::default();
        let mut two = Shards::default();
        run(&mut Sequential::new(&mut one), history(None)).unwrap();
        std::thread::scope(|s| {
            let mut sink = Parallel::new(s, &mut two, false);
            run(&mut sink, history(None)).unwrap();
            assert_eq!(sink.applied(), 300);
        });
        assert_eq!(one.len(), 100);
        same_state(&one, &two);
    }

    #[test]
    fn the_parallel_sink_applies_many_batches_like_the_sequential_one() {
        // 60,000 records: the helper gets several full batches (and reuses
        // their buffers), the caller its share in between.
        let (keys, each) = (1_000, 60);
        let mut one = Shards::default();
        let mut two = Shards::default();
        run(&mut Sequential::new(&mut one), history_of(keys, each, None)).unwrap();
        std::thread::scope(|s| {
            let mut sink = Parallel::new(s, &mut two, false);
            run(&mut sink, history_of(keys, each, None)).unwrap();
            assert_eq!(sink.applied(), keys * each);
        });
        assert_eq!(two.len() as u64, keys);
        same_state(&one, &two);
        for k in 0..keys {
            let id = crate::id::ProducerId::numeric(k);
            let e = two.get(hash_key(&id, 0), &id, 0).unwrap();
            assert_eq!(e.last_sequence() as u64, each - 1, "key {k}");
        }
        // Keys all in the caller's shards: it hands off at a full batch
        // of its own too, so memory stays bounded (found by review: it
        // held a whole segment's records).
        let mut four = Shards::default();
        std::thread::scope(|s| {
            let mut sink = Parallel::new(s, &mut four, false);
            let own: Vec<u64> = (0..10_000u64)
                .filter(|&k| {
                    sink.own
                        .owns(hash_key(&crate::id::ProducerId::numeric(k), 0))
                })
                .take(10)
                .collect();
            assert_eq!(own.len(), 10);
            let path = Path::new("x.wal");
            for i in 0..(3 * PARALLEL_BATCH as u64) {
                let key = own[(i % 10) as usize];
                sink.push(rec(i, key, (i / 10) as i32), path).unwrap();
                assert!(sink.mine.len() < PARALLEL_BATCH);
            }
            sink.drain(path).unwrap();
            assert_eq!(sink.applied(), 3 * PARALLEL_BATCH as u64);
        });
        assert_eq!(four.len(), 10);
        // A record that does not apply in a late batch fails it too.
        let mut three = Shards::default();
        std::thread::scope(|s| {
            let mut sink = Parallel::new(s, &mut three, false);
            assert!(run(&mut sink, history_of(keys, each, Some(55_555))).is_err());
        });
    }

    #[test]
    fn a_dropping_sink_passes_over_what_does_not_apply_and_applies_removals_and_states() {
        let mut one = Shards::default();
        let mut recs = history(Some(150));
        // Key 7 removed at the end; key 1000 set.
        let id = crate::id::ProducerId::numeric(7);
        recs.push(Rec {
            pos: 300,
            at: 0,
            nth: 0,
            hash: hash_key(&id, 0),
            op: KeyOp::Remove(id.clone(), 0),
        });
        let set = ProducerInfo {
            producer_id: crate::id::ProducerId::numeric(1000),
            partition: 0,
            entry: crate::engine::entry::ProducerEntry::start(3, 0, 9, None),
            last_activity: 42,
        };
        recs.push(Rec {
            pos: 301,
            at: 0,
            nth: 0,
            hash: hash_key(&set.producer_id, 0),
            op: KeyOp::Set(Box::new(set.clone())),
        });
        let mut sink = Sequential::dropping(&mut one);
        run(&mut sink, recs).unwrap();
        assert_eq!(sink.take_failure(), None);
        // Key 50's append 150 skipped a sequence, so its 250 did not apply
        // either: key 50 stayed at 0.
        let k50 = crate::id::ProducerId::numeric(50);
        assert_eq!(
            one.get(hash_key(&k50, 0), &k50, 0)
                .map(|e| e.last_sequence()),
            Some(0)
        );
        assert_eq!(one.get(hash_key(&id, 0), &id, 0), None);
        let h = hash_key(&set.producer_id, 0);
        assert_eq!(one.get_full(h, &set.producer_id, 0), Some((set.entry, 42)));
        assert_eq!(one.len(), 100);
    }

    #[test]
    fn a_record_that_does_not_apply_stops_one_exactly_and_fails_the_other() {
        let mut one = Shards::default();
        let e = run(&mut Sequential::new(&mut one), history(Some(150))).unwrap_err();
        assert!(matches!(
            e,
            Error::Corrupt { offset, kind: Corruption::RecordDoesNotApply { position: 150, .. }, .. }
                if offset == 150 * 31
        ));
        let mut two = Shards::default();
        std::thread::scope(|s| {
            let mut sink = Parallel::new(s, &mut two, false);
            assert!(run(&mut sink, history(Some(150))).is_err());
            // It cannot say where: recovery replays again, sequentially.
            assert_eq!(sink.take_failure(), Some(Failed::Somewhere));
        });
    }

    #[test]
    fn an_append_that_fails_inside_a_record_names_the_records_first_append() {
        // Records of ten appends each: the failing append is the 1st of
        // the record at position 150, then the 6th of that at 150.
        let packed = |gap| -> Vec<Rec> {
            history(Some(gap))
                .into_iter()
                .map(|r| Rec {
                    at: r.pos / 10 * 1000,
                    nth: (r.pos % 10) as u32,
                    ..r
                })
                .collect()
        };
        let failed_at = |f: Option<Failed>| match f {
            Some(Failed::At { at, first, damage }) => (at, first, damage),
            other => panic!("{other:?}"),
        };
        let mut one = Shards::default();
        let mut sink = Sequential::new(&mut one);
        assert!(run(&mut sink, packed(150)).is_err());
        let (at, first, _) = failed_at(sink.take_failure());
        assert_eq!((at, first), (15_000, 150));
        assert_eq!(sink.applied(), 150);

        let mut one = Shards::default();
        let mut sink = Sequential::new(&mut one);
        let e = run(&mut sink, packed(155)).unwrap_err();
        assert!(matches!(e, Error::Corrupt { offset: 15_000, .. }));
        // The state holds part of the record: appends 150..155.
        assert_eq!(sink.applied(), 155);
        let (at, before, damage) = failed_at(sink.take_failure());
        assert_eq!((at, before), (15_000, 150));
        // What recovery reports: the failing append, the rules' answer.
        assert_eq!(damage.offset, 15_000);
        assert!(
            matches!(
                damage.kind,
                Corruption::RecordDoesNotApply {
                    position: 155,
                    outcome: crate::outcome::BatchOutcome::OutOfOrder { .. },
                }
            ),
            "{:?}",
            damage.kind
        );
        assert_eq!(sink.take_failure(), None, "taken once");

        // The replay again stops before the record (recovery's plan ends
        // there): the state is the appends before it.
        let mut again = Shards::default();
        let mut sink = Sequential::new(&mut again);
        let to_cut: Vec<Rec> = packed(155).into_iter().filter(|r| r.pos < before).collect();
        run(&mut sink, to_cut).unwrap();
        assert_eq!(sink.take_failure(), None);
        assert_eq!(sink.applied(), 150);
        // Keys 0..50 have two appends each, 50..100 one: 150 in all.
        let total: u64 = (0..100u64)
            .map(|k| {
                let id = crate::id::ProducerId::numeric(k);
                let h = hash_key(&id, 0);
                again
                    .get(h, &id, 0)
                    .map_or(0, |e| e.last_sequence() as u64 + 1)
            })
            .sum();
        assert_eq!(total, 150);
    }
}
