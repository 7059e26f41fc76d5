//! Apache Kafka's producer snapshot files, read and written byte for byte.
//!
//! Kafka's broker writes one `<20-digit offset>.snapshot` file per log
//! segment: the producer state as of that log offset (exclusive). Version 1,
//! all integers big-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 2 | version, `i16`, must be 1 |
//! | 2 | 4 | CRC-32C of bytes 6 to the end of the file, `u32` |
//! | 6 | 4 | entry count, `i32` |
//! | 10 + 46 i | 46 | entry i |
//!
//! Entry: producer id `i64`, epoch `i16`, last sequence `i32`, last offset
//! `i64`, offset delta `i32`, timestamp `i64`, coordinator epoch `i32`,
//! current transaction first offset `i64` (-1: none). Kafka persists only
//! the last batch of each producer. Entry order is the iteration order of
//! the broker's `java.util.HashMap`, which [`sort_in_kafka_order`]
//! reproduces for a map filled in producer id order (files from other
//! histories hold the same entries in another order: compare them as sets).
//!
//! Two ways into a store, for its two semantics:
//!
//! - [`seed_kafka_store`] starts a [`Semantics::Kafka`] store from the files
//!   a Kafka broker left behind, losing nothing (open transactions,
//!   coordinator epochs, marker-only producers, marker timestamps), and
//!   [`export_store`] writes the files back byte for byte;
//! - [`seed_store`] starts a [`Semantics::Strict`] store, each producer one
//!   entry with one retained batch ([`to_entry`]), dropping what the seed
//!   rules have no place for; [`export`] writes a strict store's entries
//!   ([`from_entry`]) as Kafka tooling reads them.
//!
//! [`Semantics::Kafka`]: crate::Semantics::Kafka
//! [`Semantics::Strict`]: crate::Semantics::Strict

#![deny(clippy::indexing_slicing)]

mod export;
mod file;
mod order;
mod seed;

pub use crate::engine::kafka::entry::{KafkaProducerEntry, Unrepresentable};
pub use export::{export, export_store, export_store_with, export_with};
pub use file::{
    ENTRY_LEN, HEADER_LEN, VERSION, decode, encode, file_name, from_entry, parse_file_name, read,
    to_entry,
};
pub use order::sort_in_kafka_order;
pub use seed::{
    SeedReport, SkippedEntry, seed_kafka_store, seed_kafka_store_with, seed_store, seed_store_with,
};
