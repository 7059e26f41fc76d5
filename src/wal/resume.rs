//! Where a segment scan starts, and how much of a preallocated segment's
//! room it reads: a reopen seeks past the records its snapshot covers
//! (docs/format.md, Recovering, step 3) and, after a clean close, reads
//! only the first MiB of the zeros after the records (rule 4).
//! `segment::probe` checks a recorded point before a scan starts there.

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

/// Why a recorded point was not used to start a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The segment's header does not verify, or its records' CRC seed is
    /// not the one recorded: not the segment the point was taken in.
    OtherSegment,
    /// The point lies before the first record or past the file's end.
    OutOfRange,
    /// The bytes there are neither a record that verifies and states that
    /// offset, nor zeros (the end of a preallocated segment's records).
    NoRecord,
}
