//! A replica (log, state machine, openraft) and a cluster of them in one
//! process.
//!
//! [`Cluster::submit`] is what a producer's broker-side request does: find
//! the leader, propose the command, wait for the leader's own apply. Any
//! failure whose outcome is unknown (the leader died, the reply was lost,
//! a new leader was elected meanwhile) is answered by retrying the *same*
//! command, which is safe because it is idempotent: if the first attempt
//! was committed, the retry is classified `DUPLICATE` with the original
//! offset. Every wait is bounded ([`ClusterOptions::submit_timeout`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::{BasicNode, Config, LogId, Raft, SnapshotPolicy};
use producer_state::{PartitionExport, ProducerStateManager};
use tokio::sync::watch;

use crate::command::{Command, LifecycleOutcome, Response};
use crate::log::{LogOpened, LogStore, OpenLogError};
use crate::network::{Faults, NetworkFactory, Router};
use crate::state::{ApplyObserver, SnapshotError, StateMachine};
use crate::writer::LogStats;
use crate::{NodeId, TypeConfig};

/// A replica could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Its log could not be opened.
    #[error(transparent)]
    Log(#[from] OpenLogError),
    /// Its snapshot could not be loaded.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// openraft refused to start or initialise.
    #[error("raft: {0}")]
    Raft(String),
    /// The cluster did not elect a leader in time.
    #[error("no leader within {0:?}")]
    NoLeader(Duration),
}

/// A command got no answer.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The command cannot be proposed (see [`Command::validate`]).
    #[error("invalid command: {0}")]
    Invalid(&'static str),
    /// No replica answered before the deadline; the command may or may not
    /// have been committed: retry it (a committed one answers `DUPLICATE`).
    #[error("no answer within {timeout:?} after {attempts} attempts (last: {last})")]
    Timeout {
        /// The deadline.
        timeout: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last error seen.
        last: String,
    },
    /// That replica is not the leader (or not running); `leader` is the
    /// leader it knows of. Outcome unknown if it was the leader when the
    /// command was proposed.
    #[error("node {node} did not answer: {reason}")]
    NotAnswered {
        /// The replica asked.
        node: NodeId,
        /// The leader it knows of.
        leader: Option<NodeId>,
        /// Why.
        reason: String,
    },
    /// The command was committed and applied, and every replica refused
    /// it alike, changing nothing (an import conflicting with the state).
    #[error("refused at {log_id}: {reason}")]
    Refused {
        /// The entry that carried it.
        log_id: LogId<NodeId>,
        /// Why.
        reason: String,
    },
}

/// A lifecycle command answered with another kind's outcome: cannot
/// happen (apply answers each kind with its own), reported rather than
/// panicking.
fn unexpected(got: Option<LifecycleOutcome>) -> SubmitError {
    SubmitError::Refused {
        log_id: LogId::default(),
        reason: format!("unexpected answer {got:?}"),
    }
}

/// One running replica: its openraft handle and its state machine.
#[derive(Clone)]
pub struct Replica {
    id: NodeId,
    raft: Raft<TypeConfig>,
    sm: StateMachine,
    log_stats: Arc<LogStats>,
    opened: LogOpened,
    /// Closed once its log has let go of the directory.
    log_closed: watch::Receiver<()>,
}

impl Replica {
    /// Starts replica `id` on the files in `dir` (created if missing),
    /// reachable through `router`.
    pub async fn start(
        id: NodeId,
        dir: &Path,
        router: &Router,
        config: Arc<Config>,
        observer: Option<ApplyObserver>,
    ) -> Result<Replica, StartError> {
        let network = NetworkFactory {
            router: router.clone(),
            from: id,
        };
        let (replica, _) = Replica::with_network(id, dir, network, config, observer).await?;
        router.register(id, replica.raft.clone());
        Ok(replica)
    }

