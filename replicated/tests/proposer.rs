//! The `Proposer`'s batching: requests that queue while proposals are in
//! flight share an entry, within the limits one entry may hold, and each
//! request is answered with its own slice of that entry's outcomes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use producer_state_raft::command::MAX_COMMAND_BYTES;
use producer_state_raft::{
    Append, Cluster, ClusterOptions, Command, Faults, NodeId, Outcome, Proposer, ProposerOptions,
    Replica,
};

/// A request of `appends` batches of distinct named producers, each name
/// about 64 KiB, so a few requests reach the most bytes an entry holds.
fn big_request(request: usize, appends: usize) -> Command {
    Command::AppendAll(
        (0..appends)
            .map(|a| {
                let name = format!("{request:02}-{a:03}-{}", "x".repeat(65_000));
                Append::batch(name.as_str(), 0, 0, 0, 9, 7)
            })
            .collect(),
    )
}

// One thread: the requests below are all queued before the batching task
// runs, so the first proposal is offered every one of them.
#[tokio::test(flavor = "current_thread")]
async fn requests_that_together_pass_the_entry_limit_go_in_several_entries() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let seen = sizes.clone();
    let options = ClusterOptions {
        observer: Some(Arc::new(move |node, index, cmd: Option<&Command>, _| {
            if let (1, Some(c)) = (node, cmd) {
                seen.lock().unwrap().push((index, c.encoded_len()));
            }
        })),
        ..ClusterOptions::default()
    };
    let cluster = Arc::new(Cluster::start(dir.path(), options).await.unwrap());
    let proposer = Proposer::new(cluster.clone());
    // Three requests of about 6.2 MiB: each is valid, all three in one
    // entry would be 18.6 MiB.
    let requests: Vec<Command> = (0..3).map(|r| big_request(r, 100)).collect();
    assert!(requests.iter().all(|r| r.validate().is_ok()));
    let total: usize = requests.iter().map(Command::encoded_len).sum();
    assert!(total > MAX_COMMAND_BYTES);
    let (a, b, c) = tokio::join!(
        proposer.submit(requests[0].clone()),
        proposer.submit(requests[1].clone()),
        proposer.submit(requests[2].clone()),
    );
    let answers = [a.unwrap(), b.unwrap(), c.unwrap()];
    for (request, answer) in requests.iter().zip(&answers) {
        assert_eq!(answer.response.outcomes.len(), request.appends().len());
        assert!(
            answer
                .response
                .outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Accepted { .. }))
        );
    }
    let entries: BTreeSet<u64> = answers.iter().map(|a| a.log_id.index).collect();
    assert_eq!(entries.len(), 2, "three requests in {entries:?}");
    let sizes = sizes.lock().unwrap().clone();
    assert!(
        sizes.iter().all(|&(_, n)| n <= MAX_COMMAND_BYTES),
        "an entry of more than {MAX_COMMAND_BYTES} bytes: {sizes:?}"
    );
    cluster.shutdown().await;
}

/// The most entries the leader had appended beyond the one it was applying,
/// seen while `requests` one-append requests (distinct producers, sent
/// 2 ms apart without waiting for answers) go through a `Proposer` with
/// `in_flight` proposals at most; every request must be accepted.
async fn most_unapplied_at_the_leader(in_flight: usize, requests: usize) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    // The leader and the count of entries its log held before the
    // requests, set once the cluster is up; the observer compares the
    // entries appended since with the entries applied since.
    let leader: Arc<OnceLock<(NodeId, Replica, u64, u64)>> = Arc::default();
    let most = Arc::new(AtomicU64::new(0));
    let (seen_leader, seen_most) = (leader.clone(), most.clone());
    let options = ClusterOptions {
        // Every message waits up to 10 ms, so a proposal takes longer to
        // commit than the gap between requests and proposals pile up as
        // far as the Proposer lets them.
        faults: Faults {
            max_delay: Duration::from_millis(10),
            ..Faults::none()
        },
        observer: Some(Arc::new(move |node, index, cmd: Option<&Command>, _| {
            let Some((id, replica, entries0, index0)) = seen_leader.get() else {
                return;
            };
            if node != *id || cmd.is_none() {
                return;
            }
            let appended = replica.log_stats().entries.load(Ordering::Relaxed) - entries0;
            let applied = index - index0;
            seen_most.fetch_max(appended.saturating_sub(applied), Ordering::Relaxed);
        })),
        ..ClusterOptions::default()
    };
    let cluster = Arc::new(Cluster::start(dir.path(), options).await.unwrap());
    let id = cluster.wait_leader(Duration::from_secs(10)).await.unwrap();
    let replica = cluster.replica(id).unwrap();
    // One request through the cluster first, so every entry before the
    // baseline (membership, the leader's blank entry) is applied.
    let (log_id, _) = cluster
        .submit(Command::Append(Append::batch("warm-up", 0, 0, 0, 0, 1)))
        .await
        .unwrap();
    cluster
        .wait_applied(log_id.index, Duration::from_secs(10))
        .await
        .unwrap();
    let entries0 = replica.log_stats().entries.load(Ordering::Relaxed);
    assert!(leader.set((id, replica, entries0, log_id.index)).is_ok());
    let proposer = Proposer::with_options(
        cluster.clone(),
        ProposerOptions::default().in_flight(in_flight),
    );
    let mut tasks = Vec::new();
    for r in 0..requests {
        let proposer = proposer.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("producer-{r}");
            proposer
                .submit(Command::Append(Append::batch(name.as_str(), 0, 0, 0, 4, 1)))
                .await
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for task in tasks {
        let answer = task.await.unwrap().unwrap();
        assert!(matches!(
            answer.response.outcomes[..],
            [Outcome::Accepted { .. }]
        ));
    }
    cluster.shutdown().await;
    most.load(Ordering::Relaxed)
}

// The entry being applied was answered last of all the leader holds, so
// the entries appended beyond it are proposals still in flight: none with
// one in flight (the next is proposed only once the last is answered, and
// it is answered after it is applied), at most two with three, and with
// three the pile-up the delays make does reach past one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_bounds_the_proposals_the_leader_holds_unanswered() {
    let one = most_unapplied_at_the_leader(1, 40).await;
    let three = most_unapplied_at_the_leader(3, 40).await;
    assert_eq!(one, 0, "one proposal in flight, yet {one} more appended");
    assert!(
        (1..=2).contains(&three),
        "three proposals in flight: {three} more appended than applied"
    );
}
