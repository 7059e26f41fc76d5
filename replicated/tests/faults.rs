//! Random faults over many seeds, checked against a single-node reference.
//!
//! Each seed runs producers against a three-replica cluster whose network
//! drops, delays, duplicates and reorders messages and loses snapshot
//! chunks, while replicas are killed and restarted, cut off and healed,
//! and snapshot transfers are damaged. Then the faults stop, every replica
//! runs again, and the test checks:
//!
//! - every replica applied the same command at each log index (and the
//!   same again when it re-applied after a restart);
//! - the committed log, run through one in-memory `ProducerStateManager`
//!   (the single-node reference), gives the state every replica holds, and
//!   at every index the outcomes every replica computed;
//! - every answer a producer got is the reference's outcome at the index
//!   it was given; an acknowledged append is in the reference (accepted
//!   where its answer says), and no append is accepted twice;
//! - each producer's state ends at its last acknowledged sequence.
//!
//! `cargo test` runs a few seeds; `RAFT_FAULT_SEEDS=N` runs N seeds from
//! `RAFT_FAULT_FIRST_SEED` (default 0) and `RAFT_FAULT_BUDGET_SECS` stops
//! starting new seeds after that many seconds (CI's longer sweep).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use producer_state::ProducerStateManager;
use producer_state_raft::command::apply;
use producer_state_raft::{
    Append, Cluster, ClusterOptions, Command, Faults, NodeId, Outcome, Producer, Proposer, Response,
};

mod common;
use common::sorted;

type Applied = BTreeMap<NodeId, BTreeMap<u64, (Option<Command>, Response)>>;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One acknowledged client request: what was sent, where it was committed,
/// what the leader answered.
struct Ack {
    command: Command,
    index: u64,
    /// Where the request's appends start in the entry (0 unless batched).
    first_slot: usize,
    response: Response,
}

const PRODUCERS: u64 = 4;
const BATCHES: i32 = 40;

/// A producer: sequential batches on its partition, a new epoch half way
/// (restarting at 0), a zombie write from the old epoch, and a two-append
/// group now and then. Every request is retried until answered.
async fn produce(
    cluster: Arc<Cluster>,
    proposer: Option<Proposer>,
    p: u64,
    acks: Arc<Mutex<Vec<Ack>>>,
) {
    let submit = |command: Command| {
        let cluster = cluster.clone();
        let proposer = proposer.clone();
        async move {
            match proposer {
                Some(pr) => {
                    let a = pr.submit(command).await.expect("answered");
                    (a.log_id.index, a.first_slot, a.response)
                }
                None => {
                    let (log_id, r) = cluster.submit(command).await.expect("answered");
                    (log_id.index, 0, r)
                }
            }
        }
    };
    let partition = (p % 2) as i32;
    let mut seq = 0;
    for n in 0..BATCHES {
        let epoch = if n < BATCHES / 2 { 0 } else { 1 };
        if n == BATCHES / 2 {
            seq = 0;
        }
        let ts = i64::from(n);
        let command = if n % 7 == 3 {
            Command::AppendAll(vec![
                Append::batch(p, partition, epoch, seq, seq + 1, ts),
                Append::batch(p, partition + 10, 0, n / 7, n / 7, ts),
            ])
        } else {
            Command::Append(Append::batch(p, partition, epoch, seq, seq + 1, ts))
        };
        seq += 2;
        let (index, first_slot, response) = submit(command.clone()).await;
        acks.lock().unwrap().push(Ack {
            command,
            index,
            first_slot,
            response,
        });
        if n == BATCHES / 2 + 1 {
            let zombie = Command::Append(Append::single(p, partition, 0, 100));
            let (index, first_slot, response) = submit(zombie.clone()).await;
            acks.lock().unwrap().push(Ack {
                command: zombie,
                index,
                first_slot,
                response,
            });
        }
    }
}

