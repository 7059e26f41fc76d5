//! What a Raft entry carries, what applying it answers, and its bytes.
//!
//! A [`Command`] is the raw request: the leader does not classify it. Every
//! replica classifies it when it applies the committed entry (design A of
//! the notes: a deterministic state machine), so all replicas compute the
//! same outcome from the same log, and the leader answers the client with
//! the outcome of its own apply. The offset of an accepted append is not
//! chosen by anyone: it is the append's place in the replicated log
//! ([`offset_of`]), the same on every replica and never reused.
//!
//! Lifecycle operations are commands too ([`Command::Expire`],
//! [`Command::RemovePartition`], [`Command::ImportPartition`]): whatever
//! they decide is decided by the proposer and carried in the entry (the
//! expiration's time above all), never taken from a replica's clock or
//! memory, so every replica removes or adds exactly the same keys
//! (docs/scaling.md, "Lifecycle operations"). Each kind has its own tag in
//! [`Command::encode`]; tags are only ever added (docs/format.md).

use producer_state::{
    AppendRequest, Batch, BatchMetadata, BatchOutcome, PartitionExport, ProducerId,
    ProducerStateManager,
};
use serde::{Deserialize, Serialize};

/// The most appends one entry may carry: an append's slot in its entry is
/// the low 16 bits of its offset.
pub const MAX_APPENDS_PER_ENTRY: usize = 1 << 16;

/// The most bytes one command may take encoded (docs/format.md): 16 MiB,
/// about 500,000 appends of numeric producers. The Raft log reads records
/// of at most this plus the entry's head, so a command that passes
/// [`Command::validate`] can always be read back; a larger one is refused
/// before it is proposed, where without the bound one could be written,
/// acknowledged, and then refused as damage at the next open.
pub const MAX_COMMAND_BYTES: usize = 16 << 20;

/// The offset given to the append in slot `slot` of the entry at Raft log
/// index `index`: `index * 2^16 + slot`. Unique over the whole log, growing
/// in log order, and the same on every replica; `None` past `i64::MAX`
/// (log index 2^47, which no log reaches).
pub fn offset_of(index: u64, slot: usize) -> Option<i64> {
    if slot >= MAX_APPENDS_PER_ENTRY {
        return None;
    }
    let off = index
        .checked_mul(MAX_APPENDS_PER_ENTRY as u64)?
        .checked_add(slot as u64)?;
    i64::try_from(off).ok()
}

/// Who produces: Kafka's numeric producer id, or a name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Producer {
    /// A broker-assigned producer id.
    Id(u64),
    /// A named producer (at most 65,535 bytes of UTF-8).
    Name(String),
}

impl From<u64> for Producer {
    fn from(id: u64) -> Self {
        Producer::Id(id)
    }
}

impl From<&str> for Producer {
    fn from(name: &str) -> Self {
        Producer::Name(name.to_string())
    }
}

impl Producer {
    fn to_id(&self) -> ProducerId {
        match self {
            Producer::Id(n) => ProducerId::numeric(*n),
            Producer::Name(s) => ProducerId::named(s),
        }
    }
}

/// One append as the client sends it, before anyone classified it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Append {
    /// Who is producing.
    pub producer: Producer,
    /// To which partition.
    pub partition: i32,
    /// The producer's epoch.
    pub epoch: i16,
    /// First sequence of the request.
    pub first_sequence: i32,
    /// Last sequence (equal to the first for a single append).
    pub last_sequence: i32,
    /// `Some(timestamp)` for a batch, whose offset and timestamp are
    /// retained to answer its retries; `None` for a single-sequence append
    /// (`ProducerStateManager::append`), which retains neither.
    pub timestamp: Option<i64>,
}

impl Append {
    /// A single-sequence append.
    pub fn single(
        producer: impl Into<Producer>,
        partition: i32,
        epoch: i16,
        sequence: i32,
    ) -> Self {
        Append {
            producer: producer.into(),
            partition,
            epoch,
            first_sequence: sequence,
            last_sequence: sequence,
            timestamp: None,
        }
    }

    /// A batch of sequences `first..=last` with its timestamp.
    pub fn batch(
        producer: impl Into<Producer>,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        timestamp: i64,
    ) -> Self {
        Append {
            producer: producer.into(),
            partition,
            epoch,
            first_sequence: first,
            last_sequence: last,
            timestamp: Some(timestamp),
        }
    }

