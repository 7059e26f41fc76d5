//! Where a segment scan starts, and how much of a preallocated segment's
//! room it reads: a reopen seeks past the records its snapshot covers
//! (docs/format.md, Recovering, step 3) and, after a clean close, reads
//! only the first MiB of the zeros after the records (rule 4).
//! `segment::probe` checks a recorded point before a scan starts there.

use std::fmt;

/// Where a scan starts, and how much of a preallocated segment's room it
/// reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScanFrom {
    /// Start at this record instead of the first (after `segment::probe`
    /// has accepted it): the records before it are neither read nor counted
    /// by the scan's `each`, but they count in `segment::Scan::records`.
    pub resume: Option<Resume>,
    /// When the records end in zeros right after a close marker, read at
    /// most [`ROOM_CHECKED`] bytes of them (the rest is taken as the zeros
    /// it was given: docs/format.md, "What recovery can and cannot
    /// detect"). Otherwise the zeros are read to the end of the file.
    pub bounded_room_after_close: bool,
    /// A replay of this partition alone: records that hold one operation
    /// on another partition ([`super::record::pass_over`]) are passed
    /// over by their length once their checksum holds, counted but neither
    /// decoded nor handed to the scan's `each`, so that a partition's
    /// truncation costs what its own records cost more than what the
    /// others' do. Not inside
    /// a group (its members are read whole), and not right after an
    /// accepted-unknown record (it belongs to the next append).
    pub only_partition: Option<i32>,
    /// End the scan, clean, at the first record outside a group whose
    /// position is at or past this one: what lies after it cannot change
    /// what the caller rebuilds (a partition's truncation,
    /// `recovery::reach`).
    pub stop_at: Option<u64>,
}

/// A record to start a scan at: its byte offset, and the positions of
/// the segment's records before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resume {
    pub offset: u64,
    pub records: u64,
}

/// The most bytes of a preallocated segment's room after a close marker
/// that a scan with [`ScanFrom::bounded_room_after_close`] reads.
pub(crate) const ROOM_CHECKED: u64 = 1 << 20;

/// Why replay did not seek to the offset a snapshot recorded (a
/// snapshot's log point): what `segment::probe` found there.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekFallback {
    /// The segment under that name is not the one the snapshot was taken
    /// with (its records' CRC seed differs), or its header does not verify.
    OtherSegment,
    /// The offset lies before the first record or past the file's end.
    OutOfRange,
    /// No record that verifies and states that offset lies there, and the
    /// bytes there are not the zeros of a preallocated segment's end.
    NoRecord,
}

impl fmt::Display for SeekFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SeekFallback::OtherSegment => "the segment is not the one the snapshot was taken with",
            SeekFallback::OutOfRange => "the offset lies outside the segment's records",
            SeekFallback::NoRecord => "no record lies at the offset",
        })
    }
}
