//! What the tool prints, as typed values: one view struct per thing it
//! shows, serialized as JSON or rendered as tables by `human.rs`, and the
//! small conversions from the library's values (ids, batches, times,
//! damage) every view shares.

use std::path::Path;

use producer_state::inspect::Verdict;
use producer_state::{Error, ProducerEntry, ProducerId, Repair};
use serde::Serialize;

/// The version of the JSON document's layout (`schema_version`): raised
/// when a field is removed or changes meaning; new fields do not raise it.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The exit code of a verdict.
pub(crate) fn code_of(v: Verdict) -> u8 {
    match v {
        Verdict::Ok => 0,
        Verdict::Repairable => 4,
        Verdict::Refused => 1,
    }
}

/// The exit code of a path that holds no store to verify.
pub(crate) const NOT_A_STORE: u8 = 5;

/// A path that holds no store of its own, so nothing was verified: its
/// own verdict, exit code [`NOT_A_STORE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotAStore {
    /// A directory without a store file (empty, or other files only):
    /// `ProducerStateStore::open` would make a new, empty store there.
    NoStore,
    /// A broker's data directory or one of its partition directories:
    /// the stores are under it, or in its data directory.
    Broker,
    /// A Kafka log segment (`<offset>.log`): recognised, not read.
    KafkaLog,
}

impl NotAStore {
    /// The JSON `verdict` word.
    pub(crate) fn word(self) -> &'static str {
        match self {
            NotAStore::NoStore => "no_store",
            NotAStore::Broker => "broker_directory",
            NotAStore::KafkaLog => "kafka_log_segment",
        }
    }
}

/// The JSON `verdict` word (kept from earlier versions: `damaged` for refused).
pub(crate) fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Ok => "ok",
        Verdict::Repairable => "repairable",
        Verdict::Refused => "damaged",
    }
}

pub(crate) fn severity_serde<S: serde::Serializer>(v: &Verdict, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_str())
}

/// The `semantics` field's value: `seed` or `kafka`. The strict rules were
/// called the seed rules when the field was introduced, and scripts read
/// it: the name stays.
pub(crate) fn semantics_name(s: producer_state::Semantics) -> &'static str {
    match s {
        producer_state::Semantics::Kafka => "kafka",
        _ => "seed",
    }
}

/// A problem found, for stderr and the JSON `damage` list.
#[derive(Serialize, Debug)]
pub(crate) struct Damage {
    pub(crate) file: String,
    pub(crate) offset: Option<u64>,
    pub(crate) kind: String,
    /// `refused` (recovery would not open) or `repairable` (it opens).
    #[serde(serialize_with = "severity_serde")]
    pub(crate) severity: Verdict,
}

#[derive(Serialize)]
pub(crate) struct BatchView {
    pub(crate) first_sequence: i32,
    pub(crate) last_sequence: i32,
    pub(crate) offset: Option<i64>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) time_utc: Option<String>,
}

/// How entries sort: numeric ids (Kafka's may be negative) before names,
/// then by partition.
pub(crate) type SortKey = (bool, i128, String, Option<i32>);

#[derive(Serialize)]
pub(crate) struct EntryView {
    pub(crate) producer_id: String,
    pub(crate) producer_id_kind: &'static str,
    pub(crate) partition: Option<i32>,
    pub(crate) epoch: i16,
    pub(crate) last_sequence: i32,
    /// This crate's files: the key's last activity (milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_activity: Option<i64>,
    pub(crate) retained_batches: Vec<BatchView>,
    /// Kafka only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kafka: Option<KafkaFields>,
    #[serde(skip)]
    pub(crate) key: SortKey,
}

#[derive(Serialize)]
pub(crate) struct KafkaFields {
    pub(crate) last_offset: i64,
    pub(crate) offset_delta: i32,
    pub(crate) timestamp: i64,
    pub(crate) coordinator_epoch: i32,
    pub(crate) current_txn_first_offset: i64,
}

