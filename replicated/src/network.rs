//! An in-process network between replicas that a test controls.
//!
//! Every message between two replicas passes through one [`Router`], which
//! can drop it (the request, or only the reply: the receiver acted but the
//! sender never hears), delay it by a random time (so concurrent messages
//! overtake one another), deliver it twice (the copy arrives later, after
//! newer messages: a duplicate that is also reordered), cut links between
//! groups of nodes, and damage a snapshot in transfer. Faults are drawn
//! from one seeded generator, so a failing seed names its run.
//!
//! Snapshots are sent whole through [`RaftNetwork::full_snapshot`] in
//! chunks of 64 KiB, each of which can be lost; the receiving side checks
//! the snapshot ([`verify_snapshot`]) before it hands it to openraft, and
//! answers a damaged one with a network error, so the leader retries and
//! the receiver keeps its state.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::Snapshot;
use openraft::{BasicNode, Raft, Vote};

use crate::state::verify_snapshot;
use crate::{NodeId, TypeConfig};

/// Chunk size of a snapshot transfer.
pub const SNAPSHOT_CHUNK: usize = 64 * 1024;

/// Random faults, drawn per message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability that a request is lost.
    pub drop_request: f64,
    /// Probability that a reply is lost after the receiver acted.
    pub drop_reply: f64,
    /// Probability that a request is delivered a second time, later.
    pub duplicate: f64,
    /// Each message waits a uniform random time up to this.
    pub max_delay: Duration,
    /// Probability that one chunk of a snapshot transfer is lost.
    pub drop_chunk: f64,
}

impl Faults {
    /// No faults: every message is delivered at once.
    pub fn none() -> Faults {
        Faults::default()
    }
}

/// What the router did, for tests to assert on.
#[derive(Debug, Default)]
pub struct RouterStats {
    /// Requests delivered (duplicates included).
    pub delivered: AtomicU64,
    /// Requests and replies lost.
    pub dropped: AtomicU64,
    /// Requests delivered twice.
    pub duplicated: AtomicU64,
    /// Snapshots the receiver refused as damaged.
    pub snapshots_refused: AtomicU64,
    /// Snapshots handed to the receiver's openraft.
    pub snapshots_installed: AtomicU64,
}

struct Inner {
    nodes: Mutex<BTreeMap<NodeId, Raft<TypeConfig>>>,
    faults: Mutex<Faults>,
    rng: Mutex<u64>,
    /// Unordered pairs that cannot talk.
    cut: Mutex<BTreeSet<(NodeId, NodeId)>>,
    /// Snapshot transfers still to damage (one bit of one chunk each).
    damage_snapshots: AtomicU64,
    stats: RouterStats,
}

