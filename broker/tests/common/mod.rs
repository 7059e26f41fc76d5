//! A Kafka client for the broker's tests, built from the protocol crate's
//! own request and response types: one request at a time, on a plain
//! socket, with a read timeout so that no test waits forever.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{
    Decodable, HeaderVersion, Request, StrBytes, encode_request_header_into_buffer,
};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

pub struct Client {
    pub stream: TcpStream,
    pub correlation: i32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        Client {
            stream,
            correlation: 0,
        }
    }

    pub fn send_raw(&mut self, body: &[u8]) {
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).unwrap();
    }

    pub fn recv_raw(&mut self) -> Bytes {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body).unwrap();
        Bytes::from(body)
    }

    pub fn call<R: Request>(&mut self, req: &R, version: i16) -> R::Response {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("wire-test")));
        let mut buf = BytesMut::new();
        encode_request_header_into_buffer(&mut buf, &header).unwrap();
        req.encode(&mut buf, version).unwrap();
        self.send_raw(&buf);
        let mut body = self.recv_raw();
        let h = ResponseHeader::decode(&mut body, R::Response::header_version(version)).unwrap();
        assert_eq!(h.correlation_id, self.correlation);
        R::Response::decode(&mut body, version).unwrap()
    }
}

pub fn batch(pid: i64, epoch: i16, first_seq: i32, values: &[&str]) -> Bytes {
    batch_of(pid, epoch, first_seq, values, false)
}

/// A transactional batch.
pub fn txn_batch(pid: i64, epoch: i16, first_seq: i32, values: &[&str]) -> Bytes {
    batch_of(pid, epoch, first_seq, values, true)
}

fn batch_of(pid: i64, epoch: i16, first_seq: i32, values: &[&str], transactional: bool) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: first_seq + i as i32,
            timestamp: 1_700_000_000_000 + i as i64,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Produces one batch to `topic`/`partition`: (error code, base offset).
pub fn produce(c: &mut Client, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
    produce_as(c, None, topic, partition, records)
}

/// [`produce`] in a request that names a transactional id.
pub fn produce_as(
    c: &mut Client,
    transactional_id: Option<&str>,
    topic: &str,
    partition: i32,
    records: Bytes,
) -> (i16, i64) {
    let mut req = ProduceRequest::default();
    req.transactional_id =
        transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.into())));
    req.acks = -1;
    req.timeout_ms = 5000;
    req.topic_data = vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![
                PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(records)),
            ]),
    ];
    let resp = c.call(&req, 9);
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.index, partition);
    (p.error_code, p.base_offset)
}

pub fn create_topic(c: &mut Client, topic: &str) -> usize {
    let mut req = MetadataRequest::default();
    req.topics =
        Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(topic.into())),
        ))]);
    req.allow_auto_topic_creation = true;
    let resp = c.call(&req, 9);
    assert_eq!(resp.topics[0].error_code, 0);
    resp.topics[0].partitions.len()
}

pub fn producer_id(c: &mut Client) -> i64 {
    let mut req = InitProducerIdRequest::default();
    req.transactional_id = None;
    req.transaction_timeout_ms = 60_000;
    let resp = c.call(&req, 4);
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.producer_epoch, 0);
    resp.producer_id.0
}

/// Every (offset, value) of the partition, read back with Fetch.
pub fn fetch_all(c: &mut Client, topic: &str, partition: i32) -> Vec<(i64, String)> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let mut out = Vec::new();
    loop {
        let mut req = FetchRequest::default();
        req.replica_id = BrokerId(-1);
        req.max_wait_ms = 0;
        req.max_bytes = 1 << 20;
        req.session_epoch = -1;
        req.topics = vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.into())))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(out.last().map_or(0, |(o, _): &(i64, String)| o + 1))
                        .with_partition_max_bytes(1 << 20),
                ]),
        ];
        let resp = c.call(&req, 11);
        let p = &resp.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        let mut records = p.records.clone().unwrap_or_default();
        if records.is_empty() {
            return out;
        }
        let before = out.len();
        for set in RecordBatchDecoder::decode_all(&mut records).unwrap() {
            for r in set.records {
                if r.offset > out.last().map_or(-1, |(o, _)| *o) {
                    let v = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                    out.push((r.offset, v));
                }
            }
        }
        assert!(out.len() > before, "fetch made no progress");
    }
}

pub fn latest_offset(c: &mut Client, topic: &str, partition: i32) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let mut req = ListOffsetsRequest::default();
    req.replica_id = BrokerId(-1);
    req.topics = vec![
        ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partitions(vec![
                ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(-1),
            ]),
    ];
    let resp = c.call(&req, 7);
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}
