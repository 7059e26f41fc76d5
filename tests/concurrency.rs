//! Many broker threads at once: group commit, racing retries, bulk
//! appends, and crashes while 16 threads append. Thread counts and round
//! counts are bounded so the file runs in seconds.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::store_util::{dir, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AppendOutcome, AppendRequest, Batch, BatchMetadata, BatchOutcome, Error, FsyncPolicy,
    ProducerStateStore, Semantics,
};

fn store(fs: &SimFs) -> Arc<ProducerStateStore> {
    store_with(fs, Semantics::Strict)
}

fn store_with(fs: &SimFs, semantics: Semantics) -> Arc<ProducerStateStore> {
    Arc::new(
        ProducerStateStore::open_with(
            dir(),
            sim_opts(fs)
                .snapshot_every_records(Some(2000))
                .semantics(semantics),
        )
        .unwrap(),
    )
}

#[test]
fn concurrent_appenders_share_fsyncs() {
    let fs = SimFs::new();
    fs.set_sync_delay(Duration::from_millis(2));
    let s = store(&fs);
    let threads = 16;
    let per = 50;
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for seq in 0..per {
                    assert_eq!(s.append(t, 0, 0, seq).unwrap(), AppendOutcome::Accepted);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let st = s.stats();
    assert_eq!(st.records_written, threads * per as u64);
    // With 16 appenders waiting on a 2 ms fsync, groups form: far fewer
    // fsyncs than appends (up to 4 group commits overlap, so each group is
    // about a quarter of the waiting appenders).
    assert!(st.log_fsyncs * 2 < st.records_written, "{st:?}");
    for t in 0..threads {
        assert_eq!(s.get(t, 0).unwrap().last_sequence(), per - 1);
    }
}

#[test]
fn a_lone_appender_pays_one_fsync_per_append_and_no_more() {
    let fs = SimFs::new();
    let s = store(&fs);
    let before = s.stats();
    for seq in 0..100 {
        s.append(1u64, 0, 0, seq).unwrap();
        s.append(1u64, 0, 0, seq).unwrap(); // a duplicate writes nothing
    }
    let st = s.stats();
    assert_eq!(st.records_written - before.records_written, 100);
    assert_eq!(st.log_fsyncs - before.log_fsyncs, 100);
    assert_eq!(st.groups_written - before.groups_written, 100);
}

#[test]
fn a_retry_racing_its_original_is_never_accepted_twice() {
    retry_racing_its_original(Semantics::Strict, 2500);
}

#[test]
fn in_kafka_mode_a_retry_racing_its_original_is_never_accepted_twice() {
    // Kafka mode classifies a batch against a record still in flight
    // (pipelining): a retry must still wait for its original.
    retry_racing_its_original(Semantics::Kafka, 1000);
}

fn retry_racing_its_original(semantics: Semantics, rounds: i32) {
    let fs = SimFs::new();
    fs.set_sync_delay(Duration::from_micros(50));
    let s = store_with(&fs, semantics);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let tally = Arc::new(Mutex::new(HashMap::<i32, Vec<BatchOutcome>>::new()));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (s, barrier, tally) = (s.clone(), barrier.clone(), tally.clone());
            std::thread::spawn(move || {
                for seq in 0..rounds {
                    barrier.wait();
                    // Every thread sends the same batch: one original, the rest retries.
                    let b = Batch::new(seq, seq, i64::from(seq) * 10, 7);
                    let o = s.append_batch("racer", 0, 0, b).unwrap();
                    tally.lock().unwrap().entry(seq).or_default().push(o);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let tally = tally.lock().unwrap();
    assert_eq!(tally.len(), rounds as usize);
    for (seq, outcomes) in tally.iter() {
        let accepted = outcomes.iter().filter(|o| o.is_accepted()).count();
        assert_eq!(accepted, 1, "sequence {seq}: {outcomes:?}");
        let meta = Some(BatchMetadata {
            offset: i64::from(*seq) * 10,
            timestamp: 7,
        });
        for o in outcomes.iter().filter(|o| !o.is_accepted()) {
            assert_eq!(
                *o,
                BatchOutcome::Duplicate { original: meta },
                "sequence {seq}"
            );
        }
    }
    assert_eq!(s.get("racer", 0).unwrap().last_sequence(), rounds - 1);
    assert_eq!(s.stats().records_written, rounds as u64);
}

#[test]
fn a_retry_of_a_failed_original_gets_the_error_not_acceptance() {
    retry_of_a_failed_original(Semantics::Strict);
}

#[test]
fn in_kafka_mode_a_retry_of_a_failed_original_gets_the_error_not_acceptance() {
    retry_of_a_failed_original(Semantics::Kafka);
}

fn retry_of_a_failed_original(semantics: Semantics) {
    let mut fired = 0;
    for attempt in 0..40u64 {
        let fs = SimFs::new();
        fs.set_sync_delay(Duration::from_micros(200));
        let s = store_with(&fs, semantics);
        s.append("k", 0, 0, 0).unwrap();
        // The next fsync fails; four threads race the same append.
        let at = fs.ops() + 1 + attempt % 2;
        fs.set_fault(at, Fault::Error(std::io::ErrorKind::Other));
        let barrier = Arc::new(Barrier::new(4));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    s.append("k", 0, 0, 1)
                })
            })
            .collect();
        let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let accepted = results
            .iter()
            .filter(|r| matches!(r, Ok(AppendOutcome::Accepted)))
            .count();
        if fs.ops() > at {
            fired += 1;
            // The fault fired: nobody was told ACCEPTED or DUPLICATE.
            assert_eq!(accepted, 0, "{results:?}");
            assert!(results.iter().all(|r| r.is_err()), "{results:?}");
            if semantics == Semantics::Strict {
                // (Kafka mode reads the state of every record queued,
                // the lost one included, until the store is reopened.)
                assert_eq!(
                    s.get("k", 0).unwrap().last_sequence(),
                    0,
                    "nothing of the failed group applied"
                );
            }
            assert!(matches!(
                s.append("k", 0, 0, 1),
                Err(Error::Poisoned { .. })
            ));
        }
    }
    assert!(fired >= 20, "the fault fired in {fired} of 40 attempts");
}