/// The network of one cluster (cloneable handle).
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Fault(&'static str);

impl Router {
    /// A network with `faults`, drawn from `seed`.
    pub fn new(faults: Faults, seed: u64) -> Router {
        Router {
            inner: Arc::new(Inner {
                nodes: Mutex::new(BTreeMap::new()),
                faults: Mutex::new(faults),
                rng: Mutex::new(seed ^ 0x9e37_79b9_7f4a_7c15),
                cut: Mutex::new(BTreeSet::new()),
                damage_snapshots: AtomicU64::new(0),
                stats: RouterStats::default(),
            }),
        }
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.inner.faults) = faults;
    }

    /// Damages one bit of the next `n` snapshot transfers.
    pub fn damage_next_snapshots(&self, n: u64) {
        self.inner.damage_snapshots.store(n, Ordering::SeqCst);
    }

    /// Cuts every link between `a` and the other nodes in `others`.
    pub fn isolate(&self, a: NodeId, others: impl IntoIterator<Item = NodeId>) {
        let mut cut = lock(&self.inner.cut);
        for b in others {
            if a != b {
                cut.insert((a.min(b), a.max(b)));
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        lock(&self.inner.cut).clear();
    }

    /// The router's counters.
    pub fn stats(&self) -> &RouterStats {
        &self.inner.stats
    }

    pub(crate) fn register(&self, id: NodeId, raft: Raft<TypeConfig>) {
        lock(&self.inner.nodes).insert(id, raft);
    }

    pub(crate) fn unregister(&self, id: NodeId) {
        lock(&self.inner.nodes).remove(&id);
    }

    /// A uniform draw in [0, 1) (splitmix64).
    fn draw(&self) -> f64 {
        let mut s = lock(&self.inner.rng);
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.draw() < p
    }

    async fn delay(&self) {
        let max = lock(&self.inner.faults).max_delay;
        if !max.is_zero() {
            tokio::time::sleep(max.mul_f64(self.draw())).await;
        }
    }

    /// The target, if the link is up and the target runs.
    fn reach(&self, from: NodeId, to: NodeId) -> Result<Raft<TypeConfig>, Unreachable> {
        if lock(&self.inner.cut).contains(&(from.min(to), from.max(to))) {
            return Err(Unreachable::new(&Fault("link cut")));
        }
        lock(&self.inner.nodes)
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::new(&Fault("node not running")))
    }

    /// Delivers one request with the configured faults: `call` runs on the
    /// target (twice when duplicated).
    async fn deliver<Req, Resp, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        req: Req,
        call: F,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Clone + Send + 'static,
        Resp: Send + 'static,
        E: std::error::Error + Send + 'static,
        F: Fn(Raft<TypeConfig>, Req) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = Result<Resp, RaftError<NodeId, E>>> + Send,
    {
        let faults = lock(&self.inner.faults).clone();
        self.delay().await;
        let raft = self.reach(from, to)?;
        if self.chance(faults.drop_request) {
            self.inner.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(Unreachable::new(&Fault("request lost")).into());
        }
        if self.chance(faults.duplicate) {
            self.inner.stats.duplicated.fetch_add(1, Ordering::Relaxed);
            let (router, raft, req, call) = (self.clone(), raft.clone(), req.clone(), call.clone());
            tokio::spawn(async move {
                router.delay().await;
                router.delay().await;
                router.inner.stats.delivered.fetch_add(1, Ordering::Relaxed);
                let _ = call(raft, req).await;
            });
        }
        self.inner.stats.delivered.fetch_add(1, Ordering::Relaxed);
        let resp = call(raft, req)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))?;
        self.delay().await;
        if self.chance(faults.drop_reply) {
            self.inner.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(Unreachable::new(&Fault("reply lost")).into());
        }
        Ok(resp)
    }

    /// Sends a whole snapshot in chunks; the receiver verifies it before
    /// openraft installs it.
    async fn send_snapshot(
        &self,
        from: NodeId,
        to: NodeId,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let faults = lock(&self.inner.faults).clone();
        let meta = snapshot.meta.clone();
        let sent = snapshot.snapshot.into_inner();
        let damage = self
            .inner
            .damage_snapshots
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let chunks = sent.len().div_ceil(SNAPSHOT_CHUNK).max(1);
        let damaged_chunk = (self.draw() * chunks as f64) as usize;
        let mut received = Vec::with_capacity(sent.len());
        for (i, chunk) in sent.chunks(SNAPSHOT_CHUNK).enumerate() {
            self.delay().await;
            self.reach(from, to)?;
            if self.chance(faults.drop_chunk) {
                self.inner.stats.dropped.fetch_add(1, Ordering::Relaxed);
                return Err(Unreachable::new(&Fault("snapshot chunk lost")).into());
            }
            let start = received.len();
            received.extend_from_slice(chunk);
            if damage && i == damaged_chunk {
                let at = start + (self.draw() * chunk.len() as f64) as usize;
                if let Some(b) = received.get_mut(at) {
                    *b ^= 0x04;
                }
            }
        }
        let raft = self.reach(from, to)?;
        // The receiving side: nothing reaches openraft unless it verifies.
        if let Err(e) = verify_snapshot(&meta, &received) {
            self.inner
                .stats
                .snapshots_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(NetworkError::new(&e).into());
        }
        self.inner
            .stats
            .snapshots_installed
            .fetch_add(1, Ordering::Relaxed);
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(received)),
        };
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| Unreachable::new(&e).into())
    }
}

/// openraft's handle to the network from one replica.
pub struct Connection {
    router: Router,
    from: NodeId,
    to: NodeId,
}

/// Creates [`Connection`]s for one replica.
pub struct NetworkFactory {
    pub(crate) router: Router,
    pub(crate) from: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Connection {
        Connection {
            router: self.router.clone(),
            from: self.from,
            to: target,
        }
    }
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        self.router
            .deliver(self.from, self.to, rpc, |raft, rpc| async move {
                raft.append_entries(rpc).await
            })
            .await
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        // Snapshots travel whole through `full_snapshot`; openraft 0.9 only
        // calls this chunked API from its default `full_snapshot`.
        Err(Unreachable::new(&Fault("chunked snapshots are not used")).into())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        self.router
            .deliver(self.from, self.to, rpc, |raft, rpc| async move {
                raft.vote(rpc).await
            })
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        self.router
            .send_snapshot(self.from, self.to, vote, snapshot)
            .await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(20)))
    }
}
