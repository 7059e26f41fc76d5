//! A fault-injecting TCP proxy for the nodes' frames (loopback only), in
//! the test's own process: one per node, in front of its address, so every
//! message to that node (from its peers and from clients) passes through
//! it. Like the broker's `fault-proxy`, it follows the framing to act
//! between messages:
//!
//! - it forwards a request and then cuts the connection before the reply
//!   can come back (the node acted, the sender never hears so);
//! - it cuts a connection before a message, in either direction;
//! - it delays messages (0 to `max_delay`) and writes some in pieces;
//! - it can isolate its node: every connection is cut and new ones are
//!   refused until it is let go.
//!
//! Faults are drawn from one seeded generator; counts are kept.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::common::Rng;

/// What the proxy does to each message, by probability.
#[derive(Clone, Debug, Default)]
pub struct ProxyFaults {
    /// A request is forwarded and its connection cut before the reply.
    pub drop_after_request: f64,
    /// A connection is cut before a message.
    pub cut: f64,
    /// A message is delayed (uniformly up to `max_delay`).
    pub delay: f64,
    /// The longest delay.
    pub max_delay: Duration,
    /// A message is written in pieces.
    pub split: f64,
}

/// What the proxy did.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub messages: AtomicU64,
    pub dropped_after_request: AtomicU64,
    pub cuts: AtomicU64,
    pub delays: AtomicU64,
    pub splits: AtomicU64,
}

struct State {
    upstream: SocketAddr,
    faults: Mutex<ProxyFaults>,
    rng: Mutex<Rng>,
    blocked: AtomicBool,
    /// Raised on every isolation: connections of an older epoch end.
    epoch: AtomicU64,
    stats: ProxyStats,
}

impl State {
    fn draw(&self) -> f64 {
        self.rng.lock().unwrap().draw()
    }

    fn chance(&self, p: f64) -> bool {
        self.rng.lock().unwrap().chance(p)
    }

    fn faults(&self) -> ProxyFaults {
        self.faults.lock().unwrap().clone()
    }
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy on a free loopback port in front of `upstream`.
    pub async fn start(upstream: SocketAddr, seed: u64) -> FaultProxy {
        assert!(upstream.ip().is_loopback());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            faults: Mutex::new(ProxyFaults::default()),
            rng: Mutex::new(Rng(seed)),
            blocked: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            stats: ProxyStats::default(),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if s.blocked.load(Ordering::SeqCst) {
                    s.stats.refused.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
                s.stats.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(relay(client, s.clone()));
            }
        });
        FaultProxy { addr, state, task }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: ProxyFaults) {
        *self.state.faults.lock().unwrap() = faults;
    }

    /// Isolates the node (cuts every connection, refuses new ones) or lets
    /// it go.
    pub fn isolate(&self, isolated: bool) {
        self.state.blocked.store(isolated, Ordering::SeqCst);
        if isolated {
            self.state.epoch.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Its counts.
    pub fn stats(&self) -> &ProxyStats {
        &self.state.stats
    }
}

async fn relay(client: TcpStream, state: Arc<State>) {
    let connect = TcpStream::connect(state.upstream);
    let Ok(Ok(server)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
        return; // the node is down: the sender reconnects later
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let epoch = state.epoch.load(Ordering::SeqCst);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(direction(cr, sw, state.clone(), epoch, true));
    let down = tokio::spawn(direction(sr, cw, state.clone(), epoch, false));
    // Whichever direction ends first ends the connection.
    tokio::select! {
        _ = up => {},
        _ = down => {},
    }
}

/// Relays whole frames from `r` to `w` until one side closes or a fault
/// cuts the connection. `requests`: this direction carries requests.
async fn direction(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    state: Arc<State>,
    epoch: u64,
    requests: bool,
) {
    loop {
        let mut len = [0u8; 4];
        if r.read_exact(&mut len).await.is_err() {
            return;
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > producer_state_raft::wire::MAX_FRAME {
            return;
        }
        let mut frame = len.to_vec();
        frame.resize(4 + n, 0);
        if r.read_exact(&mut frame[4..]).await.is_err() {
            return;
        }
        if state.blocked.load(Ordering::SeqCst) || state.epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        state.stats.messages.fetch_add(1, Ordering::Relaxed);
        let faults = state.faults();
        if state.chance(faults.cut) {
            state.stats.cuts.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if state.chance(faults.delay) {
            state.stats.delays.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(faults.max_delay.mul_f64(state.draw())).await;
        }
        let written = if frame.len() > 1 && state.chance(faults.split) {
            state.stats.splits.fetch_add(1, Ordering::Relaxed);
            let at = 1 + (state.draw() * (frame.len() - 1) as f64) as usize;
            let first = w.write_all(&frame[..at]).await;
            tokio::time::sleep(Duration::from_micros(200)).await;
            match first {
                Ok(()) => w.write_all(&frame[at..]).await,
                Err(e) => Err(e),
            }
        } else {
            w.write_all(&frame).await
        };
        if written.is_err() {
            return;
        }
        if requests && state.chance(faults.drop_after_request) {
            // Let the node read it (and likely act), then lose the reply.
            state
                .stats
                .dropped_after_request
                .fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
            return;
        }
    }
}
