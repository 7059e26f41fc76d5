//! Three replicas of one partition's producer state in one process: a
//! producer appends through the leader, the leader is killed with batches
//! in flight, a new leader is elected, the producer's retries are answered
//! DUPLICATE with the original offsets (or ACCEPTED, for the batch that
//! never committed), and the old leader restarts and catches up by
//! snapshot.
//!
//! ```sh
//! cargo run -p producer-state-raft --example replicated [-- --dir /tmp/replicated]
//! ```

use std::sync::atomic::Ordering;
use std::time::Duration;

use producer_state_raft::{Append, Cluster, ClusterOptions, Command, Outcome};

const PRODUCER: u64 = 42;
const TS: i64 = 1_700_000_000_000;

fn batch(n: i32) -> Command {
    // Batch n holds the 10 records of sequences 10n..=10n+9.
    Command::Append(Append::batch(
        PRODUCER,
        0,
        0,
        n * 10,
        n * 10 + 9,
        TS + i64::from(n),
    ))
}

/// An offset is the append's place in the replicated log:
/// `log index * 65536 + slot in the entry`.
fn place(offset: i64) -> String {
    format!(" = log index {} slot {}", offset >> 16, offset & 0xffff)
}

fn show(o: &Outcome) -> String {
    match o {
        Outcome::Accepted { offset } => format!("ACCEPTED at offset {offset}{}", place(*offset)),
        Outcome::Duplicate {
            original: Some((offset, ts)),
        } => format!(
            "DUPLICATE of offset {offset}{} (timestamp {ts})",
            place(*offset)
        ),
        other => format!("{other:?}"),
    }
}

fn describe(cluster: &Cluster, id: u64) -> String {
    let Some(r) = cluster.replica(id) else {
        return format!("node {id}: down");
    };
    let (applied, mgr) = r.state();
    let window = mgr.get(PRODUCER, 0).map_or_else(
        || "no state".to_string(),
        |e| {
            let offs: Vec<_> = e
                .retained_batches()
                .filter_map(|b| b.metadata.map(|m| m.offset))
                .collect();
            format!(
                "epoch {} last sequence {} retained offsets {offs:?}",
                e.epoch(),
                e.last_sequence()
            )
        },
    );
    format!(
        "node {id}: applied up to log index {}, producer {PRODUCER}: {window}",
        applied.map_or(0, |l| l.index)
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let tmp;
    let dir = match (args.next().as_deref(), args.next()) {
        (Some("--dir"), Some(d)) => {
            let _ = std::fs::remove_dir_all(&d);
            std::path::PathBuf::from(d)
        }
        _ => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let options = ClusterOptions {
        snapshot_every: 50,
        keep_logs: 0,
        ..ClusterOptions::default()
    };
    println!("1. three replicas start in {}", dir.display());
    let cluster = Cluster::start(&dir, options).await?;
    let old = cluster.wait_leader(Duration::from_secs(10)).await?;
    println!("   node {old} is elected leader");

    println!("2. producer {PRODUCER} appends batches 0..=5 through the leader");
    let mut offsets = Vec::new();
    for n in 0..=5 {
        let (log_id, r) = cluster.submit(batch(n)).await?;
        println!(
            "   batch {n} (sequences {}..={}) -> {} [log index {}]",
            n * 10,
            n * 10 + 9,
            show(&r.outcomes[0]),
            log_id.index
        );
        if let Outcome::Accepted { offset } = r.outcomes[0] {
            offsets.push(offset);
        }
    }

    println!("3. three batches in flight when the leader dies");
    let leader = cluster.replica(old).ok_or("leader gone")?;
    for n in 6..=7 {
        let (log_id, r) = leader.submit(batch(n), Duration::from_secs(5)).await?;
        println!(
            "   batch {n} commits at log index {} ({}), but the answer is lost on the way to the producer",
            log_id.index,
            show(&r.outcomes[0])
        );
    }
    cluster.router().isolate(old, [1, 2, 3]);
    let stuck = leader.submit(batch(8), Duration::from_millis(300)).await;
    println!(
        "   batch 8 reaches the leader after it is cut off from the others: {}",
        match stuck {
            Ok(_) => "committed (unexpected)".to_string(),
            Err(e) => format!("not committed ({e})"),
        }
    );
    cluster.kill(old).await;
    cluster.router().heal();
    println!("   node {old} is killed");

    let new = cluster.wait_leader(Duration::from_secs(10)).await?;
    println!("4. node {new} is elected leader");

    println!("5. the producer retries its in-flight batches against node {new}");
    for n in 6..=8 {
        let (_, r) = cluster.submit(batch(n)).await?;
        println!("   retry of batch {n} -> {}", show(&r.outcomes[0]));
    }

    println!("6. the producer goes on; the leader snapshots and purges its log");
    for n in 9..=120 {
        cluster.submit(batch(n)).await?;
    }
    let (at, _) = cluster.replica(new).ok_or("leader gone")?.state();
    println!(
        "   batches 9..=120 accepted; leader applied up to log index {}",
        at.map_or(0, |l| l.index)
    );

    println!(
        "7. node {old} restarts from its files; the log it lacks is purged, so it is sent a snapshot"
    );
    cluster.restart(old).await?;
    let last = cluster
        .replica(new)
        .ok_or("leader gone")?
        .state()
        .0
        .map_or(0, |l| l.index);
    cluster.wait_applied(last, Duration::from_secs(20)).await?;
    let stats = cluster.router().stats();
    println!(
        "   snapshots sent and installed: {}; refused as damaged: {}",
        stats.snapshots_installed.load(Ordering::Relaxed),
        stats.snapshots_refused.load(Ordering::Relaxed)
    );
    for id in 1..=3 {
        println!("   {}", describe(&cluster, id));
    }
    let states: Vec<_> = (1..=3)
        .filter_map(|id| cluster.replica(id))
        .map(|r| r.state().1.get(PRODUCER, 0))
        .collect();
    let same = states.windows(2).all(|w| w[0] == w[1]);
    println!("8. every replica holds the same state: {same}");

    println!(
        "9. a retry of batch 120 on the restarted node's cluster is still answered from the window"
    );
    let (_, r) = cluster.submit(batch(120)).await?;
    println!("   retry of batch 120 -> {}", show(&r.outcomes[0]));
    cluster.shutdown().await;
    if !same {
        return Err("replicas differ".into());
    }
    Ok(())
}
