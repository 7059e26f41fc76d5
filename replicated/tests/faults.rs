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
//! Beside the producers, a lifecycle actor writes short-lived keys and
//! proposes expirations (with the time in the entry), partition removals
//! and partition imports, through the cluster and through the
//! `Proposer`: the reference applies those entries too, so every
//! replica's state and every lifecycle answer is checked against it.
//!
//! `cargo test` runs a few seeds; `RAFT_FAULT_SEEDS=N` runs N seeds from
//! `RAFT_FAULT_FIRST_SEED` (default 0) and `RAFT_FAULT_BUDGET_SECS` stops
//! starting new seeds after that many seconds (CI's longer sweep).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use producer_state::{Batch, ProducerStateManager};
use producer_state_raft::command::apply;
use producer_state_raft::{
    Append, Cluster, ClusterOptions, Command, Faults, LifecycleOutcome, NodeId, Outcome, Producer,
    Proposer, Response,
};

mod common;
use common::{Rng, sorted};

type Applied = BTreeMap<NodeId, BTreeMap<u64, (Option<Command>, Response)>>;

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
/// The producers' batch timestamps start here: far from the lifecycle
/// actor's expirations, which forget only keys with timestamps below
/// [`LIFECYCLE_PARTITIONS`]'s few hundred milliseconds.
const TS_BASE: i64 = 1_000_000;
/// Partitions from here on are the lifecycle actor's; the producers'
/// (0, 1, 10, 11) are below.
const LIFECYCLE_PARTITIONS: i32 = 20;

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
        let ts = TS_BASE + i64::from(n);
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

