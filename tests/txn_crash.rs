//! Generated transactional histories on a `Semantics::Kafka` store with a
//! crash at a random IO operation (SimFs), against a reference model.
//!
//! The reference is the in-memory engine under `Semantics::Kafka` (its
//! verdicts are Kafka's: tests/kafka_oracle.rs) fed the acknowledged
//! operations, plus a history to answer a truncation: the engine rebuilt
//! from the history of accepted batches and markers (reloaded, not
//! classified again, as Kafka reloads a log) with every one at or above
//! the offset left out, the KIP-890 verification states of the moment
//! kept, logged expirations removing exactly the keys they removed,
//! an earlier truncation at or above the offset passed over (below it,
//! its result taken whole). Every operation runs under
//! `FsyncPolicy::Always`, so an answer is durable: after a crash the
//! store holds exactly the acknowledged prefix, or that and the one
//! operation in flight. Checked on the way: the last stable offset of a
//! partition never moves backwards except through `truncate_to`, and
//! every acknowledged aborted transaction stays listed until a truncation
//! below its marker, a forget or the partition's removal drops it.
//!
//! Coverage, measured once with counters (1,500 cases): histories of at
//! least 10 operations, markers aimed at the oldest open transaction
//! (mostly ABORTs) and truncations that keep the old log end bring the
//! cases that crash from 42 in 97 to 816 in 1,501 (54%), and those that
//! end with an aborted transaction listed from 21 in 97 to 722 in 1,501
//! (48%).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::store_util::{dir, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AppendOptions, Batch, Clock, Error, ManualClock, Marker, MarkerOutcome, Origin,
    ProducerStateManager, ProducerStateStore, Semantics, StoreOptions,
};
use proptest::prelude::*;

const PIDS: u64 = 4;
const PARTITIONS: i32 = 2;
const EXPIRATION: i64 = 1_000;

#[derive(Clone, Copy, Debug)]
enum Op {
    Data {
        pid: u64,
        partition: i32,
        /// Added to the key's epoch.
        bump: i16,
        /// 0: next sequence; 1: a retry of the last batch; 2: a gap.
        seq: u8,
        len: i32,
        txn: bool,
    },
    Marker {
        pid: u64,
        partition: i32,
        bump: i16,
        commit: bool,
        coordinator: i32,
    },
    /// The clock moves on, then an expiration sweep.
    Expire {
        advance: i64,
    },
    RemovePartition {
        partition: i32,
    },
    /// An end marker for the producer whose transaction on the partition
    /// is the oldest open one (the first unstable offset), if any: most
    /// often an ABORT, so that aborted lists are long and often checked.
    EndOldest {
        partition: i32,
        commit: bool,
        coordinator: i32,
    },
    /// `truncate_to(log end - back)`; with `keep_end`, later batches and
    /// markers go on from the old end rather than from the offset, so
    /// offsets do not grow from the truncation and a later truncation can
    /// land between it and the old end (where replay reads batches from
    /// before the earlier truncation and the earlier truncation's group
    /// must undo them).
    Truncate {
        back: i64,
        keep_end: bool,
    },
    Forget {
        partition: i32,
        back: i64,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..PIDS, 0..PARTITIONS, prop_oneof![6 => Just(0i16), 1 => Just(1i16)],
              prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)], 0..3i32, any::<bool>())
            .prop_map(|(pid, partition, bump, seq, len, txn)| Op::Data { pid, partition, bump, seq, len, txn }),
        4 => (0..PIDS, 0..PARTITIONS, prop_oneof![4 => Just(0i16), 1 => Just(1i16)], any::<bool>(), 0..3i32)
            .prop_map(|(pid, partition, bump, commit, coordinator)| Op::Marker { pid, partition, bump, commit, coordinator }),
        1 => (0..1_500i64).prop_map(|advance| Op::Expire { advance }),
        1 => (0..PARTITIONS).prop_map(|partition| Op::RemovePartition { partition }),
        4 => (0..PARTITIONS, prop_oneof![3 => Just(false), 1 => Just(true)], 0..3i32)
            .prop_map(|(partition, commit, coordinator)| Op::EndOldest { partition, commit, coordinator }),
        1 => (0..25i64, prop_oneof![1 => Just(false), 1 => Just(true)])
            .prop_map(|(back, keep_end)| Op::Truncate { back, keep_end }),
        1 => (0..PARTITIONS, 0..25i64).prop_map(|(partition, back)| Op::Forget { partition, back }),
        1 => Just(Op::Reopen),
    ]
}

