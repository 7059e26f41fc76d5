//! Property tests of transactions under `Semantics::Kafka` against a
//! reference model written as plainly as possible (a list of batches per
//! key, linear scans, Kafka's checks transcribed in their order from
//! Kafka's `ProducerAppendInfo`), over random streams of plain and
//! transactional batches, retries, replicated batches, COMMIT and ABORT
//! markers (with stale producer and coordinator epochs) and reloads from
//! Kafka snapshots. After every step the engine and the model agree on the
//! verdict, on every key's state, on the open transactions and on the
//! aborted list, and on the KIP-890 verification states (Kafka's
//! `VerificationStateEntry`: started by a verified transactional write of a
//! producer without an open transaction, kept by a duplicate or a refusal,
//! ended by an accepted transactional batch or marker, kept by a reload);
//! and two invariants hold on their own: the last stable
//! offset of a partition never moves backwards, and every transaction an
//! accepted ABORT marker completed is listed as aborted.

use std::collections::{BTreeMap, VecDeque};

use producer_state::kafka;
use producer_state::{
    AppendOptions, Batch, BatchMetadata, BatchOutcome, Marker, MarkerOutcome, Origin,
    ProducerStateManager, RetainedBatch, Semantics, VerificationState,
};
use proptest::prelude::*;

const PIDS: u64 = 3;
const PARTITIONS: i32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Data {
        pid: u64,
        partition: i32,
        /// Relative to the key's epoch (0 for a new key).
        epoch: i16,
        /// 0: start at 0; 1: continue the model's last sequence; 2: `seq`.
        start: u8,
        seq: i32,
        len: i32,
        txn: bool,
        verified: bool,
        repl: bool,
    },
    /// A client retry of the key's `back`-th newest cached batch (if any).
    Retry {
        pid: u64,
        partition: i32,
        back: usize,
    },
    Marker {
        pid: u64,
        partition: i32,
        /// Relative to the key's epoch.
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        repl: bool,
    },
    Reload {
        partition: i32,
    },
}

/// An epoch relative to the key's: mostly the same, sometimes a bump or
/// a zombie's older one.
fn epoch_step() -> impl Strategy<Value = i16> {
    prop_oneof![8 => Just(0i16), 1 => Just(1i16), 1 => Just(-1i16)]
}

/// How a batch starts: mostly continuing, sometimes at 0 or anywhere.
fn start() -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(1u8), 1 => Just(0u8), 1 => Just(2u8)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..PIDS, 0..PARTITIONS, epoch_step(), start(), 0..12i32, 1..4i32, any::<bool>(), prop::bool::weighted(0.85), prop::bool::weighted(0.1))
            .prop_map(|(pid, partition, epoch, start, seq, len, txn, verified, repl)| Op::Data {
                pid, partition, epoch, start, seq, len, txn, verified, repl
            }),
        2 => (0..PIDS, 0..PARTITIONS, 0..6usize).prop_map(|(pid, partition, back)| Op::Retry { pid, partition, back }),
        3 => (0..PIDS, 0..PARTITIONS, epoch_step(), any::<bool>(), 0..4i32, prop::bool::weighted(0.1))
            .prop_map(|(pid, partition, epoch, commit, coordinator_epoch, repl)| Op::Marker {
                pid, partition, epoch, commit, coordinator_epoch, repl
            }),
        1 => (0..PARTITIONS).prop_map(|partition| Op::Reload { partition }),
    ]
}

/// One cached batch: first and last sequence, first offset, timestamp.
type MBatch = (i32, i32, i64, i64);

/// Kafka's `ProducerStateEntry`, plainly.
#[derive(Clone, Debug)]
struct MKey {
    epoch: i16,
    batches: VecDeque<MBatch>,
    coordinator_epoch: i32,
    txn: Option<i64>,
    last_timestamp: i64,
}

