//! The bytes replicas and clients exchange over TCP, version 1.
//!
//! Every message is one frame, little-endian throughout:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | length of everything after this field (at most [`MAX_FRAME`]) |
//! | 4 | CRC-32C of everything after this field |
//! | 1 | version ([`VERSION`]) |
//! | 1 | kind ([`Kind`]) |
//! | 8 | request id: a reply carries its request's |
//! | n | body, by kind (below) |
//!
//! The length is checked against [`MAX_FRAME`] before anything is
//! allocated, and the frame's bytes are read as they arrive (a peer that
//! claims 32 MiB and sends ten bytes costs ten bytes); every count and
//! length inside a body is checked against the bytes left before it is
//! used. A frame of another version is answered [`Kind::Failed`] and the
//! connection closed, so two builds that do not speak the same version
//! never guess at each other's bytes. TCP checksums every segment; the
//! CRC is there for what TCP's 16-bit sum misses and for a peer's bug,
//! and costs about a microsecond per 16 KiB here.
//!
//! Bodies (`LogId?` is a byte 0 for none, or 1 and then term u64, node
//! u64, index u64; `Vote` is term u64, node u64, committed u8; `str` is a
//! u32 length and UTF-8 bytes):
//!
//! - `AppendEntries`: `Vote`, prev `LogId?`, commit `LogId?`, count u32,
//!   then per entry term u64, node u64, index u64, payload length u32 and
//!   the payload as `raft.log` stores it (kind byte, then the command's
//!   bytes or the membership's JSON).
//! - `AppendEntriesReply`: 0 success, 1 partial success and `LogId?`,
//!   2 conflict, 3 higher vote and `Vote`.
//! - `Vote`: `Vote`, last `LogId?`. `VoteReply`: `Vote`, granted u8, last
//!   `LogId?`.
//! - `SnapshotChunk`: `Vote`, the snapshot's metadata as `str` (openraft's
//!   serde shape in JSON, as in `raft-snapshot`), total length u64, this
//!   chunk's offset u64, length u32, CRC-32C u32 of the chunk, the chunk.
//!   `SnapshotReply`: 0 and the next offset u64 the receiver expects, or
//!   1 and the receiver's `Vote` once it installed the whole snapshot.
//! - `Submit`: a command's bytes as the log stores them
//!   ([`Command::encode`]). `SubmitReply`: 0 answered: `LogId` (always
//!   present), first slot u32, the response (below); 1 not the leader:
//!   leader id u64 (0 for none known) and its address `str`; 2 outcome
//!   unknown: reason `str` (retry the same command); 3 invalid: reason
//!   `str` (do not retry).
//! - A response: count u32, per append 0 accepted and offset i64,
//!   1 duplicate and 0, or 1 and offset i64 and timestamp i64, 2 out of
//!   order and reason `str`, 3 fenced and epoch i16; then 0 for no
//!   lifecycle outcome, or 1 and 0 expired keys u64, 1 partition removed
//!   keys u64, 2 imported keys u64, 3 import refused reason `str`.
//! - `Status`: empty. `StatusReply`: node u64, term u64, leader u64 (0 for
//!   none), last applied `LogId?`, last log index u64 (0 for none),
//!   snapshots installed u64 and refused u64 and log fsyncs u64 since it
//!   started, then count u32 and per member id u64 and address `str`.
//! - `Entries`: first index u64, most entries u32. `EntriesReply`: count
//!   u32 and the entries as in `AppendEntries`: committed entries only.
//! - `Export`: empty. `ExportReply`: last applied `LogId?`, then the
//!   state as the core crate's snapshot bytes
//!   (`ProducerStateManager::encode_snapshot`) to the end of the frame.
//! - `Failed`: reason `str`: the request was not carried out, or may not
//!   have been (retry it).

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::{BasicNode, CommittedLeaderId, Entry, LeaderId, LogId, SnapshotMeta, Vote};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::command::{Command, LifecycleOutcome, Outcome, Reader, Response};
use crate::log_file;
use crate::proposer::Answer;
use crate::{NodeId, TypeConfig};

/// The version of the bytes this build speaks.
pub const VERSION: u8 = 1;

/// The most bytes a frame may hold after its length field: 32 MiB, twice
/// the longest command ([`crate::command::MAX_COMMAND_BYTES`]), so one
/// entry always fits; a longer `AppendEntries` is split by openraft when
/// the transport answers it is too large.
pub const MAX_FRAME: usize = 32 << 20;

/// Length and CRC, then version, kind and id.
pub const FRAME_HEAD: usize = 4 + 4 + 1 + 1 + 8;

