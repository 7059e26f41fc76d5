//! The group coordinator: consumer groups under Kafka's classic protocol
//! (JoinGroup, SyncGroup, Heartbeat, LeaveGroup; the client's assignor
//! decides who reads what), and the offsets they commit, durably, including
//! those committed inside a transaction.
//!
//! It follows Kafka's `GroupCoordinator`: a group is `Empty`,
//! `PreparingRebalance` (members rejoin), `CompletingRebalance` (the leader
//! sends the assignment) or `Stable`. A rebalance completes when every
//! member has rejoined or the rebalance timeout has passed (for a group
//! that was empty, after `group.initial.rebalance.delay.ms`, so that
//! members starting together join one generation); members that do not
//! heartbeat within their session timeout are removed. Membership is kept
//! in memory only, as Kafka rebuilds it when a coordinator moves: after a
//! restart every member gets `UNKNOWN_MEMBER_ID` and rejoins.
//!
//! Offsets are durable: every commit is appended to `DIR/offsets.log` (a
//! [`RecordsLog`]) and fsync'ed before it is answered. Offsets committed
//! within a transaction (TxnOffsetCommit) are kept pending for their
//! producer, durably too, and become the group's committed offsets only
//! when the transaction commits ([`GroupCoordinator::complete_txn`]);
//! OffsetFetch with `require_stable` answers `UNSTABLE_OFFSET_COMMIT` for a
//! partition with pending offsets (KIP-447).
//!
//! Left out, each answered with an error at once (never a silent wait):
//! static membership (`group.instance.id`: JoinGroup versions that carry it
//! are not advertised, so the client says so), the consumer protocol of
//! KIP-848 (ConsumerGroupHeartbeat is not served), and deleting groups or
//! offsets.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::records_log::{Malformed, Reader, RecordsLog, Writer};

/// Kafka error codes the group coordinator answers with.
pub mod code {
    /// `OFFSET_METADATA_TOO_LARGE`.
    pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
    /// `ILLEGAL_GENERATION`.
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// `INCONSISTENT_GROUP_PROTOCOL`.
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// `INVALID_GROUP_ID`.
    pub const INVALID_GROUP_ID: i16 = 24;
    /// `UNKNOWN_MEMBER_ID`.
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// `INVALID_SESSION_TIMEOUT`.
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    /// `REBALANCE_IN_PROGRESS`.
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    /// `KAFKA_STORAGE_ERROR`.
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    /// `MEMBER_ID_REQUIRED`.
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    /// `UNSTABLE_OFFSET_COMMIT`.
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    /// `COORDINATOR_NOT_AVAILABLE` (the broker is stopping).
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
}

/// The group settings, Kafka's names and defaults.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms` (6000).
    pub min_session_timeout: Duration,
    /// `group.max.session.timeout.ms` (1800000).
    pub max_session_timeout: Duration,
    /// `group.initial.rebalance.delay.ms` (3000).
    pub initial_rebalance_delay: Duration,
    /// `offset.metadata.max.bytes` (4096).
    pub offset_metadata_max_bytes: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            min_session_timeout: Duration::from_millis(6_000),
            max_session_timeout: Duration::from_millis(1_800_000),
            initial_rebalance_delay: Duration::from_millis(3_000),
            offset_metadata_max_bytes: 4096,
        }
    }
}

/// Where a group is in its rebalance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
}

impl GroupState {
    /// Kafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The next offset to read.
    pub offset: i64,
    /// The leader epoch the client gave (-1: none).
    pub leader_epoch: i32,
    /// The client's metadata string.
    pub metadata: String,
}

/// A group as DescribeGroups shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// Its state.
    pub state: GroupState,
    /// Its generation.
    pub generation: i32,
    /// The protocol (assignor) of the generation.
    pub protocol: Option<String>,
    /// Its members: (member id, client id).
    pub members: Vec<(String, String)>,
}

/// What a JoinGroup is answered with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Joined {
    /// The error code (0: joined).
    pub error: i16,
    /// The generation joined.
    pub generation: i32,
    /// The protocol (assignor) chosen.
    pub protocol: Option<String>,
    /// The protocol type (`consumer`).
    pub protocol_type: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// This member's id (also with `MEMBER_ID_REQUIRED`).
    pub member_id: String,
    /// For the leader: every member with its metadata for the protocol.
    pub members: Vec<(String, Bytes)>,
}

