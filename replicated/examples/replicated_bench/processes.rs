//! The bench's groups of three node processes: this program started again
//! with `--node` and a node's command line is one `producer-state-node`
//! (the same code, built with the same profile), three of them a group on
//! loopback, with producers in the bench's process going through one
//! [`Client`].

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use producer_state_raft::{Append, Client, ClientOptions, Command, Outcome};

use super::{Result, Run, batch_of, drive, percentiles};

/// Runs a node if this process was started as one (`--node` first):
/// `Some(exit code)`.
pub fn node_main() -> Option<i32> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("--node") {
        return None;
    }
    let options = match producer_state_raft::NodeOptions::from_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("node: {e}");
            return Some(2);
        }
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if options.threads > 0 {
        rt.worker_threads(options.threads);
    }
    let rt = rt.enable_all().build();
    Some(
        match rt.map(|rt| rt.block_on(producer_state_raft::run_node(options))) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                eprintln!("node: {e}");
                1
            }
            Err(e) => {
                eprintln!("node: {e}");
                1
            }
        },
    )
}

/// A loopback address for a node that is stopped and started again on
/// it: a port below the kernel's ephemeral range, so that no outgoing
/// connection takes it while the node is down.
fn node_addr(seed: &mut u64) -> Result<SocketAddr> {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    for _ in 0..1000 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let port = 10_000 + (*seed % u64::from(first.saturating_sub(10_000).max(1))) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?);
        }
    }
    Err("no free port".into())
}

/// Three node processes (killed when dropped).
pub struct Group {
    dir: PathBuf,
    addrs: BTreeMap<u64, SocketAddr>,
    children: BTreeMap<u64, Child>,
    pub client: Arc<Client>,
}

impl Drop for Group {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Group {
    /// Three nodes on fresh directories under `dir`, with default options
    /// but for the snapshot interval (as the in-process cluster's).
    pub async fn start(dir: &Path) -> Result<Group> {
        let mut seed = u64::from(std::process::id()) << 20 | 0x5eed;
        seed ^= Instant::now().elapsed().as_nanos() as u64;
        let addrs: BTreeMap<u64, SocketAddr> = (1..=3)
            .map(|i| Ok((i, node_addr(&mut seed)?)))
            .collect::<Result<_>>()?;
        let client = Arc::new(Client::new(
            addrs.iter().map(|(&i, &a)| (i, a)),
            ClientOptions::default(),
        ));
        let mut g = Group {
            dir: dir.to_path_buf(),
            addrs,
            children: BTreeMap::new(),
            client,
        };
        for i in 1..=3 {
            g.start_node(i)?;
        }
        // The three elect at once when new, and may take a few terms to
        // settle: measure once one leader has answered appends for half a
        // second.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut n = 0;
        loop {
            let leader = g.leader().await?;
            let settled = Instant::now() + Duration::from_millis(500);
            while Instant::now() < settled {
                let warm = Command::Append(Append::single(u64::MAX, 0, 0, n));
                g.client.submit(warm).await?;
                n += 1;
            }
            if g.leader().await? == leader {
                return Ok(g);
            }
            if Instant::now() > deadline {
                return Err("no stable leader within 30 s".into());
            }
        }
    }

    /// Starts node `id` and waits until it listens.
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        let members: Vec<String> = self.addrs.iter().map(|(i, a)| format!("{i}={a}")).collect();
        let mut child = Process::new(std::env::current_exe()?)
            .arg("--node")
            .args(["--id", &id.to_string()])
            .arg("--dir")
            .arg(self.dir.join(format!("node-{id}")))
            .args(["--listen", &self.addrs[&id].to_string()])
            .args(["--members", &members.join(",")])
            .args(["--snapshot-every", "20000", "--keep-logs", "1000"])
            // Three nodes share this machine's cores: one runtime thread
            // each (with two each: about 20% fewer appends/s here).
            .args(["--threads", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if line.starts_with("READY") {
                    let _ = tx.send(());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while rx.recv_timeout(Duration::from_millis(20)).is_err() {
            if child.try_wait()?.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!("node {id} did not start").into());
            }
        }
        self.children.insert(id, child);
        Ok(())
    }

    /// SIGKILL.
    pub fn kill(&mut self, id: u64) -> Result<()> {
        if let Some(mut c) = self.children.remove(&id) {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// The leader, as a node that says it leads (within 30 s).
    pub async fn leader(&self) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            for &id in self.children.keys() {
                if let Ok(s) = self.client.status(id).await
                    && s.leader == Some(id)
                {
                    return Ok(id);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("no leader within 30 s".into())
    }
}

/// `producers` producers through one client for `time`: appends/s and
/// latencies, and the leader's log fsyncs per append.
pub async fn run(dir: &Path, producers: usize, time: Duration) -> Result<Run> {
    let g = Group::start(dir).await?;
    let leader = g.leader().await?;
    let f0 = g.client.status(leader).await?.log_fsyncs;
    let client = g.client.clone();
    let (lat, took) = drive(producers, time, move |_, cmd| {
        let client = client.clone();
        async move { client.submit(cmd).await.expect("answered").response }
    })
    .await?;
    let f1 = g.client.status(leader).await?.log_fsyncs;
    let n = lat.len() as u64;
    let mut run = percentiles(lat, n, took);
    run.fsyncs_per_append = (f1 - f0) as f64 / n.max(1) as f64;
    Ok(run)
}

/// Kills the leader of a loaded group `kills` times, restarting it each
/// time: how long from each kill until an append is acknowledged by a new
/// leader.
pub async fn failover(dir: &Path, kills: usize, producers: usize) -> Result<Vec<Duration>> {
    let mut g = Group::start(dir).await?;
    let stop = Arc::new(AtomicBool::new(false));
    // (when acknowledged, by which leader)
    let acks: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let tasks: Vec<_> = (0..producers as u64)
        .map(|p| {
            let (client, stop, acks) = (g.client.clone(), stop.clone(), acks.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 10_000_000 {
                    let cmd = batch_of(p, n);
                    let a = client.submit(cmd).await.expect("answered");
                    assert!(matches!(
                        a.response.outcomes[0],
                        Outcome::Accepted { .. } | Outcome::Duplicate { .. }
                    ));
                    acks.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), a.log_id.leader_id.node_id));
                    n += 1;
                }
            })
        })
        .collect();
    let mut took = Vec::new();
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let leader = g.leader().await?;
        let killed = Instant::now();
        g.kill(leader)?;
        let deadline = killed + Duration::from_secs(30);
        loop {
            let first = acks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(at, by)| *at > killed && *by != leader)
                .map(|(at, _)| *at)
                .min();
            if let Some(at) = first {
                took.push(at - killed);
                break;
            }
            if Instant::now() > deadline {
                return Err("no failover within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        g.start_node(leader)?;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    Ok(took)
}
