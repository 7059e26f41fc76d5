//! The views of paths that hold no store of their own (exit code 5): a
//! broker directory, with the stores it names (each inspected with
//! `--all`), and a Kafka log segment, recognised and not read.

use std::io;
use std::path::Path;

use crate::dir;
use crate::filter::{Filter, Show};
use crate::place;
use crate::view::{NotAStore, Output, Unreadable, verdict_word};

/// A broker directory: the stores it names, each inspected with `--all`.
pub(crate) fn broker(
    path: &Path,
    b: place::Broker,
    all: bool,
    out: &mut Output,
    show: &Show<'_>,
) -> Result<(), Unreadable> {
    *out = match b.data {
        true => Output::new(path, "broker_data_directory", "broker data directory"),
        false => Output::new(
            path,
            "broker_partition_directory",
            "broker partition directory",
        ),
    };
    out.stores = Some(b.stores.iter().map(|p| p.display().to_string()).collect());
    out.partition_key = b.key.as_ref().map(|k| k.1);
    if !all {
        out.not_a_store(NotAStore::Broker);
        return Ok(());
    }
    // A partition's keys in the shared state: those of its key, unless
    // --partition asks for others.
    let own = b.key.as_ref().filter(|_| show.filter.partition.is_none());
    let keyed = own.map(|(_, k)| Filter {
        producer: show.filter.producer.clone(),
        kafka_producer: show.filter.kafka_producer,
        partition: Some(*k),
    });
    for store in &b.stores {
        let mut o = Output::new(store, "store", "");
        match (own, &keyed) {
            (Some((shared, _)), Some(filter)) if shared == store => {
                let show = Show { filter, ..*show };
                dir::inspect(store, &mut o, &show)?;
            }
            _ => dir::inspect(store, &mut o, show)?,
        }
        if o.not_a_store.is_none() {
            o.verdict = verdict_word(o.code);
        }
        out.inspected.push(o);
    }
    // The worst verdict of the stores that hold one; none: nothing verified.
    let worst = out
        .inspected
        .iter()
        .filter(|o| o.not_a_store.is_none())
        .map(|o| o.code)
        .max();
    match worst {
        Some(v) => out.code = v,
        None => out.not_a_store(NotAStore::Broker),
    }
    Ok(())
}

/// A Kafka log segment, by its name (`<20 digits>.log`) or by its first
/// record batch (magic 2, and a CRC-32C that verifies): recognised, not
/// read. False for anything else.
pub(crate) fn kafka_log(path: &Path, out: &mut Output) -> io::Result<bool> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(place::is_log_name);
    let first = place::first_batch(path)?;
    if !named && !first.as_ref().is_some_and(|b| b.crc_ok) {
        return Ok(false);
    }
    *out = Output::new(path, "kafka_log_segment", "");
    out.format = match &first {
        Some(b) => {
            out.position = u64::try_from(b.base_offset).ok();
            format!(
                "Kafka log segment: record batches (magic 2); the first at offset {}, {} bytes, its CRC-32C {}",
                b.base_offset,
                b.len,
                if b.crc_ok {
                    "verifies"
                } else {
                    "does not verify"
                }
            )
        }
        None => "Kafka log segment, by its name (no record batch at its start)".into(),
    };
    out.not_a_store(NotAStore::KafkaLog);
    Ok(true)
}
