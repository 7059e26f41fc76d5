//! The durable store under `Semantics::Kafka`: transactions and markers
//! survive a crash at every IO operation, replay gives exactly the live
//! state (against the in-memory engine, whose verdicts are Kafka's:
//! tests/kafka_oracle.rs), and a directory is never opened under the other
//! semantics.

mod common;

use std::path::Path;

use common::store_util::{dir, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AppendOptions, Batch, BatchOutcome, Error, Marker, MarkerOutcome, Origin, ProducerStateManager,
    ProducerStateStore, Semantics,
};

/// One operation of the workload.
#[derive(Clone, Copy, Debug)]
enum Op {
    Data {
        pid: u64,
        epoch: i16,
        first: i32,
        last: i32,
        offset: i64,
        txn: bool,
    },
    Marker {
        pid: u64,
        epoch: i16,
        commit: bool,
        coordinator: i32,
        offset: i64,
    },
}

/// Either answer, for comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Batch(BatchOutcome),
    Marker(MarkerOutcome),
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A deterministic workload over three producers on two partitions:
/// transactions committed and aborted (some by a coordinator-driven epoch
/// bump), plain batches, retries, zombies and fenced coordinators. Offsets
/// grow, as a log's do.
fn workload(n: usize) -> Vec<Op> {
    let mut s = 0x2545_f491_4f6c_dd1d_u64;
    let mut next_seq = [0i32; 3];
    let mut epoch = [0i16; 3];
    let mut offset = 0i64;
    let mut ops = Vec::new();
    for _ in 0..n {
        let r = xorshift(&mut s);
        let p = (r % 3) as usize;
        offset += 1;
        let op = match (r >> 8) % 10 {
            0 | 1 => Op::Marker {
                pid: p as u64,
                epoch: epoch[p],
                commit: r >> 20 & 1 == 0,
                coordinator: ((r >> 24) % 3) as i32,
                offset,
            },
            2 => {
                // A coordinator-driven abort with an epoch bump.
                epoch[p] += 1;
                next_seq[p] = 0;
                Op::Marker {
                    pid: p as u64,
                    epoch: epoch[p],
                    commit: false,
                    coordinator: 3,
                    offset,
                }
            }
            3 if next_seq[p] > 0 => {
                // A retry of the previous batch (a duplicate if it was
                // accepted), or a zombie's.
                Op::Data {
                    pid: p as u64,
                    epoch: epoch[p] - i16::from(r >> 30 & 1 == 1),
                    first: next_seq[p] - 1,
                    last: next_seq[p] - 1,
                    offset,
                    txn: r >> 40 & 1 == 1,
                }
            }
            _ => {
                let len = (r >> 12) % 3;
                let first = next_seq[p];
                next_seq[p] += len as i32 + 1;
                let op = Op::Data {
                    pid: p as u64,
                    epoch: epoch[p],
                    first,
                    last: first + len as i32,
                    offset,
                    txn: p != 2 || r >> 44 & 1 == 1,
                };
                offset += len as i64;
                op
            }
        };
        ops.push(op);
    }
    ops
}

fn partition(pid: u64) -> i32 {
    (pid % 2) as i32
}

fn options(txn: bool) -> AppendOptions {
    if txn {
        AppendOptions::client().transactional().verified()
    } else {
        AppendOptions::client()
    }
}

fn on_engine(m: &mut ProducerStateManager, op: Op) -> Answer {
    match op {
        Op::Data {
            pid,
            epoch,
            first,
            last,
            offset,
            txn,
        } => Answer::Batch(
            m.append_with(
                pid,
                partition(pid),
                epoch,
                Batch::new(first, last, offset, offset * 10),
                options(txn),
            )
            .unwrap(),
        ),
        Op::Marker {
            pid,
            epoch,
            commit,
            coordinator,
            offset,
        } => {
            let mk = if commit {
                Marker::commit
            } else {
                Marker::abort
            };
            Answer::Marker(
                m.append_marker(
                    pid,
                    partition(pid),
                    epoch,
                    mk(coordinator, offset, offset * 10),
                    Origin::Coordinator,
                )
                .unwrap(),
            )
        }
    }
}

