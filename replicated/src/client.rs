//! A client of a group of nodes ([`Node`](crate::Node)): it finds the
//! leader and retries across leader changes.
//!
//! [`Client::submit`] sends a command to the leader it knows of (at first
//! any node), follows "not the leader" answers to the leader they name,
//! and on any answer that leaves the outcome unknown (a connection lost
//! with the command on it, no answer in time, a proposal not committed)
//! sends the **same** command again, to the leader it then knows of,
//! until it is answered or [`ClientOptions::deadline`] passes. The same
//! (producer, epoch, sequence) is safe to send twice: if the first attempt
//! was committed, the retry is classified `DUPLICATE` with the offset the
//! first was given; if not, it is `ACCEPTED` now. Never both: every replica
//! classifies the log in the same order.
//!
//! Commands submitted by many tasks sharing a client are sent together:
//! while [`ClientOptions::in_flight`] commands are on their way, the ones
//! submitted meanwhile queue, and the next request carries all of them as
//! one `AppendAll` (a lifecycle command goes alone). The leader proposes
//! it as one entry (or with other clients' in a larger one), and each
//! caller gets its own slice of the outcomes, at its own slots; a retry
//! resends the whole request, which is as safe as resending each command,
//! since each append is classified on its own. Per producer this keeps the
//! order of its commands; a producer with several commands in flight can
//! see a later one answered `OUT_OF_ORDER` when an earlier one is retried
//! after it, as with any Kafka client, and retries it.
//!
//! One connection per node, shared by every caller of the client: each
//! request carries an id, the answers come back in any order, and requests
//! that queue while one is written go out in the same write. A connection
//! that fails fails every request on it (each is then retried, as above),
//! and the next request opens a new one.
//!
//! ```no_run
//! # async fn f() -> Result<(), producer_state_raft::ClientError> {
//! use producer_state_raft::{Append, Client, ClientOptions, Command, Outcome};
//!
//! let nodes = [(1, "127.0.0.1:7001"), (2, "127.0.0.1:7002"), (3, "127.0.0.1:7003")];
//! let client = Client::new(nodes.map(|(id, a)| (id, a.parse().unwrap())), ClientOptions::default());
//! let batch = Command::Append(Append::batch(42u64, 0, 0, 0, 9, 1_700_000_000_000));
//! let answer = client.submit(batch).await?;
//! assert!(matches!(answer.response.outcomes[0], Outcome::Accepted { .. }));
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use openraft::{Entry, LogId};
use producer_state::ProducerStateManager;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::command::Command;
use crate::proposer::{Answer, Queue, split};
use crate::wire::{self, Reply, Request, Status, SubmitReply};
use crate::{NodeId, TypeConfig};

/// How a [`Client`] waits and retries.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long one attempt may wait for its answer. Default 3 s (a node
    /// answers "outcome unknown" after a second without a commit).
    pub attempt_timeout: Duration,
    /// How long [`Client::submit`] keeps trying in all. Default 30 s.
    pub deadline: Duration,
    /// How long a connect may take. Default 500 ms.
    pub connect_timeout: Duration,
    /// The first wait after an attempt that found no leader; it doubles
    /// up to 50 ms. Default 10 ms.
    pub backoff: Duration,
    /// Commands on their way at once. Commands submitted meanwhile (by
    /// other tasks sharing the client) queue, and the next one sent
    /// carries all of them: one request, one proposal and one answer for
    /// many producers, as the leader's own batching does for many clients.
    /// Default 2; 0 sends every command alone, as it comes.
    pub in_flight: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            attempt_timeout: Duration::from_secs(3),
            deadline: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(500),
            backoff: Duration::from_millis(10),
            in_flight: 2,
        }
    }
}

impl ClientOptions {
    /// These options with `deadline` for [`Client::submit`].
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// These options with `n` commands on their way at once (0: each
    /// command sent alone).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = n;
        self
    }
}

/// A request got no answer, or an answer that is not one.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The command cannot be proposed; retrying will not help.
    #[error("invalid command: {0}")]
    Invalid(String),
    /// No answer before the deadline. The command may or may not have been
    /// committed: retry it (a committed one is answered `DUPLICATE`).
    #[error("no answer within {deadline:?} after {attempts} attempts (last: {last})")]
    Timeout {
        /// The deadline.
        deadline: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// One node's request failed.
    #[error("node {node}: {reason}")]
    Node {
        /// The node asked.
        node: NodeId,
        /// Why.
        reason: String,
    },
}

