//! Kafka's verdicts, as pure functions: what [`Semantics::Kafka`] answers.
//!
//! This is Apache Kafka's broker-side validation (`UnifiedLog` and
//! `ProducerAppendInfo`, trunk 1eb7644349cb) restated over one key's state,
//! with no IO, exactly as `engine/rules.rs` states the strict rules: the Kafka-mode
//! engine asks these functions and only then changes state. The order of
//! the checks is Kafka's and matters (a retry of a cached batch is a
//! duplicate even when its epoch would now be fenced, a plain batch inside
//! a transaction is refused only once its sequence is in order).
//!
//! A data batch, by origin (client / coordinator / replication):
//!
//! 1. client: a negative sequence is refused (`INVALID_RECORD`, Kafka's log
//!    validator, before producer state is consulted);
//! 2. client: a batch with the key's epoch and exactly the first and last
//!    sequence of a cached batch is a duplicate;
//! 3. client, coordinator: a transactional batch that would open a
//!    transaction needs a verified start (KIP-890), else `INVALID_TXN_STATE`
//!    (unless verification is off: `transaction.partition.verification.enable`);
//! 4. client, coordinator: an epoch below the key's is fenced;
//! 5. client: while the key has a verification state (KIP-890, see
//!    `verification.rs`), a first sequence above its lowest sequence is out
//!    of order, whatever the epoch and whether or not the batch is
//!    transactional;
//! 6. client: the sequence: a new epoch must start at 0 unless the key has
//!    no epoch (-1: unknown, KIP-360); the same epoch must continue the
//!    last sequence (`MAX` is followed by 0), unless the key has no epoch;
//! 7. every origin: a plain batch while the key's transaction is open is
//!    `INVALID_TXN_STATE`.
//!
//! A marker: an epoch below the key's is fenced, then a coordinator epoch
//! below the key's is fenced; replication skips both.
//!
//! Where these verdicts differ from the strict rules is the table in the
//! crate docs; `engine/rules.rs` is not consulted in Kafka mode, and its
//! `UnknownProducer` options (KIP-360 as a choice for the strict rules) are
//! independent of this module, which always answers as Kafka.
//!
//! [`Semantics::Kafka`]: crate::Semantics::Kafka

use crate::batch::{AppendOptions, BatchMetadata, Origin};
use crate::engine::kafka::txn::MarkerOutcome;
use crate::engine::rules::next_sequence;
use crate::outcome::{BatchOutcome, OutOfOrderReason, TxnStateReason};

/// What Kafka's checks read of a key's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KafkaCurrent {
    /// -1: no epoch known (Kafka's empty entry).
    pub epoch: i16,
    /// -1: no batch cached (a new key, or one known only from markers).
    pub last_sequence: i32,
    /// -1: no marker seen.
    pub coordinator_epoch: i32,
    pub txn_open: bool,
}

impl KafkaCurrent {
    /// Kafka's `ProducerStateEntry.empty`: the state of an unknown key.
    pub(crate) const EMPTY: KafkaCurrent = KafkaCurrent {
        epoch: -1,
        last_sequence: -1,
        coordinator_epoch: -1,
        txn_open: false,
    };
}

/// Kafka's `inSequence`: `next` continues `last` (in 64-bit arithmetic, so
/// `MAX + 1` never matches; only 0 follows `MAX`).
#[inline]
pub(crate) fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// Kafka's `decrementSequence(last, span)`: the first sequence of a batch
/// that ends at `last` and spans `span` more sequences, wrapping below 0.
#[inline]
pub(crate) fn first_sequence_of(last: i32, span: i32) -> i32 {
    if last < span {
        // Kafka: MAX - (span - last) + 1, computed without overflow.
        i32::MAX - (span - last - 1)
    } else {
        last - span
    }
}

/// How many sequences a batch spans past its first, wrap-aware (Kafka's
/// batches wrap inside themselves: first `MAX - 7`, last `4` spans 12).
#[inline]
pub(crate) fn sequence_span(first: i32, last: i32) -> i64 {
    if last >= first {
        i64::from(last) - i64::from(first)
    } else {
        (i64::from(i32::MAX) - i64::from(first)) + i64::from(last) + 1
    }
}

/// What KIP-890's verification adds to a data batch's checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VerificationCheck {
    /// A transactional batch that opens a transaction must be verified
    /// (Kafka's `transaction.partition.verification.enable`, on by default).
    pub required: bool,
    /// The lowest sequence of the key's verification state, if it has one.
    pub lowest_sequence: Option<i32>,
}

