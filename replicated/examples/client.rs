//! A producer talking to a group of `producer-state-node` processes
//! (docs/scaling.md, "Three processes"): it sends batches through the
//! leader, sends one again as a producer does when an answer is lost, and
//! shows what each node knows.
//!
//! `cargo run -p producer-state-raft --example client -- \
//!   1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 [PRODUCER]`
//!
//! Kill the leader (Ctrl-C or kill -9) and run it again: the client finds
//! the new leader, and the batches the first run acknowledged are answered
//! `DUPLICATE` with the offsets it printed.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use producer_state_raft::{Append, Client, ClientOptions, Command, Outcome};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let members = args
        .next()
        .ok_or("usage: client 1=ADDR,2=ADDR,3=ADDR [PRODUCER]")?;
    let producer: u64 = args.next().map_or(Ok(1), |p| p.parse())?;
    let nodes = members
        .split(',')
        .map(|m| {
            let (id, addr) = m.split_once('=').ok_or("members are ID=ADDR")?;
            Ok((id.parse()?, addr.parse::<SocketAddr>()?))
        })
        .collect::<Result<Vec<(u64, SocketAddr)>>>()?;
    let ids: Vec<u64> = nodes.iter().map(|(id, _)| *id).collect();
    let client = Client::new(nodes, ClientOptions::default());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)?
        .as_millis()
        .try_into()?;
    // Batches 0..5 of sequences 0..=49, ten per batch.
    for n in 0..5 {
        let batch = Command::Append(Append::batch(producer, 0, 0, n * 10, n * 10 + 9, now));
        let answer = client.submit(batch).await?;
        let leader = answer.log_id.leader_id.node_id;
        match &answer.response.outcomes[0] {
            Outcome::Accepted { offset } => {
                println!("batch {n}: ACCEPTED at offset {offset} (leader {leader})");
            }
            Outcome::Duplicate {
                original: Some((offset, _)),
            } => println!("batch {n}: DUPLICATE of offset {offset} (leader {leader})"),
            other => println!("batch {n}: {} {other:?}", other.word()),
        }
    }
    // An answer lost on its way: the producer sends batch 4 again.
    let again = Command::Append(Append::batch(producer, 0, 0, 40, 49, now));
    let answer = client.submit(again).await?;
    println!("batch 4 again: {:?}", answer.response.outcomes[0]);
    for id in ids {
        match client.status(id).await {
            Ok(s) => println!(
                "node {id}: term {}, leader {:?}, applied {:?}",
                s.term,
                s.leader,
                s.last_applied.map(|l| l.index)
            ),
            Err(e) => println!("{e}"),
        }
    }
    Ok(())
}