/// Kills and restarts replicas (one down at a time), cuts one off and
/// heals, and damages snapshot transfers, until `stop`.
async fn chaos(
    cluster: Arc<Cluster>,
    seed: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> BTreeMap<&'static str, u32> {
    let mut done = BTreeMap::new();
    let mut rng = Rng(seed.wrapping_mul(31) + 7);
    let mut down: Option<NodeId> = None;
    let mut steps = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && steps < 200 {
        steps += 1;
        tokio::time::sleep(Duration::from_millis(40 + rng.below(80))).await;
        match (rng.below(4), down) {
            (0, None) => {
                let id = 1 + rng.below(3);
                cluster.kill(id).await;
                down = Some(id);
                *done.entry("kill").or_default() += 1;
            }
            (0 | 1, Some(id)) => {
                cluster.restart(id).await.expect("restart");
                down = None;
                *done.entry("restart").or_default() += 1;
            }
            (2, _) => {
                let id = 1 + rng.below(3);
                cluster.router().isolate(id, [1, 2, 3]);
                tokio::time::sleep(Duration::from_millis(50 + rng.below(150))).await;
                cluster.router().heal();
                *done.entry("isolate").or_default() += 1;
            }
            _ => {
                cluster.router().damage_next_snapshots(1);
                *done.entry("damage a snapshot").or_default() += 1;
            }
        }
    }
    if let Some(id) = down {
        cluster.restart(id).await.expect("restart");
    }
    done
}