/// One producer with five batches in flight on one partition, as
/// librdkafka sends them (`max.in.flight` 5): thread `t` sends sequences
/// `t`, `t + 5`, ... and sends one again while it is out of order (its
/// predecessor not yet classified). Every sequence must be accepted
/// exactly once, in order, and the batches must share group commits.
fn pipelined(semantics: Semantics) -> (u64, u64) {
    let fs = SimFs::new();
    fs.set_sync_delay(Duration::from_millis(2));
    let s = store_with(&fs, semantics);
    let (in_flight, total) = (5, 301);
    let deadline = Instant::now() + Duration::from_secs(60);
    // The producer's first batch goes alone, as a client's does: under
    // Kafka's rules an unknown producer's first batch may have any
    // sequence, so a later one arriving first would start the producer.
    let first = Batch::new(0, 0, 0, 7);
    assert_eq!(
        s.append_batch("pipelined", 0, 0, first).unwrap(),
        BatchOutcome::Accepted
    );
    let before = s.stats();
    let hs: Vec<_> = (0..in_flight)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for seq in (1 + t..total).step_by(in_flight as usize) {
                    let b = Batch::new(seq, seq, i64::from(seq) * 10, 7);
                    loop {
                        assert!(
                            Instant::now() < deadline,
                            "{semantics:?}: sequence {seq} never accepted"
                        );
                        match s.append_batch("pipelined", 0, 0, b).unwrap() {
                            BatchOutcome::Accepted => break,
                            BatchOutcome::OutOfOrder { .. } => std::thread::yield_now(),
                            other => panic!("sequence {seq}: {other:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(s.get("pipelined", 0).unwrap().last_sequence(), total - 1);
    let st = s.stats();
    assert_eq!(
        st.records_written - before.records_written,
        total as u64 - 1
    );
    (
        st.log_fsyncs - before.log_fsyncs,
        st.records_written - before.records_written,
    )
}

#[test]
fn pipelined_batches_of_one_producer_share_group_commits() {
    for semantics in [Semantics::Strict, Semantics::Kafka] {
        let (fsyncs, batches) = pipelined(semantics);
        // One batch per fsync would be 300 fsyncs. Five in flight share
        // them, though not five to a group: one group is written at a
        // time, so the batches answered by one group go into the group
        // after the next (about 2.5 per fsync at best; 1.7 to 2.1 seen).
        assert!(
            fsyncs * 4 < batches * 3,
            "{semantics:?}: {fsyncs} fsyncs for {batches} batches"
        );
    }
}

#[test]
fn append_all_is_one_write_and_one_fsync_with_outcomes_in_order() {
    let fs = SimFs::new();
    let s = store(&fs);
    s.append(9u64, 3, 5, 0).unwrap();
    let before = s.stats();
    let reqs: Vec<AppendRequest> = (0..32)
        .map(|p| AppendRequest::batch(1u64, p, 0, Batch::new(0, 4, i64::from(p) * 100, 1)))
        .chain([
            AppendRequest::single(9u64, 3, 4, 1), // fenced
            AppendRequest::single(9u64, 3, 5, 3), // gap
            AppendRequest::batch(1u64, 7, 0, Batch::new(0, 4, 700, 1)), // retry of an item above
            AppendRequest::single(9u64, 3, 5, 1), // accepted
        ])
        .collect();
    let out = s.append_all(&reqs);
    assert_eq!(out.len(), reqs.len());
    for o in &out[..32] {
        assert_eq!(o.as_ref().unwrap(), &BatchOutcome::Accepted);
    }
    assert_eq!(
        out[32].as_ref().unwrap().outcome(),
        AppendOutcome::FencedEpoch
    );
    assert_eq!(
        out[33].as_ref().unwrap().outcome(),
        AppendOutcome::OutOfOrder
    );
    assert_eq!(
        out[34].as_ref().unwrap(),
        &BatchOutcome::Duplicate {
            original: Some(BatchMetadata {
                offset: 700,
                timestamp: 1
            })
        }
    );
    assert_eq!(out[35].as_ref().unwrap(), &BatchOutcome::Accepted);
    let st = s.stats();
    // 33 accepted records; the retry of item 7 made the call wait once.
    assert_eq!(st.records_written - before.records_written, 33);
    assert_eq!(st.log_fsyncs - before.log_fsyncs, 2);
    // Without such a retry: exactly one write and one fsync.
    let before = s.stats();
    let reqs: Vec<_> = (0..32)
        .map(|p| AppendRequest::single(2u64, p, 0, 0))
        .collect();
    assert!(
        s.append_all(&reqs)
            .iter()
            .all(|o| o.as_ref().unwrap().is_accepted())
    );
    let st = s.stats();
    assert_eq!(
        (
            st.groups_written - before.groups_written,
            st.log_fsyncs - before.log_fsyncs
        ),
        (1, 1)
    );
}

/// A found bug: the offset of the record that numeric appends join
/// outlived the write it belonged to, and a name in the next write whose
/// bytes there looked like that record's header got a numeric append
/// spliced into it (a changed name on disk, a lost append, or a writer
/// looping forever). Each write must pack only into its own records.
#[test]
fn packing_never_joins_a_record_of_an_earlier_write() {
    let mut name = b"aaaaaaaaaaaaaaa".to_vec();
    name.extend_from_slice(&23u32.to_le_bytes());
    name.extend_from_slice(b"bbbb\x01");
    let name = String::from_utf8(name).unwrap();
    for policy in [FsyncPolicy::Always, FsyncPolicy::Never] {
        for id in [2u64, 1 << 40] {
            let fs = SimFs::new();
            let opts = sim_opts(&fs).fsync(policy).snapshot_every_records(None);
            let (name2, opts2) = (name.clone(), opts.clone());
            // On a separate thread: the bug could hang the writer.
            let (done, wait) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let s = ProducerStateStore::open_with(dir(), opts2).unwrap();
                let first = [
                    AppendRequest::single("a", 0, 0, 0),
                    AppendRequest::single(1u64, 0, 0, 0),
                ];
                let second = [
                    AppendRequest::single(name2.as_str(), 0, 0, 0),
                    AppendRequest::single(id, 0, 0, 0),
                ];
                for reqs in [&first, &second] {
                    for o in s.append_all(reqs) {
                        assert_eq!(o.unwrap(), BatchOutcome::Accepted);
                    }
                    s.sync().unwrap();
                }
                s.close().unwrap();
                done.send(()).unwrap();
            });
            wait.recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{policy:?}, id {id}: the store hung"));
            let s = ProducerStateStore::open_with(dir(), opts).unwrap();
            assert_eq!(s.recovery_report().torn_tail, None, "{policy:?}, id {id}");
            assert_eq!(s.len(), 4, "{policy:?}, id {id}");
            for key in [
                producer_state::ProducerId::from("a"),
                1u64.into(),
                name.as_str().into(),
                id.into(),
            ] {
                assert_eq!(
                    s.append(key.clone(), 0, 0, 0).unwrap(),
                    AppendOutcome::Duplicate,
                    "{policy:?}, id {id}, key {key:?}"
                );
            }
        }
    }
}

#[test]
fn a_crash_while_16_threads_append_loses_nothing_acknowledged() {
    for round in 0..24u64 {
        let fs = SimFs::new();
        fs.set_sync_delay(Duration::from_micros(100));
        let s = Arc::new(
            ProducerStateStore::open_with(
                dir(),
                sim_opts(&fs)
                    .segment_size(8 << 10)
                    .snapshot_every_records(Some(500)),
            )
            .unwrap(),
        );
        let crash_at = fs.ops() + 200 + round * 97 % 1500;
        fs.set_fault(crash_at, Fault::Crash);
        let acked = Arc::new(Mutex::new(vec![-1i32; 16]));
        let hs: Vec<_> = (0..16)
            .map(|t| {
                let (s, acked) = (s.clone(), acked.clone());
                std::thread::spawn(move || {
                    for seq in 0.. {
                        let r = if seq % 3 == 0 {
                            s.append_batch(t as u64, 0, 0, Batch::new(seq, seq, 1, 1))
                                .map(|o| o.outcome())
                        } else {
                            s.append(t as u64, 0, 0, seq)
                        };
                        match r {
                            Ok(AppendOutcome::Accepted) => acked.lock().unwrap()[t] = seq,
                            Ok(o) => panic!("thread {t}: {o}"),
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(fs.crashed());
        drop(s);
        let acked = acked.lock().unwrap().clone();
        for mode in [
            Unsynced::Drop,
            Unsynced::Keep,
            Unsynced::TornPrefix(round),
            Unsynced::Sectors(round),
        ] {
            let img = fs.crash_image(mode);
            let r = ProducerStateStore::open_with(dir(), sim_opts(&img).fsync(FsyncPolicy::Always))
                .unwrap_or_else(|e| panic!("round {round} {mode:?}: {e}"));
            for (t, &a) in acked.iter().enumerate() {
                let last = r.get(t as u64, 0).map_or(-1, |e| e.last_sequence());
                // Every acknowledged append survived; beyond it, at most the
                // thread's one append in flight in the crashed group.
                assert!(
                    last == a || last == a + 1,
                    "round {round} {mode:?} thread {t}: acked {a}, recovered {last}"
                );
            }
        }
    }
}

#[test]
fn a_slow_disk_holds_buffered_appenders_back_instead_of_buffering_without_bound() {
    // Two threads append 260k records (8 MB of log, eight times the bound)
    // under `Never` to a disk that writes 20 MiB/s: far faster than it can
    // take them. The store must make them wait rather than hold the backlog
    // in memory. (One 16 MiB segment: preallocating it is written at that
    // speed too, 0.8 s, where a 1 GiB segment took 51 s.)
    let fs = SimFs::new();
    fs.set_write_delay(Duration::from_millis(50));
    let opts = sim_opts(&fs)
        .fsync(FsyncPolicy::Never)
        .segment_size(16 << 20)
        .snapshot_every_records(None);
    let s = Arc::new(ProducerStateStore::open_with(dir(), opts.clone()).unwrap());
    let batch = 10_000;
    const ROUNDS: i32 = 13;
    let hs: Vec<_> = (0..2u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut reqs = Vec::with_capacity(batch);
                for round in 0..ROUNDS {
                    reqs.clear();
                    reqs.extend(
                        (0..batch as u64)
                            .map(|k| AppendRequest::single(t * 1_000_000 + k, 0, 0, round)),
                    );
                    for o in s.append_all(&reqs) {
                        assert!(o.unwrap().is_accepted());
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let peak = s.stats().peak_buffered_bytes;
    let bound = (1 << 20) + 2 * batch as u64 * 31;
    assert!(peak <= bound, "{peak} bytes buffered, bound {bound}");
    assert!(
        peak >= 1 << 20,
        "the disk was slow enough to fill the buffer: {peak}"
    );
    drop(s);
    fs.set_write_delay(Duration::ZERO);
    let s = ProducerStateStore::open_with(dir(), opts).unwrap();
    assert_eq!(s.len(), 2 * batch);
    assert_eq!(
        s.get(1_000_000 + 17, 0).map(|e| e.last_sequence()),
        Some(ROUNDS - 1)
    );
}
