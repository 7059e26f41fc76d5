//! inspect-snapshot: look inside a producer-state store, or a Kafka
//! producer snapshot, without running a broker.
//!
//! A thin layer over `producer_state::inspect` and `producer_state::kafka`
//! (the readers recovery itself uses). It opens everything read-only and
//! takes no lock. See docs/inspect.md for the output, the JSON fields and
//! the exit codes.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use producer_state::inspect::{self, FileKind, SegmentEnd};
use producer_state::kafka::{self, KafkaProducerEntry};
use producer_state::{AppendRequest, Error, ProducerEntry, ProducerId};
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
/// 4 damage that recovery repairs by itself (a torn tail, a snapshot it
/// would skip).
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
    /// Only this producer: a number for numeric ids, anything else for names.
    #[arg(long, value_name = "ID")]
    producer: Option<String>,
    /// Only this partition.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    partition: Option<i32>,
}

const OK: u8 = 0;
const REFUSED: u8 = 1;
const UNREADABLE: u8 = 3;
const REPAIRABLE: u8 = 4;

/// A problem found, for stderr and the JSON `damage` list.
#[derive(Serialize, Clone, Debug)]
struct Damage {
    file: String,
    offset: Option<u64>,
    kind: String,
    /// "refused" (recovery would not open) or "repairable" (it would fix it).
    severity: &'static str,
}

#[derive(Serialize)]
struct Batch {
    first_sequence: i32,
    last_sequence: i32,
    offset: Option<i64>,
    timestamp: Option<i64>,
    time_utc: Option<String>,
}

