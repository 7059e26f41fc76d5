//! The Kafka protocol over TCP: connections, framing and dispatch; the
//! request handlers are in the submodules.
//!
//! Every request is a 4-byte big-endian size and a body: a request header
//! (API key, version, correlation id, client id) and the request. A
//! connection's requests are handled one at a time, in order, and answered
//! in order, as Kafka does: a producer pipelines up to five produce requests
//! and relies on their order.
//!
//! A known API at a version this broker does not advertise is answered
//! with `UNSUPPORTED_VERSION` in that API's response (ApiVersions itself
//! with a version 0 response listing what is supported, as Kafka does).
//! The connection is closed only for what cannot be answered at all: a
//! frame that is not a Kafka request, an unknown API key, or a version the
//! protocol does not define (there is no response format to answer in),
//! which is what Kafka's broker does too.
//!
//! # What a client can take ([`crate::limits`])
//!
//! - Connections: at most `max.connections`, and never so many that the
//!   descriptors the partitions need are taken
//!   ([`crate::limits::connection_room`]); one more is accepted and closed
//!   at once (no Kafka response exists for "too many"), with a warning
//!   logged at most once a second.
//! - Time: a connection that does not complete a request within
//!   `connections.max.idle.ms` of the previous one is closed.
//! - Memory: a frame's declared size is checked against
//!   `socket.request.max.bytes` before anything is read; a frame over
//!   64 KiB then waits for room for its declared size in
//!   `queued.max.request.bytes` (shared by every connection), and every
//!   body is read as it arrives, so a client that declares 100 MiB and
//!   sends 10 bytes holds 10 bytes of memory (and the large-request room,
//!   until `connections.max.idle.ms` closes it; small requests are not
//!   held up by it). Decoding is bounded by the
//!   frame (every declared length, in the patched `kafka-protocol`) and by
//!   `decode::MAX_FIELD_READS` (what the elements cost decoded). Fetch
//!   responses hold their record bytes within `fetch.max.bytes` over all
//!   connections.

mod decode;
mod fetch;
mod group;
mod metadata;
mod produce;
mod producers;
mod txn;
mod unsupported;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::Broker;
use crate::limits::Limits;
use decode::{Budgeted, MAX_FIELD_READS};

/// The APIs and versions this broker serves, as ApiVersions advertises them.
/// Versions are capped below those that address topics by id only (Fetch
/// 13+, Produce 13, Metadata 10+ add topic ids), which this broker has not.
///
/// The group APIs stop below the versions that carry a `group.instance.id`
/// (JoinGroup 5, SyncGroup 3, Heartbeat 3, LeaveGroup 3, OffsetCommit 7):
/// static membership is not served, and a client configured for it learns
/// that from these versions at once.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 11),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 9),
    (ApiKey::OffsetCommit, 2, 6),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 4),
    (ApiKey::Heartbeat, 0, 2),
    (ApiKey::LeaveGroup, 0, 2),
    (ApiKey::SyncGroup, 0, 2),
    (ApiKey::DescribeGroups, 0, 4),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeProducers, 0, 0),
];

const NODE_ID: i32 = 0;
/// Bytes read from a socket at a time into a request's buffer, so that its
/// memory follows what has arrived, not what was declared.
const READ_CHUNK: usize = 64 << 10;

/// What to do after a request.
enum Reply {
    /// The response's bytes, and the room its records hold in
    /// `fetch.max.bytes` until they are written.
    Send(Bytes, Option<OwnedSemaphorePermit>),
    /// acks=0 produce: no response.
    Nothing,
    Close(String),
}

/// What every connection shares: the broker and the bounds of
/// [`crate::limits`] that hold over all of them.
pub(crate) struct Shared {
    broker: Arc<Broker>,
    limits: Limits,
    /// Request bytes read and not yet answered (`queued.max.request.bytes`).
    requests: Arc<Semaphore>,
    /// Record bytes of Fetch responses being built or sent
    /// (`fetch.max.bytes`).
    fetches: Arc<Semaphore>,
    /// Connections open now.
    open: AtomicUsize,
    /// Connections refused for `max.connections` since the last warning.
    refused: AtomicU64,
    /// The process's open-file limit.
    nofile: u64,
}