    /// Starts replica `id` on the files in `dir` with any network; also
    /// returns a handle of its log, to read committed entries (held only by
    /// whoever must read them: a handle keeps the directory locked).
    pub(crate) async fn with_network<N: RaftNetworkFactory<TypeConfig>>(
        id: NodeId,
        dir: &Path,
        network: N,
        config: Arc<Config>,
        observer: Option<ApplyObserver>,
    ) -> Result<(Replica, LogStore), StartError> {
        let (log, opened) = LogStore::open(dir)?;
        let sm = StateMachine::open(dir, observer)?;
        log.purge_after_snapshots(&sm);
        let log_stats = log.stats();
        let log_closed = log.closed();
        let raft = Raft::new(id, config, network, log.clone(), sm.clone())
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let replica = Replica {
            id,
            raft,
            sm,
            log_stats,
            opened,
            log_closed,
        };
        Ok((replica, log))
    }

    /// The replica's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Its openraft handle.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// A copy of its producer state and the log id that state reflects.
    pub fn state(&self) -> (Option<LogId<NodeId>>, ProducerStateManager) {
        self.sm.state()
    }

    /// Its log's counters (fsyncs, entries).
    pub fn log_stats(&self) -> &LogStats {
        &self.log_stats
    }

    /// What opening its log found (a torn tail cut).
    pub fn log_opened(&self) -> &LogOpened {
        &self.opened
    }

    /// The leader this replica knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// One attempt: proposes `command` here and waits (at most `timeout`)
    /// for this replica's own apply.
    pub async fn submit(
        &self,
        command: Command,
        timeout: Duration,
    ) -> Result<(LogId<NodeId>, Response), SubmitError> {
        command.validate().map_err(SubmitError::Invalid)?;
        let not = |leader, reason: String| SubmitError::NotAnswered {
            node: self.id,
            leader,
            reason,
        };
        match tokio::time::timeout(timeout, self.raft.client_write(command)).await {
            Ok(Ok(r)) => Ok((r.log_id, r.data)),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(not(f.leader_id, "not the leader".into()))
            }
            Ok(Err(e)) => Err(not(self.leader(), e.to_string())),
            Err(_) => Err(not(self.leader(), format!("no answer within {timeout:?}"))),
        }
    }
}

/// Told of every entry any replica of a [`Cluster`] applies: the replica,
/// the log index, the command (none for Raft's own entries), the outcome.
pub type ClusterObserver = Arc<dyn Fn(NodeId, u64, Option<&Command>, &Response) + Send + Sync>;

/// How a [`Cluster`] runs.
#[derive(Clone)]
pub struct ClusterOptions {
    /// Replicas 1..=nodes. Default 3.
    pub nodes: u64,
    /// Faults of the network. Default none.
    pub faults: Faults,
    /// Seed of the network's faults. Default 0.
    pub seed: u64,
    /// Heartbeat interval; elections time out after 3 to 6 of them.
    /// Default 50 ms.
    pub heartbeat: Duration,
    /// A snapshot every this many applied entries. Default 5,000.
    pub snapshot_every: u64,
    /// Entries kept in the log below a snapshot, so a replica slightly
    /// behind catches up from the log rather than a snapshot. Default 500.
    pub keep_logs: u64,
    /// How long [`Cluster::submit`] keeps retrying. Default 10 s.
    pub submit_timeout: Duration,
    /// Told of every entry every replica applies.
    pub observer: Option<ClusterObserver>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            faults: Faults::none(),
            seed: 0,
            heartbeat: Duration::from_millis(50),
            snapshot_every: 5_000,
            keep_logs: 500,
            submit_timeout: Duration::from_secs(10),
            observer: None,
        }
    }
}

impl ClusterOptions {
    fn config(&self) -> Result<Arc<Config>, StartError> {
        raft_config(self.heartbeat, self.snapshot_every, self.keep_logs)
    }
}

/// openraft's configuration of a replica: elections time out after 3 to 6
/// heartbeats; a snapshot every `snapshot_every` applied entries, keeping
/// `keep_logs` entries below it.
pub(crate) fn raft_config(
    heartbeat: Duration,
    snapshot_every: u64,
    keep_logs: u64,
) -> Result<Arc<Config>, StartError> {
    let hb = heartbeat.as_millis().max(1) as u64;
    let config = Config {
        cluster_name: "producer-state".into(),
        heartbeat_interval: hb,
        election_timeout_min: hb * 3,
        election_timeout_max: hb * 6,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: keep_logs,
        purge_batch_size: 1,
        max_payload_entries: 1000,
        ..Config::default()
    };
    config
        .validate()
        .map(Arc::new)
        .map_err(|e| StartError::Raft(e.to_string()))
}

