//! How far into the log a partition's truncation must read.
//!
//! A partition's truncation replays the log after its base for that
//! partition alone, and what it keeps of the partition is its appends and
//! markers below the cut, and whatever else touches the partition:
//! removals of its keys, key states of it, its partition-state records and
//! forgotten aborts, a group that truncates or removes it, and any record
//! that may touch every partition (a store-wide truncation, an import's
//! group record). Nothing after the last such record can change the
//! result, so the replay may stop there instead of at the log's end. In a
//! store shared by many partitions that is most of the log: a partition
//! cut at its middle has its appends below the cut in the first half of
//! the log after the base, and only its appends above the cut, which the
//! replay drops, in the rest; and another partition's truncation, removal
//! or import after it does not make it read on.
//!
//! [`Reach`] keeps, per partition, the lowest offset appended in runs of
//! its appends (each run: its last position and lowest offset) and the
//! last position of a record of another kind that touches it, and the
//! position of the last record that may touch any partition, from the
//! position it started at (the log's position at open, or recovery's
//! replay start) on. What a record touches is [`Reach::mark`]'s one rule,
//! which the live store and recovery both follow. It is kept in memory
//! only: recovery rebuilds it from what it replays, and before its start
//! nothing is known, so a replay reads at least that far. Runs are merged
//! in pairs when a partition has [`MOST_RUNS`], so a partition keeps at
//! most 64 runs of 24 bytes (about 1.5 KiB, with its table entry); each
//! merge halves the resolution of every run, the newest included, so a
//! replay may read up to a run's length past what it needs, and older runs
//! coarsen more often.

use std::collections::HashMap;

use crate::wal::op::{GroupKind, LogOp};

/// Appends in one run before a new one starts.
const RUN: u32 = 256;
/// Runs a partition keeps before its runs are merged in pairs.
const MOST_RUNS: usize = 64;

/// A run of one partition's appends and markers: the last one's position
/// and the lowest offset among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    last: u64,
    low: i64,
    count: u32,
}

/// One partition's marks: its runs of appends and markers, and the last
/// position of a record of another kind that touches it.
#[derive(Debug, Default)]
struct Part {
    runs: Vec<Run>,
    touched: Option<u64>,
}

/// What a partition's truncation must read (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Reach {
    /// Positions from here on are known.
    from: u64,
    /// The last position of a record that may touch any partition.
    other: Option<u64>,
    /// Each partition's marks, found through `index`; the last partition
    /// marked is remembered, so that appends of one partition in a row (a
    /// batch of them, one busy partition) skip the hash lookup.
    parts: Vec<Part>,
    index: HashMap<i32, usize>,
    last: Option<(i32, usize)>,
}

impl Reach {
    /// Nothing known before position `from`.
    pub(crate) fn new(from: u64) -> Reach {
        Reach {
            from,
            ..Reach::default()
        }
    }

    /// The marks of `partition`, made if it has none.
    #[inline]
    fn part(&mut self, partition: i32) -> &mut Part {
        let i = match self.last {
            Some((p, i)) if p == partition => i,
            _ => {
                let next = self.parts.len();
                let i = *self.index.entry(partition).or_insert(next);
                if i == next {
                    self.parts.push(Part::default());
                }
                self.last = Some((partition, i));
                i
            }
        };
        // Every index has its part (pushed with it); the resize only keeps
        // the indexing below in bounds by construction.
        if i >= self.parts.len() {
            self.parts.resize_with(i + 1, Part::default);
        }
        &mut self.parts[i]
    }

    /// An append or a marker of `partition` at `offset`, at log position
    /// `pos`.
    #[inline]
    pub(crate) fn append(&mut self, partition: i32, offset: i64, pos: u64) {
        let runs = &mut self.part(partition).runs;
        if let Some(r) = runs.last_mut()
            && r.count < RUN
        {
            r.last = r.last.max(pos);
            r.low = r.low.min(offset);
            r.count += 1;
            return;
        }
        if runs.len() >= MOST_RUNS {
            merge_pairs(runs);
        }
        runs.push(Run {
            last: pos,
            low: offset,
            count: 1,
        });
    }

    /// A record that may touch any partition, whose last position is
    /// `last`.
    #[inline]
    pub(crate) fn other(&mut self, last: u64) {
        self.other = Some(self.other.map_or(last, |o| o.max(last)));
    }

    /// A record of another kind than an append or a marker that touches
    /// `partition` alone, whose last position is `last`.
    #[inline]
    pub(crate) fn touch(&mut self, partition: i32, last: u64) {
        let t = &mut self.part(partition).touched;
        *t = Some(t.map_or(last, |o| o.max(last)));
    }

