//! `append_all`: many requests under one lock, their accepted records
//! sharing one write and one fsync; under `Always` each answer waits for
//! its record, under the buffered policies the lookups of a chunk of
//! requests run ahead of their appends.

use std::sync::MutexGuard;

use super::state::{State, Submit};
use super::{ProducerStateStore, Shared, WARM, check_seed};
use crate::batch::AppendRequest;
use crate::engine::map::hash_key;
use crate::engine::shards::{KeyTarget, warm};
use crate::error::Result;
use crate::outcome::BatchOutcome;

impl ProducerStateStore {
    /// [`ProducerStateStore::append_all`], before its answers are counted.
    pub(super) fn decide_all(&self, requests: &[AppendRequest]) -> Vec<Result<BatchOutcome>> {
        let shared = &*self.shared;
        if shared.kafka {
            return shared.kafka_all(requests);
        }
        let now = shared.now_for(requests);
        let mut st = shared.lock_state();
        if !shared.is_always() {
            st = shared.room(st);
            return shared.append_all_buffered(st, requests, now);
        }
        let mut out: Vec<Result<BatchOutcome>> = Vec::with_capacity(requests.len());
        // Accepted: (index, group, position), to settle once durable.
        let mut queued: Vec<(usize, u64, u64)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if let Err(e) = check_seed(r) {
                out.push(Err(e));
                continue;
            }
            let hash = hash_key(&r.producer_id, r.partition);
            out.push(loop {
                if let Some(f) = st.log.failed() {
                    break Err(f.error_for(None));
                }
                match st.submit_durable(hash, r, now) {
                    Submit::Done(o) => break Ok(o),
                    Submit::Refused(e) => break Err(e),
                    Submit::Queued { group, pos } => {
                        queued.push((i, group, pos));
                        break Ok(BatchOutcome::Accepted);
                    }
                    Submit::Wait { group, pos } => {
                        let waited;
                        (st, waited) = shared.commit_and_relock(st, group, pos);
                        if let Err(e) = waited {
                            break Err(e);
                        }
                    }
                }
            });
        }
        settle(shared, st, &queued, &mut out);
        out
    }
}

/// `Always`: commits what `append_all` queued and waits for it; an
/// append whose record was lost gets the failure.
pub(super) fn settle(
    shared: &Shared,
    st: MutexGuard<'_, State>,
    queued: &[(usize, u64, u64)],
    out: &mut [Result<BatchOutcome>],
) {
    let Some(&(_, group, pos)) = queued.last() else {
        return;
    };
    shared.commit(st);
    if shared.await_durable(group, pos).is_err() {
        let st = shared.lock_state();
        for &(i, _, pos) in queued {
            if let Some(f) = st.log.failed()
                && st.log.durable() <= pos
                && let Some(o) = out.get_mut(i)
            {
                *o = Err(f.error_for(Some(pos)));
            }
        }
    }
}

impl Shared {
    /// `append_all`'s wait for a key with a record in flight: commits what
    /// the call queued so far (its own records may be what it waits for),
    /// waits for the record at `pos` (of commit group `group`) and takes
    /// the lock again, whatever the wait gave.
    pub(super) fn commit_and_relock<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        group: u64,
        pos: u64,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        self.commit(st);
        let waited = self.await_durable(group, pos);
        (self.lock_state(), waited)
    }

    /// [`ProducerStateStore::append_all`] under a buffered policy: classify,
    /// apply and encode every request under one lock.
    fn append_all_buffered(
        &self,
        mut st: MutexGuard<'_, State>,
        requests: &[AppendRequest],
        now: i64,
    ) -> Vec<Result<BatchOutcome>> {
        if let Some(f) = st.log.failed() {
            return requests
                .iter()
                .map(|r| check_seed(r).and(Err(f.error_for(None))))
                .collect();
        }
        let mut accepted = false;
        let mut out = Vec::with_capacity(requests.len());
        let mut hashes = [0u64; WARM];
        for chunk in requests.chunks(WARM) {
            for (h, r) in hashes.iter_mut().zip(chunk) {
                *h = hash_key(&r.producer_id, r.partition);
            }
            let shards = &st.keys.shards;
            warm(hashes.iter().copied().zip(chunk), |hash, r| {
                shards.contains(hash, &r.producer_id, r.partition)
            });
            for (&hash, r) in hashes.iter().zip(chunk) {
                out.push(check_seed(r).and_then(|()| {
                    let o = st.submit_buffered(hash, r, now)?;
                    accepted |= o.is_accepted();
                    Ok(o)
                }));
            }
        }
        if accepted {
            self.after_buffered(st);
        }
        out
    }
}