    /// The engine's request for this append at `offset`.
    fn request(&self, offset: i64) -> AppendRequest {
        match self.timestamp {
            Some(ts) => AppendRequest::batch(
                self.producer.to_id(),
                self.partition,
                self.epoch,
                Batch::new(self.first_sequence, self.last_sequence, offset, ts),
            ),
            // A single append has one sequence; a "single" whose sequences
            // differ can only come from a hand-built value, and is classified
            // as a batch without a timestamp.
            None if self.first_sequence == self.last_sequence => AppendRequest::single(
                self.producer.to_id(),
                self.partition,
                self.epoch,
                self.first_sequence,
            ),
            None => AppendRequest::batch(
                self.producer.to_id(),
                self.partition,
                self.epoch,
                Batch::new(self.first_sequence, self.last_sequence, offset, 0),
            ),
        }
    }
}

/// The payload of one Raft entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Command {
    /// One append (single-sequence or batch).
    Append(Append),
    /// Several appends classified in order as one entry: a produce request
    /// for many partitions, like the store's `append_all`. One Raft round
    /// and one log fsync for the whole group.
    AppendAll(Vec<Append>),
    /// Forgets every producer whose newest batch's timestamp is
    /// `expiration_ms` or more before `now_ms`
    /// (`ProducerStateManager::expire_producers`; a key whose newest append
    /// carried no timestamp never expires). The time is chosen once, by
    /// whoever proposes the entry (`Cluster::expire` reads its clock), and
    /// every replica applies that time: none reads a clock while applying.
    /// Answered with [`LifecycleOutcome::Expired`].
    Expire {
        /// "Now", in milliseconds since the Unix epoch, as the proposer saw it.
        now_ms: i64,
        /// How long a producer may be silent (not negative).
        expiration_ms: i64,
    },
    /// Forgets every producer of the partition (it moved to another group
    /// or was deleted). Answered with [`LifecycleOutcome::PartitionRemoved`].
    RemovePartition {
        /// The partition.
        partition: i32,
    },
    /// Adds a partition's producers, as another group (or a store)
    /// exported them: the bytes of a [`PartitionExport`]
    /// ([`Command::import_partition`] makes one). Answered with
    /// [`LifecycleOutcome::Imported`], or
    /// [`LifecycleOutcome::ImportRefused`] (nothing added) when a key of
    /// the export already has another state here.
    ImportPartition {
        /// [`PartitionExport::to_bytes`], checksummed.
        export: Vec<u8>,
    },
}

impl Command {
    /// The command that imports `export` (a partition moved here).
    pub fn import_partition(export: &PartitionExport) -> Command {
        Command::ImportPartition {
            export: export.to_bytes(),
        }
    }

    /// The appends of the command, in the order they are classified (none
    /// for a lifecycle command).
    pub fn appends(&self) -> &[Append] {
        match self {
            Command::Append(a) => std::slice::from_ref(a),
            Command::AppendAll(v) => v,
            Command::Expire { .. }
            | Command::RemovePartition { .. }
            | Command::ImportPartition { .. } => &[],
        }
    }

    /// True for appends (one or a group), which a `Proposer` may batch with
    /// others; false for a lifecycle command, which is an entry of its own.
    pub fn is_append(&self) -> bool {
        matches!(self, Command::Append(_) | Command::AppendAll(_))
    }

    /// The length of [`Command::encode`]'s bytes, computed without
    /// encoding.
    pub fn encoded_len(&self) -> usize {
        let head = match self {
            Command::Append(_) => 1,
            Command::AppendAll(_) => GROUP_HEAD,
            Command::Expire { .. } => 1 + 8 + 8,
            Command::RemovePartition { .. } => 1 + 4,
            Command::ImportPartition { export } => 1 + 4 + export.len(),
        };
        head + self.appends_len()
    }

    /// The bytes of the command's appends, without its head: what they add
    /// to a group they join.
    pub(crate) fn appends_len(&self) -> usize {
        self.appends().iter().map(Append::encoded_len).sum()
    }
}

/// The bytes of an `AppendAll` before its appends: tag and count.
pub(crate) const GROUP_HEAD: usize = 5;

