//! Helpers shared by the member's integration tests.

use producer_state::{ProducerEntry, ProducerStateManager};

/// Every key of `mgr` with its entry, in key order, to compare states.
pub fn sorted(mgr: &ProducerStateManager) -> Vec<(String, i32, ProducerEntry)> {
    let mut v: Vec<_> = mgr
        .iter()
        .map(|(p, part, e)| (p.to_string(), part, e))
        .collect();
    v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    v
}
