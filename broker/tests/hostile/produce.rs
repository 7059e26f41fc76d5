//! Produce requests and the batches in them.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::common::{self, Client};
use super::{Answer, Broker, frame, read_answer};

/// Kafka's error codes the attacks expect.
const CORRUPT_MESSAGE: i16 = 2;
const MESSAGE_TOO_LARGE: i16 = 10;
const INVALID_REQUIRED_ACKS: i16 = 21;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_RECORD: i16 = 87;

/// The batch's CRC-32C recomputed (the client's own checksum: what an
/// attacker who lies sends).
fn reseal(b: &mut [u8]) {
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn topic(c: &mut Client, name: &str) -> i64 {
    common::create_topic(c, name);
    common::producer_id(c)
}

/// A 1-record batch whose header declares 1,000 records (count and last
/// offset delta agreeing): refused with INVALID_RECORD, and the high
/// watermark does not move.
pub fn lying_record_count(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "lies");
    let mut batch = common::batch(pid, 0, 0, &["one"]).to_vec();
    batch[23..27].copy_from_slice(&999i32.to_be_bytes());
    batch[57..61].copy_from_slice(&1000i32.to_be_bytes());
    reseal(&mut batch);
    let (code, _) = common::produce(&mut c, "lies", 0, Bytes::from(batch));
    assert_eq!(code, INVALID_RECORD);
    // And the count that disagrees with the last offset delta.
    let mut batch = common::batch(pid, 0, 0, &["one", "two"]).to_vec();
    batch[57..61].copy_from_slice(&5i32.to_be_bytes());
    reseal(&mut batch);
    assert_eq!(
        common::produce(&mut c, "lies", 0, Bytes::from(batch)).0,
        INVALID_RECORD
    );
    assert_eq!(common::latest_offset(&mut c, "lies", 0), 0);
    // The honest batch after them is accepted at offset 0.
    let (code, offset) = common::produce(&mut c, "lies", 0, common::batch(pid, 0, 0, &["one"]));
    assert_eq!((code, offset), (0, 0));
}

/// Damaged batches: a flipped bit (CRC), a cut batch, two batches in one
/// partition's data, a record whose fields overrun it.
pub fn corrupt_batches(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "damaged");
    let good = common::batch(pid, 0, 0, &["a", "b"]).to_vec();
    let mut flipped = good.clone();
    flipped[70] ^= 0x10;
    assert_eq!(
        common::produce(&mut c, "damaged", 0, Bytes::from(flipped)).0,
        CORRUPT_MESSAGE
    );
    let cut = good[..good.len() - 3].to_vec();
    assert_eq!(
        common::produce(&mut c, "damaged", 0, Bytes::from(cut)).0,
        CORRUPT_MESSAGE
    );
    let mut two = good.clone();
    two.extend_from_slice(&good);
    assert_eq!(
        common::produce(&mut c, "damaged", 0, Bytes::from(two)).0,
        INVALID_RECORD
    );
    // The last record's header count made a varint that runs past it,
    // under a valid CRC.
    let mut overrun = good.clone();
    let last = overrun.len() - 1;
    overrun[last] = 0xa5;
    reseal(&mut overrun);
    assert_eq!(
        common::produce(&mut c, "damaged", 0, Bytes::from(overrun)).0,
        INVALID_RECORD
    );
    assert_eq!(common::latest_offset(&mut c, "damaged", 0), 0);
}

/// A batch one byte over `message.max.bytes` (1,048,588).
pub fn too_large(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "large");
    let value = "v".repeat(1_048_588);
    let batch = common::batch(pid, 0, 0, &[value.as_str()]);
    assert!(batch.len() > 1_048_588);
    assert_eq!(
        common::produce(&mut c, "large", 0, batch).0,
        MESSAGE_TOO_LARGE
    );
    assert_eq!(common::latest_offset(&mut c, "large", 0), 0);
}

