//! One replica as a network service: the node process.
//!
//! A [`Node`] runs one replica on its own directory and listens on one
//! address for both its peers (openraft's messages, [`transport`]) and
//! clients ([`Client`](crate::Client)): frames of [`wire`]. It joins the
//! group its [`NodeOptions::members`] name: a replica with no log
//! initialises itself with that membership (every member doing so with
//! the same membership is safe: they write the same first entry), and one
//! with a log goes on from it.
//!
//! Clients' commands: the leader batches concurrent ones into shared
//! entries ([`Proposer::for_replica`]) and answers each with its outcomes
//! once its own state machine applied the entry. A follower (or a leader
//! that lost its leadership meanwhile) answers "not the leader", naming
//! the leader it knows of and that leader's address, and the client goes
//! there: redirection, not forwarding, so a command crosses the network
//! once and a follower holds no client state. An answer whose outcome is
//! unknown (the proposal was not committed within a second, or the term
//! changed) says so, and the client retries the same command.
//!
//! Each connection is read by one task. openraft's requests are answered
//! in the order they came (snapshot pieces must be); clients' requests are
//! answered concurrently, at most [`MAX_IN_FLIGHT`] per connection (the
//! reader waits for a slot), and the answers of a connection go out
//! through one writer, several frames per write when they queue.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::BasicNode;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::NodeId;
use crate::command::Command;
use crate::log::LogStore;
use crate::node::{Replica, StartError, SubmitError, raft_config};
use crate::proposer::{Proposer, ProposerOptions};
use crate::state::position_of;
use crate::transport::{
    self, ReceivedSnapshots, SnapshotReceiver, TcpNetwork, TransportOptions, answer_raft,
};
use crate::wire::{self, FrameError, MAX_FRAME, Reply, Request, Status, SubmitReply};

/// Client requests answered at once on one connection, at most.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The most committed entries one `Entries` request is answered with.
const MAX_ENTRIES: usize = 4096;

/// How a node runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeOptions {
    /// This replica's id (not 0).
    pub id: NodeId,
    /// Its directory (created if missing).
    pub dir: PathBuf,
    /// Where it listens, for peers and clients.
    pub listen: SocketAddr,
    /// Every member of the group and the address the others reach it at
    /// (this node's own included).
    pub members: BTreeMap<NodeId, String>,
    /// Heartbeat interval; elections time out after 3 to 6 of them, and a
    /// follower that heard from its leader waits 6 more before it stands
    /// (openraft's leader lease). Default 50 ms: the leader's kill -9 to
    /// the next acknowledged append took 0.54 to 1.7 s over 24 kills here,
    /// where 100 ms took 0.95 to 3.2 s (docs/scaling.md).
    pub heartbeat: Duration,
    /// A snapshot every this many applied entries. Default 5,000.
    pub snapshot_every: u64,
    /// Entries kept in the log below a snapshot. Default 500.
    pub keep_logs: u64,
    /// How the leader batches clients' commands.
    pub proposer: ProposerOptions,
    /// How it reaches the other replicas.
    pub transport: TransportOptions,
    /// Threads of the runtime `producer-state-node` runs it on (0: one per
    /// core, the default). A node alone on a machine wants them all;
    /// several nodes sharing a few cores do better with one each (the
    /// bench runs three on two cores).
    pub threads: usize,
}

impl NodeOptions {
    /// Options for node `id` in `dir`, listening on `listen`, in a group of
    /// `members`; the rest default.
    pub fn new(
        id: NodeId,
        dir: impl Into<PathBuf>,
        listen: SocketAddr,
        members: BTreeMap<NodeId, String>,
    ) -> NodeOptions {
        NodeOptions {
            id,
            dir: dir.into(),
            listen,
            members,
            heartbeat: Duration::from_millis(50),
            snapshot_every: 5_000,
            keep_logs: 500,
            proposer: ProposerOptions::default(),
            transport: TransportOptions::default(),
            threads: 0,
        }
    }

