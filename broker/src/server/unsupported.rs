//! ApiVersions, and the answer to what this broker does not serve.

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;

use super::{Reply, SUPPORTED, encode_response};

/// The ApiVersions response: what [`SUPPORTED`] lists.
pub(super) fn api_versions(error: i16) -> ApiVersionsResponse {
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

/// The response to a request this broker does not serve: the API's own
/// response with `UNSUPPORTED_VERSION`, for the APIs whose response carries
/// a top-level error code (and FindCoordinator, per key).
pub(super) fn unsupported(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    mut body: Bytes,
) -> Reply {
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
            EndTxn => EndTxnResponse,
            AddOffsetsToTxn => AddOffsetsToTxnResponse,
            SaslHandshake => SaslHandshakeResponse,
            SaslAuthenticate => SaslAuthenticateResponse,
            DescribeCluster => DescribeClusterResponse,
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