#[derive(Serialize)]
pub(crate) struct RecordView {
    pub(crate) position: u64,
    pub(crate) byte_offset: u64,
    /// What the record does: `append`, `clock`, `accepted-unknown`,
    /// `expired`, `evicted`, `partition-removed`, `truncated` (a key
    /// removed), `group` (an atomic group), `key-state` (a key set),
    /// `kafka-batch`, `txn-marker`, `forget-aborted`, and a Kafka-mode
    /// partition state: `partition-state` then its `kafka-key-state` and
    /// `aborted-txn` records.
    pub(crate) op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) producer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) epoch: Option<i16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_sequence: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_sequence: Option<i32>,
    pub(crate) offset: Option<i64>,
    pub(crate) timestamp: Option<i64>,
    /// Groups: what the group does; clock records: the time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct FileView {
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    /// The file's length: `used_bytes + preallocated_bytes`.
    pub(crate) bytes: u64,
    /// Bytes that hold something: a segment's header, records and any
    /// torn write; every byte of any other file.
    pub(crate) used_bytes: u64,
    /// A preallocated segment's room: zeros no write reached.
    pub(crate) preallocated_bytes: u64,
    /// Snapshots: the position covered; segments: the first position.
    pub(crate) position: Option<u64>,
    /// Segments: one past the last valid record's position.
    pub(crate) end_position: Option<u64>,
    pub(crate) entries: Option<u64>,
    /// `ok`, `repairable` or `refused`: what the file means to recovery.
    #[serde(serialize_with = "severity_serde")]
    pub(crate) verdict: Verdict,
    /// What is wrong with it (null: nothing).
    pub(crate) problem: Option<String>,
    /// What recovery does about it.
    pub(crate) effect: &'static str,
    #[serde(skip)]
    pub(crate) problem_offset: Option<u64>,
}

#[derive(Serialize)]
pub(crate) struct SnapshotView {
    pub(crate) file: String,
    pub(crate) position: u64,
    pub(crate) entries: u64,
}

#[derive(Serialize)]
pub(crate) struct SkippedView {
    pub(crate) file: String,
    /// The byte and the kind of the damage.
    pub(crate) offset: u64,
    pub(crate) kind: String,
    /// Both, as the error says it.
    pub(crate) reason: String,
}

/// One change recovery would make, in the order it would make them: the
/// library's plan (`RecoveryReport::repairs`).
#[derive(Serialize)]
#[serde(tag = "repair", rename_all = "snake_case")]
pub(crate) enum RepairView {
    RemoveTemp {
        file: String,
    },
    RemoveEmptySegment {
        file: String,
    },
    Truncate {
        file: String,
        len: u64,
        /// Every byte cut: `record_bytes` of a torn write, then
        /// `preallocated_bytes` of a preallocated segment's room (zeros).
        bytes: u64,
        record_bytes: u64,
        preallocated_bytes: u64,
    },
    MoveAside {
        file: String,
        from: u64,
        to: String,
        bytes: u64,
    },
    /// A repair this build of the tool has no view of.
    Other {
        text: String,
    },
}

impl From<&Repair> for RepairView {
    fn from(r: &Repair) -> RepairView {
        let path = |p: &Path| p.display().to_string();
        match r {
            Repair::RemoveTemp { file } => RepairView::RemoveTemp { file: path(file) },
            Repair::RemoveEmptySegment { file } => {
                RepairView::RemoveEmptySegment { file: path(file) }
            }
            Repair::Truncate {
                file,
                len,
                bytes,
                preallocated,
            } => RepairView::Truncate {
                file: path(file),
                len: *len,
                bytes: *bytes,
                record_bytes: bytes.saturating_sub(*preallocated),
                preallocated_bytes: *preallocated,
            },
            Repair::MoveAside {
                file,
                from,
                to,
                bytes,
            } => RepairView::MoveAside {
                file: path(file),
                from: *from,
                to: path(to),
                bytes: *bytes,
            },
            other => RepairView::Other {
                text: other.to_string(),
            },
        }
    }
}

#[derive(Serialize)]
pub(crate) struct TornView {
    pub(crate) file: String,
    pub(crate) offset: u64,
    /// Every byte cut, as in `Truncate`.
    pub(crate) bytes: u64,
    pub(crate) record_bytes: u64,
    pub(crate) preallocated_bytes: u64,
}

