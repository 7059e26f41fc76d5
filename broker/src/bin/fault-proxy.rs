//! A fault-injecting TCP proxy for the end-to-end proof (loopback only).
//!
//! `fault-proxy --listen 127.0.0.1:P --upstream 127.0.0.1:Q [--seed N]
//! [--produce-drop P] [--random-drop P] [--stats FILE]`
//!
//! It relays Kafka connections to the broker and, at random:
//! - drops a connection right after it forwarded a Produce request and
//!   before the broker's response can come back (probability
//!   `--produce-drop` per Produce request, default 0.03): the broker may
//!   well have written the batch, the client never hears so and retries it
//!   with the same sequence numbers;
//! - drops a connection at any other moment (`--random-drop` per relayed
//!   chunk, default 0.002);
//! - delays chunks (0 to 20 ms) and splits them into pieces written
//!   separately, so the broker sees requests arrive in fragments.
//!
//! It counts what it did in `--stats FILE` (rewritten after every event:
//! `connections=.. produce_drops=.. random_drops=.. splits=.. delays=..
//! produce_batches=.. resent_batches=..`). A resent batch is one the client
//! sent again: the same (topic, partition, producer id, epoch, base
//! sequence) for an idempotent producer, the same CRC-32C otherwise; that is
//! the retry count of the proof, seen on the wire.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader};
use kafka_protocol::protocol::Decodable;
use producer_state_broker::batch;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// (topic, partition, producer id, epoch, base sequence or CRC-32C).
type BatchKey = (String, i32, i64, i16, i64);

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    produce_drops: AtomicU64,
    random_drops: AtomicU64,
    splits: AtomicU64,
    delays: AtomicU64,
    produce_batches: AtomicU64,
    resent_batches: AtomicU64,
    seen: std::sync::Mutex<HashSet<BatchKey>>,
}