    /// The command line of `producer-state-node`.
    pub const USAGE: &'static str = "producer-state-node --id N --dir DIR --listen ADDR \
        --members 1=ADDR,2=ADDR,3=ADDR [--heartbeat-ms 50] [--snapshot-every 5000] \
        [--keep-logs 500] [--in-flight 2] [--threads 0] [--allow-remote]";

    /// Options from a command line ([`NodeOptions::USAGE`]; the program
    /// name not included).
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<NodeOptions, String> {
        let (mut id, mut dir, mut listen, mut members) = (None, None, None, None);
        let mut o = NodeOptions::new(
            0,
            "",
            SocketAddr::from(([127, 0, 0, 1], 0)),
            BTreeMap::new(),
        );
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--allow-remote" {
                o.transport.allow_remote = true;
                continue;
            }
            let v = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{flag} {v}: not a number"))
            };
            match flag.as_str() {
                "--id" => id = Some(num(&v)?),
                "--dir" => dir = Some(PathBuf::from(&v)),
                "--listen" => {
                    listen = Some(
                        v.parse::<SocketAddr>()
                            .map_err(|_| format!("--listen {v}: not an address"))?,
                    );
                }
                "--members" => {
                    let mut m = BTreeMap::new();
                    for item in v.split(',') {
                        let (k, a) = item
                            .split_once('=')
                            .ok_or_else(|| format!("--members: {item:?} is not ID=ADDR"))?;
                        m.insert(num(k)?, a.to_string());
                    }
                    members = Some(m);
                }
                "--heartbeat-ms" => o.heartbeat = Duration::from_millis(num(&v)?),
                "--snapshot-every" => o.snapshot_every = num(&v)?,
                "--keep-logs" => o.keep_logs = num(&v)?,
                "--threads" => o.threads = num(&v)? as usize,
                "--in-flight" => {
                    o.proposer = ProposerOptions::default().in_flight(num(&v)? as usize);
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        o.id = id.ok_or("--id is required")?;
        o.dir = dir.ok_or("--dir is required")?;
        o.listen = listen.ok_or("--listen is required")?;
        o.members = members.ok_or("--members is required")?;
        Ok(o)
    }

    fn check(&self) -> Result<(), StartError> {
        let bad = |s: String| Err(StartError::Raft(s));
        if self.id == 0 || self.members.contains_key(&0) {
            return bad("node id 0 is reserved (it means \"none\" on the wire)".into());
        }
        if !self.members.contains_key(&self.id) {
            return bad(format!("node {} is not among the members", self.id));
        }
        if !self.listen.ip().is_loopback() && !self.transport.allow_remote {
            return bad(format!(
                "{} is not a loopback address: the transport is neither encrypted nor \
                 authenticated (allow it explicitly)",
                self.listen
            ));
        }
        for addr in self.members.values() {
            transport::resolve(addr, &self.transport).map_err(StartError::Raft)?;
        }
        Ok(())
    }
}

struct Shared {
    replica: Replica,
    log: LogStore,
    proposer: Proposer,
    snapshots: Arc<ReceivedSnapshots>,
}