/// The seek into the segment holding the snapshot's position.
#[derive(Serialize)]
pub(crate) struct SeekView {
    pub(crate) segment: String,
    pub(crate) offset: u64,
    /// Records below the position not read (0 after a fallback).
    pub(crate) records_not_read: u64,
    /// Why the segment would be read from its first record instead.
    pub(crate) fallback: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum RecoveryView {
    Opens {
        would_open: bool,
        snapshot: Option<SnapshotView>,
        skipped_snapshots: Vec<SkippedView>,
        records_replayed: u64,
        segments_read: usize,
        /// Segments wholly below the snapshot's position, not read.
        segments_skipped: usize,
        /// Where replay would start in the segment holding the snapshot's
        /// position (a version-6 snapshot).
        #[serde(skip_serializing_if = "Option::is_none")]
        seek: Option<Box<SeekView>>,
        /// Records read that the snapshot covers (0 when the seek is taken).
        records_read_not_replayed: u64,
        torn_tail: Option<TornView>,
        would_remove: Vec<String>,
        /// Everything recovery would change, in order.
        repairs: Vec<RepairView>,
        keys: usize,
        next_position: u64,
    },
    Refuses {
        would_open: bool,
        refusal: String,
    },
}

#[derive(Serialize)]
pub(crate) struct Output {
    pub(crate) path: String,
    pub(crate) kind: &'static str,
    pub(crate) format: String,
    pub(crate) version: Option<u16>,
    /// `seed` or `kafka`: the semantics of the store that wrote the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) semantics: Option<&'static str>,
    pub(crate) position: Option<u64>,
    /// A version-6 snapshot: the byte offset of its position in the
    /// segment that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_point: Option<u64>,
    pub(crate) entry_count: Option<u64>,
    /// A segment: its length, the bytes that hold something (header,
    /// records, a torn write) and its preallocated room (zeros).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) preallocated_bytes: Option<u64>,
    pub(crate) verdict: &'static str,
    pub(crate) damage: Vec<Damage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) files: Vec<FileView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) recovery: Option<RecoveryView>,
    /// A Kafka-mode snapshot: keys its Kafka section holds (beyond the
    /// `entry_count` compact entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kafka_section_keys: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) entries: Vec<EntryView>,
    /// A Kafka-mode state's aborted transactions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) aborted_transactions: Vec<AbortedView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) late_transactions: Vec<LateView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) records: Vec<RecordView>,
    /// `--limit` cut the keys: how many the filter kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) entries_total: Option<u64>,
    /// `--limit` cut the records: how many (record lines) the filter kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) records_total: Option<u64>,
    /// A broker directory: the stores under it (or, for a partition
    /// directory, its data directory's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stores: Option<Vec<String>>,
    /// A broker partition directory: its key (partition number) in its
    /// data directory's shared state, as the catalog maps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) partition_key: Option<i32>,
    /// `--all` on a broker directory: each of its stores, inspected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) inspected: Vec<Output>,
    #[serde(skip)]
    pub(crate) code: Verdict,
    /// Set when the path holds no store: then `code` means nothing.
    #[serde(skip)]
    pub(crate) not_a_store: Option<NotAStore>,
}

/// The JSON document: the output, with the version of its layout first.
#[derive(Serialize)]
pub(crate) struct Document<'a> {
    pub(crate) schema_version: u32,
    #[serde(flatten)]
    pub(crate) output: &'a Output,
}

impl Output {
    /// The exit code: the verdict's, or [`NOT_A_STORE`].
    pub(crate) fn exit_code(&self) -> u8 {
        match self.not_a_store {
            Some(_) => NOT_A_STORE,
            None => code_of(self.code),
        }
    }

    /// `--limit`: keeps the first `limit` keys, and says how many there were.
    pub(crate) fn limit_entries(&mut self, limit: Option<usize>) {
        if let Some(n) = limit
            && self.entries.len() > n
        {
            self.entries_total = Some(self.entries.len() as u64);
            self.entries.truncate(n);
        }
    }

    /// Marks the output as a path with no store.
    pub(crate) fn not_a_store(&mut self, what: NotAStore) {
        self.not_a_store = Some(what);
        self.verdict = what.word();
    }
}

#[derive(Serialize)]
pub(crate) struct AbortedView {
    pub(crate) partition: i32,
    pub(crate) producer_id: String,
    pub(crate) first_offset: i64,
    pub(crate) last_offset: i64,
    pub(crate) last_stable_offset: i64,
}

/// A partition's oldest open transaction, late at `--now`: its producer
/// idle past `transaction.max.timeout.ms` plus 5 minutes (Kafka's
/// `hasLateTransaction`).
#[derive(Serialize)]
pub(crate) struct LateView {
    pub(crate) partition: i32,
    pub(crate) producer_id: String,
    pub(crate) first_offset: i64,
    pub(crate) last_timestamp: i64,
    pub(crate) idle_ms: i64,
}

