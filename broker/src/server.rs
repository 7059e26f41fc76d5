//! The Kafka protocol over TCP: framing, dispatch and the request handlers.
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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Broker;
use crate::partition::Produced;

/// The APIs and versions this broker serves, as ApiVersions advertises them.
/// Versions are capped below those that address topics by id only (Fetch
/// 13+, Produce 13, Metadata 10+ add topic ids), which this broker has not.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 11),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 9),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
];

/// The largest request frame taken (larger ones close the connection).
const MAX_FRAME: usize = 64 << 20;
/// The longest a fetch waits for data, whatever the client asks.
const MAX_FETCH_WAIT: Duration = Duration::from_secs(5);
const NODE_ID: i32 = 0;

/// What to do after a request.
enum Reply {
    Send(Vec<u8>),
    /// acks=0 produce: no response.
    Nothing,
    Close(String),
}

/// Accepts connections until `shutdown` turns true, then stops accepting,
/// asks every connection to stop after its current request and waits for
/// them (at most 10 s).
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    broker.stats.connections.fetch_add(1, Ordering::Relaxed);
                    let _ = stream.set_nodelay(true);
                    tracing::debug!(%peer, "connection accepted");
                    conns.spawn(connection(broker.clone(), stream, shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("connections did not finish within 10 s; aborting them");
    }
}

async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = i32::from_be_bytes(len);
    if len < 0 || len as usize > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("request size {len} out of range"),
        ));
    }
    let mut buf = BytesMut::zeroed(len as usize);
    stream.read_exact(&mut buf).await?;
    Ok(Some(buf.freeze()))
}

async fn connection(
    broker: Arc<Broker>,
    mut stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut stream) => f,
            _ = shutdown.changed() => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(?peer, error = %e, "connection closed");
                break;
            }
        };
        match handle(&broker, frame).await {
            Reply::Send(bytes) => {
                if let Err(e) = stream.write_all(&bytes).await {
                    tracing::debug!(?peer, error = %e, "writing a response failed");
                    break;
                }
            }
            Reply::Nothing => {}
            Reply::Close(why) => {
                tracing::warn!(?peer, reason = %why, "closing connection");
                break;
            }
        }
    }
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
    Reply::Send(buf.to_vec())
}

fn advertised(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, min, max)| (min, max))
}

fn api_versions(error: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error;
    r.finalized_features_epoch = -1;
    r.api_keys = SUPPORTED
        .iter()
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    r
}

async fn handle(broker: &Arc<Broker>, mut buf: Bytes) -> Reply {
    if buf.len() < 8 {
        return Reply::Close(format!("a {}-byte frame is no request", buf.len()));
    }
    let raw_key = i16::from_be_bytes([buf[0], buf[1]]);
    let version = i16::from_be_bytes([buf[2], buf[3]]);
    let correlation_id = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Reply::Close(format!("unknown API key {raw_key}"));
    };
    if let Err(e) = RequestHeader::decode(&mut buf, key.request_header_version(version)) {
        return Reply::Close(format!("malformed {key:?} v{version} request header: {e}"));
    }
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
            let resp =
                ResponseKind::ApiVersions(api_versions(ResponseError::UnsupportedVersion.code()));
            return encode_response(correlation_id, key, 0, &resp);
        }
        return unsupported(key, version, correlation_id, buf);
    }
    let request = match RequestKind::decode(key, &mut buf, version) {
        Ok(r) => r,
        Err(e) => return Reply::Close(format!("malformed {key:?} v{version} request: {e:#}")),
    };
    let response = match request {
        RequestKind::ApiVersions(_) => Some(ResponseKind::ApiVersions(api_versions(0))),
        RequestKind::Metadata(r) => {
            Some(ResponseKind::Metadata(metadata(broker, r, version).await))
        }
        RequestKind::InitProducerId(r) => Some(ResponseKind::InitProducerId(
            init_producer_id(broker, r).await,
        )),
        RequestKind::Produce(r) => produce(broker, r).await.map(ResponseKind::Produce),
        RequestKind::ListOffsets(r) => Some(ResponseKind::ListOffsets(list_offsets(broker, r))),
        RequestKind::Fetch(r) => Some(ResponseKind::Fetch(fetch(broker, r).await)),
        other => {
            return Reply::Close(format!("{other:?} is advertised but has no handler"));
        }
    };
    match response {
        Some(r) => encode_response(correlation_id, key, version, &r),
        None => Reply::Nothing,
    }
}

