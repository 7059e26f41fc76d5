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
//!
//! It also keeps where the records that can change a partition's result
//! lie in the log's bytes ([`Unit`]s: the partition's appends and
//! markers, each with the records that take no position written right
//! before it; the records of other kinds that touch it, a group's
//! members as their whole group; and the records that may touch any
//! partition), so that the replay reads those records alone and seeks
//! over the rest ([`Reach::units`]). Each costs 16 bytes, kept from the
//! oldest retained snapshot on ([`Reach::forget_below`]). Where a record
//! lies is only known once its group is written ([`Reach::written`]):
//! recovery notes records at their offsets in their segments, the live
//! store at their offsets in the group being formed, and the writer's
//! group starts turn those into offsets in the segments. Single-sequence
//! appends without batch metadata (kind-1 records, which pack the appends
//! of many partitions, and may follow a clock record that a later append
//! of any partition depends on) are not placed: a replay whose range
//! holds one reads the log as before.

use std::collections::HashMap;

use crate::batch::AppendRequest;
use crate::wal::op::{GroupKind, LogOp};

/// Appends in one run before a new one starts.
const RUN: u32 = 256;
/// Runs a partition keeps before its runs are merged in pairs.
const MOST_RUNS: usize = 64;
/// Units kept at most (64 MiB of them): past it, the older half is
/// dropped, as when retention moves ([`Reach::forget_below`]). A store
/// that snapshots by its defaults drops them at retention well before.
const MOST_UNITS: usize = 1 << 22;

/// A run of one partition's appends and markers: the last one's position
/// and the lowest offset among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    last: u64,
    low: i64,
    count: u32,
}

/// One partition's marks: its runs of appends and markers, the last
/// position of a record of another kind that touches it, and where its
/// records lie: its appends' and markers' (`units`) and those of the
/// records of other kinds that touch it (`touches`), each ascending.
#[derive(Debug, Default)]
struct Part {
    runs: Vec<Run>,
    touched: Option<u64>,
    units: Vec<Unit>,
    touches: Vec<Unit>,
}

/// Records a replay reads together, in the log's order: the position of
/// the first that takes one, the positions that follow it in the unit
/// (a group's members, the later records of one write), and the offset
/// of its first byte (of a record that takes no position written right
/// before it, if there is one): in the segment holding `pos` for the
/// records recovery read, and from the start of the group written with
/// `pos` for the records written since the store opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unit {
    pub pos: u64,
    pub more: u32,
    pub at: u32,
}

/// A [`Unit`] placed in its segment: read from byte `at` of the segment
/// holding `pos`, through position `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub pos: u64,
    pub last: u64,
    pub at: u64,
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
    /// Where the records that may touch any partition lie.
    others: Vec<Unit>,
    /// Units are kept from here on (at least `from`).
    placed_from: u64,
    /// The last position of a record that is not placed (see the module
    /// docs).
    unplaced: Option<u64>,
    /// Positions from here on were written by the live store: their
    /// units' offsets count from their group's start.
    live_from: u64,
    /// The live store's groups written: first position and byte offset in
    /// its segment, ascending.
    starts: Vec<(u64, u64)>,
    /// The unit of the record being marked.
    current: Option<Unit>,
    /// The offset of the first record taking no position since the last
    /// that takes one, and the position of the record it precedes.
    lead: Option<(u32, u64)>,
    /// The group whose members are being marked: its unit and its last
    /// position.
    open: Option<(Unit, u64)>,
    /// Units kept, and the position of the last one.
    units: usize,
    last_unit: u64,
}

impl Reach {
    /// Nothing known before position `from`.
    pub(crate) fn new(from: u64) -> Reach {
        Reach {
            from,
            placed_from: from,
            live_from: from,
            ..Reach::default()
        }
    }

    /// Positions from `next` on are the live store's ([`Reach::written`]).
    pub(crate) fn live_from(&mut self, next: u64) {
        self.live_from = next;
    }

    /// A record that takes no position at offset `at`, before position
    /// `pos`: read with the record there.
    #[inline]
    pub(crate) fn quiet(&mut self, at: u32, pos: u64) {
        if self.lead.is_none_or(|(_, p)| p != pos) {
            self.lead = Some((at, pos));
        }
    }

    /// Where the records of position `pos` start: at `at`, or at the
    /// records taking no position written right before.
    #[inline]
    fn led(&mut self, at: u32, pos: u64) -> u32 {
        match self.lead.take() {
            Some((l, p)) if p == pos => l,
            _ => at,
        }
    }

    /// [`Reach::quiet`] for recovery's replay: a record taking no
    /// position read at offset `at` of its segment, before position `pos`.
    pub(crate) fn quiet_read(&mut self, pos: u64, at: u64) {
        if pos < self.from {
            return;
        }
        match u32::try_from(at) {
            Ok(at) => self.quiet(at, pos),
            Err(_) => self.unplaced(pos),
        }
    }

