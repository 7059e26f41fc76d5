//! Which verdicts the engine gives: the crate's strict rules or Kafka's.
//!
//! The strict rules (the four rules in the crate docs) are this crate's own
//! answer to idempotent produce: strict where Kafka is lenient (an unknown
//! producer must start at sequence 0), forgiving where Kafka forgets (a
//! retry older than the window is still a duplicate). A broker that must
//! answer exactly as Kafka does (a Kafka-protocol broker, a follower of a
//! Kafka leader, a migration) chooses [`Semantics::Kafka`] instead, which
//! also brings transactions, coordinator markers and replication appends.
//! The choice is made once, when the engine is created; the differences
//! are the table in the crate docs.

/// The verdicts an engine gives.
///
/// ```
/// use producer_state::{AppendOutcome, ProducerStateManager, Semantics};
///
/// // An unknown producer whose first batch does not start at 0:
/// let mut strict = ProducerStateManager::new();
/// assert_eq!(strict.semantics(), Semantics::Strict);
/// assert_eq!(strict.append(1u64, 0, 0, 5), AppendOutcome::OutOfOrder);
/// let mut kafka = ProducerStateManager::with_semantics(Semantics::Kafka);
/// assert_eq!(kafka.append(1u64, 0, 0, 5), AppendOutcome::Accepted); // KIP-360
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Semantics {
    /// The crate's four rules, strict about what they accept (the
    /// default): every append is ACCEPTED, DUPLICATE, OUT_OF_ORDER or
    /// FENCED_EPOCH by the four rules of the crate docs. No transactions,
    /// markers or replication origin: those calls return
    /// [`Error::Unsupported`](crate::Error::Unsupported). Called `Seed`
    /// before; [`Semantics::Seed`] is kept as a deprecated alias.
    #[default]
    Strict,
    /// Apache Kafka's broker, verdict for verdict (trunk 1eb7644349cb,
    /// proved against verdicts Kafka's own code gave): KIP-360 for unknown
    /// producers, the 5-batch window as the only duplicate memory,
    /// transactions with coordinator fencing and KIP-890 verification,
    /// and the replication origin.
    Kafka,
}

impl Semantics {
    /// The old name of [`Semantics::Strict`], kept for one release so that
    /// code written against it still builds (in expressions and patterns).
    #[deprecated(note = "renamed to `Semantics::Strict`: the strict four-outcome rules")]
    #[allow(non_upper_case_globals)]
    pub const Seed: Semantics = Semantics::Strict;

    /// `strict` or `kafka`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Semantics::Strict => "strict",
            Semantics::Kafka => "kafka",
        }
    }
}

display_as_str!(Semantics);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)]
    fn the_old_name_is_the_strict_rules_in_expressions_and_patterns() {
        assert_eq!(Semantics::Seed, Semantics::Strict);
        assert_eq!(Semantics::default(), Semantics::Strict);
        assert!(matches!(Semantics::Strict, Semantics::Seed));
        assert!(!matches!(Semantics::Kafka, Semantics::Seed));
        assert_eq!(Semantics::Strict.to_string(), "strict");
    }
}
