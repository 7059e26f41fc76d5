//! Exactly-once (idempotent) produce for a durable message broker.
//!
//! A broker deduplicates producer retries. Every produce request carries a
//! producer id, an epoch (the producer's session) and a per-partition
//! sequence number that grows by one per record. This crate classifies every
//! append for one (producer id, partition) key:
//!
//! 1. no state for the key: only sequence 0 is valid, `ACCEPTED`; anything
//!    else is `OUT_OF_ORDER`;
//! 2. epoch below the stored epoch: `FENCED_EPOCH` (a zombie from an older
//!    session), whatever the sequence;
//! 3. epoch above the stored epoch: a new session; sequence 0 is `ACCEPTED`,
//!    anything else `OUT_OF_ORDER` (and the stored epoch is kept);
//! 4. same epoch: last + 1 is `ACCEPTED`; at or below the last is
//!    `DUPLICATE` (a retry); higher is `OUT_OF_ORDER` (a gap).
//!
//! Only `ACCEPTED` changes state; duplicates and rejections leave it exactly
//! as it was, and keys are fully independent.
//!
//! ```
//! use producer_state::{AppendOutcome::*, ProducerStateManager};
//!
//! let mut mgr = ProducerStateManager::new();
//! assert_eq!(mgr.append("p1", 0, 0, 0), Accepted);
//! assert_eq!(mgr.append("p1", 0, 0, 1), Accepted);
//! assert_eq!(mgr.append("p1", 0, 0, 1), Duplicate); // retry
//! assert_eq!(mgr.append("p1", 0, 0, 5), OutOfOrder); // gap: 2, 3, 4 missing
//! assert_eq!(mgr.append("p1", 0, 1, 0), Accepted); // new session restarts at 0
//! assert_eq!(mgr.append("p1", 0, 0, 2), FencedEpoch); // zombie
//! ```
//!
//! # The durable store
//!
//! [`ProducerStateStore`] runs the same rules over an append-only
//! write-ahead log of accepted appends and periodic checksummed snapshots:
//!
//! - with the default [`FsyncPolicy::Always`], an `ACCEPTED` append is
//!   written and fsync'ed before `append` returns; `DUPLICATE`,
//!   `OUT_OF_ORDER` and `FENCED_EPOCH` write nothing;
//! - it is `Send + Sync`: concurrent appends share fsyncs (group commit),
//!   and a retry racing its original waits for it instead of being
//!   accepted twice;
//! - a failed write or fsync is returned to every append that waited on it,
//!   nothing of it is applied, and the store refuses appends until reopened;
//! - on open it rebuilds the state from the newest valid snapshot plus log
//!   replay, cuts a torn tail left by a crash and reports it, and refuses
//!   any other damage with [`Error::Corrupt`] naming the file and byte
//!   offset (unless opened with [`RecoveryMode::Salvage`]).
//!
//! The store also runs each key's life (`docs/lifecycle.md`): keys idle
//! for [`StoreOptions::producer_expiration`] expire, a table bounded by
//! [`StoreOptions::max_producers`] evicts its least recently active keys
//! (or refuses new ones), [`ProducerStateStore::truncate_to`] rolls the
//! state back to a log offset, and partitions are removed, exported and
//! imported. Every such decision is a record in the log: recovery never
//! reads a clock or picks a victim, so a directory reopened at any later
//! time holds exactly the state the live store had.
//!
//! Every byte on disk is described in `docs/format.md`. All IO goes through
//! the [`fs::FileSystem`] seam; [`fs::SimFs`] simulates crashes for tests.
//! [`inspect`] reads store files without writing or locking (the
//! `inspect-snapshot` tool is built on it), and [`kafka`] reads and writes
//! Apache Kafka's producer snapshot files.
//!
//! The store reports metrics through the `metrics` facade and log events
//! through `tracing` (default features; nothing happens until the
//! application installs a recorder or a subscriber): [`telemetry`] lists
//! them, and `docs/metrics.md` explains each. [`StoreStats`] counts the
//! same without a recorder.
//!
//! # Types and widths
//!
//! The integer parameters have the widths of Kafka's wire protocol, so a
//! broker passes request fields straight through: partition `i32` (Kafka's
//! `INT32` partition index), epoch `i16` (`INT16` producer epoch), sequence
//! `i32` (`INT32` base sequence). Producer ids are a [`ProducerId`]: a `u64`
//! (Kafka's broker-assigned ids) or a name (such as `"p1"`); neither
//! allocates on the hot path.
//!
//! # Batches and the retry window
//!
//! A real produce request is a [`Batch`]: first and last sequence, the log
//! offset it was written at and a timestamp. [`ProducerStateManager::append_batch`]
//! answers with a [`BatchOutcome`]. Like Kafka's broker, each key retains
//! the last [`RETAINED_BATCHES`] accepted batches of its epoch, so a retry of
//! any of them is a `DUPLICATE` carrying the original batch's offset and
//! timestamp, which is what the broker returns to the client. A batch is
//! accepted when its first sequence is last + 1 (or 0 under rules 1 and 3).
//! A batch of more than one record that reaches into the accepted range
//! without matching a retained batch, and a batch whose last sequence is
//! before its first, are rejected as `OUT_OF_ORDER` with an
//! [`OutOfOrderReason`].
//!
//! The single-sequence [`ProducerStateManager::append`] is a batch of one
//! record without metadata and keeps the four rules exactly: a retry at or
//! below the last sequence is a `DUPLICATE`, also when it is older than the
//! window (then there is no original metadata to return).
//!
//! # At the limits
//!
//! - Sequences wrap as Kafka's do: after `i32::MAX` comes 0, and that is
//!   "last + 1". Otherwise sequences compare as plain integers, exactly as
//!   the rules are written: after the wrap, a retry of a sequence from
//!   before it is recognised through the retained batches; without them
//!   (single-sequence keys, or older than the window) it is `OUT_OF_ORDER`,
//!   the answer Kafka gives for any retry it cannot match.
//! - Negative sequences are outside Kafka's sequence space (its broker
//!   rejects them with `INVALID_RECORD` before producer state is consulted).
//!   They are `OUT_OF_ORDER` under every rule except rule 2 (fencing is
//!   checked first), never a `DUPLICATE` that would acknowledge data never
//!   written.
//! - Epochs compare as signed 16-bit integers, as in Kafka. At `i16::MAX`
//!   no higher epoch exists, so a session at the limit can only continue;
//!   Kafka's coordinator hands such a producer a new producer id, and so
//!   must a broker using this crate. Negative epochs are ordinary values.
//! - Producer ids and partitions take every value of their types.
//!
//! # Kafka's semantics and transactions
//!
//! [`ProducerStateManager::with_semantics`]`(`[`Semantics::Kafka`]`)` gives
//! Apache Kafka's verdicts instead of the four rules, every row of the
//! table below answered as Kafka does (proved against verdicts Kafka's own
//! `ProducerStateManager` gave, `tests/kafka_oracle.rs`), and with them
//! Kafka's transactions: transactional batches ([`AppendOptions`]),
//! COMMIT/ABORT [`Marker`]s with coordinator fencing, the last stable
//! offset, the aborted transactions a consumer skips, and the replication
//! origin ([`Origin`]). Plain producers keep the compact layout in both
//! modes; see `docs/transactions.md`. The durable store takes the same
//! choice ([`StoreOptions::semantics`]): under Kafka semantics its log
//! holds the transactional batches and markers, replay rebuilds open
//! transactions, coordinator epochs and aborted lists exactly, and the
//! choice is recorded in the directory ([`Error::SemanticsMismatch`]).
//!
//! ```
//! use producer_state::{AppendOptions, Batch, Marker, MarkerOutcome, Origin, ProducerStateManager, Semantics};
//!
//! let mut mgr = ProducerStateManager::with_semantics(Semantics::Kafka);
//! let txn = AppendOptions::client().transactional().verified();
//! assert!(mgr.append_with(7u64, 0, 0, Batch::new(0, 4, 100, 1), txn)?.is_accepted());
//! assert_eq!(mgr.last_stable_offset(0, 105), 100); // held back by the open transaction
//! let out = mgr.append_marker(7u64, 0, 0, Marker::abort(3, 105, 2), Origin::Coordinator)?;
//! assert!(matches!(out, MarkerOutcome::Accepted { completed: Some(c) } if c.aborted));
//! assert_eq!(mgr.aborted_transactions(0)[0].first_offset, 100);
//! assert_eq!(mgr.last_stable_offset(0, 106), 106);
//! # Ok::<(), producer_state::Error>(())
//! ```
//!
//! # Differences from Kafka
//!
//! Under [`Semantics::Strict`] (the default) these rules win where they and
//! Kafka's broker differ; under [`Semantics::Kafka`] every row is Kafka's
//! (the Kafka error of each outcome: [`BatchOutcome::kafka_error`]).
//! `tests/kafka_oracle.rs` pins every strict-mode difference on Kafka's own
//! streams to one of these rows:
//!
//! | situation | Kafka's broker (`Semantics::Kafka`) | `Semantics::Strict` |
//! |---|---|---|
//! | unknown producer, first sequence != 0 | accepted (KIP-360: state may have expired) | `OUT_OF_ORDER` (rule 1) by default; accepted under [`UnknownProducer::AcceptAny`]. [`ProducerStateStore::was_removed`] tells an expired or evicted producer from one never seen |
//! | single-sequence retry older than the 5-batch window | `OUT_OF_ORDER_SEQUENCE` | `DUPLICATE` without metadata (rule 4) |
//! | multi-record retry older than the window, or a partial overlap | `OUT_OF_ORDER_SEQUENCE` | `OUT_OF_ORDER` (`OverlapsAccepted`): the same |
//! | batch whose sequences wrap inside it (first `MAX-10`, last `9`) | accepted | `OUT_OF_ORDER` (`LastBeforeFirst`); the wrap happens between batches |
//! | negative sequence | `INVALID_RECORD`, before producer state | `OUT_OF_ORDER` (`NegativeSequence`), which `kafka_error` maps to `INVALID_RECORD` |
//! | lower epoch | `INVALID_PRODUCER_EPOCH` | `FENCED_EPOCH`: the same error |
//! | retry window after a restart | shrinks to 1 batch (snapshot v1 keeps only the last) | all retained batches survive |
//! | producer expiration | decided again from the wall clock whenever a snapshot is loaded (replicas and restarts can disagree) | the store logs it: the removals and every key's last activity are records, replay reads no clock ([`StoreOptions::producer_expiration`]); the in-memory engine expires when its caller says, at the time its caller gives, under either semantics, a key's last activity being its newest batch's timestamp (a key whose newest append carried no timestamp never expires there) ([`ProducerStateManager::expire_producers`]); `producer-state-raft` carries that time in a log entry, so replicas agree |
//! | bounded number of producers | none (KIP-936 proposed) | [`StoreOptions::max_producers`]: least recently active evicted (logged, deterministic) or new keys refused |
//! | transactions, markers, coordinator epochs | supported | [`Error::Unsupported`] |
//! | replication origin (a follower's appends) | no duplicate or sequence check, lower epochs applied | [`Error::Unsupported`] |
//!
//! The duplicate check runs at rule 4 against the same epoch only, like
//! Kafka's (`findDuplicateBatch` compares the epoch and exact first and last
//! sequence); a retry from an older epoch is fenced.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

