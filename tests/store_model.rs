//! The durable store against the reference model: random appends (single
//! and batch), snapshots, clean reopens and crashes with random crash
//! images, and the lifecycle: the clock moving, expiration sweeps, a table
//! bounded by a small cap (evicting, or refusing new keys), the
//! unknown-producer policy switched at reopens, partition removal,
//! truncation (batches take growing offsets, as a partition's log gives
//! them; single-sequence appends count at their log position). A crash
//! strikes a few IO operations after it is scheduled, so it lands inside
//! appends, sweeps, snapshots and segment rolls, and the run goes on with
//! the recovered store (a torn tail that recovery did not cut would
//! surface at the next recovery). `append_all` calls of up to 80 requests
//! (built in order against the model, so a call holds retries and
//! fencings of its own earlier requests) must give the outcomes of the
//! same appends one by one, except that under `Always` a full table never
//! evicts a key the call has in flight (the model knows when the call
//! waits). The model says exactly which keys an eviction or a sweep
//! removes, and every key's last activity.
//!
//! Under `FsyncPolicy::Always` the state after any reopen is exactly the
//! acknowledged operations plus at most the one in flight (a sweep in
//! flight may have removed some of its keys: it is logged shard by shard);
//! under `Never` a crash may lose a suffix, so the state must be the model
//! after some prefix of the operations since the last sync (and never
//! anything else).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::model::{HistOp, Key, Model, ModelConfig, ModelEntry, TruncateError, same_info};
use common::ops::{Op, Seq, op, request};
use common::store_util::{diff, dir, matches, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AppendRequest, AtCapacity, Batch, Error, FsyncPolicy, ManualClock, ProducerStateStore,
    StoreOptions, UnknownProducer,
};
use proptest::prelude::*;

/// Keys expire after this long without an accepted append.
const EXPIRATION_MS: i64 = 1_000;

#[derive(Clone, Debug)]
enum Step {
    Append(Op),
    AppendAll(Vec<Op>),
    Snapshot,
    /// Reopen; `true`: with the other unknown-producer policy.
    Reopen(bool),
    /// Crash `k` IO operations from now, leaving this kind of image.
    Crash(u8, u8, u64),
    /// The clock moves forward this many milliseconds.
    Tick(u16),
    Expire,
    RemovePartition(u8),
    /// `truncate_to(high + 1 - back)` (255: one above the end).
    Truncate(u8),
    /// `truncate_partition_to(partition, its end - back)` (255: one above
    /// its end).
    TruncatePartition(u8, u8),
    /// Export a partition, try to import it back (a conflict), remove it,
    /// import it back.
    Move(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        80 => op().prop_map(Step::Append),
        5 => prop::collection::vec(op(), 1..80).prop_map(Step::AppendAll),
        3 => Just(Step::Snapshot),
        3 => any::<bool>().prop_map(Step::Reopen),
        4 => (0u8..8, 0u8..4, any::<u64>()).prop_map(|(k, m, s)| Step::Crash(k, m, s)),
        8 => (0u16..700).prop_map(Step::Tick),
        3 => Just(Step::Expire),
        1 => (0u8..3).prop_map(Step::RemovePartition),
        3 => prop_oneof![10 => 0u8..40, 1 => Just(255u8)].prop_map(Step::Truncate),
        3 => (0u8..3, prop_oneof![10 => 0u8..40, 1 => Just(255u8)])
            .prop_map(|(p, back)| Step::TruncatePartition(p, back)),
        1 => (0u8..3).prop_map(Step::Move),
    ]
}

/// What a crash under `Never` may leave: a state the model passed
/// through, or one a sweep passed through (the state before it, less some
/// of the keys it removed: one removal record per shard).
#[derive(Clone, Debug)]
enum Possible {
    Exact(Model),
    Partial { before: Model, removed: Vec<Key> },
}

impl Possible {
    /// The model this store state is, if it is one of these.
    fn matching(&self, store: &ProducerStateStore) -> Option<Model> {
        match self {
            Possible::Exact(m) => at(store, m).then(|| m.clone()),
            Possible::Partial { before, removed } => partial(store, before, removed),
        }
    }
}