/// A running node (module docs).
pub struct Node {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Node {
    /// Opens the replica, initialises it with the membership if it is new,
    /// and starts listening.
    ///
    /// # Errors
    ///
    /// [`StartError`] if the options are inconsistent (the id not among the
    /// members, an address not loopback without `allow_remote`), the files
    /// cannot be opened, or the address cannot be bound.
    pub async fn start(options: NodeOptions) -> Result<Node, StartError> {
        options.check()?;
        let config = raft_config(options.heartbeat, options.snapshot_every, options.keep_logs)?;
        let listener = TcpListener::bind(options.listen)
            .await
            .map_err(|e| StartError::Raft(format!("listen on {}: {e}", options.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let network = TcpNetwork::new(options.transport.clone());
        let (replica, log) =
            Replica::with_network(options.id, &options.dir, network, config, None).await?;
        let raft = replica.raft();
        let fresh = !raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if fresh {
            let members: BTreeMap<NodeId, BasicNode> = options
                .members
                .iter()
                .map(|(&id, addr)| (id, BasicNode::new(addr)))
                .collect();
            raft.initialize(members)
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?;
        }
        let proposer = Proposer::for_replica(replica.clone(), options.proposer.clone());
        let shared = Arc::new(Shared {
            replica,
            log,
            proposer,
            snapshots: Arc::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let accept = tokio::spawn(accept(listener, shared.clone(), stopped));
        Ok(Node {
            shared,
            addr,
            stop,
            accept,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its replica.
    pub fn replica(&self) -> &Replica {
        &self.shared.replica
    }

    /// Stops listening, closes every connection and stops the replica.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.accept.await;
        let _ = self.shared.replica.raft().shutdown().await;
    }
}

/// Accepts connections until `stopped`.
async fn accept(listener: TcpListener, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    connections.spawn(serve(stream, shared.clone(), stopped.clone()));
                }
            }
            _ = stopped.changed() => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
}

/// Serves one connection until it closes, sends a frame that cannot be
/// read, or the node stops.
async fn serve(stream: TcpStream, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(write_frames(write, rx));
    let mut read = BufReader::with_capacity(64 << 10, read);
    let mut snapshots = SnapshotReceiver::new(shared.snapshots.clone());
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let frame = tokio::select! {
            f = wire::read_frame(&mut read) => f,
            _ = stopped.changed() => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(FrameError::Version(v)) => {
                let why = format!("version {v}; this node speaks version {}", wire::VERSION);
                send(&tx, 0, &Reply::Failed(why));
                break;
            }
            Err(_) => break,
        };
        let request = match Request::decode(&frame) {
            Ok(r) => r,
            Err(why) => {
                send(&tx, frame.id, &Reply::Failed(why.to_string()));
                break;
            }
        };
        let raft = shared.replica.raft();
        let request = match answer_raft(raft, &mut snapshots, request).await {
            Ok(reply) => {
                send(&tx, frame.id, &reply);
                continue;
            }
            Err(client_request) => client_request,
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (shared, tx) = (shared.clone(), tx.clone());
        tokio::spawn(async move {
            let reply = answer_client(&shared, request).await;
            send(&tx, frame.id, &reply);
            drop(slot);
        });
    }
    drop(tx);
    let _ = writer.await;
}

/// Queues the frame of `reply` to request `id`; a reply too long for a
/// frame is answered as a failure.
fn send(tx: &mpsc::UnboundedSender<Vec<u8>>, id: u64, reply: &Reply) {
    let frame = reply
        .encode(id)
        .or_else(|e| Reply::Failed(e.to_string()).encode(id));
    if let Ok(f) = frame {
        let _ = tx.send(f);
    }
}

/// Writes queued frames, those that queued meanwhile in the same write.
async fn write_frames(
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    while let Some(mut buf) = rx.recv().await {
        while buf.len() < 1 << 20 {
            match rx.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() {
            return;
        }
    }
}

async fn answer_client(shared: &Shared, request: Request) -> Reply {
    let replica = &shared.replica;
    match request {
        Request::Submit(command) => Reply::Submit(submit(shared, command).await),
        Request::Status => {
            let m = replica.raft().metrics().borrow().clone();
            Reply::Status(Status {
                id: replica.id(),
                term: m.current_term,
                leader: m.current_leader,
                last_applied: m.last_applied,
                last_log_index: m.last_log_index,
                members: m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, n)| (*id, n.addr.clone()))
                    .collect(),
                snapshots_installed: shared.snapshots.installed.load(Ordering::Relaxed),
                snapshots_refused: shared.snapshots.refused.load(Ordering::Relaxed),
                log_fsyncs: replica.log_stats().fsyncs.load(Ordering::Relaxed),
            })
        }
        Request::Entries { from, max } => {
            let Some(applied) = replica.raft().metrics().borrow().last_applied else {
                return Reply::Entries(Vec::new());
            };
            let end = applied
                .index
                .saturating_add(1)
                .min(from.saturating_add(u64::from(max).min(MAX_ENTRIES as u64)));
            let mut log = shared.log.clone();
            let entries =
                match openraft::RaftLogReader::try_get_log_entries(&mut log, from..end).await {
                    Ok(e) => e,
                    Err(e) => return Reply::Failed(e.to_string()),
                };
            // As many as fit in a frame (at least one: an entry always fits).
            let mut bytes = 0;
            let n = entries
                .iter()
                .take_while(|e| {
                    bytes += 64
                        + match &e.payload {
                            openraft::EntryPayload::Normal(c) => c.encoded_len(),
                            _ => 1024,
                        };
                    bytes <= MAX_FRAME / 2
                })
                .count()
                .max(1);
            Reply::Entries(entries.into_iter().take(n).collect())
        }
        Request::Export => {
            let (last_applied, state) = replica.state();
            match state.encode_snapshot(position_of(last_applied)) {
                Ok(snapshot) => Reply::Export {
                    last_applied,
                    snapshot,
                },
                Err(e) => Reply::Failed(e.to_string()),
            }
        }
        other => Reply::Failed(format!("not a client request: {other:?}")),
    }
}

async fn submit(shared: &Shared, command: Command) -> SubmitReply {
    if let Err(why) = command.validate() {
        return SubmitReply::Invalid {
            reason: why.to_string(),
        };
    }
    let replica = &shared.replica;
    let not_leader = |leader: Option<NodeId>| {
        let addr = leader
            .and_then(|l| {
                let m = replica.raft().metrics();
                let m = m.borrow();
                m.membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.addr.clone())
            })
            .unwrap_or_default();
        SubmitReply::NotLeader { leader, addr }
    };
    let leader = replica.leader();
    if leader != Some(replica.id()) {
        return not_leader(leader);
    }
    match shared.proposer.submit(command).await {
        Ok(answer) => SubmitReply::Answered(answer),
        Err(SubmitError::Invalid(why)) => SubmitReply::Invalid {
            reason: why.to_string(),
        },
        Err(SubmitError::NotAnswered {
            leader: Some(l), ..
        }) if l != replica.id() => not_leader(Some(l)),
        Err(e) => SubmitReply::Unknown {
            reason: e.to_string(),
        },
    }
}

/// Runs a node until SIGINT or SIGTERM: what `producer-state-node` does.
/// Prints `READY <id> <address>` on stdout once it listens.
///
/// # Errors
///
/// As [`Node::start`].
pub async fn run_node(options: NodeOptions) -> Result<(), StartError> {
    let id = options.id;
    let node = Node::start(options).await?;
    println!("READY {id} {}", node.local_addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| StartError::Raft(e.to_string()))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    node.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_command_line_is_read_and_checked() {
        let o = NodeOptions::from_args(args(
            "--id 2 --dir /tmp/n2 --listen 127.0.0.1:7002 \
             --members 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 --heartbeat-ms 50",
        ))
        .unwrap();
        assert_eq!((o.id, o.heartbeat), (2, Duration::from_millis(50)));
        assert_eq!(o.members.len(), 3);
        assert!(o.check().is_ok());
        let refused = |s: &str| {
            NodeOptions::from_args(args(s)).and_then(|o| o.check().map_err(|e| e.to_string()))
        };
        assert!(refused("--id 2 --dir d --listen 127.0.0.1:1").is_err());
        assert!(refused("--id 4 --dir d --listen 127.0.0.1:1 --members 1=127.0.0.1:2").is_err());
        assert!(refused("--id 1 --dir d --listen 0.0.0.0:1 --members 1=127.0.0.1:2").is_err());
        assert!(refused("--id 1 --dir d --listen 127.0.0.1:1 --members 1=10.1.1.1:2").is_err());
        assert!(refused("--id 0 --dir d --listen 127.0.0.1:1 --members 0=127.0.0.1:2").is_err());
        assert!(
            refused("--id 1 --dir d --listen 0.0.0.0:1 --members 1=10.1.1.1:2 --allow-remote")
                .is_ok()
        );
        assert!(refused("--id 1 --bogus 3").is_err());
    }
}
