//! Lifecycle operations as log entries: an expiration decided once (its
//! time carried in the entry) makes a producer new again on every replica
//! alike; a replica that catches up by snapshot after an expiration holds
//! the same state; a partition moves between two groups by an export, an
//! `ImportPartition` entry and a `RemovePartition` entry, and its producers'
//! retries are answered at the new home with the offsets the old one gave.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use producer_state_raft::{
    Append, Cluster, ClusterObserver, ClusterOptions, Command, LifecycleOutcome, NodeId, Outcome,
    Response, SubmitError,
};

mod common;
use common::sorted;

const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn opts() -> ClusterOptions {
    ClusterOptions {
        submit_timeout: Duration::from_secs(20),
        ..ClusterOptions::default()
    }
}

/// What every replica applied: node -> index -> response.
type Seen = Arc<Mutex<BTreeMap<NodeId, BTreeMap<u64, Response>>>>;

fn recording() -> (Seen, ClusterObserver) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let observer: ClusterObserver = Arc::new(move |node, index, _cmd, r: &Response| {
        s.lock()
            .unwrap()
            .entry(node)
            .or_default()
            .insert(index, r.clone());
    });
    (seen, observer)
}

/// The response every replica computed at `index` (each replica's, which
/// must all be equal).
fn everywhere(seen: &Seen, index: u64, nodes: &[NodeId]) -> Response {
    let seen = seen.lock().unwrap();
    let all: Vec<&Response> = nodes.iter().map(|n| &seen[n][&index]).collect();
    for (n, r) in nodes.iter().zip(&all) {
        assert_eq!(*r, all[0], "node {n} at index {index}");
    }
    all[0].clone()
}