/// The least bytes an entry takes in a body: its log id, payload length
/// and kind.
const MIN_ENTRY: usize = 8 * 3 + 4 + 1;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// openraft's AppendEntries (a heartbeat when empty).
    AppendEntries = 1,
    /// Its answer.
    AppendEntriesReply = 2,
    /// openraft's RequestVote.
    Vote = 3,
    /// Its answer.
    VoteReply = 4,
    /// A piece of a snapshot.
    SnapshotChunk = 5,
    /// Its answer.
    SnapshotReply = 6,
    /// A client's command.
    Submit = 16,
    /// Its answer.
    SubmitReply = 17,
    /// What a node knows (leader, term, applied).
    Status = 18,
    /// Its answer.
    StatusReply = 19,
    /// Committed entries, to compare replicas.
    Entries = 20,
    /// Its answer.
    EntriesReply = 21,
    /// A node's whole state, to compare replicas.
    Export = 22,
    /// Its answer.
    ExportReply = 23,
    /// A request not carried out.
    Failed = 127,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        [
            AppendEntries,
            AppendEntriesReply,
            Vote,
            VoteReply,
            SnapshotChunk,
            SnapshotReply,
            Submit,
            SubmitReply,
            Status,
            StatusReply,
            Entries,
            EntriesReply,
            Export,
            ExportReply,
            Failed,
        ]
        .into_iter()
        .find(|k| *k as u8 == b)
    }
}

/// One frame as read: its kind, request id and body.
#[derive(Debug)]
pub struct Frame {
    /// What the body holds.
    pub kind: Kind,
    /// The request id (a reply carries its request's).
    pub id: u64,
    /// The body.
    pub body: Vec<u8>,
}

/// A frame that cannot be read; the connection it came on is closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed in the middle of a frame.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The length field claims more than [`MAX_FRAME`].
    #[error("a frame of {0} bytes is longer than the most a frame holds ({MAX_FRAME})")]
    TooLong(u64),
    /// The CRC does not match.
    #[error("a frame's checksum does not match")]
    Checksum,
    /// Another version of the bytes.
    #[error("version {0}; this build speaks version {VERSION}")]
    Version(u8),
    /// A kind this build does not know, or a frame shorter than its head.
    #[error("{0}")]
    Malformed(&'static str),
}

/// Reads one frame: `Ok(None)` if the connection closed cleanly before
/// it. The length is checked before anything is allocated, and the body
/// grows with the bytes that arrive.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u64::from(u32::from_le_bytes(len));
    if len > MAX_FRAME as u64 {
        return Err(FrameError::TooLong(len));
    }
    if len < (FRAME_HEAD - 4) as u64 {
        return Err(FrameError::Malformed("a frame shorter than its head"));
    }
    let mut bytes = Vec::with_capacity((len as usize).min(64 << 10));
    r.take(len).read_to_end(&mut bytes).await?;
    if (bytes.len() as u64) < len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    parse_frame(&bytes).map(Some)
}

/// A frame's bytes after its length field.
fn parse_frame(bytes: &[u8]) -> Result<Frame, FrameError> {
    let mut r = Reader(bytes);
    let crc = r.u32().map_err(FrameError::Malformed)?;
    if crc32c::crc32c(r.0) != crc {
        return Err(FrameError::Checksum);
    }
    let version = r.u8().map_err(FrameError::Malformed)?;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = Kind::from_u8(r.u8().map_err(FrameError::Malformed)?).ok_or(
        FrameError::Malformed("a frame kind this build does not know"),
    )?;
    let id = r.u64().map_err(FrameError::Malformed)?;
    Ok(Frame {
        kind,
        id,
        body: r.0.to_vec(),
    })
}

/// The bytes of a frame of `kind` and `id` whose body `body` writes;
/// `Err` if it would be longer than [`MAX_FRAME`] (or the body cannot be
/// encoded).
pub fn frame(
    kind: Kind,
    id: u64,
    body: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>,
) -> std::io::Result<Vec<u8>> {
    let mut out = vec![0u8; 8];
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&id.to_le_bytes());
    body(&mut out)?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("a frame of {len} bytes is longer than the most a frame holds ({MAX_FRAME})"),
        ));
    }
    let crc = crc32c::crc32c(&out[8..]);
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

// ---------------------------------------------------------------------------
// Fields.