/// What one append came to on the replica that applied it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// New data, now at `offset` (see [`offset_of`]).
    Accepted {
        /// The offset this append was given.
        offset: i64,
    },
    /// A retry of data already accepted: the original offset and timestamp
    /// when still retained (a batch among its key's last five).
    Duplicate {
        /// The original append's offset and timestamp.
        original: Option<(i64, i64)>,
    },
    /// Rejected: a gap, a sequence not valid here. The engine's reason.
    OutOfOrder {
        /// The reason, as the engine words it.
        reason: String,
    },
    /// An epoch older than the one on file.
    FencedEpoch {
        /// The epoch on file.
        current_epoch: i16,
    },
}

impl Outcome {
    /// `ACCEPTED`, `DUPLICATE`, `OUT_OF_ORDER` or `FENCED_EPOCH`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. } => "ACCEPTED",
            Outcome::Duplicate { .. } => "DUPLICATE",
            Outcome::OutOfOrder { .. } => "OUT_OF_ORDER",
            Outcome::FencedEpoch { .. } => "FENCED_EPOCH",
        }
    }

    fn from_engine(o: BatchOutcome, offset: i64) -> Outcome {
        match o {
            BatchOutcome::Accepted => Outcome::Accepted { offset },
            BatchOutcome::Duplicate { original } => Outcome::Duplicate {
                original: original.map(|BatchMetadata { offset, timestamp }| (offset, timestamp)),
            },
            BatchOutcome::OutOfOrder { reason } => Outcome::OutOfOrder {
                reason: reason.to_string(),
            },
            BatchOutcome::FencedEpoch { current_epoch } => Outcome::FencedEpoch { current_epoch },
            other => Outcome::OutOfOrder {
                reason: format!("{other:?}"),
            },
        }
    }
}

/// What a lifecycle command came to on the replica that applied it (the
/// same on every replica).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifecycleOutcome {
    /// [`Command::Expire`]: this many keys expired.
    Expired {
        /// Keys forgotten.
        keys: u64,
    },
    /// [`Command::RemovePartition`]: this many keys were the partition's.
    PartitionRemoved {
        /// Keys forgotten.
        keys: u64,
    },
    /// [`Command::ImportPartition`]: the state now holds every key of the
    /// export as exported, this many. A retry of an import that was
    /// applied finds every key as exported and is answered the same,
    /// adding nothing.
    Imported {
        /// Keys of the export.
        keys: u64,
    },
    /// [`Command::ImportPartition`] refused, nothing added: a key of the
    /// export has another state here (remove the partition first if the
    /// import is meant to replace it), or the bytes are not an export.
    ImportRefused {
        /// Why, as the engine words it.
        reason: String,
    },
}

/// The answer to one entry: one outcome per append, in order, or what a
/// lifecycle command did. Entries that carry no command (Raft's blank and
/// membership entries) answer an empty list and no lifecycle outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// One outcome per append of the command (empty for a lifecycle
    /// command).
    pub outcomes: Vec<Outcome>,
    /// What a lifecycle command did; `None` for appends.
    #[serde(default)]
    pub lifecycle: Option<LifecycleOutcome>,
}

/// Classifies every append of `command`, the entry at log `index`, against
/// `mgr`, in order. Deterministic: the same state and the same entry give
/// the same outcomes and the same new state on every replica.
pub fn apply(mgr: &mut ProducerStateManager, index: u64, command: &Command) -> Response {
    if let Some(done) = apply_lifecycle(mgr, command) {
        return Response {
            outcomes: Vec::new(),
            lifecycle: Some(done),
        };
    }
    let outcomes = command
        .appends()
        .iter()
        .enumerate()
        .map(|(slot, a)| {
            // Commands with too many appends are refused before they are
            // proposed (`Command::validate`); one that comes from the log
            // anyway is rejected whole, identically on every replica.
            let Some(offset) = offset_of(index, slot) else {
                return Outcome::OutOfOrder {
                    reason: "the entry holds more appends than offsets can number".into(),
                };
            };
            Outcome::from_engine(mgr.append_request(&a.request(offset)), offset)
        })
        .collect();
    Response {
        outcomes,
        lifecycle: None,
    }
}

