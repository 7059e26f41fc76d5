//! The `Proposer`'s batching: requests that queue while proposals are in
//! flight share an entry, within the limits one entry may hold, and each
//! request is answered with its own slice of that entry's outcomes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use producer_state_raft::command::MAX_COMMAND_BYTES;
use producer_state_raft::{Append, Cluster, ClusterOptions, Command, Outcome, Proposer};

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