fn put_u32_len(out: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    let n = u32::try_from(n).map_err(|_| std::io::Error::other("a length past u32"))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) -> std::io::Result<()> {
    put_u32_len(out, s.len())?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn get_str(r: &mut Reader<'_>) -> Result<String, &'static str> {
    let n = r.u32()? as usize;
    let b = r.take(n)?;
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| "a string not UTF-8")
}

fn put_vote(out: &mut Vec<u8>, v: &Vote<NodeId>) {
    out.extend_from_slice(&v.leader_id.term.to_le_bytes());
    out.extend_from_slice(&v.leader_id.node_id.to_le_bytes());
    out.push(u8::from(v.committed));
}

fn get_vote(r: &mut Reader<'_>) -> Result<Vote<NodeId>, &'static str> {
    let term = r.u64()?;
    let node_id = r.u64()?;
    let committed = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err("a vote's committed flag"),
    };
    Ok(Vote {
        leader_id: LeaderId { term, node_id },
        committed,
    })
}

fn put_log_id(out: &mut Vec<u8>, l: &LogId<NodeId>) {
    out.extend_from_slice(&l.leader_id.term.to_le_bytes());
    out.extend_from_slice(&l.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&l.index.to_le_bytes());
}

fn get_log_id(r: &mut Reader<'_>) -> Result<LogId<NodeId>, &'static str> {
    let term = r.u64()?;
    let node = r.u64()?;
    let index = r.u64()?;
    Ok(LogId::new(CommittedLeaderId::new(term, node), index))
}

fn put_opt_log_id(out: &mut Vec<u8>, l: &Option<LogId<NodeId>>) {
    match l {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            put_log_id(out, l);
        }
    }
}

fn get_opt_log_id(r: &mut Reader<'_>) -> Result<Option<LogId<NodeId>>, &'static str> {
    match r.u8()? {
        0 => Ok(None),
        1 => get_log_id(r).map(Some),
        _ => Err("a log id's presence flag"),
    }
}

fn put_entries(out: &mut Vec<u8>, entries: &[Entry<TypeConfig>]) -> std::io::Result<()> {
    put_u32_len(out, entries.len())?;
    for e in entries {
        put_log_id(out, &e.log_id);
        let at = out.len();
        out.extend_from_slice(&[0u8; 4]);
        log_file::encode_payload(&e.payload, out)?;
        let n = out.len() - at - 4;
        let n = u32::try_from(n).map_err(|_| std::io::Error::other("an entry past u32"))?;
        out[at..at + 4].copy_from_slice(&n.to_le_bytes());
    }
    Ok(())
}

fn get_entries(r: &mut Reader<'_>) -> Result<Vec<Entry<TypeConfig>>, &'static str> {
    let n = r.u32()? as usize;
    // Bounded by the bytes there before anything is allocated.
    if n > r.0.len() / MIN_ENTRY {
        return Err("more entries than bytes");
    }
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let log_id = get_log_id(r)?;
        let len = r.u32()? as usize;
        let payload = log_file::decode_payload(r.take(len)?)
            .map_err(|why| why.unwrap_or("an entry's payload"))?;
        entries.push(Entry { log_id, payload });
    }
    Ok(entries)
}

fn put_response(out: &mut Vec<u8>, resp: &Response) -> std::io::Result<()> {
    put_u32_len(out, resp.outcomes.len())?;
    for o in &resp.outcomes {
        match o {
            Outcome::Accepted { offset } => {
                out.push(0);
                out.extend_from_slice(&offset.to_le_bytes());
            }
            Outcome::Duplicate { original } => {
                out.push(1);
                match original {
                    None => out.push(0),
                    Some((offset, ts)) => {
                        out.push(1);
                        out.extend_from_slice(&offset.to_le_bytes());
                        out.extend_from_slice(&ts.to_le_bytes());
                    }
                }
            }
            Outcome::OutOfOrder { reason } => {
                out.push(2);
                put_str(out, reason)?;
            }
            Outcome::FencedEpoch { current_epoch } => {
                out.push(3);
                out.extend_from_slice(&current_epoch.to_le_bytes());
            }
        }
    }
    match &resp.lifecycle {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            match l {
                LifecycleOutcome::Expired { keys } => {
                    out.push(0);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::PartitionRemoved { keys } => {
                    out.push(1);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::Imported { keys } => {
                    out.push(2);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::ImportRefused { reason } => {
                    out.push(3);
                    put_str(out, reason)?;
                }
            }
        }
    }
    Ok(())
}

fn get_response(r: &mut Reader<'_>) -> Result<Response, &'static str> {
    let n = r.u32()? as usize;
    // Every outcome takes at least its tag and a byte.
    if n > r.0.len() / 2 {
        return Err("more outcomes than bytes");
    }
    let mut outcomes = Vec::with_capacity(n);
    for _ in 0..n {
        outcomes.push(match r.u8()? {
            0 => Outcome::Accepted {
                offset: r.u64()? as i64,
            },
            1 => Outcome::Duplicate {
                original: match r.u8()? {
                    0 => None,
                    1 => Some((r.u64()? as i64, r.u64()? as i64)),
                    _ => return Err("a duplicate's original flag"),
                },
            },
            2 => Outcome::OutOfOrder {
                reason: get_str(r)?,
            },
            3 => Outcome::FencedEpoch {
                current_epoch: r.u16()? as i16,
            },
            _ => return Err("an outcome tag"),
        });
    }
    let lifecycle = match r.u8()? {
        0 => None,
        1 => Some(match r.u8()? {
            0 => LifecycleOutcome::Expired { keys: r.u64()? },
            1 => LifecycleOutcome::PartitionRemoved { keys: r.u64()? },
            2 => LifecycleOutcome::Imported { keys: r.u64()? },
            3 => LifecycleOutcome::ImportRefused {
                reason: get_str(r)?,
            },
            _ => return Err("a lifecycle outcome tag"),
        }),
        _ => return Err("a lifecycle flag"),
    };
    Ok(Response {
        outcomes,
        lifecycle,
    })
}

// ---------------------------------------------------------------------------
// Messages.

/// One piece of a snapshot in transfer. The receiver takes pieces in
/// order from offset 0, checks each one's CRC, and verifies the whole
/// snapshot before openraft sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// The sending leader's vote.
    pub vote: Vote<NodeId>,
    /// The snapshot's metadata (the same in every piece).
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// The snapshot's length in bytes.
    pub total: u64,
    /// Where this piece starts.
    pub offset: u64,
    /// The piece.
    pub data: Vec<u8>,
}

/// A receiver's answer to a [`SnapshotChunk`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotAck {
    /// Taken: send the piece at this offset next.
    Received {
        /// The next offset expected.
        next: u64,
    },
    /// The last piece: the snapshot was verified and installed.
    Installed {
        /// The receiver's vote after the install.
        vote: Vote<NodeId>,
    },
}

/// A node's answer to a client's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitReply {
    /// Committed and applied: the leader's outcomes.
    Answered(Answer),
    /// This node is not the leader; it names the one it knows of.
    NotLeader {
        /// The leader, if one is known.
        leader: Option<NodeId>,
        /// Its address in the membership ("" if unknown).
        addr: String,
    },
    /// The outcome is unknown (leadership changed, no answer in time):
    /// retry the same command, which is idempotent.
    Unknown {
        /// Why.
        reason: String,
    },
    /// The command cannot be proposed: retrying will not help.
    Invalid {
        /// Why.
        reason: String,
    },
}

/// What a node knows of itself and its group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The node.
    pub id: NodeId,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// The last entry its state reflects.
    pub last_applied: Option<LogId<NodeId>>,
    /// The index of the last entry in its log.
    pub last_log_index: Option<u64>,
    /// The voters and learners it knows, with their addresses.
    pub members: Vec<(NodeId, String)>,
    /// Snapshots it received from a leader, verified and installed, since
    /// it started.
    pub snapshots_installed: u64,
    /// Snapshot transfers it refused (damaged, or out of order).
    pub snapshots_refused: u64,
    /// fdatasync calls on its log since it started.
    pub log_fsyncs: u64,
}

/// A request, replica to replica or client to node.
#[derive(Clone, Debug)]
pub enum Request {
    /// openraft's AppendEntries.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// openraft's RequestVote.
    Vote(VoteRequest<NodeId>),
    /// A piece of a snapshot.
    SnapshotChunk(SnapshotChunk),
    /// A client's command.
    Submit(Command),
    /// What the node knows.
    Status,
    /// Up to `max` committed entries from index `from`.
    Entries {
        /// The first index.
        from: u64,
        /// The most entries.
        max: u32,
    },
    /// The node's state.
    Export,
}

/// An answer to a [`Request`].
#[derive(Debug)]
pub enum Reply {
    /// To AppendEntries.
    AppendEntries(AppendEntriesResponse<NodeId>),
    /// To RequestVote.
    Vote(VoteResponse<NodeId>),
    /// To a snapshot piece.
    Snapshot(SnapshotAck),
    /// To a command.
    Submit(SubmitReply),
    /// To a status request.
    Status(Status),
    /// Committed entries.
    Entries(Vec<Entry<TypeConfig>>),
    /// The node's state: the log id it reflects and the state as the core
    /// crate's snapshot bytes.
    Export {
        /// The last entry the state reflects.
        last_applied: Option<LogId<NodeId>>,
        /// `ProducerStateManager::encode_snapshot` of it.
        snapshot: Vec<u8>,
    },
    /// Not carried out (or not known to be): retry.
    Failed(String),
}

impl Request {
    /// The frame of this request with id `id`.
    pub fn encode(&self, id: u64) -> std::io::Result<Vec<u8>> {
        match self {
            Request::AppendEntries(rpc) => frame(Kind::AppendEntries, id, |out| {
                put_vote(out, &rpc.vote);
                put_opt_log_id(out, &rpc.prev_log_id);
                put_opt_log_id(out, &rpc.leader_commit);
                put_entries(out, &rpc.entries)
            }),
            Request::Vote(rpc) => frame(Kind::Vote, id, |out| {
                put_vote(out, &rpc.vote);
                put_opt_log_id(out, &rpc.last_log_id);
                Ok(())
            }),
            Request::SnapshotChunk(c) => frame(Kind::SnapshotChunk, id, |out| {
                put_vote(out, &c.vote);
                put_str(
                    out,
                    &serde_json::to_string(&c.meta).map_err(std::io::Error::other)?,
                )?;
                out.extend_from_slice(&c.total.to_le_bytes());
                out.extend_from_slice(&c.offset.to_le_bytes());
                put_u32_len(out, c.data.len())?;
                out.extend_from_slice(&crc32c::crc32c(&c.data).to_le_bytes());
                out.extend_from_slice(&c.data);
                Ok(())
            }),
            Request::Submit(c) => frame(Kind::Submit, id, |out| {
                c.encode(out);
                Ok(())
            }),
            Request::Status => frame(Kind::Status, id, |_| Ok(())),
            Request::Entries { from, max } => frame(Kind::Entries, id, |out| {
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&max.to_le_bytes());
                Ok(())
            }),
            Request::Export => frame(Kind::Export, id, |_| Ok(())),
        }
    }

    /// The request a frame holds; `Err` names what is wrong.
    pub fn decode(f: &Frame) -> Result<Request, &'static str> {
        let mut r = Reader(&f.body);
        let req = match f.kind {
            Kind::AppendEntries => Request::AppendEntries(AppendEntriesRequest {
                vote: get_vote(&mut r)?,
                prev_log_id: get_opt_log_id(&mut r)?,
                leader_commit: get_opt_log_id(&mut r)?,
                entries: get_entries(&mut r)?,
            }),
            Kind::Vote => Request::Vote(VoteRequest {
                vote: get_vote(&mut r)?,
                last_log_id: get_opt_log_id(&mut r)?,
            }),
            Kind::SnapshotChunk => {
                let vote = get_vote(&mut r)?;
                let meta =
                    serde_json::from_str(&get_str(&mut r)?).map_err(|_| "a snapshot's metadata")?;
                let total = r.u64()?;
                let offset = r.u64()?;
                let n = r.u32()? as usize;
                let crc = r.u32()?;
                let data = r.take(n)?;
                if crc32c::crc32c(data) != crc {
                    return Err("a snapshot piece's checksum");
                }
                if offset.checked_add(n as u64).is_none_or(|end| end > total) {
                    return Err("a snapshot piece past the snapshot's end");
                }
                Request::SnapshotChunk(SnapshotChunk {
                    vote,
                    meta,
                    total,
                    offset,
                    data: data.to_vec(),
                })
            }
            Kind::Submit => {
                let c = Command::decode(r.0)?;
                r.0 = &[];
                Request::Submit(c)
            }
            Kind::Status => Request::Status,
            Kind::Entries => Request::Entries {
                from: r.u64()?,
                max: r.u32()?,
            },
            Kind::Export => Request::Export,
            _ => return Err("not a request"),
        };
        if !r.0.is_empty() {
            return Err("bytes after the message");
        }
        Ok(req)
    }
}

