//! How far into the log a partition's truncation must read.
//!
//! A partition's truncation replays the log after its base for that
//! partition alone, and what it keeps of the partition is its appends and
//! markers below the cut, and whatever else can touch the partition:
//! removals, groups (truncations, imports, partition removals), forgotten
//! aborts, partition states. Nothing after the last such record can change
//! the result, so the replay may stop there instead of at the log's end.
//! In a store shared by many partitions that is most of the log: a
//! partition cut at its middle has its appends below the cut in the first
//! half of the log after the base, and only its appends above the cut,
//! which the replay drops, in the rest.
//!
//! [`Reach`] keeps, per partition, the lowest offset appended in runs of
//! its appends (each run: its last position and lowest offset), and the
//! position of the last record of any other kind, from the position it
//! started at (the log's position at open, or recovery's replay start)
//! on. It is kept in memory only: recovery rebuilds it from what it
//! replays, and before its start nothing is known, so a replay reads at
//! least that far. Runs are merged in pairs when a partition has
//! [`MOST_RUNS`], so its memory stays below about 1 KiB per partition,
//! and the answer coarsens only for the oldest appends.

use std::collections::HashMap;

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

/// What a partition's truncation must read (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Reach {
    /// Positions from here on are known.
    from: u64,
    /// The last position of a record that is not one partition's append
    /// or marker.
    other: Option<u64>,
    /// Each partition's runs, found through `index`; the last partition
    /// appended to is remembered, so that appends of one partition in a
    /// row (a batch of them, one busy partition) skip the hash lookup.
    runs: Vec<Vec<Run>>,
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

    /// An append or a marker of `partition` at `offset`, at log position
    /// `pos`.
    #[inline]
    pub(crate) fn append(&mut self, partition: i32, offset: i64, pos: u64) {
        let i = match self.last {
            Some((p, i)) if p == partition => i,
            _ => {
                let next = self.runs.len();
                let i = *self.index.entry(partition).or_insert(next);
                if i == next {
                    self.runs.push(Vec::new());
                }
                self.last = Some((partition, i));
                i
            }
        };
        let Some(runs) = self.runs.get_mut(i) else {
            // Not reached (every index has its runs); if it were, every
            // partition would read through this position: never too short.
            self.other(pos);
            return;
        };
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

    /// A record of another kind, whose last position is `last`.
    #[inline]
    pub(crate) fn other(&mut self, last: u64) {
        self.other = Some(self.other.map_or(last, |o| o.max(last)));
    }

    /// A replayed record at `pos` that takes a position: one partition's
    /// append or marker (its partition and offset, as replay reads them),
    /// or `None` for any other kind (recovery's replay).
    pub(crate) fn note(&mut self, pos: u64, one: Option<(i32, i64)>) {
        if pos < self.from {
            return;
        }
        match one {
            Some((partition, offset)) => self.append(partition, offset, pos),
            None => self.other(pos),
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
        if let Some(r) = self
            .index
            .get(&partition)
            .and_then(|&i| self.runs.get(i))
            .and_then(|runs| runs.iter().rev().find(|r| r.low < offset))
        {
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
        let runs = &r.runs[r.index[&0]];
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
