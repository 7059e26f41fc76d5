//! Options of the durable store: when the log is fsync'ed, when snapshots
//! are taken, how recovery treats damage, and the producer lifecycle
//! (expiration, the bounded table, the unknown-producer rule, the clock).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::engine::rules::UnknownProducer;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::recovery::report::RecoveryMode;
use crate::semantics::Semantics;
use crate::wal::writer::IdSource;

/// What a store at [`StoreOptions::max_producers`] does with a new key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AtCapacity {
    /// Evict the least recently active keys to make room (the default):
    /// a 256th of the cap at a time (at least one), never a key with
    /// records in flight, each eviction logged. The evicted keys are
    /// remembered by [`ProducerStateStore::was_removed`](crate::ProducerStateStore::was_removed).
    #[default]
    EvictLeastRecentlyUsed,
    /// Refuse the new key with [`Error::TooManyProducers`]; nothing is
    /// written. Keys with state keep appending.
    Refuse,
}

/// When the log is fsync'ed. The default is [`FsyncPolicy::Always`].
///
/// ```
/// use producer_state::{FsyncPolicy, ProducerStateStore, StoreOptions};
///
/// let dir = tempfile::tempdir()?;
/// // A bulk load: nothing is fsync'ed until `sync` (or `close`) says so.
/// let opts = StoreOptions::default().fsync(FsyncPolicy::Never);
/// let store = ProducerStateStore::open_with(dir.path(), opts)?;
/// for id in 0..1000u64 {
///     store.append(id, 0, 0, 0)?;
/// }
/// store.sync()?; // every append above is durable from here on
/// assert_eq!(store.stats().log_fsyncs, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FsyncPolicy {
    /// Every accepted append is on disk (written and fsync'ed) before
    /// `append` returns; concurrent appends share fsyncs. Nothing
    /// acknowledged is ever lost. The default.
    #[default]
    Always,
    /// Records are buffered in the process, written when 64 KiB are
    /// buffered, and written and fsync'ed every interval by a thread of
    /// their own (and on [`sync`](crate::ProducerStateStore::sync),
    /// snapshots and close). A crash, of the process or of the machine,
    /// loses at most the appends acknowledged during the last interval
    /// (plus the time one write and fsync take; a snapshot running
    /// meanwhile does not delay them). A failed write or fsync poisons the
    /// store; appends already acknowledged may then be lost, as in a crash.
    Interval(Duration),
    /// Records are buffered in the process (64 KiB) and handed to the OS,
    /// never fsync'ed except on
    /// [`sync`](crate::ProducerStateStore::sync), snapshots, segment rolls
    /// and close. Not crash-safe: a process crash loses the buffer, a
    /// machine crash whatever the OS had not written. For tests and bulk
    /// loads.
    Never,
}

/// How a [`ProducerStateStore`] is opened. Every setter documents its
/// default.
///
/// ```
/// use std::time::Duration;
/// use producer_state::{FsyncPolicy, ProducerStateStore, StoreOptions};
///
/// let dir = tempfile::tempdir()?;
/// let opts = StoreOptions::default()
///     .fsync(FsyncPolicy::Interval(Duration::from_millis(5)))
///     .snapshot_every_records(Some(100_000))
///     .producer_expiration(Some(Duration::from_secs(7 * 24 * 3600)))
///     .max_producers(Some(1_000_000));
/// let store = ProducerStateStore::open_with(dir.path(), opts)?;
/// store.append(1u64, 0, 0, 0)?;
/// store.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The setters take and return the options by value, so a setter whose
/// result is dropped changes nothing: the type is `#[must_use]`.
///
/// [`ProducerStateStore`]: crate::ProducerStateStore
#[derive(Clone)]
#[must_use = "StoreOptions setters return the changed options; pass them to open_with"]
pub struct StoreOptions {
    pub(super) fsync: FsyncPolicy,
    pub(super) snapshot_every_records: Option<u64>,
    pub(super) snapshot_every_bytes: Option<u64>,
    pub(super) segment_size: u64,
    pub(super) keep_snapshots: usize,
    pub(super) recovery: RecoveryMode,
    pub(super) background_snapshots: bool,
    pub(super) fs: Arc<dyn FileSystem>,
    pub(super) ids: IdSource,
    pub(super) preallocate: bool,
    pub(super) expiration: Option<Duration>,
    pub(super) expiration_interval: Option<Duration>,
    pub(super) max_producers: Option<usize>,
    pub(super) at_capacity: AtCapacity,
    pub(super) unknown: UnknownProducer,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metric_labels: Vec<(String, String)>,
    pub(super) semantics: Semantics,
    pub(super) transaction_verification: bool,
    pub(super) skim: bool,
}

