//! Decoding a request within a budget of field reads.
//!
//! The protocol crate refuses a declared length that the bytes left cannot
//! hold (the patch in `vendor/`), which bounds every count by the frame's
//! size. What it cannot bound is what the elements cost once decoded: an
//! element of two bytes on the wire (a topic with a null name, a produce
//! partition with no records) becomes a struct of 60 to 100 bytes, so a
//! maximum-size frame of them would decode to gigabytes. [`Budgeted`] hands
//! the decoder the frame and counts its reads (each primitive field, string
//! or byte array is one); past [`MAX_FIELD_READS`] it reports no bytes
//! left, so the decoder fails as on a short frame, and the request is
//! refused as too complex. Memory for a decoded request is then bounded by
//! the budget, whatever the frame's size: the costliest element per read
//! is a topic with a null name (72 bytes for 3 reads), so 1M reads decode
//! to at most about 50 MB (a vector may have doubled past its elements),
//! and a real client takes far fewer (a Fetch of 10,000 partitions about
//! 80,000).

use bytes::{Buf, Bytes};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use kafka_protocol::protocol::buf::ByteBuf;

/// The most field reads one request may take to decode.
pub const MAX_FIELD_READS: usize = 1_000_000;

/// A frame handed to the decoder, with a budget of reads.
pub struct Budgeted {
    inner: Bytes,
    reads: usize,
}

impl Budgeted {
    /// `frame`, decodable with at most `reads` field reads.
    pub fn new(frame: Bytes, reads: usize) -> Budgeted {
        Budgeted {
            inner: frame,
            reads,
        }
    }

    /// True once the budget is spent: a decode that failed then failed for
    /// it, not for the bytes.
    pub fn exhausted(&self) -> bool {
        self.reads == 0
    }

    /// The bytes not yet decoded.
    pub fn into_inner(self) -> Bytes {
        self.inner
    }

    fn spend(&mut self) {
        self.reads = self.reads.saturating_sub(1);
    }
}

impl Buf for Budgeted {
    fn remaining(&self) -> usize {
        if self.reads == 0 {
            0
        } else {
            self.inner.remaining()
        }
    }

    fn chunk(&self) -> &[u8] {
        if self.reads == 0 {
            &[]
        } else {
            self.inner.chunk()
        }
    }

    fn advance(&mut self, cnt: usize) {
        self.inner.advance(cnt);
        self.spend();
    }
}

impl ByteBuf for Budgeted {
    fn peek_bytes(&mut self, r: std::ops::Range<usize>) -> Bytes {
        self.inner.slice(r)
    }

    fn get_bytes(&mut self, size: usize) -> Bytes {
        self.spend();
        self.inner.split_to(size)
    }
}

/// Decodes the body of a request of an API this broker serves (the
/// protocol crate's own dispatch takes only a plain buffer); `None` for
/// any other API.
pub fn request(
    key: ApiKey,
    buf: &mut Budgeted,
    version: i16,
) -> Option<anyhow::Result<RequestKind>> {
    macro_rules! served {
        ($($api:ident => $req:ident),* $(,)?) => {
            match key {
                $(ApiKey::$api => Some($req::decode(buf, version).map(RequestKind::$api)),)*
                _ => None,
            }
        };
    }
    served!(
        Produce => ProduceRequest,
        Fetch => FetchRequest,
        ListOffsets => ListOffsetsRequest,
        Metadata => MetadataRequest,
        ApiVersions => ApiVersionsRequest,
        InitProducerId => InitProducerIdRequest,
        FindCoordinator => FindCoordinatorRequest,
        JoinGroup => JoinGroupRequest,
        SyncGroup => SyncGroupRequest,
        Heartbeat => HeartbeatRequest,
        LeaveGroup => LeaveGroupRequest,
        OffsetCommit => OffsetCommitRequest,
        OffsetFetch => OffsetFetchRequest,
        DescribeGroups => DescribeGroupsRequest,
        ListGroups => ListGroupsRequest,
        AddPartitionsToTxn => AddPartitionsToTxnRequest,
        AddOffsetsToTxn => AddOffsetsToTxnRequest,
        EndTxn => EndTxnRequest,
        TxnOffsetCommit => TxnOffsetCommitRequest,
        DescribeProducers => DescribeProducersRequest,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::MetadataRequest;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::protocol::{Decodable, Encodable};

    fn metadata(topics: usize) -> Bytes {
        let mut r = MetadataRequest::default();
        r.topics = Some(vec![MetadataRequestTopic::default(); topics]);
        let mut buf = bytes::BytesMut::new();
        r.encode(&mut buf, 9).unwrap();
        buf.freeze()
    }

    #[test]
    fn a_request_within_the_budget_decodes_as_without_one() {
        let frame = metadata(1000);
        let plain = MetadataRequest::decode(&mut frame.clone(), 9).unwrap();
        let mut b = Budgeted::new(frame, 10_000);
        assert_eq!(MetadataRequest::decode(&mut b, 9).unwrap(), plain);
        assert!(!b.exhausted());
        assert_eq!(b.into_inner().len(), 0);
    }

    #[test]
    fn a_request_past_the_budget_fails_to_decode_and_says_so() {
        // 100,000 topics of two bytes each: 200 KB that decode to 7 MB.
        let mut b = Budgeted::new(metadata(100_000), 10_000);
        assert!(MetadataRequest::decode(&mut b, 9).is_err());
        assert!(b.exhausted());
    }
}