    /// The live store wrote the group whose first position is `first` at
    /// byte `offset` of its segment.
    pub(crate) fn written(&mut self, first: u64, offset: u64) {
        // In order of writing, which is the log's (after any of the same
        // first position: a group of records taking no position).
        let i = self.starts.partition_point(|s| s.0 <= first);
        self.starts.insert(i, (first, offset));
    }

    /// A record that is not placed, at `pos` (see the module docs).
    #[inline]
    pub(crate) fn unplaced(&mut self, pos: u64) {
        self.unplaced = Some(self.unplaced.map_or(pos, |u| u.max(pos)));
    }

    /// Marks the records from position `pos` on, `more` positions after it,
    /// written from offset `at` (and any record taking no position just
    /// before), with `mark` ([`Reach::mark`]'s rule).
    pub(crate) fn marking(
        &mut self,
        (pos, more, at): (u64, u32, u32),
        mark: impl FnOnce(&mut Reach),
    ) {
        let at = self.led(at, pos);
        if self.open.is_some_and(|(_, end)| pos > end) {
            self.open = None;
        }
        self.current = Some(Unit { pos, more, at });
        mark(self);
        self.current = None;
    }

    /// The unit to read for the record being marked: its group's, if it is
    /// a member of one.
    fn unit(&self) -> Option<Unit> {
        match (self.open, self.current) {
            (Some((g, end)), Some(c)) if c.pos <= end => Some(g),
            (_, c) => c,
        }
    }

    /// Drops the units before position `pos` (no truncation starts from a
    /// base before it: the oldest snapshot kept).
    pub(crate) fn forget_below(&mut self, pos: u64) {
        if pos <= self.placed_from {
            return;
        }
        self.placed_from = pos;
        let dropped = self
            .parts
            .iter_mut()
            .map(|p| drop_below(&mut p.units, pos) + drop_below(&mut p.touches, pos))
            .sum::<usize>()
            + drop_below(&mut self.others, pos);
        self.units -= dropped.min(self.units);
        // The group holding `pos` is still needed.
        let keep = self
            .starts
            .partition_point(|s| s.0 <= pos)
            .saturating_sub(1);
        self.starts.drain(..keep);
    }

    /// Counts a unit kept at `pos`; past [`MOST_UNITS`], drops the older
    /// half.
    #[inline]
    fn counted(&mut self, pos: u64) {
        self.units += 1;
        self.last_unit = self.last_unit.max(pos);
        if self.units > MOST_UNITS {
            self.halve();
        }
    }

    /// Drops the older half of the units (by position).
    #[cold]
    fn halve(&mut self) {
        let span = self.last_unit.saturating_sub(self.placed_from);
        self.forget_below(self.placed_from + (span / 2).max(1));
    }

    /// Where a replay of `partition` from position `base` to `stop`,
    /// keeping what lies below `offset`, reads, unit by unit in the log's
    /// order (its appends of runs wholly at or above `offset` left out:
    /// it would pass them over); `None` when that is not known (a unit
    /// before what is kept, a record not placed in the range): the replay
    /// then reads the log. `unplaced`: the last position of a record not
    /// placed that the caller kept ([`Reach::append_unplaced`]).
    pub(crate) fn units(
        &self,
        partition: i32,
        (base, stop, offset): (u64, u64, i64),
        unplaced: Option<u64>,
    ) -> Option<Vec<Placed>> {
        let unplaced = self.unplaced.max(unplaced);
        if base < self.placed_from || unplaced.is_some_and(|u| u >= base) {
            return None;
        }
        let in_range = |units: &[Unit]| {
            let from = units.partition_point(|u| u.pos < base);
            let to = units.partition_point(|u| u.pos < stop);
            units.get(from..to).unwrap_or_default().to_vec()
        };
        let mut all = in_range(&self.others);
        if let Some(part) = self.index.get(&partition).and_then(|&i| self.parts.get(i)) {
            all.extend(below(&in_range(&part.units), &part.runs, offset));
            all.extend(in_range(&part.touches));
        }
        all.sort_unstable_by_key(|u| u.pos);
        all.dedup();
        all.into_iter()
            .map(|u| {
                let start = if u.pos < self.live_from {
                    0
                } else {
                    let i = self
                        .starts
                        .partition_point(|s| s.0 <= u.pos)
                        .checked_sub(1)?;
                    self.starts.get(i)?.1
                };
                Some(Placed {
                    pos: u.pos,
                    last: u.pos + u64::from(u.more),
                    at: start + u64::from(u.at),
                })
            })
            .collect()
    }