impl VerificationCheck {
    /// Verification on, no state: Kafka's default broker before any
    /// verification of this key.
    #[cfg(test)]
    pub(crate) const DEFAULT: VerificationCheck = VerificationCheck {
        required: true,
        lowest_sequence: None,
    };
}

/// Classifies a data batch `first..=last` at `epoch` against `cur` (`None`:
/// the key is unknown) and the key's verification (`verification`).
/// `cached(first, last)` finds a cached batch of the key's epoch with
/// exactly these sequences (called only for client batches of the key's
/// epoch).
pub(crate) fn classify_data(
    cur: Option<KafkaCurrent>,
    (epoch, first, last): (i16, i32, i32),
    options: AppendOptions,
    verification: VerificationCheck,
    cached: impl FnOnce(i32, i32) -> Option<Option<BatchMetadata>>,
) -> BatchOutcome {
    let origin = options.origin();
    let c = cur.unwrap_or(KafkaCurrent::EMPTY);
    if origin == Origin::Client {
        if first < 0 || last < 0 {
            return BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::NegativeSequence,
            };
        }
        if cur.is_some()
            && epoch == c.epoch
            && let Some(original) = cached(first, last)
        {
            return BatchOutcome::Duplicate { original };
        }
    }
    if origin != Origin::Replication {
        if verification.required
            && options.is_transactional()
            && !c.txn_open
            && !options.is_verified()
        {
            return BatchOutcome::InvalidTxnState {
                reason: TxnStateReason::NotVerified,
            };
        }
        if epoch < c.epoch {
            return BatchOutcome::FencedEpoch {
                current_epoch: c.epoch,
            };
        }
    }
    // ProducerAppendInfo.checkSequence's first test (trunk lines 113-117):
    // a plain comparison, before and regardless of the epoch.
    if origin == Origin::Client
        && let Some(lowest) = verification.lowest_sequence
        && first > lowest
    {
        return BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::AboveVerifiedSequence {
                first_sequence: first,
                lowest_sequence: lowest,
            },
        };
    }
    if origin == Origin::Client
        && let Some(reason) = sequence_error(c, epoch, first)
    {
        return BatchOutcome::OutOfOrder { reason };
    }
    if c.txn_open && !options.is_transactional() {
        return BatchOutcome::InvalidTxnState {
            reason: TxnStateReason::ExpectedTransactional,
        };
    }
    BatchOutcome::Accepted
}

/// The rest of Kafka's `checkSequence` (its first test, the verification
/// state's lowest sequence, is in [`classify_data`]).
fn sequence_error(c: KafkaCurrent, epoch: i16, first: i32) -> Option<OutOfOrderReason> {
    if c.epoch == -1 {
        // No epoch known: any sequence (KIP-360), at any epoch.
        return None;
    }
    if epoch != c.epoch {
        return (first != 0).then_some(OutOfOrderReason::NewEpochNotAtZero {
            first_sequence: first,
        });
    }
    if in_sequence(c.last_sequence, first) {
        return None;
    }
    Some(if c.last_sequence >= 0 && first <= c.last_sequence {
        OutOfOrderReason::OverlapsAccepted {
            last_accepted: c.last_sequence,
        }
    } else {
        OutOfOrderReason::Gap {
            expected: if c.last_sequence < 0 {
                0
            } else {
                next_sequence(c.last_sequence)
            },
            first_sequence: first,
        }
    })
}

