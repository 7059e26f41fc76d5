//! A store directory: every file with the library's verdict on it, and
//! recovery's dry run.

use std::path::Path;

use producer_state::RecoveryReport;
use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{
    self, Contents, DirectoryReport, DryRun, Effect, FileReport, Problem, Role, Verdict,
};

use crate::filter::Show;
use crate::progress::Progress;
use crate::state::{aborted_of, entries_of, late_of};
use crate::view::*;

pub(crate) fn role_word(r: Role) -> &'static str {
    match r {
        Role::Segment => "segment",
        Role::Snapshot => "snapshot",
        Role::SnapshotTemp | Role::SegmentTemp => "temporary",
        Role::KafkaSnapshot => "kafka_snapshot",
        _ => "other",
    }
}

/// What recovery does about a file, in words.
pub(crate) fn effect_text(f: &FileReport) -> &'static str {
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

pub(crate) fn file_view(f: &FileReport) -> FileView {
    FileView {
        name: f.name.clone(),
        kind: role_word(f.role),
        bytes: f.bytes,
        used_bytes: f.bytes.saturating_sub(f.preallocated),
        preallocated_bytes: f.preallocated,
        position: f.position,
        end_position: f.end_position,
        entries: f.entries,
        verdict: f.verdict(),
        problem: f.problem.as_ref().map(|p| p.to_string()),
        effect: effect_text(f),
        problem_offset: f.problem.as_ref().and_then(Problem::offset),
    }
}

pub(crate) fn recovery_view(report: &RecoveryReport) -> RecoveryView {
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
        seek: report.seek.as_ref().map(|s| {
            Box::new(SeekView {
                segment: path(&s.segment),
                offset: s.offset,
                records_not_read: s.records_not_read,
                fallback: s.fallback.map(|f| f.to_string()),
            })
        }),
        records_read_not_replayed: report.records_read_not_replayed,
        torn_tail: report.torn_tail.as_ref().map(|t| TornView {
            file: path(&t.file),
            offset: t.offset,
            bytes: t.bytes,
            record_bytes: t.bytes.saturating_sub(t.preallocated),
            preallocated_bytes: t.preallocated,
        }),
        would_remove: report.files_removed.iter().map(|p| path(p)).collect(),
        repairs: report.repairs.iter().map(RepairView::from).collect(),
        keys: report.keys,
        next_position: report.next_position,
    }
}

pub(crate) fn inspect(dir: &Path, out: &mut Output, show: &Show<'_>) -> Result<(), Unreadable> {
    let (f, list) = (show.filter, show.list);
    *out = Output::new(dir, "store", "producer-state store directory");
    let mut p = Progress::new("checking files");
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
        // No file named as a store's: nothing to verify, and nothing
        // recovery would refuse (opening makes a new store here).
        _ => {
            out.kind = "directory";
            out.format = "directory without a store".into();
            out.not_a_store(NotAStore::NoStore);
        }
    }
    match &report.recovery {
        DryRun::Opens { report, state } => {
            out.position = Some(report.next_position);
            out.entry_count = Some(state.len() as u64);
            out.recovery = Some(recovery_view(report));
            out.entries = entries_of(state, f, list);
            out.limit_entries(show.limit);
            out.aborted_transactions = aborted_of(state, f, list);
            out.late_transactions = late_of(state, show);
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