/// A gzip batch of 300 KB whose one record inflates to 300 MiB: refused
/// once 256 MiB (`max.decompressed.batch.bytes`) are walked, without
/// holding them (the suite's RSS check).
pub fn decompression_bomb(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "bomb");
    let plain = common::batch(pid, 0, 0, &["x"]).to_vec();
    const VALUE: usize = 300 << 20;
    // One record: length, attributes, timestamp delta, offset delta, null
    // key, the value's length, the value, no headers.
    let zigzag = |v: i64| -> Vec<u8> {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            if z < 0x80 {
                out.push(z as u8);
                return out;
            }
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
    };
    let value_len = zigzag(VALUE as i64);
    let body_len = 1 + 1 + 1 + 1 + value_len.len() + VALUE + 1;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&zigzag(body_len as i64)).unwrap();
    gz.write_all(&[0, 0, 0, 1]).unwrap(); // attributes, deltas, key length -1
    gz.write_all(&value_len).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..VALUE >> 20 {
        gz.write_all(&zeros).unwrap();
    }
    gz.write_all(&[0]).unwrap();
    let packed = gz.finish().unwrap();
    let mut batch = plain[..61].to_vec();
    batch.extend_from_slice(&packed);
    let len = (batch.len() - 12) as i32;
    batch[8..12].copy_from_slice(&len.to_be_bytes());
    batch[21..23].copy_from_slice(&1i16.to_be_bytes());
    reseal(&mut batch);
    assert!(batch.len() < 1 << 20, "{} bytes", batch.len());
    assert_eq!(
        common::produce(&mut c, "bomb", 0, Bytes::from(batch)).0,
        INVALID_RECORD
    );
}

fn request(topic: &str, partitions: Vec<PartitionProduceData>, acks: i16) -> ProduceRequest {
    let mut r = ProduceRequest::default();
    r.acks = acks;
    r.timeout_ms = 5000;
    r.topic_data = vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(partitions),
    ];
    r
}

/// `acks` other than -1, 0 and 1: INVALID_REQUIRED_ACKS, nothing written.
/// A transactional batch in a request without a transactional id (so no
/// transaction coordinator verified it): INVALID_TXN_STATE, as in Kafka.
pub fn odd_produce_requests(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "odd");
    let data = vec![
        PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(common::batch(pid, 0, 0, &["a"]))),
    ];
    let r = c.call(&request("odd", data, 5), 9);
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        INVALID_REQUIRED_ACKS
    );
    let mut txn = common::batch(pid, 0, 0, &["a"]).to_vec();
    txn[22] |= 0x10;
    reseal(&mut txn);
    assert_eq!(
        common::produce(&mut c, "odd", 0, Bytes::from(txn)).0,
        INVALID_TXN_STATE
    );
    assert_eq!(common::latest_offset(&mut c, "odd", 0), 0);
}

/// One produce naming 20,000 partitions (4 exist): every one answered,
/// and no thread per partition.
pub fn many_partitions_one_request(b: &mut Broker) {
    let before = b.threads();
    let mut c = b.client();
    let pid = topic(&mut c, "wide");
    let records = common::batch(pid, 0, 0, &["a"]);
    let data: Vec<PartitionProduceData> = (0..20_000)
        .map(|i| {
            PartitionProduceData::default()
                .with_index(i)
                .with_records(Some(records.clone()))
        })
        .collect();
    let r = c.call(&request("wide", data, -1), 9);
    let answers = &r.responses[0].partition_responses;
    assert_eq!(answers.len(), 20_000);
    assert_eq!(answers[0].error_code, 0, "partition 0 takes the batch");
    assert!(answers[4..].iter().all(|p| p.error_code == 3));
    assert!(
        b.threads() <= before + 16,
        "threads {} -> {}",
        before,
        b.threads()
    );
}

/// The same batch from two connections at once (a retry racing its
/// original after a dropped connection): one is appended, the other is a
/// duplicate with the same offset, and the log holds it once.
pub fn racing_duplicates(b: &mut Broker) {
    let mut c = b.client();
    let pid = topic(&mut c, "race");
    for round in 0..20 {
        let f = frame(
            &request(
                "race",
                vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(common::batch(pid, 0, round, &["r"]))),
                ],
                -1,
            ),
            9,
        );
        let mut a = TcpStream::connect(b.addr).unwrap();
        let mut z = TcpStream::connect(b.addr).unwrap();
        for s in [&a, &z] {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        }
        a.write_all(&f).unwrap();
        z.write_all(&f).unwrap();
        assert!(matches!(read_answer(&mut a), Answer::Response(_)));
        assert!(matches!(read_answer(&mut z), Answer::Response(_)));
    }
    let read = common::fetch_all(&mut c, "race", 0);
    assert_eq!(read.len(), 20, "each batch once: {read:?}");
}
