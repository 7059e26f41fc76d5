//! The engine against the reference model: random single and batch appends
//! over a small key space, >= 100k operations in the default run.

mod common;

use common::model::{Model, same_entry};
use common::ops::{KEYS, key, op, request};
use producer_state::ProducerStateManager;
use proptest::prelude::*;

/// 256 cases x 400 operations = 102,400 appends per default run.
const OPS_PER_CASE: usize = 400;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_reference_model(ops in prop::collection::vec(op(), OPS_PER_CASE)) {
        let mut engine = ProducerStateManager::new();
        let mut model = Model::default();
        for (i, op) in ops.iter().enumerate() {
            let req = request(op, &model);
            let expected = model.append(&req);
            let got = engine.append_request(&req);
            prop_assert_eq!(got, expected, "op {} {:?}", i, req);
            let k = (req.producer_id.clone(), req.partition);
            match (engine.get(req.producer_id.clone(), req.partition), model.entry(&k)) {
                (Some(e), Some(m)) => prop_assert!(same_entry(&e, m), "op {}: {:?} vs {:?}", i, e, m),
                (None, None) => {}
                (e, m) => prop_assert!(false, "op {}: presence differs: {:?} vs {:?}", i, e, m),
            }
        }
        prop_assert_eq!(engine.len(), model.keys.len());
        for k in 0..KEYS {
            let (id, p) = key(k);
            prop_assert_eq!(engine.get(id.clone(), p).is_some(), model.entry(&(id, p)).is_some());
        }
        prop_assert_eq!(engine.iter().count(), model.keys.len());
    }

    #[test]
    fn single_append_is_a_batch_of_one_without_metadata(ops in prop::collection::vec(op(), 200)) {
        let mut a = ProducerStateManager::new();
        let mut b = ProducerStateManager::new();
        let mut model = Model::default();
        for op in &ops {
            let req = request(op, &model);
            model.append(&req);
            let via_request = a.append_request(&req).outcome();
            let via_api = match req.metadata() {
                None => b.append(req.producer_id.clone(), req.partition, req.epoch, req.first_sequence()),
                Some(m) => b.append_batch(
                    req.producer_id.clone(), req.partition, req.epoch,
                    producer_state::Batch::new(req.first_sequence(), req.last_sequence(), m.offset, m.timestamp),
                ).outcome(),
            };
            prop_assert_eq!(via_request, via_api);
        }
    }
}