impl MKey {
    const EMPTY: MKey = MKey {
        epoch: -1,
        batches: VecDeque::new(),
        coordinator_epoch: -1,
        txn: None,
        last_timestamp: -1,
    };

    fn last_seq(&self) -> i32 {
        self.batches.back().map_or(-1, |b| b.1)
    }

    fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.epoch {
            self.batches.clear();
            self.epoch = epoch;
        }
    }
}

#[derive(Default)]
struct Model {
    keys: BTreeMap<(u64, i32), MKey>,
    /// Open transactions: (partition, first offset, producer).
    open: Vec<(i32, i64, u64)>,
    /// Aborted: (partition, producer, first offset, marker offset).
    aborted: Vec<(i32, u64, i64, i64)>,
    end: [i64; PARTITIONS as usize],
    /// Verification states: (created at, lowest sequence, epoch).
    verifying: BTreeMap<(u64, i32), (i64, i32, i16)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Accepted,
    Duplicate(i64, i64),
    OutOfOrder,
    Fenced,
    TxnState,
    CoordinatorFenced,
    AcceptedMarker(Option<(i64, i64, bool, i64)>),
}

impl Model {
    /// The key's epoch, 0 for a new key.
    fn epoch(&self, pid: u64, p: i32) -> i16 {
        self.keys.get(&(pid, p)).map_or(0, |k| k.epoch.max(0))
    }

    fn fuo(&self, partition: i32) -> Option<i64> {
        self.open
            .iter()
            .filter(|o| o.0 == partition)
            .map(|o| o.1)
            .min()
    }

    /// A data batch: its sequences and timestamp, and whether it is
    /// transactional, verified and replicated.
    fn data(
        &mut self,
        (pid, p, epoch): (u64, i32, i16),
        (first, last, ts): (i32, i32, i64),
        (txn, verified, repl): (bool, bool, bool),
    ) -> Verdict {
        let offset = self.end[p as usize];
        let known = self.keys.contains_key(&(pid, p));
        let k = self.keys.get(&(pid, p)).cloned().unwrap_or(MKey::EMPTY);
        // ReplicaManager verifies a transactional write first, unless the
        // transaction is open (maybeStartTransactionVerification), and
        // maybeUpdateLowestSequenceAndEpoch keeps the lowest sequence of
        // the newest epoch.
        if !repl && txn && verified && k.txn.is_none() {
            let v = self.verifying.entry((pid, p)).or_insert((ts, first, epoch));
            if epoch == v.2 && first < v.1 {
                v.1 = first;
            }
            if epoch > v.2 {
                v.2 = epoch;
                v.1 = first;
            }
        }
        if !repl {
            if known
                && epoch == k.epoch
                && let Some(b) = k.batches.iter().find(|b| b.0 == first && b.1 == last)
            {
                return Verdict::Duplicate(b.2, b.3);
            }
            if txn && k.txn.is_none() && !verified {
                return Verdict::TxnState;
            }
            if epoch < k.epoch {
                return Verdict::Fenced;
            }
            if self.verifying.get(&(pid, p)).is_some_and(|v| first > v.1) {
                return Verdict::OutOfOrder;
            }
            if k.epoch != -1 {
                let ok = if epoch != k.epoch {
                    first == 0
                } else {
                    first == k.last_seq() + 1
                };
                if !ok {
                    return Verdict::OutOfOrder;
                }
            }
        }
        if k.txn.is_some() && !txn {
            return Verdict::TxnState;
        }
        let mut k = k;
        k.set_epoch(epoch);
        if k.batches.len() == 5 {
            k.batches.pop_front();
        }
        k.batches.push_back((first, last, offset, ts));
        k.last_timestamp = ts;
        if txn && k.txn.is_none() {
            k.txn = Some(offset);
            self.open.push((p, offset, pid));
        }
        if txn {
            self.verifying.remove(&(pid, p));
        }
        self.keys.insert((pid, p), k);
        self.end[p as usize] = offset + i64::from(last - first) + 1;
        Verdict::Accepted
    }

