//! Proposal batching: many concurrent requests, one Raft entry.
//!
//! openraft 0.9's core waits for each log append to be flushed before it
//! does anything else (`RaftCore::append_to_log` awaits the flush), so a
//! leader commits at most one `client_write` per fsync of its log, however
//! many producers wait: measured, 16 or 64 concurrent producers get no
//! more appends/s than one (docs/scaling.md). The [`Proposer`] restores
//! the group commit one level up, as TiKV batches proposals: requests that
//! arrive while a proposal is in flight are queued, and the next proposal
//! carries all of them as one [`Command::AppendAll`] entry (up to
//! [`MAX_APPENDS_PER_ENTRY`] appends and [`MAX_COMMAND_BYTES`] bytes).
//! Every replica classifies the appends of the entry in order, exactly as if they had been proposed one after the
//! other, so each request's outcomes are what they would have been; each
//! request gets its own slice of the entry's outcomes, and its offsets are
//! its appends' slots in the entry.
//!
//! A lifecycle command ([`Command::Expire`] and the others) is never
//! batched: it is proposed as an entry of its own, in its place in the
//! order requests arrived, and answered with the whole response.
//!
//! Up to [`ProposerOptions::in_flight`] proposals (default two) are in
//! flight at once, handed to the leader's openraft in order
//! (`client_write_ff`), so the log keeps the order in which requests
//! arrived while the leader fsyncs one proposal and replicates the
//! previous one.
//!
//! A proposal whose outcome is unknown (no answer within a second, a
//! leader change) is retried whole by [`Cluster::submit`] when the
//! proposer serves a [`Cluster`]: every append in it is idempotent, so
//! appends that were committed are answered `DUPLICATE` with their
//! original offsets. A proposer of one replica
//! ([`Proposer::for_replica`], a node serving clients over the network)
//! does not retry: it answers every request of the proposal
//! [`SubmitError::NotAnswered`] with the leader it knows of, and the
//! client retries its own request, at that leader. A producer with several
//! requests in flight can then see a later one answered `OUT_OF_ORDER`
//! (it was committed before the earlier one's retry) and must retry it,
//! as Kafka clients do; with one request in flight per producer, as in the
//! tests and the bench, that cannot happen.

use std::sync::Arc;

use openraft::error::ClientWriteError;
use openraft::{LogId, Raft};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::command::{Command, GROUP_HEAD, MAX_APPENDS_PER_ENTRY, MAX_COMMAND_BYTES, Response};
use crate::node::{Cluster, Replica, SubmitError};
use crate::{NodeId, TypeConfig};

type Reply = oneshot::Sender<Result<Answer, SubmitError>>;

/// The answer to one request sent through a [`Proposer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The entry that carried the request (shared with the other requests
    /// batched with it).
    pub log_id: LogId<NodeId>,
    /// The slot of the request's first append in that entry.
    pub first_slot: usize,
    /// One outcome per append of the request, in order.
    pub response: Response,
}

/// Batches concurrent requests into shared entries (module docs). Cheap
/// to clone; the batching task ends when every clone is dropped.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<(Command, Reply)>,
}

/// How a [`Proposer`] batches.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProposerOptions {
    /// Proposals handed to the leader and not yet answered, at most
    /// (at least 1). Fewer make bigger entries and fewer fsyncs per
    /// append; more let the leader fsync one proposal while the followers
    /// fsync the one before, which pays when each replica has a disk of
    /// its own. A proposal retried after a failover keeps its slot until
    /// it is answered. Default 2: on one shared disk, two runs of the
    /// bench never found 4 ahead of 1 or 2 (docs/scaling.md).
    pub in_flight: usize,
}

impl Default for ProposerOptions {
    fn default() -> Self {
        ProposerOptions {
            in_flight: IN_FLIGHT,
        }
    }
}

impl ProposerOptions {
    /// These options with at most `n` proposals in flight at once (0 is
    /// taken as 1).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = n.max(1);
        self
    }
}

impl Proposer {
    /// Starts the batching task for `cluster`, with the default options.
    pub fn new(cluster: Arc<Cluster>) -> Proposer {
        Proposer::with_options(cluster, ProposerOptions::default())
    }

