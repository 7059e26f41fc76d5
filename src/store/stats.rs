//! What the store counts for callers without a metrics recorder.

use std::time::Duration;

/// Counters of the store's answers and IO since it was opened, for
/// callers without a metrics recorder (the same events reach one as the
/// metrics of docs/metrics.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Appends answered `ACCEPTED` (every append call and every request of
    /// an `append_all` counts once, whichever method made it).
    pub accepted: u64,
    /// Appends answered `DUPLICATE`.
    pub duplicates: u64,
    /// Appends answered `OUT_OF_ORDER`.
    pub out_of_order: u64,
    /// Appends answered `FENCED_EPOCH`.
    pub fenced: u64,
    /// Appends answered with an error (IO, poisoned, name too long).
    pub errors: u64,
    /// Records written to the log, counted in positions: accepted appends
    /// and lifecycle records (removals, key states, groups); clock records
    /// and markers take none.
    pub records_written: u64,
    /// Bytes of those records.
    pub bytes_written: u64,
    /// Writes of record groups (one per group commit).
    pub groups_written: u64,
    /// fsyncs of the log (by group commits and `sync`).
    pub log_fsyncs: u64,
    /// Time spent in those fsyncs.
    pub log_fsync_time: Duration,
    /// Snapshots written.
    pub snapshots_written: u64,
    /// The most bytes of records held in memory, not yet handed to the OS
    /// (buffered policies: bounded near 1 MiB plus one `append_all` call).
    pub peak_buffered_bytes: u64,
    /// Keys removed by expiration sweeps.
    pub expired: u64,
    /// Keys evicted at `max_producers`.
    pub evicted: u64,
    /// Keys removed by `remove_partition`.
    pub partition_removed: u64,
    /// `truncate_to` calls that completed.
    pub truncations: u64,
    /// Keys a truncation set back or removed.
    pub truncated_keys: u64,
    /// Partition truncations (`truncate_partition_to`) that read only the
    /// log records of their partition, seeking over the others'
    /// (docs/lifecycle.md, "One partition's truncation").
    pub skimmed_truncations: u64,
    /// Keys added by `import_partition`.
    pub imported: u64,
}