/// A JoinGroup's parameters.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    /// The group.
    pub group: String,
    /// The member id ("" to be given one).
    pub member_id: String,
    /// The client id (the start of a new member id).
    pub client_id: String,
    /// `session.timeout.ms`.
    pub session_timeout: Duration,
    /// `max.poll.interval.ms` (the rebalance timeout).
    pub rebalance_timeout: Duration,
    /// `consumer`.
    pub protocol_type: String,
    /// The assignors the member supports, in its order of preference, with
    /// its subscription for each.
    pub protocols: Vec<(String, Bytes)>,
    /// Whether the request's version requires a known member id (v4+:
    /// a first join is answered `MEMBER_ID_REQUIRED` with its id).
    pub require_known_member_id: bool,
}

struct Member {
    client_id: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen: Instant,
    /// A JoinGroup waiting for the rebalance to complete.
    join: Option<oneshot::Sender<Joined>>,
    /// A SyncGroup waiting for the leader's assignment.
    sync: Option<oneshot::Sender<(i16, Bytes)>>,
}

struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// Members in the order they joined.
    members: BTreeMap<u64, (String, Member)>,
    next_order: u64,
    /// Member ids handed out with `MEMBER_ID_REQUIRED`, not yet joined.
    pending: HashMap<String, Instant>,
    /// When the rebalance in progress completes whatever happens.
    deadline: Option<Instant>,
    /// The rebalance in progress began with no members: it waits out
    /// `group.initial.rebalance.delay.ms` for members starting together.
    initial: bool,
    committed: BTreeMap<(String, i32), Committed>,
    /// Offsets committed in transactions not yet ended, by producer id.
    txn_pending: BTreeMap<i64, BTreeMap<(String, i32), Committed>>,
}

impl Group {
    fn new() -> Group {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            next_order: 0,
            pending: HashMap::new(),
            deadline: None,
            initial: false,
            committed: BTreeMap::new(),
            txn_pending: BTreeMap::new(),
        }
    }

    fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members
            .values_mut()
            .find(|(m, _)| m == id)
            .map(|(_, m)| m)
    }

    fn has(&self, id: &str) -> bool {
        self.members.values().any(|(m, _)| m == id)
    }

    fn remove(&mut self, id: &str) {
        self.members.retain(|_, (m, _)| m != id);
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
    }

    /// Starts a rebalance (every member must rejoin) completing by
    /// `deadline` at the latest.
    fn prepare_rebalance(&mut self, deadline: Instant) {
        if self.state != GroupState::PreparingRebalance {
            self.state = GroupState::PreparingRebalance;
            self.deadline = Some(deadline);
            // Members waiting for an assignment learn of the rebalance.
            for (_, m) in self.members.values_mut() {
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send((code::REBALANCE_IN_PROGRESS, Bytes::new()));
                }
            }
        }
    }

    /// Completes the rebalance: members that did not rejoin are removed,
    /// a new generation is chosen with a protocol every member supports,
    /// and every waiting JoinGroup is answered.
    fn complete_join(&mut self) {
        self.members.retain(|_, (_, m)| m.join.is_some());
        self.deadline = None;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.generation += 1;
            self.protocol = None;
            self.leader = None;
            return;
        }
        self.generation += 1;
        self.state = GroupState::CompletingRebalance;
        if self.leader.as_ref().is_none_or(|l| !self.has(l)) {
            self.leader = self.members.values().next().map(|(id, _)| id.clone());
        }
        // The first protocol of the leader's that every member supports.
        let leader = self.leader.clone().unwrap_or_default();
        let candidates: Vec<String> = self
            .members
            .values()
            .find(|(id, _)| *id == leader)
            .map(|(_, m)| m.protocols.iter().map(|(p, _)| p.clone()).collect())
            .unwrap_or_default();
        self.protocol = candidates.into_iter().find(|p| {
            self.members
                .values()
                .all(|(_, m)| m.protocols.iter().any(|(q, _)| q == p))
        });
        let protocol = self.protocol.clone();
        let listing: Vec<(String, Bytes)> = self
            .members
            .values()
            .map(|(id, m)| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(p, _)| Some(p) == protocol.as_ref())
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), meta)
            })
            .collect();
        for (id, m) in self.members.values_mut() {
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: 0,
                    generation: self.generation,
                    protocol: protocol.clone(),
                    protocol_type: self.protocol_type.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        listing.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }

    fn all_rejoined(&self) -> bool {
        self.members.values().all(|(_, m)| m.join.is_some())
    }
}

