//! What the broker takes from a client, and from all of them together.
//!
//! Every limit a request could push past is here, named after Kafka's
//! broker setting where Kafka has one (the command line takes the same
//! name: `--socket.request.max.bytes 1048576`), with Kafka's default where
//! that default bounds anything. Where Kafka's default is "no limit", this
//! broker has one, and says why beside it: a broker's memory and file
//! descriptors are finite, and one client must not be able to take them
//! from the others.
//!
//! | setting | default | Kafka's default | past it |
//! |---|---|---|---|
//! | `socket.request.max.bytes` | 100 MiB | the same | the connection is closed (the frame is not read) |
//! | `queued.max.request.bytes` | 100 MiB | -1 (none) | reading requests waits until earlier ones are done |
//! | `max.connections` | 2147483647 | the same | the connection is accepted and closed at once, logged |
//! | (descriptors) | [`RESERVED_FDS`] + [`FDS_PER_PARTITION`] per partition kept free | none | the same |
//! | `connections.max.idle.ms` | 600000 (10 min) | the same | the connection is closed |
//! | `message.max.bytes` | 1048588 | the same | `MESSAGE_TOO_LARGE` (10) for that partition |
//! | `fetch.max.bytes` | 57671680 (55 MiB) | the same | a Fetch response holds at most this much |
//! | `auto.create.topics.enable` | true | the same | off: unknown topics are `UNKNOWN_TOPIC_OR_PARTITION` (3) |
//! | `max.partitions` | 1000 | none (Kafka has no such setting) | auto-creation answers `POLICY_VIOLATION` (44) |
//! | `max.decompressed.batch.bytes` | 256 MiB | none | `INVALID_RECORD` (87) for that partition |

use std::time::Duration;

/// The limits; [`Limits::default`] gives the defaults above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `socket.request.max.bytes`: the largest request frame taken. Larger
    /// ones close the connection before their body is read, as Kafka does.
    pub socket_request_max_bytes: usize,
    /// `queued.max.request.bytes`: request bytes held at once over all
    /// connections (read and not yet answered). A frame waits for room
    /// before its body is read, so memory for requests stays bounded
    /// whatever the number of connections. Kafka's default is -1 (no
    /// bound): ours lets one maximum-size request in at a time, so that
    /// requests hold at most 100 MiB however many clients send them.
    pub queued_max_request_bytes: usize,
    /// `max.connections`: connections open at once. One more is accepted
    /// and closed at once, with a warning in the log. Whatever this says,
    /// a connection is also refused when taking it would leave fewer
    /// descriptors free than the partitions need ([`connection_room`]):
    /// connections alone never take the descriptors of the partitions.
    pub max_connections: usize,
    /// `connections.max.idle.ms`: a connection that sends no complete
    /// request for this long is closed. Kafka measures idleness between
    /// any two reads; this broker gives each request, from its first byte
    /// to its last, the same time, so a client sending one byte a minute
    /// is closed too.
    pub connections_max_idle: Duration,
    /// `message.max.bytes`: the largest record batch a produce may carry.
    pub message_max_bytes: usize,
    /// `fetch.max.bytes`: the most record bytes one Fetch response holds,
    /// whatever the request asks (KIP-541).
    pub fetch_max_bytes: usize,
    /// `auto.create.topics.enable`: Metadata creates topics it is asked
    /// for (with `--partitions` partitions).
    pub auto_create_topics: bool,
    /// `max.partitions`: partitions the broker holds at most; creating a
    /// topic that would pass it is refused with `POLICY_VIOLATION`. Kafka
    /// has no such bound (KIP-578 proposed one); without it, one Metadata
    /// request naming many new topics makes the broker create them all.
    pub max_partitions: usize,
    /// `max.decompressed.batch.bytes`: the most bytes a compressed batch's
    /// records may decompress to while the broker counts them. Kafka has
    /// no such bound (it streams); this one stops a small batch that
    /// inflates to gigabytes (a decompression bomb) from taking the CPU.
    pub max_decompressed_batch_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            socket_request_max_bytes: 100 << 20,
            queued_max_request_bytes: 100 << 20,
            max_connections: 2_147_483_647,
            connections_max_idle: Duration::from_millis(600_000),
            message_max_bytes: 1_048_588,
            fetch_max_bytes: 57_671_680,
            auto_create_topics: true,
            max_partitions: 1000,
            max_decompressed_batch_bytes: 256 << 20,
        }
    }
}

/// Descriptors a partition holds open: its log (its producer state is
/// the shared store's, whose descriptors are among [`RESERVED_FDS`]).
pub const FDS_PER_PARTITION: u64 = 1;
/// Descriptors kept free beyond the partitions': the listener, the
/// runtime, logging, the shared producer state (its segment, the
/// segment's second handle for fsyncs, its directory and lock), the
/// coordinators' logs, files opened for a moment (snapshots, the catalog,
/// producer ids) and a few partitions being created.
pub const RESERVED_FDS: u64 = 64;

/// Connections the broker may hold with `nofile` descriptors and
/// `partitions` partitions open: what is left after the partitions and
/// [`RESERVED_FDS`], and at most `max_connections`.
pub fn connection_room(max_connections: usize, nofile: u64, partitions: usize) -> usize {
    let needed = RESERVED_FDS + FDS_PER_PARTITION * partitions as u64;
    let room = usize::try_from(nofile.saturating_sub(needed)).unwrap_or(usize::MAX);
    room.min(max_connections)
}

/// The process's soft limit on open file descriptors (`RLIMIT_NOFILE`),
/// read from `/proc/self/limits`; 1024 (Linux's usual default) where that
/// cannot be read.
pub fn open_file_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| parse_open_file_limit(&s))
        .unwrap_or(1024)
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_limit_is_read_from_proc() {
        let sample = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            256                  524288               files     \n";
        assert_eq!(parse_open_file_limit(sample), Some(256));
        assert_eq!(connection_room(1000, 256, 10), 256 - 64 - 10);
        assert_eq!(connection_room(100, 256, 10), 100);
        assert_eq!(connection_room(1000, 256, 1000), 0);
        assert_eq!(parse_open_file_limit("nothing"), None);
        assert!(open_file_limit() > 0);
    }
}