/// Replicas in one process over one [`Router`], each in its own directory
/// under a base directory (`node-<id>`).
pub struct Cluster {
    base: PathBuf,
    router: Router,
    config: Arc<Config>,
    options: ClusterOptions,
    replicas: Mutex<BTreeMap<NodeId, Replica>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    /// Starts replicas 1..=`options.nodes` under `base`, makes them one
    /// group (initialised on node 1 if new) and waits for a leader.
    pub async fn start(base: &Path, options: ClusterOptions) -> Result<Cluster, StartError> {
        let config = options.config()?;
        let cluster = Cluster {
            base: base.to_path_buf(),
            router: Router::new(options.faults.clone(), options.seed),
            config,
            options: options.clone(),
            replicas: Mutex::new(BTreeMap::new()),
        };
        for id in 1..=options.nodes {
            cluster.restart(id).await?;
        }
        let first = cluster
            .replica(1)
            .ok_or(StartError::NoLeader(Duration::ZERO))?;
        let fresh = !first
            .raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if fresh {
            let members: BTreeMap<NodeId, BasicNode> = (1..=options.nodes)
                .map(|id| (id, BasicNode::default()))
                .collect();
            first
                .raft
                .initialize(members)
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?;
        }
        cluster.wait_leader(options.submit_timeout).await?;
        Ok(cluster)
    }