/// Whether the store is exactly at the model: its keys, and where its log
/// ends (the model of an earlier prefix can hold the same keys).
fn at(store: &ProducerStateStore, m: &Model) -> bool {
    matches(store, m)
        && store.end_offset() == m.high + 1
        && store.next_position() == m.next_pos
        && (0..3).all(|p| store.partition_end_offset(p) == m.partition_end(p))
}

/// The store's state as `before` less some of `removed`, if it is that.
fn partial(store: &ProducerStateStore, before: &Model, removed: &[Key]) -> Option<Model> {
    let mut m = before.clone();
    let mut gone = Vec::new();
    for k in removed {
        if store.get(k.0.clone(), k.1).is_none() {
            m.keys.remove(k);
            m.removed.insert(k.clone());
            gone.push(k.clone());
        }
    }
    // A sweep logs one record per shard: where the log ends is known only
    // within bounds. Every record of `before` must be there (at least its
    // position): a state that merely holds the same keys (a partition
    // removed and imported back, the move lost in the crash) is an earlier
    // prefix with another history, which truncation would replay
    // differently. Each removed key surviving takes at most one record
    // (its shard's), and at least one survived if any did.
    let pos = store.next_position();
    let records = pos.checked_sub(before.next_pos);
    let fits = match records {
        Some(0) => gone.is_empty(),
        Some(n) => !gone.is_empty() && n <= gone.len() as u64,
        None => false,
    };
    if !gone.is_empty() {
        m.history.push(HistOp::Remove(gone));
    }
    (fits && matches(store, &m) && store.end_offset() == m.high + 1).then(|| {
        m.next_pos = pos;
        m
    })
}

struct Run {
    policy: FsyncPolicy,
    fs: SimFs,
    clock: ManualClock,
    config: ModelConfig,
    store: Option<ProducerStateStore>,
    model: Model,
    /// What a crash may leave under `Never`: the states since everything
    /// was last durable.
    since_sync: Vec<Possible>,
    /// The image a pending crash leaves.
    image: (u8, u64),
    /// The log offset the next batch takes: batches get offsets as a
    /// partition's log gives them, growing, so that truncation cuts
    /// suffixes of histories (retries keep their original offset).
    next_offset: i64,
}

impl Run {
    fn opts(&self, fs: &SimFs) -> StoreOptions {
        let c = self.config;
        sim_opts(fs)
            .fsync(self.policy)
            .segment_size(2048)
            .snapshot_every_records(Some(60))
            .clock(Arc::new(self.clock.clone()))
            .producer_expiration(Some(Duration::from_millis(EXPIRATION_MS as u64)))
            .max_producers(c.cap)
            .at_capacity(if c.refuse {
                AtCapacity::Refuse
            } else {
                AtCapacity::EvictLeastRecentlyUsed
            })
            .unknown_producer(if c.accept_any {
                UnknownProducer::AcceptAny
            } else {
                UnknownProducer::RequireZero
            })
    }

    fn store(&self) -> &ProducerStateStore {
        self.store.as_ref().expect("open")
    }

    /// The request of `o` against `model`, with a growing offset if it is
    /// a new batch (a retry keeps its original's).
    fn request(&mut self, o: &Op, model: &Model) -> AppendRequest {
        let r = request(o, model);
        match r.metadata() {
            Some(m) if !matches!(o.seq, Seq::Retry(_)) => {
                let offset = self.next_offset;
                self.next_offset +=
                    1 + i64::from(r.last_sequence().wrapping_sub(r.first_sequence()).max(0))
                        .min(1 << 20);
                AppendRequest::batch(
                    r.producer_id.clone(),
                    r.partition,
                    r.epoch,
                    Batch::new(r.first_sequence(), r.last_sequence(), offset, m.timestamp),
                )
            }
            _ => r,
        }
    }

    fn now(&self) -> i64 {
        producer_state::Clock::now_ms(&self.clock)
    }

