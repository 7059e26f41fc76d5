//! openraft's network between processes: TCP, one frame per message
//! ([`wire`]).
//!
//! **Sending** ([`TcpNetwork`], [`TcpConnection`]). openraft asks for one
//! connection per replication stream (and one for snapshots, one per
//! election), and makes one call at a time on each: so a connection is a
//! TCP stream with one request in flight, written and then read in the
//! caller's task (no relay task between them; measured in
//! docs/scaling.md). A stream is opened on first use and after any
//! failure; every call is bounded by openraft's time limit for it (a
//! heartbeat interval for AppendEntries, the shortest election timeout for
//! a vote) and every connect by [`TransportOptions::connect_timeout`]. A
//! call that openraft abandons at its time limit may leave half a frame on
//! the stream: the next call sees the call never finished and opens a new
//! stream rather than read a stale reply. A failed connect is
//! `Unreachable` (openraft waits a backoff, 10 ms doubling to 250 ms,
//! before it tries again), and so is a failure on a stream that never
//! answered (a peer that accepts and closes at once must not be retried
//! in a tight loop); a failure on a stream that answered before is a
//! network error (openraft retries at once, on a new stream). An AppendEntries whose frame would
//! pass [`MAX_FRAME`](crate::wire::MAX_FRAME) is answered "payload too
//! large" with a hint of half the entries, and openraft sends fewer.
//!
//! **Snapshots** travel in pieces of [`TransportOptions::snapshot_chunk`]
//! bytes, one request each, each with its offset and its CRC, each bounded
//! in time; the receiver ([`SnapshotReceiver`]) takes them only in order,
//! grows its buffer with the bytes that arrived (never by the length a
//! piece claims), and verifies the whole snapshot with the crate's own
//! checksums ([`verify_snapshot`]) before openraft sees it. A damaged or
//! out-of-order transfer is refused and openraft sends the snapshot again.
//!
//! **Addresses** are the ones in the membership (`BasicNode::addr`), and
//! only loopback addresses unless the transport is told otherwise
//! ([`TransportOptions::allow_remote`]): the frames are neither encrypted
//! nor authenticated (docs/scaling.md, "What a deployment on several
//! machines needs").

use std::future::Future;
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError,
    ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::Snapshot;
use openraft::{BasicNode, Raft, SnapshotMeta, Vote};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::state::verify_snapshot;
use crate::wire::{self, Reply, Request, SnapshotAck, SnapshotChunk};
use crate::{NodeId, TypeConfig};

/// How replicas reach each other.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TransportOptions {
    /// How long a connect may take. Default 500 ms.
    pub connect_timeout: Duration,
    /// Bytes per snapshot piece. Default 1 MiB.
    pub snapshot_chunk: usize,
    /// How long one snapshot piece may take, its answer included (the last
    /// piece's answer waits for the receiver to verify and install the
    /// snapshot). Default 30 s.
    pub snapshot_timeout: Duration,
    /// Whether addresses other than loopback may be used. Default false:
    /// nothing on the wire is encrypted or authenticated.
    pub allow_remote: bool,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            connect_timeout: Duration::from_millis(500),
            snapshot_chunk: 1 << 20,
            snapshot_timeout: Duration::from_secs(30),
            allow_remote: false,
        }
    }
}

impl TransportOptions {
    /// These options with `allow` for non-loopback addresses.
    pub fn allow_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }
}

/// The address `addr` names, if these options allow it.
pub(crate) fn resolve(addr: &str, options: &TransportOptions) -> Result<SocketAddr, String> {
    let a: SocketAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IP address and port"))?;
    if !a.ip().is_loopback() && !options.allow_remote {
        return Err(format!(
            "{a} is not a loopback address, and the transport is neither encrypted nor \
             authenticated (allow it explicitly)"
        ));
    }
    Ok(a)
}

/// Creates a [`TcpConnection`] per target openraft asks for.
#[derive(Clone)]
pub struct TcpNetwork {
    options: Arc<TransportOptions>,
}