/// A concrete operation, resolved against the acknowledged state.
#[derive(Clone, Copy, Debug)]
enum Step {
    Data {
        pid: u64,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        txn: bool,
        offset: i64,
        ts: i64,
    },
    Marker {
        pid: u64,
        partition: i32,
        epoch: i16,
        marker: Marker,
    },
    Expire {
        now: i64,
    },
    RemovePartition(i32),
    Truncate(i64),
    Forget(i32, i64),
}

impl Step {
    fn offset(&self) -> Option<i64> {
        match self {
            Step::Data { offset, .. } => Some(*offset),
            Step::Marker { marker, .. } => Some(marker.offset),
            _ => None,
        }
    }
}

fn options(txn: bool) -> AppendOptions {
    if txn {
        AppendOptions::client().transactional().verified()
    } else {
        AppendOptions::client()
    }
}

/// What happened, for a truncation's rebuild.
#[derive(Clone)]
enum Ev {
    Step(Step),
    Expired(Vec<(u64, i32)>),
    Truncated(i64, Box<ProducerStateManager>),
}

/// The reference: the engine of the acknowledged operations and their
/// history.
#[derive(Clone)]
struct Model {
    m: ProducerStateManager,
    history: Vec<Ev>,
}

fn engine() -> ProducerStateManager {
    ProducerStateManager::with_semantics(Semantics::Kafka)
}

/// A step's effect on an engine (verdicts are the engine's own).
fn apply(m: &mut ProducerStateManager, s: &Step) -> Option<MarkerOutcome> {
    effect(m, s, false).1
}

/// A step's effect on an engine, and whether it took one (a batch or a
/// marker accepted; any other step). With `reload`, a data batch goes in
/// as Kafka reloads one from the log (`AppendOrigin.REPLICATION`: see
/// [`Model::rebuild`]).
fn effect(m: &mut ProducerStateManager, s: &Step, reload: bool) -> (bool, Option<MarkerOutcome>) {
    match *s {
        Step::Data {
            pid,
            partition,
            epoch,
            first,
            last,
            txn,
            offset,
            ts,
        } => {
            let options = match (reload, txn) {
                (false, _) => options(txn),
                (true, false) => AppendOptions::replication(),
                (true, true) => AppendOptions::replication().transactional(),
            };
            let out = m
                .append_with(
                    pid,
                    partition,
                    epoch,
                    Batch::new(first, last, offset, ts),
                    options,
                )
                .unwrap();
            (out.is_accepted(), None)
        }
        Step::Marker {
            pid,
            partition,
            epoch,
            marker,
        } => {
            let out = m
                .append_marker(pid, partition, epoch, marker, Origin::Coordinator)
                .unwrap();
            (out.is_accepted(), Some(out))
        }
        Step::RemovePartition(p) => {
            m.remove_partition(p);
            (true, None)
        }
        Step::Forget(p, o) => {
            m.forget_aborted_before(p, o);
            (true, None)
        }
        Step::Expire { .. } | Step::Truncate(_) => (true, None),
    }
}

fn keys(m: &ProducerStateManager) -> BTreeSet<(u64, i32)> {
    m.iter()
        .map(|(id, p, _)| (id.as_numeric().unwrap(), p))
        .collect()
}