impl Shared {
    pub(crate) fn new(broker: Arc<Broker>) -> Arc<Shared> {
        let limits = broker.config().limits.clone();
        Arc::new(Shared {
            requests: Arc::new(Semaphore::new(
                limits.queued_max_request_bytes.min(Semaphore::MAX_PERMITS),
            )),
            fetches: Arc::new(Semaphore::new(
                limits.fetch_max_bytes.min(Semaphore::MAX_PERMITS),
            )),
            broker,
            limits,
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            nofile: crate::limits::open_file_limit(),
        })
    }
}

/// Counts a connection open until dropped.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts connections until `shutdown` turns true, then stops accepting,
/// asks every connection to stop after its current request and waits for
/// them (at most 10 s).
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let sweeper = Sweeper::start(broker.clone());
    let shared = Shared::new(broker);
    let ticker = {
        let shared = shared.clone();
        let swept_here = sweeper.is_none();
        tokio::spawn(async move {
            // Group sessions and rebalances are timed in tenths of a second.
            let mut every = tokio::time::interval(Duration::from_millis(100));
            let mut last_sweep = Instant::now();
            loop {
                every.tick().await;
                shared.broker.groups().tick(Instant::now());
                // Without a sweeper thread, the sweep runs here, on the
                // runtime's blocking pool.
                if swept_here && last_sweep.elapsed() >= Duration::from_secs(1) {
                    last_sweep = Instant::now();
                    let b = shared.broker.clone();
                    let _ = tokio::task::spawn_blocking(move || b.sweep_transactions()).await;
                }
            }
        })
    };
    let mut conns = tokio::task::JoinSet::new();
    let mut last_warning: Option<Instant> = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let room = crate::limits::connection_room(
                        shared.limits.max_connections,
                        shared.nofile,
                        shared.broker.partitions_open(),
                    );
                    if shared.open.load(Ordering::Relaxed) >= room {
                        refuse(&shared, stream, peer, room, &mut last_warning);
                        continue;
                    }
                    shared.open.fetch_add(1, Ordering::Relaxed);
                    let open = Open(shared.clone());
                    shared.broker.stats.connections.fetch_add(1, Ordering::Relaxed);
                    let _ = stream.set_nodelay(true);
                    tracing::debug!(%peer, "connection accepted");
                    conns.spawn(connection(open, stream, peer, shutdown.clone()));
                }
                Err(e) => {
                    // EMFILE and its kind: nothing to do but wait for a
                    // connection to close.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    ticker.abort();
    // Wait for the ticker and the sweeper to be dropped: they hold the
    // broker, which the caller takes back once serve returns.
    let _ = ticker.await;
    if let Some(s) = sweeper {
        let _ = tokio::task::spawn_blocking(move || s.stop()).await;
    }
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("connections did not finish within 10 s; aborting them");
    }
}

/// The thread that aborts transactions past their `transaction.timeout.ms`
/// once a second (writing markers blocks). A thread of its own rather
/// than the runtime's blocking pool: a pool thread used every second never
/// retires, and while other blocking work overlapped it (a topic of 10,000
/// partitions created) the pool kept a second one alive, so an idle
/// broker's thread count depended on its history and its partitions.
struct Sweeper {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Sweeper {
    /// `None` (and a warning) if the thread cannot be started: the sweep
    /// then runs on the runtime's blocking pool.
    fn start(broker: Arc<Broker>) -> Option<Sweeper> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("producer-state-txn-sweep".into())
            .spawn(move || {
                // Until the sender is dropped (or sends).
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Duration::from_secs(1))
                {
                    broker.sweep_transactions();
                }
            });
        match thread {
            Ok(thread) => Some(Sweeper { stop, thread }),
            Err(e) => {
                tracing::warn!(error = %e, "no thread for the transaction sweep; the runtime's blocking pool runs it");
                None
            }
        }
    }

    /// Stops the thread after its current sweep and waits for it.
    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// Closes a connection over `max.connections` at once, and says so in the
