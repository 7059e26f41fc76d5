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

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
pub use crate::group::{Committed, GroupState, Joined, code};
use crate::group::{Group, Member, check_member, rebalance_after_removal};
use crate::records_log::{Malformed, Reader, RecordsLog, Writer};

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
        if let Some(error) = self.refused_join(&req) {
            return Err(fail(error, &req.member_id));
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
        g.joined(now, initial_delay);
        Ok(rx)
    }

    /// The error a JoinGroup is refused with before its group is looked at,
    /// if any: no group id, a session timeout out of the configured range,
    /// no protocol.
    fn refused_join(&self, req: &JoinRequest) -> Option<i16> {
        if req.group.is_empty() {
            return Some(code::INVALID_GROUP_ID);
        }
        if req.session_timeout < self.config.min_session_timeout
            || req.session_timeout > self.config.max_session_timeout
        {
            return Some(code::INVALID_SESSION_TIMEOUT);
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return Some(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        None
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

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
#[path = "group_coordinator_tests.rs"]
mod tests;