impl Model {
    /// The acknowledged step's effect (its answer compared by the caller).
    fn step(&mut self, s: Step) -> Result<(), ()> {
        match s {
            Step::Expire { now } => {
                let before = keys(&self.m);
                self.m.expire_producers(now, EXPIRATION).unwrap();
                let gone: Vec<_> = before.difference(&keys(&self.m)).copied().collect();
                self.history.push(Ev::Expired(gone));
            }
            Step::Truncate(x) => {
                // Kafka's truncateAndReload leaves the broker's in-memory
                // verification states alone; so does the store's.
                let verifying = self.m.verification_states();
                self.m = self.rebuild(x);
                self.m.restore_verification_states(verifying);
                self.history
                    .push(Ev::Truncated(x, Box::new(self.m.clone())));
            }
            s => {
                // Only what took effect goes in the history, as only
                // accepted batches and markers reach a log: a refused or
                // duplicate batch changed nothing but, maybe, a KIP-890
                // verification state, which is in memory only.
                if effect(&mut self.m, &s, false).0 {
                    self.history.push(Ev::Step(s));
                }
            }
        }
        Ok(())
    }

    /// The state with every batch and marker at or above `x` left out.
    ///
    /// The history's batches were accepted: they are reloaded, not
    /// classified again, as Kafka reloads a log (trunk 1eb7644349cb:
    /// UnifiedLog.java `loadProducersFromRecords`, line 187, and
    /// LogSegment.java `updateProducerState`, line 352, append with
    /// `AppendOrigin.REPLICATION`; ProducerAppendInfo.java
    /// `maybeValidateDataBatch`, lines 89-94, runs `checkSequence`, whose
    /// first test is the verification state's lowest sequence, lines
    /// 112-117, for `CLIENT` batches only). Classifying them again would
    /// let a verification state that a verified duplicate started, and
    /// that a restart since forgot (a restart is no event here), refuse a
    /// batch the store accepted after that restart and holds.
    fn rebuild(&self, x: i64) -> ProducerStateManager {
        let mut m = engine();
        for ev in &self.history {
            match ev {
                Ev::Step(s) => {
                    if s.offset().is_none_or(|o| o < x) {
                        let (accepted, _) = effect(&mut m, s, true);
                        assert!(accepted, "a reloaded step was refused: {s:?}");
                    }
                }
                Ev::Expired(gone) => {
                    for &(pid, p) in gone {
                        m.remove_producer(pid, p);
                    }
                }
                Ev::Truncated(y, state) => {
                    if *y < x {
                        m = (**state).clone();
                    }
                }
            }
        }
        m
    }
}

/// The store's views equal the engine's.
fn same(s: &ProducerStateStore, m: &ProducerStateManager) -> Result<(), String> {
    for p in 0..PARTITIONS {
        let want: Vec<_> = (0..PIDS)
            .filter_map(|pid| Some((pid.into(), m.kafka_state(pid, p)?)))
            .collect();
        let got = s.kafka_producers(p);
        if got != want {
            return Err(format!("partition {p}: store {got:?}\nmodel {want:?}"));
        }
        if s.aborted_transactions(p) != m.aborted_transactions(p) {
            return Err(format!(
                "partition {p} aborted: store {:?} model {:?}",
                s.aborted_transactions(p),
                m.aborted_transactions(p)
            ));
        }
        if s.first_unstable_offset(p) != m.first_unstable_offset(p) {
            return Err(format!("partition {p}: first unstable offset"));
        }
        for pid in 0..PIDS {
            if s.verification_state(pid, p) != m.verification_state(pid, p) {
                return Err(format!(
                    "producer {pid} partition {p} verification: store {:?} model {:?}",
                    s.verification_state(pid, p),
                    m.verification_state(pid, p)
                ));
            }
        }
    }
    Ok(())
}

fn opts(fs: &SimFs, clock: &Arc<ManualClock>) -> StoreOptions {
    sim_opts(fs)
        .semantics(Semantics::Kafka)
        .producer_expiration(Some(Duration::from_millis(EXPIRATION as u64)))
        .clock(clock.clone())
        .snapshot_every_records(Some(12))
        .keep_snapshots(64)
}

/// A COMMIT or ABORT marker from the coordinator at `coordinator_epoch`.
fn end_marker(commit: bool, coordinator_epoch: i32, offset: i64, timestamp: i64) -> Marker {
    if commit {
        Marker::commit(coordinator_epoch, offset, timestamp)
    } else {
        Marker::abort(coordinator_epoch, offset, timestamp)
    }
}