/// Every running replica's state, after all have applied up to the
/// leader's last entry, is the same.
async fn assert_same_state(cluster: &Cluster) {
    let leader = cluster.replica(cluster.leader().unwrap()).unwrap();
    let last = leader.state().0.unwrap().index;
    cluster
        .wait_applied(last, Duration::from_secs(20))
        .await
        .unwrap();
    let (_, reference) = leader.state();
    for id in cluster.running() {
        let (at, state) = cluster.replica(id).unwrap().state();
        assert_eq!(at.map(|l| l.index), Some(last), "node {id}");
        assert_eq!(sorted(&state), sorted(&reference), "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_an_expiration_is_a_new_producer_on_every_replica_alike() {
    let dir = tempfile::tempdir().unwrap();
    let (seen, observer) = recording();
    let cluster = Cluster::start(
        dir.path(),
        ClusterOptions {
            observer: Some(observer),
            ..opts()
        },
    )
    .await
    .unwrap();
    let (now, old) = (now_ms(), now_ms() - 2 * DAY_MS);
    // Producer 1 was last heard two days ago (its batch timestamps),
    // producer 2 now; producer 3 sends single-sequence appends, which
    // carry no timestamp and never expire.
    let silent = |n: i32| {
        Command::Append(Append::batch(
            1u64,
            0,
            0,
            n * 5,
            n * 5 + 4,
            old + i64::from(n),
        ))
    };
    let busy = Command::Append(Append::batch(2u64, 0, 0, 0, 4, now));
    let mut answered = BTreeMap::new();
    for n in 0..3 {
        let (_, r) = cluster.submit(silent(n)).await.unwrap();
        answered.insert(n, r.outcomes[0].clone());
    }
    let (_, busy_first) = cluster.submit(busy.clone()).await.unwrap();
    cluster
        .submit(Command::Append(Append::single(3u64, 0, 0, 0)))
        .await
        .unwrap();

    // A follower is down while the expiration is decided, and comes back
    // to apply it from its log later: the time it applies is the entry's.
    let leader = cluster.leader().unwrap();
    let follower = (1..=3).find(|&n| n != leader).unwrap();
    cluster.kill(follower).await;
    let (expired_at, keys) = cluster
        .expire(Duration::from_millis(DAY_MS as u64))
        .await
        .unwrap();
    assert_eq!(keys, 1, "only producer 1 was a day silent");
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.restart(follower).await.unwrap();

    // Producer 1 retries its last batch: it is not a duplicate any more
    // but a producer the group does not know (rule 1), on every replica;
    // it starts over at sequence 0 and is accepted at a new offset.
    let (retry_at, retry) = cluster.submit(silent(2)).await.unwrap();
    assert!(
        matches!(retry.outcomes[0], Outcome::OutOfOrder { .. }),
        "{retry:?}"
    );
    let restart = Command::Append(Append::batch(1u64, 0, 1, 0, 4, now));
    let (restart_at, restarted) = cluster.submit(restart).await.unwrap();
    let Outcome::Accepted { offset } = restarted.outcomes[0] else {
        panic!("{restarted:?}")
    };
    assert_ne!(Some(&restarted.outcomes[0]), answered.get(&0));
    // Producer 2's retry is still a duplicate with its original offset.
    let (_, again) = cluster.submit(busy).await.unwrap();
    let Outcome::Accepted {
        offset: busy_offset,
    } = busy_first.outcomes[0]
    else {
        panic!()
    };
    assert_eq!(
        again.outcomes[0],
        Outcome::Duplicate {
            original: Some((busy_offset, now))
        }
    );

    assert_same_state(&cluster).await;
    let nodes = [1, 2, 3];
    assert_eq!(
        everywhere(&seen, expired_at.index, &nodes).lifecycle,
        Some(LifecycleOutcome::Expired { keys: 1 })
    );
    assert_eq!(everywhere(&seen, retry_at.index, &nodes), retry);
    assert_eq!(
        everywhere(&seen, restart_at.index, &nodes).outcomes,
        [Outcome::Accepted { offset }]
    );
    let (_, state) = cluster.replica(follower).unwrap().state();
    assert_eq!(state.get(1u64, 0).map(|e| e.epoch()), Some(1));
    assert!(state.get(3u64, 0).is_some(), "no timestamp: never expires");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_catches_up_by_snapshot_after_an_expiration_holds_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let (seen, observer) = recording();
    let cluster = Cluster::start(
        dir.path(),
        ClusterOptions {
            snapshot_every: 20,
            keep_logs: 0,
            observer: Some(observer),
            ..opts()
        },
    )
    .await
    .unwrap();
    let leader = cluster.leader().unwrap();
    let behind = (1..=3).find(|&n| n != leader).unwrap();
    cluster.kill(behind).await;
    // While it is down: producers 0..40 on four partitions, the even ones
    // with old timestamps; an expiration; the removal of partition 3; more
    // appends, past several snapshots, so the log it lacks is purged.
    let base = 1_700_000_000_000;
    for p in 0..40u64 {
        let ts = if p % 2 == 0 { base } else { base + DAY_MS };
        let c = Command::Append(Append::batch(p, (p % 4) as i32, 0, 0, 9, ts));
        cluster.submit(c).await.unwrap();
    }
    let (_, r) = cluster
        .submit(Command::Expire {
            now_ms: base + DAY_MS,
            expiration_ms: DAY_MS,
        })
        .await
        .unwrap();
    assert_eq!(r.lifecycle, Some(LifecycleOutcome::Expired { keys: 20 }));
    let (_, removed) = cluster.remove_partition(3).await.unwrap();
    assert_eq!(removed, 10, "the odd producers of partition 3");
    let last =
        |n: i32| Command::Append(Append::batch(1u64, 1, 0, n * 10, n * 10 + 9, base + DAY_MS));
    let mut last_offset = 0;
    for n in 1..60 {
        let (_, r) = cluster.submit(last(n)).await.unwrap();
        let Outcome::Accepted { offset } = r.outcomes[0] else {
            panic!("{r:?}")
        };
        last_offset = offset;
    }
    let installed = cluster
        .router()
        .stats()
        .snapshots_installed
        .load(Ordering::Relaxed);
    cluster.restart(behind).await.unwrap();
    assert_same_state(&cluster).await;
    assert!(
        cluster
            .router()
            .stats()
            .snapshots_installed
            .load(Ordering::Relaxed)
            > installed,
        "node {behind} caught up by snapshot"
    );
    let (_, state) = cluster.replica(behind).unwrap().state();
    assert_eq!(
        state.len(),
        10,
        "the 20 even producers expired, partition 3's 10 removed"
    );
    assert!(state.get(0u64, 0).is_none() && state.get(3u64, 3).is_none());
    // The caught-up replica answers as the others: a retry of a live
    // producer's last batch is a duplicate with its offset; a retry of an
    // expired producer's middle batch is a producer it does not know.
    let (at, r) = cluster.submit(last(59)).await.unwrap();
    let dup = Outcome::Duplicate {
        original: Some((last_offset, base + DAY_MS)),
    };
    assert_eq!(r.outcomes, [dup]);
    let (gap_at, gap) = cluster
        .submit(Command::Append(Append::batch(2u64, 2, 0, 5, 9, base)))
        .await
        .unwrap();
    assert!(
        matches!(gap.outcomes[0], Outcome::OutOfOrder { .. }),
        "{gap:?}"
    );
    cluster
        .wait_applied(gap_at.index, Duration::from_secs(20))
        .await
        .unwrap();
    let all: Vec<NodeId> = cluster.running();
    assert_eq!(everywhere(&seen, at.index, &all), r);
    assert_eq!(everywhere(&seen, gap_at.index, &all), gap);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_moves_between_groups_and_retries_keep_their_offsets() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Cluster::start(a_dir.path(), opts()).await.unwrap();
    let b = Cluster::start(b_dir.path(), opts()).await.unwrap();
    let batch = |p: u64, n: i32| {
        Command::Append(Append::batch(
            p,
            5,
            0,
            n * 10,
            n * 10 + 9,
            1_000 + i64::from(n),
        ))
    };
    let mut offsets = BTreeMap::new();
    for p in 1..=3u64 {
        for n in 0..3 {
            let (_, r) = a.submit(batch(p, n)).await.unwrap();
            let Outcome::Accepted { offset } = r.outcomes[0] else {
                panic!()
            };
            offsets.insert((p, n), offset);
        }
    }
    a.submit(Command::Append(Append::single(9u64, 6, 0, 0)))
        .await
        .unwrap();
    // B already has producer 1 on another partition: no conflict.
    b.submit(Command::Append(Append::batch(1u64, 0, 0, 0, 0, 1)))
        .await
        .unwrap();

    // The move: export at A's leader (everything answered is in it),
    // import into B, remove at A.
    let export = a.export_partition(5).await.unwrap();
    assert_eq!(export.len(), 3);
    let (_, keys) = b.import_partition(&export).await.unwrap();
    assert_eq!(keys, 3);
    // A retried import (its answer lost) is answered alike, adds nothing.
    assert_eq!(b.import_partition(&export).await.unwrap().1, 3);
    assert_eq!(a.remove_partition(5).await.unwrap().1, 3);
    assert_eq!(a.remove_partition(5).await.unwrap().1, 0);

    // Retries at the new home: duplicates with the offsets A gave.
    for p in 1..=3u64 {
        let (_, r) = b.submit(batch(p, 2)).await.unwrap();
        assert_eq!(
            r.outcomes[0],
            Outcome::Duplicate {
                original: Some((offsets[&(p, 2)], 1_002))
            }
        );
        let (_, r) = b.submit(batch(p, 3)).await.unwrap();
        assert_eq!(r.outcomes[0].word(), "ACCEPTED");
    }
    // At the old home the partition is gone; partition 6 stayed.
    let (_, r) = a.submit(batch(1, 2)).await.unwrap();
    assert!(matches!(r.outcomes[0], Outcome::OutOfOrder { .. }));
    assert!(a.export_partition(6).await.unwrap().len() == 1);
    // The producers moved on at B: importing the old export again would
    // take their state back, and is refused by every replica, changing
    // nothing.
    match b.import_partition(&export).await {
        Err(SubmitError::Refused { reason, .. }) => {
            assert!(reason.contains("already has state"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_same_state(&a).await;
    assert_same_state(&b).await;
    let (_, state) = b.replica(b.leader().unwrap()).unwrap().state();
    assert_eq!(state.get(1u64, 5).unwrap().last_sequence(), 39);
    a.shutdown().await;
    b.shutdown().await;
}
