//! The write-ahead log: append-only segment files of self-delimiting,
//! checksummed records, one per accepted append.
//!
//! Records carry no explicit position: a segment's file name and header give
//! the log position (LSN) of its first record and each record is the next.
//! Every record states, besides its own length, CRC and kind, how far it
//! sits from the start of the write it was part of. That one field is what
//! lets recovery tell a crash from damage: a torn or half-persisted last
//! write leaves bad bytes followed only by records of that same write,
//! while damage in the middle of the log is followed by records of later
//! writes. See docs/format.md.

pub(crate) mod record;
pub(crate) mod segment;
pub(crate) mod writer;
