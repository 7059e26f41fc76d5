//! The validation rules, as one pure function.
//!
//! Everything else in the crate (the state map, the durable store, log
//! replay) asks this function what an append is and only then changes
//! state, so the rules live in exactly one place, free of IO, and are the
//! main target of the property tests.
//!
//! The four rules, checked in this order for one (producer id, partition):
//!
//! 1. no state: only first sequence 0 is accepted; anything else is out of order;
//! 2. epoch below the stored epoch: fenced, whatever the sequence;
//! 3. epoch above the stored epoch: a new session; it must start at 0,
//!    otherwise out of order (and the stored epoch stays as it was);
//! 4. same epoch: last + 1 is accepted; a retry of a retained batch is a
//!    duplicate with its metadata; a single sequence at or below the last is
//!    a duplicate; a multi-record batch reaching into the accepted range
//!    without matching a retained batch is out of order; anything higher
//!    is a gap.
//!
//! Sequences wrap like Kafka's: after `i32::MAX` comes 0, and that is
//! "last + 1". Comparisons are otherwise plain integer comparisons, exactly
//! as the rules are written; retries across the wrap are recognised through
//! the retained batches (see the crate docs, "At the limits").

use crate::batch::BatchMetadata;
use crate::outcome::{BatchOutcome, OutOfOrderReason};

/// What rule 1 does with a key that has no state: the unknown-producer
/// policy, on [`ProducerStateManager`](crate::ProducerStateManager) and on
/// the store ([`StoreOptions::unknown_producer`](crate::StoreOptions::unknown_producer)).
///
/// A key can lose its state: it expires, is evicted from a bounded table,
/// or its partition moves. A producer that was active then retries or
/// continues at some sequence above 0.
///
/// ```
/// use producer_state::{AppendOutcome, ProducerStateManager, UnknownProducer};
///
/// let mut strict = ProducerStateManager::new();
/// assert_eq!(strict.append(7u64, 0, 3, 42), AppendOutcome::OutOfOrder);
/// let mut kafka = ProducerStateManager::new().with_unknown_producer(UnknownProducer::AcceptAny);
/// assert_eq!(kafka.append(7u64, 0, 3, 42), AppendOutcome::Accepted);
/// assert_eq!(kafka.append(7u64, 0, 3, 42), AppendOutcome::Duplicate);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnknownProducer {
    /// Rule 1 as written: a key without state accepts only sequence 0;
    /// anything else is `OUT_OF_ORDER` (reason
    /// [`UnknownProducer`](crate::OutOfOrderReason::UnknownProducer)). The
    /// default. A broker tells a producer whose state was removed from one
    /// never seen with [`ProducerStateStore::was_removed`](crate::ProducerStateStore::was_removed).
    #[default]
    RequireZero,
    /// Kafka since KIP-360 (2.5): the first batch of a producer without
    /// state is accepted whatever its sequence (a well-formed one: not
    /// negative, last not before first) and epoch, because its state may
    /// have expired. Later appends follow rules 2 to 4 as usual.
    AcceptAny,
}

/// What the rules need to know of a key's stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Current {
    pub epoch: i16,
    pub last_sequence: i32,
}

/// The sequence after `s`: `s + 1`, and 0 after `i32::MAX`.
#[inline]
pub(crate) const fn next_sequence(s: i32) -> i32 {
    if s == i32::MAX { 0 } else { s + 1 }
}

/// A batch's own shape, before any state is consulted.
#[inline]
fn shape_error(first: i32, last: i32) -> Option<OutOfOrderReason> {
    if first < 0 || last < 0 {
        Some(OutOfOrderReason::NegativeSequence)
    } else if last < first {
        Some(OutOfOrderReason::LastBeforeFirst)
    } else {
        None
    }
}

/// Classifies an append of sequences `first..=last` at `epoch` against the
/// stored state `current` (`None`: no state for the key).
///
/// `retained(first, last)` looks up a retained batch with exactly these
/// sequences in the current epoch and returns its metadata (`Some(None)` for
/// a retained single-sequence append without metadata). It is only called
/// under rule 4, so a key without retained batches pays nothing for it.
#[inline]
pub(crate) fn classify(
    current: Option<Current>,
    epoch: i16,
    first: i32,
    last: i32,
    retained: impl FnOnce(i32, i32) -> Option<Option<BatchMetadata>>,
) -> BatchOutcome {
    classify_with(
        current,
        UnknownProducer::RequireZero,
        epoch,
        first,
        last,
        retained,
    )
}