impl TcpNetwork {
    /// A network with these options.
    pub fn new(options: TransportOptions) -> TcpNetwork {
        TcpNetwork {
            options: Arc::new(options),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = TcpConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpConnection {
        TcpConnection {
            target,
            addr: resolve(&node.addr, &self.options),
            options: self.options.clone(),
            stream: None,
            in_call: false,
            answered: false,
            next_id: 0,
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// No stream could be opened: the target is down or unknown.
    #[error("cannot reach node {target} at {addr}: {why}")]
    Unreachable {
        target: NodeId,
        addr: String,
        why: String,
    },
    /// The stream failed, timed out or answered nonsense mid-call.
    #[error("node {target}: {why}")]
    Failed { target: NodeId, why: String },
}

impl CallError {
    fn rpc<E: std::error::Error>(self) -> RPCError<NodeId, BasicNode, E> {
        match self {
            e @ CallError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
            e @ CallError::Failed { .. } => RPCError::Network(NetworkError::new(&e)),
        }
    }

    fn streaming(self) -> StreamingError<TypeConfig, Fatal<NodeId>> {
        match self {
            e @ CallError::Unreachable { .. } => Unreachable::new(&e).into(),
            e @ CallError::Failed { .. } => NetworkError::new(&e).into(),
        }
    }
}

/// openraft's handle to one other replica: one TCP stream, one call at a
/// time (module docs).
pub struct TcpConnection {
    target: NodeId,
    addr: Result<SocketAddr, String>,
    options: Arc<TransportOptions>,
    stream: Option<BufReader<TcpStream>>,
    /// A call began and did not finish: the stream may hold half a frame.
    in_call: bool,
    /// The stream has answered a call: a failure on it is the network's,
    /// not a peer that cannot be reached.
    answered: bool,
    next_id: u64,
}

impl TcpConnection {
    fn unreachable(&self, why: impl ToString) -> CallError {
        CallError::Unreachable {
            target: self.target,
            addr: match &self.addr {
                Ok(a) => a.to_string(),
                Err(_) => "?".into(),
            },
            why: why.to_string(),
        }
    }

    fn failed(&self, why: impl ToString) -> CallError {
        CallError::Failed {
            target: self.target,
            why: why.to_string(),
        }
    }

    /// Sends the frame `frame` (of request `id`) and reads its reply,
    /// within `timeout` in all (connect included).
    async fn call(&mut self, id: u64, frame: &[u8], timeout: Duration) -> Result<Reply, CallError> {
        if std::mem::replace(&mut self.in_call, true) {
            self.stream = None;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        if self.stream.is_none() {
            let addr = self.addr.clone().map_err(|e| self.unreachable(e))?;
            let limit = self.options.connect_timeout.min(timeout);
            let s = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(self.unreachable(e)),
                Err(_) => return Err(self.unreachable(format!("no connection within {limit:?}"))),
            };
            let _ = s.set_nodelay(true);
            self.stream = Some(BufReader::new(s));
            self.answered = false;
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(self.unreachable("no stream"));
        };
        let exchange = async {
            stream.get_mut().write_all(frame).await?;
            wire::read_frame(stream)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        let got = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(Some(f))) if f.id == id => Reply::decode(&f).map_err(|e| self.failed(e)),
            Ok(Ok(Some(f))) => Err(self.failed(format!("a reply to {} for {id}", f.id))),
            Ok(Ok(None)) => Err(self.failed("the connection closed")),
            Ok(Err(e)) => Err(self.failed(e)),
            Err(_) => Err(self.failed(format!("no answer within {timeout:?}"))),
        };
        self.in_call = false;
        match got {
            Ok(reply) => {
                self.answered = true;
                Ok(reply)
            }
            // A stream that never answered (accepted and closed at once, as
            // by a proxy in front of a node that is down): the peer cannot
            // be reached, and openraft should back off, not retry at once.
            Err(CallError::Failed { why, .. }) if !self.answered => {
                self.stream = None;
                Err(self.unreachable(why))
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }

    async fn request(&mut self, req: &Request, timeout: Duration) -> Result<Reply, CallError> {
        self.next_id += 1;
        let id = self.next_id;
        let frame = req.encode(id).map_err(|e| self.failed(e))?;
        self.call(id, &frame, timeout).await
    }
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for TcpConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let n = rpc.entries.len() as u64;
        self.next_id += 1;
        let id = self.next_id;
        let frame = match Request::AppendEntries(rpc).encode(id) {
            Ok(f) => f,
            // Only a frame past the bound fails to encode (an entry's
            // payload was encoded once already, into the log): fewer.
            Err(e) if n > 1 => {
                let hint = PayloadTooLarge::new_entries_hint(n / 2);
                return Err(RPCError::PayloadTooLarge(hint.with_source_error(&e)));
            }
            Err(e) => return Err(self.failed(e).rpc()),
        };
        match self.call(id, &frame, option.hard_ttl()).await {
            Ok(Reply::AppendEntries(r)) => Ok(r),
            Ok(other) => Err(self.failed(unexpected(&other)).rpc()),
            Err(e) => Err(e.rpc()),
        }
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        // Snapshots travel whole through `full_snapshot`; openraft 0.9 only
        // calls this chunked API from its default `full_snapshot`.
        Err(self.failed("chunked snapshots are not used").rpc())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        match self.request(&Request::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(other) => Err(self.failed(unexpected(&other)).rpc()),
            Err(e) => Err(e.rpc()),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let meta = snapshot.meta.clone();
        let data = snapshot.snapshot.into_inner();
        tokio::select! {
            r = self.send_snapshot(vote, meta, &data) => r,
            closed = cancel => Err(StreamingError::Closed(closed)),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new((0..).map(|i: u32| Duration::from_millis(10u64 << i.min(5)).min(BACKOFF_MAX)))
    }
}

/// The longest wait openraft makes before trying an unreachable replica
/// again.
const BACKOFF_MAX: Duration = Duration::from_millis(250);

fn unexpected(reply: &Reply) -> String {
    match reply {
        Reply::Failed(why) => format!("refused: {why}"),
        other => format!("an unexpected reply: {other:?}"),
    }
}

impl TcpConnection {
    /// Sends `data` in pieces, in order, each within the snapshot timeout:
    /// at most one piece per [`TransportOptions::snapshot_chunk`] bytes,
    /// since every answer must move the offset forward.
    async fn send_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, BasicNode>,
        data: &[u8],
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let total = data.len() as u64;
        let chunk = self.options.snapshot_chunk.max(1);
        let timeout = self.options.snapshot_timeout;
        let mut offset = 0usize;
        loop {
            let end = (offset + chunk).min(data.len());
            let piece = Request::SnapshotChunk(SnapshotChunk {
                vote,
                meta: meta.clone(),
                total,
                offset: offset as u64,
                data: data[offset..end].to_vec(),
            });
            match self.request(&piece, timeout).await {
                Ok(Reply::Snapshot(SnapshotAck::Installed { vote })) if end == data.len() => {
                    return Ok(SnapshotResponse { vote });
                }
                Ok(Reply::Snapshot(SnapshotAck::Received { next }))
                    if next == end as u64 && end < data.len() =>
                {
                    offset = end;
                }
                Ok(other) => return Err(self.failed(unexpected(&other)).streaming()),
                Err(e) => return Err(e.streaming()),
            }
        }
    }
}

/// What a node's snapshot receivers did, over all its connections.
#[derive(Debug, Default)]
pub struct ReceivedSnapshots {
    /// Snapshots received whole, verified and installed.
    pub installed: AtomicU64,
    /// Snapshots refused: damaged, or pieces out of order.
    pub refused: AtomicU64,
}

/// The receiving side of snapshot transfers on one connection: pieces in
/// order, each appended as it arrives, the whole verified before openraft
/// installs it.
pub struct SnapshotReceiver {
    /// The transfer under way: its metadata, length, and the bytes so far.
    transfer: Option<(SnapshotMeta<NodeId, BasicNode>, u64, Vec<u8>)>,
    counts: Arc<ReceivedSnapshots>,
}

impl SnapshotReceiver {
    /// A receiver that counts in `counts`.
    pub fn new(counts: Arc<ReceivedSnapshots>) -> SnapshotReceiver {
        SnapshotReceiver {
            transfer: None,
            counts,
        }
    }

    /// Takes one piece; installs the snapshot through `raft` when it is
    /// whole and verifies.
    pub async fn receive(&mut self, raft: &Raft<TypeConfig>, piece: SnapshotChunk) -> Reply {
        if piece.offset == 0 {
            // A new transfer (or the same one again): what came before is
            // dropped. The buffer grows with the pieces, never by `total`.
            self.transfer = Some((piece.meta.clone(), piece.total, Vec::new()));
        }
        let in_order = self.transfer.as_ref().is_some_and(|(meta, total, got)| {
            *meta == piece.meta && *total == piece.total && got.len() as u64 == piece.offset
        });
        if !in_order {
            self.transfer = None;
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            return Reply::Failed("a snapshot piece out of order: send it again from 0".into());
        }
        let Some((_, total, got)) = self.transfer.as_mut() else {
            return Reply::Failed("no snapshot transfer".into());
        };
        got.extend_from_slice(&piece.data);
        if (got.len() as u64) < *total {
            return Reply::Snapshot(SnapshotAck::Received {
                next: got.len() as u64,
            });
        }
        let Some((meta, _, data)) = self.transfer.take() else {
            return Reply::Failed("no snapshot transfer".into());
        };
        // Nothing reaches openraft unless it verifies.
        if let Err(e) = verify_snapshot(&meta, &data) {
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            return Reply::Failed(format!("snapshot refused: {e}"));
        }
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        };
        match raft.install_full_snapshot(piece.vote, snapshot).await {
            Ok(r) => {
                self.counts.installed.fetch_add(1, Ordering::Relaxed);
                Reply::Snapshot(SnapshotAck::Installed { vote: r.vote })
            }
            Err(e) => Reply::Failed(e.to_string()),
        }
    }
}

/// Answers one Raft request (AppendEntries, a vote, a snapshot piece)
/// through the local `raft`; any other request is handed back.
pub async fn answer_raft(
    raft: &Raft<TypeConfig>,
    snapshots: &mut SnapshotReceiver,
    request: Request,
) -> Result<Reply, Request> {
    Ok(match request {
        Request::AppendEntries(rpc) => match raft.append_entries(rpc).await {
            Ok(r) => Reply::AppendEntries(r),
            Err(e) => Reply::Failed(e.to_string()),
        },
        Request::Vote(rpc) => match raft.vote(rpc).await {
            Ok(r) => Reply::Vote(r),
            Err(e) => Reply::Failed(e.to_string()),
        },
        Request::SnapshotChunk(piece) => snapshots.receive(raft, piece).await,
        other => return Err(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_unless_allowed() {
        let o = TransportOptions::default();
        assert!(resolve("127.0.0.1:7001", &o).is_ok());
        assert!(resolve("[::1]:7001", &o).is_ok());
        assert!(
            resolve("10.0.0.1:7001", &o)
                .unwrap_err()
                .contains("loopback")
        );
        assert!(resolve("localhost:7001", &o).is_err());
        assert!(resolve("10.0.0.1:7001", &o.allow_remote(true)).is_ok());
    }

    #[test]
    fn the_backoff_doubles_to_its_cap() {
        let c = TcpConnection {
            target: 1,
            addr: Err(String::new()),
            options: Arc::new(TransportOptions::default()),
            stream: None,
            in_call: false,
            answered: false,
            next_id: 0,
        };
        let waits: Vec<_> = c.backoff().take(8).collect();
        assert_eq!(waits[0], Duration::from_millis(10));
        assert_eq!(waits[4], Duration::from_millis(160));
        assert_eq!(waits[7], BACKOFF_MAX);
    }
}