fn on_store(s: &ProducerStateStore, op: Op) -> producer_state::Result<Answer> {
    Ok(match op {
        Op::Data {
            pid,
            epoch,
            first,
            last,
            offset,
            txn,
        } => Answer::Batch(s.append_with(
            pid,
            partition(pid),
            epoch,
            Batch::new(first, last, offset, offset * 10),
            options(txn),
        )?),
        Op::Marker {
            pid,
            epoch,
            commit,
            coordinator,
            offset,
        } => {
            let mk = if commit {
                Marker::commit
            } else {
                Marker::abort
            };
            Answer::Marker(s.append_marker(
                pid,
                partition(pid),
                epoch,
                mk(coordinator, offset, offset * 10),
                Origin::Coordinator,
            )?)
        }
    })
}

fn kafka_opts(fs: &SimFs) -> producer_state::StoreOptions {
    sim_opts(fs)
        .semantics(Semantics::Kafka)
        .snapshot_every_records(Some(40))
}

/// Whether the store holds exactly the engine's state.
fn same(store: &ProducerStateStore, m: &ProducerStateManager) -> bool {
    (0..3u64)
        .all(|pid| store.kafka_state(pid, partition(pid)) == m.kafka_state(pid, partition(pid)))
        && (0..2).all(|p| {
            store.first_unstable_offset(p) == m.first_unstable_offset(p)
                && store.aborted_transactions(p) == m.aborted_transactions(p)
        })
        && store.len() == m.len()
}

/// Runs the workload until the first error: the engine of the
/// acknowledged operations and the operation in flight when it failed.
fn run(fs: &SimFs, ops: &[Op]) -> (ProducerStateManager, Option<Op>) {
    let mut acked = ProducerStateManager::with_semantics(Semantics::Kafka);
    let Ok(store) = ProducerStateStore::open_with(dir(), kafka_opts(fs)) else {
        return (acked, None);
    };
    for &op in ops {
        match on_store(&store, op) {
            Ok(got) => assert_eq!(got, on_engine(&mut acked, op), "{op:?}"),
            Err(_) => return (acked, Some(op)),
        }
    }
    (acked, None)
}

const OPS: usize = 160;

#[test]
fn the_workload_is_transactional_and_the_last_stable_offset_never_goes_back() {
    let ops = workload(OPS);
    let mut m = ProducerStateManager::with_semantics(Semantics::Kafka);
    let (mut lso, mut aborted, mut accepted_markers, mut fenced) = ([0i64; 2], 0, 0, 0);
    for (i, &op) in ops.iter().enumerate() {
        let a = on_engine(&mut m, op);
        if let Answer::Marker(MarkerOutcome::Accepted { completed: Some(c) }) = a
            && c.aborted
        {
            aborted += 1;
            let p = match op {
                Op::Marker { pid, .. } => partition(pid),
                _ => unreachable!(),
            };
            // An aborted transaction is always listed.
            assert!(
                m.aborted_transactions(p)
                    .iter()
                    .any(|t| t.first_offset == c.first_offset && t.last_offset == c.last_offset)
            );
        }
        accepted_markers +=
            usize::from(matches!(a, Answer::Marker(MarkerOutcome::Accepted { .. })));
        fenced += usize::from(matches!(
            a,
            Answer::Marker(MarkerOutcome::CoordinatorFenced { .. })
        ));
        let end = match op {
            Op::Data {
                offset,
                first,
                last,
                ..
            } => offset + i64::from(last - first) + 1,
            Op::Marker { offset, .. } => offset + 1,
        };
        for p in 0..2 {
            let now = m.last_stable_offset(p, end);
            assert!(now >= lso[p as usize], "op {i}: the LSO went back");
            lso[p as usize] = now;
        }
    }
    assert!(
        aborted >= 5 && accepted_markers >= 10 && fenced >= 1,
        "{aborted} {accepted_markers} {fenced}"
    );
}

