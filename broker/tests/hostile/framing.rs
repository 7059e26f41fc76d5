//! Frames and declared lengths: what a decoder meets before any handler.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{Answer, Broker, frame, raw_frame, read_answer, send};

const T: Duration = Duration::from_secs(20);

/// Kafka's API keys, as the frames spell them.
const PRODUCE: i16 = 0;
const FETCH: i16 = 1;
const METADATA: i16 = 3;

/// The 21-byte request that used to abort the broker: Metadata v1 with a
/// 3-byte client id whose topics array declares 2^31 - 1 elements and
/// holds none.
pub fn huge_array_metadata(b: &mut Broker) {
    let mut f = 17i32.to_be_bytes().to_vec();
    f.extend_from_slice(&METADATA.to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes());
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&3i16.to_be_bytes());
    f.extend_from_slice(b"abc");
    f.extend_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(f.len(), 21);
    assert_eq!(send(b, &f, T), Answer::Closed);
}

/// Produce v3: transactional id (null), acks, timeout, then the topics
/// array declaring 2^31 - 1 elements.
pub fn huge_array_produce(b: &mut Broker) {
    let mut body = (-1i16).to_be_bytes().to_vec();
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.extend_from_slice(&5000i32.to_be_bytes());
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(send(b, &raw_frame(PRODUCE, 3, &body), T), Answer::Closed);
}

/// Fetch v4: replica id, max wait, min bytes, max bytes, isolation level,
/// then the topics array declaring 2^31 - 1 elements.
pub fn huge_array_fetch(b: &mut Broker) {
    let mut body = (-1i32).to_be_bytes().to_vec();
    body.extend_from_slice(&500i32.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&(1i32 << 20).to_be_bytes());
    body.push(0);
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(send(b, &raw_frame(FETCH, 4, &body), T), Answer::Closed);
}