    /// The network, to inject faults.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The directory of replica `id`.
    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.base.join(format!("node-{id}"))
    }

    /// A running replica.
    pub fn replica(&self, id: NodeId) -> Option<Replica> {
        lock(&self.replicas).get(&id).cloned()
    }

    /// The ids of the running replicas.
    pub fn running(&self) -> Vec<NodeId> {
        lock(&self.replicas).keys().copied().collect()
    }

    /// The running leader known in the newest term, if one is known. A
    /// leader cut off from the others goes on believing it leads (openraft
    /// 0.9's leader does not step down without a quorum) while the others
    /// elect one in a higher term: that one is the leader. (A replica cut
    /// off as a candidate raises its term but knows no leader: it is not
    /// asked.)
    pub fn leader(&self) -> Option<NodeId> {
        let replicas = lock(&self.replicas);
        replicas
            .values()
            .filter_map(|r| {
                let m = r.raft.metrics();
                let m = m.borrow();
                let leader = m.current_leader.filter(|l| replicas.contains_key(l))?;
                Some((m.current_term, leader))
            })
            .max_by_key(|&(term, _)| term)
            .map(|(_, leader)| leader)
    }

    /// Waits (at most `timeout`) until a running leader of the newest term
    /// is known ([`Cluster::leader`]).
    pub async fn wait_leader(&self, timeout: Duration) -> Result<NodeId, StartError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader() {
                return Ok(l);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StartError::NoLeader(timeout));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Proposes `command` through the leader and returns the leader's own
    /// outcome, retrying the same command on any failure until
    /// `submit_timeout` (module docs).
    pub async fn submit(&self, command: Command) -> Result<(LogId<NodeId>, Response), SubmitError> {
        command.validate().map_err(SubmitError::Invalid)?;
        let timeout = self.options.submit_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut attempts = 0;
        let mut hint: Option<NodeId> = None;
        let mut last = String::from("no replica running");
        while tokio::time::Instant::now() < deadline {
            let target = hint
                .and_then(|h| self.replica(h))
                .or_else(|| self.leader().and_then(|l| self.replica(l)));
            let Some(replica) = target else {
                hint = None;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            attempts += 1;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match replica
                .submit(command.clone(), left.min(Duration::from_secs(1)))
                .await
            {
                Ok(r) => return Ok(r),
                Err(SubmitError::NotAnswered { leader, reason, .. }) => {
                    hint = leader.filter(|&l| l != replica.id);
                    last = reason;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(SubmitError::Timeout {
            timeout,
            attempts,
            last,
        })
    }

    /// Expires every producer silent for `expiration` or longer
    /// ([`Command::Expire`]): reads this machine's clock **once**, here,
    /// and proposes that time in the entry, so every replica forgets the
    /// same keys, whenever it applies the entry (and a retry of the entry
    /// carries the same time). Returns the entry and how many keys expired.
    ///
    /// # Errors
    ///
    /// As [`Cluster::submit`]; [`SubmitError::Invalid`] for an expiration
    /// beyond `i64::MAX` milliseconds.
    pub async fn expire(&self, expiration: Duration) -> Result<(LogId<NodeId>, u64), SubmitError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let expiration_ms = i64::try_from(expiration.as_millis())
            .map_err(|_| SubmitError::Invalid("an expiration is at most i64::MAX ms"))?;
        let (log_id, r) = self
            .submit(Command::Expire {
                now_ms,
                expiration_ms,
            })
            .await?;
        match r.lifecycle {
            Some(LifecycleOutcome::Expired { keys }) => Ok((log_id, keys)),
            other => Err(unexpected(other)),
        }
    }

    /// Forgets every producer of `partition` ([`Command::RemovePartition`]):
    /// the partition moved to another group or was deleted. Returns the
    /// entry and how many keys went.
    ///
    /// # Errors
    ///
    /// As [`Cluster::submit`].
    pub async fn remove_partition(
        &self,
        partition: i32,
    ) -> Result<(LogId<NodeId>, u64), SubmitError> {
        let (log_id, r) = self.submit(Command::RemovePartition { partition }).await?;
        match r.lifecycle {
            Some(LifecycleOutcome::PartitionRemoved { keys }) => Ok((log_id, keys)),
            other => Err(unexpected(other)),
        }
    }

    /// The producer state of `partition` as the group has committed it, to
    /// move the partition to another group ([`Cluster::import_partition`]
    /// there) or a store. A linearizable read at the leader: it confirms
    /// its leadership with a majority and waits until it has applied
    /// everything committed before the call, so every append answered
    /// before it is in the export. Stop sending the partition's appends
    /// here first (its producers retry against the new home).
    ///
    /// # Errors
    ///
    /// [`SubmitError::NotAnswered`] if the replica asked is not the leader
    /// (or loses leadership) or no leader is known; [`SubmitError::Timeout`]
    /// after [`ClusterOptions::submit_timeout`].
    pub async fn export_partition(&self, partition: i32) -> Result<PartitionExport, SubmitError> {
        let timeout = self.options.submit_timeout;
        let not = |node, reason: String| SubmitError::NotAnswered {
            node,
            leader: None,
            reason,
        };
        let leader = self
            .leader()
            .and_then(|l| self.replica(l))
            .ok_or_else(|| not(0, "no leader known".into()))?;
        match tokio::time::timeout(timeout, leader.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(not(leader.id, e.to_string())),
            Err(_) => {
                return Err(SubmitError::Timeout {
                    timeout,
                    attempts: 1,
                    last: "the leader did not confirm its leadership".into(),
                });
            }
        }
        let (_, state) = leader.state();
        // The replicas run the seed rules, whose state an export holds.
        state
            .export_partition(partition)
            .map_err(|e| not(leader.id, e.to_string()))
    }

    /// Adds the producers of a partition exported elsewhere
    /// ([`Command::ImportPartition`]): a producer retrying against this
    /// group gets `DUPLICATE` with the offset its first attempt was given
    /// there. Returns the entry and how many keys the export holds; a
    /// retry of an import that was applied is answered the same.
    ///
    /// # Errors
    ///
    /// As [`Cluster::submit`]; [`SubmitError::Invalid`] for an export of
    /// more than 16 MiB; [`SubmitError::Refused`] (nothing added) when a
    /// key of the export already has another state here.
    pub async fn import_partition(
        &self,
        export: &PartitionExport,
    ) -> Result<(LogId<NodeId>, u64), SubmitError> {
        let (log_id, r) = self.submit(Command::import_partition(export)).await?;
        match r.lifecycle {
            Some(LifecycleOutcome::Imported { keys }) => Ok((log_id, keys)),
            Some(LifecycleOutcome::ImportRefused { reason }) => {
                Err(SubmitError::Refused { log_id, reason })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Stops replica `id` (its files stay): a crash of the process as far
    /// as the others can tell; what it acknowledged was fsync'ed. Returns
    /// once its log has let go of the directory (openraft's replication
    /// tasks may hold it a moment after shutting down), or after
    /// [`ClusterOptions::submit_timeout`].
    pub async fn kill(&self, id: NodeId) {
        let replica = lock(&self.replicas).remove(&id);
        self.router.unregister(id);
        if let Some(r) = replica {
            let _ = r.raft.shutdown().await;
            let mut closed = r.log_closed.clone();
            let gone = async move { while closed.changed().await.is_ok() {} };
            let _ = tokio::time::timeout(self.options.submit_timeout, gone).await;
        }
    }

    /// Starts replica `id` on its directory (after [`Cluster::kill`], or
    /// for the first time).
    pub async fn restart(&self, id: NodeId) -> Result<Replica, StartError> {
        let observer: Option<ApplyObserver> = self.options.observer.clone().map(|f| {
            let f: ApplyObserver =
                Arc::new(move |index, cmd: Option<&Command>, r: &Response| f(id, index, cmd, r));
            f
        });
        let dir = self.dir(id);
        let replica = Replica::start(id, &dir, &self.router, self.config.clone(), observer).await?;
        lock(&self.replicas).insert(id, replica.clone());
        Ok(replica)
    }

    /// Starts replica `id` with no files and makes it a voting member: the
    /// leader sends it the log, or a snapshot when the log it needs was
    /// purged.
    ///
    /// It is added as a learner first and promoted to a voter only once it
    /// holds the log up to its own addition: a voter that cannot catch up
    /// would count towards every majority without helping form one (four
    /// voters of which one is useless tolerate no failure, where three
    /// tolerate one).
    ///
    /// # Errors
    ///
    /// [`StartError::Raft`] if it has not caught up and been promoted
    /// within [`ClusterOptions::submit_timeout`]; it stays a learner (the
    /// leader goes on sending it the log), and calling this again retries.
    pub async fn add_member(&self, id: NodeId) -> Result<(), StartError> {
        let _ = std::fs::remove_dir_all(self.dir(id));
        self.restart(id).await?;
        let timeout = self.options.submit_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no leader");
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(StartError::Raft(format!(
                    "node {id} was not added within {timeout:?}: {last}"
                )));
            }
            match self.promote(id, left).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(20).min(left)).await;
        }
    }

    /// One attempt of [`Cluster::add_member`], every wait within `left`.
    async fn promote(&self, id: NodeId, left: Duration) -> Result<(), String> {
        let bounded = |what: &'static str| move |_| format!("{what}: no answer within {left:?}");
        let leader = self.wait_leader(left).await.map_err(|e| e.to_string())?;
        let l = self.replica(leader).ok_or("the leader stopped")?;
        let added = tokio::time::timeout(left, l.raft.add_learner(id, BasicNode::default(), false))
            .await
            .map_err(bounded("add a learner"))?
            .map_err(|e| e.to_string())?;
        // Caught up: the leader has replicated to it up to its addition.
        let since = added.log_id;
        l.raft
            .wait(Some(left))
            .metrics(
                |m| {
                    let matched = m.replication.as_ref().and_then(|r| r.get(&id).copied());
                    matched.flatten().is_some_and(|at| at >= since)
                },
                "the new replica catches up",
            )
            .await
            .map_err(|e| format!("node {id} did not catch up: {e}"))?;
        let members: BTreeSet<NodeId> = l
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .chain([id])
            .collect();
        tokio::time::timeout(left, l.raft.change_membership(members, false))
            .await
            .map_err(bounded("change the membership"))?
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Waits (at most `timeout`) until every running replica has applied
    /// at least up to `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), StartError> {
        for id in self.running() {
            if let Some(r) = self.replica(id) {
                r.raft
                    .wait(Some(timeout))
                    .applied_index_at_least(Some(index), "catch up")
                    .await
                    .map_err(|e| StartError::Raft(format!("node {id}: {e}")))?;
            }
        }
        Ok(())
    }

    /// Stops every replica.
    pub async fn shutdown(&self) {
        for id in self.running() {
            self.kill(id).await;
        }
    }
}