const KIND_COMMIT: u8 = 1;
const KIND_PENDING: u8 = 2;
const KIND_TXN_END: u8 = 3;

fn offset_record(kind: u8, group: &str, pid: i64, tp: &(String, i32), c: &Committed) -> Vec<u8> {
    let mut w = Writer::new(kind);
    w.str(group)
        .i64(pid)
        .str(&tp.0)
        .i32(tp.1)
        .i64(c.offset)
        .i32(c.leader_epoch)
        .str(&c.metadata);
    w.0
}

fn txn_end_record(group: &str, pid: i64, commit: bool) -> Vec<u8> {
    let mut w = Writer::new(KIND_TXN_END);
    w.str(group).i64(pid).u8(u8::from(commit));
    w.0
}

struct Groups {
    groups: HashMap<String, Group>,
    log: RecordsLog,
    next_member: u64,
}

impl Groups {
    fn group(&mut self, name: &str) -> &mut Group {
        self.groups
            .entry(name.to_string())
            .or_insert_with(Group::new)
    }

    /// Applies one record of the offsets log.
    fn apply(&mut self, rec: &[u8]) -> std::result::Result<(), Malformed> {
        let mut r = Reader(rec);
        let kind = r.u8()?;
        let group = r.str()?;
        let pid = r.i64()?;
        match kind {
            KIND_COMMIT | KIND_PENDING => {
                let tp = (r.str()?, r.i32()?);
                let c = Committed {
                    offset: r.i64()?,
                    leader_epoch: r.i32()?,
                    metadata: r.str()?,
                };
                let g = self.group(&group);
                if kind == KIND_COMMIT {
                    g.committed.insert(tp, c);
                } else {
                    g.txn_pending.entry(pid).or_default().insert(tp, c);
                }
            }
            KIND_TXN_END => {
                let commit = r.u8()? == 1;
                let g = self.group(&group);
                if let Some(offsets) = g.txn_pending.remove(&pid)
                    && commit
                {
                    g.committed.extend(offsets);
                }
            }
            _ => return Err("an unknown record kind"),
        }
        if r.done() {
            Ok(())
        } else {
            Err("bytes after the record")
        }
    }

    /// Every live record: committed offsets and pending ones.
    fn live(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (name, g) in &self.groups {
            for (tp, c) in &g.committed {
                out.push(offset_record(KIND_COMMIT, name, -1, tp, c));
            }
            for (pid, offsets) in &g.txn_pending {
                for (tp, c) in offsets {
                    out.push(offset_record(KIND_PENDING, name, *pid, tp, c));
                }
            }
        }
        out
    }

    fn append(&mut self, records: &[Vec<u8>]) -> Result<()> {
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        self.log.append(&refs)?;
        let live = self.live();
        if self.log.records() > 2 * live.len() as u64 + 4096 {
            self.log.rewrite(&live)?;
        }
        Ok(())
    }
}

/// The group coordinator.
pub struct GroupCoordinator {
    groups: Mutex<Groups>,
    config: GroupConfig,
}

impl std::fmt::Debug for GroupCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator").finish_non_exhaustive()
    }
}

/// What validating a member of a group found.
fn check_member(g: &Group, generation: i32, member_id: &str) -> std::result::Result<(), i16> {
    if !g.has(member_id) {
        return Err(code::UNKNOWN_MEMBER_ID);
    }
    if generation != g.generation {
        return Err(code::ILLEGAL_GENERATION);
    }
    Ok(())
}

