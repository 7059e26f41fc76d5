//! The broker over TCP, driven with kafka-protocol's own client-side
//! encoders: ApiVersions, unsupported requests, the produce path's four
//! outcomes, Fetch, ListOffsets, and recovery when a crash left the producer
//! state ahead of or behind the partition log.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use producer_state_broker::{Broker, Config, server};

mod common;
use common::*;

struct Running {
    addr: SocketAddr,
    /// What opening did: (batches replayed, states truncated, states
    /// rebuilt).
    recovered: (u64, u64, u64),
    stop: tokio::sync::watch::Sender<bool>,
    thread: JoinHandle<()>,
}

fn start(dir: &Path, partitions: i32) -> Running {
    start_sharded(dir, partitions, 1)
}

/// [`start`] with the partitions spread over `shards` producer-state
/// stores.
fn start_sharded(dir: &Path, partitions: i32, shards: usize) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::DEBUG)
        .try_init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = Config {
        state_shards: shards,
        ..Config::new(
            dir,
            &addr.ip().to_string(),
            i32::from(addr.port()),
            partitions,
        )
    };
    let broker = Broker::open(config).unwrap();
    let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let recovered = (
        g(&broker.stats.batches_replayed),
        g(&broker.stats.states_truncated),
        g(&broker.stats.states_rebuilt),
    );
    let (stop, rx) = tokio::sync::watch::channel(false);
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let broker = Arc::new(broker);
        rt.block_on(async {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            server::serve(broker.clone(), listener, rx).await;
        });
        Arc::try_unwrap(broker).unwrap().close().unwrap();
    });
    Running {
        addr,
        recovered,
        stop,
        thread,
    }
}

impl Running {
    fn stop(self) {
        self.stop.send(true).unwrap();
        self.thread.join().unwrap();
    }
}

#[test]
fn api_versions_and_unsupported_requests_are_answered_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), 2);
    let mut c = Client::connect(b.addr);
    let resp = c.call(&ApiVersionsRequest::default(), 3);
    assert_eq!(resp.error_code, 0);
    let produce = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Produce as i16)
        .expect("Produce advertised");
    assert!(produce.min_version <= 3 && produce.max_version >= 9);
    // Groups are served below the versions that carry a group.instance.id.
    let join = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::JoinGroup as i16)
        .expect("JoinGroup advertised");
    assert_eq!(join.max_version, 4);

    // A version the broker does not serve: its response, UNSUPPORTED_VERSION.
    let mut join = JoinGroupRequest::default();
    join.group_id = GroupId(StrBytes::from_static_str("g"));
    join.protocol_type = StrBytes::from_static_str("consumer");
    let resp = c.call(&join, 5);
    assert_eq!(resp.error_code, 35);

    // FindCoordinator v4 answers per key: this broker, for groups and
    // transactional ids; INVALID_REQUEST for a key type there is not.
    let mut find = FindCoordinatorRequest::default();
    find.coordinator_keys = vec![StrBytes::from_static_str("g")];
    let resp = c.call(&find, 4);
    assert_eq!(resp.coordinators.len(), 1);
    assert_eq!(
        (
            resp.coordinators[0].error_code,
            resp.coordinators[0].node_id
        ),
        (0, BrokerId(0))
    );
    find.key_type = 7;
    let resp = c.call(&find, 4);
    assert_eq!(resp.coordinators[0].error_code, 42);

    // An ApiVersions version from the future: a version 0 answer listing
    // what is supported, as Kafka does.
    let mut raw = Vec::new();
    raw.extend_from_slice(&(ApiKey::ApiVersions as i16).to_be_bytes());
    raw.extend_from_slice(&99i16.to_be_bytes());
    raw.extend_from_slice(&77i32.to_be_bytes());
    raw.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    raw.push(0); // tagged fields
    c.send_raw(&raw);
    let mut body = c.recv_raw();
    let h = ResponseHeader::decode(&mut body, 0).unwrap();
    assert_eq!(h.correlation_id, 77);
    let resp = ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(resp.error_code, 35);
    assert!(!resp.api_keys.is_empty());

    // The connection is still good.
    assert_eq!(c.call(&ApiVersionsRequest::default(), 3).error_code, 0);
    b.stop();
}

