//! Paths that are not a store, run through the real binary: an empty
//! directory (where the library makes a store), a broker's data directory
//! and its partition directories (laid out as the broker lays them out:
//! broker/src/lib.rs, partition.rs, catalog.rs), and a Kafka log segment.
//! Each gets its own verdict and exit code 5, never "damaged"; `--all`
//! inspects every store of a broker directory in one run.

mod common;

use std::path::{Path, PathBuf};

use common::{files, json, run, s};
use producer_state::{Batch, ProducerStateStore, Semantics, StoreOptions};
use serde_json::Value;

/// A Kafka record batch (format v2, magic 2) at `base` with `n` bytes of
/// records, its CRC-32C right: what a broker partition's log holds.
fn kafka_batch(base: i64, n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&base.to_be_bytes());
    b.extend_from_slice(&((61 - 12 + n) as u32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // CRC, below
    b.extend(std::iter::repeat_n(0x11u8, 61 - 21 + n));
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A Kafka-mode store with a few producers, closed: the shared state.
fn kafka_store(dir: &Path) {
    let opts = StoreOptions::default().semantics(Semantics::Kafka);
    let st = ProducerStateStore::open_with(dir, opts).unwrap();
    for p in 5..8i32 {
        st.append_batch(
            1000u64 + p as u64,
            p,
            0,
            Batch::new(0, 4, 5 * i64::from(p), 1_700_000_000_000),
        )
        .unwrap();
    }
    st.close().unwrap();
}

/// A strict store (what an older broker kept in each partition).
fn strict_store(dir: &Path) {
    let st = ProducerStateStore::open(dir).unwrap();
    st.append(7u64, 0, 0, 0).unwrap();
    st.close().unwrap();
}

/// A broker's data directory: the catalog, the producer-id file, the
/// group and transaction logs, the shared state, and two topics'
/// partitions: `orders-0` and `orders-1` with their logs, `orders-1` also
/// with the store an older broker kept in it.
struct BrokerDir {
    _tmp: tempfile::TempDir,
    data: PathBuf,
}

impl BrokerDir {
    fn new() -> BrokerDir {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(data.join("topics")).unwrap();
        // As broker/src/catalog.rs writes it: topic `orders`, 2
        // partitions, keys 5 and 6 in the shared state.
        let mut catalog = "producer-state-broker topics 2\nother 5 0\norders 2 5\n".to_string();
        let crc = crc32c::crc32c(catalog.as_bytes());
        catalog.push_str(&format!("crc32c {crc:08x}\n"));
        std::fs::write(data.join("topics.catalog"), catalog).unwrap();
        std::fs::write(data.join("producer-ids"), [0u8; 12]).unwrap();
        std::fs::write(data.join("offsets.log"), b"").unwrap();
        std::fs::write(data.join("transactions.log"), b"").unwrap();
        kafka_store(&data.join("state"));
        for p in 0..2 {
            let dir = data.join(format!("topics/orders-{p}"));
            std::fs::create_dir_all(&dir).unwrap();
            let mut log = kafka_batch(0, 40);
            log.extend(kafka_batch(1, 40));
            std::fs::write(dir.join("00000000000000000000.log"), log).unwrap();
        }
        strict_store(&data.join("topics/orders-1/state"));
        BrokerDir { _tmp: tmp, data }
    }

    fn partition(&self, p: i32) -> PathBuf {
        self.data.join(format!("topics/orders-{p}"))
    }
}

fn stores(v: &Value) -> Vec<String> {
    v["stores"]
        .as_array()
        .unwrap_or_else(|| panic!("no stores: {v}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_empty_directory_holds_no_store_and_is_not_damaged() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, err) = run(&[s(d.path())]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(out.contains("verdict:   no store here"), "{out}");
    assert!(!out.contains("DAMAGED"), "{out}");
    assert!(
        err.starts_with(&format!("no_store: {}: no store here", d.path().display())),
        "{err}"
    );
    let (code, v) = json(&[s(d.path())]);
    assert_eq!(code, 5);
    assert_eq!(
        (v["kind"].as_str(), v["verdict"].as_str()),
        (Some("directory"), Some("no_store"))
    );
    assert_eq!(v["damage"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["schema_version"], 1, "the layout's version, first: {v}");
    let (code, out, _) = run(&[s(d.path()), "--verify"]);
    assert_eq!((code, out.as_str()), (5, ""));
    // Other files only: still no store.
    std::fs::write(d.path().join("notes.txt"), b"hello").unwrap();
    std::fs::write(d.path().join("x.wal"), b"not named as a segment").unwrap();
    let (code, v) = json(&[s(d.path())]);
    assert_eq!((code, v["verdict"].as_str()), (5, Some("no_store")), "{v}");
    // The library agrees: it opens a new store there, which verifies.
    ProducerStateStore::open(d.path()).unwrap().close().unwrap();
    let (code, out, err) = run(&[s(d.path()), "--verify"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn a_broker_data_directory_names_its_stores() {
    let b = BrokerDir::new();
    let (code, out, err) = run(&[s(&b.data)]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(
        out.contains("a broker directory (a data directory)"),
        "{out}"
    );
    let shared = b.data.join("state");
    let legacy = b.partition(1).join("state");
    assert!(
        out.contains(&format!(
            "stores:\n  {}\n  {}\n",
            shared.display(),
            legacy.display()
        )),
        "{out}"
    );
    assert!(!out.contains("DAMAGED"), "{out}");
    assert!(
        err.contains(&format!(
            "broker_directory: {}: a broker directory",
            b.data.display()
        )) && err.contains(&format!(
            "stores: {}, {}",
            shared.display(),
            legacy.display()
        )),
        "{err}"
    );
    let (code, v) = json(&[s(&b.data)]);
    assert_eq!(code, 5);
    assert_eq!(
        (v["kind"].as_str(), v["verdict"].as_str()),
        (Some("broker_data_directory"), Some("broker_directory"))
    );
    assert_eq!(stores(&v), [s(&shared), s(&legacy)]);
    assert!(v.get("inspected").is_none(), "not without --all: {v}");

    // A data directory from before the catalog: `topics/` and the
    // producer-id file are its markers.
    std::fs::remove_file(b.data.join("topics.catalog")).unwrap();
    let (code, v) = json(&[s(&b.data)]);
    assert_eq!(
        (code, v["kind"].as_str()),
        (5, Some("broker_data_directory"))
    );
}

#[test]
fn all_inspects_every_store_of_a_broker_directory_in_one_run() {
    let b = BrokerDir::new();
    let (code, v) = json(&[s(&b.data), "--all"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["verdict"], "ok");
    let inspected = v["inspected"].as_array().expect("inspected");
    assert_eq!(inspected.len(), 2, "{v}");
    assert_eq!(inspected[0]["path"], s(&b.data.join("state")));
    assert_eq!(inspected[0]["entry_count"], 3, "the shared state's keys");
    assert_eq!(inspected[1]["entry_count"], 1, "the older broker's store");
    assert!(inspected.iter().all(|o| o["verdict"] == "ok"), "{v}");
    assert!(
        inspected.iter().all(|o| o.get("schema_version").is_none()),
        "the version is the document's, once"
    );
    let (code, out, _) = run(&[s(&b.data), "--all"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("=== store {}", b.data.join("state").display())),
        "{out}"
    );
    assert_eq!(out.matches("recovery (dry run").count(), 2, "{out}");

    // A torn tail in one store: the run's verdict is the worst.
    let seg = files(&b.partition(1).join("state"), ".wal").pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.iter().rposition(|&x| x != 0).unwrap() + 1;
    bytes[at..at + 17].fill(0x5a);
    std::fs::write(&seg, &bytes).unwrap();
    let (code, out, err) = run(&[s(&b.data), "--all", "--verify"]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        err.contains(&format!("repairable: {}", seg.display())),
        "{err}"
    );
    // A segment of the shared state under another position's name:
    // recovery would refuse it.
    let shared = b.data.join("state");
    let seg = files(&shared, ".wal").pop().unwrap();
    std::fs::rename(&seg, shared.join("00000000000000000005.wal")).unwrap();
    let (code, v) = json(&[s(&b.data), "--all"]);
    assert_eq!((code, v["verdict"].as_str()), (1, Some("damaged")), "{v}");
    assert_eq!(v["inspected"][0]["recovery"]["would_open"], false);
}

#[test]
fn a_partition_directory_names_the_stores_of_its_producer_state() {
    let b = BrokerDir::new();
    // Today's partition: only its log; the state is the data directory's.
    let (code, out, err) = run(&[s(&b.partition(0))]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(out.contains("a broker directory (a partition's)"), "{out}");
    let shared = b.data.join("state");
    assert!(
        out.contains(&format!(
            "partition: 5 in {} (the catalog's key; `--partition 5` there)",
            shared.display()
        )),
        "{out}"
    );
    let (_, v) = json(&[s(&b.partition(0))]);
    assert_eq!(v["kind"], "broker_partition_directory");
    assert_eq!(v["verdict"], "broker_directory");
    assert_eq!(stores(&v), [s(&shared)]);
    assert_eq!(v["partition_key"], 5);
    // --all: the shared state's keys of this partition only, unless
    // --partition asks for another.
    let (code, v) = json(&[s(&b.partition(0)), "--all"]);
    assert_eq!(code, 0, "{v}");
    let keys = v["inspected"][0]["entries"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{v}");
    assert_eq!(
        (&keys[0]["producer_id"], &keys[0]["partition"]),
        (&"1005".into(), &5.into())
    );
    let (_, v) = json(&[s(&b.partition(0)), "--all", "--partition", "7"]);
    assert_eq!(v["inspected"][0]["entries"][0]["producer_id"], "1007");
    // A catalog that does not verify names no key (and filters nothing).
    let cat = b.data.join("topics.catalog");
    let text = std::fs::read_to_string(&cat).unwrap();
    std::fs::write(&cat, text.replace("orders 2 5", "orders 2 6")).unwrap();
    let (code, v) = json(&[s(&b.partition(0)), "--all"]);
    assert_eq!(code, 0);
    assert!(v.get("partition_key").is_none(), "{v}");
    assert_eq!(v["inspected"][0]["entries"].as_array().unwrap().len(), 3);
    std::fs::write(&cat, text).unwrap();
    // An older broker's partition: its own store, then the shared one.
    let (code, v) = json(&[s(&b.partition(1))]);
    assert_eq!(code, 5);
    assert_eq!(
        stores(&v),
        [s(&b.partition(1).join("state")), s(&b.data.join("state"))]
    );
    assert_eq!(v["partition_key"], 6);
    let (code, v) = json(&[s(&b.partition(1)), "--all"]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("ok")), "{v}");
    assert_eq!(v["inspected"].as_array().map(Vec::len), Some(2));
    // Its own store is not filtered by the shared state's key.
    assert_eq!(v["inspected"][0]["entries"][0]["producer_id"], "7");
    assert_eq!(v["inspected"][1]["entries"][0]["producer_id"], "1006");
}

#[test]
fn a_kafka_log_segment_is_recognised_and_not_read() {
    let b = BrokerDir::new();
    let log = b.partition(0).join("00000000000000000000.log");
    let (code, out, err) = run(&[s(&log)]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(
        out.contains("verdict:   a Kafka log segment (not read)"),
        "{out}"
    );
    assert!(
        out.contains("the first at offset 0, 101 bytes, its CRC-32C verifies"),
        "{out}"
    );
    assert!(err.starts_with("kafka_log_segment: "), "{err}");
    let (code, v) = json(&[s(&log)]);
    assert_eq!(code, 5);
    assert_eq!(
        (v["kind"].as_str(), v["verdict"].as_str()),
        (Some("kafka_log_segment"), Some("kafka_log_segment"))
    );
    assert_eq!(v["position"], 0);

    // By its content under another name, at another offset.
    let d = tempfile::tempdir().unwrap();
    let other = d.path().join("segment-copy");
    std::fs::write(&other, kafka_batch(4242, 10)).unwrap();
    let (code, v) = json(&[s(&other)]);
    assert_eq!(
        (code, v["kind"].as_str()),
        (5, Some("kafka_log_segment")),
        "{v}"
    );
    assert_eq!(v["position"], 4242);
    // Content alone must verify: a damaged batch under another name is of
    // no known kind; under a log's name it is still a log, said so.
    let mut bad = kafka_batch(0, 10);
    bad[40] ^= 1;
    std::fs::write(&other, &bad).unwrap();
    let (code, v) = json(&[s(&other)]);
    assert_eq!((code, v["kind"].as_str()), (1, Some("unknown")), "{v}");
    let named = d.path().join("00000000000000000007.log");
    std::fs::write(&named, &bad).unwrap();
    let (code, out, _) = run(&[s(&named)]);
    assert_eq!(code, 5, "{out}");
    assert!(out.contains("its CRC-32C does not verify"), "{out}");
    // An empty log (a new partition's): by its name.
    std::fs::write(&named, b"").unwrap();
    let (code, out, _) = run(&[s(&named)]);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("by its name (no record batch at its start)"),
        "{out}"
    );
}

#[test]
fn all_needs_a_directory() {
    let b = BrokerDir::new();
    let log = b.partition(0).join("00000000000000000000.log");
    let (code, _, err) = run(&[s(&log), "--all"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--all takes a directory"), "{err}");
}