/// Kafka's `producer.id.expiration.ms` default: one day.
const DEFAULT_EXPIRATION: Duration = Duration::from_secs(24 * 60 * 60);
/// Kafka's `producer.id.expiration.check.interval.ms` default: ten minutes.
const DEFAULT_EXPIRATION_INTERVAL: Duration = Duration::from_secs(10 * 60);

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            fsync: FsyncPolicy::default(),
            snapshot_every_records: Some(1_000_000),
            snapshot_every_bytes: Some(64 << 20),
            segment_size: 64 << 20,
            keep_snapshots: 2,
            recovery: RecoveryMode::Strict,
            background_snapshots: true,
            fs: Arc::new(StdFs),
            ids: IdSource::Random,
            skim: true,
            preallocate: true,
            expiration: Some(DEFAULT_EXPIRATION),
            expiration_interval: Some(DEFAULT_EXPIRATION_INTERVAL),
            max_producers: None,
            at_capacity: AtCapacity::default(),
            unknown: UnknownProducer::default(),
            clock: Arc::new(SystemClock),
            metric_labels: Vec::new(),
            semantics: Semantics::Strict,
            transaction_verification: true,
        }
    }
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("fsync", &self.fsync)
            .field("snapshot_every_records", &self.snapshot_every_records)
            .field("snapshot_every_bytes", &self.snapshot_every_bytes)
            .field("segment_size", &self.segment_size)
            .field("keep_snapshots", &self.keep_snapshots)
            .field("recovery", &self.recovery)
            .field("background_snapshots", &self.background_snapshots)
            .field("preallocate", &self.preallocate)
            .field("transaction_verification", &self.transaction_verification)
            .field("producer_expiration", &self.expiration)
            .field("expiration_interval", &self.expiration_interval)
            .field("max_producers", &self.max_producers)
            .field("at_capacity", &self.at_capacity)
            .field("unknown_producer", &self.unknown)
            .field("fs", &self.fs)
            .field("metric_labels", &self.metric_labels)
            .field("semantics", &self.semantics)
            .finish_non_exhaustive()
    }
}

impl StoreOptions {
    setters! {
        /// When the log is fsync'ed. Default [`FsyncPolicy::Always`].
        fsync(policy: FsyncPolicy) => fsync;

        /// Take a snapshot after this many accepted appends (`None`: never by
        /// count). Default 1,000,000. Recovery replays at most about this many
        /// records; a snapshot costs one pass over the state.
        snapshot_every_records(n: Option<u64>) => snapshot_every_records;

        /// Take a snapshot after this many bytes of log (`None`: never by size).
        /// Default 64 MiB.
        snapshot_every_bytes(n: Option<u64>) => snapshot_every_bytes;

        /// Roll to a new log segment once the active one holds this many bytes
        /// (a soft limit: one group of records never spans two segments).
        /// Default 64 MiB; at least 1 KiB and at most 1 GiB (a segment never
        /// grows past 4 GiB, the most its records' offsets can describe).
        /// Preallocated segments start smaller and grow to it: a new store's
        /// first segment is 64 KiB (or this size, if smaller), each next one
        /// 4 times its predecessor.
        segment_size(bytes: u64) => segment_size;
    }