#[macro_use]
mod macros;

mod batch;
mod clock;
mod codec;
mod directory;
mod engine;
mod error;
pub mod fs;
mod id;
pub mod inspect;
pub mod kafka;
mod outcome;
mod recovery;
mod semantics;
mod snapshot;
mod store;
pub mod telemetry;
mod wal;

// CRC-32C of any byte range from the CRCs of prefixes. Public only because
// the Raft log of `producer-state-raft` (a member of this workspace)
// verifies its records with it: it is not part of the store's API, so it is
// hidden from the docs, and it may change in any release. Its home is the
// codec layer, beside the encoders the log's prefix CRCs serve.
#[doc(hidden)]
pub use codec::crc;

pub use batch::{AppendOptions, AppendRequest, Batch, BatchMetadata, Origin, RetainedBatch};
pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::ProducerStateManager;
pub use engine::entry::{Batches, ProducerEntry, RETAINED_BATCHES};
pub use engine::info::ProducerInfo;
pub use engine::kafka::side::KafkaProducerState;
pub use engine::kafka::txn::{
    AbortedTxn, CompletedTxn, LATE_TRANSACTION_BUFFER_MS, LateTransaction, Marker, MarkerKind,
    MarkerOutcome,
};
pub use engine::kafka::verification::VerificationState;
pub use engine::rules::UnknownProducer;
pub use error::{Corruption, Error, Result};
pub use id::{INLINE_NAME_LEN, NegativeProducerId, ProducerId};
pub use outcome::{
    AppendOutcome, BatchOutcome, KafkaError, OutOfOrderReason, ParseOutcomeError, TxnStateReason,
};
pub use recovery::{
    Damage, LogSeek, RecoveryMode, RecoveryReport, Repair, Salvage, SkippedSnapshot, SnapshotUsed,
    TornTail,
};
pub use semantics::Semantics;
pub use snapshot::export::PartitionExport;
pub use store::pipelined::Pending;
pub use store::{AtCapacity, FsyncPolicy, ProducerStateStore, StoreOptions, StoreStats};
pub use wal::resume::SeekFallback;

// Brokers share one store between their request threads, and move errors
// into `Box<dyn Error + Send + Sync>` or `anyhow`: a change that made one
// of these lose `Send` or `Sync` must not compile.
const _: () = {
    const fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ProducerStateStore>();
    assert_send_sync::<Error>();
    assert_send_sync::<ProducerStateManager>();
    assert_send_sync::<ProducerId>();
    assert_send_sync::<fs::SimFs>();
    assert_send_sync::<StoreOptions>();
};

/// The README's examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
