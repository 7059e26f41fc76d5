//! What an append comes to.
//!
//! Outcomes are values, not errors: a duplicate is the normal answer to a
//! retry, and a fenced zombie is the normal answer to an old session. The
//! four outcomes of the four rules are [`AppendOutcome`]; the batch-level append
//! answers with a [`BatchOutcome`], which carries what a broker sends back:
//! the original batch's metadata for a duplicate, the reason for a rejection.

use std::fmt;
use std::str::FromStr;

use crate::batch::BatchMetadata;

/// The classification of one append: one of the four rules' four outcomes.
///
/// ```
/// use producer_state::AppendOutcome;
/// assert_eq!(AppendOutcome::OutOfOrder.to_string(), "OUT_OF_ORDER");
/// assert_eq!("FENCED_EPOCH".parse(), Ok(AppendOutcome::FencedEpoch));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AppendOutcome {
    /// In-order new data: the state now records it.
    Accepted,
    /// A retry of data already accepted: acknowledge without appending.
    Duplicate,
    /// A gap, or a sequence that is not valid here: reject.
    OutOfOrder,
    /// A request from an older epoch than the one on file (a zombie): reject.
    FencedEpoch,
}

impl AppendOutcome {
    /// All four outcomes, in declaration order.
    pub const ALL: [AppendOutcome; 4] = [
        AppendOutcome::Accepted,
        AppendOutcome::Duplicate,
        AppendOutcome::OutOfOrder,
        AppendOutcome::FencedEpoch,
    ];

    /// `ACCEPTED`, `DUPLICATE`, `OUT_OF_ORDER` or `FENCED_EPOCH`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AppendOutcome::Accepted => "ACCEPTED",
            AppendOutcome::Duplicate => "DUPLICATE",
            AppendOutcome::OutOfOrder => "OUT_OF_ORDER",
            AppendOutcome::FencedEpoch => "FENCED_EPOCH",
        }
    }
}

display_as_str!(AppendOutcome);

/// The text was not one of the four outcome words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not an append outcome (expected ACCEPTED, DUPLICATE, OUT_OF_ORDER or FENCED_EPOCH)"
)]
pub struct ParseOutcomeError {
    text: String,
}

impl FromStr for AppendOutcome {
    type Err = ParseOutcomeError;

    /// Parses exactly the words [`AppendOutcome::as_str`] prints (case-sensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AppendOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| ParseOutcomeError {
                text: s.to_string(),
            })
    }
}

/// The classification of a batch-level append, with the details a broker
/// needs to answer the client.
///
/// ```
/// use producer_state::{Batch, BatchOutcome, KafkaError, OutOfOrderReason, ProducerStateManager};
///
/// let mut mgr = ProducerStateManager::new();
/// assert_eq!(mgr.append_batch(9u64, 0, 1, Batch::new(0, 4, 10, 1)), BatchOutcome::Accepted);
/// // A gap: records 5..=9 never arrived.
/// let gap = mgr.append_batch(9u64, 0, 1, Batch::new(10, 14, 20, 2));
/// assert!(matches!(gap, BatchOutcome::OutOfOrder { reason: OutOfOrderReason::Gap { .. } }));
/// assert_eq!(gap.kafka_error(), Some(KafkaError::OutOfOrderSequenceNumber));
/// // A zombie of the older session 0.
/// let zombie = mgr.append_batch(9u64, 0, 0, Batch::new(5, 9, 15, 3));
/// assert_eq!(zombie, BatchOutcome::FencedEpoch { current_epoch: 1 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchOutcome {
    /// The batch continues the sequence (or starts a session at 0).
    Accepted,
    /// A retry. `original` is the retained metadata of the batch it repeats,
    /// when the engine still has it: the batch was appended with metadata and
    /// is among the last [`RETAINED_BATCHES`](crate::RETAINED_BATCHES) of
    /// its key. `None` for older retries and for single-sequence appends,
    /// which carry no metadata.
    Duplicate {
        /// The original batch's log offset and timestamp.
        original: Option<BatchMetadata>,
    },
    /// Rejected; `reason` says why.
    OutOfOrder {
        /// Why the batch does not fit.
        reason: OutOfOrderReason,
    },
    /// The batch's epoch is older than the one on file.
    FencedEpoch {
        /// The epoch on file.
        current_epoch: i16,
    },
    /// The batch does not fit the producer's transaction state (only under
    /// [`Semantics::Kafka`](crate::Semantics::Kafka), Kafka's
    /// `INVALID_TXN_STATE`): a plain batch while a transaction is open, or a
    /// transactional batch that starts a transaction nobody verified.
    InvalidTxnState {
        /// Which of the two.
        reason: TxnStateReason,
    },
}