    /// Starts the batching task for `cluster`.
    pub fn with_options(cluster: Arc<Cluster>, options: ProposerOptions) -> Proposer {
        Proposer::spawn(Target::Cluster(cluster), options)
    }

    /// Starts the batching task for one replica: proposals go to its own
    /// openraft, and a request whose proposal fails or is not answered in
    /// time (this replica is not the leader, or stopped leading) is
    /// answered [`SubmitError::NotAnswered`] with the leader it knows of,
    /// for the client to retry there (module docs).
    pub fn for_replica(replica: Replica, options: ProposerOptions) -> Proposer {
        Proposer::spawn(Target::Replica(replica), options)
    }

    fn spawn(target: Target, options: ProposerOptions) -> Proposer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(target, rx, options.in_flight.max(1)));
        Proposer { tx }
    }

    /// Proposes `command` in the next entry and waits for its outcomes.
    pub async fn submit(&self, command: Command) -> Result<Answer, SubmitError> {
        command.validate().map_err(SubmitError::Invalid)?;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((command, reply))
            .map_err(|_| SubmitError::Invalid("the proposer stopped"))?;
        answer
            .await
            .map_err(|_| SubmitError::Invalid("the proposer stopped"))?
    }
}

/// Proposals in flight at once. openraft takes them in the order they
/// are handed over, so requests keep their order in the log while the
/// leader fsyncs one proposal and replicates the one before.
const IN_FLIGHT: usize = 2;

/// How long an in-flight proposal may take before it is retried through
/// [`Cluster::submit`] (a leader cut off from the others never commits).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Where proposals go.
#[derive(Clone)]
enum Target {
    /// To the cluster's leader; retried through [`Cluster::submit`].
    Cluster(Arc<Cluster>),
    /// To this replica; not retried (the client retries).
    Replica(Replica),
}

impl Target {
    /// The openraft to hand the next proposal to.
    fn raft(&self) -> Option<Raft<TypeConfig>> {
        match self {
            Target::Cluster(c) => c.leader().and_then(|l| c.replica(l)),
            Target::Replica(r) => Some(r.clone()),
        }
        .map(|r| r.raft().clone())
    }

    /// What to do with a proposal whose outcome is not known (`why`).
    async fn unknown(
        &self,
        command: Command,
        why: String,
        leader: Option<NodeId>,
    ) -> Result<(LogId<NodeId>, Response), SubmitError> {
        match self {
            Target::Cluster(c) => c.submit(command).await,
            Target::Replica(r) => Err(SubmitError::NotAnswered {
                node: r.id(),
                leader: leader.or_else(|| r.leader()),
                reason: why,
            }),
        }
    }
}

async fn run(target: Target, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>, in_flight: usize) {
    let mut queue = Queue::new(in_flight);
    while let Some((permit, command, waiting)) = queue.next(&mut rx).await {
        // Handed to the leader's openraft here, in order; answered later.
        let pending = match target.raft() {
            Some(raft) => raft.client_write_ff(command.clone()).await.ok(),
            None => None,
        };
        let target = target.clone();
        tokio::spawn(async move {
            let committed = match pending {
                Some(answer) => match tokio::time::timeout(PATIENCE, answer).await {
                    Ok(Ok(Ok(r))) => Ok((r.log_id, r.data)),
                    Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                        Err(("not the leader".to_string(), f.leader_id))
                    }
                    Ok(Ok(Err(e))) => Err((e.to_string(), None)),
                    Ok(Err(_)) => Err(("the replica stopped".to_string(), None)),
                    Err(_) => Err((format!("not committed within {PATIENCE:?}"), None)),
                },
                None => Err(("no leader known".to_string(), None)),
            };
            // Unknown outcome: retry the same entry (idempotent), or let
            // the client do so.
            let result = match committed {
                Ok(r) => Ok(r),
                Err((why, leader)) => target.unknown(command, why, leader).await,
            };
            answer_all(result, waiting);
            drop(permit);
        });
    }
}

/// Requests waiting to be proposed, with at most `in_flight` proposals
/// on their way at once: the batching loop of a [`Proposer`] and of a
/// client's requests (`client.rs`).
pub(crate) struct Queue<R> {
    permits: Arc<Semaphore>,
    /// A request taken from the channel that did not join the last
    /// proposal.
    carried: Option<(Command, R)>,
}