impl Reply {
    /// The frame of this reply to request `id`.
    pub fn encode(&self, id: u64) -> std::io::Result<Vec<u8>> {
        match self {
            Reply::AppendEntries(resp) => frame(Kind::AppendEntriesReply, id, |out| {
                match resp {
                    AppendEntriesResponse::Success => out.push(0),
                    AppendEntriesResponse::PartialSuccess(l) => {
                        out.push(1);
                        put_opt_log_id(out, l);
                    }
                    AppendEntriesResponse::Conflict => out.push(2),
                    AppendEntriesResponse::HigherVote(v) => {
                        out.push(3);
                        put_vote(out, v);
                    }
                }
                Ok(())
            }),
            Reply::Vote(resp) => frame(Kind::VoteReply, id, |out| {
                put_vote(out, &resp.vote);
                out.push(u8::from(resp.vote_granted));
                put_opt_log_id(out, &resp.last_log_id);
                Ok(())
            }),
            Reply::Snapshot(ack) => frame(Kind::SnapshotReply, id, |out| {
                match ack {
                    SnapshotAck::Received { next } => {
                        out.push(0);
                        out.extend_from_slice(&next.to_le_bytes());
                    }
                    SnapshotAck::Installed { vote } => {
                        out.push(1);
                        put_vote(out, vote);
                    }
                }
                Ok(())
            }),
            Reply::Submit(s) => frame(Kind::SubmitReply, id, |out| match s {
                SubmitReply::Answered(a) => {
                    out.push(0);
                    put_log_id(out, &a.log_id);
                    put_u32_len(out, a.first_slot)?;
                    put_response(out, &a.response)
                }
                SubmitReply::NotLeader { leader, addr } => {
                    out.push(1);
                    out.extend_from_slice(&leader.unwrap_or(0).to_le_bytes());
                    put_str(out, addr)
                }
                SubmitReply::Unknown { reason } => {
                    out.push(2);
                    put_str(out, reason)
                }
                SubmitReply::Invalid { reason } => {
                    out.push(3);
                    put_str(out, reason)
                }
            }),
            Reply::Status(s) => frame(Kind::StatusReply, id, |out| {
                out.extend_from_slice(&s.id.to_le_bytes());
                out.extend_from_slice(&s.term.to_le_bytes());
                out.extend_from_slice(&s.leader.unwrap_or(0).to_le_bytes());
                put_opt_log_id(out, &s.last_applied);
                out.extend_from_slice(&s.last_log_index.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&s.snapshots_installed.to_le_bytes());
                out.extend_from_slice(&s.snapshots_refused.to_le_bytes());
                out.extend_from_slice(&s.log_fsyncs.to_le_bytes());
                put_u32_len(out, s.members.len())?;
                for (id, addr) in &s.members {
                    out.extend_from_slice(&id.to_le_bytes());
                    put_str(out, addr)?;
                }
                Ok(())
            }),
            Reply::Entries(entries) => {
                frame(Kind::EntriesReply, id, |out| put_entries(out, entries))
            }
            Reply::Export {
                last_applied,
                snapshot,
            } => frame(Kind::ExportReply, id, |out| {
                put_opt_log_id(out, last_applied);
                out.extend_from_slice(snapshot);
                Ok(())
            }),
            Reply::Failed(reason) => frame(Kind::Failed, id, |out| put_str(out, reason)),
        }
    }