    /// A COMMIT or ABORT marker of a coordinator epoch, and whether it is
    /// replicated.
    fn marker(
        &mut self,
        (pid, p, epoch): (u64, i32, i16),
        (commit, coord, ts): (bool, i32, i64),
        repl: bool,
    ) -> Verdict {
        let offset = self.end[p as usize];
        let mut k = self.keys.get(&(pid, p)).cloned().unwrap_or(MKey::EMPTY);
        if !repl {
            if epoch < k.epoch {
                return Verdict::Fenced;
            }
            if k.coordinator_epoch > coord {
                return Verdict::CoordinatorFenced;
            }
        }
        let completed = k.txn.map(|first| {
            self.open
                .retain(|o| !(o.0 == p && o.1 == first && o.2 == pid));
            let lso = self.fuo(p).unwrap_or(offset + 1);
            if !commit {
                self.aborted.push((p, pid, first, offset));
            }
            (first, offset, !commit, lso)
        });
        k.set_epoch(epoch);
        k.coordinator_epoch = coord;
        k.txn = None;
        k.last_timestamp = ts;
        self.keys.insert((pid, p), k);
        self.verifying.remove(&(pid, p));
        self.end[p as usize] = offset + 1;
        Verdict::AcceptedMarker(completed)
    }

    /// Kafka's reload of one partition from its snapshot: the newest batch
    /// only, its timestamp the entry's.
    fn reload(&mut self, p: i32) {
        for ((_, kp), k) in self.keys.iter_mut() {
            if *kp == p {
                let ts = k.last_timestamp;
                let newest = k.batches.back().map(|b| (b.0, b.1, b.2, ts));
                k.batches = newest.into_iter().collect();
            }
        }
    }
}