impl BatchOutcome {
    /// The four-outcome classification of this outcome.
    pub const fn outcome(&self) -> AppendOutcome {
        match self {
            BatchOutcome::Accepted => AppendOutcome::Accepted,
            BatchOutcome::Duplicate { .. } => AppendOutcome::Duplicate,
            BatchOutcome::OutOfOrder { .. } => AppendOutcome::OutOfOrder,
            BatchOutcome::FencedEpoch { .. } => AppendOutcome::FencedEpoch,
            // Not one of the four outcomes: a batch that is not valid here.
            BatchOutcome::InvalidTxnState { .. } => AppendOutcome::OutOfOrder,
        }
    }

    /// The Kafka error a broker answers this outcome with, `None` for
    /// accepted batches and duplicates (Kafka answers a duplicate with
    /// success and the original offsets).
    ///
    /// ```
    /// use producer_state::{BatchOutcome, KafkaError};
    /// let fenced = BatchOutcome::FencedEpoch { current_epoch: 3 };
    /// assert_eq!(fenced.kafka_error(), Some(KafkaError::InvalidProducerEpoch));
    /// assert_eq!(KafkaError::InvalidProducerEpoch.code(), 47);
    /// ```
    pub const fn kafka_error(&self) -> Option<KafkaError> {
        match self {
            BatchOutcome::Accepted | BatchOutcome::Duplicate { .. } => None,
            BatchOutcome::OutOfOrder {
                reason: OutOfOrderReason::NegativeSequence,
            } => Some(KafkaError::InvalidRecord),
            BatchOutcome::OutOfOrder { .. } => Some(KafkaError::OutOfOrderSequenceNumber),
            BatchOutcome::FencedEpoch { .. } => Some(KafkaError::InvalidProducerEpoch),
            BatchOutcome::InvalidTxnState { .. } => Some(KafkaError::InvalidTxnState),
        }
    }

    /// True for [`BatchOutcome::Accepted`].
    pub const fn is_accepted(&self) -> bool {
        matches!(self, BatchOutcome::Accepted)
    }
}

impl fmt::Display for BatchOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchOutcome::Accepted => f.write_str("ACCEPTED"),
            BatchOutcome::Duplicate { original: Some(m) } => write!(
                f,
                "DUPLICATE (original offset {}, timestamp {})",
                m.offset, m.timestamp
            ),
            BatchOutcome::Duplicate { original: None } => f.write_str("DUPLICATE"),
            BatchOutcome::OutOfOrder { reason } => write!(f, "OUT_OF_ORDER ({reason})"),
            BatchOutcome::FencedEpoch { current_epoch } => {
                write!(f, "FENCED_EPOCH (current epoch {current_epoch})")
            }
            BatchOutcome::InvalidTxnState { reason } => write!(f, "INVALID_TXN_STATE ({reason})"),
        }
    }
}

/// Why a batch does not fit its producer's transaction state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnStateReason {
    /// A non-transactional batch while the producer has a transaction open
    /// on this partition (Kafka: "Expected transactional write").
    ExpectedTransactional,
    /// A transactional batch would start a transaction that was not
    /// verified with the transaction coordinator (KIP-890 part 1; Kafka:
    /// "Record was not part of an ongoing transaction").
    NotVerified,
}

impl fmt::Display for TxnStateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TxnStateReason::ExpectedTransactional => {
                "a non-transactional batch while the producer's transaction is open"
            }
            TxnStateReason::NotVerified => {
                "a transactional batch starts a transaction the coordinator did not verify"
            }
        })
    }
}

/// The Kafka protocol errors a producer-state verdict maps to, with their
/// wire codes, so a Kafka-protocol broker answers exactly as Kafka does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KafkaError {
    /// `OUT_OF_ORDER_SEQUENCE_NUMBER` (45).
    OutOfOrderSequenceNumber,
    /// `INVALID_PRODUCER_EPOCH` (47).
    InvalidProducerEpoch,
    /// `INVALID_TXN_STATE` (48).
    InvalidTxnState,
    /// `TRANSACTION_COORDINATOR_FENCED` (52).
    TransactionCoordinatorFenced,
    /// `INVALID_RECORD` (87): Kafka's log validator refuses a client batch
    /// with a producer id and a negative base sequence.
    InvalidRecord,
}

impl KafkaError {
    /// The error code on the wire.
    pub const fn code(self) -> i16 {
        match self {
            KafkaError::OutOfOrderSequenceNumber => 45,
            KafkaError::InvalidProducerEpoch => 47,
            KafkaError::InvalidTxnState => 48,
            KafkaError::TransactionCoordinatorFenced => 52,
            KafkaError::InvalidRecord => 87,
        }
    }