/// The response to a request this broker does not serve: the API's own
/// response with `UNSUPPORTED_VERSION`, for the APIs whose response carries
/// a top-level error code (and FindCoordinator, per key).
fn unsupported(key: ApiKey, version: i16, correlation_id: i32, mut body: Bytes) -> Reply {
    let valid = key.valid_versions();
    if version < valid.min || version > valid.max {
        return Reply::Close(format!(
            "{key:?} v{version} is not a version of the protocol: no response format to answer in"
        ));
    }
    let code = ResponseError::UnsupportedVersion.code();
    macro_rules! top_level {
        ($($api:ident => $resp:ident),* $(,)?) => {
            match key {
                $(ApiKey::$api => {
                    let mut r = $resp::default();
                    r.error_code = code;
                    Some(ResponseKind::$api(r))
                })*
                _ => None,
            }
        };
    }
    let resp = if key == ApiKey::FindCoordinator {
        let mut r = FindCoordinatorResponse::default();
        if version < 4 {
            // Versions 4+ answer per key and have no top-level fields.
            r.error_code = code;
            r.node_id = BrokerId(-1);
        } else if let Ok(req) = FindCoordinatorRequest::decode(&mut body, version) {
            r.coordinators = req
                .coordinator_keys
                .into_iter()
                .map(|k| {
                    Coordinator::default()
                        .with_key(k)
                        .with_node_id(BrokerId(-1))
                        .with_error_code(code)
                })
                .collect();
        }
        Some(ResponseKind::FindCoordinator(r))
    } else {
        top_level!(
            JoinGroup => JoinGroupResponse,
            Heartbeat => HeartbeatResponse,
            SyncGroup => SyncGroupResponse,
            LeaveGroup => LeaveGroupResponse,
            OffsetFetch => OffsetFetchResponse,
            ListGroups => ListGroupsResponse,
            SaslHandshake => SaslHandshakeResponse,
            SaslAuthenticate => SaslAuthenticateResponse,
            DescribeCluster => DescribeClusterResponse,
            EndTxn => EndTxnResponse,
            AddOffsetsToTxn => AddOffsetsToTxnResponse,
            DescribeAcls => DescribeAclsResponse,
            DescribeLogDirs => DescribeLogDirsResponse,
            DescribeClientQuotas => DescribeClientQuotasResponse,
            ElectLeaders => ElectLeadersResponse,
            ListPartitionReassignments => ListPartitionReassignmentsResponse,
            ListTransactions => ListTransactionsResponse,
            OffsetDelete => OffsetDeleteResponse,
            GetTelemetrySubscriptions => GetTelemetrySubscriptionsResponse,
            PushTelemetry => PushTelemetryResponse,
            ConsumerGroupHeartbeat => ConsumerGroupHeartbeatResponse,
            DescribeUserScramCredentials => DescribeUserScramCredentialsResponse,
            CreateDelegationToken => CreateDelegationTokenResponse,
            RenewDelegationToken => RenewDelegationTokenResponse,
            ExpireDelegationToken => ExpireDelegationTokenResponse,
            DescribeDelegationToken => DescribeDelegationTokenResponse,
            UpdateFeatures => UpdateFeaturesResponse,
        )
    };
    match resp {
        Some(r) => encode_response(correlation_id, key, version, &r),
        None => Reply::Close(format!(
            "{key:?} is not served and its response has no top-level error code to refuse it with"
        )),
    }
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

async fn metadata(broker: &Arc<Broker>, req: MetadataRequest, version: i16) -> MetadataResponse {
    let b = broker.clone();
    let topics = tokio::task::spawn_blocking(move || {
        let wanted: Option<Vec<String>> = match req.topics {
            Some(t) if !(version == 0 && t.is_empty()) => Some(
                t.into_iter()
                    .filter_map(|t| t.name.map(|n| n.0.to_string()))
                    .collect(),
            ),
            _ => None,
        };
        let create = version < 4 || req.allow_auto_topic_creation;
        match wanted {
            None => b
                .topics()
                .into_iter()
                .map(|(n, t)| (n, Ok(t)))
                .collect::<Vec<_>>(),
            Some(names) => names
                .into_iter()
                .map(|n| {
                    let t = if !crate::valid_topic_name(&n) {
                        Err(ResponseError::InvalidTopicException.code())
                    } else if create {
                        b.topic_or_create(&n).map_err(|e| {
                            tracing::error!(topic = %n, error = %e, "creating a topic failed");
                            ResponseError::KafkaStorageError.code()
                        })
                    } else {
                        b.topic(&n)
                            .ok_or(ResponseError::UnknownTopicOrPartition.code())
                    };
                    (n, t)
                })
                .collect(),
        }
    })
    .await
    .unwrap_or_default();
    let cfg = broker.config();
    let mut r = MetadataResponse::default();
    r.brokers = vec![
        MetadataResponseBroker::default()
            .with_node_id(BrokerId(NODE_ID))
            .with_host(str_bytes(&cfg.advertised_host))
            .with_port(cfg.advertised_port),
    ];
    r.cluster_id = Some(StrBytes::from_static_str("producer-state-broker"));
    r.controller_id = BrokerId(NODE_ID);
    r.topics = topics
        .into_iter()
        .map(|(name, t)| {
            let mut topic =
                MetadataResponseTopic::default().with_name(Some(TopicName(str_bytes(&name))));
            match t {
                Ok(t) => {
                    topic.partitions = (0..t.partitions.len() as i32)
                        .map(|i| {
                            MetadataResponsePartition::default()
                                .with_partition_index(i)
                                .with_leader_id(BrokerId(NODE_ID))
                                .with_leader_epoch(-1)
                                .with_replica_nodes(vec![BrokerId(NODE_ID)])
                                .with_isr_nodes(vec![BrokerId(NODE_ID)])
                        })
                        .collect();
                }
                Err(code) => topic.error_code = code,
            }
            topic
        })
        .collect();
    r
}

async fn init_producer_id(
    broker: &Arc<Broker>,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    if req.transactional_id.is_some() {
        r.error_code = ResponseError::InvalidRequest.code();
        return r;
    }
    // Like Kafka for a producer without a transactional id: always a new
    // id at epoch 0, also when the client asks to bump the epoch of its
    // current one (KIP-360); its old id's state is then simply unused.
    let b = broker.clone();
    match tokio::task::spawn_blocking(move || b.allocate_producer_id()).await {
        Ok(Ok(id)) => {
            tracing::info!(producer_id = id, "handed out a producer id");
            r.producer_id = ProducerId(id);
            r.producer_epoch = 0;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "storing the next producer id failed");
            r.error_code = ResponseError::UnknownServerError.code();
        }
        Err(e) => {
            tracing::error!(error = %e, "producer id task failed");
            r.error_code = ResponseError::UnknownServerError.code();
        }
    }
    r
}