#[test]
fn produce_answers_duplicates_with_the_original_offset_and_maps_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), 2);
    let mut c = Client::connect(b.addr);
    assert_eq!(create_topic(&mut c, "orders"), 2);
    let pid = producer_id(&mut c);

    let first = batch(pid, 0, 0, &["a", "b", "c"]);
    assert_eq!(produce(&mut c, "orders", 0, first.clone()), (0, 0));
    // The retry: success with the original offset, nothing written.
    assert_eq!(produce(&mut c, "orders", 0, first), (0, 0));
    assert_eq!(
        produce(&mut c, "orders", 0, batch(pid, 0, 3, &["d"])),
        (0, 3)
    );
    // A gap: OUT_OF_ORDER_SEQUENCE_NUMBER.
    assert_eq!(produce(&mut c, "orders", 0, batch(pid, 0, 9, &["z"])).0, 45);
    // A new epoch starts at 0; the old epoch is then fenced.
    assert_eq!(
        produce(&mut c, "orders", 0, batch(pid, 1, 0, &["e"])),
        (0, 4)
    );
    assert_eq!(produce(&mut c, "orders", 0, batch(pid, 0, 4, &["y"])).0, 47);
    // Another partition is independent; an unknown one is refused.
    assert_eq!(
        produce(&mut c, "orders", 1, batch(pid, 0, 0, &["p1"])),
        (0, 0)
    );
    assert_eq!(produce(&mut c, "orders", 7, batch(pid, 0, 0, &["x"])).0, 3);
    // A damaged batch: CORRUPT_MESSAGE.
    let mut bad = batch(pid, 1, 1, &["f"]).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(produce(&mut c, "orders", 0, Bytes::from(bad)).0, 2);

    let got = fetch_all(&mut c, "orders", 0);
    let want: Vec<(i64, String)> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, v)| (i as i64, v.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(latest_offset(&mut c, "orders", 0), 5);
    b.stop();
}

#[test]
fn a_crash_between_the_state_write_and_the_log_write_is_repaired_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), 1);
    let mut c = Client::connect(b.addr);
    create_topic(&mut c, "t");
    let pid = producer_id(&mut c);
    let b0 = batch(pid, 0, 0, &["m0", "m1"]);
    let b1 = batch(pid, 0, 2, &["m2", "m3"]);
    assert_eq!(produce(&mut c, "t", 0, b0.clone()), (0, 0));
    assert_eq!(produce(&mut c, "t", 0, b1.clone()), (0, 2));
    drop(c);
    b.stop();

    // What a crash after step 2 (state durable) and during step 3 (log
    // write) leaves: the state knows b1, the log holds b0 and half of b1.
    let log = dir.path().join("topics/t-0/00000000000000000000.log");
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(b0.len() as u64 + 20).unwrap();
    drop(f);

    let b = start(dir.path(), 1);
    assert_eq!(
        b.recovered,
        (0, 1, 0),
        "a state ahead of the log is truncated to it, not rebuilt"
    );
    let mut c = Client::connect(b.addr);
    assert_eq!(latest_offset(&mut c, "t", 0), 2, "the torn batch was cut");
    // The client never heard about b1 and retries it: it must be written
    // again (a state left ahead would answer DUPLICATE for data not there).
    assert_eq!(produce(&mut c, "t", 0, b1.clone()), (0, 2));
    assert_eq!(produce(&mut c, "t", 0, b1), (0, 2), "now a duplicate");
    let values: Vec<String> = fetch_all(&mut c, "t", 0)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, ["m0", "m1", "m2", "m3"]);
    // Producer ids survive the restart: the next one is new.
    assert!(producer_id(&mut c) > pid);
    b.stop();
}