    fn synced(&mut self) {
        if let Some(st) = &self.store {
            self.model.next_pos = st.next_position();
        }
        self.since_sync = vec![Possible::Exact(self.model.clone())];
    }

    fn done(&mut self) {
        self.model.next_pos = self.store().next_position();
        self.since_sync.push(Possible::Exact(self.model.clone()));
    }

    /// Appends were answered: the log passed through these states (an
    /// eviction's removal record comes before its append's).
    fn passed_through(&mut self, trace: &[Vec<Model>]) {
        self.since_sync
            .extend(trace.iter().flatten().cloned().map(Possible::Exact));
    }

    /// The machine went down: recover from the crash image and check it.
    /// `inflight`: the states the requests in flight lead through (their
    /// records were written in order: the log may hold any prefix of
    /// them); `sweep`: the keys a sweep in flight was removing (any of them
    /// may be gone); `whole`: an atomic operation in flight, the model
    /// after it (all of it or nothing survived).
    fn crashed(
        &mut self,
        step: usize,
        inflight: &[Vec<Model>],
        sweep: Option<(Model, Vec<Key>)>,
        whole: Option<Model>,
    ) -> Result<(), TestCaseError> {
        drop(self.store.take());
        let (mode, seed) = self.image;
        self.fs = self.fs.crash_image(match mode {
            0 => Unsynced::Drop,
            1 => Unsynced::Keep,
            2 => Unsynced::TornPrefix(seed),
            _ => Unsynced::Sectors(seed),
        });
        let store = ProducerStateStore::open_with(dir(), self.opts(&self.fs))
            .map_err(|e| TestCaseError::fail(format!("step {step}: recovery failed: {e}")))?;
        if self.policy == FsyncPolicy::Always {
            let mut found = at(&store, &self.model);
            for m in inflight.iter().flatten() {
                if !found && at(&store, m) {
                    self.model = m.clone();
                    found = true;
                }
            }
            if let Some((before, removed)) = &sweep
                && let Some(m) = partial(&store, before, removed)
            {
                self.model = m;
                found = true;
            }
            if let Some(after) = whole
                && at(&store, &after)
            {
                self.model = after;
                found = true;
            }
            prop_assert!(found, "step {}: {}", step, diff(&store, &self.model));
        } else {
            let mut options = self.since_sync.clone();
            options.extend(inflight.iter().flatten().cloned().map(Possible::Exact));
            if let Some((before, removed)) = sweep {
                options.push(Possible::Partial { before, removed });
            }
            if let Some(after) = whole {
                options.push(Possible::Exact(after));
            }
            let k = options.iter().rev().find_map(|p| p.matching(&store));
            prop_assert!(
                k.is_some(),
                "step {}: not a prefix: {}",
                step,
                diff(&store, &self.model)
            );
            self.model = k.unwrap_or_default();
        }
        // The store reopened with the run's options (a reopen that
        // switched the policy may have crashed).
        self.model.config = self.config;
        self.store = Some(store);
        self.synced();
        Ok(())
    }

