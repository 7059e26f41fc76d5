//! The write-ahead log: append-only segment files of self-delimiting,
//! checksummed records: accepted appends and, from format version 5, the
//! lifecycle operations (clock readings, removals, atomic groups of key
//! states) that replay must repeat rather than decide again.
//!
//! Records carry no log position: a segment's file name and header give
//! the log position of its first record and each record is the next.
//! What ties a record to its place is its byte offset, which it states and
//! its checksum covers (version 3), and the segment's salt and store id,
//! which seed that checksum: a record missing, moved or repeated leaves
//! the next one away from the offset it states, and a record of another
//! segment, store or earlier use of the file never verifies.
//! Every record states, besides its own length, CRC and kind, how far past
//! the segment's durable end (the bytes known to be fsync'ed) it was
//! written. That one field is what lets recovery tell a crash from damage:
//! a crash can only damage bytes that were never fsync'ed, and every record
//! written after those bytes were durable says so. Damage followed only by
//! records written while it was still unsynced is a torn tail (a write cut
//! short, sectors persisted out of order, or several buffered writes of
//! which the OS persisted some); damage followed by a record written after
//! it was durable is damage in the middle of the log. See docs/format.md.

pub(crate) mod frame;
pub(crate) mod op;
pub(crate) mod points;
mod prefix_crc;
pub(crate) mod record;
pub(crate) mod resume;
pub(crate) mod segment;
pub(crate) mod txn_op;
mod window;
pub(crate) mod writer;