fn verdict_of(out: BatchOutcome) -> Verdict {
    match out {
        BatchOutcome::Accepted => Verdict::Accepted,
        BatchOutcome::Duplicate { original: Some(m) } => Verdict::Duplicate(m.offset, m.timestamp),
        BatchOutcome::OutOfOrder { .. } => Verdict::OutOfOrder,
        BatchOutcome::FencedEpoch { .. } => Verdict::Fenced,
        BatchOutcome::InvalidTxnState { .. } => Verdict::TxnState,
        other => panic!("unexpected {other:?}"),
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let mut model = Model::default();
    let mut lso = [0i64; PARTITIONS as usize];
    for (step, op) in ops.iter().enumerate() {
        let ts = 1_000 + step as i64;
        let touched = match *op {
            Op::Data {
                pid,
                partition: p,
                epoch,
                start,
                seq,
                len,
                txn,
                verified,
                repl,
            } => {
                let last_seq = model.keys.get(&(pid, p)).map_or(-1, MKey::last_seq);
                let epoch = model.epoch(pid, p) + epoch;
                let first = match start {
                    0 => 0,
                    1 => last_seq + 1,
                    _ => seq,
                };
                let last = first + len - 1;
                let offset = model.end[p as usize];
                let mut options = if repl {
                    AppendOptions::replication()
                } else {
                    AppendOptions::client()
                };
                if txn {
                    options = options.transactional();
                }
                if verified {
                    options = options.verified();
                }
                let out = mgr
                    .append_with(pid, p, epoch, Batch::new(first, last, offset, ts), options)
                    .unwrap();
                let expected =
                    model.data((pid, p, epoch), (first, last, ts), (txn, verified, repl));
                prop_assert_eq!(verdict_of(out), expected, "step {} {:?}", step, op);
                Some((pid, p))
            }
            Op::Retry {
                pid,
                partition: p,
                back,
            } => {
                let Some(k) = model.keys.get(&(pid, p)) else {
                    continue;
                };
                let Some(&(first, last, _, _)) = k.batches.iter().rev().nth(back) else {
                    continue;
                };
                let epoch = k.epoch;
                let offset = model.end[p as usize];
                let out = mgr
                    .append_with(
                        pid,
                        p,
                        epoch,
                        Batch::new(first, last, offset, ts),
                        AppendOptions::client(),
                    )
                    .unwrap();
                let expected =
                    model.data((pid, p, epoch), (first, last, ts), (false, false, false));
                prop_assert_eq!(verdict_of(out), expected, "step {} {:?}", step, op);
                Some((pid, p))
            }
            Op::Marker {
                pid,
                partition: p,
                epoch,
                commit,
                coordinator_epoch,
                repl,
            } => {
                let offset = model.end[p as usize];
                let epoch = model.epoch(pid, p) + epoch;
                let marker = if commit {
                    Marker::commit(coordinator_epoch, offset, ts)
                } else {
                    Marker::abort(coordinator_epoch, offset, ts)
                };
                let origin = if repl {
                    Origin::Replication
                } else {
                    Origin::Coordinator
                };
                let out = mgr.append_marker(pid, p, epoch, marker, origin).unwrap();
                let got = match out {
                    MarkerOutcome::Accepted { completed } => {
                        Verdict::AcceptedMarker(completed.map(|c| {
                            (
                                c.first_offset,
                                c.last_offset,
                                c.aborted,
                                c.last_stable_offset,
                            )
                        }))
                    }
                    MarkerOutcome::FencedEpoch { .. } => Verdict::Fenced,
                    MarkerOutcome::CoordinatorFenced { .. } => Verdict::CoordinatorFenced,
                    other => panic!("unexpected {other:?}"),
                };
                let expected = model.marker((pid, p, epoch), (commit, coordinator_epoch, ts), repl);
                if let Verdict::AcceptedMarker(Some((first, last, true, _))) = expected {
                    // Invariant: an aborted transaction is always listed.
                    let listed = mgr.aborted_transactions(p).iter().any(|a| {
                        a.producer_id.as_numeric() == Some(pid)
                            && a.first_offset == first
                            && a.last_offset == last
                    });
                    prop_assert!(listed, "abort of {}..{} not listed", first, last);
                }
                prop_assert_eq!(got, expected, "step {} {:?}", step, op);
                Some((pid, p))
            }
            Op::Reload { partition: p } => {
                let bytes = kafka::encode(&mgr.kafka_snapshot_entries(p).unwrap());
                let entries = kafka::decode(std::path::Path::new("mem"), &bytes).unwrap();
                prop_assert!(mgr.load_kafka_snapshot(p, &entries).unwrap().is_empty());
                model.reload(p);
                None
            }
        };
        // The whole state agrees after every step.
        for ((pid, p), k) in &model.keys {
            let s = mgr.kafka_state(*pid, *p).expect("the model's key exists");
            let batches: Vec<RetainedBatch> = k
                .batches
                .iter()
                .map(|&(f, l, o, t)| RetainedBatch {
                    first_sequence: f,
                    last_sequence: l,
                    metadata: Some(BatchMetadata {
                        offset: o,
                        timestamp: t,
                    }),
                })
                .collect();
            prop_assert_eq!(
                (
                    s.epoch,
                    s.last_sequence,
                    s.coordinator_epoch,
                    s.current_txn_first_offset,
                    s.last_timestamp,
                    &s.batches
                ),
                (
                    k.epoch,
                    k.last_seq(),
                    k.coordinator_epoch,
                    k.txn,
                    k.last_timestamp,
                    &batches
                ),
                "key {:?} after step {} {:?} (touched {:?})",
                (pid, p),
                step,
                op,
                touched
            );
        }
        prop_assert_eq!(mgr.len(), model.keys.len());
        let verifying: Vec<(u64, i32, VerificationState)> = mgr
            .verification_states()
            .into_iter()
            .map(|(id, p, v)| (id.as_numeric().unwrap(), p, v))
            .collect();
        let expected: Vec<(u64, i32, VerificationState)> = model
            .verifying
            .iter()
            .map(|(&(pid, p), &(ts, lowest, epoch))| {
                (pid, p, VerificationState::new(ts, lowest, epoch))
            })
            .collect();
        prop_assert_eq!(
            verifying,
            expected,
            "verification states after step {}",
            step
        );
        for p in 0..PARTITIONS {
            prop_assert_eq!(mgr.first_unstable_offset(p), model.fuo(p));
            let listed: Vec<(u64, i64, i64)> = mgr
                .aborted_transactions(p)
                .iter()
                .map(|a| {
                    (
                        a.producer_id.as_numeric().unwrap(),
                        a.first_offset,
                        a.last_offset,
                    )
                })
                .collect();
            let expected: Vec<(u64, i64, i64)> = model
                .aborted
                .iter()
                .filter(|a| a.0 == p)
                .map(|a| (a.1, a.2, a.3))
                .collect();
            prop_assert_eq!(listed, expected);
            // Invariant: the last stable offset never moves backwards.
            let now = mgr.last_stable_offset(p, model.end[p as usize]);
            prop_assert!(
                now >= lso[p as usize],
                "LSO of {} went from {} to {}",
                p,
                lso[p as usize],
                now
            );
            lso[p as usize] = now;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn transactions_match_the_reference_model(ops in prop::collection::vec(op(), 1..200)) {
        run(&ops)?;
    }
}

#[test]
fn an_abort_with_an_epoch_bump_restarts_the_sequence_and_is_listed() {
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let txn = AppendOptions::client().transactional().verified();
    assert!(
        mgr.append_with(1u64, 0, 0, Batch::new(0, 1, 0, 5), txn)
            .unwrap()
            .is_accepted()
    );
    // Another producer's transaction opens later and stays open.
    assert!(
        mgr.append_with(2u64, 0, 0, Batch::new(0, 0, 2, 5), txn)
            .unwrap()
            .is_accepted()
    );
    assert_eq!(mgr.last_stable_offset(0, 3), 0);
    let out = mgr
        .append_marker(1u64, 0, 1, Marker::abort(0, 3, 6), Origin::Coordinator)
        .unwrap();
    let MarkerOutcome::Accepted { completed: Some(c) } = out else {
        panic!("{out:?}")
    };
    assert_eq!((c.first_offset, c.last_offset, c.aborted), (0, 3, true));
    assert_eq!(
        c.last_stable_offset, 2,
        "held back by producer 2's open transaction"
    );
    assert_eq!(mgr.last_stable_offset(0, 4), 2);
    assert_eq!(mgr.aborted_transactions(0).len(), 1);
    // The bump dropped the batches: sequence 2 at the new epoch is out of order, 0 is fine.
    let plain = AppendOptions::client();
    assert_eq!(
        mgr.append_with(1u64, 0, 1, Batch::new(2, 2, 4, 7), plain)
            .unwrap()
            .kafka_error(),
        Some(producer_state::KafkaError::OutOfOrderSequenceNumber)
    );
    assert!(
        mgr.append_with(1u64, 0, 1, Batch::new(0, 0, 4, 7), plain)
            .unwrap()
            .is_accepted()
    );
    // Producer 2 commits: nothing is open, the partition is stable to its end.
    mgr.append_marker(2u64, 0, 0, Marker::commit(0, 5, 8), Origin::Coordinator)
        .unwrap();
    assert_eq!(mgr.first_unstable_offset(0), None);
    assert_eq!(mgr.last_stable_offset(0, 6), 6);
    mgr.forget_aborted_before(0, 4);
    assert!(mgr.aborted_transactions(0).is_empty());
}

#[test]
fn seed_semantics_refuse_what_they_do_not_model() {
    let mut mgr = ProducerStateManager::new();
    let b = Batch::new(0, 0, 0, 0);
    for options in [
        AppendOptions::client().transactional().verified(),
        AppendOptions::replication(),
        AppendOptions::client(),
    ] {
        let err = mgr.append_with(1u64, 0, 0, b, options).unwrap_err();
        assert!(err.to_string().contains("Semantics::Kafka"), "{err}");
    }
    assert!(
        mgr.append_marker(1u64, 0, 0, Marker::commit(0, 1, 0), Origin::Coordinator)
            .is_err()
    );
    // Expiration works under both (by batch timestamps; nothing to expire).
    assert_eq!(mgr.expire_producers(0, 1).unwrap(), 0);
    assert!(mgr.kafka_snapshot_entries(0).is_err());
    assert!(mgr.load_kafka_snapshot(0, &[]).is_err());
    assert_eq!(mgr.len(), 0, "nothing was applied");
    assert_eq!(mgr.first_unstable_offset(0), None);
    assert_eq!(mgr.last_stable_offset(0, 10), 10);
}

#[test]
fn expiration_spares_open_transactions_and_forgets_the_rest() {
    // Kafka's testProducersWithOngoingTransactionsDontExpire and
    // testPidExpirationTimeout, for plain and transactional keys alike.
    let day = 86_400_000;
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let txn = AppendOptions::client().transactional().verified();
    let plain = AppendOptions::client();
    mgr.append_with(1u64, 0, 5, Batch::new(0, 0, 0, 1_000), plain)
        .unwrap();
    mgr.append_with(2u64, 0, 0, Batch::new(0, 0, 1, 1_000), txn)
        .unwrap();
    mgr.append_with(3u64, 0, 0, Batch::new(0, 0, 2, 1_000), txn)
        .unwrap();
    mgr.append_marker(
        3u64,
        0,
        0,
        Marker::commit(0, 3, 1_000 + day),
        Origin::Coordinator,
    )
    .unwrap();
    assert_eq!(mgr.expire_producers(1_000 + day - 1, day).unwrap(), 0);
    // Producer 1 is a day silent; 2 has its transaction open; 3's marker
    // is its last timestamp.
    assert_eq!(mgr.expire_producers(1_000 + day, day).unwrap(), 1);
    assert!(mgr.kafka_state(1u64, 0).is_none());
    assert!(mgr.kafka_state(2u64, 0).is_some() && mgr.kafka_state(3u64, 0).is_some());
    assert_eq!(mgr.first_unstable_offset(0), Some(1));
    // Expired, producer 1 is unknown again: any sequence, its epoch too.
    assert!(
        mgr.append_with(1u64, 0, 5, Batch::new(1, 1, 4, 2), plain)
            .unwrap()
            .is_accepted()
    );
    assert_eq!(mgr.expire_producers(1_000 + 2 * day, day).unwrap(), 2);
    assert_eq!(mgr.len(), 1, "only the open transaction is left");
}

#[test]
fn side_table_keys_show_in_len_iter_and_get() {
    let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
    let txn = AppendOptions::client().transactional().verified();
    mgr.append_batch("plain", 0, 0, Batch::new(0, 2, 0, 1));
    mgr.append_with("txn", 0, 0, Batch::new(0, 2, 3, 1), txn)
        .unwrap();
    mgr.append_marker(9u64, 1, 4, Marker::abort(0, 6, 1), Origin::Coordinator)
        .unwrap();
    assert_eq!(mgr.len(), 3);
    assert_eq!(mgr.iter().count(), 3);
    let e = mgr.get("txn", 0).unwrap();
    assert_eq!(
        (e.epoch(), e.last_sequence(), e.retained_batches().len()),
        (0, 2, 1)
    );
    // Known only from a marker: an epoch and no sequence.
    let e = mgr.get(9u64, 1).unwrap();
    assert_eq!((e.epoch(), e.last_sequence()), (4, -1));
    // Named producer ids have no place in Kafka's snapshot format.
    assert!(mgr.kafka_snapshot_entries(0).unwrap().is_empty());
    assert_eq!(mgr.kafka_snapshot_entries(1).unwrap().len(), 1);
}