#[derive(Serialize)]
struct Entry {
    producer_id: String,
    producer_id_kind: &'static str,
    partition: Option<i32>,
    epoch: i16,
    last_sequence: i32,
    retained_batches: Vec<Batch>,
    /// Kafka only.
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka: Option<KafkaFields>,
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
struct Record {
    position: u64,
    byte_offset: u64,
    producer_id: String,
    partition: i32,
    epoch: i16,
    first_sequence: i32,
    last_sequence: i32,
    offset: Option<i64>,
    timestamp: Option<i64>,
}

#[derive(Serialize)]
struct FileReport {
    name: String,
    kind: &'static str,
    bytes: u64,
    /// Snapshots: the position covered; segments: the first position.
    position: Option<u64>,
    /// Segments: one past the last valid record's position.
    end_position: Option<u64>,
    entries: Option<u64>,
    verdict: String,
}

#[derive(Serialize, Default)]
struct Output {
    path: String,
    kind: &'static str,
    format: String,
    version: Option<u16>,
    position: Option<u64>,
    entry_count: Option<u64>,
    verdict: String,
    damage: Vec<Damage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<FileReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entries: Vec<Entry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    records: Vec<Record>,
}

/// Filters by producer and partition.
struct Filter {
    producer: Option<ProducerId>,
    partition: Option<i32>,
}

impl Filter {
    fn keeps(&self, id: &ProducerId, partition: Option<i32>) -> bool {
        self.producer.as_ref().is_none_or(|p| p == id)
            && self
                .partition
                .is_none_or(|q| partition.is_none_or(|p| p == q))
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

fn id_string(id: &ProducerId) -> (String, &'static str) {
    match id.as_numeric() {
        Some(n) => (n.to_string(), "numeric"),
        None => (id.to_string(), "name"),
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

fn entry_of(id: &ProducerId, partition: Option<i32>, e: &ProducerEntry) -> Entry {
    let (producer_id, producer_id_kind) = id_string(id);
    Entry {
        producer_id,
        producer_id_kind,
        partition,
        epoch: e.epoch(),
        last_sequence: e.last_sequence(),
        retained_batches: e
            .retained_batches()
            .map(|b| Batch {
                first_sequence: b.first_sequence,
                last_sequence: b.last_sequence,
                offset: b.metadata.map(|m| m.offset),
                timestamp: b.metadata.map(|m| m.timestamp),
                time_utc: b.metadata.and_then(|m| utc(m.timestamp)),
            })
            .collect(),
        kafka: None,
    }
}

fn sort_entries(v: &mut [Entry]) {
    v.sort_by(|a, b| {
        let key = |e: &Entry| {
            (
                e.producer_id_kind != "numeric",
                e.producer_id.parse::<u64>().unwrap_or(0),
                e.producer_id.clone(),
                e.partition,
            )
        };
        key(a).cmp(&key(b))
    });
}

fn damage_of(e: &Error, severity: &'static str) -> Damage {
    match e {
        Error::Corrupt { file, offset, kind } => Damage {
            file: file.display().to_string(),
            offset: Some(*offset),
            kind: kind.to_string(),
            severity,
        },
        // Not damage, but recovery refuses it in every mode.
        Error::UnsupportedVersion { file, .. } => Damage {
            file: file.display().to_string(),
            offset: Some(0),
            kind: e.to_string(),
            severity: "refused",
        },
        other => Damage {
            file: String::new(),
            offset: None,
            kind: other.to_string(),
            severity,
        },
    }
}

/// The exit code for what was found.
fn code_for(damage: &[Damage]) -> u8 {
    if damage.iter().any(|d| d.severity == "refused") {
        REFUSED
    } else if damage.is_empty() {
        OK
    } else {
        REPAIRABLE
    }
}

fn verdict_text(damage: &[Damage]) -> String {
    match code_for(damage) {
        OK => "ok".into(),
        REPAIRABLE => "repairable".into(),
        _ => "damaged".into(),
    }
}

/// An IO error reading a file is not damage: it is its own exit code.
struct Unreadable(Error);

fn is_io(e: &Error) -> bool {
    matches!(e, Error::Io { .. })
}

/// Names what a single file is, before reading it.
fn begin(out: &mut Output, kind: &'static str, format: &str) {
    out.kind = kind;
    out.format = format.into();
    out.version = Some(1);
}

/// Takes a reader's result: an IO error stops the tool (exit 3), damage is
/// recorded (exit 1), success goes to `ok`.
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
        Err(e) if is_io(&e) => Err(Unreadable(e)),
        Err(e) => {
            out.damage.push(damage_of(&e, "refused"));
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
    begin(out, "snapshot", "producer-state snapshot");
    let mut p = Progress::new("verifying snapshot: entries", quiet);
    let mut entries = Vec::new();
    let result = inspect::snapshot(
        path,
        |id, part, e| {
            if list && f.keeps(&id, Some(part)) {
                entries.push(entry_of(&id, Some(part), &e));
            }
        },
        &mut |n| p.tick(n),
    );
    settle(out, result, |out, s| {
        out.position = Some(s.position);
        out.entry_count = Some(s.entries);
        out.entries = entries;
    })
}

fn request_record(position: u64, at: u64, r: &AppendRequest) -> Record {
    Record {
        position,
        byte_offset: at,
        producer_id: id_string(&r.producer_id).0,
        partition: r.partition,
        epoch: r.epoch,
        first_sequence: r.first_sequence(),
        last_sequence: r.last_sequence(),
        offset: r.metadata().map(|m| m.offset),
        timestamp: r.metadata().map(|m| m.timestamp),
    }
}

fn segment_damage(path: &Path, end: &SegmentEnd) -> Option<Damage> {
    match end {
        SegmentEnd::Clean => None,
        SegmentEnd::TornTail { offset, kind } => Some(Damage {
            file: path.display().to_string(),
            offset: Some(*offset),
            kind: format!("torn tail ({kind}); recovery cuts it if this is the last segment"),
            severity: "repairable",
        }),
        SegmentEnd::Damaged {
            offset,
            kind,
            later_write,
        } => Some(Damage {
            file: path.display().to_string(),
            offset: Some(*offset),
            kind: format!(
                "{kind}; a valid record written after it was durable follows at byte {later_write}"
            ),
            severity: "refused",
        }),
    }
}

fn inspect_segment(
    path: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    begin(out, "segment", "producer-state log segment");
    let mut p = Progress::new("scanning segment: byte", quiet);
    let mut records = Vec::new();
    let result = inspect::segment(
        path,
        |pos, at, r| {
            if list && f.keeps(&r.producer_id, Some(r.partition)) {
                records.push(request_record(pos, at, r));
            }
        },
        &mut |b| p.tick(b),
    );
    settle(out, result, |out, s| {
        out.position = Some(s.first_position);
        out.version = Some(s.version);
        out.entry_count = Some(s.records);
        out.damage.extend(segment_damage(path, &s.end));
        out.records = records;
    })
}

fn kafka_entry(k: &KafkaProducerEntry, partition: Option<i32>) -> Entry {
    // The batch as this crate reads it (none if it cannot be represented).
    let first = kafka::to_entry(k)
        .ok()
        .and_then(|(_, e)| e.retained_batches().next());
    Entry {
        producer_id: k.producer_id.to_string(),
        producer_id_kind: "numeric",
        partition,
        epoch: k.epoch,
        last_sequence: k.last_sequence,
        retained_batches: first
            .map(|b| Batch {
                first_sequence: b.first_sequence,
                last_sequence: b.last_sequence,
                offset: b.metadata.map(|m| m.offset),
                timestamp: b.metadata.map(|m| m.timestamp),
                time_utc: b.metadata.and_then(|m| utc(m.timestamp)),
            })
            .into_iter()
            .collect(),
        kafka: Some(KafkaFields {
            last_offset: k.last_offset,
            offset_delta: k.offset_delta,
            timestamp: k.timestamp,
            coordinator_epoch: k.coordinator_epoch,
            current_txn_first_offset: k.current_txn_first_offset,
        }),
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
    begin(out, "kafka_snapshot", "Apache Kafka producer snapshot");
    out.position = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(kafka::parse_file_name);
    let partition = kafka_partition(path);
    let mut p = Progress::new("verifying Kafka snapshot: entries", quiet);
    let mut entries = Vec::new();
    let result = inspect::kafka_snapshot(
        path,
        |k| {
            if list && f.keeps(&ProducerId::numeric(k.producer_id as u64), partition) {
                entries.push(kafka_entry(&k, partition));
            }
        },
        &mut |n| p.tick(n),
    );
    settle(out, result, |out, n| {
        out.entry_count = Some(n);
        out.entries = entries;
    })
}

fn inspect_dir(
    dir: &Path,
    out: &mut Output,
    f: &Filter,
    list: bool,
    quiet: bool,
) -> Result<(), Unreadable> {
    out.kind = "store";
    out.format = "producer-state store directory".into();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| {
            Unreadable(Error::Io {
                op: "list",
                path: dir.to_path_buf(),
                source: e,
            })
        })?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut found_store = false;
    let mut p = Progress::new("checking files", quiet);
    for (i, name) in names.iter().enumerate() {
        p.tick(i as u64);
        let path = dir.join(name);
        let kind = if name.ends_with(".snap.tmp") {
            out.files.push(FileReport {
                name: name.clone(),
                kind: "temporary",
                bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
                position: None,
                end_position: None,
                entries: None,
                verdict: "left over from an interrupted snapshot; recovery removes it".into(),
            });
            continue;
        } else if name.ends_with(".snap") {
            FileKind::Snapshot
        } else if name.ends_with(".wal") {
            FileKind::Segment
        } else if name.ends_with(".snapshot") {
            FileKind::KafkaSnapshot
        } else {
            continue;
        };
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        let mut fr = FileReport {
            name: name.clone(),
            kind: "",
            bytes,
            position: None,
            end_position: None,
            entries: None,
            verdict: "ok".into(),
        };
        match kind {
            FileKind::Snapshot => {
                found_store = true;
                fr.kind = "snapshot";
                match inspect::snapshot(&path, |_, _, _| {}, &mut |_| {}) {
                    Ok(s) => {
                        fr.position = Some(s.position);
                        fr.entries = Some(s.entries);
                    }
                    Err(e) if is_io(&e) => return Err(Unreadable(e)),
                    Err(e @ Error::UnsupportedVersion { .. }) => {
                        fr.verdict = format!("unsupported: {e}; recovery refuses it");
                        out.damage.push(damage_of(&e, "refused"));
                    }
                    Err(e) => {
                        // Recovery skips a damaged snapshot and falls back.
                        fr.verdict = format!("damaged: {e}; recovery would skip it");
                        out.damage.push(damage_of(&e, "repairable"));
                    }
                }
            }
            FileKind::Segment => {
                found_store = true;
                fr.kind = "segment";
                match inspect::segment(&path, |_, _, _| {}, &mut |_| {}) {
                    Ok(s) => {
                        fr.position = Some(s.first_position);
                        fr.end_position = Some(s.first_position + s.records);
                        fr.entries = Some(s.records);
                        if let Some(d) = segment_damage(&path, &s.end) {
                            fr.verdict = d.kind.clone();
                        }
                    }
                    Err(e) if is_io(&e) => return Err(Unreadable(e)),
                    Err(e @ Error::UnsupportedVersion { .. }) => {
                        fr.verdict = format!("unsupported: {e}; recovery refuses it")
                    }
                    Err(e) => fr.verdict = format!("damaged: {e}"),
                }
            }
            FileKind::KafkaSnapshot => {
                fr.kind = "kafka_snapshot";
                match inspect::kafka_snapshot(&path, |_| {}, &mut |_| {}) {
                    Ok(n) => fr.entries = Some(n),
                    Err(e) if is_io(&e) => return Err(Unreadable(e)),
                    Err(e) => {
                        fr.verdict = format!("damaged: {e}");
                        out.damage.push(damage_of(&e, "refused"));
                    }
                }
            }
        }
        out.files.push(fr);
    }
    drop(p);
    if !found_store {
        if out.files.iter().any(|f| f.kind == "kafka_snapshot") {
            out.format = "directory of Kafka producer snapshots".into();
            return Ok(());
        }
        out.damage.push(Damage {
            file: dir.display().to_string(),
            offset: None,
            kind: "no store files here (no .wal or .snap files): not a producer-state directory"
                .into(),
            severity: "refused",
        });
        return Ok(());
    }
    // What opening the store would do, without writing anything.
    match inspect::dry_run(dir) {
        Ok((report, state)) => {
            if let Some(t) = &report.torn_tail {
                out.damage.push(Damage {
                    file: t.file.display().to_string(),
                    offset: Some(t.offset),
                    kind: format!("torn tail: recovery would truncate {} bytes", t.bytes),
                    severity: "repairable",
                });
            }
            for removed in &report.files_removed {
                out.damage.push(Damage {
                    file: removed.display().to_string(),
                    offset: None,
                    kind: "recovery would remove this file".into(),
                    severity: "repairable",
                });
            }
            out.position = Some(report.next_position);
            out.entry_count = Some(state.len() as u64);
            out.recovery = Some(serde_json::json!({
                "would_open": true,
                "snapshot": report.snapshot.as_ref().map(|s| serde_json::json!({
                    "file": s.file.display().to_string(), "position": s.position, "entries": s.entries })),
                "skipped_snapshots": report.skipped_snapshots.iter().map(|s| serde_json::json!({
                    "file": s.file.display().to_string(), "reason": s.reason })).collect::<Vec<_>>(),
                "records_replayed": report.records_replayed,
                "segments_read": report.segments_read,
                "torn_tail": report.torn_tail.as_ref().map(|t| serde_json::json!({
                    "file": t.file.display().to_string(), "offset": t.offset, "bytes": t.bytes })),
                "would_remove": report.files_removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "keys": report.keys,
                "next_position": report.next_position,
            }));
            if list {
                out.entries = state
                    .iter()
                    .filter(|(id, p, _)| f.keeps(id, Some(*p)))
                    .map(|(id, p, e)| entry_of(&id, Some(p), &e))
                    .collect();
            }
        }
        Err(e) if is_io(&e) => return Err(Unreadable(e)),
        Err(e) => {
            out.recovery =
                Some(serde_json::json!({ "would_open": false, "refusal": e.to_string() }));
            out.damage.push(damage_of(&e, "refused"));
        }
    }
    Ok(())
}

/// Prints rows as aligned columns.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

fn batches_text(b: &[Batch]) -> String {
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

fn print_human(out: &Output) {
    println!("path:      {}", out.path);
    println!(
        "format:    {}{}",
        out.format,
        out.version
            .map_or(String::new(), |v| format!(", version {v}"))
    );
    match out.kind {
        "snapshot" => {
            if let Some(p) = out.position {
                println!("position:  {p} (covers log records before position {p})");
            }
        }
        "segment" => {
            if let (Some(p), Some(n)) = (out.position, out.entry_count) {
                println!("positions: {p}..{} ({n} valid records)", p + n);
            }
        }
        "kafka_snapshot" => {
            if let Some(p) = out.position {
                println!("offset:    {p} (covers log offsets before {p})");
            }
        }
        _ => {}
    }
    if out.kind != "store"
        && out.kind != "segment"
        && let Some(n) = out.entry_count
    {
        println!("entries:   {n}");
    }
    let verdict = match code_for(&out.damage) {
        OK => "OK, every checksum verifies".to_string(),
        REPAIRABLE => "repairable damage (recovery fixes it by itself)".to_string(),
        _ => "DAMAGED (or of a format version this build cannot read): recovery would refuse it"
            .to_string(),
    };
    println!("verdict:   {verdict}");
    for d in &out.damage {
        println!(
            "  {}{}: {}",
            d.file,
            d.offset.map_or(String::new(), |o| format!(" at byte {o}")),
            d.kind
        );
    }
    if !out.files.is_empty() {
        println!("\nfiles:");
        let rows: Vec<Vec<String>> = out
            .files
            .iter()
            .map(|f| {
                let range = match (f.kind, f.position, f.end_position) {
                    ("segment", Some(a), Some(b)) => format!("positions {a}..{b}"),
                    ("snapshot", Some(a), _) => format!("position {a}"),
                    _ => "-".into(),
                };
                vec![
                    f.kind.to_string(),
                    f.name.clone(),
                    range,
                    f.entries.map_or("-".into(), |n| n.to_string()),
                    f.bytes.to_string(),
                    f.verdict.clone(),
                ]
            })
            .collect();
        table(
            &["KIND", "FILE", "RANGE", "ENTRIES", "BYTES", "VERDICT"],
            &rows,
        );
    }
    if let Some(r) = &out.recovery {
        println!("\nrecovery (dry run: nothing written, no lock taken):");
        if r["would_open"] == true {
            match r["snapshot"].as_object() {
                Some(s) => println!(
                    "  would start from {} (position {})",
                    s["file"].as_str().unwrap_or(""),
                    s["position"]
                ),
                None => println!("  would start from an empty state at position 0"),
            }
            for s in r["skipped_snapshots"].as_array().into_iter().flatten() {
                println!(
                    "  would skip {} ({})",
                    s["file"].as_str().unwrap_or(""),
                    s["reason"].as_str().unwrap_or("")
                );
            }
            println!(
                "  would replay {} records from {} segment(s)",
                r["records_replayed"], r["segments_read"]
            );
            if let Some(t) = r["torn_tail"].as_object() {
                println!(
                    "  would truncate {} bytes of torn tail from {} at byte {}",
                    t["bytes"],
                    t["file"].as_str().unwrap_or(""),
                    t["offset"]
                );
            }
            for p in r["would_remove"].as_array().into_iter().flatten() {
                println!("  would remove {}", p.as_str().unwrap_or(""));
            }
            println!(
                "  -> {} keys, next position {}",
                r["keys"], r["next_position"]
            );
        } else {
            println!(
                "  would REFUSE to open: {}",
                r["refusal"].as_str().unwrap_or("")
            );
        }
    }
    if !out.entries.is_empty() {
        println!();
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
                    batches_text(&e.retained_batches),
                ];
                if let Some(k) = &e.kafka {
                    row.push(k.coordinator_epoch.to_string());
                    row.push(k.current_txn_first_offset.to_string());
                }
                row
            })
            .collect();
        if kafka {
            table(
                &[
                    "PRODUCER",
                    "PARTITION",
                    "EPOCH",
                    "LAST SEQ",
                    "LAST BATCH (first..last @offset time)",
                    "COORD EPOCH",
                    "TXN FIRST OFFSET",
                ],
                &rows,
            );
        } else {
            table(
                &[
                    "PRODUCER",
                    "PARTITION",
                    "EPOCH",
                    "LAST SEQ",
                    "RETAINED BATCHES (first..last @offset time)",
                ],
                &rows,
            );
        }
    }
    if !out.records.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = out
            .records
            .iter()
            .map(|r| {
                vec![
                    r.position.to_string(),
                    r.byte_offset.to_string(),
                    r.producer_id.clone(),
                    r.partition.to_string(),
                    r.epoch.to_string(),
                    format!("{}..{}", r.first_sequence, r.last_sequence),
                    r.offset.map_or("-".into(), |o| o.to_string()),
                    r.timestamp
                        .map_or("-".into(), |t| utc(t).unwrap_or_else(|| t.to_string())),
                ]
            })
            .collect();
        table(
            &[
                "POSITION",
                "BYTE",
                "PRODUCER",
                "PARTITION",
                "EPOCH",
                "SEQUENCES",
                "OFFSET",
                "TIME",
            ],
            &rows,
        );
    }
}

fn run(args: &Args) -> Result<Output, Unreadable> {
    let f = Filter {
        producer: args.producer.as_ref().map(|p| match p.parse::<u64>() {
            Ok(n) => ProducerId::numeric(n),
            Err(_) => ProducerId::from(p.as_str()),
        }),
        partition: args.partition,
    };
    let list = !args.verify;
    let quiet = args.json;
    let mut out = Output {
        path: args.path.display().to_string(),
        ..Output::default()
    };
    let meta = std::fs::metadata(&args.path).map_err(|e| {
        Unreadable(Error::Io {
            op: "stat",
            path: args.path.clone(),
            source: e,
        })
    })?;
    if meta.is_dir() {
        inspect_dir(&args.path, &mut out, &f, list, quiet)?;
    } else {
        match inspect::detect(&args.path) {
            Ok(Some(FileKind::Snapshot)) => {
                inspect_snapshot(&args.path, &mut out, &f, list, quiet)?
            }
            Ok(Some(FileKind::Segment)) => inspect_segment(&args.path, &mut out, &f, list, quiet)?,
            Ok(Some(FileKind::KafkaSnapshot)) => {
                inspect_kafka(&args.path, &mut out, &f, list, quiet)?
            }
            Ok(None) => {
                out.kind = "unknown";
                out.format = format!(
                    "unknown ({} bytes): not a snapshot, segment or Kafka snapshot",
                    meta.len()
                );
                out.damage.push(Damage {
                    file: args.path.display().to_string(),
                    offset: Some(0),
                    kind: "not a file of a known kind (neither name nor first bytes match)".into(),
                    severity: "refused",
                });
            }
            Err(e) => return Err(Unreadable(e)),
        }
    }
    sort_entries(&mut out.entries);
    out.verdict = verdict_text(&out.damage);
    Ok(out)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let out = match run(&args) {
        Ok(o) => o,
        Err(Unreadable(e)) => {
            eprintln!("inspect-snapshot: cannot read: {e}");
            return ExitCode::from(UNREADABLE);
        }
    };
    let code = code_for(&out.damage);
    for d in &out.damage {
        eprintln!(
            "{}: {}{}: {}",
            if d.severity == "refused" {
                "damaged"
            } else {
                "repairable"
            },
            d.file,
            d.offset.map_or(String::new(), |o| format!(" at byte {o}")),
            d.kind
        );
    }
    if args.json {
        match serde_json::to_string_pretty(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("inspect-snapshot: {e}"),
        }
    } else if !args.verify {
        print_human(&out);
    }
    ExitCode::from(code)
}