/// With the partitions spread over two producer-state stores, each
/// partition's state lives in the store of its key (`state`, `state-1`),
/// retries are duplicates across a restart, and starting again with one
/// store replays the moved partitions' logs into it, so a retry is still a
/// duplicate with its original offset.
#[test]
fn partitions_spread_over_two_stores_keep_their_state_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_sharded(dir.path(), 4, 2);
    let mut c = Client::connect(b.addr);
    create_topic(&mut c, "t");
    let pid = producer_id(&mut c);
    let batches: Vec<_> = (0..4)
        .map(|p| batch(pid, 0, 0, &[&format!("m{p}")]))
        .collect();
    for (p, b) in batches.iter().enumerate() {
        assert_eq!(produce(&mut c, "t", p as i32, b.clone()), (0, 0));
    }
    drop(c);
    b.stop();
    assert!(dir.path().join("state-1").is_dir());

    let b = start_sharded(dir.path(), 4, 2);
    assert_eq!(b.recovered, (0, 0, 0), "nothing to repair");
    let mut c = Client::connect(b.addr);
    for (p, b) in batches.iter().enumerate() {
        assert_eq!(produce(&mut c, "t", p as i32, b.clone()), (0, 0), "p{p}");
    }
    drop(c);
    b.stop();

    // One store again: the partitions that lived in `state-1` are missing
    // from `state`, which is behind their logs: it replays them.
    let b = start_sharded(dir.path(), 4, 1);
    assert_eq!(b.recovered, (2, 0, 0), "two partitions' batches replayed");
    let mut c = Client::connect(b.addr);
    for (p, b) in batches.iter().enumerate() {
        assert_eq!(produce(&mut c, "t", p as i32, b.clone()), (0, 0), "p{p}");
    }
    assert_eq!(latest_offset(&mut c, "t", 1), 1, "written once");
    b.stop();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_crash_that_left_the_state_behind_the_log_is_caught_up_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    // The data directory's shared producer state.
    let state = dir.path().join("state");
    let saved = dir.path().join("saved-state");
    let b = start(dir.path(), 1);
    let mut c = Client::connect(b.addr);
    create_topic(&mut c, "t");
    let pid = producer_id(&mut c);
    let b0 = batch(pid, 0, 0, &["m0", "m1"]);
    let b1 = batch(pid, 0, 2, &["m2"]);
    let b2 = batch(pid, 0, 3, &["m3", "m4"]);
    assert_eq!(produce(&mut c, "t", 0, b0), (0, 0));
    drop(c);
    b.stop();
    copy_dir(&state, &saved);

    let b = start(dir.path(), 1);
    let mut c = Client::connect(b.addr);
    assert_eq!(produce(&mut c, "t", 0, b1.clone()), (0, 2));
    assert_eq!(produce(&mut c, "t", 0, b2.clone()), (0, 3));
    drop(c);
    b.stop();
    // What a crash leaves when the state's records of b1 and b2 were not
    // yet on disk (the state is fsync'ed on an interval, the log before
    // every answer): the log holds b0..b2, the state knows only b0.
    std::fs::remove_dir_all(&state).unwrap();
    copy_dir(&saved, &state);

    let b = start(dir.path(), 1);
    assert_eq!(b.recovered, (2, 0, 0), "caught up by replaying b1 and b2");
    let mut c = Client::connect(b.addr);
    // The client never heard about b2 and retries it: the log has it, so
    // it is a duplicate with its offset (a state left behind would write
    // it a second time).
    assert_eq!(produce(&mut c, "t", 0, b2), (0, 3));
    assert_eq!(produce(&mut c, "t", 0, b1), (0, 2));
    let values: Vec<String> = fetch_all(&mut c, "t", 0)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, ["m0", "m1", "m2", "m3", "m4"]);
    b.stop();
}

/// DescribeProducers (KIP-664), in the protocol crate's own request and
/// response types: each partition's producers as the shared state holds
/// them, after a restart too; an unknown partition or topic is
/// UNKNOWN_TOPIC_OR_PARTITION, and describing a topic does not create it.
#[test]
fn describe_producers_lists_each_partitions_producers_from_the_state() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;

    let dir = tempfile::tempdir().unwrap();
    let describe = |c: &mut Client, topic: &str, partitions: Vec<i32>| {
        let req = DescribeProducersRequest::default().with_topics(vec![
            TopicRequest::default()
                .with_name(TopicName(StrBytes::from_string(topic.into())))
                .with_partition_indexes(partitions),
        ]);
        let r = c.call(&req, 0);
        assert_eq!(r.topics.len(), 1);
        r.topics[0]
            .partitions
            .iter()
            .map(|p| {
                let mut producers: Vec<(i64, i32, i32, i64, i32, i64)> = p
                    .active_producers
                    .iter()
                    .map(|s| {
                        (
                            s.producer_id.0,
                            s.producer_epoch,
                            s.last_sequence,
                            s.last_timestamp,
                            s.coordinator_epoch,
                            s.current_txn_start_offset,
                        )
                    })
                    .collect();
                producers.sort_unstable();
                (p.partition_index, p.error_code, producers)
            })
            .collect::<Vec<_>>()
    };
    let b = start(dir.path(), 2);
    let mut c = Client::connect(b.addr);
    create_topic(&mut c, "t");
    let (p1, p2) = (producer_id(&mut c), producer_id(&mut c));
    assert_eq!(produce(&mut c, "t", 0, batch(p1, 0, 0, &["a", "b"])).0, 0);
    assert_eq!(produce(&mut c, "t", 0, batch(p1, 0, 2, &["c"])).0, 0);
    assert_eq!(produce(&mut c, "t", 1, batch(p2, 3, 0, &["d"])).0, 0);
    // `batch` stamps every record with this timestamp.
    let ts = |producers: &[(i64, i32, i32, i64, i32, i64)]| producers[0].3;
    let got = describe(&mut c, "t", vec![0, 1, 5]);
    assert_eq!(got[0].0, 0);
    assert_eq!(got[0].1, 0);
    let t0 = ts(&got[0].2);
    assert_eq!(got[0].2, vec![(p1, 0, 2, t0, -1, -1)]);
    assert_eq!(got[1].2, vec![(p2, 3, 0, ts(&got[1].2), -1, -1)]);
    assert_eq!((got[2].0, got[2].1, got[2].2.len()), (5, 3, 0));
    let unknown = describe(&mut c, "nope", vec![0]);
    assert_eq!(unknown[0].1, 3);
    drop(c);
    b.stop();
    // The same after a restart: the state is durable and shared.
    let b = start(dir.path(), 2);
    let mut c = Client::connect(b.addr);
    let again = describe(&mut c, "t", vec![0, 1]);
    assert_eq!(again, got[..2].to_vec());
    assert_eq!(
        c.call(
            &MetadataRequest::default()
                .with_topics(Some(vec![]))
                .with_allow_auto_topic_creation(false),
            9
        )
        .topics
        .len(),
        0,
        "no topic was created (Metadata for none lists none)"
    );
    b.stop();
}