#[test]
fn a_crash_at_every_io_operation_keeps_transactions_and_markers_exactly() {
    let ops = workload(OPS);
    let full = SimFs::new();
    let (m, inflight) = run(&full, &ops);
    assert!(inflight.is_none());
    let files: Vec<String> = full
        .files()
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(files.iter().any(|f| f.ends_with(".snap")), "{files:?}");
    let total = full.ops();
    assert!(total > 200, "{total}");
    {
        let store = ProducerStateStore::open_with(dir(), kafka_opts(&full)).unwrap();
        assert!(same(&store, &m), "a clean reopen");
    }
    for n in 0..total {
        let fs = SimFs::new();
        fs.set_fault(n, Fault::Crash);
        let (acked, inflight) = run(&fs, &ops);
        for mode in [Unsynced::Drop, Unsynced::Keep, Unsynced::TornPrefix(n)] {
            let img = fs.crash_image(mode);
            let store = ProducerStateStore::open_with(dir(), kafka_opts(&img))
                .unwrap_or_else(|e| panic!("crash at {n}, {mode:?}: {e}"));
            let ok = same(&store, &acked)
                || inflight.is_some_and(|op| {
                    let mut with = acked.clone();
                    on_engine(&mut with, op);
                    same(&store, &with)
                });
            assert!(ok, "crash at operation {n}, image {mode:?}");
        }
    }
}

