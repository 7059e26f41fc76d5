//! A snapshot file: verified, its header and its keys.

use std::path::Path;

use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{self};

use crate::filter::Show;
use crate::progress::Progress;
use crate::state::{aborted_of, entries_of, late_of};
use crate::view::*;

pub(crate) fn inspect(path: &Path, out: &mut Output, show: &Show<'_>) -> Result<(), Unreadable> {
    let (f, list) = (show.filter, show.list);
    *out = Output::new(path, "snapshot", "producer-state snapshot");
    let mut p = Progress::new("verifying snapshot: entries");
    let result = inspect::snapshot(&ReadOnlyFs(StdFs), path, &mut |n| p.tick(n));
    settle(out, result, |out, (s, state)| {
        out.version = Some(s.version);
        out.semantics = Some(semantics_name(s.semantics));
        out.position = Some(s.position);
        out.log_point = s.log_point;
        out.entry_count = Some(s.entries);
        if state.semantics() == producer_state::Semantics::Kafka {
            out.kafka_section_keys = Some((state.len() as u64).saturating_sub(s.entries));
        }
        out.entries = entries_of(&state, f, list);
        out.limit_entries(show.limit);
        out.aborted_transactions = aborted_of(&state, f, list);
        out.late_transactions = late_of(&state, show);
    })
}