/// Short-lived keys and the lifecycle entries that forget or add them, in
/// cycles of six steps: producer 100, 101 or 102 (a different one each
/// cycle) appends on partitions 20 and 30 with timestamps that grow from
/// 0; an expiration of every key older than three steps (the time carried
/// in the entry); producer 200 appends on partition 40 after the batch it
/// was imported with; partition 30 or 40 is removed; partition 40 is
/// imported (refused while producer 200 has moved on there, accepted
/// after the partition's removal). A forgotten key starts over at
/// sequence 0, as a client does after UNKNOWN_PRODUCER_ID.
async fn lifecycle(cluster: Arc<Cluster>, proposer: Proposer, acks: Arc<Mutex<Vec<Ack>>>) {
    const IMPORTED_TS: i64 = TS_BASE / 2;
    let export = {
        let mut other = ProducerStateManager::new();
        for pid in [200u64, 201] {
            other.append_batch(pid, 40, 0, Batch::new(0, 9, 7 << 16, IMPORTED_TS));
        }
        other.export_partition(40).unwrap()
    };
    let mut next_seq: BTreeMap<(u64, i32), i32> = BTreeMap::new();
    for k in 0..30i64 {
        let command = match k % 6 {
            0 | 1 => {
                let pid = 100 + (k as u64 / 6) % 3;
                let partition = if k % 2 == 0 { 20 } else { 30 };
                let seq = next_seq.get(&(pid, partition)).copied().unwrap_or(0);
                Command::Append(Append::batch(pid, partition, 0, seq, seq, k * 10))
            }
            2 => Command::Expire {
                now_ms: TS_BASE,
                expiration_ms: TS_BASE - (k - 3) * 10,
            },
            3 => {
                let seq = next_seq.get(&(200, 40)).copied().unwrap_or(10);
                Command::Append(Append::batch(200u64, 40, 0, seq, seq, IMPORTED_TS + k))
            }
            4 => Command::RemovePartition {
                partition: if k % 12 == 4 { 30 } else { 40 },
            },
            _ => Command::import_partition(&export),
        };
        // Half through the Proposer (a lifecycle command goes alone there),
        // half straight to the cluster.
        let (index, first_slot, response) = if k % 2 == 0 {
            let a = proposer.submit(command.clone()).await.expect("answered");
            (a.log_id.index, a.first_slot, a.response)
        } else {
            let (log_id, r) = cluster.submit(command.clone()).await.expect("answered");
            (log_id.index, 0, r)
        };
        match (command.appends().first(), &response.lifecycle) {
            (Some(a), _) => {
                let Producer::Id(pid) = a.producer else {
                    unreachable!()
                };
                let next = match response.outcomes.first() {
                    Some(Outcome::Accepted { .. } | Outcome::Duplicate { .. }) => {
                        a.first_sequence + 1
                    }
                    _ => 0,
                };
                next_seq.insert((pid, a.partition), next);
            }
            (None, Some(LifecycleOutcome::Imported { .. })) => {
                next_seq.insert((200, 40), 10);
            }
            (None, _) => {}
        }
        acks.lock().unwrap().push(Ack {
            command,
            index,
            first_slot,
            response,
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
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

/// A short run can end before the router has dropped or duplicated a
/// message (seeds differ, and the machine's speed decides how many
/// messages a run sends). Appends keep flowing under the same faults
/// until both have happened, at most 500 of them or 30 s, so that the
/// check after the run asserts that faults were met rather than hoping.
/// Producer 998 has partition 0 to itself; what it gets is checked with
/// everything else against the reference.
async fn keep_traffic_until_faults(cluster: &Cluster) {
    let seen = || {
        let stats = cluster.router().stats();
        stats.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0
            && stats.duplicated.load(std::sync::atomic::Ordering::Relaxed) > 0
    };
    let until = Instant::now() + Duration::from_secs(30);
    let mut sequence = 0;
    while !seen() && sequence < 500 && Instant::now() < until {
        let append = Command::Append(Append::single(998u64, 0, 0, sequence));
        // A submit cut off by a fault may still commit: the reference
        // replays the committed log, whatever the answer here was.
        let _ = tokio::time::timeout(Duration::from_secs(2), cluster.submit(append)).await;
        sequence += 1;
    }
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
    let mut producers: Vec<_> = (1..=PRODUCERS)
        .map(|p| {
            // Producers 3 and 4 share a proposal batcher: their requests
            // travel in shared entries.
            let proposer = (p >= 3).then(|| proposer.clone());
            tokio::spawn(produce(cluster.clone(), proposer, p, acks.clone()))
        })
        .collect();
    producers.push(tokio::spawn(lifecycle(
        cluster.clone(),
        proposer.clone(),
        acks.clone(),
    )));
    for h in producers {
        h.await.unwrap();
    }
    keep_traffic_until_faults(&cluster).await;
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
            if a.partition >= LIFECYCLE_PARTITIONS {
                // Short-lived keys start over once forgotten.
                continue;
            }
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
    let mut lifecycle_answers: BTreeMap<&'static str, u64> = BTreeMap::new();
    for ack in acks.iter() {
        if !ack.command.is_append() {
            // A lifecycle entry: its answer is the reference's, whole.
            assert_eq!(
                Some(&ack.response),
                outcomes.get(&ack.index),
                "seed {seed}: lifecycle answer at index {}",
                ack.index
            );
            let (kind, keys) = match &ack.response.lifecycle {
                Some(LifecycleOutcome::Expired { keys }) => ("expired", *keys),
                Some(LifecycleOutcome::PartitionRemoved { keys }) => ("removed", *keys),
                Some(LifecycleOutcome::Imported { keys }) => ("imported", *keys),
                Some(LifecycleOutcome::ImportRefused { .. }) => ("import refused", 1),
                None => panic!("seed {seed}: a lifecycle command without its answer"),
            };
            *lifecycle_answers.entry(kind).or_default() += keys;
            continue;
        }
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
            if a.partition >= LIFECYCLE_PARTITIONS {
                continue;
            }
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
    // The lifecycle entries did something: keys expired, were removed,
    // were imported (partition 40's two, more than once) and an import was
    // refused while they were there.
    for kind in ["expired", "removed", "imported", "import refused"] {
        assert!(
            lifecycle_answers.get(kind).is_some_and(|&n| n > 0),
            "seed {seed}: no key {kind}: {lifecycle_answers:?}"
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
         snapshots {} installed {} refused, chaos {:?}, lifecycle keys {lifecycle_answers:?}",
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
