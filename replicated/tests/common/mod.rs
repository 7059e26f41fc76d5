//! Helpers shared by the member's integration tests.

use producer_state::{ProducerEntry, ProducerStateManager};

/// Every key of `mgr` with its entry, in key order, to compare states.
pub fn sorted(mgr: &ProducerStateManager) -> Vec<(String, i32, ProducerEntry)> {
    let mut v: Vec<_> = mgr
        .iter()
        .map(|(p, part, e)| (p.to_string(), part, e))
        .collect();
    v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    v
}

/// A free loopback address for a node that will be stopped and started
/// again on it: a port below the kernel's ephemeral range (so no outgoing
/// connection is given it while the node is down), bound and let go.
#[allow(dead_code)]
pub fn node_addr() -> std::net::SocketAddr {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let mut x = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 10_000 + (x % u64::from(first.saturating_sub(10_000).max(1))) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free port below {first}");
}

/// splitmix64: the tests' seeded randomness (a failing seed names its run).
#[allow(dead_code)]
pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in [0, 1).
    pub fn draw(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.draw() < p
    }
}

/// The offset an acknowledgement names: where an `ACCEPTED` append went,
/// or where a `DUPLICATE`'s original did.
#[allow(dead_code)]
pub fn offset(o: &producer_state_raft::Outcome) -> i64 {
    use producer_state_raft::Outcome;
    match o {
        Outcome::Accepted { offset } => *offset,
        Outcome::Duplicate {
            original: Some((offset, _)),
        } => *offset,
        other => panic!("not an acknowledgement: {other:?}"),
    }
}