/// Classifies an end-transaction marker at `epoch` from coordinator epoch
/// `coordinator_epoch`: `None` when it is accepted.
pub(crate) fn classify_marker(
    cur: Option<KafkaCurrent>,
    epoch: i16,
    coordinator_epoch: i32,
    origin: Origin,
) -> Option<MarkerOutcome> {
    if origin == Origin::Replication {
        return None;
    }
    let c = cur.unwrap_or(KafkaCurrent::EMPTY);
    if epoch < c.epoch {
        return Some(MarkerOutcome::FencedEpoch {
            current_epoch: c.epoch,
        });
    }
    if c.coordinator_epoch > coordinator_epoch {
        return Some(MarkerOutcome::CoordinatorFenced {
            current_coordinator_epoch: c.coordinator_epoch,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::AppendOutcome;

    const V: VerificationCheck = VerificationCheck::DEFAULT;

    fn at(epoch: i16, last: i32) -> Option<KafkaCurrent> {
        Some(KafkaCurrent {
            epoch,
            last_sequence: last,
            coordinator_epoch: -1,
            txn_open: false,
        })
    }

    fn client(cur: Option<KafkaCurrent>, epoch: i16, first: i32, last: i32) -> AppendOutcome {
        classify_data(
            cur,
            (epoch, first, last),
            AppendOptions::client(),
            VerificationCheck::DEFAULT,
            |_, _| None,
        )
        .outcome()
    }

    #[test]
    fn sequence_arithmetic_is_kafkas() {
        assert!(in_sequence(i32::MAX, 0));
        assert!(!in_sequence(i32::MAX, 1));
        assert!(in_sequence(-1, 0));
        assert!(!in_sequence(-1, 1));
        assert_eq!(first_sequence_of(4, 12), i32::MAX - 7);
        assert_eq!(first_sequence_of(0, 1), i32::MAX);
        assert_eq!(first_sequence_of(9, 20), i32::MAX - 10);
        assert_eq!(first_sequence_of(9, 3), 6);
        assert_eq!(sequence_span(i32::MAX - 7, 4), 12);
        assert_eq!(sequence_span(3, 3), 0);
    }

    #[test]
    fn unknown_producers_accept_any_sequence_and_known_epochs_restart_at_zero() {
        assert_eq!(client(None, 7, 123, 125), AppendOutcome::Accepted);
        assert_eq!(client(None, 0, -1, -1), AppendOutcome::OutOfOrder);
        assert_eq!(client(at(-1, 4), -1, 9, 9), AppendOutcome::Accepted);
        assert_eq!(client(at(0, 1), 1, 5, 5), AppendOutcome::OutOfOrder);
        assert_eq!(client(at(0, 1), 1, 0, 0), AppendOutcome::Accepted);
        // Marker-only state: the same epoch must start at 0.
        assert_eq!(client(at(1, -1), 1, 1, 1), AppendOutcome::OutOfOrder);
        assert_eq!(client(at(1, -1), 1, 0, 0), AppendOutcome::Accepted);
        assert_eq!(client(at(1, 3), 0, 4, 4), AppendOutcome::FencedEpoch);
        // A batch that wraps inside itself continues MAX - 8.
        assert_eq!(
            client(at(0, i32::MAX - 8), 0, i32::MAX - 7, 4),
            AppendOutcome::Accepted
        );
    }

    #[test]
    fn duplicates_come_first_and_need_the_keys_epoch() {
        let meta = BatchMetadata {
            offset: 5,
            timestamp: 6,
        };
        let found = |_, _| Some(Some(meta));
        let out = classify_data(at(2, 9), (2, 3, 4), AppendOptions::client(), V, found);
        assert_eq!(
            out,
            BatchOutcome::Duplicate {
                original: Some(meta)
            }
        );
        let out = classify_data(at(2, 9), (1, 3, 4), AppendOptions::client(), V, found);
        assert_eq!(out, BatchOutcome::FencedEpoch { current_epoch: 2 });
        // Replication never looks for duplicates, nor checks sequences or epochs.
        let out = classify_data(
            at(2, 9),
            (1, 3, 4),
            AppendOptions::replication(),
            V,
            |_, _| unreachable!(),
        );
        assert_eq!(out, BatchOutcome::Accepted);
    }

    #[test]
    fn transaction_checks() {
        let open = Some(KafkaCurrent {
            txn_open: true,
            ..at(0, 0).unwrap()
        });
        let plain = AppendOptions::client();
        let txn = AppendOptions::client().transactional();
        let out = |cur, o| classify_data(cur, (0, 1, 1), o, V, |_, _| None);
        assert_eq!(
            out(open, plain),
            BatchOutcome::InvalidTxnState {
                reason: TxnStateReason::ExpectedTransactional
            }
        );
        assert_eq!(
            out(open, AppendOptions::replication()).outcome(),
            AppendOutcome::OutOfOrder
        );
        assert_eq!(out(open, txn), BatchOutcome::Accepted);
        assert_eq!(
            out(at(0, 0), txn),
            BatchOutcome::InvalidTxnState {
                reason: TxnStateReason::NotVerified
            }
        );
        assert_eq!(out(at(0, 0), txn.verified()), BatchOutcome::Accepted);
        // A bad sequence is reported before the transaction state.
        let gap = classify_data(open, (0, 5, 5), plain, V, |_, _| None);
        assert_eq!(gap.outcome(), AppendOutcome::OutOfOrder);
        assert!(matches!(gap, BatchOutcome::OutOfOrder { .. }));
    }

    /// Where KIP-890's lowest-sequence test sits among the others (Kafka
    /// trunk 1eb7644349cb): `ProducerAppendInfo.checkSequence` tests it
    /// first (ProducerAppendInfo.java lines 113-117), `checkSequence` runs
    /// after `checkProducerEpoch` and for CLIENT batches only
    /// (`maybeValidateDataBatch`, lines 89-94), and the duplicate lookup
    /// comes before all of it (UnifiedLog.scala
    /// `analyzeAndValidateProducerState`, lines 1039-1045).
    #[test]
    fn the_verified_lowest_sequence_is_tested_after_the_fence_and_before_the_sequence() {
        let v = |lowest| VerificationCheck {
            required: true,
            lowest_sequence: Some(lowest),
        };
        let plain = AppendOptions::client();
        let none = |_, _| None;
        let above = |first, lowest| BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::AboveVerifiedSequence {
                first_sequence: first,
                lowest_sequence: lowest,
            },
        };
        // In sequence, but above the lowest: refused.
        assert_eq!(
            classify_data(at(0, 4), (0, 5, 5), plain, v(3), none),
            above(5, 3)
        );
        // Not above it: the ordinary checks decide.
        assert_eq!(
            classify_data(at(0, 2), (0, 3, 3), plain, v(3), none),
            BatchOutcome::Accepted
        );
        assert!(matches!(
            classify_data(at(0, 0), (0, 3, 3), plain, v(3), none),
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::Gap { .. }
            }
        ));
        // A duplicate is answered first ...
        let meta = BatchMetadata {
            offset: 1,
            timestamp: 2,
        };
        assert_eq!(
            classify_data(at(0, 9), (0, 5, 5), plain, v(3), |_, _| Some(Some(meta))),
            BatchOutcome::Duplicate {
                original: Some(meta)
            }
        );
        // ... and a lower epoch is fenced before the test.
        assert_eq!(
            classify_data(at(1, 9), (0, 5, 5), plain, v(3), none),
            BatchOutcome::FencedEpoch { current_epoch: 1 }
        );
        // Whatever the epoch: a new epoch's sequence 0 is above a
        // coordinator's verification (NO_SEQUENCE, -1).
        assert_eq!(
            classify_data(at(0, 9), (1, 0, 0), plain, v(-1), none),
            above(0, -1)
        );
        // Not for replicated nor coordinator batches.
        for o in [
            AppendOptions::replication(),
            AppendOptions::client().with_origin(Origin::Coordinator),
        ] {
            assert_eq!(
                classify_data(at(0, 4), (0, 5, 5), o, v(3), none),
                BatchOutcome::Accepted
            );
        }
        // Verification off (transaction.partition.verification.enable):
        // a transaction opens without it (UnifiedLog.scala
        // batchMissingRequiredVerification, lines 1085-1088).
        let off = VerificationCheck {
            required: false,
            lowest_sequence: None,
        };
        let txn = AppendOptions::client().transactional();
        assert_eq!(
            classify_data(at(0, 4), (0, 5, 5), txn, off, none),
            BatchOutcome::Accepted
        );
        assert_eq!(
            classify_data(at(0, 4), (0, 5, 5), txn, V, none),
            BatchOutcome::InvalidTxnState {
                reason: TxnStateReason::NotVerified
            }
        );
    }

    #[test]
    fn markers_check_the_producer_epoch_then_the_coordinator_epoch() {
        let cur = Some(KafkaCurrent {
            coordinator_epoch: 5,
            ..at(1, 0).unwrap()
        });
        assert_eq!(classify_marker(cur, 1, 5, Origin::Coordinator), None);
        assert_eq!(classify_marker(cur, 2, 6, Origin::Coordinator), None);
        assert_eq!(
            classify_marker(cur, 0, 9, Origin::Coordinator),
            Some(MarkerOutcome::FencedEpoch { current_epoch: 1 })
        );
        assert_eq!(
            classify_marker(cur, 1, 4, Origin::Coordinator),
            Some(MarkerOutcome::CoordinatorFenced {
                current_coordinator_epoch: 5
            })
        );
        assert_eq!(classify_marker(cur, 0, 4, Origin::Replication), None);
        assert_eq!(classify_marker(None, 0, -1, Origin::Coordinator), None);
    }
}