/// log at most once a second (with how many were refused meanwhile).
fn refuse(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    room: usize,
    last: &mut Option<Instant>,
) {
    drop(stream);
    shared
        .broker
        .stats
        .connections_refused
        .fetch_add(1, Ordering::Relaxed);
    let refused = shared.refused.fetch_add(1, Ordering::Relaxed) + 1;
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *last = Some(Instant::now());
        shared.refused.store(0, Ordering::Relaxed);
        tracing::warn!(
            %peer, refused, open = room, max_connections = shared.limits.max_connections,
            partitions = shared.broker.partitions_open(), nofile = shared.nofile,
            "refused connections: max.connections, or the descriptors left after the partitions', are taken"
        );
    }
}

/// Why a connection stops reading.
enum Stop {
    /// The client closed it between requests.
    Closed,
    /// No complete request within `connections.max.idle.ms`.
    Idle,
    /// A frame this broker does not take, or the socket failed.
    Bad(String),
}

/// Reads the next request frame. A frame over [`READ_CHUNK`] first takes
/// room for its whole declared size in `queued.max.request.bytes` (held
/// until the returned permit is dropped), as Kafka's memory pool does; a
/// smaller one is read without (at most `max.connections` of them are
/// read at once, and each holds only the bytes that have arrived), so a
/// client holding the pool with a large frame it does not send does not
/// stop the small requests of others.
async fn read_frame(
    shared: &Shared,
    stream: &mut TcpStream,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Stop> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Stop::Closed),
        Err(e) => return Err(Stop::Bad(e.to_string())),
    }
    let len = i32::from_be_bytes(len);
    let max = shared
        .limits
        .socket_request_max_bytes
        .min(shared.limits.queued_max_request_bytes.max(READ_CHUNK));
    let len = match usize::try_from(len) {
        Ok(n) if n <= max => n,
        _ => {
            return Err(Stop::Bad(format!(
                "request size {len} is not within 0 to {max} (socket.request.max.bytes, \
                 queued.max.request.bytes)"
            )));
        }
    };
    let permit = if len > READ_CHUNK {
        let permits = u32::try_from(len).unwrap_or(u32::MAX);
        Some(
            shared
                .requests
                .clone()
                .acquire_many_owned(permits)
                .await
                .map_err(|_| Stop::Bad("the broker is stopping".into()))?,
        )
    } else {
        None
    };
    let mut buf = BytesMut::with_capacity(len.min(READ_CHUNK));
    while buf.len() < len {
        let want = (len - buf.len()).min(READ_CHUNK);
        buf.reserve(want);
        let n = (&mut *stream)
            .take(want as u64)
            .read_buf(&mut buf)
            .await
            .map_err(|e| Stop::Bad(e.to_string()))?;
        if n == 0 {
            return Err(Stop::Bad(format!(
                "the connection closed {} bytes into a {len}-byte request",
                buf.len()
            )));
        }
    }
    Ok((buf.freeze(), permit))
}

async fn connection(
    open: Open,
    mut stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = open.0.clone();
    let idle = shared.limits.connections_max_idle;
    loop {
        let frame = tokio::select! {
            f = tokio::time::timeout(idle, read_frame(&shared, &mut stream)) => {
                f.unwrap_or(Err(Stop::Idle))
            }
            _ = shutdown.changed() => break,
        };
        let (frame, _permit) = match frame {
            Ok(f) => f,
            Err(Stop::Closed) => break,
            Err(Stop::Idle) => {
                tracing::info!(%peer, idle_ms = idle.as_millis() as u64, "closing an idle connection (connections.max.idle.ms)");
                break;
            }
            Err(Stop::Bad(why)) => {
                tracing::warn!(%peer, reason = %why, "closing connection");
                break;
            }
        };
        match handle(&shared, frame).await {
            Reply::Send(bytes, _held) => {
                if let Err(e) = stream.write_all(&bytes).await {
                    tracing::debug!(%peer, error = %e, "writing a response failed");
                    break;
                }
            }
            Reply::Nothing => {}
            Reply::Close(why) => {
                tracing::warn!(%peer, reason = %why, "closing connection");
                break;
            }
        }
    }
    drop(open);
}