/// One partition's part of a produce request.
struct Job {
    topic: usize,
    partition: i32,
    target: Option<Arc<crate::partition::Partition>>,
    records: Option<Bytes>,
}

async fn produce(broker: &Arc<Broker>, req: ProduceRequest) -> Option<ProduceResponse> {
    let acks = req.acks;
    let mut names = Vec::new();
    let mut jobs = Vec::new();
    for (ti, t) in req.topic_data.into_iter().enumerate() {
        let topic = broker.topic(t.name.0.as_str());
        names.push(t.name);
        for p in t.partition_data {
            let target = topic
                .as_ref()
                .and_then(|t| {
                    usize::try_from(p.index)
                        .ok()
                        .and_then(|i| t.partitions.get(i))
                })
                .cloned();
            jobs.push(Job {
                topic: ti,
                partition: p.index,
                target,
                records: p.records,
            });
        }
    }
    if req.transactional_id.is_some() {
        for j in &mut jobs {
            j.target = None;
        }
    }
    let b = broker.clone();
    let results: Vec<(usize, i32, Produced)> = tokio::task::spawn_blocking(move || {
        let run = |j: Job| -> (usize, i32, Produced) {
            let outcome = match (&j.target, j.records) {
                (None, _) => Produced::Refused {
                    code: ResponseError::UnknownTopicOrPartition.code(),
                    message: "unknown topic or partition".into(),
                },
                (Some(_), None) => Produced::Refused {
                    code: ResponseError::InvalidRecord.code(),
                    message: "no records".into(),
                },
                (Some(p), Some(records)) => {
                    let mut bytes = records.to_vec();
                    p.produce(&mut bytes)
                }
            };
            let name = j.target.as_ref().map(|p| p.name().to_string());
            match &outcome {
                Produced::Appended { .. } => {
                    b.stats.batches_appended.fetch_add(1, Ordering::Relaxed);
                }
                Produced::Duplicate { base_offset } => {
                    b.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(partition = ?name, base_offset, "DUPLICATE produce answered with the original offset");
                }
                Produced::Refused { code, message } => {
                    b.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(partition = ?name, code, %message, "produce refused");
                }
            }
            (j.topic, j.partition, outcome)
        };
        if jobs.len() <= 1 {
            jobs.into_iter().map(run).collect()
        } else {
            // Partitions are independent: classify and fsync them in parallel.
            std::thread::scope(|s| {
                let handles: Vec<_> = jobs
                    .into_iter()
                    .map(|j| s.spawn(|| run(j)))
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| h.join().ok())
                    .collect()
            })
        }
    })
    .await
    .unwrap_or_default();
    broker.data.notify_waiters();
    if acks == 0 {
        return None;
    }
    let mut r = ProduceResponse::default();
    r.responses = names
        .into_iter()
        .map(|n| TopicProduceResponse::default().with_name(n))
        .collect();
    for (ti, partition, outcome) in results {
        let mut p = PartitionProduceResponse::default()
            .with_index(partition)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(0);
        match outcome {
            Produced::Appended { base_offset } | Produced::Duplicate { base_offset } => {
                p.base_offset = base_offset;
            }
            Produced::Refused { code, message } => {
                p.error_code = code;
                p.base_offset = -1;
                p.error_message = Some(StrBytes::from_string(message));
            }
        }
        if let Some(t) = r.responses.get_mut(ti) {
            t.partition_responses.push(p);
        }
    }
    Some(r)
}