    /// The one rule for what a record of another kind than one
    /// partition's append or marker touches (`last`: its last position):
    /// a removal or key-state record, the partitions of its keys; a
    /// partition-state record or a forgotten abort, its partition; the
    /// group record of a partition's truncation or removal, that
    /// partition; that of a store-wide truncation or an import, none (its
    /// members carry what it changes: [`Reach::group`]); any other
    /// record, every partition.
    pub(crate) fn mark(&mut self, last: u64, op: &LogOp) {
        match op {
            LogOp::Remove { keys, .. } => {
                for (_, p) in keys {
                    self.touch(*p, last);
                }
            }
            LogOp::Set { entries } => {
                for e in entries {
                    self.touch(e.partition, last);
                }
            }
            LogOp::KafkaPartition { partition, .. } | LogOp::ForgetAborted { partition, .. } => {
                self.touch(*partition, last);
            }
            LogOp::Group { kind, arg, .. } => self.group(*kind, *arg, last),
            _ => self.other(last),
        }
    }

    /// [`Reach::mark`] for a group record of `kind` and `arg` at `pos`.
    pub(crate) fn group(&mut self, kind: GroupKind, arg: i64, pos: u64) {
        match (kind, i32::try_from(arg)) {
            (GroupKind::TruncatePartition { partition }, _) => self.touch(partition, pos),
            // Replay drops the partition at this record.
            (GroupKind::RemovePartition, Ok(partition)) => self.touch(partition, pos),
            // A store-wide truncation's or an import's record changes no
            // key itself (replay::kafka_op, Replayer::op): its members do,
            // each marked for its keys' partitions, and a replay that
            // reads a member has read the group's record before it. Its
            // completion moves the highest offset and the partitions'
            // ends, which a partition's truncation does not take from
            // its replay.
            (GroupKind::Truncate | GroupKind::Import, _) => {}
            (GroupKind::RemovePartition, Err(_)) => self.other(pos),
        }
    }

    /// A replayed record at `pos` that takes a position (recovery's
    /// replay): one partition's append or marker (`one`: its partition
    /// and offset, as replay reads them), or a record of another kind
    /// ([`Reach::mark`]).
    pub(crate) fn note(&mut self, pos: u64, op: &LogOp, one: Option<(i32, i64)>) {
        if pos < self.from {
            return;
        }
        match one {
            Some((partition, offset)) => self.append(partition, offset, pos),
            None => self.mark(pos, op),
        }
    }

    /// Where a replay of `partition` from position `base`, keeping what
    /// lies below `offset`, may stop: one past the last position that can
    /// change its result (at least `base`, and at least where what is
    /// known starts). The caller bounds it by the log's end.
    pub(crate) fn stop(&self, partition: i32, offset: i64, base: u64) -> u64 {
        let mut stop = self.from.max(base);
        if let Some(o) = self.other {
            stop = stop.max(o + 1);
        }
        let part = self.index.get(&partition).and_then(|&i| self.parts.get(i));
        if let Some(t) = part.and_then(|p| p.touched) {
            stop = stop.max(t + 1);
        }
        if let Some(r) = part.and_then(|p| p.runs.iter().rev().find(|r| r.low < offset)) {
            stop = stop.max(r.last + 1);
        }
        stop
    }
}

