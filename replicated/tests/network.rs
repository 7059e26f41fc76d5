//! Three nodes in this process over real TCP on loopback: the transport,
//! the node's service and the client, without process kills (those are
//! `processes.rs`'s).
//!
//! - a command is answered by the leader whichever node the client asks
//!   first, and its retry is `DUPLICATE` with the original offset;
//! - when the leader stops, the client finds the new one, and a retry of a
//!   batch answered before is `DUPLICATE` with its original offset;
//! - a node that was down while the log was purged past what it holds is
//!   sent a snapshot in pieces over TCP and ends with the same state;
//! - a frame of another version, a frame longer than the bound and bytes
//!   that are not a frame are refused, and the node goes on serving.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use producer_state_raft::wire::{self, Kind, Reply, Request};
use producer_state_raft::{
    Append, Client, ClientOptions, Command, Node, NodeOptions, Outcome, TransportOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Group {
    dir: tempfile::TempDir,
    addrs: BTreeMap<u64, SocketAddr>,
    nodes: BTreeMap<u64, Node>,
}

impl Group {
    fn options(&self, id: u64) -> NodeOptions {
        let members = self
            .addrs
            .iter()
            .map(|(&i, a)| (i, a.to_string()))
            .collect();
        let mut o = NodeOptions::new(
            id,
            self.dir.path().join(format!("n{id}")),
            self.addrs[&id],
            members,
        );
        o.heartbeat = Duration::from_millis(50);
        o.snapshot_every = 40;
        o.keep_logs = 5;
        o.transport = TransportOptions::default();
        // Small pieces, so a snapshot takes several.
        o.transport.snapshot_chunk = 256;
        o
    }

    async fn start(&mut self, id: u64) {
        let node = Node::start(self.options(id)).await.unwrap();
        self.nodes.insert(id, node);
    }

    async fn stop(&mut self, id: u64) {
        if let Some(n) = self.nodes.remove(&id) {
            n.shutdown().await;
        }
    }

    fn client(&self) -> Client {
        Client::new(
            self.addrs.iter().map(|(&i, &a)| (i, a)),
            ClientOptions::default().deadline(Duration::from_secs(20)),
        )
    }
}

fn batch(p: u64, n: i32) -> Command {
    Command::Append(Append::batch(p, 0, 0, n * 5, n * 5 + 4, i64::from(n)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_tcp_fail_over_and_catch_up_by_snapshot() {
    let mut g = Group {
        dir: tempfile::tempdir().unwrap(),
        addrs: (1..=3).map(|i| (i, common::node_addr())).collect(),
        nodes: BTreeMap::new(),
    };
    for id in 1..=3 {
        g.start(id).await;
    }
    let client = g.client();
    let first = client.submit(batch(7, 0)).await.unwrap();
    let Outcome::Accepted { offset: at } = first.response.outcomes[0] else {
        panic!("{first:?}")
    };
    let retry = client.submit(batch(7, 0)).await.unwrap();
    assert_eq!(
        retry.response.outcomes[0],
        Outcome::Duplicate {
            original: Some((at, 0))
        }
    );

    // The leader stops; the client finds the next one; the old batch's
    // retry keeps its offset.
    let leader = client.leader().unwrap();
    g.stop(leader).await;
    let after = client.submit(batch(7, 1)).await.unwrap();
    assert!(matches!(
        after.response.outcomes[0],
        Outcome::Accepted { .. }
    ));
    assert_ne!(client.leader(), Some(leader));
    let again = client.submit(batch(7, 0)).await.unwrap();
    assert_eq!(common::offset(&again.response.outcomes[0]), at);

    // While it is down, enough entries for snapshots and purges (every 40
    // entries, keeping 5) that it can only catch up by snapshot. openraft
    // postpones a purge while a replication to the stopped node is in
    // flight, so go on until the leader's log starts past index 1.
    let mut purged = false;
    for n in 0..3_000 {
        let a = client
            .submit(batch(n as u64 % 5 + 10, n / 5))
            .await
            .unwrap();
        common::offset(&a.response.outcomes[0]);
        if n >= 100 && n % 10 == 0 {
            let leader_now = client.leader().unwrap();
            if client.entries(leader_now, 1, 1).await.unwrap().is_empty() {
                purged = true;
                break;
            }
        }
    }
    assert!(purged, "the leader never purged its log");
    g.start(leader).await;
    let target = client.status(client.leader().unwrap()).await.unwrap();
    let want = target.last_applied.unwrap().index;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = client.status(leader).await.unwrap();
        if s.last_applied.is_some_and(|l| l.index >= want) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {leader} did not catch up: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // It caught up by a snapshot sent in pieces.
    let s = client.status(leader).await.unwrap();
    assert!(s.snapshots_installed >= 1, "{s:?}");
    // Every replica holds the same state once all applied the same entry.
    let leader_now = client.leader().unwrap();
    let (at_leader, state) = client.export(leader_now).await.unwrap();
    for id in 1..=3 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (at, s) = client.export(id).await.unwrap();
            if at == at_leader {
                assert_eq!(common::sorted(&s), common::sorted(&state), "node {id}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {id} at {at:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for id in 1..=3 {
        g.stop(id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_are_refused_and_the_node_goes_on() {
    let mut g = Group {
        dir: tempfile::tempdir().unwrap(),
        addrs: BTreeMap::from([(1, common::node_addr())]),
        nodes: BTreeMap::new(),
    };
    g.start(1).await;
    let addr = g.addrs[&1];
    // Another version: answered Failed, naming the versions, and closed.
    let mut f = Request::Status.encode(9).unwrap();
    f[8] = wire::VERSION + 1;
    let crc = crc32c::crc32c(&f[8..]);
    f[4..8].copy_from_slice(&crc.to_le_bytes());
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&f).await.unwrap();
    let reply = wire::read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(reply.kind, Kind::Failed);
    let Reply::Failed(why) = Reply::decode(&reply).unwrap() else {
        panic!()
    };
    assert!(why.contains("version"), "{why}");
    assert_eq!(s.read(&mut [0u8; 16]).await.unwrap(), 0, "closed");
    // A length past the bound, and garbage: the connection is closed
    // without an answer, nothing allocated for the claim.
    for bad in [
        ((wire::MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&bad).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 64]))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
    }
    // Still serving.
    let client = g.client();
    let a = client.submit(batch(1, 0)).await.unwrap();
    assert!(matches!(a.response.outcomes[0], Outcome::Accepted { .. }));
    g.stop(1).await;
}