/// Resolves an operation against the acknowledged state.
fn resolve(op: Op, m: &ProducerStateManager, end: i64, now: i64) -> Option<Step> {
    Some(match op {
        Op::Data {
            pid,
            partition,
            bump,
            seq,
            len,
            txn,
        } => {
            let st = m.kafka_state(pid, partition);
            let epoch = st.as_ref().map_or(0, |s| s.epoch.max(0)) + bump;
            let last = st.as_ref().map_or(-1, |s| s.last_sequence);
            let next = if bump > 0 {
                0
            } else {
                last.wrapping_add(1).max(0)
            };
            let first = match seq {
                0 => next,
                1 => (last - len).max(0),
                _ => next + 2,
            };
            Step::Data {
                pid,
                partition,
                epoch,
                first,
                last: first + len,
                txn,
                offset: end,
                ts: now,
            }
        }
        Op::Marker {
            pid,
            partition,
            bump,
            commit,
            coordinator,
        } => {
            let st = m.kafka_state(pid, partition);
            let epoch = st.as_ref().map_or(0, |s| s.epoch.max(0)) + bump;
            Step::Marker {
                pid,
                partition,
                epoch,
                marker: end_marker(commit, coordinator, end, now),
            }
        }
        Op::EndOldest {
            partition,
            commit,
            coordinator,
        } => {
            let oldest = (0..PIDS)
                .filter_map(|pid| {
                    let first = m.kafka_state(pid, partition)?.current_txn_first_offset?;
                    Some((first, pid))
                })
                .min();
            let pid = oldest.map_or(0, |(_, pid)| pid);
            let epoch = m.kafka_state(pid, partition).map_or(0, |s| s.epoch.max(0));
            Step::Marker {
                pid,
                partition,
                epoch,
                marker: end_marker(commit, coordinator, end, now),
            }
        }
        Op::Expire { .. } => Step::Expire { now },
        Op::RemovePartition { partition } => Step::RemovePartition(partition),
        Op::Truncate { back, .. } => Step::Truncate((end - back).max(0)),
        Op::Forget { partition, back } => Step::Forget(partition, (end - back).max(0)),
        Op::Reopen => return None,
    })
}

/// Runs the step on the store: `Ok(true)` if it took effect, `Ok(false)`
/// if refused with nothing changed (a truncation out of range), `Err` on
/// an IO failure (the crash).
fn run(s: &ProducerStateStore, step: &Step, model: &Model) -> Result<bool, Error> {
    match *step {
        Step::Data {
            pid,
            partition,
            epoch,
            first,
            last,
            txn,
            offset,
            ts,
        } => {
            let got = s.append_with(
                pid,
                partition,
                epoch,
                Batch::new(first, last, offset, ts),
                options(txn),
            )?;
            let mut m = model.m.clone();
            let want = m
                .append_with(
                    pid,
                    partition,
                    epoch,
                    Batch::new(first, last, offset, ts),
                    options(txn),
                )
                .unwrap();
            assert_eq!(got, want, "{step:?}");
        }
        Step::Marker {
            pid,
            partition,
            epoch,
            marker,
        } => {
            let got = s.append_marker(pid, partition, epoch, marker, Origin::Coordinator)?;
            let mut m = model.m.clone();
            assert_eq!(got, apply(&mut m, step).unwrap(), "{step:?}");
        }
        Step::Expire { .. } => {
            let n = s.expire_now()?;
            let mut m = model.clone();
            let before = keys(&m.m);
            m.step(*step).unwrap();
            assert_eq!(n, before.len() - keys(&m.m).len(), "expired");
        }
        Step::RemovePartition(p) => {
            let n = s.remove_partition(p)?;
            let want = keys(&model.m).iter().filter(|k| k.1 == p).count();
            assert_eq!(n, want, "removed");
        }
        Step::Truncate(x) => match s.truncate_to(x) {
            Ok(()) => {}
            Err(Error::TruncateAboveEnd { .. } | Error::TruncateBelowHistory { .. }) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        },
        Step::Forget(p, o) => s.forget_aborted_before(p, o)?,
    }
    Ok(true)
}

/// The acknowledged aborted transactions (partition, first, last).
type Aborted = BTreeSet<(i32, i64, i64)>;

