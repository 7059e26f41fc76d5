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
