//! One consumer group of the classic protocol: its members, its
//! committed and pending offsets, and the rebalance state machine (`Empty`,
//! `PreparingRebalance`, `CompletingRebalance`, `Stable`) that the group
//! coordinator drives ([`crate::group_coordinator`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

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

pub(crate) struct Member {
    pub(crate) client_id: String,
    pub(crate) session_timeout: Duration,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) protocols: Vec<(String, Bytes)>,
    pub(crate) assignment: Bytes,
    pub(crate) last_seen: Instant,
    /// A JoinGroup waiting for the rebalance to complete.
    pub(crate) join: Option<oneshot::Sender<Joined>>,
    /// A SyncGroup waiting for the leader's assignment.
    pub(crate) sync: Option<oneshot::Sender<(i16, Bytes)>>,
}

pub(crate) struct Group {
    pub(crate) state: GroupState,
    pub(crate) generation: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol: Option<String>,
    pub(crate) leader: Option<String>,
    /// Members in the order they joined.
    pub(crate) members: BTreeMap<u64, (String, Member)>,
    pub(crate) next_order: u64,
    /// Member ids handed out with `MEMBER_ID_REQUIRED`, not yet joined.
    pub(crate) pending: HashMap<String, Instant>,
    /// When the rebalance in progress completes whatever happens.
    pub(crate) deadline: Option<Instant>,
    /// The rebalance in progress began with no members: it waits out
    /// `group.initial.rebalance.delay.ms` for members starting together.
    pub(crate) initial: bool,
    pub(crate) committed: BTreeMap<(String, i32), Committed>,
    /// Offsets committed in transactions not yet ended, by producer id.
    pub(crate) txn_pending: BTreeMap<i64, BTreeMap<(String, i32), Committed>>,
}

impl Group {
    pub(crate) fn new() -> Group {
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

    pub(crate) fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members
            .values_mut()
            .find(|(m, _)| m == id)
            .map(|(_, m)| m)
    }

    pub(crate) fn has(&self, id: &str) -> bool {
        self.members.values().any(|(m, _)| m == id)
    }

    pub(crate) fn remove(&mut self, id: &str) {
        self.members.retain(|_, (m, _)| m != id);
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
    }

    /// Starts a rebalance (every member must rejoin) completing by
    /// `deadline` at the latest.
    pub(crate) fn prepare_rebalance(&mut self, deadline: Instant) {
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
    pub(crate) fn complete_join(&mut self) {
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

    /// After a member joined at `now`: a rebalance starts unless one is in
    /// progress (a new member, a changed subscription or a member rejoining
    /// after it lost its generation: everyone rejoins), by the members'
    /// longest rebalance timeout, or for a group that was empty after
    /// `initial_delay`; it completes once every member has rejoined, unless
    /// it is a new group's, which waits out its delay (the coordinator's
    /// tick).
    pub(crate) fn joined(&mut self, now: Instant, initial_delay: Duration) {
        if self.state != GroupState::PreparingRebalance {
            let was_empty = self.state == GroupState::Empty;
            let deadline = if was_empty {
                now + initial_delay
            } else {
                now + self
                    .members
                    .values()
                    .map(|(_, m)| m.rebalance_timeout)
                    .max()
                    .unwrap_or_default()
            };
            self.prepare_rebalance(deadline);
            self.initial = was_empty;
        }
        if !self.initial && self.all_rejoined() {
            self.complete_join();
        }
    }

    pub(crate) fn all_rejoined(&self) -> bool {
        self.members.values().all(|(_, m)| m.join.is_some())
    }
}

/// What validating a member of a group found.
pub(crate) fn check_member(
    g: &Group,
    generation: i32,
    member_id: &str,
) -> std::result::Result<(), i16> {
    if !g.has(member_id) {
        return Err(code::UNKNOWN_MEMBER_ID);
    }
    if generation != g.generation {
        return Err(code::ILLEGAL_GENERATION);
    }
    Ok(())
}

/// After members left: a group with members left rebalances; without, it
/// is empty.
pub(crate) fn rebalance_after_removal(g: &mut Group, now: Instant) {
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
