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
use openraft::{BasicNode, Entry, LogId, SnapshotMeta, Vote};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::command::{Command, Reader};
use crate::proposer::Answer;
use crate::{NodeId, TypeConfig};

mod fields;
use fields::{
    get_entries, get_log_id, get_opt_log_id, get_response, get_str, get_vote, put_entries,
    put_log_id, put_opt_log_id, put_response, put_str, put_u32_len, put_vote,
};

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
#[path = "wire_tests.rs"]
mod tests;