impl<R> Queue<R> {
    pub(crate) fn new(in_flight: usize) -> Queue<R> {
        Queue {
            permits: Arc::new(Semaphore::new(in_flight.max(1))),
            carried: None,
        }
    }

    /// Waits for a free slot (requests that arrive meanwhile make the next
    /// proposal bigger), then for a request, and returns the slot (held
    /// until the proposal is answered) and the next proposal ([`gather`]);
    /// `None` once every sender is gone.
    pub(crate) async fn next(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<(Command, R)>,
    ) -> Option<(OwnedSemaphorePermit, Command, Vec<(Command, R)>)> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let first = match self.carried.take() {
            Some(c) => c,
            None => rx.recv().await?,
        };
        let (command, waiting) = gather(first, rx, &mut self.carried);
        Some((permit, command, waiting))
    }
}

/// The next proposal: `first`, then every request queued in `rx` while
/// it fits in one entry (in appends and in bytes; each request passed
/// `Command::validate` alone), merged into one `AppendAll` if there are
/// several. A lifecycle command is an entry of its own, in its place in
/// the order: a request that does not join is left in `carried`, to start
/// the next proposal. Returns the command and the requests it carries, in
/// order.
pub(crate) fn gather<R>(
    first: (Command, R),
    rx: &mut mpsc::UnboundedReceiver<(Command, R)>,
    carried: &mut Option<(Command, R)>,
) -> (Command, Vec<(Command, R)>) {
    let mut appends = first.0.appends().len();
    let mut bytes = GROUP_HEAD + first.0.appends_len();
    let alone = !first.0.is_append();
    let mut waiting = vec![first];
    while let Some(next) = (!alone).then(|| rx.try_recv().ok()).flatten() {
        let (n, b) = (next.0.appends().len(), next.0.appends_len());
        if !next.0.is_append()
            || appends + n > MAX_APPENDS_PER_ENTRY
            || bytes + b > MAX_COMMAND_BYTES
        {
            *carried = Some(next);
            break;
        }
        appends += n;
        bytes += b;
        waiting.push(next);
    }
    let command = if waiting.len() == 1 {
        waiting[0].0.clone()
    } else {
        Command::AppendAll(
            waiting
                .iter()
                .flat_map(|(c, _)| c.appends().iter().cloned())
                .collect(),
        )
    };
    (command, waiting)
}

/// Each request's part of the answer to the proposal that carried them
/// (`gather`): its own outcomes, and the slot of its first append, counted
/// from `base` (where the proposal's appends start in their entry). A
/// request alone gets the whole response (a lifecycle command's answer is
/// not a slice).
pub(crate) fn split<R>(
    waiting: Vec<(Command, R)>,
    base: usize,
    response: Response,
) -> Vec<(R, usize, Response)> {
    if waiting.len() == 1 {
        return waiting
            .into_iter()
            .map(|(_, r)| (r, base, response.clone()))
            .collect();
    }
    let mut outcomes = response.outcomes.into_iter();
    let mut slot = base;
    waiting
        .into_iter()
        .map(|(command, reply)| {
            let n = command.appends().len();
            let mine = Response {
                outcomes: outcomes.by_ref().take(n).collect(),
                lifecycle: None,
            };
            slot += n;
            (reply, slot - n, mine)
        })
        .collect()
}

/// Gives each request its slice of the entry's outcomes.
fn answer_all(
    result: Result<(LogId<NodeId>, Response), SubmitError>,
    waiting: Vec<(Command, Reply)>,
) {
    match result {
        Ok((log_id, response)) => {
            for (reply, first_slot, response) in split(waiting, 0, response) {
                let _ = reply.send(Ok(Answer {
                    log_id,
                    first_slot,
                    response,
                }));
            }
        }
        Err(e) => {
            let (node, leader) = match &e {
                SubmitError::NotAnswered { node, leader, .. } => (*node, *leader),
                _ => (0, None),
            };
            let text = match &e {
                SubmitError::NotAnswered { reason, .. } => reason.clone(),
                e => e.to_string(),
            };
            for (_, reply) in waiting {
                let _ = reply.send(Err(SubmitError::NotAnswered {
                    node,
                    leader,
                    reason: text.clone(),
                }));
            }
        }
    }
}
