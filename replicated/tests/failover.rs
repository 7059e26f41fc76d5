//! A leader dies with appends in flight; the producer retries them against
//! the new leader and is answered DUPLICATE with the original offsets;
//! restarted and new replicas catch up (by log, then by snapshot) to the
//! same state; a damaged snapshot transfer is refused and retried.

use std::time::Duration;

use producer_state_raft::{Append, Cluster, ClusterOptions, Command, Outcome};

fn opts() -> ClusterOptions {
    ClusterOptions {
        submit_timeout: Duration::from_secs(20),
        ..ClusterOptions::default()
    }
}

fn batch(producer: u64, n: i32) -> Command {
    Command::Append(Append::batch(
        producer,
        0,
        0,
        n * 10,
        n * 10 + 9,
        1000 + i64::from(n),
    ))
}

fn accepted_offset(o: &Outcome) -> i64 {
    match o {
        Outcome::Accepted { offset } => *offset,
        other => panic!("expected ACCEPTED, got {other:?}"),
    }
}

/// Every running replica holds exactly the same entries.
fn assert_same_state(cluster: &Cluster) {
    let mut states = cluster.running().into_iter().map(|id| {
        let (applied, mgr) = cluster.replica(id).unwrap().state();
        let mut v: Vec<_> = mgr
            .iter()
            .map(|(p, part, e)| (p.to_string(), part, e))
            .collect();
        v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        (id, applied, v)
    });
    let (first_id, first_applied, first) = states.next().unwrap();
    for (id, applied, v) in states {
        assert_eq!(applied, first_applied, "node {id} vs node {first_id}");
        assert_eq!(v, first, "node {id} vs node {first_id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_a_leader_dies_are_duplicates_with_the_original_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), opts()).await.unwrap();
    let old = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();

    // Three producers, four batches each, acknowledged.
    let mut offsets = std::collections::BTreeMap::new();
    for n in 0..4 {
        for p in 1..=3u64 {
            let (_, r) = cluster.submit(batch(p, n)).await.unwrap();
            offsets.insert((p, n), accepted_offset(&r.outcomes[0]));
        }
    }
    // Producers 1 and 2: their fifth batch commits, but the answer never
    // reaches them (the leader dies right after answering).
    let leader = cluster.replica(old).unwrap();
    let mut lost = std::collections::BTreeMap::new();
    for p in 1..=2u64 {
        let (_, r) = leader
            .submit(batch(p, 4), Duration::from_secs(5))
            .await
            .unwrap();
        lost.insert(p, accepted_offset(&r.outcomes[0]));
    }
    // Producer 3: its fifth batch reaches the leader after the leader is
    // cut off from the others, so it never commits.
    cluster.router().isolate(old, [1, 2, 3]);
    let stuck = leader.submit(batch(3, 4), Duration::from_millis(300)).await;
    assert!(
        stuck.is_err(),
        "a leader cut off from a majority committed: {stuck:?}"
    );
    cluster.kill(old).await;
    cluster.router().heal();
    let new = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    assert_ne!(new, old);

    // Each producer retries its last acknowledged batch and its in-flight
    // one against the new leader.
    for p in 1..=3u64 {
        let (_, r) = cluster.submit(batch(p, 3)).await.unwrap();
        assert_eq!(
            r.outcomes[0],
            Outcome::Duplicate {
                original: Some((offsets[&(p, 3)], 1003))
            }
        );
        let (_, r) = cluster.submit(batch(p, 4)).await.unwrap();
        let fifth = match lost.get(&p) {
            // Committed before the failover: a duplicate with the offset
            // the lost answer carried.
            Some(&offset) => {
                assert_eq!(
                    r.outcomes[0],
                    Outcome::Duplicate {
                        original: Some((offset, 1004))
                    },
                    "producer {p}"
                );
                offset
            }
            // Never committed: accepted now, at a new offset.
            None => accepted_offset(&r.outcomes[0]),
        };
        // A second retry is a duplicate of whichever attempt committed.
        let (_, again) = cluster.submit(batch(p, 4)).await.unwrap();
        assert_eq!(
            again.outcomes[0],
            Outcome::Duplicate {
                original: Some((fifth, 1004))
            }
        );
        offsets.insert((p, 4), fifth);
        // The producer goes on: the next batch is accepted.
        let (_, r) = cluster.submit(batch(p, 5)).await.unwrap();
        offsets.insert((p, 5), accepted_offset(&r.outcomes[0]));
    }

    // The old leader restarts from its files (with producer 3's
    // uncommitted entry at its end, which the new leader's log replaces)
    // and catches up from the log.
    let back = cluster.restart(old).await.unwrap();
    let last = cluster.replica(new).unwrap().state().0.unwrap().index;
    cluster
        .wait_applied(last, Duration::from_secs(20))
        .await
        .unwrap();
    assert_same_state(&cluster);
    let (_, mgr) = back.state();
    for p in 1..=3u64 {
        let e = mgr.get(p, 0).unwrap();
        assert_eq!(e.last_sequence(), 59);
        let kept: Vec<_> = e
            .retained_batches()
            .map(|b| b.metadata.unwrap().offset)
            .collect();
        let want: Vec<_> = (1..=5).map(|n| offsets[&(p, n)]).collect();
        assert_eq!(
            kept, want,
            "producer {p}'s retry window on the restarted node"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_catches_up_by_snapshot_and_a_damaged_transfer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(
        dir.path(),
        ClusterOptions {
            snapshot_every: 50,
            keep_logs: 0,
            ..opts()
        },
    )
    .await
    .unwrap();
    let group = |n: i32| {
        Command::AppendAll(
            (0..20u64)
                .map(|p| Append::batch(p, (p % 4) as i32, 0, n, n, i64::from(n)))
                .collect(),
        )
    };
    for n in 0..120 {
        let (_, r) = cluster.submit(group(n)).await.unwrap();
        assert!(r.outcomes.iter().all(|o| o.word() == "ACCEPTED"));
    }
    // The log below the last snapshot is purged on the leader, so node 4
    // can only be brought up by a snapshot. The first two transfers are
    // damaged in flight: the receiver refuses them and keeps its (empty)
    // state, and the leader sends again.
    cluster.router().damage_next_snapshots(2);
    cluster.add_member(4).await.unwrap();
    let last = cluster
        .replica(cluster.leader().unwrap())
        .unwrap()
        .state()
        .0
        .unwrap()
        .index;
    cluster
        .wait_applied(last, Duration::from_secs(20))
        .await
        .unwrap();
    let stats = cluster.router().stats();
    assert_eq!(
        stats
            .snapshots_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert!(
        stats
            .snapshots_installed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    assert_same_state(&cluster);
    // The new replica answers a retry exactly as the others would.
    let (_, mgr) = cluster.replica(4).unwrap().state();
    assert_eq!(mgr.len(), 20);
    assert_eq!(mgr.get(7u64, 3).unwrap().last_sequence(), 119);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_replica_restarts_the_state_is_back_and_no_entry_is_applied_twice() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let applies: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let seen = applies.clone();
    let options = ClusterOptions {
        snapshot_every: 30,
        keep_logs: 5,
        observer: Some(Arc::new(move |node, index, _, _| {
            seen.lock().unwrap().push((node, index))
        })),
        ..opts()
    };
    let cluster = Cluster::start(dir.path(), options.clone()).await.unwrap();
    let mut offsets = Vec::new();
    for n in 0..100 {
        let (_, r) = cluster.submit(batch(5, n)).await.unwrap();
        offsets.push(accepted_offset(&r.outcomes[0]));
    }
    let last = cluster
        .replica(cluster.leader().unwrap())
        .unwrap()
        .state()
        .0
        .unwrap();
    cluster
        .wait_applied(last.index, Duration::from_secs(20))
        .await
        .unwrap();
    let before: Vec<_> = (1..=3)
        .map(|id| cluster.replica(id).unwrap().state())
        .collect();
    cluster.shutdown().await;
    drop(cluster);

    // Each replica restarts from its snapshot (at most 30 entries old) and
    // its log; what it applies now are only the entries after the
    // snapshot, each once.
    applies.lock().unwrap().clear();
    let cluster = Cluster::start(dir.path(), options).await.unwrap();
    for id in 1..=3 {
        let snapshot_at = std::fs::metadata(cluster.dir(id).join("raft-snapshot")).is_ok();
        assert!(snapshot_at, "node {id} wrote a snapshot");
    }
    let (_, r) = cluster.submit(batch(5, 99)).await.unwrap();
    assert_eq!(
        r.outcomes[0],
        Outcome::Duplicate {
            original: Some((offsets[99], 1099))
        }
    );
    let now = cluster
        .replica(cluster.leader().unwrap())
        .unwrap()
        .state()
        .0
        .unwrap();
    cluster
        .wait_applied(now.index, Duration::from_secs(20))
        .await
        .unwrap();
    let applies = applies.lock().unwrap().clone();
    for id in 1..=3u64 {
        let mine: Vec<u64> = applies
            .iter()
            .filter(|(n, _)| *n == id)
            .map(|(_, i)| *i)
            .collect();
        let unique: std::collections::BTreeSet<_> = mine.iter().collect();
        assert_eq!(
            unique.len(),
            mine.len(),
            "node {id} applied an entry twice: {mine:?}"
        );
        assert!(
            mine.windows(2).all(|w| w[1] == w[0] + 1),
            "node {id}: {mine:?}"
        );
        assert!(
            mine.len() <= 30 + 5 + 3,
            "node {id} re-applied {} entries: more than since its snapshot",
            mine.len()
        );
        let (at, state) = cluster.replica(id).unwrap().state();
        assert_eq!(at, Some(now), "node {id}");
        let (_, old) = &before[(id - 1) as usize];
        let entry = state.get(5u64, 0).unwrap();
        assert_eq!(Some(entry), old.get(5u64, 0), "node {id}");
    }
    assert_same_state(&cluster);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_member_that_cannot_catch_up_gives_up_at_the_deadline() {
    // The log below the snapshot is purged, and every snapshot transfer to
    // the new replica is damaged: it can never catch up. Adding it must
    // fail once `submit_timeout` has passed, without making it a voter
    // (four voters of which one is useless tolerate no failure).
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(
        dir.path(),
        ClusterOptions {
            snapshot_every: 20,
            keep_logs: 0,
            submit_timeout: Duration::from_secs(2),
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    for n in 0..30 {
        cluster.submit(batch(1, n)).await.unwrap();
    }
    // Once the leader has purged its log below a snapshot.
    let leader = cluster.replica(cluster.leader().unwrap()).unwrap();
    leader
        .raft()
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.purged.is_some(), "a purge")
        .await
        .unwrap();
    cluster.router().damage_next_snapshots(u64::MAX);
    let started = std::time::Instant::now();
    let added = tokio::time::timeout(Duration::from_secs(20), cluster.add_member(4)).await;
    match added {
        Err(_) => panic!("add_member still waiting after 20 s"),
        Ok(Ok(())) => panic!("a replica that cannot catch up was added"),
        Ok(Err(e)) => {
            let took = started.elapsed();
            assert!(took < Duration::from_secs(5), "gave up after {took:?}: {e}");
        }
    }
    // It was not made a voter, and the group goes on without it.
    let leader = cluster.replica(cluster.leader().unwrap()).unwrap();
    let voters: Vec<u64> = leader
        .raft()
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(voters, [1, 2, 3]);
    cluster.router().damage_next_snapshots(0);
    let (_, r) = cluster.submit(batch(1, 30)).await.unwrap();
    accepted_offset(&r.outcomes[0]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_for_good_is_passed_over() {
    // The leader is cut off from the others and stays so. It still
    // believes it leads (openraft 0.9's leader does not step down without
    // a quorum), while the others elect a new one in a higher term: a
    // submit must reach the new leader, not wait on the old one until it
    // gives up.
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(
        dir.path(),
        ClusterOptions {
            submit_timeout: Duration::from_secs(5),
            ..ClusterOptions::default()
        },
    )
    .await
    .unwrap();
    cluster.submit(batch(1, 0)).await.unwrap();
    let old = cluster.wait_leader(Duration::from_secs(5)).await.unwrap();
    cluster.router().isolate(old, [1, 2, 3]);
    let (log_id, r) = match cluster.submit(batch(1, 1)).await {
        Ok(answer) => answer,
        Err(e) => panic!("the majority side has a leader, but: {e}"),
    };
    accepted_offset(&r.outcomes[0]);
    assert_ne!(log_id.leader_id.node_id, old);
    assert_ne!(cluster.leader(), Some(old));
    cluster.router().heal();
    cluster.shutdown().await;
}
