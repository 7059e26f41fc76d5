//! The durable store against the reference model: random appends (single
//! and batch), snapshots, clean reopens and crashes with random crash
//! images; a crash strikes a few IO operations after it is scheduled, so it
//! lands inside appends, snapshots and segment rolls, and the run goes on
//! appending to the recovered store (a torn tail that recovery did not cut
//! would surface at the next recovery). `append_all` calls of up to 80
//! requests (built in order against the model, so a call holds retries and
//! fencings of its own earlier requests) must give the outcomes of the
//! same appends one by one. Under `FsyncPolicy::Always` the
//! state after any reopen is exactly the acknowledged appends plus at most
//! the one in flight; under `Never` a crash may lose a suffix, so the state
//! must be the model after some prefix of the appends since the last sync
//! (and never anything else).

mod common;

use common::model::Model;
use common::ops::{Op, op, request};
use common::store_util::{diff, dir, matches, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{AppendRequest, FsyncPolicy, ProducerStateStore, StoreOptions};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Append(Op),
    AppendAll(Vec<Op>),
    Snapshot,
    Reopen,
    /// Crash `k` IO operations from now, leaving this kind of image.
    Crash(u8, u8, u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        85 => op().prop_map(Step::Append),
        5 => prop::collection::vec(op(), 1..80).prop_map(Step::AppendAll),
        3 => Just(Step::Snapshot),
        3 => Just(Step::Reopen),
        4 => (0u8..8, 0u8..4, any::<u64>()).prop_map(|(k, m, s)| Step::Crash(k, m, s)),
    ]
}

struct Run {
    policy: FsyncPolicy,
    fs: SimFs,
    store: Option<ProducerStateStore>,
    model: Model,
    /// Models after each accepted append since everything was last durable
    /// (for `Never`, a crash may land on any of them).
    since_sync: Vec<Model>,
    /// The image a pending crash leaves.
    image: (u8, u64),
}

impl Run {
    fn opts(&self, fs: &SimFs) -> StoreOptions {
        sim_opts(fs)
            .fsync(self.policy)
            .segment_size(2048)
            .snapshot_every_records(Some(60))
    }

    fn store(&self) -> &ProducerStateStore {
        self.store.as_ref().expect("open")
    }

    /// The machine went down: recover from the crash image and check it.
    fn crashed(&mut self, step: usize, inflight: &[AppendRequest]) -> Result<(), TestCaseError> {
        drop(self.store.take());
        let (mode, seed) = self.image;
        self.fs = self.fs.crash_image(match mode {
            0 => Unsynced::Drop,
            1 => Unsynced::Keep,
            2 => Unsynced::TornPrefix(seed),
            _ => Unsynced::Sectors(seed),
        });
        let store = ProducerStateStore::open_with(dir(), self.opts(&self.fs))
            .map_err(|e| TestCaseError::fail(format!("step {step}: recovery failed: {e}")))?;
        if self.policy == FsyncPolicy::Always {
            // The records in flight were written in order: any prefix of
            // them may have survived.
            let mut m = self.model.clone();
            for r in inflight {
                m.append(r);
                if matches(&store, &m) {
                    self.model = m.clone();
                }
            }
            prop_assert!(
                matches(&store, &self.model),
                "step {}: {}",
                step,
                diff(&store, &self.model)
            );
        } else {
            let k = self.since_sync.iter().rposition(|m| matches(&store, m));
            prop_assert!(
                k.is_some(),
                "step {}: not a prefix: {}",
                step,
                diff(&store, &self.model)
            );
            self.model = self.since_sync[k.unwrap_or(0)].clone();
        }
        self.since_sync = vec![self.model.clone()];
        self.store = Some(store);
        Ok(())
    }