/// Halves `runs` by merging neighbours: each merged run ends where the
/// later one did and holds the lower of the two lows.
fn merge_pairs(runs: &mut Vec<Run>) {
    let merged: Vec<Run> = runs
        .chunks(2)
        .map(|pair| {
            pair.iter()
                .copied()
                .reduce(|a, b| Run {
                    last: a.last.max(b.last),
                    low: a.low.min(b.low),
                    count: a.count.saturating_add(b.count),
                })
                .unwrap_or(Run {
                    last: 0,
                    low: i64::MAX,
                    count: 0,
                })
        })
        .collect();
    *runs = merged;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_stops_after_the_last_append_below_the_cut_or_other_record() {
        let mut r = Reach::new(10);
        // Partition 0: offsets 0..1000 at positions 10, 12, ... (interleaved
        // with partition 1 at the odd positions).
        for i in 0..1000u64 {
            r.append(0, i as i64, 10 + 2 * i);
            r.append(1, i as i64, 11 + 2 * i);
        }
        // Cut at 500: the run holding offset 499 ends at offset 511 (runs of
        // 256 appends: 256..=511), whose position is 10 + 2 * 511.
        assert_eq!(r.stop(0, 500, 10), 10 + 2 * 511 + 1);
        // Nothing below offset 0: the replay need not read past its base.
        assert_eq!(r.stop(0, 0, 10), 10);
        assert_eq!(r.stop(0, 0, 100), 100);
        // A partition never appended to, and one cut above its end.
        assert_eq!(r.stop(7, 50, 10), 10);
        assert_eq!(r.stop(1, 5000, 10), 11 + 2 * 999 + 1);
        // An append below the cut late in the log (offsets need not grow).
        r.append(0, 3, 5000);
        assert_eq!(r.stop(0, 500, 10), 5001);
        // Any other record reaches every partition.
        r.other(6000);
        assert_eq!(r.stop(7, 50, 10), 6001);
        assert_eq!(r.stop(0, 0, 10), 6001);
    }

    #[test]
    fn a_record_of_another_kind_reaches_the_partitions_it_touches() {
        use crate::engine::info::ProducerInfo;
        use crate::id::ProducerId;
        use crate::wal::op::RemoveReason;
        let mut r = Reach::new(0);
        r.append(0, 5, 10);
        r.append(1, 5, 11);
        let id = ProducerId::numeric(9);
        // A removal of partition 1's key and 2's: not partition 0's.
        let remove = LogOp::Remove {
            reason: RemoveReason::Expired,
            keys: vec![(id.clone(), 1), (id.clone(), 2)],
        };
        r.mark(20, &remove);
        assert_eq!(
            (r.stop(0, 6, 0), r.stop(1, 6, 0), r.stop(2, 0, 0)),
            (11, 21, 21)
        );
        // A key state of partition 3; a forgotten abort of 4.
        let info = ProducerInfo {
            producer_id: id,
            partition: 3,
            entry: crate::engine::entry::ProducerEntry::start(0, 0, 0, None),
            last_activity: 0,
        };
        r.mark(
            30,
            &LogOp::Set {
                entries: vec![info],
            },
        );
        r.mark(
            31,
            &LogOp::ForgetAborted {
                partition: 4,
                offset: 0,
            },
        );
        assert_eq!(
            (r.stop(3, 0, 0), r.stop(4, 0, 0), r.stop(0, 6, 0)),
            (31, 32, 11)
        );
        // Groups: a partition's truncation or removal, that partition; a
        // store-wide truncation's or an import's record, none (their
        // members are marked as removals and key states are).
        r.group(GroupKind::TruncatePartition { partition: 5 }, 3, 40);
        r.group(GroupKind::RemovePartition, 6, 41);
        assert_eq!(
            (r.stop(5, 0, 0), r.stop(6, 0, 0), r.stop(0, 6, 0)),
            (41, 42, 11)
        );
        r.group(GroupKind::Import, 3, 50);
        r.group(GroupKind::Truncate, 3, 51);
        assert_eq!(r.stop(0, 6, 0), 11);
        // Any other record that takes a position: every partition.
        r.other(60);
        assert_eq!(r.stop(0, 6, 0), 61);
    }

    #[test]
    fn nothing_before_the_start_is_known() {
        let r = Reach::new(1000);
        assert_eq!(r.stop(0, 5, 0), 1000);
        assert_eq!(r.stop(0, 5, 2000), 2000);
    }

    #[test]
    fn merged_runs_keep_every_low_and_last() {
        let mut r = Reach::new(0);
        let appends = u64::from(RUN) * (MOST_RUNS as u64) * 3;
        for i in 0..appends {
            r.append(0, i as i64, i);
        }
        let runs = &r.parts[r.index[&0]].runs;
        assert!(runs.len() <= MOST_RUNS, "{}", runs.len());
        assert_eq!(
            runs.iter().map(|r| u64::from(r.count)).sum::<u64>(),
            appends
        );
        assert_eq!(runs.last().unwrap().last, appends - 1);
        // Every cut finds a stop at or past its own last append below it,
        // and never before it.
        for cut in [1, 300, 20_000, appends as i64] {
            let stop = r.stop(0, cut, 0);
            assert!(stop >= cut as u64, "cut {cut}: stop {stop}");
            assert!(stop <= appends, "cut {cut}: stop {stop}");
        }
        // A partition with every offset the same: the whole history.
        let mut same = Reach::new(0);
        for i in 0..appends {
            same.append(3, 7, i);
        }
        assert_eq!(same.stop(3, 8, 0), appends);
        assert_eq!(same.stop(3, 7, 0), 0);
    }
}
