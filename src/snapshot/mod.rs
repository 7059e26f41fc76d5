//! Snapshot files: the whole state at one log position, checksummed.
//!
//! A snapshot is written as `<position>.snap.tmp`, streamed entry by entry
//! (the writer never holds a second copy of the state), its header filled in
//! last, fsync'ed, renamed to `<position>.snap`, and the directory fsync'ed.
//! The reader streams too and verifies the CRC over every byte before the
//! caller may use what it decoded. The layout is in docs/format.md.
//!
//! Version 4 frames the entries in blocks, each of one shard's keys with
//! its entry count and byte length: a reader can hand a whole block to
//! another thread (which owns that shard's table) without decoding it
//! first, so loading a big file uses two cores (`loader.rs`), and a block
//! is decoded where its keys are inserted.
//!
//! The folder: `header.rs` (the header and the layout's constants),
//! `write.rs` and `read.rs` (the file, streamed), `entry.rs` (one key's
//! entry, shared with the log's key-state records and the partition
//! export), `meta.rs` (the store section) with `filter.rs` (its removed-key
//! filter), `kafka.rs` (the Kafka section,
//! shared with the log's partition-state records), `export.rs` (a
//! partition's export, its bytes and the engine's export and import) and
//! `engine.rs` (the in-memory engine's state as snapshot bytes). The
//! format sits above the engine: it encodes engine types, and the engine
//! knows no bytes.

pub(crate) mod ends;
mod engine;
pub(crate) mod entry;
pub(crate) mod export;
mod filter;
mod header;
pub(crate) mod kafka;
pub(crate) mod meta;
mod read;
#[cfg(test)]
mod tests;
mod write;

pub(crate) use header::{
    HEADER_LEN, Header, LogPoint, MAGIC, POSITION_AT, UNSHARDED, VERSION_4, VERSION_5, parse_header,
};
pub(crate) use read::{
    Block, Prelude, Sink, load_block, read, read_blocks, read_kafka, read_meta, read_prelude,
    read_rest,
};
pub(crate) use write::{Blocks, Writer};
