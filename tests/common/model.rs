//! A deliberately simple reference model of the rules, written from the
//! issue text, not from the engine: a map of keys to (epoch, last sequence,
//! a list of retained batches), searched linearly.

#![allow(dead_code)]

use std::collections::HashMap;

use producer_state::{AppendRequest, BatchMetadata, BatchOutcome, OutOfOrderReason, ProducerEntry};

pub type Key = (producer_state::ProducerId, i32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    pub epoch: i16,
    pub last: i32,
    /// `None` until the key's first append with metadata: keys that only
    /// use the single-sequence append retain nothing.
    pub retained: Option<Vec<(i32, i32, Option<BatchMetadata>)>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub keys: HashMap<Key, ModelEntry>,
}

fn succ(s: i32) -> i32 {
    if s == i32::MAX { 0 } else { s + 1 }
}

impl Model {
    pub fn append(&mut self, r: &AppendRequest) -> BatchOutcome {
        let key = (r.producer_id.clone(), r.partition);
        let (epoch, first, last, meta) =
            (r.epoch, r.first_sequence(), r.last_sequence(), r.metadata());
        let malformed = if first < 0 || last < 0 {
            Some(OutOfOrderReason::NegativeSequence)
        } else if last < first {
            Some(OutOfOrderReason::LastBeforeFirst)
        } else {
            None
        };
        let ooo = |reason| BatchOutcome::OutOfOrder { reason };
        let Some(e) = self.keys.get_mut(&key) else {
            if let Some(m) = malformed {
                return ooo(m);
            }
            if first != 0 {
                return ooo(OutOfOrderReason::UnknownProducer {
                    first_sequence: first,
                });
            }
            let retained = meta.map(|_| vec![(first, last, meta)]);
            self.keys.insert(
                key,
                ModelEntry {
                    epoch,
                    last,
                    retained,
                },
            );
            return BatchOutcome::Accepted;
        };
        if epoch < e.epoch {
            return BatchOutcome::FencedEpoch {
                current_epoch: e.epoch,
            };
        }
        if let Some(m) = malformed {
            return ooo(m);
        }
        if epoch > e.epoch {
            if first != 0 {
                return ooo(OutOfOrderReason::NewEpochNotAtZero {
                    first_sequence: first,
                });
            }
            let retained = match (&e.retained, meta) {
                (None, None) => None,
                _ => Some(vec![(first, last, meta)]),
            };
            *e = ModelEntry {
                epoch,
                last,
                retained,
            };
            return BatchOutcome::Accepted;
        }
        if first == succ(e.last) {
            e.last = last;
            match (&mut e.retained, meta) {
                (Some(v), _) => {
                    v.push((first, last, meta));
                    if v.len() > 5 {
                        v.remove(0);
                    }
                }
                (None, Some(_)) => e.retained = Some(vec![(first, last, meta)]),
                (None, None) => {}
            }
            return BatchOutcome::Accepted;
        }
        if let Some(b) = e
            .retained
            .as_ref()
            .and_then(|v| v.iter().find(|b| b.0 == first && b.1 == last))
        {
            return BatchOutcome::Duplicate { original: b.2 };
        }
        if first <= e.last {
            if first == last {
                BatchOutcome::Duplicate { original: None }
            } else {
                ooo(OutOfOrderReason::OverlapsAccepted {
                    last_accepted: e.last,
                })
            }
        } else {
            ooo(OutOfOrderReason::Gap {
                expected: succ(e.last),
                first_sequence: first,
            })
        }
    }

    pub fn entry(&self, key: &Key) -> Option<&ModelEntry> {
        self.keys.get(key)
    }
}

/// True when the engine's entry says exactly what the model's does.
pub fn same_entry(engine: &ProducerEntry, model: &ModelEntry) -> bool {
    let retained: Vec<_> = engine
        .retained_batches()
        .map(|b| (b.first_sequence, b.last_sequence, b.metadata))
        .collect();
    engine.epoch() == model.epoch
        && engine.last_sequence() == model.last
        && retained == model.retained.clone().unwrap_or_default()
}