    fn step(&mut self, i: usize, s: &Step) -> Result<(), TestCaseError> {
        match s {
            Step::Append(o) => {
                let r = request(o, &self.model);
                match self.store().append_request(&r) {
                    Ok(got) => {
                        let want = self.model.append(&r);
                        prop_assert_eq!(got, want, "step {} {:?}", i, r);
                        if want.is_accepted() {
                            self.since_sync.push(self.model.clone());
                        }
                    }
                    Err(_) if self.fs.crashed() => self.crashed(i, std::slice::from_ref(&r))?,
                    Err(e) => prop_assert!(false, "step {}: {}", i, e),
                }
            }
            Step::AppendAll(ops) => {
                let mut scratch = self.model.clone();
                let reqs: Vec<AppendRequest> = ops
                    .iter()
                    .map(|o| {
                        let r = request(o, &scratch);
                        scratch.append(&r);
                        r
                    })
                    .collect();
                let out = self.store().append_all(&reqs);
                prop_assert_eq!(out.len(), reqs.len());
                // Answered requests come first in log order; from the first
                // error on (a crash), the rest are in flight.
                let answered = out.iter().take_while(|o| o.is_ok()).count();
                for (j, (got, r)) in out.iter().zip(&reqs).take(answered).enumerate() {
                    let want = self.model.append(r);
                    prop_assert_eq!(
                        got.as_ref().ok(),
                        Some(&want),
                        "step {} request {} {:?}",
                        i,
                        j,
                        r
                    );
                    if want.is_accepted() {
                        self.since_sync.push(self.model.clone());
                    }
                }
                if answered < reqs.len() {
                    prop_assert!(self.fs.crashed(), "step {}: {:?}", i, out[answered]);
                    self.crashed(i, &reqs[answered..])?;
                }
            }
            Step::Snapshot => match self.store().snapshot() {
                Ok(_) => self.since_sync = vec![self.model.clone()],
                Err(_) if self.fs.crashed() => self.crashed(i, &[])?,
                Err(e) => prop_assert!(false, "step {}: {}", i, e),
            },
            Step::Reopen => {
                let closed = self.store.take().expect("open").close();
                if self.fs.crashed() {
                    return self.crashed(i, &[]);
                }
                prop_assert!(closed.is_ok(), "step {}: {:?}", i, closed);
                // Opening writes too (it fsyncs the log it continues), so a
                // scheduled crash may strike there.
                let store = match ProducerStateStore::open_with(dir(), self.opts(&self.fs)) {
                    Ok(s) => s,
                    Err(_) if self.fs.crashed() => return self.crashed(i, &[]),
                    Err(e) => return Err(TestCaseError::fail(format!("step {i}: reopen: {e}"))),
                };
                prop_assert!(
                    matches(&store, &self.model),
                    "step {}: {}",
                    i,
                    diff(&store, &self.model)
                );
                self.store = Some(store);
                self.since_sync = vec![self.model.clone()];
            }
            Step::Crash(k, mode, seed) => {
                if !self.fs.crashed() {
                    self.fs
                        .set_fault(self.fs.ops() + u64::from(*k), Fault::Crash);
                    self.image = (*mode, *seed);
                }
            }
        }
        Ok(())
    }
}

fn run(steps: &[Step], policy: FsyncPolicy) -> Result<(), TestCaseError> {
    let fs = SimFs::new();
    let mut r = Run {
        policy,
        store: None,
        model: Model::default(),
        since_sync: vec![Model::default()],
        image: (0, 0),
        fs,
    };
    r.store = Some(ProducerStateStore::open_with(dir(), r.opts(&r.fs)).unwrap());
    for (i, s) in steps.iter().enumerate() {
        r.step(i, s)?;
    }
    // Whatever is pending, a final crash and recovery must hold too.
    if !r.fs.crashed() {
        r.fs.set_fault(r.fs.ops(), Fault::Crash);
    }
    r.crashed(steps.len(), &[])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_store_matches_the_model_across_reopens_and_crashes(steps in prop::collection::vec(step(), 150..300)) {
        run(&steps, FsyncPolicy::Always)?;
    }

    #[test]
    fn without_fsync_a_crash_loses_a_suffix_never_more(steps in prop::collection::vec(step(), 150..300)) {
        run(&steps, FsyncPolicy::Never)?;
    }
}