impl GroupCoordinator {
    /// Opens the offsets log at `path`.
    pub fn open(path: &Path, config: GroupConfig) -> Result<GroupCoordinator> {
        let (log, records) = RecordsLog::open(path)?;
        let mut groups = Groups {
            groups: HashMap::new(),
            log,
            next_member: 0,
        };
        for (i, rec) in records.iter().enumerate() {
            groups.apply(rec).map_err(|reason| Error::CorruptLog {
                path: path.to_path_buf(),
                pos: i as u64,
                reason: format!("record {i}: {reason}"),
            })?;
        }
        Ok(GroupCoordinator {
            groups: Mutex::new(groups),
            config,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// JoinGroup: answered once the rebalance it takes part in completes
    /// (at once with an error, or with `MEMBER_ID_REQUIRED`).
    pub async fn join(&self, req: JoinRequest, now: Instant) -> Joined {
        let rx = {
            let mut gs = self.lock();
            match self.join_locked(&mut gs, req, now) {
                Ok(rx) => rx,
                Err(answer) => return *answer,
            }
        };
        rx.await.unwrap_or(Joined {
            error: code::COORDINATOR_NOT_AVAILABLE,
            ..Joined::default()
        })
    }

    fn join_locked(
        &self,
        gs: &mut Groups,
        req: JoinRequest,
        now: Instant,
    ) -> std::result::Result<oneshot::Receiver<Joined>, Box<Joined>> {
        let fail = |error: i16, member_id: &str| {
            Box::new(Joined {
                error,
                generation: -1,
                member_id: member_id.to_string(),
                ..Joined::default()
            })
        };
        if req.group.is_empty() {
            return Err(fail(code::INVALID_GROUP_ID, &req.member_id));
        }
        if req.session_timeout < self.config.min_session_timeout
            || req.session_timeout > self.config.max_session_timeout
        {
            return Err(fail(code::INVALID_SESSION_TIMEOUT, &req.member_id));
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return Err(fail(code::INCONSISTENT_GROUP_PROTOCOL, &req.member_id));
        }
        let n = gs.next_member;
        gs.next_member += 1;
        let initial_delay = self.config.initial_rebalance_delay;
        let g = gs.group(&req.group);
        if g.state != GroupState::Empty
            && g.protocol_type.as_deref() != Some(req.protocol_type.as_str())
        {
            return Err(fail(code::INCONSISTENT_GROUP_PROTOCOL, &req.member_id));
        }
        let member_id = if req.member_id.is_empty() {
            let id = format!("{}-{}-{:016x}", req.client_id, n, now_nanos());
            if req.require_known_member_id {
                g.pending.insert(id.clone(), now + req.session_timeout);
                return Err(Box::new(Joined {
                    error: code::MEMBER_ID_REQUIRED,
                    generation: -1,
                    member_id: id,
                    ..Joined::default()
                }));
            }
            id
        } else {
            if !g.has(&req.member_id) && g.pending.remove(&req.member_id).is_none() {
                return Err(fail(code::UNKNOWN_MEMBER_ID, &req.member_id));
            }
            req.member_id.clone()
        };
        if g.state == GroupState::Empty {
            g.protocol_type = Some(req.protocol_type.clone());
        }
        let (tx, rx) = oneshot::channel();
        if let Some(m) = g.member(&member_id) {
            // A member that rejoins: a new JoinGroup replaces one waiting.
            if let Some(old) = m.join.take() {
                let _ = old.send(*fail(code::REBALANCE_IN_PROGRESS, &member_id));
            }
            m.protocols = req.protocols.clone();
            m.session_timeout = req.session_timeout;
            m.rebalance_timeout = req.rebalance_timeout;
            m.last_seen = now;
            m.join = Some(tx);
        } else {
            let order = g.next_order;
            g.next_order += 1;
            g.members.insert(
                order,
                (
                    member_id.clone(),
                    Member {
                        client_id: req.client_id.clone(),
                        session_timeout: req.session_timeout,
                        rebalance_timeout: req.rebalance_timeout,
                        protocols: req.protocols.clone(),
                        assignment: Bytes::new(),
                        last_seen: now,
                        join: Some(tx),
                        sync: None,
                    },
                ),
            );
        }
        if g.state != GroupState::PreparingRebalance {
            // A new member, a changed subscription or a member rejoining
            // after it lost its generation: everyone rejoins.
            let was_empty = g.state == GroupState::Empty;
            let deadline = if was_empty {
                now + initial_delay
            } else {
                now + g
                    .members
                    .values()
                    .map(|(_, m)| m.rebalance_timeout)
                    .max()
                    .unwrap_or_default()
            };
            g.prepare_rebalance(deadline);
            g.initial = was_empty;
        }
        // Once every member has rejoined, a rebalance completes, unless it
        // is a new group's, which waits out its delay ([`Self::tick`]).
        if !g.initial && g.all_rejoined() {
            g.complete_join();
        }
        Ok(rx)
    }

    /// SyncGroup: the leader's assignment (`assignments`, from the leader
    /// only) is given to every member; the answer is this member's.
    pub async fn sync(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> (i16, Bytes) {
        let rx = {
            let mut gs = self.lock();
            let Some(g) = gs.groups.get_mut(group) else {
                return (code::UNKNOWN_MEMBER_ID, Bytes::new());
            };
            if let Err(e) = check_member(g, generation, member_id) {
                return (e, Bytes::new());
            }
            match g.state {
                GroupState::Empty | GroupState::PreparingRebalance => {
                    return (code::REBALANCE_IN_PROGRESS, Bytes::new());
                }
                GroupState::Stable => {
                    return match g.member(member_id) {
                        Some(m) => {
                            m.last_seen = now;
                            (0, m.assignment.clone())
                        }
                        None => (code::UNKNOWN_MEMBER_ID, Bytes::new()),
                    };
                }
                GroupState::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            if let Some(m) = g.member(member_id) {
                m.last_seen = now;
                m.sync = Some(tx);
            }
            if g.leader.as_deref() == Some(member_id) {
                let given: HashMap<String, Bytes> = assignments.into_iter().collect();
                for (id, m) in g.members.values_mut() {
                    m.assignment = given.get(id).cloned().unwrap_or_default();
                    if let Some(tx) = m.sync.take() {
                        let _ = tx.send((0, m.assignment.clone()));
                    }
                }
                g.state = GroupState::Stable;
            }
            rx
        };
        rx.await
            .unwrap_or((code::COORDINATOR_NOT_AVAILABLE, Bytes::new()))
    }

    /// Heartbeat.
    pub fn heartbeat(&self, group: &str, generation: i32, member_id: &str, now: Instant) -> i16 {
        let mut gs = self.lock();
        let Some(g) = gs.groups.get_mut(group) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        if !g.has(member_id) {
            return code::UNKNOWN_MEMBER_ID;
        }
        if let Some(m) = g.member(member_id) {
            m.last_seen = now;
        }
        if g.state == GroupState::PreparingRebalance {
            return code::REBALANCE_IN_PROGRESS;
        }
        if generation != g.generation {
            return code::ILLEGAL_GENERATION;
        }
        0
    }

    /// LeaveGroup: the members leave; the others rebalance. Per member, 0
    /// or `UNKNOWN_MEMBER_ID`.
    pub fn leave(&self, group: &str, member_ids: &[String], now: Instant) -> Vec<i16> {
        let mut gs = self.lock();
        let Some(g) = gs.groups.get_mut(group) else {
            return vec![code::UNKNOWN_MEMBER_ID; member_ids.len()];
        };
        let codes = member_ids
            .iter()
            .map(|id| {
                if g.has(id) {
                    if let Some(m) = g.member(id)
                        && let Some(tx) = m.join.take()
                    {
                        let _ = tx.send(Joined {
                            error: code::UNKNOWN_MEMBER_ID,
                            generation: -1,
                            ..Joined::default()
                        });
                    }
                    g.remove(id);
                    0
                } else {
                    code::UNKNOWN_MEMBER_ID
                }
            })
            .collect();
        rebalance_after_removal(g, now);
        codes
    }

    /// Removes members whose session expired, and completes rebalances
    /// that are due. Called a few times a second.
    pub fn tick(&self, now: Instant) {
        let mut gs = self.lock();
        for (name, g) in gs.groups.iter_mut() {
            g.pending.retain(|_, until| *until > now);
            let expired: Vec<String> = g
                .members
                .values()
                .filter(|(_, m)| {
                    m.join.is_none() && now.duration_since(m.last_seen) > m.session_timeout
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in &expired {
                tracing::info!(group = %name, member = %id, "member removed: its session timed out");
                g.remove(id);
            }
            if !expired.is_empty() {
                rebalance_after_removal(g, now);
            }
            if g.state == GroupState::PreparingRebalance
                && (g.deadline.is_some_and(|d| d <= now) || !g.initial && g.all_rejoined())
            {
                g.complete_join();
            }
        }
    }

    /// The state of a group, its generation, protocol and members (for
    /// DescribeGroups and the tests).
    pub fn describe(&self, group: &str) -> Option<Described> {
        let gs = self.lock();
        let g = gs.groups.get(group)?;
        Some(Described {
            state: g.state,
            generation: g.generation,
            protocol: g.protocol.clone(),
            members: g
                .members
                .values()
                .map(|(id, m)| (id.clone(), m.client_id.clone()))
                .collect(),
        })
    }

    fn check_offsets(
        &self,
        offsets: &[((String, i32), Committed)],
    ) -> std::result::Result<(), i16> {
        if offsets
            .iter()
            .any(|(_, c)| c.metadata.len() > self.config.offset_metadata_max_bytes)
        {
            return Err(code::OFFSET_METADATA_TOO_LARGE);
        }
        Ok(())
    }

    /// OffsetCommit: by a member of the current generation, or with
    /// generation -1 and no member id by a client that uses no group
    /// management (the group must then have no members). Durable before it
    /// returns.
    pub fn commit(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        offsets: &[((String, i32), Committed)],
        now: Instant,
    ) -> std::result::Result<(), i16> {
        self.check_offsets(offsets)?;
        let mut gs = self.lock();
        let g = gs.group(group);
        if generation < 0 && member_id.is_empty() {
            if !g.members.is_empty() {
                return Err(code::UNKNOWN_MEMBER_ID);
            }
        } else {
            check_member(g, generation, member_id)?;
            if g.state == GroupState::PreparingRebalance
                || g.state == GroupState::CompletingRebalance
            {
                return Err(code::REBALANCE_IN_PROGRESS);
            }
            if let Some(m) = g.member(member_id) {
                m.last_seen = now;
            }
        }
        let records: Vec<Vec<u8>> = offsets
            .iter()
            .map(|(tp, c)| offset_record(KIND_COMMIT, group, -1, tp, c))
            .collect();
        gs.append(&records).map_err(|e| {
            tracing::error!(error = %e, "the offsets log failed");
            code::KAFKA_STORAGE_ERROR
        })?;
        let g = gs.group(group);
        for (tp, c) in offsets {
            g.committed.insert(tp.clone(), c.clone());
        }
        Ok(())
    }

    /// TxnOffsetCommit: offsets of producer `producer_id`'s transaction,
    /// pending until it ends. The caller has checked the transaction; a
    /// generation other than -1 is checked as for OffsetCommit (KIP-447).
    pub fn txn_commit(
        &self,
        group: &str,
        producer_id: i64,
        generation: i32,
        member_id: &str,
        offsets: &[((String, i32), Committed)],
    ) -> std::result::Result<(), i16> {
        self.check_offsets(offsets)?;
        let mut gs = self.lock();
        let g = gs.group(group);
        if generation >= 0 {
            check_member(g, generation, member_id)?;
        }
        let records: Vec<Vec<u8>> = offsets
            .iter()
            .map(|(tp, c)| offset_record(KIND_PENDING, group, producer_id, tp, c))
            .collect();
        gs.append(&records).map_err(|e| {
            tracing::error!(error = %e, "the offsets log failed");
            code::KAFKA_STORAGE_ERROR
        })?;
        let pending = gs.group(group).txn_pending.entry(producer_id).or_default();
        for (tp, c) in offsets {
            pending.insert(tp.clone(), c.clone());
        }
        Ok(())
    }

    /// The end of producer `producer_id`'s transaction for `group`: its
    /// pending offsets become the group's (`commit`) or are dropped.
    /// Durable before it returns.
    pub fn complete_txn(&self, group: &str, producer_id: i64, commit: bool) -> Result<()> {
        let mut gs = self.lock();
        gs.append(&[txn_end_record(group, producer_id, commit)])?;
        let g = gs.group(group);
        if let Some(offsets) = g.txn_pending.remove(&producer_id)
            && commit
        {
            g.committed.extend(offsets);
        }
        Ok(())
    }

    /// OffsetFetch: the committed offset of each partition asked (all the
    /// group has when `partitions` is `None`), with an error code each:
    /// `UNSTABLE_OFFSET_COMMIT` when `require_stable` and a transaction has
    /// offsets pending for it.
    pub fn fetch(
        &self,
        group: &str,
        partitions: Option<&[(String, i32)]>,
        require_stable: bool,
    ) -> Vec<((String, i32), Option<Committed>, i16)> {
        let gs = self.lock();
        let g = gs.groups.get(group);
        let pending = |tp: &(String, i32)| {
            g.is_some_and(|g| g.txn_pending.values().any(|o| o.contains_key(tp)))
        };
        let asked: Vec<(String, i32)> = match partitions {
            Some(p) => p.to_vec(),
            None => g
                .map(|g| g.committed.keys().cloned().collect())
                .unwrap_or_default(),
        };
        asked
            .into_iter()
            .map(|tp| {
                if require_stable && pending(&tp) {
                    return (tp, None, code::UNSTABLE_OFFSET_COMMIT);
                }
                let c = g.and_then(|g| g.committed.get(&tp).cloned());
                (tp, c, 0)
            })
            .collect()
    }

    /// Every group's name.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().groups.keys().cloned().collect();
        v.sort();
        v
    }
}

/// After members left: a group with members left rebalances; without, it
/// is empty.
fn rebalance_after_removal(g: &mut Group, now: Instant) {
    if g.members.is_empty() {
        if g.state != GroupState::Empty {
            g.state = GroupState::Empty;
            g.generation += 1;
            g.protocol = None;
            g.leader = None;
            g.deadline = None;
        }
        return;
    }
    let deadline = now
        + g.members
            .values()
            .map(|(_, m)| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
    if g.state != GroupState::PreparingRebalance {
        g.prepare_rebalance(deadline);
        g.initial = false;
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay: Duration::from_millis(100),
            ..GroupConfig::default()
        }
    }

    fn join_req(group: &str, member: &str, session_ms: u64) -> JoinRequest {
        JoinRequest {
            group: group.into(),
            member_id: member.into(),
            client_id: "c".into(),
            session_timeout: Duration::from_millis(session_ms),
            rebalance_timeout: Duration::from_millis(2_000),
            protocol_type: "consumer".into(),
            protocols: vec![
                ("range".into(), Bytes::from_static(b"sub")),
                ("roundrobin".into(), Bytes::from_static(b"sub")),
            ],
            require_known_member_id: true,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Drives `tick` until `f` completes (at most 10 s).
    async fn with_ticks<T>(c: &GroupCoordinator, f: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(f);
        for _ in 0..1000 {
            tokio::select! {
                v = &mut f => return v,
                _ = tokio::time::sleep(Duration::from_millis(10)) => c.tick(Instant::now()),
            }
        }
        panic!("did not complete within 10 s");
    }

    /// A first JoinGroup gets MEMBER_ID_REQUIRED and an id; joining with it
    /// waits for the rebalance.
    async fn member(c: &GroupCoordinator, group: &str, session_ms: u64) -> String {
        let first = c
            .join(join_req(group, "", session_ms), Instant::now())
            .await;
        assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
        first.member_id
    }

    #[test]
    fn members_join_one_generation_get_the_leaders_assignment_and_rebalance_on_a_new_member() {
        let dir = tempfile::tempdir().unwrap();
        let c = std::sync::Arc::new(
            GroupCoordinator::open(&dir.path().join("offsets.log"), config()).unwrap(),
        );
        rt().block_on(async {
            let a = member(&c, "g", 10_000).await;
            let b = member(&c, "g", 10_000).await;
            let (ja, jb) = with_ticks(&c, async {
                tokio::join!(
                    c.join(join_req("g", &a, 10_000), Instant::now()),
                    c.join(join_req("g", &b, 10_000), Instant::now())
                )
            })
            .await;
            assert_eq!((ja.error, jb.error), (0, 0));
            assert_eq!((ja.generation, jb.generation), (1, 1));
            assert_eq!(ja.protocol.as_deref(), Some("range"));
            let (leader, follower) = if ja.leader == a { (ja, jb) } else { (jb, ja) };
            assert_eq!(leader.members.len(), 2);
            assert!(follower.members.is_empty());
            let given = vec![
                (a.clone(), Bytes::from_static(b"for a")),
                (b.clone(), Bytes::from_static(b"for b")),
            ];
            let (sl, sf) = tokio::join!(
                c.sync("g", 1, &leader.member_id, given, Instant::now()),
                c.sync("g", 1, &follower.member_id, Vec::new(), Instant::now())
            );
            assert_eq!(sl.0, 0);
            assert_eq!(sf.0, 0);
            assert_eq!(c.describe("g").unwrap().state, GroupState::Stable);
            assert_eq!(c.heartbeat("g", 1, &a, Instant::now()), 0);
            assert_eq!(
                c.heartbeat("g", 0, &a, Instant::now()),
                code::ILLEGAL_GENERATION
            );
            assert_eq!(
                c.heartbeat("g", 1, "nobody", Instant::now()),
                code::UNKNOWN_MEMBER_ID
            );
            // A third member: the others learn of the rebalance by their
            // heartbeat and rejoin; all three are in generation 2.
            let d = member(&c, "g", 10_000).await;
            let c2 = c.clone();
            let pending =
                tokio::spawn(
                    async move { c2.join(join_req("g", &d, 10_000), Instant::now()).await },
                );
            let rejoin = async {
                while c.heartbeat("g", 1, &a, Instant::now()) == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert_eq!(
                    c.heartbeat("g", 1, &a, Instant::now()),
                    code::REBALANCE_IN_PROGRESS
                );
                let (ja, jb) = tokio::join!(
                    c.join(join_req("g", &a, 10_000), Instant::now()),
                    c.join(join_req("g", &b, 10_000), Instant::now())
                );
                (pending.await.unwrap(), ja, jb)
            };
            let (jd, ja, jb) = with_ticks(&c, rejoin).await;
            assert_eq!((jd.generation, ja.generation, jb.generation), (2, 2, 2));
        });
    }

    #[test]
    fn a_member_that_stops_heartbeating_is_removed_and_the_rest_rebalance() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = GroupConfig {
            min_session_timeout: Duration::from_millis(100),
            ..config()
        };
        let c = GroupCoordinator::open(&dir.path().join("offsets.log"), cfg).unwrap();
        rt().block_on(async {
            let a = member(&c, "g", 300).await;
            let b = member(&c, "g", 300).await;
            with_ticks(&c, async {
                tokio::join!(
                    c.join(join_req("g", &a, 300), Instant::now()),
                    c.join(join_req("g", &b, 300), Instant::now())
                )
            })
            .await;
            // Only a heartbeats from now on.
            let alive = async {
                for _ in 0..100 {
                    let code = c.heartbeat("g", 1, &a, Instant::now());
                    if code == code::REBALANCE_IN_PROGRESS {
                        return c.join(join_req("g", &a, 300), Instant::now()).await;
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                panic!("no rebalance after b stopped");
            };
            let j = with_ticks(&c, alive).await;
            assert_eq!(j.error, 0);
            assert_eq!(j.members.len(), 1, "only a is left");
            assert_eq!(c.describe("g").unwrap().members.len(), 1);
        });
    }

    fn off(o: i64) -> Committed {
        Committed {
            offset: o,
            leader_epoch: -1,
            metadata: String::new(),
        }
    }

    #[test]
    fn offsets_are_durable_and_a_transactions_are_seen_only_once_it_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offsets.log");
        let tp = ("t".to_string(), 0);
        let tp1 = ("t".to_string(), 1);
        {
            let c = GroupCoordinator::open(&path, config()).unwrap();
            // No member: a simple commit (generation -1).
            c.commit("g", -1, "", &[(tp.clone(), off(10))], Instant::now())
                .unwrap();
            assert_eq!(
                c.commit("g", 3, "ghost", &[(tp.clone(), off(11))], Instant::now()),
                Err(code::UNKNOWN_MEMBER_ID)
            );
            c.txn_commit(
                "g",
                7,
                -1,
                "",
                &[(tp.clone(), off(20)), (tp1.clone(), off(5))],
            )
            .unwrap();
            let f = c.fetch("g", Some(std::slice::from_ref(&tp)), true);
            assert_eq!(f[0].2, code::UNSTABLE_OFFSET_COMMIT);
            let f = c.fetch("g", Some(std::slice::from_ref(&tp)), false);
            assert_eq!(f[0].1, Some(off(10)));
            c.txn_commit("g", 8, -1, "", &[(tp.clone(), off(99))])
                .unwrap();
            c.complete_txn("g", 8, false).unwrap();
        }
        // After a restart: the pending transaction is still pending, the
        // aborted one is gone; committing makes its offsets the group's.
        let c = GroupCoordinator::open(&path, config()).unwrap();
        assert_eq!(
            c.fetch("g", Some(std::slice::from_ref(&tp)), true)[0].2,
            code::UNSTABLE_OFFSET_COMMIT
        );
        c.complete_txn("g", 7, true).unwrap();
        let all = c.fetch("g", None, true);
        assert_eq!(
            all,
            [
                (tp.clone(), Some(off(20)), 0),
                (tp1.clone(), Some(off(5)), 0)
            ]
        );
        let long = Committed {
            metadata: "m".repeat(5000),
            ..off(1)
        };
        assert_eq!(
            c.commit("g", -1, "", &[(tp.clone(), long)], Instant::now()),
            Err(code::OFFSET_METADATA_TOO_LARGE)
        );
        assert_eq!(
            c.fetch("other", Some(std::slice::from_ref(&tp)), false)[0].1,
            None
        );
    }
}