impl Output {
    pub(crate) fn new(path: &Path, kind: &'static str, format: &str) -> Output {
        Output {
            path: path.display().to_string(),
            kind,
            format: format.into(),
            version: None,
            semantics: None,
            position: None,
            log_point: None,
            entry_count: None,
            bytes: None,
            used_bytes: None,
            preallocated_bytes: None,
            verdict: "ok",
            damage: Vec::new(),
            files: Vec::new(),
            recovery: None,
            kafka_section_keys: None,
            entries: Vec::new(),
            aborted_transactions: Vec::new(),
            late_transactions: Vec::new(),
            records: Vec::new(),
            entries_total: None,
            records_total: None,
            stores: None,
            partition_key: None,
            inspected: Vec::new(),
            code: Verdict::Ok,
            not_a_store: None,
        }
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm UTC`
/// (proleptic Gregorian); `None` outside years 1..=9999, where the four
/// digits of the year no longer say it.
pub(crate) fn utc(ms: i64) -> Option<String> {
    const MIN: i64 = -62_135_596_800_000; // 0001-01-01
    const MAX: i64 = 253_402_300_799_999; // 9999-12-31
    if !(MIN..=MAX).contains(&ms) {
        return None;
    }
    let format = time::macros::format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:3] UTC"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()?
        .format(&format)
        .ok()
}

pub(crate) fn id_view(id: &ProducerId) -> (String, &'static str, SortKey) {
    match id.as_numeric() {
        Some(n) => (
            n.to_string(),
            "numeric",
            (false, i128::from(n), String::new(), None),
        ),
        None => {
            let s = id.to_string();
            (s.clone(), "name", (true, 0, s, None))
        }
    }
}

pub(crate) fn batch_view(b: &producer_state::RetainedBatch) -> BatchView {
    BatchView {
        first_sequence: b.first_sequence,
        last_sequence: b.last_sequence,
        offset: b.metadata.map(|m| m.offset),
        timestamp: b.metadata.map(|m| m.timestamp),
        time_utc: b.metadata.and_then(|m| utc(m.timestamp)),
    }
}

pub(crate) fn entry_of(id: &ProducerId, partition: Option<i32>, e: &ProducerEntry) -> EntryView {
    let (producer_id, producer_id_kind, mut key) = id_view(id);
    key.3 = partition;
    EntryView {
        producer_id,
        producer_id_kind,
        partition,
        epoch: e.epoch(),
        last_sequence: e.last_sequence(),
        last_activity: None,
        retained_batches: e.retained_batches().map(|b| batch_view(&b)).collect(),
        kafka: None,
        key,
    }
}

/// A reader's IO error: not damage, its own exit code.
pub(crate) struct Unreadable(pub(crate) Error);

/// Damage found by reading a file on its own: it does not verify.
pub(crate) fn damage_of(e: &Error) -> Damage {
    match e {
        Error::Corrupt { file, offset, kind } => Damage {
            file: file.display().to_string(),
            offset: Some(*offset),
            kind: kind.to_string(),
            severity: Verdict::Refused,
        },
        Error::UnsupportedVersion { file, .. } => Damage {
            file: file.display().to_string(),
            offset: Some(0),
            kind: e.to_string(),
            severity: Verdict::Refused,
        },
        other => Damage {
            file: String::new(),
            offset: None,
            kind: other.to_string(),
            severity: Verdict::Refused,
        },
    }
}

/// Takes a single file reader's result: an IO error stops the tool (exit
/// 3), anything else that fails is damage (a file on its own that does not
/// verify), success goes to `ok`.
pub(crate) fn settle<T>(
    out: &mut Output,
    result: producer_state::Result<T>,
    ok: impl FnOnce(&mut Output, T),
) -> Result<(), Unreadable> {
    match result {
        Ok(v) => {
            ok(out, v);
            Ok(())
        }
        Err(e @ Error::Io { .. }) => Err(Unreadable(e)),
        Err(e) => {
            out.damage.push(damage_of(&e));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_with_milliseconds_within_years_1_to_9999() {
        assert_eq!(utc(0).as_deref(), Some("1970-01-01 00:00:00.000 UTC"));
        assert_eq!(utc(-1).as_deref(), Some("1969-12-31 23:59:59.999 UTC"));
        assert_eq!(
            utc(1_700_000_000_000).as_deref(),
            Some("2023-11-14 22:13:20.000 UTC")
        );
        assert_eq!(
            utc(951_782_400_123).as_deref(),
            Some("2000-02-29 00:00:00.123 UTC")
        );
        assert_eq!(
            utc(-62_135_596_800_000).as_deref(),
            Some("0001-01-01 00:00:00.000 UTC")
        );
        assert_eq!(
            utc(253_402_300_799_999).as_deref(),
            Some("9999-12-31 23:59:59.999 UTC")
        );
        assert_eq!(utc(-62_135_596_800_001), None);
        assert_eq!(utc(253_402_300_800_000), None);
        assert_eq!(utc(i64::MIN), None);
    }
}
