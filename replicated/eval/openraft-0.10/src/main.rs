//! openraft 0.9.25 against 0.10.0-alpha.37, the same everything else:
//! three nodes in one process, an in-memory network (direct calls), the
//! memstore crates' state machines and logs, with every log append
//! written to a file and fdatasync'ed before openraft hears it is flushed
//! (0.10: by a writer thread that group-commits whatever queued while the
//! last fsync ran, as producer-state-raft's log does; 0.9: in the append
//! itself, since its core awaits every flush before anything else, so a
//! writer thread could never group two); 1, 16 and 64 concurrent
//! `client_write` callers on the leader, each waiting for its answer, for
//! the given seconds; three interleaved rounds, medians. Prints a markdown
//! table. Files go to the system's temporary directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Run {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    fsyncs_per_write: f64,
}

fn summarize(mut lat: Vec<Duration>, took: Duration, fsyncs: u64) -> Run {
    lat.sort();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    Run {
        per_sec: lat.len() as f64 / took.as_secs_f64(),
        p50_us: at(0.5),
        p99_us: at(0.99),
        fsyncs_per_write: fsyncs as f64 / lat.len() as f64,
    }
}

/// The writer thread: group commit of queued appends.
struct Writer<CB: Send + 'static> {
    tx: std::sync::mpsc::Sender<(Vec<u8>, CB)>,
}

fn spawn_writer<CB: Send + 'static>(
    path: PathBuf,
    fsyncs: Arc<AtomicU64>,
    done: impl Fn(CB) + Send + 'static,
) -> Writer<CB> {
    let (tx, rx) = std::sync::mpsc::channel::<(Vec<u8>, CB)>();
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(more) = rx.try_recv() {
                group.push(more);
            }
            let mut bytes = Vec::new();
            for (b, _) in &group {
                bytes.extend_from_slice(b);
            }
            f.write_all(&bytes).unwrap();
            f.sync_data().unwrap();
            fsyncs.fetch_add(1, Ordering::Relaxed);
            for (_, cb) in group {
                done(cb);
            }
        }
    });
    Writer { tx }
}

mod v9 {
    use super::*;
    use mem9::{ClientRequest, MemStore, TypeConfig};
    use or9::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
    use or9::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
    use or9::raft::*;
    use or9::storage::{Adaptor, LogState};
    use or9::{Config, Entry, LogId, Raft, RaftLogReader, RaftStorage, StorageError, Vote};

    type NodeId = u64;
    type Routes = Arc<Mutex<BTreeMap<NodeId, Raft<TypeConfig>>>>;

