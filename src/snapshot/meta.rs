//! The store-level state beside the keys: what replay needs besides each
//! key's entry to reach exactly the live store's state, and what a
//! snapshot (version 3) stores in its store section.

#![deny(clippy::indexing_slicing)]

use super::ends::Ends;
use crate::codec::{Dec, Put};
use crate::engine::filter::RemovedFilter;
use crate::error::Corruption;

/// The store-level state (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    /// The last clock reading logged (0 before any): an append without a
    /// timestamp of its own takes it as its key's activity.
    pub clock: i64,
    /// The highest offset of any append in the history (a batch's offset,
    /// a single-sequence append's position), lowered to `offset - 1` by
    /// `truncate_to(offset)`; -1 before any. One past it is the log's end
    /// for truncation, and a snapshot whose `high` is below an offset can
    /// be a truncation's base.
    pub high: i64,
    /// Each partition's highest offset (version 5; derived lower bounds
    /// from an older snapshot's keys).
    pub ends: Ends,
    /// Keys whose state expired or was evicted, remembered approximately.
    pub filter: RemovedFilter,
    /// Under [`Semantics::Kafka`](crate::Semantics::Kafka), the whole
    /// Kafka-mode state (compact map, side table, transactions): the store
    /// runs Kafka's rules on it in log order, and a snapshot captures it
    /// with the store section (docs/transactions.md, "The durable store"). `None`
    /// under the strict rules, whose keys are the store's shards.
    pub kafka: Option<Box<crate::engine::ProducerStateManager>>,
}

impl PartialEq for Meta {
    /// The store-level fields (a Kafka-mode state is compared by the
    /// caller, through its views).
    fn eq(&self, other: &Meta) -> bool {
        (self.clock, self.high, &self.ends, &self.filter)
            == (other.clock, other.high, &other.ends, &other.filter)
            && self.kafka.is_some() == other.kafka.is_some()
    }
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            clock: 0,
            high: -1,
            ends: Ends::default(),
            filter: RemovedFilter::default(),
            kafka: None,
        }
    }
}

/// The highest offset of a state loaded from a snapshot older than
/// version 3, which did not record it: unknown, so as high as can be (such
/// a snapshot is never a truncation's base; a truncation sets it).
pub(crate) const UNKNOWN_HIGH: i64 = i64::MAX - 1;

impl Meta {
    /// The store-level state of a state loaded from a snapshot of version
    /// 1 or 2: the log clock of a new store, an unknown highest offset, no
    /// removed keys.
    pub(crate) fn legacy() -> Meta {
        Meta {
            high: UNKNOWN_HIGH,
            ends: Ends::derived([]),
            ..Meta::default()
        }
    }

    /// Appends the store section of a version-3 snapshot: its length
    /// (`u32`, the bytes after it), then the fields.
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.put_u32(0);
        buf.put_i64(self.clock);
        buf.put_i64(self.high);
        super::filter::encode(&self.filter, buf);
        self.ends.encode(buf);
        let len = (buf.len() - start - 4) as u32;
        crate::codec::set_u32(buf, start, len);
    }

    /// Decodes a store section of a snapshot of `version` (after its
    /// length field): exactly `bytes`. Before version 5 the partition ends
    /// are not there: they are marked as lower bounds, to be derived from
    /// the keys once they are loaded.
    pub(crate) fn decode(bytes: &[u8], version: u16) -> Result<Meta, Corruption> {
        let mut d = Dec::new(bytes);
        let short = || Corruption::BadField("store section (too short)");
        let clock = d.i64().ok_or_else(short)?;
        let high = d.i64().ok_or_else(short)?;
        let filter = super::filter::decode(&mut d)?;
        let ends = if version >= super::header::VERSION_5 {
            Ends::decode(&mut d)?
        } else {
            Ends::derived([])
        };
        if d.remaining() != 0 {
            return Err(Corruption::TrailingBytes(d.remaining() as u64));
        }
        Ok(Meta {
            clock,
            high,
            ends,
            filter,
            kafka: None,
        })
    }
}
