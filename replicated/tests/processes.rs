//! Three `producer-state-node` processes on loopback, producers through
//! the [`Client`], the leader killed with SIGKILL at random moments
//! (sometimes a follower, sometimes a node isolated instead), killed nodes
//! restarted on their directories, and every message to a node (from its
//! peers and from clients) through a fault proxy that loses replies after
//! the request arrived, cuts connections, delays messages and writes them
//! in pieces.
//!
//! Checks, once the faults stop and every node has applied the same
//! entry:
//!
//! - the three logs are the same, entry for entry, and their replay
//!   through one in-memory engine (the single-node reference) answers
//!   every acknowledgement a producer got exactly as it got it, at the
//!   entry and slot its answer names;
//! - every acknowledged batch is `ACCEPTED` exactly once in that log, at
//!   the offset it was acknowledged with, and no batch is accepted twice:
//!   a batch answered `DUPLICATE` (a retry of an attempt that was
//!   committed, by the client or by the producer itself) carries the
//!   offset of its one acceptance;
//! - every node's state (exported over the network) is the reference's;
//! - after the chaos, a node that was down while the log was purged
//!   catches up by a snapshot sent through the proxy and holds the same
//!   state.
//!
//! The counts (kills, failovers and how long each took, retries, proxy
//! faults) are printed. `cargo test` runs a small count; more on demand:
//! `RAFT_PROCESS_KILLS=30 RAFT_PROCESS_PRODUCERS=16 RAFT_PROCESS_SEED=7
//! cargo test --release -p producer-state-raft --test processes -- --nocapture`.

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Rng;
use openraft::EntryPayload;
use producer_state::ProducerStateManager;
use producer_state_raft::command::apply;
use producer_state_raft::{Append, Client, ClientOptions, Command, Outcome};
use proxy::{FaultProxy, ProxyFaults};