    #[derive(Debug)]
    struct Gone;
    impl std::fmt::Display for Gone {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("unreachable")
        }
    }
    impl std::error::Error for Gone {}

    /// memstore with every log append written and fdatasync'ed before
    /// it returns (openraft 0.9's core awaits each append's flush anyway,
    /// so a writer thread could never group two of them).
    #[derive(Clone)]
    struct Store {
        inner: Arc<MemStore>,
        file: Arc<Mutex<std::fs::File>>,
        fsyncs: Arc<AtomicU64>,
    }

    impl RaftLogReader<TypeConfig> for Store {
        async fn try_get_log_entries<
            RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + Send,
        >(
            &mut self,
            range: RB,
        ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
            self.inner.try_get_log_entries(range).await
        }
    }

    impl RaftStorage<TypeConfig> for Store {
        type LogReader = Arc<MemStore>;
        type SnapshotBuilder = Arc<MemStore>;
        async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
            self.inner.save_vote(vote).await
        }
        async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
            self.inner.read_vote().await
        }
        async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
            RaftStorage::get_log_state(&mut self.inner).await
        }
        async fn get_log_reader(&mut self) -> Arc<MemStore> {
            self.inner.clone()
        }
        async fn append_to_log<I>(&mut self, entries: I) -> Result<(), StorageError<NodeId>>
        where
            I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        {
            let entries: Vec<_> = entries.into_iter().collect();
            let bytes = serde_json::to_vec(&entries).unwrap();
            self.inner.append_to_log(entries).await?;
            let (file, fsyncs) = (self.file.clone(), self.fsyncs.clone());
            tokio::task::spawn_blocking(move || {
                let mut f = file.lock().unwrap();
                f.write_all(&bytes).unwrap();
                f.sync_data().unwrap();
                fsyncs.fetch_add(1, Ordering::Relaxed);
            })
            .await
            .unwrap();
            Ok(())
        }
        async fn delete_conflict_logs_since(
            &mut self,
            log_id: LogId<NodeId>,
        ) -> Result<(), StorageError<NodeId>> {
            self.inner.delete_conflict_logs_since(log_id).await
        }
        async fn purge_logs_upto(
            &mut self,
            log_id: LogId<NodeId>,
        ) -> Result<(), StorageError<NodeId>> {
            self.inner.purge_logs_upto(log_id).await
        }
        async fn last_applied_state(
            &mut self,
        ) -> Result<(Option<LogId<NodeId>>, or9::StoredMembership<NodeId, ()>), StorageError<NodeId>>
        {
            self.inner.last_applied_state().await
        }
        async fn apply_to_state_machine(
            &mut self,
            entries: &[Entry<TypeConfig>],
        ) -> Result<Vec<mem9::ClientResponse>, StorageError<NodeId>> {
            self.inner.apply_to_state_machine(entries).await
        }
        async fn get_snapshot_builder(&mut self) -> Arc<MemStore> {
            self.inner.clone()
        }
        async fn begin_receiving_snapshot(
            &mut self,
        ) -> Result<Box<std::io::Cursor<Vec<u8>>>, StorageError<NodeId>> {
            self.inner.begin_receiving_snapshot().await
        }
        async fn install_snapshot(
            &mut self,
            meta: &or9::SnapshotMeta<NodeId, ()>,
            snapshot: Box<std::io::Cursor<Vec<u8>>>,
        ) -> Result<(), StorageError<NodeId>> {
            self.inner.install_snapshot(meta, snapshot).await
        }
        async fn get_current_snapshot(
            &mut self,
        ) -> Result<Option<or9::storage::Snapshot<TypeConfig>>, StorageError<NodeId>> {
            self.inner.get_current_snapshot().await
        }
    }

    struct Net {
        routes: Routes,
        to: NodeId,
    }
    struct Factory {
        routes: Routes,
    }
    impl RaftNetworkFactory<TypeConfig> for Factory {
        type Network = Net;
        async fn new_client(&mut self, target: NodeId, _: &()) -> Net {
            Net {
                routes: self.routes.clone(),
                to: target,
            }
        }
    }
    impl Net {
        fn raft(&self) -> Result<Raft<TypeConfig>, Unreachable> {
            self.routes
                .lock()
                .unwrap()
                .get(&self.to)
                .cloned()
                .ok_or_else(|| Unreachable::new(&Gone))
        }
    }
    type R<T, E = or9::error::Infallible> = Result<T, RPCError<NodeId, (), RaftError<NodeId, E>>>;
    impl RaftNetwork<TypeConfig> for Net {
        async fn append_entries(
            &mut self,
            rpc: AppendEntriesRequest<TypeConfig>,
            _: RPCOption,
        ) -> R<AppendEntriesResponse<NodeId>> {
            self.raft()?
                .append_entries(rpc)
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
        }
        async fn install_snapshot(
            &mut self,
            _: InstallSnapshotRequest<TypeConfig>,
            _: RPCOption,
        ) -> R<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
            Err(RPCError::Unreachable(Unreachable::new(&Gone)))
        }
        async fn vote(
            &mut self,
            rpc: VoteRequest<NodeId>,
            _: RPCOption,
        ) -> R<VoteResponse<NodeId>> {
            self.raft()?
                .vote(rpc)
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
        }
    }

    pub async fn run(dir: &Path, producers: usize, time: Duration) -> Run {
        let config = Arc::new(
            Config {
                heartbeat_interval: 50,
                election_timeout_min: 150,
                election_timeout_max: 300,
                ..Config::default()
            }
            .validate()
            .unwrap(),
        );
        let routes: Routes = Arc::default();
        let fsyncs: BTreeMap<NodeId, Arc<AtomicU64>> =
            (1..=3).map(|i| (i, Arc::default())).collect();
        for id in 1..=3u64 {
            let store = Store {
                inner: Arc::new(MemStore::new()),
                file: Arc::new(Mutex::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join(format!("log-{id}")))
                        .unwrap(),
                )),
                fsyncs: fsyncs[&id].clone(),
            };
            let (log, sm) = Adaptor::new(store);
            let raft = Raft::new(
                id,
                config.clone(),
                Factory {
                    routes: routes.clone(),
                },
                log,
                sm,
            )
            .await
            .unwrap();
            routes.lock().unwrap().insert(id, raft);
        }
        let r1 = routes.lock().unwrap()[&1].clone();
        r1.initialize(BTreeMap::from([(1, ()), (2, ()), (3, ())]))
            .await
            .unwrap();
        let leader = loop {
            if let Some(l) = r1.metrics().borrow().current_leader {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let raft = routes.lock().unwrap()[&leader].clone();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let f0 = fsyncs[&leader].load(Ordering::Relaxed);
        let (lat, took) = drive(producers, time, move |p, n| {
            let raft = raft.clone();
            async move {
                raft.client_write(ClientRequest {
                    client: p.to_string(),
                    serial: n,
                    status: "x".into(),
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
        })
        .await;
        let f = fsyncs[&leader].load(Ordering::Relaxed) - f0;
        let rafts: Vec<_> = routes.lock().unwrap().values().cloned().collect();
        for r in rafts {
            let _ = r.shutdown().await;
        }
        summarize(lat, took, f)
    }
}

mod v10 {
    use super::*;
    use mem10::{ClientRequest, MemLogStore, MemStateMachine, TypeConfig};
    use or10::alias::{EntryOf, LogIdOf, SnapshotOf, VoteOf};
    use or10::error::{RPCError, StreamingError, Unreachable};
    use or10::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
    use or10::raft::*;
    use or10::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
    use or10::{Config, Raft};
    use std::io;

    type NodeId = u64;
    type Routes = Arc<Mutex<BTreeMap<NodeId, Raft<TypeConfig, Arc<MemStateMachine>>>>>;

    #[derive(Debug)]
    struct Gone;
    impl std::fmt::Display for Gone {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("unreachable")
        }
    }
    impl std::error::Error for Gone {}

    #[derive(Clone)]
    struct Log {
        store: Arc<MemLogStore>,
        writer: Arc<Mutex<Writer<IOFlushed<TypeConfig>>>>,
    }

    impl RaftLogReader<TypeConfig> for Log {
        async fn try_get_log_entries<
            RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + Send,
        >(
            &mut self,
            range: RB,
        ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
            self.store.try_get_log_entries(range).await
        }
        async fn read_vote(&mut self) -> Result<Option<VoteOf<TypeConfig>>, io::Error> {
            self.store.read_vote().await
        }
    }

    impl RaftLogStorage<TypeConfig> for Log {
        type LogReader = Self;
        async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
            self.store.get_log_state().await
        }
        async fn get_log_reader(&mut self) -> Self {
            self.clone()
        }
        async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> Result<(), io::Error> {
            self.store.save_vote(vote).await
        }
        async fn append<I>(
            &mut self,
            entries: I,
            callback: IOFlushed<TypeConfig>,
        ) -> Result<(), io::Error>
        where
            I: IntoIterator<Item = EntryOf<TypeConfig>> + Send,
        {
            let entries: Vec<_> = entries.into_iter().collect();
            let bytes = serde_json::to_vec(&entries).unwrap();
            self.store.append(entries, IOFlushed::noop()).await?;
            let _ = self.writer.lock().unwrap().tx.send((bytes, callback));
            Ok(())
        }
        async fn truncate_after(
            &mut self,
            last: Option<LogIdOf<TypeConfig>>,
        ) -> Result<(), io::Error> {
            self.store.truncate_after(last).await
        }
        async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> Result<(), io::Error> {
            self.store.purge(log_id).await
        }
    }

    struct Net {
        routes: Routes,
        to: NodeId,
    }
    struct Factory {
        routes: Routes,
    }
    impl RaftNetworkFactory<TypeConfig> for Factory {
        type Network = Net;
        async fn new_client(&mut self, target: NodeId, _: &()) -> Net {
            Net {
                routes: self.routes.clone(),
                to: target,
            }
        }
    }
    impl Net {
        fn raft(&self) -> Result<Raft<TypeConfig, Arc<MemStateMachine>>, Unreachable<TypeConfig>> {
            self.routes
                .lock()
                .unwrap()
                .get(&self.to)
                .cloned()
                .ok_or_else(|| Unreachable::new(&Gone))
        }
    }
    impl RaftNetworkV2<TypeConfig> for Net {
        type SnapshotData = std::io::Cursor<Vec<u8>>;
        async fn append_entries(
            &mut self,
            rpc: AppendEntriesRequest<TypeConfig>,
            _: RPCOption,
        ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
            self.raft()?
                .append_entries(rpc)
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
        }
        async fn vote(
            &mut self,
            rpc: VoteRequest<TypeConfig>,
            _: RPCOption,
        ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
            self.raft()?
                .vote(rpc)
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
        }
        async fn full_snapshot(
            &mut self,
            _vote: VoteOf<TypeConfig>,
            _snapshot: SnapshotOf<TypeConfig, Self::SnapshotData>,
            _cancel: impl std::future::Future<Output = or10::error::ReplicationClosed> + Send + 'static,
            _option: RPCOption,
        ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
            Err(StreamingError::Unreachable(Unreachable::new(&Gone)))
        }
    }

    pub async fn run(dir: &Path, producers: usize, time: Duration) -> Run {
        let config = Arc::new(
            Config {
                heartbeat_interval: 50,
                election_timeout_min: 150,
                election_timeout_max: 300,
                ..Config::default()
            }
            .validate()
            .unwrap(),
        );
        let routes: Routes = Arc::default();
        let fsyncs: BTreeMap<NodeId, Arc<AtomicU64>> =
            (1..=3).map(|i| (i, Arc::default())).collect();
        for id in 1..=3u64 {
            let (store, sm) = mem10::new_mem_store();
            let writer = spawn_writer(
                dir.join(format!("log-{id}")),
                fsyncs[&id].clone(),
                |cb: IOFlushed<TypeConfig>| cb.io_completed(Ok(())),
            );
            let log = Log {
                store,
                writer: Arc::new(Mutex::new(writer)),
            };
            let raft = Raft::new(
                id,
                config.clone(),
                Factory {
                    routes: routes.clone(),
                },
                log,
                sm,
            )
            .await
            .unwrap();
            routes.lock().unwrap().insert(id, raft);
        }
        let r1 = routes.lock().unwrap()[&1].clone();
        r1.initialize(BTreeMap::from([(1, ()), (2, ()), (3, ())]))
            .await
            .unwrap();
        let leader = loop {
            if let Some(l) = or10::rt::WatchReceiver::borrow_watched(&r1.metrics()).current_leader {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let raft = routes.lock().unwrap()[&leader].clone();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let f0 = fsyncs[&leader].load(Ordering::Relaxed);
        let (lat, took) = drive(producers, time, move |p, n| {
            let raft = raft.clone();
            async move {
                raft.client_write(ClientRequest {
                    client: p.to_string(),
                    serial: n,
                    status: "x".into(),
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
        })
        .await;
        let f = fsyncs[&leader].load(Ordering::Relaxed) - f0;
        let rafts: Vec<_> = routes.lock().unwrap().values().cloned().collect();
        for r in rafts {
            let _ = r.shutdown().await;
        }
        summarize(lat, took, f)
    }
}

/// `producers` tasks for `time`, each calling `write(task, n)` for its
/// n-th write and waiting for it (retried while the leader settles): the
/// latencies and the time taken.
async fn drive<F, Fut>(producers: usize, time: Duration, write: F) -> (Vec<Duration>, Duration)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let start = Instant::now();
    let deadline = start + time;
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let write = write.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let mut tries = 0;
                    while let Err(e) = write(p, n).await {
                        tries += 1;
                        assert!(tries < 1000, "{e}");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    lat.push(t.elapsed());
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    (lat, start.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let rounds = 3;
    let time = Duration::from_secs_f64(secs);
    println!(
        "| writers | 0.9.25 writes/s | p50 µs | p99 µs | leader fsyncs per write | 0.10.0-alpha.37 writes/s | p50 µs | p99 µs | leader fsyncs per write | 0.10 / 0.9 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for producers in [1usize, 16, 64] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let d = tempfile_dir();
            a.push(v9::run(&d, producers, time).await);
            let _ = std::fs::remove_dir_all(&d);
            let d = tempfile_dir();
            b.push(v10::run(&d, producers, time).await);
            let _ = std::fs::remove_dir_all(&d);
        }
        let m = |v: &[Run], f: fn(&Run) -> f64| median(v.iter().map(f).collect());
        println!(
            "| {producers} | {:.0} | {:.0} | {:.0} | {:.3} | {:.0} | {:.0} | {:.0} | {:.3} | {:.2}x |",
            m(&a, |r| r.per_sec),
            m(&a, |r| r.p50_us),
            m(&a, |r| r.p99_us),
            m(&a, |r| r.fsyncs_per_write),
            m(&b, |r| r.per_sec),
            m(&b, |r| r.p50_us),
            m(&b, |r| r.p99_us),
            m(&b, |r| r.fsyncs_per_write),
            m(&b, |r| r.per_sec) / m(&a, |r| r.per_sec),
        );
    }
}

fn tempfile_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "or-eval-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