fn list_offsets(broker: &Arc<Broker>, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut r = ListOffsetsResponse::default();
    r.topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.topic(t.name.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let mut out = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_leader_epoch(-1)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    match topic.as_ref().and_then(|t| {
                        usize::try_from(p.partition_index)
                            .ok()
                            .and_then(|i| t.partitions.get(i))
                    }) {
                        Some(part) => {
                            let (offset, ts) = part.list_offset(p.timestamp);
                            out.offset = offset;
                            out.timestamp = ts;
                        }
                        None => out.error_code = ResponseError::UnknownTopicOrPartition.code(),
                    }
                    out
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    r
}

fn read_all(broker: &Broker, req: &FetchRequest) -> (Vec<FetchableTopicResponse>, usize) {
    let mut budget = usize::try_from(req.max_bytes).unwrap_or(0).max(1);
    let mut total = 0usize;
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let topic = broker.topic(t.topic.0.as_str());
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut out = PartitionData::default()
                        .with_partition_index(p.partition)
                        .with_aborted_transactions(Some(Vec::new()))
                        .with_preferred_read_replica(BrokerId(-1));
                    let part = topic.as_ref().and_then(|t| {
                        usize::try_from(p.partition)
                            .ok()
                            .and_then(|i| t.partitions.get(i))
                    });
                    let Some(part) = part else {
                        out.error_code = ResponseError::UnknownTopicOrPartition.code();
                        out.high_watermark = -1;
                        out.last_stable_offset = -1;
                        return out;
                    };
                    let max = usize::try_from(p.partition_max_bytes)
                        .unwrap_or(0)
                        .min(budget);
                    match part.read(p.fetch_offset, max) {
                        Ok((bytes, hw)) => {
                            out.high_watermark = hw;
                            out.last_stable_offset = hw;
                            budget = budget.saturating_sub(bytes.len());
                            total += bytes.len();
                            out.records = Some(Bytes::from(bytes));
                        }
                        Err(code) => {
                            out.error_code = code;
                            out.high_watermark = part.high_watermark();
                            out.last_stable_offset = out.high_watermark;
                        }
                    }
                    out
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_partitions(partitions)
        })
        .collect();
    (topics, total)
}

async fn fetch(broker: &Arc<Broker>, req: FetchRequest) -> FetchResponse {
    let wait =
        Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0)).min(MAX_FETCH_WAIT);
    let req = Arc::new(req);
    // Registered before reading, so a produce between the read and the
    // wait still wakes this fetch.
    let notified = broker.data.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let read = |b: Arc<Broker>, r: Arc<FetchRequest>| async move {
        tokio::task::spawn_blocking(move || read_all(&b, &r))
            .await
            .unwrap_or_default()
    };
    let (mut topics, total) = read(broker.clone(), req.clone()).await;
    if total == 0 && !wait.is_zero() && tokio::time::timeout(wait, notified).await.is_ok() {
        topics = read(broker.clone(), req.clone()).await.0;
    }
    let mut r = FetchResponse::default();
    r.responses = topics;
    r
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
        let broker = Arc::new(
            Broker::open(crate::Config {
                dir: dir.path().to_path_buf(),
                advertised_host: "127.0.0.1".into(),
                advertised_port: 9092,
                partitions: 1,
            })
            .unwrap(),
        );
        for frame in [
            &b""[..],
            &[0, 0, 0],
            &[0x7f, 0x7f, 0, 0, 0, 0, 0, 1],
            &[0, 0, 0x7f, 0, 0, 0, 0, 1, 0xff],
            &[0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0xff],
        ] {
            let reply = rt.block_on(handle(&broker, Bytes::copy_from_slice(frame)));
            assert!(matches!(reply, Reply::Close(_) | Reply::Send(_)));
        }
        // Metadata v1 declaring 2^31 - 1 topics in a 21-byte frame: the
        // decoder used to reserve 154 GB for them and abort the process.
        let mut frame = vec![0, 3, 0, 1, 0, 0, 0, 7, 0, 0];
        frame.extend_from_slice(&i32::MAX.to_be_bytes());
        frame.extend_from_slice(&[0; 3]);
        match rt.block_on(handle(&broker, Bytes::from(frame))) {
            Reply::Close(why) => assert!(why.contains("more than the 3 bytes"), "{why}"),
            _ => panic!("a request whose array cannot fit in it was answered"),
        }
    }
}
