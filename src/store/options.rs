//! Options of the durable store: when the log is fsync'ed, when snapshots
//! are taken, how recovery treats damage.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::recovery::RecoveryMode;
use crate::wal::writer::IdSource;

/// When the log is fsync'ed. The default is [`FsyncPolicy::Always`].
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
    pub(super) metric_labels: Vec<(String, String)>,
}

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
            preallocate: true,
            metric_labels: Vec::new(),
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
            .field("fs", &self.fs)
            .field("metric_labels", &self.metric_labels)
            .finish()
    }
}

impl StoreOptions {
    /// When the log is fsync'ed. Default [`FsyncPolicy::Always`].
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }

    /// Take a snapshot after this many accepted appends (`None`: never by
    /// count). Default 1,000,000. Recovery replays at most about this many
    /// records; a snapshot costs one pass over the state.
    pub fn snapshot_every_records(mut self, n: Option<u64>) -> Self {
        self.snapshot_every_records = n;
        self
    }

    /// Take a snapshot after this many bytes of log (`None`: never by size).
    /// Default 64 MiB.
    pub fn snapshot_every_bytes(mut self, n: Option<u64>) -> Self {
        self.snapshot_every_bytes = n;
        self
    }

    /// Roll to a new log segment once the active one holds this many bytes
    /// (a soft limit: one group of records never spans two segments).
    /// Default 64 MiB; at least 1 KiB and at most 1 GiB (a segment never
    /// grows past 4 GiB, the most its records' offsets can describe).
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
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

    /// How many snapshots to keep (at least 2, so that recovery can fall
    /// back to an older one; the log is kept back to the oldest). Default 2.
    pub fn keep_snapshots(mut self, n: usize) -> Self {
        self.keep_snapshots = n;
        self
    }

    /// What recovery does with damage other than a torn tail. Default
    /// [`RecoveryMode::Strict`].
    pub fn recovery(mut self, mode: RecoveryMode) -> Self {
        self.recovery = mode;
        self
    }

    /// Run automatic snapshots on a background thread (default `true`). With
    /// `false` the append that crosses a threshold takes the snapshot before
    /// it returns: slower for that append, but deterministic, which tests
    /// under a simulated file system want. The same goes for preparing
    /// the next preallocated segment ([`StoreOptions::preallocate`]): with
    /// `false` the append that rolls to it prepares it.
    pub fn background_snapshots(mut self, on: bool) -> Self {
        self.background_snapshots = on;
        self
    }

    /// Preallocate log segments (default `true`): each segment is written
    /// full of zeros to `segment_size` and fsync'ed before it is used, so
    /// that an append overwrites blocks that are allocated and written and
    /// its `fdatasync` commits no file-system metadata (about 1.4x more
    /// durable appends per second for one appender on ext4 here). The next
    /// segment is prepared while the active one fills.
    ///
    /// The price: every segment takes `segment_size` on disk from the
    /// start, and one more is kept ready (up to two segments' worth of
    /// zeros at any time); the zeros are written once per segment (disk
    /// bandwidth, not latency: off the append path with background work);
    /// the first open writes the first segment's zeros. Recovery reads the
    /// zeros after the last record as the log's clean end (format version
    /// 4, docs/format.md). With `false` segments grow by appends (version
    /// 3) and each fsync of a group that extends the file also commits its
    /// new length. Builds before version 4 refuse a preallocated segment
    /// (`Error::UnsupportedVersion`) instead of misreading its zeros as a
    /// torn tail.
    pub fn preallocate(mut self, on: bool) -> Self {
        self.preallocate = on;
        self
    }

    pub(super) fn layout(&self) -> crate::wal::writer::Layout {
        crate::wal::writer::Layout {
            preallocate: self.preallocate,
            background: self.background_snapshots,
        }
    }

    /// The file system to use. Default [`StdFs`]; tests use [`crate::fs::SimFs`].
    pub fn file_system(mut self, fs: Arc<dyn FileSystem>) -> Self {
        self.fs = fs;
        self
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

    pub(super) fn validate(&self) -> Result<()> {
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
        let labelled = StoreOptions::default()
            .metric_label("partition", "orders-3")
            .metric_label("_store", "");
        assert!(labelled.validate().is_ok());
    }
}