/// Counts the batches of a Produce request frame (without its size
/// prefix), and those seen before.
fn count_batches(frame: &[u8], stats: &Stats) {
    let mut buf = Bytes::copy_from_slice(frame);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let Ok(header) =
        RequestHeader::decode(&mut buf, ApiKey::Produce.request_header_version(version))
    else {
        return;
    };
    let Ok(req) = ProduceRequest::decode(&mut buf, header.request_api_version) else {
        return;
    };
    let mut seen = stats.seen.lock().unwrap_or_else(|p| p.into_inner());
    for t in req.topic_data {
        for p in t.partition_data {
            let Some(records) = p.records else { continue };
            let Ok(h) = batch::parse(&records) else {
                continue;
            };
            let key = if h.is_idempotent() {
                (
                    t.name.0.to_string(),
                    p.index,
                    h.producer_id,
                    h.producer_epoch,
                    i64::from(h.base_sequence),
                )
            } else {
                let crc = u32::from_be_bytes([records[17], records[18], records[19], records[20]]);
                (t.name.0.to_string(), p.index, -1, -1, i64::from(crc))
            };
            stats.produce_batches.fetch_add(1, Ordering::Relaxed);
            if !seen.insert(key) {
                stats.resent_batches.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct Config {
    upstream: SocketAddr,
    produce_drop: f64,
    random_drop: f64,
    stats_file: Option<PathBuf>,
}

/// xorshift64*: enough randomness for fault injection, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

fn write_stats(cfg: &Config, s: &Stats) {
    let Some(path) = &cfg.stats_file else { return };
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let line = format!(
        "connections={} produce_drops={} random_drops={} splits={} delays={} \
         produce_batches={} resent_batches={}\n",
        g(&s.connections),
        g(&s.produce_drops),
        g(&s.random_drops),
        g(&s.splits),
        g(&s.delays),
        g(&s.produce_batches),
        g(&s.resent_batches)
    );
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, line).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Writes `buf`, maybe delayed, maybe in pieces.
async fn relay_chunk(
    w: &mut OwnedWriteHalf,
    buf: &[u8],
    rng: &mut Rng,
    stats: &Stats,
) -> std::io::Result<()> {
    if rng.chance(0.05) {
        stats.delays.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
    }
    if buf.len() > 1 && rng.chance(0.1) {
        stats.splits.fetch_add(1, Ordering::Relaxed);
        let mut at = 0;
        while at < buf.len() {
            let n = (1 + rng.below(buf.len() as u64 / 2 + 1) as usize).min(buf.len() - at);
            w.write_all(&buf[at..at + n]).await?;
            w.flush().await?;
            at += n;
            tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
        }
        return Ok(());
    }
    w.write_all(buf).await
}

/// Client to broker: follows the request framing to see Produce requests.
async fn upstream_dir(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    doomed: Arc<AtomicBool>,
    cfg: Arc<Config>,
    stats: Arc<Stats>,
    seed: u64,
) {
    let mut rng = Rng(seed | 1);
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if doomed.load(Ordering::SeqCst) {
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        // Forward whole frames one by one, so a drop can follow a Produce.
        while pending.len() >= 4 {
            let len = u32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]) as usize;
            if pending.len() < 4 + len {
                break;
            }
            let frame: Vec<u8> = pending.drain(..4 + len).collect();
            let is_produce = len >= 4 && frame[4] == 0 && frame[5] == 0;
            if is_produce {
                count_batches(&frame[4..], &stats);
            }
            if rng.chance(cfg.random_drop) {
                stats.random_drops.fetch_add(1, Ordering::Relaxed);
                write_stats(&cfg, &stats);
                doomed.store(true, Ordering::SeqCst);
                return;
            }
            if relay_chunk(&mut w, &frame, &mut rng, &stats).await.is_err() {
                return;
            }
            if is_produce && rng.chance(cfg.produce_drop) {
                // The request is on its way; its response must not return.
                doomed.store(true, Ordering::SeqCst);
                stats.produce_drops.fetch_add(1, Ordering::Relaxed);
                write_stats(&cfg, &stats);
                // Let the broker read (and likely process) it first.
                tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
                return;
            }
        }
    }
}

/// Broker to client: relayed unless the connection is doomed.
async fn downstream_dir(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    doomed: Arc<AtomicBool>,
    cfg: Arc<Config>,
    stats: Arc<Stats>,
    seed: u64,
) {
    let mut rng = Rng(seed | 1);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if doomed.load(Ordering::SeqCst) {
            return;
        }
        if rng.chance(cfg.random_drop) {
            stats.random_drops.fetch_add(1, Ordering::Relaxed);
            write_stats(&cfg, &stats);
            doomed.store(true, Ordering::SeqCst);
            return;
        }
        if relay_chunk(&mut w, &buf[..n], &mut rng, &stats)
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn handle(client: TcpStream, cfg: Arc<Config>, stats: Arc<Stats>, seed: u64) {
    let Ok(broker) = TcpStream::connect(cfg.upstream).await else {
        return; // broker down (killed): the client reconnects later
    };
    let _ = client.set_nodelay(true);
    let _ = broker.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (br, bw) = broker.into_split();
    let doomed = Arc::new(AtomicBool::new(false));
    let up = tokio::spawn(upstream_dir(
        cr,
        bw,
        doomed.clone(),
        cfg.clone(),
        stats.clone(),
        seed,
    ));
    let down = tokio::spawn(downstream_dir(
        br,
        cw,
        doomed.clone(),
        cfg,
        stats,
        seed.rotate_left(17),
    ));
    // Whichever direction ends first ends the connection: dropping both
    // halves of both sockets closes them.
    tokio::select! {
        _ = up => {},
        _ = down => {},
    }
}

fn parse() -> Result<(SocketAddr, Config, u64), String> {
    let mut listen = None;
    let mut upstream = None;
    let mut seed = 1u64;
    let mut produce_drop = 0.03;
    let mut random_drop = 0.002;
    let mut stats_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let v = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag} {v}: bad value");
        match flag.as_str() {
            "--listen" => {
                listen = Some(
                    v.parse::<SocketAddr>()
                        .map_err(|_| format!("bad --listen {v}"))?,
                )
            }
            "--upstream" => {
                upstream = Some(
                    v.parse::<SocketAddr>()
                        .map_err(|_| format!("bad --upstream {v}"))?,
                )
            }
            "--seed" => seed = v.parse().map_err(bad)?,
            "--produce-drop" => produce_drop = v.parse().map_err(|_| format!("bad {flag}"))?,
            "--random-drop" => random_drop = v.parse().map_err(|_| format!("bad {flag}"))?,
            "--stats" => stats_file = Some(PathBuf::from(v)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let listen = listen.ok_or("--listen is required")?;
    let upstream = upstream.ok_or("--upstream is required")?;
    if !listen.ip().is_loopback() || !upstream.ip().is_loopback() {
        return Err("the proxy relays loopback addresses only".into());
    }
    Ok((
        listen,
        Config {
            upstream,
            produce_drop,
            random_drop,
            stats_file,
        },
        seed,
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (listen, cfg, seed) = match parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fault-proxy: {e}");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fault-proxy: listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    let cfg = Arc::new(cfg);
    let stats = Arc::new(Stats::default());
    write_stats(&cfg, &stats);
    println!("proxy listening on {listen}");
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fault-proxy: SIGTERM handler: {e}");
            std::process::exit(1);
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    stats.connections.fetch_add(1, Ordering::Relaxed);
                    write_stats(&cfg, &stats);
                    tokio::spawn(handle(client, cfg.clone(), stats.clone(), rng.next()));
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    write_stats(&cfg, &stats);
}