    fn step(&mut self, i: usize, s: &Step) -> Result<(), TestCaseError> {
        let durable = self.policy == FsyncPolicy::Always;
        match s {
            Step::Append(o) => {
                let model = self.model.clone();
                let r = self.request(o, &model);
                self.model.next_pos = self.store().next_position();
                let now = self.now();
                let mut after = self.model.clone();
                let (want, trace) = after.append_all_trace(std::slice::from_ref(&r), now, durable);
                match self.store().append_request(&r) {
                    Ok(got) => {
                        prop_assert_eq!(Ok(got), want[0], "step {} {:?}", i, r);
                        self.model = after;
                        self.passed_through(&trace);
                    }
                    Err(Error::TooManyProducers { .. }) => {
                        prop_assert!(want[0].is_err(), "step {}: refused {:?}", i, r);
                    }
                    Err(_) if self.fs.crashed() => self.crashed(i, &trace, None, None)?,
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::AppendAll(ops) => {
                let mut scratch = self.model.clone();
                let reqs: Vec<AppendRequest> = ops
                    .iter()
                    .map(|o| {
                        let r = self.request(o, &scratch);
                        let _ = scratch.try_append_at(&r, 0, &HashSet::new());
                        r
                    })
                    .collect();
                let now = self.now();
                self.model.next_pos = self.store().next_position();
                let out = self.store().append_all(&reqs);
                prop_assert_eq!(out.len(), reqs.len());
                // Answered requests come first in log order; from the first
                // error other than a refusal (a crash), the rest are in
                // flight.
                let answered = out
                    .iter()
                    .take_while(|o| matches!(o, Ok(_) | Err(Error::TooManyProducers { .. })))
                    .count();
                let mut model = self.model.clone();
                let (want, trace) = model.append_all_trace(&reqs, now, durable);
                for (j, (got, w)) in out.iter().zip(&want).take(answered).enumerate() {
                    match (got, w) {
                        (Ok(g), Ok(w)) => prop_assert_eq!(g, w, "step {} request {}", i, j),
                        (Err(Error::TooManyProducers { .. }), Err(_)) => {}
                        _ => prop_assert!(false, "step {} request {}: {:?} {:?}", i, j, got, w),
                    }
                }
                if answered < reqs.len() {
                    prop_assert!(self.fs.crashed(), "step {}: {:?}", i, out[answered]);
                    if answered > 0 {
                        self.model = trace[answered - 1].last().cloned().unwrap_or_default();
                    }
                    self.crashed(i, &trace[answered..], None, None)?;
                } else {
                    self.model = model;
                    self.passed_through(&trace);
                }
            }
            Step::Snapshot => match self.store().snapshot() {
                Ok(_) => self.synced(),
                Err(_) if self.fs.crashed() => self.crashed(i, &[], None, None)?,
                Err(e) => prop_assert!(false, "step {}: {}", i, e),
            },
            Step::Reopen(toggle) => {
                let closed = self.store.take().expect("open").close();
                if self.fs.crashed() {
                    return self.crashed(i, &[], None, None);
                }
                prop_assert!(closed.is_ok(), "step {}: {:?}", i, closed);
                if *toggle {
                    self.config.accept_any = !self.config.accept_any;
                    self.model.config = self.config;
                }
                // Opening writes too (it fsyncs the log it continues), so a
                // scheduled crash may strike there.
                let store = match ProducerStateStore::open_with(dir(), self.opts(&self.fs)) {
                    Ok(s) => s,
                    Err(_) if self.fs.crashed() => return self.crashed(i, &[], None, None),
                    Err(e) => return Err(TestCaseError::fail(format!("step {i}: reopen: {e}"))),
                };
                prop_assert!(
                    at(&store, &self.model),
                    "step {}: {}",
                    i,
                    diff(&store, &self.model)
                );
                self.store = Some(store);
                self.synced();
            }
            Step::Crash(k, mode, seed) => {
                if !self.fs.crashed() {
                    self.fs
                        .set_fault(self.fs.ops() + u64::from(*k), Fault::Crash);
                    self.image = (*mode, *seed);
                }
            }
            Step::Tick(ms) => self.clock.advance(Duration::from_millis(u64::from(*ms))),
            Step::Expire => {
                self.model.next_pos = self.store().next_position();
                let before = self.model.clone();
                let mut after = self.model.clone();
                let n = after.expire(self.now());
                let removed: Vec<Key> = before
                    .keys
                    .keys()
                    .filter(|k| !after.keys.contains_key(*k))
                    .cloned()
                    .collect();
                match self.store().expire_now() {
                    Ok(got) => {
                        prop_assert_eq!(got, n, "step {}", i);
                        // Its records (one per shard) may be lost in part.
                        self.since_sync.push(Possible::Partial {
                            before: before.clone(),
                            removed: removed.clone(),
                        });
                        self.model = after;
                        self.done();
                    }
                    Err(_) if self.fs.crashed() => {
                        self.crashed(i, &[], Some((before, removed)), None)?
                    }
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::Truncate(back) => {
                let end = self.model.high.saturating_add(1);
                let offset = if *back == 255 {
                    end + 1
                } else {
                    end - i64::from(*back)
                };
                self.model.next_pos = self.store().next_position();
                let mut after = self.model.clone();
                let want = after.truncate(offset);
                match self.store().truncate_to(offset) {
                    Ok(()) => {
                        prop_assert!(want.is_ok(), "step {}: {:?}", i, want);
                        prop_assert!(
                            matches(self.store(), &after),
                            "step {} truncate_to({}): {}",
                            i,
                            offset,
                            diff(self.store(), &after)
                        );
                        self.model = after;
                        self.synced();
                    }
                    Err(Error::TruncateAboveEnd { end: e, .. }) => {
                        prop_assert_eq!(
                            want,
                            Err(TruncateError::AboveEnd { end: e }),
                            "step {}",
                            i
                        );
                    }
                    Err(Error::TruncateBelowHistory { lowest, .. }) => {
                        // The model cannot say what snapshots are kept:
                        // nothing changed, and the store can reach `lowest`.
                        prop_assert!(lowest > offset, "step {}", i);
                        prop_assert!(matches(self.store(), &self.model), "step {}", i);
                    }
                    Err(_) if self.fs.crashed() => self.crashed(i, &[], None, Some(after))?,
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::TruncatePartition(p, back) => {
                let p = i32::from(*p);
                let end = self.model.partition_end(p);
                let offset = if *back == 255 {
                    end + 1
                } else {
                    end - i64::from(*back)
                };
                self.model.next_pos = self.store().next_position();
                let mut after = self.model.clone();
                let want = after.truncate_partition(p, offset);
                match self.store().truncate_partition_to(p, offset) {
                    Ok(()) => {
                        prop_assert!(want.is_ok(), "step {}: {:?}", i, want);
                        prop_assert!(
                            at(self.store(), &after),
                            "step {} truncate_partition_to({}, {}): {}",
                            i,
                            p,
                            offset,
                            diff(self.store(), &after)
                        );
                        self.model = after;
                        self.synced();
                    }
                    Err(Error::TruncateAboveEnd { end: e, .. }) => {
                        prop_assert_eq!(
                            want,
                            Err(TruncateError::AboveEnd { end: e }),
                            "step {}",
                            i
                        );
                    }
                    Err(Error::TruncateBelowHistory { lowest, .. }) => {
                        prop_assert!(lowest > offset, "step {}", i);
                        prop_assert!(matches(self.store(), &self.model), "step {}", i);
                    }
                    Err(_) if self.fs.crashed() => self.crashed(i, &[], None, Some(after))?,
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::Move(p) => {
                let p = i32::from(*p);
                self.model.next_pos = self.store().next_position();
                let export = match self.store().export_partition(p) {
                    Ok(e) => e,
                    Err(_) if self.fs.crashed() => return self.crashed(i, &[], None, None),
                    Err(e) => return Err(TestCaseError::fail(format!("step {i}: {e}"))),
                };
                let mine: Vec<(Key, ModelEntry)> = self
                    .model
                    .keys
                    .iter()
                    .filter(|((_, kp), _)| *kp == p)
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect();
                prop_assert_eq!(export.len(), mine.len(), "step {}", i);
                for info in export.iter() {
                    let m = self.model.entry(&(info.producer_id.clone(), p));
                    prop_assert!(
                        m.is_some_and(|m| same_info(info, m)),
                        "step {}: {:?}",
                        i,
                        info
                    );
                }
                if !export.is_empty() {
                    let conflict = self.store().import_partition(&export);
                    prop_assert!(
                        matches!(conflict, Err(Error::ImportConflict { .. })),
                        "step {}: {:?}",
                        i,
                        conflict
                    );
                }
                let mut removed = self.model.clone();
                removed.remove_partition(p);
                let mut after = removed.clone();
                after.import(mine);
                let moved = self
                    .store()
                    .remove_partition(p)
                    .and_then(|_| self.store().import_partition(&export));
                match moved {
                    Ok(n) => {
                        prop_assert_eq!(n, export.len(), "step {}", i);
                        // Two groups: a crash may keep the first alone.
                        self.since_sync.push(Possible::Exact(removed));
                        self.model = after;
                        self.done();
                    }
                    // Two groups: none, the first or both may be durable.
                    Err(_) if self.fs.crashed() => {
                        self.crashed(i, &[vec![removed, after]], None, None)?
                    }
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::RemovePartition(p) => {
                let p = i32::from(*p);
                self.model.next_pos = self.store().next_position();
                let mut after = self.model.clone();
                let n = after.remove_partition(p);
                match self.store().remove_partition(p) {
                    Ok(got) => {
                        prop_assert_eq!(got, n, "step {}", i);
                        self.model = after;
                        self.done();
                    }
                    Err(_) if self.fs.crashed() => self.crashed(i, &[], None, Some(after))?,
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
        }
        Ok(())
    }
}

fn config() -> impl Strategy<Value = ModelConfig> {
    (
        prop_oneof![2 => Just(None), 3 => (1usize..6).prop_map(Some)],
        prop::bool::weighted(0.2),
        any::<bool>(),
    )
        .prop_map(|(cap, refuse, accept_any)| ModelConfig {
            cap,
            refuse,
            accept_any,
            expiration_ms: Some(EXPIRATION_MS),
        })
}

fn run(steps: &[Step], policy: FsyncPolicy, config: ModelConfig) -> Result<(), TestCaseError> {
    let fs = SimFs::new();
    let mut r = Run {
        policy,
        store: None,
        clock: ManualClock::new(1_700_000_000_000),
        config,
        model: Model {
            config,
            ..Model::default()
        },
        since_sync: Vec::new(),
        image: (0, 0),
        next_offset: 0,
        fs,
    };
    r.store = Some(ProducerStateStore::open_with(dir(), r.opts(&r.fs)).unwrap());
    r.synced();
    for (i, s) in steps.iter().enumerate() {
        r.step(i, s)?;
    }
    // Whatever is pending, a final crash and recovery must hold too.
    if !r.fs.crashed() {
        r.fs.set_fault(r.fs.ops(), Fault::Crash);
    }
    r.crashed(steps.len(), &[], None, None)
}

/// The saved case `dfc1290e…` shrunk: under `Never`, a partition moved
/// onto itself (removed, imported back: the same keys) and a sweep that
/// expires nothing are lost by a crash. The recovered store holds the keys
/// it held before the move, at the position before it, so truncating to
/// offset 1 rolls key (1, 1) back to its batch at 0 (its own history). A
/// sweep's possible crash states used to be matched by keys alone, so the
/// model took the state after the move, whose truncation undoes the import
/// (offset 1 >= its highest offset, 1) and leaves the key without state.
#[test]
fn a_move_lost_in_a_crash_is_not_in_the_history_truncation_replays() {
    use common::ops::Epoch;
    // Key 3 is (1, partition 1); a batch timestamp of offset / 3: now.
    let batch = |records| {
        Step::Append(Op {
            key: 3,
            epoch: Epoch::Same,
            seq: Seq::Next,
            records,
            offset: 3 * 1_700_000_000_000,
        })
    };
    let steps = [
        batch(1),
        batch(1),
        Step::Reopen(false),
        Step::Move(1),
        Step::Expire,
        // The next IO operation crashes, dropping what was not synced.
        Step::Crash(0, 0, 0),
        Step::Snapshot,
        Step::Truncate(1),
    ];
    let config = ModelConfig {
        expiration_ms: Some(EXPIRATION_MS),
        ..ModelConfig::default()
    };
    let r = run(&steps, FsyncPolicy::Never, config);
    assert!(r.is_ok(), "{r:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_store_matches_the_model_across_reopens_and_crashes(
        steps in prop::collection::vec(step(), 150..300),
        config in config(),
    ) {
        run(&steps, FsyncPolicy::Always, config)?;
    }

    #[test]
    fn without_fsync_a_crash_loses_a_suffix_never_more(
        steps in prop::collection::vec(step(), 150..300),
        config in config(),
    ) {
        run(&steps, FsyncPolicy::Never, config)?;
    }
}