/// [`classify`] with rule 1 as `unknown` says.
#[inline]
pub(crate) fn classify_with(
    current: Option<Current>,
    unknown: UnknownProducer,
    epoch: i16,
    first: i32,
    last: i32,
    retained: impl FnOnce(i32, i32) -> Option<Option<BatchMetadata>>,
) -> BatchOutcome {
    let reject = |reason| BatchOutcome::OutOfOrder { reason };
    // The common case first: the same session continuing in order. This is
    // exactly what rule 4 accepts (a stored last sequence is never negative,
    // so its successor is not either, and `last >= first` is the shape check).
    if let Some(cur) = current
        && epoch == cur.epoch
        && first == next_sequence(cur.last_sequence)
        && last >= first
    {
        return BatchOutcome::Accepted;
    }
    let Some(cur) = current else {
        // Rule 1.
        if let Some(reason) = shape_error(first, last) {
            return reject(reason);
        }
        return if first == 0 || unknown == UnknownProducer::AcceptAny {
            BatchOutcome::Accepted
        } else {
            reject(OutOfOrderReason::UnknownProducer {
                first_sequence: first,
            })
        };
    };
    // Rule 2: fencing beats everything, even a malformed batch.
    if epoch < cur.epoch {
        return BatchOutcome::FencedEpoch {
            current_epoch: cur.epoch,
        };
    }
    if let Some(reason) = shape_error(first, last) {
        return reject(reason);
    }
    // Rule 3.
    if epoch > cur.epoch {
        return if first == 0 {
            BatchOutcome::Accepted
        } else {
            reject(OutOfOrderReason::NewEpochNotAtZero {
                first_sequence: first,
            })
        };
    }
    // Rule 4.
    let expected = next_sequence(cur.last_sequence);
    if first == expected {
        return BatchOutcome::Accepted;
    }
    if let Some(original) = retained(first, last) {
        return BatchOutcome::Duplicate { original };
    }
    if first <= cur.last_sequence {
        if first == last {
            BatchOutcome::Duplicate { original: None }
        } else {
            reject(OutOfOrderReason::OverlapsAccepted {
                last_accepted: cur.last_sequence,
            })
        }
    } else {
        reject(OutOfOrderReason::Gap {
            expected,
            first_sequence: first,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::AppendOutcome;

    fn at(epoch: i16, last: i32) -> Option<Current> {
        Some(Current {
            epoch,
            last_sequence: last,
        })
    }

    fn single(current: Option<Current>, epoch: i16, seq: i32) -> AppendOutcome {
        classify(current, epoch, seq, seq, |_, _| None).outcome()
    }

    #[test]
    fn rule_1_only_zero_starts_a_key() {
        assert_eq!(single(None, 0, 0), AppendOutcome::Accepted);
        assert_eq!(single(None, 7, 0), AppendOutcome::Accepted);
        assert_eq!(single(None, 0, 1), AppendOutcome::OutOfOrder);
        assert_eq!(single(None, 0, -1), AppendOutcome::OutOfOrder);
        assert_eq!(single(None, 0, i32::MAX), AppendOutcome::OutOfOrder);
    }

    #[test]
    fn rule_2_fencing_beats_a_valid_looking_sequence() {
        // seq 6 would be last + 1, and seq 0 would start a session.
        assert_eq!(single(at(3, 5), 2, 6), AppendOutcome::FencedEpoch);
        assert_eq!(single(at(3, 5), 2, 0), AppendOutcome::FencedEpoch);
        assert_eq!(single(at(3, 5), i16::MIN, -5), AppendOutcome::FencedEpoch);
        let out = classify(at(3, 5), 2, 9, 1, |_, _| None);
        assert_eq!(out, BatchOutcome::FencedEpoch { current_epoch: 3 });
    }

    #[test]
    fn rule_3_new_epoch_must_start_at_zero() {
        assert_eq!(single(at(0, 5), 1, 0), AppendOutcome::Accepted);
        assert_eq!(single(at(0, 5), 1, 6), AppendOutcome::OutOfOrder);
        assert_eq!(single(at(0, 5), i16::MAX, 0), AppendOutcome::Accepted);
    }

    #[test]
    fn rule_4_same_epoch() {
        assert_eq!(single(at(0, 5), 0, 6), AppendOutcome::Accepted);
        assert_eq!(single(at(0, 5), 0, 5), AppendOutcome::Duplicate);
        assert_eq!(single(at(0, 5), 0, 0), AppendOutcome::Duplicate);
        assert_eq!(single(at(0, 5), 0, 7), AppendOutcome::OutOfOrder);
        assert_eq!(single(at(0, 5), 0, i32::MAX), AppendOutcome::OutOfOrder);
        assert_eq!(single(at(0, 5), 0, -1), AppendOutcome::OutOfOrder);
    }

    #[test]
    fn sequences_wrap_after_max() {
        assert_eq!(next_sequence(i32::MAX), 0);
        assert_eq!(next_sequence(0), 1);
        assert_eq!(single(at(0, i32::MAX), 0, 0), AppendOutcome::Accepted);
        assert_eq!(single(at(0, i32::MAX), 0, 1), AppendOutcome::Duplicate);
        assert_eq!(
            single(at(0, i32::MAX), 0, i32::MAX),
            AppendOutcome::Duplicate
        );
    }

    #[test]
    fn batches_are_matched_exactly_or_rejected_with_a_reason() {
        let meta = BatchMetadata {
            offset: 40,
            timestamp: 9,
        };
        let window = |f, l| (f == 3 && l == 5).then_some(Some(meta));
        assert_eq!(
            classify(at(0, 8), 0, 3, 5, window),
            BatchOutcome::Duplicate {
                original: Some(meta)
            }
        );
        assert_eq!(
            classify(at(0, 8), 0, 4, 6, window),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::OverlapsAccepted { last_accepted: 8 }
            }
        );
        // Straddling the last accepted sequence.
        assert_eq!(
            classify(at(0, 8), 0, 7, 12, window).outcome(),
            AppendOutcome::OutOfOrder
        );
        assert_eq!(classify(at(0, 8), 0, 9, 20, window), BatchOutcome::Accepted);
        assert_eq!(
            classify(at(0, 8), 0, 11, 20, window),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::Gap {
                    expected: 9,
                    first_sequence: 11
                }
            }
        );
        assert_eq!(
            classify(at(0, 8), 0, 9, 8, window),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::LastBeforeFirst
            }
        );
        assert_eq!(
            classify(None, 0, 0, -3, window),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::NegativeSequence
            }
        );
    }

    #[test]
    fn the_window_is_not_consulted_for_new_sessions_or_fencing() {
        let panicking = |_, _| -> Option<Option<BatchMetadata>> { unreachable!() };
        classify(None, 0, 0, 0, panicking);
        classify(at(1, 4), 0, 0, 0, panicking);
        classify(at(1, 4), 2, 0, 0, panicking);
        classify(at(1, 4), 1, 5, 5, panicking);
    }
}