    /// The simple name of the exception Kafka's broker raises for it.
    pub const fn exception_name(self) -> &'static str {
        match self {
            KafkaError::OutOfOrderSequenceNumber => "OutOfOrderSequenceException",
            KafkaError::InvalidProducerEpoch => "InvalidProducerEpochException",
            KafkaError::InvalidTxnState => "InvalidTxnStateException",
            KafkaError::TransactionCoordinatorFenced => "TransactionCoordinatorFencedException",
            KafkaError::InvalidRecord => "InvalidRecordException",
        }
    }
}

/// Why a batch was rejected as out of order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutOfOrderReason {
    /// No state for the key, and the batch does not start at sequence 0.
    UnknownProducer {
        /// The batch's first sequence.
        first_sequence: i32,
    },
    /// A new epoch must start at sequence 0; the stored epoch was kept.
    NewEpochNotAtZero {
        /// The batch's first sequence.
        first_sequence: i32,
    },
    /// Sequences are missing between the last accepted one and the batch.
    Gap {
        /// The sequence that would have been accepted.
        expected: i32,
        /// The batch's first sequence.
        first_sequence: i32,
    },
    /// A multi-record batch reaches into the accepted range but is not one
    /// of the retained batches, so it is neither new data nor a recognisable
    /// retry (a partial overlap, or a retry older than the retry window).
    OverlapsAccepted {
        /// The last accepted sequence.
        last_accepted: i32,
    },
    /// A sequence number below 0: outside Kafka's sequence space.
    NegativeSequence,
    /// The batch's last sequence is before its first.
    LastBeforeFirst,
    /// Only under [`Semantics::Kafka`](crate::Semantics::Kafka): the
    /// producer has a transaction verification in progress (KIP-890) whose
    /// lowest sequence is below the batch's first, so a retry of that lower
    /// sequence could be overtaken (Kafka's "earliest seen sequence").
    AboveVerifiedSequence {
        /// The batch's first sequence.
        first_sequence: i32,
        /// The lowest sequence the verification saw.
        lowest_sequence: i32,
    },
}

impl fmt::Display for OutOfOrderReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutOfOrderReason::UnknownProducer { first_sequence } => write!(
                f,
                "no state for this producer and partition: the first batch must start at sequence 0, not {first_sequence}"
            ),
            OutOfOrderReason::NewEpochNotAtZero { first_sequence } => write!(
                f,
                "a new epoch must start at sequence 0, not {first_sequence}"
            ),
            OutOfOrderReason::Gap {
                expected,
                first_sequence,
            } => write!(f, "gap: expected sequence {expected}, got {first_sequence}"),
            OutOfOrderReason::OverlapsAccepted { last_accepted } => write!(
                f,
                "the batch overlaps sequences already accepted (up to {last_accepted}) without matching a retained batch"
            ),
            OutOfOrderReason::NegativeSequence => f.write_str("negative sequence number"),
            OutOfOrderReason::LastBeforeFirst => {
                f.write_str("the batch's last sequence is before its first")
            }
            OutOfOrderReason::AboveVerifiedSequence {
                first_sequence,
                lowest_sequence,
            } => write!(
                f,
                "sequence {first_sequence} is above {lowest_sequence}, the earliest sequence of the transaction verification in progress: retry {lowest_sequence} first"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_nothing_else_parses() {
        for o in AppendOutcome::ALL {
            assert_eq!(o.to_string(), o.as_str());
            assert_eq!(o.as_str().parse::<AppendOutcome>(), Ok(o));
        }
        assert_eq!(AppendOutcome::Accepted.as_str(), "ACCEPTED");
        assert_eq!(AppendOutcome::Duplicate.as_str(), "DUPLICATE");
        assert_eq!(AppendOutcome::OutOfOrder.as_str(), "OUT_OF_ORDER");
        assert_eq!(AppendOutcome::FencedEpoch.as_str(), "FENCED_EPOCH");
        for bad in ["accepted", "", "ACCEPTED ", "OUT-OF-ORDER", "FENCED"] {
            let err = bad.parse::<AppendOutcome>().unwrap_err();
            assert!(err.to_string().contains("is not an append outcome"));
        }
    }

    #[test]
    fn batch_outcomes_map_to_the_four_words() {
        let dup = BatchOutcome::Duplicate { original: None };
        assert_eq!(dup.outcome(), AppendOutcome::Duplicate);
        let gap = BatchOutcome::OutOfOrder {
            reason: OutOfOrderReason::Gap {
                expected: 2,
                first_sequence: 5,
            },
        };
        assert_eq!(gap.outcome(), AppendOutcome::OutOfOrder);
        assert_eq!(
            gap.to_string(),
            "OUT_OF_ORDER (gap: expected sequence 2, got 5)"
        );
        let fenced = BatchOutcome::FencedEpoch { current_epoch: 3 };
        assert_eq!(fenced.outcome(), AppendOutcome::FencedEpoch);
        assert!(BatchOutcome::Accepted.is_accepted() && !fenced.is_accepted());
    }
}