/// A lifecycle command against `mgr` (`None` for appends): deterministic,
/// from the command alone (no clock, no memory size, nothing of the
/// replica's own).
fn apply_lifecycle(mgr: &mut ProducerStateManager, command: &Command) -> Option<LifecycleOutcome> {
    Some(match command {
        Command::Expire {
            now_ms,
            expiration_ms,
        } => LifecycleOutcome::Expired {
            // Never an error (the replicas run the seed rules).
            keys: mgr.expire_producers(*now_ms, *expiration_ms).unwrap_or(0) as u64,
        },
        Command::RemovePartition { partition } => LifecycleOutcome::PartitionRemoved {
            keys: mgr.remove_partition(*partition) as u64,
        },
        Command::ImportPartition { export } => {
            let refused = |e: producer_state::Error| LifecycleOutcome::ImportRefused {
                reason: e.to_string(),
            };
            // Validated before it was proposed, under the log's CRC since:
            // a failure here is identical on every replica anyway.
            let export = match PartitionExport::from_bytes(export) {
                Ok(e) => e,
                Err(e) => return Some(refused(e)),
            };
            let keys = export.len() as u64;
            // A retry of an import that was applied (its answer lost):
            // every key is already here, as exported.
            let done = export.iter().all(|i| {
                mgr.get(i.producer_id.clone(), i.partition)
                    .is_some_and(|e| e == i.entry)
            });
            if done && !export.is_empty() {
                return Some(LifecycleOutcome::Imported { keys });
            }
            match mgr.import_partition(&export) {
                Ok(_) => LifecycleOutcome::Imported { keys },
                Err(e) => refused(e),
            }
        }
        Command::Append(_) | Command::AppendAll(_) => return None,
    })
}

impl Command {
    /// Refuses a command that cannot be proposed: no appends, more than
    /// [`MAX_APPENDS_PER_ENTRY`], a name longer than 65,535 bytes, more
    /// than [`MAX_COMMAND_BYTES`] in all, a negative expiration, or an
    /// import whose bytes are not a valid partition export.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.encoded_len() > MAX_COMMAND_BYTES {
            return Err("a command is at most 16 MiB encoded");
        }
        match self {
            Command::Append(_) | Command::AppendAll(_) => {}
            Command::Expire { expiration_ms, .. } if *expiration_ms < 0 => {
                return Err("an expiration is not negative");
            }
            Command::ImportPartition { export } if PartitionExport::from_bytes(export).is_err() => {
                return Err("the import's bytes are not a valid partition export");
            }
            Command::Expire { .. }
            | Command::RemovePartition { .. }
            | Command::ImportPartition { .. } => return Ok(()),
        }
        let appends = self.appends();
        if appends.is_empty() {
            return Err("a command must carry at least one append");
        }
        if appends.len() > MAX_APPENDS_PER_ENTRY {
            return Err("a command carries at most 65,536 appends");
        }
        if appends
            .iter()
            .any(|a| matches!(&a.producer, Producer::Name(n) if n.len() > u16::MAX as usize))
        {
            return Err("a producer name is at most 65,535 bytes");
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Bytes (docs/format.md, "Raft log of producer-state-raft").

// Tags are only ever added, and an existing tag's bytes never change
// (docs/format.md, "Versions"): tags 3 to 5 came with log version 3.
const TAG_APPEND: u8 = 1;
const TAG_APPEND_ALL: u8 = 2;
const TAG_EXPIRE: u8 = 3;
const TAG_REMOVE_PARTITION: u8 = 4;
const TAG_IMPORT_PARTITION: u8 = 5;
const PRODUCER_ID: u8 = 0;
const PRODUCER_NAME: u8 = 1;
const HAS_TIMESTAMP: u8 = 1;

impl Command {
    /// Appends the command's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Command::Append(a) => {
                out.push(TAG_APPEND);
                encode_append(a, out);
            }
            Command::AppendAll(v) => {
                out.push(TAG_APPEND_ALL);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                for a in v {
                    encode_append(a, out);
                }
            }
            Command::Expire {
                now_ms,
                expiration_ms,
            } => {
                out.push(TAG_EXPIRE);
                out.extend_from_slice(&now_ms.to_le_bytes());
                out.extend_from_slice(&expiration_ms.to_le_bytes());
            }
            Command::RemovePartition { partition } => {
                out.push(TAG_REMOVE_PARTITION);
                out.extend_from_slice(&partition.to_le_bytes());
            }
            Command::ImportPartition { export } => {
                out.push(TAG_IMPORT_PARTITION);
                // At most 16 MiB (`validate`), so the length fits.
                out.extend_from_slice(&(export.len() as u32).to_le_bytes());
                out.extend_from_slice(export);
            }
        }
    }

    /// Reads a command written by [`Command::encode`]; it must use every
    /// byte. `Err` names what is wrong; never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Command, &'static str> {
        let mut r = Reader(bytes);
        let cmd = match r.u8()? {
            TAG_APPEND => Command::Append(decode_append(&mut r)?),
            TAG_APPEND_ALL => {
                let n = r.u32()? as usize;
                if n == 0 || n > MAX_APPENDS_PER_ENTRY {
                    return Err("append count");
                }
                let mut v = Vec::with_capacity(n.min(bytes.len() / 20));
                for _ in 0..n {
                    v.push(decode_append(&mut r)?);
                }
                Command::AppendAll(v)
            }
            TAG_EXPIRE => Command::Expire {
                now_ms: r.u64()? as i64,
                expiration_ms: r.u64()? as i64,
            },
            TAG_REMOVE_PARTITION => Command::RemovePartition {
                partition: r.u32()? as i32,
            },
            TAG_IMPORT_PARTITION => {
                let n = r.u32()? as usize;
                Command::ImportPartition {
                    export: r.take(n)?.to_vec(),
                }
            }
            _ => return Err(UNKNOWN_TAG),
        };
        if !r.0.is_empty() {
            return Err("bytes after the command");
        }
        Ok(cmd)
    }
}

