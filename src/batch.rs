//! What a produce request carries.
//!
//! A Kafka produce request is a batch of records: a first and last sequence
//! (first + record count - 1), written at some log offset with a timestamp.
//! The engine keeps the offset and timestamp of recent batches so that a
//! retry can be answered with what the original append returned.

use crate::id::ProducerId;

/// One record batch of a produce request, as the engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Batch {
    /// Sequence number of the batch's first record.
    pub first_sequence: i32,
    /// Sequence number of the batch's last record (first + record count - 1).
    pub last_sequence: i32,
    /// Log offset the batch was (or will be) written at.
    pub offset: i64,
    /// The batch's timestamp (milliseconds since the Unix epoch, by Kafka's convention).
    pub timestamp: i64,
}

impl Batch {
    /// A batch of sequences `first_sequence..=last_sequence` at `offset`.
    pub const fn new(first_sequence: i32, last_sequence: i32, offset: i64, timestamp: i64) -> Self {
        Batch {
            first_sequence,
            last_sequence,
            offset,
            timestamp,
        }
    }

    /// The metadata the engine retains for this batch.
    pub const fn metadata(&self) -> BatchMetadata {
        BatchMetadata {
            offset: self.offset,
            timestamp: self.timestamp,
        }
    }
}

/// What a broker returns for a duplicate: the original batch's log offset
/// and timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchMetadata {
    /// Log offset of the original batch.
    pub offset: i64,
    /// Timestamp of the original batch.
    pub timestamp: i64,
}

/// One of the batches an entry retains to recognise retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RetainedBatch {
    /// First sequence of the batch.
    pub first_sequence: i32,
    /// Last sequence of the batch.
    pub last_sequence: i32,
    /// Offset and timestamp, or `None` for a single-sequence append, which
    /// carries none.
    pub metadata: Option<BatchMetadata>,
}

/// One append, as a value: used by the bulk append of the durable store and
/// by anything that queues appends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// Who is producing.
    pub producer_id: ProducerId,
    /// To which partition.
    pub partition: i32,
    /// The producer's epoch (session).
    pub epoch: i16,
    pub(crate) first: i32,
    pub(crate) last: i32,
    // Invariant: `None` only for single-sequence appends (first == last).
    pub(crate) metadata: Option<BatchMetadata>,
    /// Origin and transactional flags (`Semantics::Kafka` stores only).
    pub(crate) options: AppendOptions,
}

impl AppendRequest {
    /// A single-sequence append, exactly like `append(producer_id, partition, epoch, sequence)`.
    pub fn single(
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> Self {
        AppendRequest {
            producer_id: producer_id.into(),
            partition,
            epoch,
            first: sequence,
            last: sequence,
            metadata: None,
            options: AppendOptions::client(),
        }
    }

    /// The same request with an origin and transactional flags, for
    /// [`ProducerStateStore::append_all`](crate::ProducerStateStore::append_all)
    /// under [`Semantics::Kafka`](crate::Semantics::Kafka) (the default is
    /// [`AppendOptions::client`]). A strict-mode store answers a request
    /// with other options [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn with_options(mut self, options: AppendOptions) -> Self {
        self.options = options;
        self
    }

    /// The request's origin and transactional flags.
    pub fn options(&self) -> AppendOptions {
        self.options
    }

    /// A batch-level append.
    pub fn batch(
        producer_id: impl Into<ProducerId>,
        partition: i32,
        epoch: i16,
        batch: Batch,
    ) -> Self {
        AppendRequest {
            producer_id: producer_id.into(),
            partition,
            epoch,
            first: batch.first_sequence,
            last: batch.last_sequence,
            metadata: Some(batch.metadata()),
            options: AppendOptions::client(),
        }
    }

    /// First sequence of the request.
    pub fn first_sequence(&self) -> i32 {
        self.first
    }

    /// Last sequence of the request (equal to the first for a single append).
    pub fn last_sequence(&self) -> i32 {
        self.last
    }

    /// The batch's offset and timestamp; `None` for a single-sequence append.
    pub fn metadata(&self) -> Option<BatchMetadata> {
        self.metadata
    }
}

/// Who sends an append, as Kafka's `AppendOrigin` names it: the checks run
/// depend on it (only under [`Semantics::Kafka`](crate::Semantics::Kafka);
/// the strict rules know only clients).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// A producer's request: every check, the duplicate lookup first.
    #[default]
    Client,
    /// A transaction or group coordinator writing to its own log (and the
    /// origin of end-transaction markers): the epoch and transaction checks,
    /// no duplicate lookup, no sequence check.
    Coordinator,
    /// A follower applying what its leader already accepted (and log
    /// recovery): no duplicate lookup, no sequence check, a lower producer
    /// or coordinator epoch is applied rather than refused; only a plain
    /// batch inside an open transaction is still refused, as in Kafka.
    Replication,
}

/// How a batch is appended: its origin and its transactional flags.
///
/// ```
/// use producer_state::{AppendOptions, Origin};
/// let plain = AppendOptions::client();
/// let txn = AppendOptions::client().transactional().verified();
/// let follower = AppendOptions::replication();
/// assert_eq!(follower.origin(), Origin::Replication);
/// assert!(txn.is_transactional() && !plain.is_transactional());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AppendOptions {
    origin: Origin,
    transactional: bool,
    verified: bool,
}

impl AppendOptions {
    /// A producer's plain (non-transactional) batch: the default.
    pub const fn client() -> Self {
        AppendOptions {
            origin: Origin::Client,
            transactional: false,
            verified: false,
        }
    }

    /// A batch a follower copies from its leader.
    pub const fn replication() -> Self {
        AppendOptions::client().with_origin(Origin::Replication)
    }

    /// The same options from another origin.
    pub const fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// Marks the batch transactional (Kafka's `isTransactional` batch
    /// attribute): it opens the producer's transaction on this partition,
    /// or continues it.
    pub const fn transactional(mut self) -> Self {
        self.transactional = true;
        self
    }

    /// Says the broker verified with the transaction coordinator that the
    /// producer added this partition to its transaction (KIP-890 part 1,
    /// `AddPartitionsToTxn` with verification). A transactional batch that
    /// would open a transaction needs it; one that continues an open
    /// transaction does not.
    ///
    /// Under [`Semantics::Kafka`](crate::Semantics::Kafka) a verified
    /// transactional batch of a producer without an open transaction first
    /// starts Kafka's verification state, as the broker does before it
    /// appends: if the batch then does not append (a duplicate, or
    /// refused), the state stays and refuses the producer's later batches
    /// that start above its lowest sequence (see
    /// [`ProducerStateManager::start_transaction_verification`](crate::ProducerStateManager::start_transaction_verification)).
    pub const fn verified(mut self) -> Self {
        self.verified = true;
        self
    }

    /// The origin.
    pub const fn origin(&self) -> Origin {
        self.origin
    }

    /// True for a transactional batch.
    pub const fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// True when the transaction start was verified.
    pub const fn is_verified(&self) -> bool {
        self.verified
    }
}
