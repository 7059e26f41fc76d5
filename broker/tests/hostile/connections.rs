//! Connections: how many, how long, and what running out of descriptors
//! does to the partitions.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::*;

use super::common;
use super::{Answer, Broker, Canary, NOFILE, read_answer, wait_until};

/// More connections than the descriptors left after the partitions' (the
/// default `max.connections` is Kafka's, no bound): the extra ones are
/// closed at once, the broker never runs out of descriptors; a client
/// connected before the flood keeps producing without a storage error;
/// once the flood is gone, new clients are served.
pub fn flood(b: &mut Broker) {
    let partitions = b.partitions_open();
    let max = producer_state_broker::limits::connection_room(usize::MAX, b.nofile(), partitions);
    let mut early = b.client();
    let pid = {
        common::create_topic(&mut early, "flood");
        common::producer_id(&mut early)
    };
    let mut all = Vec::new();
    for _ in 0..max + 40 {
        all.push(TcpStream::connect(b.addr).unwrap());
    }
    // A refused connection is closed at once: it reads as ended. An
    // accepted one has nothing to read.
    std::thread::sleep(Duration::from_millis(500));
    let mut held = Vec::new();
    let mut refused = 0;
    for s in all {
        s.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 1];
        match std::io::Read::read(&mut &s, &mut probe) {
            Ok(0) => refused += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => refused += 1,
            _ => held.push(s),
        }
    }
    b.fds();
    assert!(refused >= 40, "{refused} refused, {} held", held.len());
    assert!(held.len() < max, "{} held, max {max}", held.len());
    for seq in 0..5 {
        let (code, _) = common::produce(
            &mut early,
            "flood",
            0,
            common::batch(pid, 0, seq, &["during the flood"]),
        );
        assert_eq!(code, 0, "produce on an open connection during the flood");
    }
    drop(held);
    let mut after = b.client();
    assert_eq!(after.call(&ApiVersionsRequest::default(), 3).error_code, 0);
}

/// A connection that sends nothing is closed after
/// `connections.max.idle.ms`; one that sends a request one byte at a time
/// (slowloris) is too, though bytes keep arriving; a busy one is not.
#[test]
fn idle_and_slow_connections_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Broker::start(
        &tmp.path().join("data"),
        &["--connections.max.idle.ms", "1000"],
        NOFILE,
    );
    let mut idle = TcpStream::connect(b.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = Instant::now();
    assert_eq!(read_answer(&mut idle), Answer::Closed);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");

    let mut slow = TcpStream::connect(b.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(&1000i32.to_be_bytes()).unwrap();
    let start = Instant::now();
    let mut closed = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        if slow.write_all(&[0]).is_err() {
            closed = true;
            break;
        }
    }
    // Writes may still land in the socket's buffer after the close: the
    // read says for sure.
    if !closed {
        assert_eq!(read_answer(&mut slow), Answer::Closed);
    }
    assert!(start.elapsed() < Duration::from_secs(5));

    // Requests every 300 ms keep a connection open past the idle time.
    let mut busy = b.client();
    for _ in 0..8 {
        assert_eq!(busy.call(&ApiVersionsRequest::default(), 3).error_code, 0);
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sets the soft open-file limit of process `pid` (util-linux `prlimit`;
/// lowering or restoring a soft limit needs no privilege).
fn set_soft_nofile(pid: u32, n: u64) {
    let ok = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--nofile={n}:"))
        .status()
        .expect("prlimit (util-linux) runs")
        .success();
    assert!(ok, "prlimit failed");
}

/// The attack that poisoned partitions until restart: the process runs out
/// of descriptors (before, idle connections took them all; the broker now
/// keeps the partitions' share free, so here the limit is lowered under
/// the broker to what it holds). Meanwhile a client connected before keeps
/// producing, through segment rolls of the producer state; once
/// descriptors are back, no partition answers KAFKA_STORAGE_ERROR, and new
/// connections and topics work.
#[test]
fn running_out_of_descriptors_poisons_no_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = Broker::start(&tmp.path().join("data"), &["--partitions", "2"], NOFILE);
    let mut canary = Canary::new("before");
    canary.check(&mut b, "start");
    let mut early = b.client();
    let pid = common::producer_id(&mut early);
    common::create_topic(&mut early, "steady");
    let mut next = [0i32; 2];
    let mut produce = |c: &mut common::Client, p: usize, n: usize, what: &str| {
        for _ in 0..n {
            let (code, _) = common::produce(
                c,
                "steady",
                p as i32,
                common::batch(pid, 0, next[p], &[what]),
            );
            assert_eq!(code, 0, "partition {p}, batch {}, {what}", next[p]);
            next[p] += 1;
        }
    };
    produce(&mut early, 0, 10, "before");
    produce(&mut early, 1, 10, "before");
    let held = b.fds() as u64;
    set_soft_nofile(b.pid(), held);
    // Out of descriptors: the broker cannot accept a new connection.
    let late = TcpStream::connect(b.addr).unwrap();
    let log = b.dir.with_extension("log");
    assert!(
        wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("os error 24"))
        }),
        "the broker never ran out of descriptors: the test tests nothing"
    );
    // 2,000 batches on partition 0 take its producer state through a
    // segment roll (its first segment is 64 KiB), which needs descriptors.
    produce(&mut early, 0, 2000, "while out of descriptors");
    produce(&mut early, 1, 20, "while out of descriptors");
    set_soft_nofile(b.pid(), NOFILE);
    drop(late);
    let mut c = b.client();
    produce(&mut c, 0, 10, "after");
    produce(&mut c, 1, 10, "after");
    canary.check(&mut b, "running out of descriptors");
    let mut fresh = Canary::new("after");
    fresh.check(&mut b, "a new topic after running out of descriptors");
    // What the restart reads is what was acknowledged.
    let (d, a, n) = b.kill9();
    let b = Broker::restart(&d, a, n);
    let mut c = b.client();
    assert_eq!(
        common::latest_offset(&mut c, "steady", 0),
        i64::from(next[0])
    );
    assert_eq!(
        common::latest_offset(&mut c, "steady", 1),
        i64::from(next[1])
    );
}