fn encode_response(correlation_id: i32, key: ApiKey, version: i16, resp: &ResponseKind) -> Reply {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let encoded = header
        .encode(&mut buf, key.response_header_version(version))
        .and_then(|()| resp.encode(&mut buf, version));
    if let Err(e) = encoded {
        return Reply::Close(format!(
            "encoding the {key:?} v{version} response failed: {e}"
        ));
    }
    let size = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Reply::Send(buf.freeze(), None)
}

fn advertised(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, min, max)| (min, max))
}

/// A request read from its frame.
struct Parsed {
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: String,
    request: RequestKind,
}

/// Reads a request's header and body from its frame `buf`, or the reply
/// that ends it there: a frame that is no request closes the connection,
/// an unadvertised version gets `UNSUPPORTED_VERSION`.
fn parse(buf: Bytes) -> Result<Parsed, Reply> {
    if buf.len() < 8 {
        return Err(Reply::Close(format!(
            "a {}-byte frame is no request",
            buf.len()
        )));
    }
    let raw_key = i16::from_be_bytes([buf[0], buf[1]]);
    let version = i16::from_be_bytes([buf[2], buf[3]]);
    let correlation_id = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Err(Reply::Close(format!("unknown API key {raw_key}")));
    };
    let mut buf = Budgeted::new(buf, MAX_FIELD_READS);
    let header = match RequestHeader::decode(&mut buf, key.request_header_version(version)) {
        Ok(h) => h,
        Err(e) => {
            return Err(Reply::Close(format!(
                "malformed {key:?} v{version} request header: {e:#}"
            )));
        }
    };
    let client_id = header.client_id.as_deref().unwrap_or("").to_string();
    let in_range = advertised(key).is_some_and(|(min, max)| (min..=max).contains(&version));
    if !in_range {
        tracing::info!(
            ?key,
            version,
            "unsupported request answered with UNSUPPORTED_VERSION"
        );
        if key == ApiKey::ApiVersions {
            // Kafka answers an ApiVersions it cannot parse with version 0,
            // which every client reads, so the client can pick a version.
            let resp = ResponseKind::ApiVersions(unsupported::api_versions(
                ResponseError::UnsupportedVersion.code(),
            ));
            return Err(encode_response(correlation_id, key, 0, &resp));
        }
        return Err(unsupported::unsupported(
            key,
            version,
            correlation_id,
            buf.into_inner(),
        ));
    }
    let request = match decode::request(key, &mut buf, version) {
        Some(Ok(r)) => r,
        None => {
            return Err(Reply::Close(format!(
                "{key:?} is advertised but has no decoder"
            )));
        }
        Some(Err(_)) if buf.exhausted() => {
            return Err(Reply::Close(format!(
                "{key:?} v{version} request takes more than {MAX_FIELD_READS} fields to decode"
            )));
        }
        Some(Err(e)) => {
            return Err(Reply::Close(format!(
                "malformed {key:?} v{version} request: {e:#}"
            )));
        }
    };
    Ok(Parsed {
        key,
        version,
        correlation_id,
        client_id,
        request,
    })
}