fn track(aborted: &mut Aborted, step: &Step, answer: Option<MarkerOutcome>) {
    match *step {
        Step::Marker { partition, .. } => {
            if let Some(MarkerOutcome::Accepted { completed: Some(c) }) = answer
                && c.aborted
            {
                aborted.insert((partition, c.first_offset, c.last_offset));
            }
        }
        Step::RemovePartition(p) => aborted.retain(|t| t.0 != p),
        Step::Truncate(x) => aborted.retain(|t| t.2 < x),
        Step::Forget(p, o) => aborted.retain(|t| t.0 != p || t.2 >= o),
        _ => {}
    }
}

fn check_aborted(s: &ProducerStateStore, aborted: &Aborted) -> Result<(), String> {
    for &(p, first, last) in aborted {
        let listed = s
            .aborted_transactions(p)
            .iter()
            .any(|t| t.first_offset == first && t.last_offset == last);
        if !listed {
            return Err(format!(
                "aborted ({p}, {first}, {last}) is no longer listed"
            ));
        }
    }
    Ok(())
}

/// The crash image `image` of `fs` (which crashed at `crash_at`).
fn crash_image(fs: &SimFs, crash_at: u64, image: u8) -> SimFs {
    let mode = match image {
        0 => Unsynced::Drop,
        1 => Unsynced::Keep,
        _ => Unsynced::TornPrefix(crash_at),
    };
    fs.crash_image(mode)
}

/// Opens the store; if the crash comes while it opens, opens the crash
/// image instead (nothing was acknowledged meanwhile).
fn open(
    fs: &mut SimFs,
    clock: &Arc<ManualClock>,
    crashed: &mut bool,
    crash_at: u64,
    image: u8,
) -> Result<ProducerStateStore, TestCaseError> {
    match ProducerStateStore::open_with(dir(), opts(fs, clock)) {
        Ok(s) => Ok(s),
        Err(e) => {
            prop_assert!(!*crashed && fs.crashed(), "open failed: {e}");
            *crashed = true;
            *fs = crash_image(fs, crash_at, image);
            ProducerStateStore::open_with(dir(), opts(fs, clock))
                .map_err(|e| TestCaseError::fail(format!("recovery: {e}")))
        }
    }
}