fn files(fs: &SimFs) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = fs
        .files()
        .into_iter()
        .map(|(p, _)| {
            let b = fs.read_file(&p).unwrap_or_default();
            (p, b)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_directory_is_never_opened_under_the_other_semantics() {
    for (written, other) in [
        (Semantics::Strict, Semantics::Kafka),
        (Semantics::Kafka, Semantics::Strict),
    ] {
        let fs = SimFs::new();
        let opts = |s: Semantics| sim_opts(&fs).semantics(s);
        let store = ProducerStateStore::open_with(dir(), opts(written)).unwrap();
        store
            .append_batch(1u64, 0, 0, Batch::new(0, 0, 0, 0))
            .unwrap();
        store.snapshot().unwrap();
        store
            .append_batch(1u64, 0, 0, Batch::new(1, 1, 1, 0))
            .unwrap();
        assert_eq!(store.semantics(), written);
        store.close().unwrap();
        let before = files(&fs);
        match ProducerStateStore::open_with(dir(), opts(other)) {
            Err(Error::SemanticsMismatch {
                stored,
                requested,
                path,
            }) => {
                assert_eq!((stored, requested), (written, other));
                assert!(path.starts_with(dir()), "{path:?}");
            }
            r => panic!("{written} opened as {other}: {r:?}"),
        }
        assert_eq!(files(&fs), before, "nothing changed");
        // The right semantics opens it.
        let store = ProducerStateStore::open_with(dir(), opts(written)).unwrap();
        assert_eq!(store.get(1u64, 0).map(|e| e.last_sequence()), Some(1));
    }
    let _ = Path::new("");
}

#[test]
fn seed_mode_refuses_kafka_calls_and_kafka_mode_refuses_the_moves_it_lacks() {
    let fs = SimFs::new();
    let seed = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    let txn = options(true);
    assert!(matches!(
        seed.append_with(1u64, 0, 0, Batch::new(0, 0, 0, 0), txn),
        Err(Error::Unsupported { .. })
    ));
    let r =
        producer_state::AppendRequest::batch(1u64, 0, 0, Batch::new(0, 0, 0, 0)).with_options(txn);
    assert!(matches!(
        seed.append_all(&[r])[0],
        Err(Error::Unsupported { .. })
    ));
    assert!(seed.is_empty(), "nothing was applied");
    drop(seed);
    let fs = SimFs::new();
    let k = ProducerStateStore::open_with(dir(), kafka_opts(&fs)).unwrap();
    // Truncation, expiration, removal and partition moves work in Kafka
    // mode (tests/kafka_lifecycle.rs); a strict export is refused.
    assert!(k.truncate_to(0).is_ok() && k.expire_now().is_ok());
    let mut seed_engine = producer_state::ProducerStateManager::new();
    seed_engine.append(1u64, 0, 0, 0);
    let e = k
        .import_partition(&seed_engine.export_partition(0).unwrap())
        .err();
    assert!(
        matches!(
            e,
            Some(Error::ImportSemanticsMismatch {
                exported: Semantics::Strict,
                store: Semantics::Kafka,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(k.is_empty());
    // append_all carries options in Kafka mode, and forgets are logged.
    let reqs = [
        producer_state::AppendRequest::batch(5u64, 0, 0, Batch::new(0, 0, 7, 1)).with_options(txn),
        producer_state::AppendRequest::batch(6u64, 0, 0, Batch::new(3, 3, 8, 1)),
    ];
    let out: Vec<_> = k
        .append_all(&reqs)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(out, [BatchOutcome::Accepted, BatchOutcome::Accepted]);
    k.append_marker(5u64, 0, 0, Marker::abort(0, 9, 2), Origin::Coordinator)
        .unwrap();
    assert_eq!(k.aborted_transactions(0).len(), 1);
    k.forget_aborted_before(0, 10).unwrap();
    drop(k);
    let k = ProducerStateStore::open_with(dir(), kafka_opts(&fs)).unwrap();
    assert!(
        k.aborted_transactions(0).is_empty(),
        "the forget was replayed"
    );
    assert_eq!(k.kafka_state(6u64, 0).map(|s| s.last_sequence), Some(3));
}

/// Hanging transactions, by Kafka's rule (`ProducerStateManager`
/// `hasLateTransaction`: the oldest open transaction of a partition is late
/// once its producer's last timestamp is more than
/// `transaction.max.timeout.ms` + `LATE_TRANSACTION_BUFFER_MS` (5 min) old),
/// found in the store before and after a reopen, and gone once a marker
/// ends the transaction.
#[test]
fn late_transactions_are_the_oldest_open_ones_past_the_longest_timeout() {
    use producer_state::{LATE_TRANSACTION_BUFFER_MS, LateTransaction};
    let fs = SimFs::new();
    let opts = || sim_opts(&fs).semantics(Semantics::Kafka);
    let max = 900_000; // transaction.max.timeout.ms
    let t0 = 1_700_000_000_000;
    let s = ProducerStateStore::open_with(dir(), opts()).unwrap();
    let txn = options(true);
    // Partition 0: producer 1 opens at offset 10 (time t0), producer 2
    // later at offset 20 (t0 + 1 min): producer 1's is the oldest.
    s.append_with(1u64, 0, 0, Batch::new(0, 0, 10, t0), txn)
        .unwrap();
    s.append_with(2u64, 0, 0, Batch::new(0, 0, 20, t0 + 60_000), txn)
        .unwrap();
    // Partition 1: producer 3 opened at t0 but wrote again at t0 + 10 min:
    // lateness runs from the producer's last timestamp.
    s.append_with(3u64, 1, 0, Batch::new(0, 0, 5, t0), txn)
        .unwrap();
    s.append_with(3u64, 1, 0, Batch::new(1, 1, 6, t0 + 600_000), txn)
        .unwrap();
    // Partition 2: a committed transaction is not late however old.
    s.append_with(4u64, 2, 0, Batch::new(0, 0, 0, t0), txn)
        .unwrap();
    s.append_marker(4u64, 2, 0, Marker::commit(0, 1, t0), Origin::Coordinator)
        .unwrap();
    // Partition 3: a plain (non-transactional) producer is never late.
    s.append_batch(5u64, 3, 0, Batch::new(0, 0, 0, t0)).unwrap();

    let bound = max + LATE_TRANSACTION_BUFFER_MS;
    assert!(
        s.late_transactions(t0 + bound, max).is_empty(),
        "not past it yet"
    );
    let late = |s: &ProducerStateStore, now| -> Vec<(i32, i64, i64)> {
        s.late_transactions(now, max)
            .into_iter()
            .map(|t: LateTransaction| (t.partition, t.first_offset, t.last_timestamp))
            .collect()
    };
    assert_eq!(late(&s, t0 + bound + 1), vec![(0, 10, t0)]);
    assert_eq!(
        late(&s, t0 + 600_000 + bound + 1),
        vec![(0, 10, t0), (1, 5, t0 + 600_000)]
    );
    assert_eq!(
        s.late_transactions(t0 + bound + 1, max)[0].producer_id,
        1u64.into()
    );
    // The state is durable: a reopen finds the same.
    drop(s);
    let s = ProducerStateStore::open_with(dir(), opts()).unwrap();
    assert_eq!(
        late(&s, t0 + 600_000 + bound + 1),
        vec![(0, 10, t0), (1, 5, t0 + 600_000)]
    );
    // An operator aborts producer 1's transaction: producer 2's is now the
    // oldest on partition 0, and its last timestamp is a minute later.
    s.append_marker(
        1u64,
        0,
        0,
        Marker::abort(0, 30, t0 + bound),
        Origin::Coordinator,
    )
    .unwrap();
    assert_eq!(late(&s, t0 + bound + 1), vec![]);
    assert_eq!(
        late(&s, t0 + 60_000 + bound + 1),
        vec![(0, 20, t0 + 60_000)]
    );

    // Strict mode has no transactions: nothing is ever late.
    let fs = SimFs::new();
    let strict = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
    strict.append(1u64, 0, 0, 0).unwrap();
    assert!(strict.late_transactions(i64::MAX, max).is_empty());
}

/// A Kafka-mode snapshot is built from the newest snapshot and the log on
/// the snapshot's own thread while appenders go on (the live engine is not
/// copied under the lock): each snapshot taken during concurrent appends
/// holds exactly the batches the log has below its position, read back
/// here from the segments on their own, not through the store's replay.
#[test]
fn kafka_snapshots_taken_while_appending_hold_exactly_the_log_below_them() {
    use producer_state::inspect::{self, LogOp};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fs = SimFs::new();
    fs.set_sync_delay(std::time::Duration::from_micros(100));
    let s = Arc::new(
        ProducerStateStore::open_with(
            dir(),
            sim_opts(&fs)
                .semantics(Semantics::Kafka)
                .snapshot_every_records(None)
                .keep_snapshots(100),
        )
        .unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                for seq in 0..150 {
                    for pid in t * 5..t * 5 + 5 {
                        let b = Batch::new(seq, seq, i64::from(seq), 7);
                        let o = s.append_batch(pid, (pid % 3) as i32, 0, b).unwrap();
                        assert_eq!(o, BatchOutcome::Accepted);
                    }
                }
                done.store(true, Ordering::Relaxed);
            })
        })
        .collect();
    let mut snaps = Vec::new();
    while !done.load(Ordering::Relaxed) && snaps.len() < 30 {
        if let Some(p) = s.snapshot().unwrap() {
            snaps.push(p);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    for h in hs {
        h.join().unwrap();
    }
    assert!(
        snaps.len() >= 3,
        "only {} snapshots during the appends",
        snaps.len()
    );
    // Every batch the log holds, by position.
    let mut log: Vec<(u64, u64, i32, i32)> = Vec::new();
    for (path, _) in fs.files() {
        if path.extension().is_some_and(|e| e == "wal") {
            inspect::segment(
                &fs,
                &path,
                |pos, _, op| {
                    if let LogOp::Append(r) = op {
                        let id = r.producer_id.as_numeric().unwrap();
                        log.push((pos, id, r.partition, r.last_sequence()));
                    }
                },
                &mut |_| {},
            )
            .unwrap();
        }
    }
    for path in &snaps {
        let (summary, state) = inspect::snapshot(&fs, path, &mut |_| {}).unwrap();
        let mut want: BTreeMap<(u64, i32), i32> = BTreeMap::new();
        for &(pos, id, p, last) in &log {
            if pos < summary.position {
                let e = want.entry((id, p)).or_insert(-1);
                *e = (*e).max(last);
            }
        }
        let got: BTreeMap<(u64, i32), i32> = want
            .keys()
            .map(|&(id, p)| {
                (
                    (id, p),
                    state.kafka_state(id, p).map_or(-2, |k| k.last_sequence),
                )
            })
            .collect();
        assert_eq!(got, want, "snapshot at {}", summary.position);
        assert_eq!(state.len(), want.len(), "snapshot at {}", summary.position);
    }
}