async fn handle(shared: &Arc<Shared>, buf: Bytes) -> Reply {
    let Parsed {
        key,
        version,
        correlation_id,
        client_id,
        request,
    } = match parse(buf) {
        Ok(p) => p,
        Err(reply) => return reply,
    };
    let broker = &shared.broker;
    let started = Instant::now();
    let response = match request {
        RequestKind::ApiVersions(_) => {
            Some(ResponseKind::ApiVersions(unsupported::api_versions(0)))
        }
        RequestKind::Metadata(r) => Some(ResponseKind::Metadata(
            metadata::metadata(broker, r, version).await,
        )),
        RequestKind::InitProducerId(r) => {
            Some(ResponseKind::InitProducerId(match r.transactional_id {
                Some(id) => {
                    txn::init_producer_id(shared, id.0.to_string(), r.transaction_timeout_ms).await
                }
                None => produce::init_producer_id(broker, r).await,
            }))
        }
        RequestKind::AddPartitionsToTxn(r) => Some(ResponseKind::AddPartitionsToTxn(
            txn::add_partitions(shared, r, version).await,
        )),
        RequestKind::AddOffsetsToTxn(r) => Some(ResponseKind::AddOffsetsToTxn(
            txn::add_offsets(shared, r, version).await,
        )),
        RequestKind::EndTxn(r) => {
            Some(ResponseKind::EndTxn(txn::end_txn(shared, r, version).await))
        }
        RequestKind::TxnOffsetCommit(r) => Some(ResponseKind::TxnOffsetCommit(
            txn::txn_offset_commit(shared, r, version).await,
        )),
        RequestKind::Produce(r) => produce::produce(shared, r).await.map(ResponseKind::Produce),
        RequestKind::ListOffsets(r) => {
            Some(ResponseKind::ListOffsets(fetch::list_offsets(broker, r)))
        }
        RequestKind::FindCoordinator(r) => Some(ResponseKind::FindCoordinator(
            group::find_coordinator(shared, r, version),
        )),
        RequestKind::JoinGroup(r) => Some(ResponseKind::JoinGroup(
            group::join_group(shared, r, version, &client_id).await,
        )),
        RequestKind::SyncGroup(r) => {
            Some(ResponseKind::SyncGroup(group::sync_group(shared, r).await))
        }
        RequestKind::Heartbeat(r) => Some(ResponseKind::Heartbeat(group::heartbeat(shared, r))),
        RequestKind::LeaveGroup(r) => Some(ResponseKind::LeaveGroup(group::leave_group(
            shared, r, version,
        ))),
        RequestKind::OffsetCommit(r) => Some(ResponseKind::OffsetCommit(
            group::offset_commit(shared, r).await,
        )),
        RequestKind::OffsetFetch(r) => Some(ResponseKind::OffsetFetch(group::offset_fetch(
            shared, r, version,
        ))),
        RequestKind::DescribeGroups(r) => Some(ResponseKind::DescribeGroups(
            group::describe_groups(shared, r),
        )),
        RequestKind::ListGroups(_) => Some(ResponseKind::ListGroups(group::list_groups(shared))),
        RequestKind::DescribeProducers(r) => Some(ResponseKind::DescribeProducers(
            producers::describe_producers(&shared.broker, r),
        )),
        RequestKind::Fetch(r) => {
            let (response, held) = fetch::fetch(shared, r).await;
            return match encode_response(
                correlation_id,
                key,
                version,
                &ResponseKind::Fetch(response),
            ) {
                Reply::Send(bytes, _) => Reply::Send(bytes, held),
                other => other,
            };
        }
        other => {
            return Reply::Close(format!("{other:?} is advertised but has no handler"));
        }
    };
    tracing::debug!(
        ?key, version, correlation_id, client = %client_id,
        ms = started.elapsed().as_secs_f64() * 1e3, "request answered"
    );
    match response {
        Some(r) => encode_response(correlation_id, key, version, &r),
        None => Reply::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_version_is_one_the_protocol_crate_can_encode() {
        for &(key, min, max) in SUPPORTED {
            let valid = key.valid_versions();
            assert!(valid.min <= min && max <= valid.max, "{key:?}");
        }
    }

    #[test]
    fn frames_that_are_no_request_close_without_panicking() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let broker =
            Arc::new(Broker::open(crate::Config::new(dir.path(), "127.0.0.1", 9092, 1)).unwrap());
        let shared = Shared::new(broker);
        for frame in [
            &b""[..],
            &[0, 0, 0],
            &[0x7f, 0x7f, 0, 0, 0, 0, 0, 1],
            &[0, 0, 0x7f, 0, 0, 0, 0, 1, 0xff],
            &[0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0xff],
        ] {
            let reply = rt.block_on(handle(&shared, Bytes::copy_from_slice(frame)));
            assert!(matches!(reply, Reply::Close(_) | Reply::Send(..)));
        }
        // Metadata v1 declaring 2^31 - 1 topics in a 21-byte frame: the
        // decoder used to reserve 154 GB for them and abort the process.
        let mut frame = vec![0, 3, 0, 1, 0, 0, 0, 7, 0, 0];
        frame.extend_from_slice(&i32::MAX.to_be_bytes());
        frame.extend_from_slice(&[0; 3]);
        match rt.block_on(handle(&shared, Bytes::from(frame))) {
            Reply::Close(why) => assert!(why.contains("more than the 3 bytes"), "{why}"),
            _ => panic!("a request whose array cannot fit in it was answered"),
        }
    }
}