/// Runs `ops` with a crash at IO operation `crash_at` (seen through
/// `image`); true if the crash came.
fn case(ops: &[Op], crash_at: u64, image: u8) -> Result<bool, TestCaseError> {
    let clock = Arc::new(ManualClock::new(0));
    let mut fs = SimFs::new();
    fs.set_fault(crash_at, Fault::Crash);
    let mut crashed = false;
    let mut store = Some(open(&mut fs, &clock, &mut crashed, crash_at, image)?);
    let mut model = Model {
        m: engine(),
        history: Vec::new(),
    };
    let mut aborted = Aborted::new();
    let mut end = 0i64;
    let mut lso = [0i64; PARTITIONS as usize];
    for &op in ops {
        if let Op::Expire { advance } = op {
            clock.advance(Duration::from_millis(advance as u64));
        }
        let now = clock.now_ms();
        let Some(step) = resolve(op, &model.m, end, now) else {
            drop(store.take());
            store = Some(open(&mut fs, &clock, &mut crashed, crash_at, image)?);
            // A restart forgets the KIP-890 verification states, as Kafka's
            // (in memory only, never logged).
            model.m.forget_verification_states();
            let s = store.as_ref().unwrap();
            same(s, &model.m).map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
            continue;
        };
        let s = store.as_ref().unwrap();
        // Whether the step took effect: a refused truncation or one a
        // crash undid leaves the log end where it was.
        let took = match run(s, &step, &model) {
            Ok(took) => {
                let mut m = model.m.clone();
                let answer = apply(&mut m, &step);
                if took {
                    model.step(step).unwrap();
                    track(&mut aborted, &step, answer);
                }
                took
            }
            Err(e) => {
                prop_assert!(!crashed, "a second failure: {e}");
                prop_assert!(fs.crashed(), "failed without the crash: {e}");
                crashed = true;
                // Reopen the crash image: the acknowledged prefix, or it
                // and the step in flight.
                drop(store.take());
                fs = crash_image(&fs, crash_at, image);
                let s = ProducerStateStore::open_with(dir(), opts(&fs, &clock))
                    .map_err(|e| TestCaseError::fail(format!("recovery: {e}")))?;
                model.m.forget_verification_states();
                let applied = same(&s, &model.m).is_err();
                if applied {
                    let answer = apply(&mut model.m.clone(), &step);
                    let mut trial = model.clone();
                    trial.step(step).unwrap();
                    trial.m.forget_verification_states();
                    same(&s, &trial.m).map_err(|e| {
                        TestCaseError::fail(format!(
                            "after a crash in {step:?}: neither the acknowledged state nor it with the step: {e}"
                        ))
                    })?;
                    model = trial;
                    track(&mut aborted, &step, answer);
                }
                store = Some(s);
                applied
            }
        };
        if let Some(o) = step.offset() {
            end = end.max(
                o + 1
                    + match step {
                        Step::Data { first, last, .. } => i64::from(last - first),
                        _ => 0,
                    },
            );
        }
        let s = store.as_ref().unwrap();
        same(s, &model.m).map_err(|e| TestCaseError::fail(format!("after {step:?}: {e}")))?;
        check_aborted(s, &aborted).map_err(TestCaseError::fail)?;
        if let Step::Truncate(x) = step {
            // Offsets go on from the truncation point only if the log was
            // cut there: after a truncation the crash undid, a batch at
            // the point would sit below open transactions' first offsets.
            if took && !matches!(op, Op::Truncate { keep_end: true, .. }) {
                end = end.min(x.max(0));
            }
            lso = [0; PARTITIONS as usize];
        }
        for p in 0..PARTITIONS {
            let now = s.last_stable_offset(p, end);
            prop_assert!(
                now >= lso[p as usize],
                "partition {p}: the last stable offset went back from {} to {now} at {step:?}",
                lso[p as usize]
            );
            lso[p as usize] = now;
        }
    }
    Ok(crashed)
}

/// Every kind of record a Kafka-mode store writes: transactional and plain
/// batches, COMMIT and ABORT markers (one with an epoch bump), an
/// expiration, a partition removal, a truncation and a forget.
fn every_record() -> Vec<Op> {
    let data = |pid, partition, txn| Op::Data {
        pid,
        partition,
        bump: 0,
        seq: 0,
        len: 1,
        txn,
    };
    let marker = |pid, partition, commit, bump| Op::Marker {
        pid,
        partition,
        bump,
        commit,
        coordinator: 1,
    };
    vec![
        data(0, 0, true),
        data(1, 0, false),
        data(2, 1, true),
        marker(0, 0, false, 0),
        data(0, 0, true),
        data(3, 1, false),
        marker(2, 1, true, 0),
        Op::Expire { advance: 600 },
        data(1, 0, false),
        marker(0, 0, false, 1),
        data(2, 1, true),
        Op::Expire { advance: 700 },
        data(0, 0, true),
        Op::Truncate {
            back: 4,
            keep_end: false,
        },
        data(0, 0, true),
        marker(0, 0, true, 0),
        Op::Forget {
            partition: 0,
            back: 1,
        },
        Op::RemovePartition { partition: 1 },
        data(3, 1, true),
        Op::Reopen,
        data(1, 0, false),
    ]
}

#[test]
fn a_crash_at_every_io_operation_of_every_record_kind_recovers_a_prefix() {
    let ops = every_record();
    let mut n = 0;
    // Until the crash point lies past the whole history.
    while case(&ops, n, 0).unwrap_or_else(|e| panic!("crash at {n}, dropped: {e}")) {
        for image in 1..3 {
            case(&ops, n, image).unwrap_or_else(|e| panic!("crash at {n}, image {image}: {e}"));
        }
        n += 1;
        assert!(n < 5_000, "bounded");
    }
    assert!(n > 60, "only {n} IO operations");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn kafka_mode_histories_survive_a_crash_anywhere(
        ops in prop::collection::vec(op(), 10..60),
        crash_at in 0u64..160,
        image in 0u8..3,
    ) {
        let _crashed = case(&ops, crash_at, image)?;
    }
}