    /// The reply a frame holds; `Err` names what is wrong.
    pub fn decode(f: &Frame) -> Result<Reply, &'static str> {
        let mut r = Reader(&f.body);
        let reply = match f.kind {
            Kind::AppendEntriesReply => Reply::AppendEntries(match r.u8()? {
                0 => AppendEntriesResponse::Success,
                1 => AppendEntriesResponse::PartialSuccess(get_opt_log_id(&mut r)?),
                2 => AppendEntriesResponse::Conflict,
                3 => AppendEntriesResponse::HigherVote(get_vote(&mut r)?),
                _ => return Err("an append-entries answer tag"),
            }),
            Kind::VoteReply => Reply::Vote(VoteResponse {
                vote: get_vote(&mut r)?,
                vote_granted: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err("a vote's granted flag"),
                },
                last_log_id: get_opt_log_id(&mut r)?,
            }),
            Kind::SnapshotReply => Reply::Snapshot(match r.u8()? {
                0 => SnapshotAck::Received { next: r.u64()? },
                1 => SnapshotAck::Installed {
                    vote: get_vote(&mut r)?,
                },
                _ => return Err("a snapshot answer tag"),
            }),
            Kind::SubmitReply => Reply::Submit(match r.u8()? {
                0 => SubmitReply::Answered(Answer {
                    log_id: get_log_id(&mut r)?,
                    first_slot: r.u32()? as usize,
                    response: get_response(&mut r)?,
                }),
                1 => SubmitReply::NotLeader {
                    leader: Some(r.u64()?).filter(|&l| l != 0),
                    addr: get_str(&mut r)?,
                },
                2 => SubmitReply::Unknown {
                    reason: get_str(&mut r)?,
                },
                3 => SubmitReply::Invalid {
                    reason: get_str(&mut r)?,
                },
                _ => return Err("a submit answer tag"),
            }),
            Kind::StatusReply => {
                let id = r.u64()?;
                let term = r.u64()?;
                let leader = Some(r.u64()?).filter(|&l| l != 0);
                let last_applied = get_opt_log_id(&mut r)?;
                let last_log_index = Some(r.u64()?).filter(|&i| i != 0);
                let snapshots_installed = r.u64()?;
                let snapshots_refused = r.u64()?;
                let log_fsyncs = r.u64()?;
                let n = r.u32()? as usize;
                // A member takes at least its id and a length.
                if n > r.0.len() / 12 {
                    return Err("more members than bytes");
                }
                let mut members = Vec::with_capacity(n);
                for _ in 0..n {
                    members.push((r.u64()?, get_str(&mut r)?));
                }
                Reply::Status(Status {
                    id,
                    term,
                    leader,
                    last_applied,
                    last_log_index,
                    members,
                    snapshots_installed,
                    snapshots_refused,
                    log_fsyncs,
                })
            }
            Kind::EntriesReply => Reply::Entries(get_entries(&mut r)?),
            Kind::ExportReply => {
                let last_applied = get_opt_log_id(&mut r)?;
                let snapshot = std::mem::take(&mut r.0).to_vec();
                Reply::Export {
                    last_applied,
                    snapshot,
                }
            }
            Kind::Failed => Reply::Failed(get_str(&mut r)?),
            _ => return Err("not a reply"),
        };
        if !r.0.is_empty() {
            return Err("bytes after the message");
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Append;
    use openraft::{EntryPayload, Membership, StoredMembership};
    use std::collections::BTreeSet;

    fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn vote() -> Vote<NodeId> {
        Vote {
            leader_id: LeaderId {
                term: 7,
                node_id: 2,
            },
            committed: true,
        }
    }

    fn entries() -> Vec<Entry<TypeConfig>> {
        vec![
            Entry {
                log_id: log_id(1, 1, 0),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1, 2, 3])],
                    None,
                )),
            },
            Entry {
                log_id: log_id(1, 1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2, 3, 2),
                payload: EntryPayload::Normal(Command::AppendAll(vec![
                    Append::batch("orders", -1, 3, 0, 9, 1_700_000_000_000),
                    Append::single(u64::MAX, i32::MAX, i16::MIN, 5),
                ])),
            },
        ]
    }

    fn meta() -> SnapshotMeta<NodeId, BasicNode> {
        SnapshotMeta {
            last_log_id: Some(log_id(2, 3, 2)),
            last_membership: StoredMembership::new(
                Some(log_id(1, 1, 0)),
                Membership::new(vec![BTreeSet::from([1, 2, 3])], None),
            ),
            snapshot_id: "2-3-2-1".into(),
        }
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::AppendEntries(AppendEntriesRequest {
                vote: vote(),
                prev_log_id: Some(log_id(1, 1, 1)),
                leader_commit: None,
                entries: entries(),
            }),
            Request::AppendEntries(AppendEntriesRequest {
                vote: vote(),
                prev_log_id: None,
                leader_commit: Some(log_id(9, 9, 9)),
                entries: Vec::new(),
            }),
            Request::Vote(VoteRequest {
                vote: vote(),
                last_log_id: Some(log_id(3, 1, 44)),
            }),
            Request::SnapshotChunk(SnapshotChunk {
                vote: vote(),
                meta: meta(),
                total: 10,
                offset: 4,
                data: vec![1, 2, 3, 4, 5, 6],
            }),
            Request::Submit(Command::Append(Append::batch(1u64, 0, 0, 0, 4, 9))),
            Request::Status,
            Request::Entries { from: 3, max: 100 },
            Request::Export,
        ]
    }

    fn replies() -> Vec<Reply> {
        let answer = Answer {
            log_id: log_id(4, 2, 17),
            first_slot: 3,
            response: Response {
                outcomes: vec![
                    Outcome::Accepted { offset: 17 << 16 },
                    Outcome::Duplicate { original: None },
                    Outcome::Duplicate {
                        original: Some((-1, i64::MIN)),
                    },
                    Outcome::OutOfOrder {
                        reason: "gap".into(),
                    },
                    Outcome::FencedEpoch { current_epoch: -2 },
                ],
                lifecycle: None,
            },
        };
        let lifecycle = |l| {
            Reply::Submit(SubmitReply::Answered(Answer {
                log_id: log_id(1, 1, 1),
                first_slot: 0,
                response: Response {
                    outcomes: Vec::new(),
                    lifecycle: Some(l),
                },
            }))
        };
        vec![
            Reply::AppendEntries(AppendEntriesResponse::Success),
            Reply::AppendEntries(AppendEntriesResponse::PartialSuccess(None)),
            Reply::AppendEntries(AppendEntriesResponse::PartialSuccess(Some(log_id(1, 2, 3)))),
            Reply::AppendEntries(AppendEntriesResponse::Conflict),
            Reply::AppendEntries(AppendEntriesResponse::HigherVote(vote())),
            Reply::Vote(VoteResponse {
                vote: vote(),
                vote_granted: true,
                last_log_id: None,
            }),
            Reply::Snapshot(SnapshotAck::Received { next: 1 << 40 }),
            Reply::Snapshot(SnapshotAck::Installed { vote: vote() }),
            Reply::Submit(SubmitReply::Answered(answer)),
            lifecycle(LifecycleOutcome::Expired { keys: 3 }),
            lifecycle(LifecycleOutcome::PartitionRemoved { keys: 0 }),
            lifecycle(LifecycleOutcome::Imported { keys: u64::MAX }),
            lifecycle(LifecycleOutcome::ImportRefused {
                reason: "conflict".into(),
            }),
            Reply::Submit(SubmitReply::NotLeader {
                leader: Some(3),
                addr: "127.0.0.1:7003".into(),
            }),
            Reply::Submit(SubmitReply::NotLeader {
                leader: None,
                addr: String::new(),
            }),
            Reply::Submit(SubmitReply::Unknown {
                reason: "leader changed".into(),
            }),
            Reply::Submit(SubmitReply::Invalid {
                reason: "too long".into(),
            }),
            Reply::Status(Status {
                id: 2,
                term: 9,
                leader: Some(1),
                last_applied: Some(log_id(9, 1, 100)),
                last_log_index: Some(101),
                members: vec![(1, "a".into()), (2, "b".into())],
                snapshots_installed: 3,
                snapshots_refused: 1,
                log_fsyncs: 77,
            }),
            Reply::Entries(entries()),
            Reply::Export {
                last_applied: None,
                snapshot: vec![9; 40],
            },
            Reply::Failed("busy".into()),
        ]
    }

    fn parse(bytes: &[u8]) -> Result<Frame, FrameError> {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 4);
        parse_frame(&bytes[4..])
    }

    #[test]
    fn every_message_round_trips_and_every_cut_or_extra_byte_is_refused() {
        for (i, req) in requests().into_iter().enumerate() {
            let bytes = req.encode(i as u64).unwrap();
            let f = parse(&bytes).unwrap();
            assert_eq!(f.id, i as u64);
            let back = Request::decode(&f).unwrap();
            assert_eq!(format!("{back:?}"), format!("{req:?}"));
            for cut in 0..f.body.len() {
                let short = Frame {
                    kind: f.kind,
                    id: 0,
                    body: f.body[..cut].to_vec(),
                };
                assert!(Request::decode(&short).is_err(), "{req:?} cut at {cut}");
            }
            let mut long = f.body.clone();
            long.push(0);
            let long = Frame {
                kind: f.kind,
                id: 0,
                body: long,
            };
            // An export's state runs to the end of the frame; every other
            // body is exact.
            assert!(Request::decode(&long).is_err(), "{req:?} with a byte more");
        }
        for (i, reply) in replies().into_iter().enumerate() {
            let bytes = reply.encode(i as u64).unwrap();
            let f = parse(&bytes).unwrap();
            let back = Reply::decode(&f).unwrap();
            assert_eq!(format!("{back:?}"), format!("{reply:?}"));
            for cut in 0..f.body.len() {
                let short = Frame {
                    kind: f.kind,
                    id: 0,
                    body: f.body[..cut].to_vec(),
                };
                let decoded = Reply::decode(&short);
                // Cutting an export's state leaves a shorter state, which
                // the core crate's decoder refuses (its own checksum).
                if f.kind != Kind::ExportReply || cut < 1 {
                    assert!(decoded.is_err(), "{reply:?} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn a_damaged_frame_is_refused_by_its_checksum_and_its_head() {
        let bytes = requests()[0].encode(5).unwrap();
        for at in 4..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(parse(&bad).is_err(), "flip at {at} accepted");
        }
        // Another version, with a valid checksum, is refused by name.
        let mut other = bytes.clone();
        other[8] = VERSION + 1;
        let crc = crc32c::crc32c(&other[8..]);
        other[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(parse(&other), Err(FrameError::Version(v)) if v == VERSION + 1));
    }

    #[tokio::test]
    async fn a_length_past_the_bound_is_refused_before_allocation_and_short_frames_fail() {
        let mut claim = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        claim.extend_from_slice(&[0; 16]);
        assert!(matches!(
            read_frame(&mut claim.as_slice()).await,
            Err(FrameError::TooLong(n)) if n == MAX_FRAME as u64 + 1
        ));
        // A frame that claims more than arrives: an error, not a hang or a
        // 32 MiB buffer.
        let mut liar = (MAX_FRAME as u32).to_le_bytes().to_vec();
        liar.extend_from_slice(&[0; 100]);
        assert!(matches!(
            read_frame(&mut liar.as_slice()).await,
            Err(FrameError::Io(_))
        ));
        // Clean end before a frame; two frames back to back.
        assert!(read_frame(&mut [].as_slice()).await.unwrap().is_none());
        let mut two = Request::Status.encode(1).unwrap();
        two.extend(Request::Export.encode(2).unwrap());
        let mut r = two.as_slice();
        assert_eq!(read_frame(&mut r).await.unwrap().unwrap().id, 1);
        assert_eq!(
            read_frame(&mut r).await.unwrap().unwrap().kind,
            Kind::Export
        );
        assert!(read_frame(&mut r).await.unwrap().is_none());
    }

    #[test]
    fn counts_are_bounded_by_the_bytes_there() {
        // An AppendEntries claiming 2^32 - 1 entries in a few bytes.
        let f = frame(Kind::AppendEntries, 0, |out| {
            put_vote(out, &vote());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&u32::MAX.to_le_bytes());
            Ok(())
        })
        .unwrap();
        let f = parse(&f).unwrap();
        assert_eq!(Request::decode(&f).unwrap_err(), "more entries than bytes");
        // A frame whose body would pass the bound is not written.
        let huge = Request::Submit(Command::ImportPartition {
            export: vec![0; MAX_FRAME],
        });
        assert!(huge.encode(0).is_err());
    }

    #[test]
    fn a_snapshot_piece_past_its_snapshot_or_with_a_bad_checksum_is_refused() {
        let mut chunk = SnapshotChunk {
            vote: vote(),
            meta: meta(),
            total: 5,
            offset: 0,
            data: vec![1, 2, 3, 4, 5, 6],
        };
        let f = parse(&Request::SnapshotChunk(chunk.clone()).encode(0).unwrap()).unwrap();
        assert_eq!(
            Request::decode(&f).unwrap_err(),
            "a snapshot piece past the snapshot's end"
        );
        chunk.total = 6;
        let mut bytes = Request::SnapshotChunk(chunk).encode(0).unwrap();
        // Flip a data byte and fix the frame CRC: the piece's own CRC
        // still catches it.
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        let crc = crc32c::crc32c(&bytes[8..]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        let f = parse(&bytes).unwrap();
        assert_eq!(
            Request::decode(&f).unwrap_err(),
            "a snapshot piece's checksum"
        );
    }
}