/// Metadata v9 (flexible: header v2 with tagged fields) whose compact
/// topics array declares 2^32 - 2 elements in a 5-byte varint.
pub fn huge_compact_array(b: &mut Broker) {
    let mut header = Vec::new();
    header.extend_from_slice(&METADATA.to_be_bytes());
    header.extend_from_slice(&9i16.to_be_bytes());
    header.extend_from_slice(&1i32.to_be_bytes());
    header.extend_from_slice(&(-1i16).to_be_bytes());
    header.push(0); // header tagged fields
    header.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // u32::MAX: 2^32 - 2 elements
    header.extend_from_slice(&[0, 0, 0]);
    let mut f = (header.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(&header);
    assert_eq!(send(b, &f, T), Answer::Closed);
}

/// A client id, then a topic name, each declaring more bytes than follow.
pub fn long_string_and_bytes(b: &mut Broker) {
    let mut f = Vec::new();
    let body: Vec<u8> = [
        &METADATA.to_be_bytes()[..],
        &1i16.to_be_bytes(),
        &1i32.to_be_bytes(),
        &i16::MAX.to_be_bytes(), // client id of 32,767 bytes
        b"abc",
    ]
    .concat();
    f.extend_from_slice(&(body.len() as i32).to_be_bytes());
    f.extend_from_slice(&body);
    assert_eq!(send(b, &f, T), Answer::Closed);
    let mut body = 1i32.to_be_bytes().to_vec();
    body.extend_from_slice(&i16::MAX.to_be_bytes()); // a topic name of 32,767 bytes
    body.extend_from_slice(b"t");
    assert_eq!(send(b, &raw_frame(METADATA, 1, &body), T), Answer::Closed);
}

/// Bytes that are no request: too short, an unknown API key, a version no
/// protocol defines, random bytes.
pub fn garbage_frames(b: &mut Broker) {
    for body in [
        &[][..],
        &[0, 3, 0],
        &[0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 0xff, 0xff],
        &[0, 3, 0x7f, 0, 0, 0, 0, 1, 0xff, 0xff],
        &[
            0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef,
        ],
    ] {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        assert_eq!(send(b, &f, T), Answer::Closed, "{body:?}");
    }
    // Not even a Kafka frame: an HTTP request.
    assert_eq!(
        send(b, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", T),
        Answer::Closed
    );
}

/// A negative size, and a size past `socket.request.max.bytes`: closed
/// before any body is read.
pub fn bad_frame_sizes(b: &mut Broker) {
    assert_eq!(send(b, &(-1i32).to_be_bytes(), T), Answer::Closed);
    assert_eq!(send(b, &i32::MAX.to_be_bytes(), T), Answer::Closed);
    assert_eq!(
        send(b, &((100 << 20) + 1i32).to_be_bytes(), T),
        Answer::Closed
    );
}

/// Half a request, then the client goes away.
pub fn cut_frame(b: &mut Broker) {
    let f = frame(&MetadataRequest::default(), 1);
    let mut s = TcpStream::connect(b.addr).unwrap();
    s.write_all(&f[..f.len() / 2]).unwrap();
    drop(s);
}

fn null_topics(n: usize) -> MetadataRequest {
    let mut r = MetadataRequest::default();
    r.topics = Some(vec![MetadataRequestTopic::default(); n]);
    r.allow_auto_topic_creation = false;
    r
}

/// A legal count of small elements: 300,000 topics with null names (0.6
/// MB) are decoded and answered (no topic named: none listed), without
/// reserving for the count. Two million take more field reads than a
/// request may and are refused.
pub fn many_small_elements(b: &mut Broker) {
    match send(b, &frame(&null_topics(300_000), 9), T) {
        Answer::Response(n) => assert!(n < 1 << 20, "a {n}-byte answer"),
        Answer::Closed => panic!("a legal request was refused"),
    }
    assert_eq!(
        send(b, &frame(&null_topics(2_000_000), 9), T),
        Answer::Closed
    );
}

/// The largest kind of frame made of the smallest elements: 64 MiB of
/// produce partitions with no records (6 bytes each, 11 million of them,
/// which decoded would take about a gigabyte). Refused by the decode
/// budget; the memory bound is the suite's peak-RSS check.
pub fn max_frame_of_tiny_elements(b: &mut Broker) {
    let n = (64 << 20) / 6;
    let mut r = ProduceRequest::default();
    r.acks = 1;
    r.timeout_ms = 1000;
    r.topic_data = vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("canary")))
            .with_partition_data(vec![PartitionProduceData::default(); n]),
    ];
    let f = frame(&r, 9);
    assert!(f.len() > 60 << 20);
    drop(r);
    assert_eq!(send(b, &f, Duration::from_secs(60)), Answer::Closed);
}

/// A frame that declares 100 MiB and sends 10 bytes holds those bytes, not
/// 100 MiB (checked by the suite's peak RSS); other clients are served
/// meanwhile.
pub fn declared_but_not_sent(b: &mut Broker) {
    let mut s = TcpStream::connect(b.addr).unwrap();
    s.write_all(&(100i32 << 20).to_be_bytes()).unwrap();
    s.write_all(&[0; 10]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = b.peak_rss_kib();
    let mut c = b.client();
    assert_eq!(c.call(&ApiVersionsRequest::default(), 3).error_code, 0);
    assert!(
        b.peak_rss_kib() < before + 16 * 1024,
        "the declared size was allocated"
    );
    drop(s);
}

/// APIs the broker does not serve are answered with UNSUPPORTED_VERSION in
/// their own response where one exists, and closed where none can say so.
pub fn unsupported_requests(b: &mut Broker) {
    let mut c = b.client();
    let r = c.call(&DescribeClusterRequest::default(), 0);
    assert_eq!(r.error_code, 35);
    // An ApiVersions newer than served: answered (in version 0, which
    // every client reads), not closed.
    assert!(matches!(
        send(b, &raw_frame(18, 4, &[0, 0, 0]), T),
        Answer::Response(_)
    ));
    let mut s = TcpStream::connect(b.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&frame(&DeleteTopicsRequest::default(), 4))
        .unwrap();
    assert_eq!(read_answer(&mut s), Answer::Closed);
}
