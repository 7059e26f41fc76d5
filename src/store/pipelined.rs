//! Pipelined appends: a request classified and queued without waiting for
//! it to be durable, answered later and in order by [`Pending::wait`].
//!
//! A broker connection that pipelines its requests (librdkafka keeps up to
//! five in flight) hands them over in the order they came with
//! [`ProducerStateStore::append_pipelined`] and answers each once it is
//! durable. One producer's batches then share group commits: each is
//! classified against the state its predecessors queued, and the
//! connection does not wait between them. A blocking `append` per
//! request needs a thread per request in flight, and their hand-overs to
//! one another, in order, cost as much as the fsync they would share.
//!
//! The guarantees are [`ProducerStateStore::append`]'s: nothing accepted
//! is answered before it is durable, and a retry of a record in flight is
//! not answered `DUPLICATE` before its original is durable: a request
//! whose key has a record in flight that it does not continue is
//! classified once that record is durable, and the hand-over waits for
//! it, so that the requests after it see it classified.

use super::ProducerStateStore;
use super::state::Submit;
use super::txn::{KafkaAnswer, KafkaOp, KafkaSubmit, check_kafka};
use super::{check_name, check_seed};
use crate::batch::AppendRequest;
use crate::engine::map::hash_key;
use crate::error::Result;
use crate::outcome::BatchOutcome;

/// A request handed over by [`ProducerStateStore::append_pipelined`]: its
/// outcome comes from [`Pending::wait`], once what it accepted is durable.
#[must_use = "a pending append is answered by `wait`"]
pub struct Pending<'a> {
    store: &'a ProducerStateStore,
    state: State,
}

enum State {
    /// Answered when handed over: nothing to wait for.
    Done(Result<BatchOutcome>),
    /// Accepted and queued at `pos` in `group`.
    Queued {
        outcome: BatchOutcome,
        group: u64,
        pos: u64,
    },
}

impl ProducerStateStore {
    /// Classifies one request and queues what it accepts, without waiting
    /// for it to be durable: [`Pending::wait`] gives the outcome once it
    /// is. Requests handed over in order get the outcomes they would get
    /// one by one; waiting for them in the same order answers each as
    /// soon as it may be. Under the buffered fsync policies there is
    /// nothing to wait for, and the request is appended as by
    /// [`ProducerStateStore::append_request`].
    ///
    /// ```
    /// use producer_state::{AppendRequest, Batch, ProducerStateStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = ProducerStateStore::open(dir.path())?;
    /// // Five batches of one producer in flight, then their answers.
    /// let pending: Vec<_> = (0..5)
    ///     .map(|s| store.append_pipelined(&AppendRequest::batch(7u64, 0, 0, Batch::new(s, s, i64::from(s), 1))))
    ///     .collect();
    /// for p in pending {
    ///     assert!(p.wait()?.is_accepted());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn append_pipelined(&self, request: &AppendRequest) -> Pending<'_> {
        let pending = |state| Pending { store: self, state };
        let shared = &*self.shared;
        let checked = if shared.kafka {
            check_name(request).and_then(|()| check_kafka(request))
        } else {
            check_seed(request)
        };
        if !shared.is_always() || checked.is_err() {
            return pending(State::Done(self.append_request(request)));
        }
        let mut st = match shared.lock_to_write(false) {
            Ok(st) => st,
            Err(e) => return pending(State::Done(Err(e))),
        };
        // A request whose key has a record in flight that it does not
        // continue (a retry, a gap) is classified once that record is
        // durable, here: the requests after it must see it classified.
        let state = loop {
            let submitted = if shared.kafka {
                match st.submit_kafka(&KafkaOp::Batch(request)) {
                    Err(e) => Err(State::Done(Err(e))),
                    Ok(KafkaSubmit::Done(a)) => Err(State::Done(Ok(outcome_of(a)))),
                    Ok(KafkaSubmit::Queued { answer, group, pos }) => Err(State::Queued {
                        outcome: outcome_of(answer),
                        group,
                        pos,
                    }),
                    Ok(KafkaSubmit::Wait { group, pos }) => Ok((group, pos)),
                }
            } else {
                let hash = hash_key(&request.producer_id, request.partition);
                let now = shared.now_for(std::slice::from_ref(request));
                match st.submit_durable(hash, request, now) {
                    Submit::Done(o) => Err(State::Done(Ok(o))),
                    Submit::Refused(e) => Err(State::Done(Err(e))),
                    Submit::Queued { group, pos } => Err(State::Queued {
                        outcome: BatchOutcome::Accepted,
                        group,
                        pos,
                    }),
                    Submit::Wait { group, pos } => Ok((group, pos)),
                }
            };
            let (group, pos) = match submitted {
                Err(state) => break state,
                Ok(wait) => wait,
            };
            st = match shared.relock_after(st, group, pos) {
                Ok(st) => st,
                Err(e) => return pending(State::Done(Err(e))),
            };
        };
        // Nobody is asked to write it yet: the first `wait` leads a group
        // commit with every request queued meanwhile.
        drop(st);
        pending(state)
    }
}

/// A Kafka-mode batch's answer as its outcome.
fn outcome_of(a: KafkaAnswer) -> BatchOutcome {
    match a {
        KafkaAnswer::Batch(o) => o,
        _ => BatchOutcome::Accepted,
    }
}

impl Pending<'_> {
    /// The request's outcome, once what it accepted is durable: if no
    /// group commit is under way, this call leads one, with every request
    /// handed over so far. A pending request never waited for is written
    /// with the next group commit (another append's, a `sync`, the close).
    ///
    /// # Errors
    ///
    /// As [`ProducerStateStore::append`]: a write or fsync that failed
    /// (the store is then poisoned, and this request was not made
    /// durable), or a request refused when handed over.
    pub fn wait(self) -> Result<BatchOutcome> {
        let shared = &*self.store.shared;
        let answer = match self.state {
            State::Done(r) => r,
            State::Queued {
                outcome,
                group,
                pos,
            } => {
                if shared.log.durable_past(pos) {
                    Ok(outcome)
                } else {
                    // Leads a group commit if nobody does (every request
                    // handed over meanwhile is in it), as an append does.
                    shared.commit(shared.lock_state());
                    shared.await_durable(group, pos).map(|()| outcome)
                }
            }
        };
        shared.log.telemetry().answered(&answer);
        answer
    }
}