    /// `unit` for `partition` (once: a record touching it through several
    /// keys is one unit).
    fn place(&mut self, partition: i32, unit: Unit) {
        if push_new(&mut self.part(partition).touches, unit) {
            self.counted(unit.pos);
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
    /// `pos`, whose record starts at offset `at` ([`Unit`]); `None` for a
    /// record that is not placed (see the module docs).
    #[inline]
    pub(crate) fn append(&mut self, partition: i32, offset: i64, pos: u64, at: Option<u32>) {
        let Some(at) = at else {
            self.unplaced(pos);
            self.append_unplaced(partition, offset, pos);
            return;
        };
        let at = self.led(at, pos);
        self.counted(pos);
        let part = self.part(partition);
        part.units.push(Unit { pos, more: 0, at });
        add_to_runs(&mut part.runs, offset, pos);
    }

    /// [`Reach::append`] of a record that is not placed, which the caller
    /// keeps ([`Reach::units`] is told).
    #[inline]
    pub(crate) fn append_unplaced(&mut self, partition: i32, offset: i64, pos: u64) {
        add_to_runs(&mut self.part(partition).runs, offset, pos);
    }

    /// A record that may touch any partition, whose last position is
    /// `last`.
    #[inline]
    pub(crate) fn other(&mut self, last: u64) {
        self.other = Some(self.other.map_or(last, |o| o.max(last)));
        if let Some(u) = self.unit()
            && push_new(&mut self.others, u)
        {
            self.counted(u.pos);
        }
    }

    /// A record of another kind than an append or a marker that touches
    /// `partition` alone, whose last position is `last`.
    #[inline]
    pub(crate) fn touch(&mut self, partition: i32, last: u64) {
        let t = &mut self.part(partition).touched;
        *t = Some(t.map_or(last, |o| o.max(last)));
        if let Some(u) = self.unit() {
            self.place(partition, u);
        }
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
            LogOp::Group { kind, arg, members } => self.group(*kind, *arg, *members, last),
            _ => self.other(last),
        }
    }

    /// [`Reach::mark`] for a group record of `kind` and `arg` at `pos`,
    /// followed by `members` records: the members marked next are read as
    /// the whole group.
    pub(crate) fn group(&mut self, kind: GroupKind, arg: i64, members: u32, pos: u64) {
        if let Some(c) = self.current {
            let g = Unit {
                pos: c.pos,
                more: members,
                at: c.at,
            };
            self.open = Some((g, c.pos + u64::from(members)));
        }
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

    /// A replayed operation at `pos` that takes a position (recovery's
    /// replay), the `nth` of its record at offset `at` of its segment: one
    /// partition's append or marker (`one`: its partition and offset, as
    /// replay reads them), or a record of another kind ([`Reach::mark`]).
    /// `placed` is false for an append without batch metadata (see the
    /// module docs); the only records of several operations hold such
    /// appends.
    pub(crate) fn note(
        &mut self,
        (pos, at, nth): (u64, u64, u32),
        op: &LogOp,
        one: Option<(i32, i64)>,
        placed: bool,
    ) {
        if pos < self.from {
            return;
        }
        let at = u32::try_from(at).ok().filter(|_| placed && nth == 0);
        match (one, at) {
            (Some((partition, offset)), at) => self.append(partition, offset, pos, at),
            (None, Some(at)) => self.marking((pos, 0, at), |r| r.mark(pos, op)),
            (None, None) => {
                self.unplaced(pos);
                self.mark(pos, op);
            }
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

/// Of a partition's append and marker `units` (ascending), those a replay
/// keeping what lies below `offset` must read: all but those of a run
/// whose lowest offset is at or above it, which the replay passes over
/// whole (an append at or above the offset changes nothing, and the
/// record taking no position read with it only concerns it). A run holds
/// the positions after the run before it, through its last.
fn below<'a>(units: &'a [Unit], runs: &'a [Run], offset: i64) -> impl Iterator<Item = Unit> + 'a {
    let mut run = runs.iter().peekable();
    units.iter().copied().filter(move |u| {
        while run.next_if(|r| r.last < u.pos).is_some() {}
        run.peek().is_none_or(|r| r.low < offset)
    })
}

/// Pushes `unit` unless it is the last already (a record touching a
/// partition through several keys is one unit); says whether it did.
fn push_new(units: &mut Vec<Unit>, unit: Unit) -> bool {
    let new = units.last() != Some(&unit);
    if new {
        units.push(unit);
    }
    new
}

/// Drops the units (ascending) before position `pos`; returns how many.
fn drop_below(units: &mut Vec<Unit>, pos: u64) -> usize {
    let n = units.partition_point(|u| u.pos < pos);
    units.drain(..n);
    n
}

/// Whether the record of append `r` is placed: not an append without
/// batch metadata, which a kind-1 record may pack with other partitions'
/// (see the module docs). The live store and recovery both ask this.
#[inline]
pub(crate) fn placed(r: &AppendRequest) -> bool {
    r.metadata.is_some()
}

/// Adds an append at `offset` and `pos` to a partition's `runs`.
#[inline]
fn add_to_runs(runs: &mut Vec<Run>, offset: i64, pos: u64) {
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
            r.append(0, i as i64, 10 + 2 * i, Some(0));
            r.append(1, i as i64, 11 + 2 * i, Some(0));
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
        r.append(0, 3, 5000, Some(0));
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
        r.append(0, 5, 10, Some(0));
        r.append(1, 5, 11, Some(0));
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
        r.group(GroupKind::TruncatePartition { partition: 5 }, 3, 0, 40);
        r.group(GroupKind::RemovePartition, 6, 0, 41);
        assert_eq!(
            (r.stop(5, 0, 0), r.stop(6, 0, 0), r.stop(0, 6, 0)),
            (41, 42, 11)
        );
        r.group(GroupKind::Import, 3, 0, 50);
        r.group(GroupKind::Truncate, 3, 0, 51);
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
            r.append(0, i as i64, i, Some(0));
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
            same.append(3, 7, i, Some(0));
        }
        assert_eq!(same.stop(3, 8, 0), appends);
        assert_eq!(same.stop(3, 7, 0), 0);
    }
    #[test]
    fn units_say_where_a_partitions_records_lie() {
        let place = |pos, last, at| Placed { pos, last, at };
        // Recovery read positions 0 to 3 (offsets in their segment), the
        // live store wrote from 4 on, in groups written at 100 and 500.
        let mut r = Reach::new(0);
        r.append(0, 0, 0, Some(20));
        r.append(1, 0, 1, Some(40));
        // A record taking no position before partition 0's second append.
        r.quiet(60, 2);
        r.append(0, 1, 2, Some(70));
        r.live_from(4);
        r.written(4, 100);
        r.append(1, 1, 4, Some(0));
        r.append(0, 2, 5, Some(30));
        // A group of partition 1's truncation whose second member removes
        // a key of partition 0 too: read as the whole group.
        let remove = LogOp::Remove {
            reason: crate::wal::op::RemoveReason::Truncated,
            keys: vec![(crate::id::ProducerId::numeric(1), 0)],
        };
        r.marking((6, 0, 60), |r| {
            r.group(GroupKind::TruncatePartition { partition: 1 }, 0, 2, 6)
        });
        r.marking((7, 0, 80), |r| r.touch(1, 7));
        r.marking((8, 0, 110), |r| r.mark(8, &remove));
        r.written(9, 500);
        // A record that may touch any partition.
        r.marking((9, 1, 8), |r| r.other(10));
        r.append(0, 3, 11, Some(40));
        assert_eq!(
            r.units(0, (0, 12, i64::MAX), None),
            Some(vec![
                place(0, 0, 20),
                place(2, 2, 60),
                place(5, 5, 130),
                place(6, 8, 160),
                place(9, 10, 508),
                place(11, 11, 540),
            ])
        );
        // Partition 1: its own appends and the group it is truncated by.
        assert_eq!(
            r.units(1, (0, 12, i64::MAX), None),
            Some(vec![
                place(1, 1, 40),
                place(4, 4, 100),
                place(6, 8, 160),
                place(9, 10, 508)
            ])
        );
        // From a base, to a stop.
        assert_eq!(
            r.units(0, (3, 9, i64::MAX), None),
            Some(vec![place(5, 5, 130), place(6, 8, 160)])
        );
        // Cut at offset 2: partition 0's appends at offsets 2 and 3 (one
        // run, its lowest offset 0) are still read; a run wholly at or
        // above the cut is not (below).
        assert_eq!(r.units(0, (0, 12, 2), None), r.units(0, (0, 12, 9), None));
        let mut runs = Reach::new(0);
        runs.written(0, 0);
        for i in 0..u64::from(RUN) * 2 {
            runs.append(0, i as i64, i, Some(i as u32));
        }
        let cut = i64::from(RUN);
        let read = runs.units(0, (0, u64::from(RUN) * 2, cut), None).unwrap();
        assert_eq!(read.len(), RUN as usize, "the second run is left out");
        assert_eq!(read.last().map(|u| u.pos), Some(u64::from(RUN) - 1));
        // Nothing is known before what is kept; a record that is not
        // placed in the range makes the replay read the log.
        r.forget_below(5);
        assert_eq!(r.units(0, (2, 12, i64::MAX), None), None);
        assert_eq!(
            r.units(0, (5, 12, i64::MAX), None).map(|u| u.len()),
            Some(4)
        );
        r.unplaced(12);
        assert_eq!(r.units(0, (5, 13, i64::MAX), None), None);
    }
}
