//! Real processes: a child runs all three replicas while producers append
//! and prints every answer; the parent kills it with SIGKILL at random
//! moments (so all three replicas die at once, in log writes, snapshots,
//! purges and applies), starts it again on the same directories, and at
//! the end checks every acknowledged append is still there:
//!
//! - a batch answered in two rounds (the retry of an in-flight batch) has
//!   one offset, and is `ACCEPTED` in at most one of them;
//! - after the last kill, the cluster restarted in this process answers a
//!   retry of each producer's last acknowledged batch `DUPLICATE` with the
//!   offset first given, and each producer's state is at that batch or the
//!   one it had in flight when the child was killed.
//!
//! SIGKILL ends the process, not the machine: the page cache survives, so
//! this proves that no acknowledged append is lost or accepted twice to a
//! crash of every replica's process at any moment, and that every replica
//! restarts from its own files; it cannot see a missing fsync.
//!
//! The child is this test binary run again with an environment variable
//! set; `child_process` is its entry point and does nothing otherwise.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command as Process, Stdio};
use std::sync::Arc;
use std::time::Duration;

use producer_state_raft::{Append, Cluster, ClusterOptions, Command, Outcome, Proposer};

const CHILD: &str = "PRODUCER_STATE_RAFT_CHILD";
const PRODUCERS: u64 = 4;

fn options() -> ClusterOptions {
    ClusterOptions {
        snapshot_every: 25,
        keep_logs: 3,
        submit_timeout: Duration::from_secs(30),
        ..ClusterOptions::default()
    }
}

fn batch(p: u64, n: i32) -> Command {
    Command::Append(Append::batch(p, 0, 0, n * 5, n * 5 + 4, i64::from(n)))
}

/// The child's entry point (a no-op unless run as the child).
#[test]
fn child_process() {
    let Ok(dir) = std::env::var(CHILD) else {
        return;
    };
    let start: Vec<i32> = std::env::var("START")
        .unwrap()
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cluster = Arc::new(
            Cluster::start(std::path::Path::new(&dir), options())
                .await
                .unwrap(),
        );
        let proposer = Proposer::new(cluster.clone());
        println!("READY");
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (cluster, proposer) = (cluster.clone(), proposer.clone());
                let first = start[p as usize];
                tokio::spawn(async move {
                    for n in first..first + 100_000 {
                        // Half the producers through the batcher.
                        let outcome = if p % 2 == 0 {
                            cluster.submit(batch(p, n)).await.unwrap().1.outcomes[0].clone()
                        } else {
                            proposer
                                .submit(batch(p, n))
                                .await
                                .unwrap()
                                .response
                                .outcomes[0]
                                .clone()
                        };
                        let line = match outcome {
                            Outcome::Accepted { offset } => format!("ACK {p} {n} A {offset}"),
                            Outcome::Duplicate {
                                original: Some((offset, _)),
                            } => format!("ACK {p} {n} D {offset}"),
                            other => format!("BAD {p} {n} {other:?}"),
                        };
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "{line}").unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// (producer, batch) -> (offset, how many times answered ACCEPTED).
type Acks = BTreeMap<(u64, i32), (i64, u32)>;

#[test]
fn every_replica_killed_at_random_moments_loses_no_acknowledged_append() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acks = Acks::new();
    let mut next = [0i32; PRODUCERS as usize];
    let mut seed = 0x5eed_u64;
    let rounds = 4;
    for round in 0..rounds {
        let start = next.map(|n| n.to_string()).join(",");
        let mut child = Process::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .env("START", &start)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Let it start, elect and append a while: 400 to 1,200 ms.
        std::thread::sleep(Duration::from_millis(900 + seed % 800));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        // libtest prints its own lines around the child's.
        assert!(
            lines.iter().any(|l| l.ends_with("READY")),
            "round {round}: the child did not start: {:?}",
            lines.iter().take(5).collect::<Vec<_>>()
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("BAD")),
            "round {round}: {:?}",
            lines.iter().find(|l| l.starts_with("BAD"))
        );
        let mut answered = 0;
        for line in lines.iter().filter(|l| l.starts_with("ACK ")) {
            let f: Vec<&str> = line.split(' ').collect();
            let (p, n): (u64, i32) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            let offset: i64 = f[4].parse().unwrap();
            let e = acks.entry((p, n)).or_insert((offset, 0));
            assert_eq!(
                e.0, offset,
                "round {round}: batch {n} of producer {p}: two offsets"
            );
            if f[3] == "A" {
                e.1 += 1;
            }
            next[p as usize] = next[p as usize].max(n + 1);
            answered += 1;
        }
        eprintln!("round {round}: {answered} answers");
    }
    assert!(
        acks.values().all(|(_, accepted)| *accepted <= 1),
        "accepted twice"
    );
    assert!(
        acks.len() > 20,
        "too few appends to prove anything: {}",
        acks.len()
    );

    // The last restart, in this process: every acknowledged batch is there.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = Cluster::start(dir.path(), options()).await.unwrap();
        for p in 0..PRODUCERS {
            let last = next[p as usize] - 1;
            if last < 0 {
                continue;
            }
            let (offset, _) = acks[&(p, last)];
            let (_, r) = cluster.submit(batch(p, last)).await.unwrap();
            assert_eq!(
                r.outcomes[0],
                Outcome::Duplicate {
                    original: Some((offset, i64::from(last)))
                },
                "producer {p} batch {last}"
            );
            let leader = cluster.replica(cluster.leader().unwrap()).unwrap();
            let e = leader.state().1.get(p, 0).unwrap();
            // Its last acknowledged batch, or the one in flight when the
            // child was killed (committed, its answer never printed).
            assert!(
                [last * 5 + 4, last * 5 + 9].contains(&e.last_sequence()),
                "producer {p}: last sequence {} after batch {last}",
                e.last_sequence()
            );
        }
        cluster.shutdown().await;
    });
}