    /// Derives the store id and every segment's salt from `seed` instead
    /// of drawing them at random, so that a fixed history writes fixed
    /// bytes: for the golden-file tests only. Two stores given one seed
    /// cannot tell each other's segments apart (docs/format.md).
    #[doc(hidden)]
    pub fn fixed_ids_for_tests(mut self, seed: u64) -> Self {
        self.ids = IdSource::Fixed(seed);
        self
    }

    /// Makes a partition's truncation read the log from its base, as it
    /// does when it does not know where its records lie, instead of
    /// reading its records alone (docs/lifecycle.md): for the tests that
    /// compare the two only.
    #[doc(hidden)]
    pub fn read_the_log_to_truncate_for_tests(mut self) -> Self {
        self.skim = false;
        self
    }

    setters! {
        /// How many snapshots to keep (at least 2, so that recovery can fall
        /// back to an older one; the log is kept back to the oldest). Default 2.
        keep_snapshots(n: usize) => keep_snapshots;

        /// What recovery does with damage other than a torn tail. Default
        /// [`RecoveryMode::Strict`].
        recovery(mode: RecoveryMode) => recovery;

        /// Run automatic snapshots on a background thread (default `true`). With
        /// `false` the append that crosses a threshold takes the snapshot before
        /// it returns: slower for that append, but deterministic, which tests
        /// under a simulated file system want. The same goes for preparing
        /// the next preallocated segment ([`StoreOptions::preallocate`]): with
        /// `false` the append that rolls to it prepares it.
        background_snapshots(on: bool) => background_snapshots;

        /// Preallocate log segments (default `true`): each segment is written
        /// full of zeros to `segment_size` and fsync'ed before it is used, so
        /// that an append overwrites blocks that are allocated and written and
        /// its `fdatasync` commits no file-system metadata (about 1.4x more
        /// durable appends per second for one appender on ext4 here). The next
        /// segment is prepared while the active one fills.
        ///
        /// The price: every segment takes its size on disk from the start, and
        /// one more is kept ready (up to two segments' worth of zeros at any
        /// time); the zeros are written once per segment (disk bandwidth, not
        /// latency: off the append path with background work); the first open
        /// writes the first segment's zeros. Sizes grow with the log (64 KiB,
        /// then 4 times the one before, up to
        /// [`StoreOptions::segment_size`]), so an empty store costs 64 KiB of
        /// disk, not a full segment. Recovery reads the
        /// zeros after the last record as the log's clean end (the header's
        /// preallocated flag, format version 5, docs/format.md). With `false`
        /// segments grow by appends and each fsync of a group that extends the
        /// file also commits its new length. Builds before version 5 refuse a
        /// version-5 segment either way (`Error::UnsupportedVersion`).
        preallocate(on: bool) => preallocate;
    }

    pub(super) fn layout(&self) -> crate::wal::writer::Layout {
        crate::wal::writer::Layout {
            segment_size: self.segment_size,
            ids: self.ids,
            preallocate: self.preallocate,
            background: self.background_snapshots,
            kafka: self.semantics == Semantics::Kafka,
        }
    }