async fn run_seed(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let applied: Arc<Mutex<Applied>> = Arc::default();
    let conflicts: Arc<Mutex<Vec<String>>> = Arc::default();
    let observer = {
        let applied = applied.clone();
        let conflicts = conflicts.clone();
        Arc::new(
            move |node: NodeId, index: u64, cmd: Option<&Command>, r: &Response| {
                let mut a = applied.lock().unwrap();
                let seen = a.entry(node).or_default();
                let now = (cmd.cloned(), r.clone());
                if let Some(before) = seen.insert(index, now.clone()) {
                    // Re-applied after a restart: same command, and, from
                    // the same state, the same outcome.
                    if before != now {
                        conflicts.lock().unwrap().push(format!(
                            "node {node} index {index}: {before:?} then {now:?}"
                        ));
                    }
                }
            },
        )
    };
    let options = ClusterOptions {
        faults: Faults {
            drop_request: 0.05,
            drop_reply: 0.05,
            duplicate: 0.05,
            max_delay: Duration::from_millis(3),
            drop_chunk: 0.1,
        },
        seed,
        heartbeat: Duration::from_millis(30),
        snapshot_every: 20,
        keep_logs: 3,
        submit_timeout: Duration::from_secs(30),
        observer: Some(observer),
        ..ClusterOptions::default()
    };
    let cluster = Arc::new(Cluster::start(dir.path(), options).await.unwrap());
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let proposer = Proposer::new(cluster.clone());
    let chaos = tokio::spawn(chaos(cluster.clone(), seed, stop.clone()));
    let producers: Vec<_> = (1..=PRODUCERS)
        .map(|p| {
            // Producers 3 and 4 share a proposal batcher: their requests
            // travel in shared entries.
            let proposer = (p >= 3).then(|| proposer.clone());
            tokio::spawn(produce(cluster.clone(), proposer, p, acks.clone()))
        })
        .collect();
    for h in producers {
        h.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let chaos_log = chaos.await.unwrap();

    // Calm: no faults, every replica up, one more commit, all caught up.
    cluster.router().set_faults(Faults::none());
    cluster.router().heal();
    for id in 1..=3 {
        if cluster.replica(id).is_none() {
            cluster.restart(id).await.unwrap();
        }
    }
    let (last, _) = cluster
        .submit(Command::Append(Append::single(999u64, 0, 0, 0)))
        .await
        .unwrap();
    cluster
        .wait_applied(last.index, Duration::from_secs(30))
        .await
        .unwrap();

    let conflicts = conflicts.lock().unwrap().clone();
    assert!(conflicts.is_empty(), "seed {seed}: {conflicts:#?}");
    let applied = applied.lock().unwrap().clone();

    // The committed log: every index some replica applied, the same
    // command on every replica that applied it.
    let mut log: BTreeMap<u64, Option<Command>> = BTreeMap::new();
    for (node, entries) in applied.iter() {
        for (index, (cmd, _)) in entries {
            if let Some(other) = log.insert(*index, cmd.clone()) {
                assert_eq!(&other, cmd, "seed {seed}: node {node} index {index}");
            }
        }
    }
    let first = *log.keys().next().unwrap();
    assert_eq!(
        log.keys().copied().collect::<Vec<_>>(),
        (first..=last.index).collect::<Vec<_>>(),
        "seed {seed}: the applied log has holes"
    );

    // The single-node reference over the committed log.
    let mut reference = ProducerStateManager::new();
    let mut outcomes: BTreeMap<u64, Response> = BTreeMap::new();
    let mut accepted: BTreeMap<(Producer, i32, i16, i32, i32), Vec<i64>> = BTreeMap::new();
    for (index, cmd) in &log {
        let Some(cmd) = cmd else { continue };
        let r = apply(&mut reference, *index, cmd);
        for (a, o) in cmd.appends().iter().zip(&r.outcomes) {
            if let Outcome::Accepted { offset } = o {
                accepted
                    .entry((
                        a.producer.clone(),
                        a.partition,
                        a.epoch,
                        a.first_sequence,
                        a.last_sequence,
                    ))
                    .or_default()
                    .push(*offset);
            }
        }
        outcomes.insert(*index, r);
    }
    // Every replica's outcomes and final state are the reference's.
    for (node, entries) in applied.iter() {
        for (index, (cmd, r)) in entries {
            if cmd.is_some() {
                assert_eq!(
                    Some(r),
                    outcomes.get(index),
                    "seed {seed}: node {node} index {index}"
                );
            }
        }
    }
    for id in 1..=3 {
        let (at, state) = cluster.replica(id).unwrap().state();
        assert_eq!(
            at.map(|l| l.index),
            Some(last.index),
            "seed {seed} node {id}"
        );
        assert_eq!(sorted(&state), sorted(&reference), "seed {seed}: node {id}");
    }
    // Nothing accepted twice.
    for (key, offsets) in &accepted {
        assert_eq!(
            offsets.len(),
            1,
            "seed {seed}: {key:?} accepted at {offsets:?}"
        );
    }
    // Every answer is the reference's outcome at its index; an acknowledged
    // append is in the reference where its answer says.
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    let mut last_acked: BTreeMap<(Producer, i32), (i16, i32)> = BTreeMap::new();
    for ack in acks.iter() {
        let n = ack.command.appends().len();
        let committed = outcomes
            .get(&ack.index)
            .and_then(|r| r.outcomes.get(ack.first_slot..ack.first_slot + n));
        assert_eq!(
            Some(&ack.response.outcomes[..]),
            committed,
            "seed {seed}: answer at index {} slot {}",
            ack.index,
            ack.first_slot
        );
        for (a, o) in ack.command.appends().iter().zip(&ack.response.outcomes) {
            let key = (
                a.producer.clone(),
                a.partition,
                a.epoch,
                a.first_sequence,
                a.last_sequence,
            );
            match o {
                Outcome::Accepted { offset }
                | Outcome::Duplicate {
                    original: Some((offset, _)),
                } => {
                    assert_eq!(
                        accepted.get(&key),
                        Some(&vec![*offset]),
                        "seed {seed}: {key:?}"
                    );
                    let l = last_acked
                        .entry((a.producer.clone(), a.partition))
                        .or_insert((a.epoch, a.last_sequence));
                    *l = (*l).max((a.epoch, a.last_sequence));
                }
                Outcome::FencedEpoch { current_epoch: 1 } => {
                    assert_eq!(a.epoch, 0, "seed {seed}: only the zombie is fenced")
                }
                other => panic!("seed {seed}: {key:?} answered {other:?}"),
            }
        }
    }
    for ((producer, partition), last_seq) in &last_acked {
        let id = match producer {
            Producer::Id(n) => *n,
            Producer::Name(_) => unreachable!(),
        };
        let e = reference.get(id, *partition).unwrap();
        assert_eq!(
            (e.epoch(), e.last_sequence()),
            *last_seq,
            "seed {seed}: {producer:?} {partition}"
        );
    }
    let answered = acks.len();
    assert!(answered >= (PRODUCERS as usize) * (BATCHES as usize));
    let stats = cluster.router().stats();
    let dropped = stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let duplicated = stats.duplicated.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        dropped > 0 && duplicated > 0,
        "seed {seed}: faults were injected"
    );
    eprintln!(
        "seed {seed}: {answered} answers, log {first}..={}, {dropped} dropped, {duplicated} duplicated, \
         snapshots {} installed {} refused, chaos {:?}",
        last.index,
        stats
            .snapshots_installed
            .load(std::sync::atomic::Ordering::Relaxed),
        stats
            .snapshots_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        chaos_log,
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_over_many_seeds_match_a_single_node_reference() {
    let seeds: u64 = std::env::var("RAFT_FAULT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let first: u64 = std::env::var("RAFT_FAULT_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let budget = std::env::var("RAFT_FAULT_BUDGET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let started = Instant::now();
    let mut ran = 0;
    for seed in first..first + seeds {
        if budget.is_some_and(|b| started.elapsed() >= b) {
            break;
        }
        run_seed(seed).await;
        ran += 1;
    }
    let names: BTreeSet<u64> = (first..first + ran).collect();
    eprintln!(
        "fault seeds passed: {ran} ({:?}..) in {:.1?}",
        names.first(),
        started.elapsed()
    );
    assert!(ran > 0);
}