/// What a client did since it was made.
#[derive(Debug, Default)]
pub struct ClientStats {
    /// Requests sent (every attempt of every command).
    pub attempts: AtomicU64,
    /// Attempts answered "not the leader" naming another node.
    pub redirects: AtomicU64,
    /// Attempts whose outcome was unknown (the connection failed with the
    /// command on it, no answer in time, or the node could not tell), so
    /// the same command was sent again: each was answered `DUPLICATE` if
    /// the attempt had been committed, else `ACCEPTED` by a later one.
    pub retried: AtomicU64,
}

/// Why one attempt got no answer.
enum CallError {
    /// The request never left: no connection.
    NotSent(String),
    /// The request may have reached the node.
    Lost(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(why) | CallError::Lost(why) => f.write_str(why),
        }
    }
}

/// The longest wait between attempts: while the nodes elect a leader,
/// asking again every 50 ms costs a few small requests and answers the
/// first acknowledgement at most 50 ms after the election.
const BACKOFF_MAX: Duration = Duration::from_millis(50);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection to one node, shared by every caller.
struct Conn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    dead: Arc<AtomicBool>,
}

impl Conn {
    async fn open(addr: SocketAddr, timeout: Duration) -> Result<Conn, String> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect to {addr}: {e}")),
            Err(_) => {
                return Err(format!(
                    "connect to {addr}: no connection within {timeout:?}"
                ));
            }
        };
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let (frames, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending: Pending = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let (p, d) = (pending.clone(), dead.clone());
        // Fails every waiting request (their senders are dropped) once
        // either direction ends.
        let fail_all = move || {
            d.store(true, Ordering::SeqCst);
            lock(&p).clear();
        };
        let fail = fail_all.clone();
        tokio::spawn(async move {
            while let Some(mut buf) = queued.recv().await {
                while buf.len() < 1 << 20 {
                    match queued.try_recv() {
                        Ok(more) => buf.extend_from_slice(&more),
                        Err(_) => break,
                    }
                }
                if write.write_all(&buf).await.is_err() {
                    break;
                }
            }
            fail();
        });
        let p = pending.clone();
        tokio::spawn(async move {
            let mut read = BufReader::with_capacity(64 << 10, read);
            while let Ok(Some(f)) = wire::read_frame(&mut read).await {
                let Ok(reply) = Reply::decode(&f) else { break };
                if let Some(waiting) = lock(&p).remove(&f.id) {
                    let _ = waiting.send(reply);
                }
            }
            fail_all();
        });
        Ok(Conn {
            frames,
            pending,
            dead,
        })
    }

    async fn call(
        &self,
        id: u64,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let frame = request
            .encode(id)
            .map_err(|e| CallError::NotSent(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if self.dead.load(Ordering::SeqCst) || self.frames.send(frame).is_err() {
            lock(&self.pending).remove(&id);
            return Err(CallError::NotSent("the connection failed".into()));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(CallError::Lost(
                "the connection failed with the request on it".into(),
            )),
            Err(_) => {
                lock(&self.pending).remove(&id);
                Err(CallError::Lost(format!("no answer within {timeout:?}")))
            }
        }
    }
}

/// What a [`Client`] shares with its batching task.
struct Core {
    nodes: BTreeMap<NodeId, SocketAddr>,
    options: ClientOptions,
    conns: Mutex<HashMap<NodeId, Arc<Conn>>>,
    /// The leader last heard of (0: none).
    leader: AtomicU64,
    stats: ClientStats,
    /// Where to try next when no leader is known.
    next: AtomicU64,
    ids: AtomicU64,
}

impl Core {
    fn new(nodes: BTreeMap<NodeId, SocketAddr>, options: ClientOptions) -> Core {
        Core {
            nodes,
            options,
            conns: Mutex::new(HashMap::new()),
            leader: AtomicU64::new(0),
            stats: ClientStats::default(),
            next: AtomicU64::new(0),
            ids: AtomicU64::new(1),
        }
    }

    /// The leader last heard of.
    fn leader(&self) -> Option<NodeId> {
        Some(self.leader.load(Ordering::Relaxed)).filter(|&l| l != 0)
    }

    /// One request to `node`, within `timeout`: a shared connection, opened
    /// if there is none alive.
    async fn call(
        &self,
        node: NodeId,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let addr = *self
            .nodes
            .get(&node)
            .ok_or_else(|| CallError::NotSent(format!("node {node} is not one of the client's")))?;
        let alive = lock(&self.conns)
            .get(&node)
            .filter(|c| !c.dead.load(Ordering::SeqCst))
            .cloned();
        let conn = match alive {
            Some(c) => c,
            None => {
                let limit = self.options.connect_timeout.min(timeout);
                let c = Arc::new(Conn::open(addr, limit).await.map_err(CallError::NotSent)?);
                lock(&self.conns).insert(node, c.clone());
                c
            }
        };
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        conn.call(id, request, timeout).await
    }

    /// The node to try next: the leader last heard of, or the nodes in
    /// turn.
    fn target(&self) -> NodeId {
        if let Some(l) = self.leader().filter(|l| self.nodes.contains_key(l)) {
            return l;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        self.nodes
            .keys()
            .nth(i % self.nodes.len().max(1))
            .copied()
            .unwrap_or(0)
    }

    /// [`Client::submit`] of one command, as it is (merged or not).
    async fn submit(&self, command: Command) -> Result<Answer, ClientError> {
        let deadline = tokio::time::Instant::now() + self.options.deadline;
        let request = Request::Submit(command);
        let mut attempts = 0;
        let mut wait = self.options.backoff;
        let mut last = String::from("no node tried");
        let mut redirects = 0;
        while attempts < u32::MAX {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let node = self.target();
            attempts += 1;
            let timeout = self.options.attempt_timeout.min(left);
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let unknown = || self.stats.retried.fetch_add(1, Ordering::Relaxed);
            let failed = match self.call(node, &request, timeout).await {
                Ok(Reply::Submit(SubmitReply::Answered(a))) => {
                    self.leader.store(node, Ordering::Relaxed);
                    return Ok(a);
                }
                Ok(Reply::Submit(SubmitReply::Invalid { reason })) => {
                    return Err(ClientError::Invalid(reason));
                }
                Ok(Reply::Submit(SubmitReply::NotLeader {
                    leader: Some(l), ..
                })) if l != node && self.nodes.contains_key(&l) => {
                    // Straight to the leader named, unless the nodes keep
                    // naming one another (news of an election still on its
                    // way): then after a wait like any failure.
                    self.leader.store(l, Ordering::Relaxed);
                    self.stats.redirects.fetch_add(1, Ordering::Relaxed);
                    redirects += 1;
                    if redirects <= self.nodes.len() {
                        last = format!("node {node}: not the leader (node {l} is)");
                        continue;
                    }
                    redirects = 0;
                    format!("node {node}: not the leader (node {l} is, again)")
                }
                Ok(Reply::Submit(SubmitReply::NotLeader { .. })) => {
                    format!("node {node}: not the leader, and knows none")
                }
                Ok(Reply::Submit(SubmitReply::Unknown { reason })) => {
                    unknown();
                    format!("node {node}: {reason}")
                }
                Ok(other) => {
                    unknown();
                    format!("node {node}: an unexpected reply: {other:?}")
                }
                Err(CallError::Lost(e)) => {
                    unknown();
                    format!("node {node}: {e}")
                }
                Err(CallError::NotSent(e)) => format!("node {node}: {e}"),
            };
            // No leader here: ask the others, after a short wait that grows
            // while nobody answers.
            if !failed.contains("again") {
                let _ = self
                    .leader
                    .compare_exchange(node, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            last = failed;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(wait.min(left)).await;
            wait = (wait * 2).min(BACKOFF_MAX);
        }
        Err(ClientError::Timeout {
            deadline: self.options.deadline,
            attempts,
            last,
        })
    }
}

/// A client of a group of nodes (module docs). Cheap to share: wrap it in
/// an `Arc` and call it from many tasks.
pub struct Client {
    core: Arc<Core>,
    /// The batching task's queue, started on the first submit.
    batcher: OnceLock<mpsc::UnboundedSender<(Command, Waiting)>>,
}

type Waiting = oneshot::Sender<Result<Answer, ClientError>>;

impl Client {
    /// A client of the nodes at these addresses.
    pub fn new(
        nodes: impl IntoIterator<Item = (NodeId, SocketAddr)>,
        options: ClientOptions,
    ) -> Client {
        Client {
            core: Arc::new(Core::new(nodes.into_iter().collect(), options)),
            batcher: OnceLock::new(),
        }
    }

    /// What it did since it was made.
    pub fn stats(&self) -> &ClientStats {
        &self.core.stats
    }

    /// The leader last heard of.
    pub fn leader(&self) -> Option<NodeId> {
        self.core.leader()
    }

    /// Proposes `command` through the leader and returns the leader's
    /// outcomes for it, retrying the same command until
    /// [`ClientOptions::deadline`] (module docs). Commands submitted while
    /// [`ClientOptions::in_flight`] others are on their way are sent
    /// together, as one (module docs).
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a command no node will propose;
    /// [`ClientError::Timeout`] when no attempt was answered in time (the
    /// outcome is unknown: retry the same command).
    pub async fn submit(&self, command: Command) -> Result<Answer, ClientError> {
        command
            .validate()
            .map_err(|why| ClientError::Invalid(why.to_string()))?;
        let in_flight = self.core.options.in_flight;
        if in_flight == 0 {
            return self.core.submit(command).await;
        }
        let batcher = self.batcher.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(batch(self.core.clone(), rx, in_flight));
            tx
        });
        let (tx, rx) = oneshot::channel();
        batcher
            .send((command, tx))
            .map_err(|_| ClientError::Invalid("the client's batching task stopped".into()))?;
        rx.await
            .map_err(|_| ClientError::Invalid("the client's batching task stopped".into()))?
    }

    /// What `node` knows: its term, leader, applied entry and members.
    ///
    /// # Errors
    ///
    /// [`ClientError::Node`] if it does not answer within the attempt
    /// timeout.
    pub async fn status(&self, node: NodeId) -> Result<Status, ClientError> {
        match self.one(node, &Request::Status).await? {
            Reply::Status(s) => Ok(s),
            other => Err(unexpected(node, other)),
        }
    }

    /// Up to `max` of the entries `node` has applied, from index `from`
    /// (fewer if they would not fit in one frame; none past its applied
    /// entry or below its purged log).
    ///
    /// # Errors
    ///
    /// As [`Client::status`].
    pub async fn entries(
        &self,
        node: NodeId,
        from: u64,
        max: u32,
    ) -> Result<Vec<Entry<TypeConfig>>, ClientError> {
        match self.one(node, &Request::Entries { from, max }).await? {
            Reply::Entries(e) => Ok(e),
            other => Err(unexpected(node, other)),
        }
    }

    /// `node`'s whole producer state and the entry it reflects.
    ///
    /// # Errors
    ///
    /// As [`Client::status`]; also if the state's bytes do not verify.
    pub async fn export(
        &self,
        node: NodeId,
    ) -> Result<(Option<LogId<NodeId>>, ProducerStateManager), ClientError> {
        match self.one(node, &Request::Export).await? {
            Reply::Export {
                last_applied,
                snapshot,
            } => {
                let (_, state) = ProducerStateManager::decode_snapshot(
                    format!("export of node {node}"),
                    &snapshot,
                )
                .map_err(|e| ClientError::Node {
                    node,
                    reason: e.to_string(),
                })?;
                Ok((last_applied, state))
            }
            other => Err(unexpected(node, other)),
        }
    }

    async fn one(&self, node: NodeId, request: &Request) -> Result<Reply, ClientError> {
        self.core
            .call(node, request, self.core.options.attempt_timeout)
            .await
            .map_err(|e| ClientError::Node {
                node,
                reason: e.to_string(),
            })
    }
}

/// The batching task: up to `in_flight` commands on their way, each
/// carrying every submit that queued meanwhile (`proposer::Queue`), each
/// answer split among them (`proposer::split`). Ends when the client is
/// dropped.
async fn batch(
    core: Arc<Core>,
    mut rx: mpsc::UnboundedReceiver<(Command, Waiting)>,
    in_flight: usize,
) {
    let mut queue = Queue::new(in_flight);
    while let Some((permit, command, waiting)) = queue.next(&mut rx).await {
        let core = core.clone();
        tokio::spawn(async move {
            match core.submit(command).await {
                Ok(a) => {
                    for (reply, first_slot, response) in split(waiting, a.first_slot, a.response) {
                        let _ = reply.send(Ok(Answer {
                            log_id: a.log_id,
                            first_slot,
                            response,
                        }));
                    }
                }
                Err(e) => {
                    for (_, reply) in waiting {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

fn unexpected(node: NodeId, reply: Reply) -> ClientError {
    ClientError::Node {
        node,
        reason: match reply {
            Reply::Failed(why) => why,
            other => format!("an unexpected reply: {other:?}"),
        },
    }
}
