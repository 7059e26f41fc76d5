//! Where log positions lie on disk, for a snapshot to record (its log
//! point, docs/format.md): the log writer notes where each group of
//! records it writes ends, and finds a position inside a group by walking
//! that group's records.

use std::collections::VecDeque;
use std::ops::Range;

use super::record;

/// Where a log position lies on disk: in the segment of `first_position`
/// (whose record CRCs are seeded with `seed`), at byte `offset`, where the
/// record of that position starts or will be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentPoint {
    pub first_position: u64,
    pub seed: u32,
    pub offset: u64,
}

/// How many group ends [`Points::pin`] can look back over: a snapshot
/// pins its position right after choosing it, when only the groups being
/// written or fsync'ed meanwhile can have followed it.
const MARKS: usize = 64;

/// The recent group ends and the pinned position.
#[derive(Default)]
pub(crate) struct Points {
    /// Where the last few groups ended (position, point), newest last.
    marks: VecDeque<(u64, SegmentPoint)>,
    /// The position a snapshot asked about.
    pin: Option<Pin>,
}

/// A pinned position: waiting for the group that holds it, or looked up
/// (`None`: it lies inside a record, or no group of this writer ended at
/// it).
#[derive(Clone, Copy)]
enum Pin {
    Waiting(u64),
    Known(u64, Option<SegmentPoint>),
}

impl Points {
    /// Starts following where position `p` lies on disk (the writer has
    /// written every position below `written`). Known at once if a recent
    /// group ended at `p`; else found when the group holding `p` is
    /// written. A position no group of this writer ended at or held (the
    /// log resumed there, or the group was written too long ago) is not
    /// known: the snapshot then records no point.
    ///
    /// The point is where the record after position `p - 1`'s starts: a
    /// record that takes no position (a clock, an unknown-producer marker)
    /// is written in the same group as the append it precedes, never at a
    /// group's end, so the point is also where replay from `p` starts.
    pub(crate) fn pin(&mut self, p: u64, written: u64) {
        self.pin = Some(if p <= written {
            Pin::Known(p, self.marked(p))
        } else {
            Pin::Waiting(p)
        });
    }

    /// Where the pinned position `p` lies on disk, if known; unpins.
    pub(crate) fn take_pin(&mut self, p: u64) -> Option<SegmentPoint> {
        match self.pin.take() {
            Some(Pin::Known(pinned, point)) if pinned == p => point,
            _ => None,
        }
    }

    /// The recent group end at position `p`, if there is one.
    fn marked(&self, p: u64) -> Option<SegmentPoint> {
        let found = self.marks.iter().rev().find(|(end, _)| *end == p);
        found.map(|m| m.1)
    }

    /// Notes a group just written: `buf`, its sealed records, holding
    /// `positions` at `bytes` of the segment `(first position, seed)`.
    pub(crate) fn written(
        &mut self,
        buf: &[u8],
        layout: record::Layout,
        (first_position, seed): (u64, u32),
        positions: Range<u64>,
        bytes: Range<u64>,
    ) {
        let point = |offset| SegmentPoint {
            first_position,
            seed,
            offset,
        };
        if self.marks.len() == MARKS {
            self.marks.pop_front();
        }
        self.marks.push_back((positions.end, point(bytes.end)));
        let Some(Pin::Waiting(p)) = self.pin else {
            return;
        };
        if p > positions.end {
            return;
        }
        let found = if p > positions.start {
            offset_of(buf, seed, layout, (bytes.start, positions.start), p).map(point)
        } else {
            self.marked(p)
        };
        self.pin = Some(Pin::Known(p, found));
    }
}

/// In `buf`, sealed records written at byte `start` whose first position
/// is `pos`: the byte where the record after position `p - 1`'s starts
/// (`None` if `p` lies inside a record, or a record does not decode).
fn offset_of(
    buf: &[u8],
    seed: u32,
    layout: record::Layout,
    (start, pos): (u64, u64),
    p: u64,
) -> Option<u64> {
    let (mut at, mut n) = (0usize, pos);
    while n < p {
        let d = record::decode(buf.get(at..)?, seed, layout, start + at as u64).ok()?;
        n += d.ops.filter(|op| op.takes_position()).count() as u64;
        at += d.len;
    }
    (n == p).then_some(start + at as u64)
}
