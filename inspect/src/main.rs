//! inspect-snapshot: look inside a producer-state store, or a Kafka
//! producer snapshot, without running a broker.
//!
//! A renderer over `producer_state::inspect` and `producer_state::kafka`:
//! the library reads (with the readers recovery itself uses) and decides
//! what each finding means (the verdicts and exit codes); this tool prints
//! that, as tables or JSON, from typed view structs. It reads through
//! `ReadOnlyFs(StdFs)` and takes no lock. See docs/inspect.md for the
//! output, the JSON fields and the exit codes.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{
    self, Contents, DirectoryReport, DryRun, Effect, FileKind, FileReport, GroupKind, LogOp,
    Problem, RemoveReason, Role, SegmentEnd, Verdict,
};
use producer_state::kafka::{self, KafkaProducerEntry};
use producer_state::{
    AppendRequest, Error, KafkaProducerState, MarkerKind, ProducerEntry, ProducerId,
    RecoveryReport, Repair,
};
use serde::Serialize;

/// Inspect a producer-state snapshot, log segment or store directory, or an
/// Apache Kafka producer snapshot (`<offset>.snapshot`), read-only.
///
/// PATH is detected by name and content. A directory is listed file by
/// file, then recovery is run as a dry run (nothing is written, no lock is
/// taken) to show the state it would rebuild and what it would truncate or
/// refuse.
///
/// Exit codes: 0 everything verifies; 1 damage that recovery would refuse
/// (or a file of no known kind); 2 usage error; 3 a file could not be read;
/// 4 damage with which recovery still opens the store (a torn tail it
/// cuts, a snapshot it skips, damage in the log only a fallback to an
/// older snapshot would need).
#[derive(Parser, Debug)]
#[command(name = "inspect-snapshot", version)]
struct Args {
    /// A snapshot (`.snap`), a log segment (`.wal`), a store directory, or a
    /// Kafka snapshot (`.snapshot`).
    path: PathBuf,
    /// Print one JSON document instead of tables (field names in docs/inspect.md).
    #[arg(long)]
    json: bool,
    /// Print no table: exit 0 if everything verifies, else a non-zero code,
    /// with the file, byte offset and kind of damage on stderr.
    #[arg(long)]
    verify: bool,
    /// Only this producer: a number for numeric ids (Kafka's may be
    /// negative), anything else for names.
    #[arg(long, value_name = "ID", allow_negative_numbers = true)]
    producer: Option<String>,
    /// Only this partition.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    partition: Option<i32>,
}

const UNREADABLE: u8 = 3;

/// The exit code of a verdict.
fn code_of(v: Verdict) -> u8 {
    match v {
        Verdict::Ok => 0,
        Verdict::Repairable => 4,
        Verdict::Refused => 1,
    }
}

/// The JSON `verdict` word (kept from earlier versions: `damaged` for refused).
fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Ok => "ok",
        Verdict::Repairable => "repairable",
        Verdict::Refused => "damaged",
    }
}

fn severity_serde<S: serde::Serializer>(v: &Verdict, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_str())
}

/// A problem found, for stderr and the JSON `damage` list.
#[derive(Serialize, Debug)]
struct Damage {
    file: String,
    offset: Option<u64>,
    kind: String,
    /// `refused` (recovery would not open) or `repairable` (it opens).
    #[serde(serialize_with = "severity_serde")]
    severity: Verdict,
}

#[derive(Serialize)]
struct BatchView {
    first_sequence: i32,
    last_sequence: i32,
    offset: Option<i64>,
    timestamp: Option<i64>,
    time_utc: Option<String>,
}

/// How entries sort: numeric ids (Kafka's may be negative) before names,
/// then by partition.
type SortKey = (bool, i128, String, Option<i32>);

#[derive(Serialize)]
struct EntryView {
    producer_id: String,
    producer_id_kind: &'static str,
    partition: Option<i32>,
    epoch: i16,
    last_sequence: i32,
    /// This crate's files: the key's last activity (milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_activity: Option<i64>,
    retained_batches: Vec<BatchView>,
    /// Kafka only.
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka: Option<KafkaFields>,
    #[serde(skip)]
    key: SortKey,
}

#[derive(Serialize)]
struct KafkaFields {
    last_offset: i64,
    offset_delta: i32,
    timestamp: i64,
    coordinator_epoch: i32,
    current_txn_first_offset: i64,
}

