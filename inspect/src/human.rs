//! The tables and lines printed without `--json`.

use std::io::{self, Write};

use producer_state::inspect::Verdict;

use crate::progress::Progress;
use crate::view::*;

/// Prints rows as aligned columns.
pub(crate) fn table(w: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
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

pub(crate) fn batches_text(b: &[BatchView]) -> String {
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

pub(crate) fn print_recovery(w: &mut dyn Write, r: &RecoveryView) -> io::Result<()> {
    writeln!(w, "\nrecovery (dry run: nothing written, no lock taken):")?;
    match r {
        RecoveryView::Opens {
            snapshot,
            skipped_snapshots,
            records_replayed,
            segments_read,
            segments_skipped,
            seek,
            records_read_not_replayed,
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
            match seek.as_deref() {
                Some(SeekView {
                    segment,
                    offset,
                    records_not_read,
                    fallback: None,
                }) => writeln!(
                    w,
                    "  would seek to byte {offset} of {segment}, not reading the {records_not_read} records below it"
                )?,
                Some(SeekView {
                    segment,
                    offset,
                    fallback: Some(why),
                    ..
                }) => writeln!(
                    w,
                    "  would not seek to byte {offset} of {segment} ({why}): would read it from its first record"
                )?,
                None => {}
            }
            if *records_read_not_replayed > 0 {
                writeln!(
                    w,
                    "  would read {records_read_not_replayed} records the snapshot covers without replaying them"
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
pub(crate) fn print_repair(w: &mut dyn Write, r: &RepairView) -> io::Result<()> {
    match r {
        RepairView::RemoveTemp { file } => {
            writeln!(w, "  would remove {file} (a leftover temporary snapshot)")
        }
        RepairView::RemoveEmptySegment { file } => writeln!(
            w,
            "  would remove {file} (a segment cut off at its creation: no record)"
        ),
        RepairView::Truncate {
            file,
            len,
            bytes,
            preallocated_bytes: 0,
            ..
        } => writeln!(
            w,
            "  would truncate {bytes} bytes of torn tail from {file} at byte {len}"
        ),
        RepairView::Truncate {
            file,
            len,
            record_bytes,
            preallocated_bytes,
            ..
        } => writeln!(
            w,
            "  would truncate {record_bytes} bytes of torn tail from {file} at byte {len}, and the {preallocated_bytes} bytes of preallocated room (zeros) after them"
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

/// Everything printed without `--json`, in order: the file or
/// directory and its verdict, then each part the output has.
///
/// Rendering a segment's millions of records takes seconds: `p` ticks
/// with the rows rendered.
pub(crate) fn print(w: &mut dyn Write, out: &Output, p: &mut Progress) -> io::Result<()> {
    print_header(w, out)?;
    print_stores(w, out)?;
    for o in &out.inspected {
        writeln!(w, "\n=== store {}\n", o.path)?;
        print(w, o, p)?;
    }
    print_files(w, out)?;
    if let Some(r) = &out.recovery {
        print_recovery(w, r)?;
    }
    print_entries(w, out, p)?;
    print_aborted(w, out)?;
    print_late(w, out)?;
    print_records(w, out, p)
}

/// What was inspected, its format and position, and the verdict with
/// every damage found.
fn print_header(w: &mut dyn Write, out: &Output) -> io::Result<()> {
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
            writeln!(w, "position:  {p} (covers log records before position {p})")?;
            if let Some(at) = out.log_point {
                writeln!(
                    w,
                    "log point: byte {at} of the segment holding position {p} (where recovery starts reading it)"
                )?;
            }
        }
        ("segment", Some(p), Some(n)) => {
            writeln!(w, "positions: {p}..{} ({n} valid records)", p + n)?
        }
        ("kafka_snapshot", Some(p), _) => {
            writeln!(w, "offset:    {p} (covers log offsets before {p})")?
        }
        _ => {}
    }
    if let (Some(used), Some(room)) = (out.used_bytes, out.preallocated_bytes) {
        writeln!(
            w,
            "bytes:     {used} written (header, records, any torn write), {room} preallocated (zeros: room for records to come)"
        )?;
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
    if out.not_a_store.is_some() {
        writeln!(w, "verdict:   {}", not_a_store_text(out))?;
        return Ok(());
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
    Ok(())
}

/// What a path that holds no store is, in words (the verdict line, and
/// the line on stderr).
pub(crate) fn not_a_store_text(out: &Output) -> &'static str {
    match (out.not_a_store, out.kind) {
        (Some(NotAStore::NoStore), _) => {
            "no store here: no file named as a store's (<20 digits>.wal or .snap), nothing verified; opening a store here would make a new, empty one"
        }
        (Some(NotAStore::Broker), "broker_data_directory") => {
            "a broker directory (a data directory), not a store: stores under it are listed; inspect one by its path, or every one with --all"
        }
        (Some(NotAStore::Broker), _) => {
            "a broker directory (a partition's), not a store: its producer state is in the stores listed; inspect one by its path, or every one with --all"
        }
        (Some(NotAStore::KafkaLog), _) => {
            "a Kafka log segment (not read): this tool reads producer-state stores, their files and Kafka's producer snapshots (<offset>.snapshot)"
        }
        (None, _) => "",
    }
}

/// [`not_a_store_text`] on one line, for stderr: a broker directory's
/// stores named in it.
pub(crate) fn not_a_store_line(out: &Output) -> String {
    let text = not_a_store_text(out);
    match &out.stores {
        Some(s) if s.is_empty() => format!("{text}; stores: none"),
        Some(s) => format!("{text}; stores: {}", s.join(", ")),
        None => text.to_string(),
    }
}

/// A broker directory's stores, one a line.
fn print_stores(w: &mut dyn Write, out: &Output) -> io::Result<()> {
    let Some(stores) = &out.stores else {
        return Ok(());
    };
    if let (Some(k), Some(shared)) = (out.partition_key, stores.last()) {
        writeln!(
            w,
            "partition: {k} in {shared} (the catalog's key; `--partition {k}` there)"
        )?;
    }
    if stores.is_empty() {
        return writeln!(w, "stores:    none");
    }
    writeln!(w, "stores:")?;
    for s in stores {
        writeln!(w, "  {s}")?;
    }
    Ok(())
}

/// A directory's files, one row each.
fn print_files(w: &mut dyn Write, out: &Output) -> io::Result<()> {
    if out.files.is_empty() {
        return Ok(());
    }
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
                f.used_bytes.to_string(),
                if f.kind == "segment" {
                    f.preallocated_bytes.to_string()
                } else {
                    "-".into()
                },
                verdict,
            ]
        })
        .collect();
    table(
        w,
        &[
            "KIND",
            "FILE",
            "RANGE",
            "ENTRIES",
            "BYTES",
            "PREALLOCATED",
            "VERDICT",
        ],
        &rows,
    )?;
    Ok(())
}

/// The keys, one row each (Kafka's columns for Kafka's files and Kafka-mode
/// states).
fn print_entries(w: &mut dyn Write, out: &Output, p: &mut Progress) -> io::Result<()> {
    if out.entries.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    let kafka = out.entries.iter().any(|e| e.kafka.is_some());
    let rows: Vec<Vec<String>> = out
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if i % 4096 == 0 {
                p.tick(i as u64);
            }
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
    limited(w, out.entries.len(), out.entries_total, "keys")
}

/// A Kafka-mode state's late (hanging) transactions.
fn print_late(w: &mut dyn Write, out: &Output) -> io::Result<()> {
    let rows = out.late_transactions.iter().map(|t| {
        vec![
            t.partition.to_string(),
            t.producer_id.clone(),
            t.first_offset.to_string(),
            utc(t.last_timestamp).unwrap_or_else(|| t.last_timestamp.to_string()),
            format!("{:.1} min", t.idle_ms as f64 / 60_000.0),
        ]
    });
    section(
        w,
        "late (hanging) transactions: each the oldest open one of its partition, its producer idle \
         past transaction.max.timeout.ms + 5 min; it holds the last stable offset back:",
        &[
            "PARTITION",
            "PRODUCER",
            "FIRST OFFSET",
            "LAST TIMESTAMP",
            "IDLE",
        ],
        rows.collect(),
    )
}

/// A Kafka-mode state's aborted transactions.
fn print_aborted(w: &mut dyn Write, out: &Output) -> io::Result<()> {
    let rows = out.aborted_transactions.iter().map(|t| {
        vec![
            t.partition.to_string(),
            t.producer_id.clone(),
            t.first_offset.to_string(),
            t.last_offset.to_string(),
            t.last_stable_offset.to_string(),
        ]
    });
    section(
        w,
        "aborted transactions (in marker order):",
        &[
            "PARTITION",
            "PRODUCER",
            "FIRST OFFSET",
            "LAST OFFSET",
            "LAST STABLE OFFSET",
        ],
        rows.collect(),
    )
}

/// A titled table after a blank line; nothing without rows.
fn section(
    w: &mut dyn Write,
    title: &str,
    header: &[&str],
    rows: Vec<Vec<String>>,
) -> io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(w, "{title}")?;
    table(w, header, &rows)
}

/// Says how many of `total` were shown, if `--limit` cut a list.
fn limited(w: &mut dyn Write, shown: usize, total: Option<u64>, what: &str) -> io::Result<()> {
    match total {
        Some(total) => writeln!(w, "({shown} of {total} {what} shown: --limit)"),
        None => Ok(()),
    }
}

/// A segment's records, one row per key each concerns.
fn print_records(w: &mut dyn Write, out: &Output, p: &mut Progress) -> io::Result<()> {
    if out.records.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    let rows: Vec<Vec<String>> = out
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if i % 4096 == 0 {
                p.tick(i as u64);
            }
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
    limited(w, out.records.len(), out.records_total, "records")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_a_long_list_ticks_the_progress_bar() {
        let mut out = Output::new(std::path::Path::new("x.wal"), "segment", "");
        out.records = (0..20_000u64)
            .map(|i| crate::segment::store_record(i, 40 + i, "clock", String::new()))
            .collect();
        let mut p = Progress::new("rendering");
        let mut w = Vec::new();
        print(&mut w, &out, &mut p).unwrap();
        assert!(p.ticks >= 4, "{} ticks", p.ticks);
        assert_eq!(
            String::from_utf8(w)
                .unwrap()
                .lines()
                .filter(|l| l.contains("clock"))
                .count(),
            20_000
        );
    }
}
