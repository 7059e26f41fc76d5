//! Topics: names, auto-creation and its bounds.

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{Broker, NOFILE};

fn metadata(names: &[String], create: bool) -> MetadataRequest {
    let mut r = MetadataRequest::default();
    r.topics = Some(
        names
            .iter()
            .map(|n| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
            })
            .collect(),
    );
    r.allow_auto_topic_creation = create;
    r
}

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() {
            disk_bytes(&e.path())
        } else {
            m.len()
        };
    }
    total
}

/// Names that would leave the data directory, or are not names: refused
/// with INVALID_TOPIC_EXCEPTION (17), and nothing is made outside `topics/`.
pub fn path_tricks(b: &mut Broker) {
    let names: Vec<String> = [
        "../escape",
        "a/b",
        "/abs",
        ".",
        "..",
        "",
        "nul\u{0}byte",
        "white space",
        "ünïcode",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([("x".repeat(250))])
    .collect();
    let mut c = b.client();
    let r = c.call(&metadata(&names, true), 9);
    assert_eq!(r.topics.len(), names.len());
    for t in &r.topics {
        assert_eq!(t.error_code, 17, "{:?}", t.name);
        assert!(t.partitions.is_empty());
    }
    let parent = b.dir.parent().unwrap();
    assert!(!parent.join("escape").exists() && !b.dir.join("escape").exists());
    let listed: Vec<String> = std::fs::read_dir(b.dir.join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        listed
            .iter()
            .all(|n| !n.starts_with("..") && !n.contains('/')),
        "{listed:?}"
    );
}

/// One name 100,000 times in one request: one answer, one topic.
pub fn one_name_many_times(b: &mut Broker) {
    let names = vec!["repeated".to_string(); 100_000];
    let mut c = b.client();
    let r = c.call(&metadata(&names, true), 9);
    assert_eq!(r.topics.len(), 1);
    assert_eq!(r.topics[0].error_code, 0);
    assert_eq!(r.topics[0].partitions.len(), 4);
}

/// The 66-byte request that made 32 partitions at 2 GiB of disk: now they
/// cost kilobytes each, and the answer lists every partition.
pub fn eight_new_topics(b: &mut Broker) {
    let names: Vec<String> = (0..8).map(|i| format!("new{i}")).collect();
    let before = disk_bytes(&b.dir);
    let mut c = b.client();
    let r = c.call(&metadata(&names, true), 9);
    assert!(
        r.topics
            .iter()
            .all(|t| t.error_code == 0 && t.partitions.len() == 4)
    );
    let per_partition = (disk_bytes(&b.dir) - before) / 32;
    println!("disk per new empty partition: {per_partition} bytes");
    assert!(
        per_partition <= 64 << 10,
        "{per_partition} bytes of disk for an empty partition"
    );
}

/// Auto-creation past `max.partitions` answers POLICY_VIOLATION (44) for
/// the topics that would pass it, creates the rest, and the broker keeps
/// serving; a restart keeps the same topics.
#[test]
fn auto_creation_stops_at_max_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let b = Broker::start(
        &dir,
        &["--max.partitions", "10", "--partitions", "3"],
        NOFILE,
    );
    let names: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let mut c = b.client();
    let r = c.call(&metadata(&names, true), 9);
    let codes: Vec<i16> = r.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, [0, 0, 0, 44, 44, 44]);
    // Asked again without creation: the three exist, the rest are unknown.
    let r = c.call(&metadata(&names, false), 9);
    let codes: Vec<i16> = r.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, [0, 0, 0, 3, 3, 3]);
    let (dir, args, nofile) = b.kill9();
    let b = Broker::restart(&dir, args, nofile);
    let mut c = b.client();
    let r = c.call(&metadata(&names, false), 9);
    let codes: Vec<i16> = r.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, [0, 0, 0, 3, 3, 3]);
    // Auto-creation off: nothing is created at all.
    drop(b);
    let b = Broker::start(
        &tmp.path().join("off"),
        &["--auto.create.topics.enable", "false"],
        NOFILE,
    );
    let r = b.client().call(&metadata(&names[..1], true), 9);
    assert_eq!(r.topics[0].error_code, 3);
}