/// A transaction the coordinator does not know (its transaction log was
/// lost, say) is never aborted by a timeout: once its producer has written
/// nothing for `transaction.max.timeout.ms` + 5 min it is reported as
/// hanging, by topic and partition, as Kafka's `hasLateTransaction` rule
/// says; a recent one is not.
#[test]
fn a_transaction_nobody_ends_is_reported_as_hanging() {
    use producer_state::{AppendOptions, Batch};
    use producer_state_broker::now_ms;

    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(Config::new(dir.path(), "127.0.0.1", 9092, 2)).unwrap();
    let topic = broker.topic_or_create("t").unwrap();
    let txn = AppendOptions::client().transactional().verified();
    let now = now_ms();
    let max = 900_000; // transaction.max.timeout.ms
    // Written straight into the state, past the coordinator: partition 1
    // 21 minutes ago, partition 0 a minute ago.
    let (k0, k1) = (topic.partitions[0].key(), topic.partitions[1].key());
    let state = broker.state();
    state
        .append_with(77u64, k1, 0, Batch::new(0, 0, 40, now - 21 * 60_000), txn)
        .unwrap();
    state
        .append_with(78u64, k0, 0, Batch::new(0, 0, 9, now - 60_000), txn)
        .unwrap();
    let late = broker.late_transactions(now);
    assert_eq!(late.len(), 1, "{late:?}");
    let (name, partition, t) = &late[0];
    assert_eq!((name.as_str(), *partition), ("t", 1));
    assert_eq!((t.producer_id.clone(), t.first_offset), (77u64.into(), 40));
    // The sweep logs it (once) and leaves it: only its producer or an
    // operator may end it.
    broker.sweep_transactions();
    broker.sweep_transactions();
    assert_eq!(broker.late_transactions(now).len(), 1);
    // Partition 0's becomes late 20 minutes on.
    assert_eq!(broker.late_transactions(now + max + 300_000 + 1).len(), 2);
    broker.close().unwrap();
}

/// KIP-890 through the broker, as Kafka does it: a transactional batch
/// for a partition that is not in the producer's transaction is refused,
/// and the verification begun for it outlives the refusal, so the
/// producer's later batches on that partition whose first sequence is
/// above the refused one's are refused as out of order
/// (`ProducerAppendInfo.checkSequence`) until one appends.
#[test]
fn a_refused_unverified_batch_leaves_kafkas_verification_state() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;

    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), 2);
    let mut c = Client::connect(b.addr);
    create_topic(&mut c, "t");
    let tx = || TransactionalId(StrBytes::from_string("tx".into()));
    let mut init = InitProducerIdRequest::default();
    init.transactional_id = Some(tx());
    init.transaction_timeout_ms = 60_000;
    let r = c.call(&init, 4);
    assert_eq!(r.error_code, 0);
    let (pid, epoch) = (r.producer_id.0, r.producer_epoch);
    let add = |c: &mut Client, partition: i32| {
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(tx())
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(StrBytes::from_string("t".into())))
                    .with_partitions(vec![partition]),
            ]);
        let r = c.call(&req, 3);
        assert_eq!(
            r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
            0
        );
    };
    add(&mut c, 0);
    // Partition 1 is not in the transaction: refused, and its
    // verification (lowest sequence 0) stays.
    let (code, _) = produce_as(&mut c, Some("tx"), "t", 1, txn_batch(pid, epoch, 0, &["a"]));
    assert_ne!(code, 0, "a batch for a partition outside the transaction");
    add(&mut c, 1);
    // Sequence 1 would start the unknown producer (KIP-360), but it is
    // above the verification's lowest sequence: OUT_OF_ORDER_SEQUENCE_NUMBER.
    let (code, _) = produce_as(&mut c, Some("tx"), "t", 1, txn_batch(pid, epoch, 1, &["b"]));
    assert_eq!(code, 45);
    // Sequence 0 appends and clears it; then 1 follows.
    assert_eq!(
        produce_as(&mut c, Some("tx"), "t", 1, txn_batch(pid, epoch, 0, &["a"])).0,
        0
    );
    assert_eq!(
        produce_as(&mut c, Some("tx"), "t", 1, txn_batch(pid, epoch, 1, &["b"])).0,
        0
    );
    drop(c);
    b.stop();
}
