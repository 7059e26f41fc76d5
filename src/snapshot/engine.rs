//! The in-memory engine's whole state as a snapshot file's bytes, and
//! back: [`ProducerStateManager::encode_snapshot`] and
//! [`ProducerStateManager::decode_snapshot`]. They are the engine's
//! methods but the snapshot format's code, so they live with the format
//! and the engine knows no bytes.

use std::path::Path;

use super::meta::Meta;
use super::read::read_kafka;
use super::write::encode_to_vec;
use crate::engine::ProducerStateManager;
use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::map::StateMap;
use crate::error::{Corruption, Error, Result};
use crate::id::ProducerId;
#[cfg(doc)]
use crate::semantics::Semantics;

impl ProducerStateManager {
    /// The whole state as a snapshot in the crate's own checksummed format
    /// (docs/format.md, "Snapshot files"), byte for byte what the durable
    /// store writes to `<position>.snap`, stating `position` in its header.
    ///
    /// For a caller that keeps or ships the state by other means, such as a
    /// replicated state machine building a snapshot at its applied log
    /// index. [`ProducerStateManager::decode_snapshot`] reads it back, and
    /// so do the store's recovery and the `inspect-snapshot` tool when the
    /// bytes are saved under the store's file name.
    ///
    /// ```
    /// use producer_state::{AppendOutcome, ProducerStateManager};
    ///
    /// let mut mgr = ProducerStateManager::new();
    /// mgr.append(7u64, 0, 0, 0);
    /// let bytes = mgr.encode_snapshot(42)?;
    /// let (position, copy) = ProducerStateManager::decode_snapshot("transfer", &bytes)?;
    /// assert_eq!((position, copy.get(7u64, 0)), (42, mgr.get(7u64, 0)));
    /// # Ok::<(), producer_state::Error>(())
    /// ```
    ///
    /// Under [`Semantics::Kafka`] the snapshot's header says so (flag bit
    /// 0) and a Kafka section holds the side table and the aborted
    /// transactions (docs/format.md); [`ProducerStateManager::decode_snapshot`]
    /// gives back a Kafka-mode engine with the same state.
    ///
    /// # Errors
    ///
    /// None today; a `Result` so that a state the format cannot hold is an
    /// error, never a file that loses it.
    pub fn encode_snapshot(&self, position: u64) -> Result<Vec<u8>> {
        // The engine keeps no clock: a key's activity is its newest
        // batch's timestamp, as for a file written before activity existed.
        Ok(encode_to_vec(
            position,
            &Meta::default(),
            self.kafka_side(),
            self.compact_entries(),
        ))
    }

    /// Reads a snapshot made by [`ProducerStateManager::encode_snapshot`]
    /// (or a store's snapshot file) into a fresh engine, with the position
    /// its header states.
    ///
    /// Nothing is returned unless every check passes: magic, version,
    /// lengths, every entry, the CRC over every byte and the entry count.
    /// `source` names the bytes in errors (a path, or any label such as
    /// "snapshot from node 2").
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming `source` and the byte offset of the first
    /// damage (also for a key stated twice), or
    /// [`Error::UnsupportedVersion`]. Never a panic, whatever the bytes.
    pub fn decode_snapshot(source: impl AsRef<Path>, bytes: &[u8]) -> Result<(u64, Self)> {
        let source = source.as_ref();
        let mut map = StateMap::default();
        let read = |id: ProducerId, partition, entry: ProducerEntry, _activity| {
            if map.insert_new_hashed(HashedKey::new(&id, partition), &entry, ()) {
                Ok(())
            } else {
                Err(Error::corrupt(source, 0, Corruption::DuplicateKey))
            }
        };
        let (header, _meta, kafka) = read_kafka(source, bytes, bytes.len() as u64, read)?;
        if let Some(k) = &kafka
            && let Some((id, p, _)) = k.side().find(|(id, p, _)| map.get(id, *p).is_some())
        {
            let _ = (id, p);
            return Err(Error::corrupt(source, 0, Corruption::DuplicateKey));
        }
        Ok((
            header.position,
            ProducerStateManager::from_parts(map, kafka),
        ))
    }
}