impl Append {
    /// The length of this append's bytes within a command.
    pub fn encoded_len(&self) -> usize {
        let producer = match &self.producer {
            Producer::Id(_) => 8,
            Producer::Name(n) => 2 + n.len(),
        };
        let timestamp = if self.timestamp.is_some() { 8 } else { 0 };
        1 + producer + 4 + 2 + 4 + 4 + 1 + timestamp
    }
}

fn encode_append(a: &Append, out: &mut Vec<u8>) {
    match &a.producer {
        Producer::Id(n) => {
            out.push(PRODUCER_ID);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Producer::Name(s) => {
            out.push(PRODUCER_NAME);
            out.extend_from_slice(&(s.len() as u16).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
    out.extend_from_slice(&a.partition.to_le_bytes());
    out.extend_from_slice(&a.epoch.to_le_bytes());
    out.extend_from_slice(&a.first_sequence.to_le_bytes());
    out.extend_from_slice(&a.last_sequence.to_le_bytes());
    match a.timestamp {
        Some(ts) => {
            out.push(HAS_TIMESTAMP);
            out.extend_from_slice(&ts.to_le_bytes());
        }
        None => out.push(0),
    }
}

fn decode_append(r: &mut Reader<'_>) -> Result<Append, &'static str> {
    let producer = match r.u8()? {
        PRODUCER_ID => Producer::Id(r.u64()?),
        PRODUCER_NAME => {
            let n = r.u16()? as usize;
            let name = std::str::from_utf8(r.take(n)?).map_err(|_| "producer name not UTF-8")?;
            Producer::Name(name.to_string())
        }
        _ => return Err("unknown producer kind"),
    };
    let partition = r.u32()? as i32;
    let epoch = r.u16()? as i16;
    let first_sequence = r.u32()? as i32;
    let last_sequence = r.u32()? as i32;
    let timestamp = match r.u8()? {
        0 => None,
        HAS_TIMESTAMP => Some(r.u64()? as i64),
        _ => return Err("timestamp flag"),
    };
    Ok(Append {
        producer,
        partition,
        epoch,
        first_sequence,
        last_sequence,
        timestamp,
    })
}

/// [`Command::decode`]'s answer to a tag it does not know: a command of a
/// later build (the log refuses it by name rather than cut it as damage).
pub(crate) const UNKNOWN_TAG: &str = "unknown command tag";

/// A bounds-checked little-endian reader.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("ends early");
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, &'static str> {
        self.array().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Result<u32, &'static str> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Result<u64, &'static str> {
        self.array().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
