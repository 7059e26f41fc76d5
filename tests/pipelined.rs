//! Pipelined appends (`append_pipelined`, `Pending::wait`) give the
//! outcomes appends one by one give, in both semantics, with up to five
//! requests in flight: checked against the reference model (strict) and
//! against a store appended to one request at a time (Kafka), and again
//! after a reopen.

mod common;

use std::collections::VecDeque;

use common::model::Model;
use common::store_util::{diff, dir, matches, sim_opts, workload};
use producer_state::fs::SimFs;
use producer_state::{AppendRequest, ProducerStateStore, Semantics};

/// Hands `reqs` over in order, at most `depth` in flight, and answers
/// them in order: each answer as a string (an error's message too).
fn pipelined(store: &ProducerStateStore, reqs: &[AppendRequest], depth: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(reqs.len());
    let mut pending = VecDeque::new();
    for r in reqs {
        pending.push_back(store.append_pipelined(r));
        if pending.len() == depth {
            out.push(answer(pending.pop_front().unwrap().wait()));
        }
    }
    out.extend(pending.into_iter().map(|p| answer(p.wait())));
    out
}

fn answer(r: producer_state::Result<producer_state::BatchOutcome>) -> String {
    match r {
        Ok(o) => format!("{o:?}"),
        Err(e) => format!("error: {e}"),
    }
}

#[test]
fn pipelined_appends_answer_as_the_model_does() {
    let reqs = workload(3_000);
    let mut model = Model::default();
    let want: Vec<String> = reqs
        .iter()
        .map(|r| format!("{:?}", model.append_at(r, 0)))
        .collect();
    for depth in [1, 2, 5] {
        let fs = SimFs::new();
        let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
        assert_eq!(pipelined(&store, &reqs, depth), want, "{depth} in flight");
        assert!(matches(&store, &model), "{}", diff(&store, &model));
        store.close().unwrap();
        let store = ProducerStateStore::open_with(dir(), sim_opts(&fs)).unwrap();
        assert!(
            matches(&store, &model),
            "reopened: {}",
            diff(&store, &model)
        );
    }
}

#[test]
fn kafka_mode_pipelined_appends_answer_as_one_by_one() {
    // Kafka's producer ids are numbers: the named keys are refused alike.
    let reqs = workload(3_000);
    let kafka = |fs: &SimFs| sim_opts(fs).semantics(Semantics::Kafka);
    let one = SimFs::new();
    let store = ProducerStateStore::open_with(dir(), kafka(&one)).unwrap();
    let want: Vec<String> = reqs
        .iter()
        .map(|r| answer(store.append_request(r)))
        .collect();
    let keys: Vec<_> = reqs
        .iter()
        .map(|r| (r.producer_id.clone(), r.partition))
        .collect();
    let state = |s: &ProducerStateStore| -> Vec<_> {
        keys.iter().map(|(id, p)| s.get(id.clone(), *p)).collect()
    };
    let expected = state(&store);
    assert!(want.iter().any(|a| a == "Accepted"));
    for depth in [2, 5] {
        let fs = SimFs::new();
        let store = ProducerStateStore::open_with(dir(), kafka(&fs)).unwrap();
        assert_eq!(pipelined(&store, &reqs, depth), want, "{depth} in flight");
        assert_eq!(state(&store), expected);
        store.close().unwrap();
        let store = ProducerStateStore::open_with(dir(), kafka(&fs)).unwrap();
        assert_eq!(state(&store), expected, "reopened");
    }
}
