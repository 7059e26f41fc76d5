//! `kill -9` in the middle of what a client asked: nothing half made,
//! nothing acknowledged lost.

use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::common;
use super::{Broker, NOFILE};

/// Partitions of each topic the creation test makes: enough that a kill
/// lands in the middle of making them (each takes a few milliseconds).
const PARTITIONS: usize = 8;

fn ask(topic: &str, create: bool) -> MetadataRequest {
    let mut r = MetadataRequest::default();
    r.topics =
        Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(topic.into())),
        ))]);
    r.allow_auto_topic_creation = create;
    r
}

/// A topic being created when the broker is killed: after the restart it
/// is either unknown or whole, never some of its partitions (a kill after
/// the catalog was written finishes the creation at open).
#[test]
fn a_topic_is_all_or_nothing_across_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let args = ["--partitions", "8"];
    let mut b = Broker::start(&dir, &args, NOFILE);
    let (mut whole, mut unknown) = (0, 0);
    for round in 0..10u64 {
        let topic = format!("made{round}");
        let send = {
            let addr = b.addr;
            let topic = topic.clone();
            std::thread::spawn(move || {
                // The kill may come first: the client then sees an error.
                if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                    let f = super::frame(&ask(&topic, true), 9);
                    let _ = std::io::Write::write_all(&mut s, &f);
                    let mut one = [0u8; 1];
                    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
                    let _ = std::io::Read::read(&mut s, &mut one);
                }
            })
        };
        // Kill at a moment that moves through the creation.
        std::thread::sleep(Duration::from_millis(1 + round * 2));
        let (d, a, n) = b.kill9();
        send.join().unwrap();
        b = Broker::restart(&d, a, n);
        let r = b.client().call(&ask(&topic, false), 9);
        match r.topics[0].error_code {
            0 => {
                assert_eq!(r.topics[0].partitions.len(), PARTITIONS, "{topic}");
                whole += 1;
            }
            3 => unknown += 1,
            code => panic!("{topic}: error {code}"),
        }
    }
    println!("topics whole after the kill: {whole}, unknown: {unknown}");
    // Every topic asked for again comes back whole.
    for round in 0..10 {
        let r = b.client().call(&ask(&format!("made{round}"), true), 9);
        assert_eq!(r.topics[0].partitions.len(), PARTITIONS);
    }
}

/// Batches acknowledged before a `kill -9` are all there after the
/// restart, and a retry of each is answered with its original offset.
#[test]
fn acknowledged_batches_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Broker::start(&tmp.path().join("data"), &[], NOFILE);
    let mut c = b.client();
    common::create_topic(&mut c, "kept");
    let pid = common::producer_id(&mut c);
    let mut acked = Vec::new();
    for seq in 0..200 {
        let value = format!("v{seq}");
        let (code, offset) = common::produce(
            &mut c,
            "kept",
            seq % 4,
            common::batch(pid, 0, seq / 4, &[value.as_str()]),
        );
        assert_eq!(code, 0);
        acked.push((seq % 4, seq / 4, offset, value));
    }
    let (d, a, n) = b.kill9();
    let b = Broker::restart(&d, a, n);
    let mut c = b.client();
    for p in 0..4 {
        let read = common::fetch_all(&mut c, "kept", p);
        let want: Vec<(i64, String)> = acked
            .iter()
            .filter(|a| a.0 == p)
            .map(|a| (a.2, a.3.clone()))
            .collect();
        assert_eq!(read, want, "partition {p}");
    }
    // The last five batches of each partition are a producer's retry
    // window (Kafka's): each retry gets its original offset.
    for (p, seq, offset, value) in acked.iter().filter(|a| a.1 >= 45) {
        let (code, again) = common::produce(
            &mut c,
            "kept",
            *p,
            common::batch(pid, 0, *seq, &[value.as_str()]),
        );
        assert_eq!((code, again), (0, *offset), "the retry of {value}");
    }
}