const NODE: &str = env!("CARGO_BIN_EXE_producer-state-node");

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The node processes, killed when dropped (a failing test leaves none).
struct Nodes {
    dir: PathBuf,
    listen: BTreeMap<u64, SocketAddr>,
    /// The address the others (and clients) reach each node at: its proxy.
    reach: BTreeMap<u64, SocketAddr>,
    children: BTreeMap<u64, Child>,
    /// `--snapshot-every` and `--keep-logs`.
    snapshots: (u64, u64),
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Nodes {
    /// Starts node `id` and waits until it listens.
    fn start(&mut self, id: u64) {
        let members: Vec<String> = self.reach.iter().map(|(i, a)| format!("{i}={a}")).collect();
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{id}.err")))
            .unwrap();
        let mut child = Process::new(NODE)
            .args(["--id", &id.to_string()])
            .arg("--dir")
            .arg(self.dir.join(format!("node-{id}")))
            .args(["--listen", &self.listen[&id].to_string()])
            .args(["--members", &members.join(",")])
            .args(["--snapshot-every", &self.snapshots.0.to_string()])
            .args(["--keep-logs", &self.snapshots.1.to_string()])
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("READY") {
                    let _ = tx.send(());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while rx.recv_timeout(Duration::from_millis(50)).is_err() {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let log = std::fs::read_to_string(self.dir.join(format!("node-{id}.err")));
                panic!("node {id} did not start ({exited:?}): {log:?}");
            }
        }
        self.children.insert(id, child);
    }

    /// SIGKILL.
    fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children.remove(&id) {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

fn batch(p: u64, n: i32) -> Command {
    Command::Append(Append::batch(p, 0, 0, n * 5, n * 5 + 4, i64::from(n)))
}

/// An acknowledgement a producer got: batch `n` of producer `p` at
/// (index, slot), with its outcome.
#[derive(Clone, Debug)]
struct Ack {
    p: u64,
    n: i32,
    index: u64,
    slot: usize,
    outcome: Outcome,
    leader: u64,
    at: Instant,
}

/// Producer `p`: sends its batches one after the other through the
/// client until `stop`; now and then sends an acknowledged batch again
/// (a producer that lost the answer), which must be `DUPLICATE`.
async fn produce(
    client: Arc<Client>,
    p: u64,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && n < 1_000_000 {
        let again = n > 0 && rng.chance(0.05);
        let b = if again { n - 1 } else { n };
        let a = match client.submit(batch(p, b)).await {
            Ok(a) => a,
            Err(e) => panic!("producer {p} batch {b}: {e}"),
        };
        let outcome = a.response.outcomes[0].clone();
        assert!(
            matches!(
                outcome,
                Outcome::Accepted { .. } | Outcome::Duplicate { original: Some(_) }
            ),
            "producer {p} batch {b}: {outcome:?}"
        );
        if again {
            assert!(
                matches!(outcome, Outcome::Duplicate { .. }),
                "resent batch {b} of {p}: {outcome:?}"
            );
        }
        acks.lock().unwrap().push(Ack {
            p,
            n: b,
            index: a.log_id.index,
            slot: a.first_slot,
            outcome,
            leader: a.log_id.leader_id.node_id,
            at: Instant::now(),
        });
        if !again {
            n += 1;
        }
    }
}

/// Waits until every node has applied the same last entry; returns it.
async fn converge(client: &Client, ids: &[u64]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut applied = Vec::new();
        for &id in ids {
            applied.push(
                client
                    .status(id)
                    .await
                    .ok()
                    .and_then(|s| s.last_applied)
                    .map(|l| l.index),
            );
        }
        if let Some(Some(first)) = applied.first().copied()
            && applied.iter().all(|a| *a == Some(first))
        {
            return first;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not converge: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every committed entry of node `id`, up to `last`.
async fn log_of(client: &Client, id: u64, last: u64) -> Vec<(u64, Option<Command>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while from <= last {
        let entries = client.entries(id, from, 4096).await.unwrap();
        assert!(!entries.is_empty(), "node {id} has no entry at {from}");
        for e in entries {
            assert_eq!(e.log_id.index, from, "node {id}");
            let cmd = match e.payload {
                EntryPayload::Normal(c) => Some(c),
                _ => None,
            };
            out.push((from, cmd));
            from += 1;
        }
    }
    out.truncate((last + 1) as usize);
    out
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_killed_and_cut_off_lose_no_acknowledged_append() {
    let kills = env_or("RAFT_PROCESS_KILLS", 6);
    let producers = env_or("RAFT_PROCESS_PRODUCERS", 4);
    let seed = env_or("RAFT_PROCESS_SEED", 1);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let ids = [1u64, 2, 3];
    let listen: BTreeMap<u64, SocketAddr> = ids.iter().map(|&i| (i, common::node_addr())).collect();
    let mut proxies = BTreeMap::new();
    for &i in &ids {
        proxies.insert(i, FaultProxy::start(listen[&i], seed ^ (i << 32)).await);
    }
    let reach: BTreeMap<u64, SocketAddr> = proxies.iter().map(|(&i, p)| (i, p.addr())).collect();
    // Snapshots are written often (and so killed in the middle of), but no
    // log is purged: the whole log stays to be checked.
    let mut nodes = Nodes {
        dir: dir.path().to_path_buf(),
        listen: listen.clone(),
        reach: reach.clone(),
        children: BTreeMap::new(),
        snapshots: (300, 1_000_000),
    };
    for &i in &ids {
        nodes.start(i);
    }
    let faults = ProxyFaults {
        drop_after_request: 0.002,
        cut: 0.001,
        delay: 0.05,
        max_delay: Duration::from_millis(5),
        split: 0.02,
    };
    for p in proxies.values() {
        p.set_faults(faults.clone());
    }
    let client = Arc::new(Client::new(
        reach.iter().map(|(&i, &a)| (i, a)),
        ClientOptions::default().deadline(Duration::from_secs(60)),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            tokio::spawn(produce(
                client.clone(),
                p,
                stop.clone(),
                acks.clone(),
                seed + p,
            ))
        })
        .collect();

    // The chaos: each round, after a random while, kill the leader (most
    // often), a follower, or isolate a node; restart what was killed.
    let mut failovers = Vec::new();
    let (mut leader_kills, mut follower_kills, mut isolations) = (0, 0, 0);
    let leader_of = |client: Arc<Client>| async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            seen.clear();
            for id in [1, 2, 3] {
                let s = client.status(id).await;
                if let Ok(s) = &s
                    && s.leader == Some(id)
                {
                    return id;
                }
                seen.push(s.map(|s| (s.term, s.leader, s.last_applied)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no leader within 20 s: {seen:?}");
    };
    for round in 0..kills {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        let leader = leader_of(client.clone()).await;
        let roll = rng.below(10);
        if roll < 2 {
            // A node isolated by its proxy for a while: its connections
            // cut, new ones refused.
            let victim = ids[rng.below(3) as usize];
            proxies[&victim].isolate(true);
            tokio::time::sleep(Duration::from_millis(200 + rng.below(800))).await;
            proxies[&victim].isolate(false);
            isolations += 1;
            continue;
        }
        let victim = if roll < 8 {
            leader
        } else {
            *ids.iter()
                .filter(|&&i| i != leader)
                .nth(rng.below(2) as usize)
                .unwrap()
        };
        let killed_at = Instant::now();
        nodes.kill(victim);
        if victim == leader {
            leader_kills += 1;
            // Failover: from the kill to the first acknowledgement of an
            // entry another leader wrote.
            let deadline = killed_at + Duration::from_secs(30);
            let took = loop {
                let first = acks
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|a| a.at > killed_at && a.leader != victim)
                    .map(|a| a.at)
                    .min();
                if let Some(t) = first {
                    break t - killed_at;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: no failover after killing {victim}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            failovers.push(took);
        } else {
            follower_kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(200 + rng.below(1000))).await;
        nodes.start(victim);
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    for p in proxies.values() {
        p.set_faults(ProxyFaults::default());
        p.isolate(false);
    }

    // Every node applied the same entry: the logs, the reference, the
    // states.
    let last = converge(&client, &ids).await;
    let logs = [
        log_of(&client, 1, last).await,
        log_of(&client, 2, last).await,
        log_of(&client, 3, last).await,
    ];
    assert_eq!(logs[0], logs[1], "nodes 1 and 2 hold different logs");
    assert_eq!(logs[0], logs[2], "nodes 1 and 3 hold different logs");
    let mut reference = ProducerStateManager::new();
    let mut outcomes = BTreeMap::new();
    for (index, cmd) in &logs[0] {
        if let Some(cmd) = cmd {
            outcomes.insert(
                *index,
                (cmd.clone(), apply(&mut reference, *index, cmd).outcomes),
            );
        }
    }
    // Where each batch was accepted, per the reference.
    let mut accepted: BTreeMap<(u64, i32), Vec<i64>> = BTreeMap::new();
    for (cmd, out) in outcomes.values() {
        for (a, o) in cmd.appends().iter().zip(out) {
            if let (producer_state_raft::Producer::Id(p), Outcome::Accepted { offset }) =
                (&a.producer, o)
            {
                accepted
                    .entry((*p, a.first_sequence / 5))
                    .or_default()
                    .push(*offset);
            }
        }
    }
    let twice: Vec<_> = accepted.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(twice.is_empty(), "accepted twice: {twice:?}");
    let acks = acks.lock().unwrap().clone();
    let (mut accepted_answers, mut duplicate_answers) = (0, 0);
    for a in &acks {
        let (cmd, out) = &outcomes[&a.index];
        assert_eq!(
            cmd.appends()[a.slot],
            match batch(a.p, a.n) {
                Command::Append(x) => x,
                _ => unreachable!(),
            }
        );
        assert_eq!(
            out[a.slot], a.outcome,
            "the answer to batch {} of {} is the reference's",
            a.n, a.p
        );
        let once = accepted.get(&(a.p, a.n)).map(Vec::as_slice);
        assert_eq!(
            once,
            Some(&[common::offset(&a.outcome)][..]),
            "batch {} of {}",
            a.n,
            a.p
        );
        match a.outcome {
            Outcome::Accepted { .. } => accepted_answers += 1,
            _ => duplicate_answers += 1,
        }
    }
    for &id in &ids {
        let (at, state) = client.export(id).await.unwrap();
        assert_eq!(at.map(|l| l.index), Some(last), "node {id}");
        assert_eq!(
            common::sorted(&state),
            common::sorted(&reference),
            "node {id}'s state"
        );
    }
    let retried = client.stats().retried.load(Ordering::Relaxed);
    let sum = |f: fn(&proxy::ProxyStats) -> &std::sync::atomic::AtomicU64| {
        proxies
            .values()
            .map(|p| f(p.stats()).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    failovers.sort();
    eprintln!(
        "seed {seed}: {} entries; {} acknowledgements ({accepted_answers} ACCEPTED, {duplicate_answers} \
         DUPLICATE) from {producers} producers, {} batches acknowledged, each accepted once; 0 lost, \
         0 accepted twice; {retried} attempts retried after an unknown outcome; kills: {leader_kills} \
         leaders, {follower_kills} followers; {isolations} isolations; proxy: {} messages, {} replies \
         lost after the request, {} cuts, {} delayed, {} split, {} refused",
        last + 1,
        acks.len(),
        accepted.len(),
        sum(|s| &s.messages),
        sum(|s| &s.dropped_after_request),
        sum(|s| &s.cuts),
        sum(|s| &s.delays),
        sum(|s| &s.splits),
        sum(|s| &s.refused),
    );
    if !failovers.is_empty() {
        eprintln!(
            "failover after a leader's kill -9 ({} kills): min {:?}, median {:?}, p90 {:?}, max {:?}",
            failovers.len(),
            failovers[0],
            percentile(&failovers, 0.5),
            percentile(&failovers, 0.9),
            failovers[failovers.len() - 1]
        );
    }
    assert!(
        accepted.len() >= 20,
        "too few appends to prove anything: {}",
        accepted.len()
    );
    assert!(
        leader_kills + follower_kills >= 1 || kills < 3,
        "no kill in {kills} rounds"
    );

    // Snapshots across processes: restart with a short log, take a
    // follower down while the log is purged past it, bring it back: it is
    // sent a snapshot through its proxy, and holds the same state.
    for &i in &ids {
        nodes.kill(i);
    }
    nodes.snapshots = (50, 10);
    for &i in &ids {
        nodes.start(i);
    }
    let leader = leader_of(client.clone()).await;
    let follower = *ids.iter().find(|&&i| i != leader).unwrap();
    // The leader must purge past what the follower holds, not only its
    // first entry (purged already, maybe, by the restart's first
    // snapshot): else the follower catches up from the log.
    let held = client
        .status(follower)
        .await
        .unwrap()
        .last_log_index
        .map_or(1, |l| l.max(1));
    nodes.kill(follower);
    for p in proxies.values() {
        p.set_faults(ProxyFaults {
            cut: 0.001,
            split: 0.05,
            ..ProxyFaults::default()
        });
    }
    let purged = 'purge: {
        for n in 0..3_000 {
            client.submit(batch(1_000, n)).await.unwrap();
            if n >= 100 && n % 10 == 0 {
                let l = client.leader().unwrap();
                if client.entries(l, held + 1, 1).await.unwrap().is_empty() {
                    break 'purge true;
                }
            }
        }
        false
    };
    assert!(purged, "the leader never purged its log");
    nodes.start(follower);
    let last = converge(&client, &ids).await;
    let status = client.status(follower).await.unwrap();
    assert!(status.snapshots_installed >= 1, "{status:?}");
    let (_, want) = client
        .export(leader_of(client.clone()).await)
        .await
        .unwrap();
    let (at, got) = client.export(follower).await.unwrap();
    assert_eq!(at.map(|l| l.index), Some(last));
    assert_eq!(common::sorted(&got), common::sorted(&want));
    eprintln!(
        "snapshot: node {follower} caught up by {} snapshot(s) through its proxy ({} refused)",
        status.snapshots_installed, status.snapshots_refused
    );
}