#[derive(Serialize)]
struct RecordView {
    position: u64,
    byte_offset: u64,
    /// What the record does: `append`, `clock`, `accepted-unknown`,
    /// `expired`, `evicted`, `partition-removed`, `truncated` (a key
    /// removed), `group` (an atomic group), `key-state` (a key set),
    /// `kafka-batch`, `txn-marker`, `forget-aborted`, and a Kafka-mode
    /// partition state: `partition-state` then its `kafka-key-state` and
    /// `aborted-txn` records.
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_sequence: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_sequence: Option<i32>,
    offset: Option<i64>,
    timestamp: Option<i64>,
    /// Groups: what the group does; clock records: the time.
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

#[derive(Serialize)]
struct FileView {
    name: String,
    kind: &'static str,
    bytes: u64,
    /// Snapshots: the position covered; segments: the first position.
    position: Option<u64>,
    /// Segments: one past the last valid record's position.
    end_position: Option<u64>,
    entries: Option<u64>,
    /// `ok`, `repairable` or `refused`: what the file means to recovery.
    #[serde(serialize_with = "severity_serde")]
    verdict: Verdict,
    /// What is wrong with it (null: nothing).
    problem: Option<String>,
    /// What recovery does about it.
    effect: &'static str,
    #[serde(skip)]
    problem_offset: Option<u64>,
}

#[derive(Serialize)]
struct SnapshotView {
    file: String,
    position: u64,
    entries: u64,
}

#[derive(Serialize)]
struct SkippedView {
    file: String,
    /// The byte and the kind of the damage.
    offset: u64,
    kind: String,
    /// Both, as the error says it.
    reason: String,
}

/// One change recovery would make, in the order it would make them: the
/// library's plan (`RecoveryReport::repairs`).
#[derive(Serialize)]
#[serde(tag = "repair", rename_all = "snake_case")]
enum RepairView {
    RemoveTemp {
        file: String,
    },
    RemoveEmptySegment {
        file: String,
    },
    Truncate {
        file: String,
        len: u64,
        bytes: u64,
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
            Repair::Truncate { file, len, bytes } => RepairView::Truncate {
                file: path(file),
                len: *len,
                bytes: *bytes,
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
struct TornView {
    file: String,
    offset: u64,
    bytes: u64,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RecoveryView {
    Opens {
        would_open: bool,
        snapshot: Option<SnapshotView>,
        skipped_snapshots: Vec<SkippedView>,
        records_replayed: u64,
        segments_read: usize,
        /// Segments wholly below the snapshot's position, not read.
        segments_skipped: usize,
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
struct Output {
    path: String,
    kind: &'static str,
    format: String,
    version: Option<u16>,
    /// `seed` or `kafka`: the semantics of the store that wrote the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    semantics: Option<&'static str>,
    position: Option<u64>,
    entry_count: Option<u64>,
    verdict: &'static str,
    damage: Vec<Damage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<FileView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery: Option<RecoveryView>,
    /// A Kafka-mode snapshot: keys its Kafka section holds (beyond the
    /// `entry_count` compact entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka_section_keys: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entries: Vec<EntryView>,
    /// A Kafka-mode state's aborted transactions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    aborted_transactions: Vec<AbortedView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    records: Vec<RecordView>,
    #[serde(skip)]
    code: Verdict,
}

#[derive(Serialize)]
struct AbortedView {
    partition: i32,
    producer_id: String,
    first_offset: i64,
    last_offset: i64,
    last_stable_offset: i64,
}

impl Output {
    fn new(path: &Path, kind: &'static str, format: &str) -> Output {
        Output {
            path: path.display().to_string(),
            kind,
            format: format.into(),
            version: None,
            semantics: None,
            position: None,
            entry_count: None,
            verdict: "ok",
            damage: Vec::new(),
            files: Vec::new(),
            recovery: None,
            kafka_section_keys: None,
            entries: Vec::new(),
            aborted_transactions: Vec::new(),
            records: Vec::new(),
            code: Verdict::Ok,
        }
    }
}

/// Filters by producer and partition.
struct Filter {
    producer: Option<ProducerId>,
    /// The `--producer` argument as a Kafka id (an `i64`, may be negative).
    kafka_producer: Option<Option<i64>>,
    partition: Option<i32>,
}

impl Filter {
    fn keeps_partition(&self, partition: Option<i32>) -> bool {
        self.partition
            .is_none_or(|q| partition.is_none_or(|p| p == q))
    }

    fn keeps(&self, id: &ProducerId, partition: Option<i32>) -> bool {
        self.producer.as_ref().is_none_or(|p| p == id) && self.keeps_partition(partition)
    }

    fn keeps_kafka(&self, id: i64, partition: Option<i32>) -> bool {
        self.kafka_producer.is_none_or(|p| p == Some(id)) && self.keeps_partition(partition)
    }
}

/// A progress bar on stderr, shown only if the scan takes over a second and
/// stderr is a terminal.
struct Progress {
    start: Instant,
    bar: Option<indicatif::ProgressBar>,
    enabled: bool,
    what: String,
}

impl Progress {
    fn new(what: &str, quiet: bool) -> Progress {
        Progress {
            start: Instant::now(),
            bar: None,
            enabled: !quiet && std::io::stderr().is_terminal(),
            what: what.to_string(),
        }
    }

    fn tick(&mut self, done: u64) {
        if !self.enabled || self.start.elapsed() < Duration::from_secs(1) {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.set_message(self.what.clone());
            b
        });
        bar.set_position(done);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm UTC`
/// (civil-from-days, proleptic Gregorian); `None` outside years 1..=9999.
fn utc(ms: i64) -> Option<String> {
    const MIN: i64 = -62_135_596_800_000; // 0001-01-01
    const MAX: i64 = 253_402_300_799_999; // 9999-12-31
    if !(MIN..=MAX).contains(&ms) {
        return None;
    }
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    Some(format!(
        "{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}.{milli:03} UTC"
    ))
}

fn id_view(id: &ProducerId) -> (String, &'static str, SortKey) {
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

fn batch_view(b: &producer_state::RetainedBatch) -> BatchView {
    BatchView {
        first_sequence: b.first_sequence,
        last_sequence: b.last_sequence,
        offset: b.metadata.map(|m| m.offset),
        timestamp: b.metadata.map(|m| m.timestamp),
        time_utc: b.metadata.and_then(|m| utc(m.timestamp)),
    }
}

fn entry_of(id: &ProducerId, partition: Option<i32>, e: &ProducerEntry) -> EntryView {
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

fn entries_of(state: &inspect::RecoveredState, f: &Filter, list: bool) -> Vec<EntryView> {
    if !list {
        return Vec::new();
    }
    let mut v: Vec<EntryView> = state
        .infos()
        .filter(|i| f.keeps(&i.producer_id, Some(i.partition)))
        .map(
            |i| match state.kafka_state(i.producer_id.clone(), i.partition) {
                // A Kafka-mode key: Kafka's view, every cached batch.
                Some(k) => kafka_state_entry(&i.producer_id, i.partition, &k),
                None => {
                    let mut v = entry_of(&i.producer_id, Some(i.partition), &i.entry);
                    v.last_activity = Some(i.last_activity);
                    v
                }
            },
        )
        .collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

/// A key of a Kafka-mode state, with the fields Kafka's snapshot would
/// hold for it (its newest batch's last offset and delta).
fn kafka_state_entry(id: &ProducerId, partition: i32, k: &KafkaProducerState) -> EntryView {
    let (producer_id, producer_id_kind, mut key) = id_view(id);
    key.3 = Some(partition);
    let newest = k.batches.last().and_then(|b| {
        let m = b.metadata?;
        let delta = i64::from(b.last_sequence.wrapping_sub(b.first_sequence)) & 0x7fff_ffff;
        Some((m.offset.wrapping_add(delta), delta as i32))
    });
    EntryView {
        producer_id,
        producer_id_kind,
        partition: Some(partition),
        epoch: k.epoch,
        last_sequence: k.last_sequence,
        last_activity: None,
        retained_batches: k.batches.iter().map(batch_view).collect(),
        kafka: Some(KafkaFields {
            last_offset: newest.map_or(-1, |n| n.0),
            offset_delta: newest.map_or(0, |n| n.1),
            timestamp: k.last_timestamp,
            coordinator_epoch: k.coordinator_epoch,
            current_txn_first_offset: k.current_txn_first_offset.unwrap_or(-1),
        }),
        key,
    }
}

fn aborted_of(state: &inspect::RecoveredState, f: &Filter, list: bool) -> Vec<AbortedView> {
    if !list {
        return Vec::new();
    }
    state
        .aborted_transactions()
        .into_iter()
        .filter(|(p, t)| f.keeps(&t.producer_id, Some(*p)))
        .map(|(partition, t)| AbortedView {
            partition,
            producer_id: id_view(&t.producer_id).0,
            first_offset: t.first_offset,
            last_offset: t.last_offset,
            last_stable_offset: t.last_stable_offset,
        })
        .collect()
}

/// A reader's IO error: not damage, its own exit code.
struct Unreadable(Error);

/// Damage found by reading a file on its own: it does not verify.
fn damage_of(e: &Error) -> Damage {
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
fn settle<T>(
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

fn inspect_snapshot(
    path: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    *out = Output::new(path, "snapshot", "producer-state snapshot");
    let mut p = Progress::new("verifying snapshot: entries", quiet);
    let result = inspect::snapshot(&ReadOnlyFs(StdFs), path, &mut |n| p.tick(n));
    settle(out, result, |out, (s, state)| {
        out.version = Some(s.version);
        out.semantics = Some(semantics_name(s.semantics));
        out.position = Some(s.position);
        out.entry_count = Some(s.entries);
        if state.semantics() == producer_state::Semantics::Kafka {
            out.kafka_section_keys = Some((state.len() as u64).saturating_sub(s.entries));
        }
        out.entries = entries_of(&state, f, list);
        out.aborted_transactions = aborted_of(&state, f, list);
    })
}

fn request_record(position: u64, at: u64, r: &AppendRequest) -> RecordView {
    RecordView {
        position,
        byte_offset: at,
        op: "append",
        producer_id: Some(id_view(&r.producer_id).0),
        partition: Some(r.partition),
        epoch: Some(r.epoch),
        first_sequence: Some(r.first_sequence()),
        last_sequence: Some(r.last_sequence()),
        offset: r.metadata().map(|m| m.offset),
        timestamp: r.metadata().map(|m| m.timestamp),
        detail: None,
    }
}

/// A record that concerns no one key.
fn store_record(position: u64, at: u64, op: &'static str, detail: String) -> RecordView {
    RecordView {
        position,
        byte_offset: at,
        op,
        producer_id: None,
        partition: None,
        epoch: None,
        first_sequence: None,
        last_sequence: None,
        offset: None,
        timestamp: None,
        detail: Some(detail),
    }
}

/// The records of one log operation that `f` keeps: one per key it
/// concerns (removals, key states), or one for the record.
fn op_records(position: u64, at: u64, op: &LogOp, f: &Filter, out: &mut Vec<RecordView>) {
    let unfiltered = f.producer.is_none() && f.partition.is_none();
    match op {
        LogOp::Append(r) if f.keeps(&r.producer_id, Some(r.partition)) => {
            out.push(request_record(position, at, r));
        }
        LogOp::Clock(ms) if unfiltered => {
            let t = utc(*ms).unwrap_or_else(|| ms.to_string());
            out.push(store_record(position, at, "clock", format!("{ms} ({t})")));
        }
        LogOp::AcceptedUnknown if unfiltered => {
            let d = "the next append was accepted for a producer without state".to_string();
            out.push(store_record(position, at, "accepted-unknown", d));
        }
        LogOp::Group { kind, members, arg } if unfiltered => {
            let what = match kind {
                GroupKind::Truncate => format!("truncate to offset {arg}"),
                GroupKind::RemovePartition => format!("remove partition {arg}"),
                GroupKind::Import => format!("import (highest offset {arg})"),
                _ => format!("{kind} {arg}"),
            };
            let d = format!("{what}: the next {members} record(s), all or none");
            out.push(store_record(position, at, "group", d));
        }
        LogOp::Remove { reason, keys } => {
            let op = match reason {
                RemoveReason::Expired => "expired",
                RemoveReason::Evicted => "evicted",
                RemoveReason::PartitionRemoved => "partition-removed",
                _ => "truncated",
            };
            for (id, p) in keys.iter().filter(|(id, p)| f.keeps(id, Some(*p))) {
                let mut v = store_record(position, at, op, String::new());
                v.producer_id = Some(id_view(id).0);
                v.partition = Some(*p);
                v.detail = None;
                out.push(v);
            }
        }
        LogOp::Set { entries } => {
            for i in entries
                .iter()
                .filter(|i| f.keeps(&i.producer_id, Some(i.partition)))
            {
                let newest = i.newest_batch();
                out.push(RecordView {
                    position,
                    byte_offset: at,
                    op: "key-state",
                    producer_id: Some(id_view(&i.producer_id).0),
                    partition: Some(i.partition),
                    epoch: Some(i.epoch()),
                    first_sequence: newest.map(|b| b.first_sequence),
                    last_sequence: Some(i.last_sequence()),
                    offset: newest.and_then(|b| b.metadata).map(|m| m.offset),
                    timestamp: Some(i.last_activity),
                    detail: Some(format!("{} retained batch(es)", i.retained_batches().len())),
                });
            }
        }
        LogOp::KafkaBatch {
            request,
            transactional,
        } if f.keeps(&request.producer_id, Some(request.partition)) => {
            let mut v = request_record(position, at, request);
            v.op = "kafka-batch";
            v.detail = transactional.then(|| "transactional".to_string());
            out.push(v);
        }
        LogOp::TxnMarker {
            producer_id,
            partition,
            epoch,
            marker,
        } if f.keeps(producer_id, Some(*partition)) => {
            let kind = match marker.kind {
                MarkerKind::Commit => "commit",
                _ => "abort",
            };
            let d = format!("{kind}, coordinator epoch {}", marker.coordinator_epoch);
            let mut v = store_record(position, at, "txn-marker", d);
            v.producer_id = Some(id_view(producer_id).0);
            v.partition = Some(*partition);
            v.epoch = Some(*epoch);
            v.offset = Some(marker.offset);
            v.timestamp = Some(marker.timestamp);
            out.push(v);
        }
        LogOp::KafkaPartition {
            partition,
            reset,
            section,
        } => partition_records(position, at, (*partition, *reset, section), f, out),
        LogOp::ForgetAborted { partition, offset } if unfiltered => {
            let d = format!("aborted transactions below offset {offset} forgotten");
            let mut v = store_record(position, at, "forget-aborted", d);
            v.partition = Some(*partition);
            out.push(v);
        }
        _ => {}
    }
}

/// A partition-state record (kind 21, a Kafka-mode truncation's or
/// import's member): one `partition-state` record saying what it does to
/// the partition, then one `kafka-key-state` per side-table key and one
/// `aborted-txn` per aborted transaction it carries.
fn partition_records(
    position: u64,
    at: u64,
    (partition, reset, section): (i32, bool, &[u8]),
    f: &Filter,
    out: &mut Vec<RecordView>,
) {
    let decoded = inspect::partition_section(partition, section);
    if f.producer.is_none() && f.keeps_partition(Some(partition)) {
        let what = match &decoded {
            Ok(s) => format!(
                "{}{} side-table key(s), {} aborted transaction(s)",
                if reset {
                    "the partition's keys and transactions dropped, then "
                } else {
                    ""
                },
                s.keys.len(),
                s.aborted.len()
            ),
            Err(e) => format!("undecodable section: {e}"),
        };
        let mut v = store_record(position, at, "partition-state", what);
        v.partition = Some(partition);
        out.push(v);
    }
    let Ok(s) = decoded else { return };
    for (id, k) in s.keys.iter().filter(|(id, _)| f.keeps(id, Some(partition))) {
        let newest = k.batches.last();
        let txn = k.current_txn_first_offset.map_or_else(
            || "no open transaction".to_string(),
            |o| format!("open transaction from offset {o}"),
        );
        out.push(RecordView {
            position,
            byte_offset: at,
            op: "kafka-key-state",
            producer_id: Some(id_view(id).0),
            partition: Some(partition),
            epoch: Some(k.epoch),
            first_sequence: newest.map(|b| b.first_sequence),
            last_sequence: Some(k.last_sequence),
            offset: newest.and_then(|b| b.metadata).map(|m| m.offset),
            timestamp: Some(k.last_timestamp),
            detail: Some(format!(
                "coordinator epoch {}, {txn}, {} cached batch(es)",
                k.coordinator_epoch,
                k.batches.len()
            )),
        });
    }
    for t in s
        .aborted
        .iter()
        .filter(|t| f.keeps(&t.producer_id, Some(partition)))
    {
        let d = format!(
            "aborted offsets {}..={}, last stable offset {}",
            t.first_offset, t.last_offset, t.last_stable_offset
        );
        let mut v = store_record(position, at, "aborted-txn", d);
        v.producer_id = Some(id_view(&t.producer_id).0);
        v.partition = Some(partition);
        v.offset = Some(t.first_offset);
        out.push(v);
    }
}

fn inspect_segment(
    path: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    *out = Output::new(path, "segment", "producer-state log segment");
    let mut p = Progress::new("scanning segment: byte", quiet);
    let mut records = Vec::new();
    let result = inspect::segment(
        &ReadOnlyFs(StdFs),
        path,
        |pos, at, op| {
            if list {
                op_records(pos, at, op, f, &mut records);
            }
        },
        &mut |b| p.tick(b),
    );
    settle(out, result, |out, s| {
        out.position = Some(s.first_position);
        out.version = Some(s.version);
        out.semantics = Some(semantics_name(s.semantics));
        out.entry_count = Some(s.records);
        let (offset, kind) = match &s.end {
            SegmentEnd::TornTail { offset, kind } => (
                *offset,
                format!("torn tail ({kind}); recovery cuts it if this is the last segment"),
            ),
            SegmentEnd::Damaged {
                offset,
                kind,
                later_write,
            } => (
                *offset,
                format!(
                    "{kind}; a valid record written after it was durable follows at byte {later_write}"
                ),
            ),
            _ => (0, String::new()),
        };
        if s.end.verdict() != Verdict::Ok {
            out.damage.push(Damage {
                file: path.display().to_string(),
                offset: Some(offset),
                kind,
                severity: s.end.verdict(),
            });
        }
        out.records = records;
    })
}

fn kafka_entry(k: &KafkaProducerEntry, partition: Option<i32>) -> EntryView {
    // The batch as this crate reads it (none if it cannot be represented).
    let first = kafka::to_entry(k)
        .ok()
        .and_then(|(_, e)| e.retained_batches().next());
    EntryView {
        // Kafka's id is an i64 and shown as it is, negative ones included
        // (-1 is Kafka's "no producer"; seeding a store skips those).
        producer_id: k.producer_id.to_string(),
        producer_id_kind: "numeric",
        partition,
        epoch: k.epoch,
        last_sequence: k.last_sequence,
        last_activity: None,
        retained_batches: first.map(|b| batch_view(&b)).into_iter().collect(),
        kafka: Some(KafkaFields {
            last_offset: k.last_offset,
            offset_delta: k.offset_delta,
            timestamp: k.timestamp,
            coordinator_epoch: k.coordinator_epoch,
            current_txn_first_offset: k.current_txn_first_offset,
        }),
        key: (false, i128::from(k.producer_id), String::new(), partition),
    }
}

/// Kafka keeps a partition's files in `<topic>-<partition>`.
fn kafka_partition(path: &Path) -> Option<i32> {
    let dir = path.parent()?.file_name()?.to_str()?;
    dir.rsplit_once('-')?.1.parse().ok()
}

fn inspect_kafka(
    path: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    *out = Output::new(path, "kafka_snapshot", "Apache Kafka producer snapshot");
    out.version = Some(1);
    out.position = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(kafka::parse_file_name);
    let partition = kafka_partition(path);
    let mut p = Progress::new("verifying Kafka snapshot: entries", quiet);
    let result = inspect::kafka_snapshot(&ReadOnlyFs(StdFs), path, &mut |n| p.tick(n));
    settle(out, result, |out, entries| {
        out.entry_count = Some(entries.len() as u64);
        if list {
            out.entries = entries
                .iter()
                .filter(|k| f.keeps_kafka(k.producer_id, partition))
                .map(|k| kafka_entry(k, partition))
                .collect();
            out.entries.sort_by(|a, b| a.key.cmp(&b.key));
        }
    })
}

fn role_word(r: Role) -> &'static str {
    match r {
        Role::Segment => "segment",
        Role::Snapshot => "snapshot",
        Role::SnapshotTemp | Role::SegmentTemp => "temporary",
        Role::KafkaSnapshot => "kafka_snapshot",
        _ => "other",
    }
}

/// What recovery does about a file, in words.
fn effect_text(f: &FileReport) -> &'static str {
    match f.effect {
        Effect::None => "ok",
        Effect::Ignored => "not a store file: recovery does not read it",
        Effect::Repaired => match f.problem {
            Some(Problem::TornTail { .. }) => "recovery cuts it there",
            _ => "recovery removes it",
        },
        Effect::Skipped => "recovery skips it and falls back to an older snapshot",
        Effect::NeededByFallback => {
            "recovery does not read it now, but a fallback to an older snapshot needs it (and would refuse)"
        }
        Effect::Refuses => "recovery refuses to open the store",
        _ => "it does not verify",
    }
}

fn file_view(f: &FileReport) -> FileView {
    FileView {
        name: f.name.clone(),
        kind: role_word(f.role),
        bytes: f.bytes,
        position: f.position,
        end_position: f.end_position,
        entries: f.entries,
        verdict: f.verdict(),
        problem: f.problem.as_ref().map(|p| p.to_string()),
        effect: effect_text(f),
        problem_offset: f.problem.as_ref().and_then(Problem::offset),
    }
}

fn recovery_view(report: &RecoveryReport) -> RecoveryView {
    let path = |p: &Path| p.display().to_string();
    RecoveryView::Opens {
        would_open: true,
        snapshot: report.snapshot.as_ref().map(|s| SnapshotView {
            file: path(&s.file),
            position: s.position,
            entries: s.entries,
        }),
        skipped_snapshots: report
            .skipped_snapshots
            .iter()
            .map(|s| SkippedView {
                file: path(&s.file),
                offset: s.offset,
                kind: s.kind.to_string(),
                reason: s.to_string(),
            })
            .collect(),
        records_replayed: report.records_replayed,
        segments_read: report.segments_read,
        segments_skipped: report.segments_skipped,
        torn_tail: report.torn_tail.as_ref().map(|t| TornView {
            file: path(&t.file),
            offset: t.offset,
            bytes: t.bytes,
        }),
        would_remove: report.files_removed.iter().map(|p| path(p)).collect(),
        repairs: report.repairs.iter().map(RepairView::from).collect(),
        keys: report.keys,
        next_position: report.next_position,
    }
}

fn inspect_dir(
    dir: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    *out = Output::new(dir, "store", "producer-state store directory");
    let mut p = Progress::new("checking files", quiet);
    let report: DirectoryReport =
        inspect::directory(&ReadOnlyFs(StdFs), dir, &mut |n| p.tick(n)).map_err(Unreadable)?;
    drop(p);
    out.files = report.files.iter().map(file_view).collect();
    for (fr, v) in report.files.iter().zip(&out.files) {
        if fr.problem.is_some() && fr.verdict() != Verdict::Ok {
            out.damage.push(Damage {
                file: fr.path.display().to_string(),
                offset: v.problem_offset,
                kind: format!("{}; {}", v.problem.as_deref().unwrap_or_default(), v.effect),
                severity: fr.verdict(),
            });
        }
    }
    match report.contents {
        Contents::Store => {}
        Contents::KafkaSnapshots => out.format = "directory of Kafka producer snapshots".into(),
        _ => out.damage.push(Damage {
            file: dir.display().to_string(),
            offset: None,
            kind: "no file named as a store's (<20 digits>.wal or .snap): not a producer-state directory"
                .into(),
            severity: Verdict::Refused,
        }),
    }
    match &report.recovery {
        DryRun::Opens { report, state } => {
            out.position = Some(report.next_position);
            out.entry_count = Some(state.len() as u64);
            out.recovery = Some(recovery_view(report));
            out.entries = entries_of(state, f, list);
            out.aborted_transactions = aborted_of(state, f, list);
        }
        DryRun::Refuses(e) => {
            out.recovery = Some(RecoveryView::Refuses {
                would_open: false,
                refusal: e.to_string(),
            });
            // Already listed if it names one of the files.
            let named = report.files.iter().any(|fr| fr.effect == Effect::Refuses);
            if !named {
                out.damage.push(damage_of(e));
            }
        }
        _ => {}
    }
    out.code = report.verdict;
    Ok(())
}

/// Prints rows as aligned columns.
fn table(w: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = width.get_mut(i) {
                *x = (*x).max(c.len());
            }
        }
    }
    let mut line = |cells: &[String]| -> io::Result<()> {
        let s: Vec<String> = cells
            .iter()
            .zip(&width)
            .map(|(c, n)| format!("{c:<n$}"))
            .collect();
        writeln!(w, "{}", s.join("  ").trim_end())
    };
    line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>())?;
    for r in rows {
        line(r)?;
    }
    Ok(())
}

fn batches_text(b: &[BatchView]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter()
        .map(|b| match (b.offset, &b.time_utc, b.timestamp) {
            (Some(o), Some(t), _) => format!("{}..{} @{o} {t}", b.first_sequence, b.last_sequence),
            (Some(o), None, Some(ts)) => {
                format!("{}..{} @{o} ts {ts}", b.first_sequence, b.last_sequence)
            }
            _ => format!("{}..{}", b.first_sequence, b.last_sequence),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn print_recovery(w: &mut dyn Write, r: &RecoveryView) -> io::Result<()> {
    writeln!(w, "\nrecovery (dry run: nothing written, no lock taken):")?;
    match r {
        RecoveryView::Opens {
            snapshot,
            skipped_snapshots,
            records_replayed,
            segments_read,
            segments_skipped,
            repairs,
            keys,
            next_position,
            ..
        } => {
            match snapshot {
                Some(s) => writeln!(w, "  would start from {} (position {})", s.file, s.position)?,
                None => writeln!(w, "  would start from an empty state at position 0")?,
            }
            for s in skipped_snapshots {
                writeln!(w, "  would skip {} ({})", s.file, s.reason)?;
            }
            writeln!(
                w,
                "  would replay {records_replayed} records from {segments_read} segment(s)"
            )?;
            if *segments_skipped > 0 {
                writeln!(
                    w,
                    "  would not read {segments_skipped} segment(s) wholly below the snapshot's position"
                )?;
            }
            for r in repairs {
                print_repair(w, r)?;
            }
            writeln!(w, "  -> {keys} keys, next position {next_position}")
        }
        RecoveryView::Refuses { refusal, .. } => {
            writeln!(w, "  would REFUSE to open: {refusal}")
        }
    }
}

/// One step of recovery's plan, as the dry run would take it.
fn print_repair(w: &mut dyn Write, r: &RepairView) -> io::Result<()> {
    match r {
        RepairView::RemoveTemp { file } => {
            writeln!(w, "  would remove {file} (a leftover temporary snapshot)")
        }
        RepairView::RemoveEmptySegment { file } => writeln!(
            w,
            "  would remove {file} (a segment cut off at its creation: no record)"
        ),
        RepairView::Truncate { file, len, bytes } => writeln!(
            w,
            "  would truncate {bytes} bytes of torn tail from {file} at byte {len}"
        ),
        RepairView::MoveAside {
            file,
            from: 0,
            to,
            bytes,
        } => writeln!(w, "  would move {file} ({bytes} bytes) aside to {to}"),
        RepairView::MoveAside {
            file,
            from,
            to,
            bytes,
        } => writeln!(
            w,
            "  would move {bytes} bytes of {file} from byte {from} on aside to {to}, and cut it there"
        ),
        RepairView::Other { text } => writeln!(w, "  would {text}"),
    }
}

fn print_human(w: &mut dyn Write, out: &Output) -> io::Result<()> {
    writeln!(w, "path:      {}", out.path)?;
    writeln!(
        w,
        "format:    {}{}",
        out.format,
        out.version
            .map_or(String::new(), |v| format!(", version {v}"))
    )?;
    if out.semantics == Some("kafka") {
        writeln!(w, "semantics: kafka (Semantics::Kafka store)")?;
    }
    match (out.kind, out.position, out.entry_count) {
        ("snapshot", Some(p), _) => {
            writeln!(w, "position:  {p} (covers log records before position {p})")?
        }
        ("segment", Some(p), Some(n)) => {
            writeln!(w, "positions: {p}..{} ({n} valid records)", p + n)?
        }
        ("kafka_snapshot", Some(p), _) => {
            writeln!(w, "offset:    {p} (covers log offsets before {p})")?
        }
        _ => {}
    }
    if out.kind != "store"
        && out.kind != "segment"
        && let Some(n) = out.entry_count
    {
        match out.kafka_section_keys {
            Some(k) => writeln!(w, "entries:   {n} (and {k} keys in the Kafka section)")?,
            None => writeln!(w, "entries:   {n}")?,
        }
    }
    let verdict = match out.code {
        Verdict::Ok => "OK, every checksum verifies",
        Verdict::Repairable => {
            "repairable damage (recovery still opens: it repairs or does without what is damaged)"
        }
        Verdict::Refused => {
            "DAMAGED (or of a format version this build cannot read): recovery would refuse it"
        }
    };
    writeln!(w, "verdict:   {verdict}")?;
    for d in &out.damage {
        writeln!(
            w,
            "  {}{}: {}",
            d.file,
            d.offset.map_or(String::new(), |o| format!(" at byte {o}")),
            d.kind
        )?;
    }
    if !out.files.is_empty() {
        writeln!(w, "\nfiles:")?;
        let rows: Vec<Vec<String>> = out
            .files
            .iter()
            .map(|f| {
                let range = match (f.kind, f.position, f.end_position) {
                    ("segment", Some(a), Some(b)) => format!("positions {a}..{b}"),
                    ("snapshot", Some(a), _) => format!("position {a}"),
                    ("kafka_snapshot", Some(a), _) => format!("offset {a}"),
                    _ => "-".into(),
                };
                let verdict = match &f.problem {
                    Some(p) => format!("{p}; {}", f.effect),
                    None => f.effect.to_string(),
                };
                vec![
                    f.kind.to_string(),
                    f.name.clone(),
                    range,
                    f.entries.map_or("-".into(), |n| n.to_string()),
                    f.bytes.to_string(),
                    verdict,
                ]
            })
            .collect();
        table(
            w,
            &["KIND", "FILE", "RANGE", "ENTRIES", "BYTES", "VERDICT"],
            &rows,
        )?;
    }
    if let Some(r) = &out.recovery {
        print_recovery(w, r)?;
    }
    if !out.entries.is_empty() {
        writeln!(w)?;
        let kafka = out.entries.iter().any(|e| e.kafka.is_some());
        let rows: Vec<Vec<String>> = out
            .entries
            .iter()
            .map(|e| {
                let mut row = vec![
                    e.producer_id.clone(),
                    e.partition.map_or("-".into(), |p| p.to_string()),
                    e.epoch.to_string(),
                    e.last_sequence.to_string(),
                ];
                if !kafka {
                    row.push(
                        e.last_activity
                            .map_or("-".into(), |t| utc(t).unwrap_or_else(|| t.to_string())),
                    );
                }
                row.push(batches_text(&e.retained_batches));
                if let Some(k) = &e.kafka {
                    row.push(k.coordinator_epoch.to_string());
                    row.push(k.current_txn_first_offset.to_string());
                }
                row
            })
            .collect();
        let mut header = vec!["PRODUCER", "PARTITION", "EPOCH", "LAST SEQ"];
        if !kafka {
            header.push("LAST ACTIVITY");
        }
        if kafka {
            // Kafka's file keeps one batch; a Kafka-mode store, its window.
            header.push(if out.kind == "kafka_snapshot" {
                "LAST BATCH (first..last @offset time)"
            } else {
                "BATCHES (first..last @offset time)"
            });
            header.extend(["COORD EPOCH", "TXN FIRST OFFSET"]);
        } else {
            header.push("RETAINED BATCHES (first..last @offset time)");
        }
        table(w, &header, &rows)?;
    }
    if !out.aborted_transactions.is_empty() {
        writeln!(w)?;
        writeln!(w, "aborted transactions (in marker order):")?;
        let rows: Vec<Vec<String>> = out
            .aborted_transactions
            .iter()
            .map(|t| {
                vec![
                    t.partition.to_string(),
                    t.producer_id.clone(),
                    t.first_offset.to_string(),
                    t.last_offset.to_string(),
                    t.last_stable_offset.to_string(),
                ]
            })
            .collect();
        table(
            w,
            &[
                "PARTITION",
                "PRODUCER",
                "FIRST OFFSET",
                "LAST OFFSET",
                "LAST STABLE OFFSET",
            ],
            &rows,
        )?;
    }
    if !out.records.is_empty() {
        writeln!(w)?;
        let rows: Vec<Vec<String>> = out
            .records
            .iter()
            .map(|r| {
                let dash = || "-".to_string();
                let sequences = match (r.first_sequence, r.last_sequence) {
                    (Some(a), Some(b)) => format!("{a}..{b}"),
                    (None, Some(b)) => format!("..{b}"),
                    _ => dash(),
                };
                vec![
                    r.position.to_string(),
                    r.byte_offset.to_string(),
                    r.op.to_string(),
                    r.producer_id.clone().unwrap_or_else(dash),
                    r.partition.map_or_else(dash, |p| p.to_string()),
                    r.epoch.map_or_else(dash, |e| e.to_string()),
                    sequences,
                    r.offset.map_or_else(dash, |o| o.to_string()),
                    r.timestamp
                        .map_or_else(dash, |t| utc(t).unwrap_or_else(|| t.to_string())),
                    r.detail.clone().unwrap_or_default(),
                ]
            })
            .collect();
        table(
            w,
            &[
                "POSITION",
                "BYTE",
                "OP",
                "PRODUCER",
                "PARTITION",
                "EPOCH",
                "SEQUENCES",
                "OFFSET",
                "TIME",
                "DETAIL",
            ],
            &rows,
        )?;
    }
    Ok(())
}

fn run(args: &Args) -> Result<Output, Unreadable> {
    let f = Filter {
        producer: args.producer.as_ref().map(|p| match p.parse::<u64>() {
            Ok(n) => ProducerId::numeric(n),
            Err(_) => ProducerId::from(p.as_str()),
        }),
        kafka_producer: args.producer.as_ref().map(|p| p.parse::<i64>().ok()),
        partition: args.partition,
    };
    let list = !args.verify;
    let quiet = args.json;
    let path = &args.path;
    let mut out = Output::new(path, "unknown", "");
    let meta = std::fs::metadata(path).map_err(|e| {
        Unreadable(Error::Io {
            op: "stat",
            path: path.clone(),
            source: e,
        })
    })?;
    if meta.is_dir() {
        inspect_dir(path, &mut out, &f, list, quiet)?;
    } else {
        match inspect::detect(&ReadOnlyFs(StdFs), path) {
            Ok(Some(FileKind::Snapshot)) => inspect_snapshot(path, &mut out, &f, list, quiet)?,
            Ok(Some(FileKind::Segment)) => inspect_segment(path, &mut out, &f, list, quiet)?,
            Ok(Some(FileKind::KafkaSnapshot)) => inspect_kafka(path, &mut out, &f, list, quiet)?,
            // A kind this tool does not know yet (the library's list can grow).
            Ok(_) => {
                out.format = format!(
                    "unknown ({} bytes): not a snapshot, segment or Kafka snapshot",
                    meta.len()
                );
                out.damage.push(Damage {
                    file: path.display().to_string(),
                    offset: Some(0),
                    kind: "not a file of a known kind (neither name nor first bytes match)".into(),
                    severity: Verdict::Refused,
                });
            }
            Err(e) => return Err(Unreadable(e)),
        }
        // A file on its own: as bad as its worst damage.
        out.code = out
            .damage
            .iter()
            .map(|d| d.severity)
            .max()
            .unwrap_or(Verdict::Ok);
    }
    out.verdict = verdict_word(out.code);
    Ok(out)
}

/// Prints the output; an error only if stdout fails.
fn print(args: &Args, out: &Output) -> io::Result<()> {
    let mut w = io::BufWriter::with_capacity(1 << 16, io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut w, out)?;
        writeln!(w)?;
    } else if !args.verify {
        print_human(&mut w, out)?;
    }
    w.flush()
}

/// The `semantics` field's value: `seed` or `kafka`. The strict rules were
/// called the seed rules when the field was introduced, and scripts read
/// it: the name stays.
fn semantics_name(s: producer_state::Semantics) -> &'static str {
    match s {
        producer_state::Semantics::Kafka => "kafka",
        _ => "seed",
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Writes to stderr that fail (a closed stderr) are dropped: there is
    // nowhere left to say anything.
    let mut err = io::stderr().lock();
    let out = match run(&args) {
        Ok(o) => o,
        Err(Unreadable(e)) => {
            let _ = writeln!(err, "inspect-snapshot: cannot read: {e}");
            return ExitCode::from(UNREADABLE);
        }
    };
    for d in &out.damage {
        let _ = writeln!(
            err,
            "{}: {}{}: {}",
            if d.severity == Verdict::Refused {
                "damaged"
            } else {
                "repairable"
            },
            d.file,
            d.offset.map_or(String::new(), |o| format!(" at byte {o}")),
            d.kind
        );
    }
    match print(&args, &out) {
        Ok(()) => {}
        // The reader went away (`| head`): stop quietly, as Unix tools
        // do, with the verdict's exit code (it does not depend on how much
        // was printed).
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            let _ = writeln!(err, "inspect-snapshot: cannot write the output: {e}");
            return ExitCode::from(UNREADABLE);
        }
    }
    ExitCode::from(code_of(out.code))
}