    setters! {
        /// How long a key may go without an accepted append before it expires
        /// (`None`: never). Default 24 hours, Kafka's
        /// `producer.id.expiration.ms`. A key expires when `now - last
        /// activity >= expiration`, `now` read from [`StoreOptions::clock`] by
        /// the sweep; its last activity is its last accepted batch's timestamp,
        /// or the clock when its last single-sequence append was accepted. An
        /// expired key has no state (rule 1 applies to it again). Sweeps run
        /// every [`StoreOptions::expiration_interval`] and on
        /// [`expire_now`](crate::ProducerStateStore::expire_now); each one is
        /// logged, so recovery never decides an expiration again. Must be above
        /// zero.
        producer_expiration(expiration: Option<Duration>) => expiration;

        /// How often a background thread sweeps for expired keys (`None`: only
        /// [`expire_now`](crate::ProducerStateStore::expire_now) does). Default
        /// 10 minutes, Kafka's `producer.id.expiration.check.interval.ms`. A
        /// sweep holds the store's lock for one shard (a 256th of the state) at
        /// a time. Must be above zero.
        expiration_interval(every: Option<Duration>) => expiration_interval;

        /// The most (producer id, partition) keys the store holds (`None`: no
        /// bound, the default). At the bound a new key evicts the least
        /// recently active keys or is refused, as [`StoreOptions::at_capacity`]
        /// says. Must be above zero. A store reopened with a lower bound than
        /// it holds evicts down to it at its next new key.
        max_producers(max: Option<usize>) => max_producers;

        /// What a store at [`StoreOptions::max_producers`] does with a new key.
        /// Default [`AtCapacity::EvictLeastRecentlyUsed`].
        at_capacity(policy: AtCapacity) => at_capacity;

        /// What rule 1 does with a key that has no state. Default
        /// [`UnknownProducer::RequireZero`]; [`UnknownProducer::AcceptAny`] is
        /// Kafka's behaviour since KIP-360. The log records each append it lets
        /// through at a sequence other than 0, so a store reopened with the
        /// other policy replays it unchanged.
        unknown_producer(policy: UnknownProducer) => unknown;

        /// The clock the store reads (default [`SystemClock`], the wall
        /// clock): for the activity of single-sequence appends and the "now"
        /// of expiration sweeps. Tests pass a [`ManualClock`](crate::ManualClock).
        /// Recovery never reads it.
        clock(clock: Arc<dyn Clock>) => clock;

        /// The file system to use. Default [`StdFs`]; tests use [`crate::fs::SimFs`].
        file_system(fs: Arc<dyn FileSystem>) => fs;
    }

    /// Adds a label to every metric this store reports (see
    /// [`crate::telemetry`] and docs/metrics.md), for example
    /// `("partition", "orders-3")` in a broker with a store per partition.
    /// Default: none, so that the stores of a process share each series
    /// (counters and histograms add up; the live-producers gauge is their
    /// sum). Every distinct value is a new series in the recorder: label
    /// by something with few values. Without the `metrics` feature labels
    /// are checked and ignored.
    ///
    /// `open` refuses ([`Error::InvalidOptions`]) a key that is not a
    /// Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not starting with
    /// `__`), a key given twice, and `outcome`, the store's own label.
    pub fn metric_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metric_labels.push((key.into(), value.into()));
        self
    }
    setters! {
        /// Kafka's `transaction.partition.verification.enable` (KIP-890),
        /// only under [`Semantics::Kafka`]: on by default, as in Kafka. Off, a
        /// transactional batch that opens a transaction needs no
        /// [`AppendOptions::verified`](crate::AppendOptions::verified), and no
        /// verification state is started (see
        /// [`ProducerStateManager::set_transaction_verification`](crate::ProducerStateManager::set_transaction_verification)).
        /// A setting of the running broker, as in Kafka: not recorded in the
        /// directory, so a reopen may change it.
        transaction_verification(enabled: bool) => transaction_verification;
    }

    /// The verdicts the store gives (default [`Semantics::Strict`]).
    /// [`Semantics::Kafka`] gives Kafka's, with transactions, markers and
    /// the replication origin (`append_with`, `append_marker`, ...). The
    /// choice is recorded in the directory (docs/format.md): opening it
    /// with the other semantics is [`Error::SemanticsMismatch`].
    ///
    /// Kafka mode expires producers as Kafka does (by their batches' and
    /// markers' timestamps, never one with an open transaction), but
    /// choosing it turns [`StoreOptions::producer_expiration`] off: set it
    /// again after this call to expire (the timestamps are the broker's,
    /// and a test's small ones would all expire at once). It has no
    /// eviction bound: [`StoreOptions::max_producers`] is
    /// [`Error::InvalidOptions`] at open (docs/lifecycle.md, "Kafka
    /// mode"). The unknown-producer rule is Kafka's (any sequence),
    /// whatever [`StoreOptions::unknown_producer`] says.
    pub fn semantics(mut self, semantics: Semantics) -> Self {
        self.semantics = semantics;
        if semantics == Semantics::Kafka {
            self.expiration = None;
        }
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.semantics == Semantics::Kafka && self.max_producers.is_some() {
            return Err(Error::InvalidOptions(
                "Semantics::Kafka has no max_producers (Kafka has no cap, and evicting a producer with an open transaction would lose it): set it to None, or bound the table with producer_expiration".into(),
            ));
        }
        if self.keep_snapshots < 2 {
            return Err(Error::InvalidOptions(format!(
                "keep_snapshots must be at least 2, not {}",
                self.keep_snapshots
            )));
        }
        if !(1024..=1 << 30).contains(&self.segment_size) {
            return Err(Error::InvalidOptions(format!(
                "segment_size must be between 1 KiB and 1 GiB, not {}",
                self.segment_size
            )));
        }
        if self.fsync == FsyncPolicy::Interval(Duration::ZERO) {
            return Err(Error::InvalidOptions(
                "the fsync interval must be above zero".into(),
            ));
        }
        if self.snapshot_every_records == Some(0) || self.snapshot_every_bytes == Some(0) {
            return Err(Error::InvalidOptions(
                "snapshot thresholds must be above zero (or None)".into(),
            ));
        }
        if self.expiration == Some(Duration::ZERO) {
            return Err(Error::InvalidOptions(
                "producer_expiration must be above zero (None: keys never expire)".into(),
            ));
        }
        if self.expiration_interval == Some(Duration::ZERO) {
            return Err(Error::InvalidOptions(
                "expiration_interval must be above zero (None: sweep only on expire_now)".into(),
            ));
        }
        if self.max_producers == Some(0) {
            return Err(Error::InvalidOptions(
                "max_producers must be above zero (None: no bound)".into(),
            ));
        }
        crate::telemetry::check_labels(&self.metric_labels).map_err(Error::InvalidOptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        let bad = [
            StoreOptions::default().keep_snapshots(1),
            StoreOptions::default().segment_size(10),
            StoreOptions::default().segment_size((1 << 30) + 1),
            StoreOptions::default().fsync(FsyncPolicy::Interval(Duration::ZERO)),
            StoreOptions::default().snapshot_every_records(Some(0)),
            StoreOptions::default().producer_expiration(Some(Duration::ZERO)),
            StoreOptions::default().expiration_interval(Some(Duration::ZERO)),
            StoreOptions::default().max_producers(Some(0)),
            StoreOptions::default()
                .semantics(Semantics::Kafka)
                .max_producers(Some(10)),
            StoreOptions::default().metric_label("", "x"),
            StoreOptions::default().metric_label("1st", "x"),
            StoreOptions::default().metric_label("store-name", "x"),
            StoreOptions::default().metric_label("outcome", "x"),
            StoreOptions::default().metric_label("__name__", "x"),
            StoreOptions::default()
                .metric_label("partition", "1")
                .metric_label("partition", "2"),
        ];
        for o in bad {
            assert!(
                matches!(o.validate(), Err(Error::InvalidOptions(_))),
                "{o:?}"
            );
        }
        assert!(StoreOptions::default().validate().is_ok());
        assert!(
            StoreOptions::default()
                .semantics(Semantics::Kafka)
                .validate()
                .is_ok()
        );
        // Kafka mode expires too, off unless set after the choice.
        let kafka = StoreOptions::default().semantics(Semantics::Kafka);
        assert_eq!(kafka.expiration, None);
        assert!(
            kafka
                .producer_expiration(Some(Duration::from_secs(1)))
                .validate()
                .is_ok()
        );
        let labelled = StoreOptions::default()
            .metric_label("partition", "orders-3")
            .metric_label("_store", "");
        assert!(labelled.validate().is_ok());
    }
}
