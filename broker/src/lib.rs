//! A small Kafka-protocol broker built on `producer-state`: exactly-once
//! (idempotent) produce for real Kafka clients.
//!
//! It speaks the Kafka wire protocol through the `kafka-protocol` crate
//! (ApiVersions, Metadata with topic auto-creation, InitProducerId,
//! Produce, ListOffsets and Fetch), keeps one log file per partition and
//! one [`producer_state::ProducerStateStore`] for all of them, and is the
//! reference for `docs/broker.md`: how a broker embeds the crate, the order
//! of its durable writes and what recovery does when the two logs disagree.
//! [`partition`] holds the produce path and recovery; [`server`] the
//! protocol.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod agreement;
pub mod batch;
pub mod catalog;
pub mod error;
mod group;
pub mod group_coordinator;
pub mod limits;
pub mod partition;
pub mod pids;
pub mod plog;
pub mod records;
pub mod records_log;
pub mod server;
pub mod txn_coordinator;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use catalog::{Catalog, CatalogTopic};
pub use error::{Error, Result};
pub use limits::Limits;
use partition::{Partition, partition_dir};
use pids::ProducerIds;
use producer_state::{LateTransaction, ProducerId, ProducerStateStore};

/// How the broker runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The data directory.
    pub dir: PathBuf,
    /// Host Metadata hands out for this broker.
    pub advertised_host: String,
    /// Port Metadata hands out for this broker.
    pub advertised_port: i32,
    /// Partitions of an auto-created topic.
    pub partitions: i32,
    /// What clients may take ([`limits`]).
    pub limits: Limits,
    /// Consumer group settings ([`group_coordinator`]).
    pub group: group_coordinator::GroupConfig,
    /// `producer.id.expiration.ms`: how long after its newest batch's
    /// timestamp a producer without an open transaction is forgotten
    /// (default a day, Kafka's).
    pub producer_id_expiration: std::time::Duration,
    /// How many producer-state stores the partitions are spread over
    /// (default 1: one store per data directory). Partition key `k` lives
    /// in store `k % state_shards`: `DIR/state` for store 0, `DIR/state-i`
    /// for the others. Changing it moves partitions to other stores, into
    /// which their logs are replayed at open (the new store is behind
    /// them); what the old store held of them stays there, unread, until
    /// the count comes back and the agreement check compares it with the
    /// log.
    pub state_shards: usize,
}

impl Config {
    /// A broker on `dir` that hands out `host:port` in Metadata and
    /// creates topics with `partitions` partitions, with the default
    /// [`Limits`].
    pub fn new(dir: impl Into<PathBuf>, host: &str, port: i32, partitions: i32) -> Config {
        Config {
            dir: dir.into(),
            advertised_host: host.to_string(),
            advertised_port: port,
            partitions,
            limits: Limits::default(),
            group: group_coordinator::GroupConfig::default(),
            producer_id_expiration: partition::PRODUCER_ID_EXPIRATION,
            state_shards: 1,
        }
    }
}

/// A topic: its partitions, numbered from 0.
#[derive(Debug)]
pub struct Topic {
    /// The partitions, index = partition number.
    pub partitions: Vec<Arc<Partition>>,
}

/// Counters since the broker started (printed on shutdown; duplicates are
/// also logged one by one).
#[derive(Debug, Default)]
pub struct Stats {
    /// Batches written to a partition log.
    pub batches_appended: AtomicU64,
    /// Produce retries answered as duplicates with the original offset.
    pub duplicates: AtomicU64,
    /// Batches refused (out of order, fenced, corrupt, storage error).
    pub refused: AtomicU64,
    /// Producer ids handed out.
    pub producer_ids: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused because `max.connections` were open.
    pub connections_refused: AtomicU64,
    /// Batches of partition logs replayed into a producer state that a
    /// crash had left behind its log (when partitions were opened).
    pub batches_replayed: AtomicU64,
    /// Partitions whose producer state was ahead of their log when they
    /// were opened, and was cut back to it.
    pub states_truncated: AtomicU64,
    /// Producer states rebuilt from their whole log (not belonging to it)
    /// when partitions were opened.
    pub states_rebuilt: AtomicU64,
}

impl Stats {
    /// One line of `name=value` pairs.
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "batches_appended={} duplicates={} refused={} producer_ids={} connections={} \
             connections_refused={} batches_replayed={} states_truncated={} states_rebuilt={}",
            g(&self.batches_appended),
            g(&self.duplicates),
            g(&self.refused),
            g(&self.producer_ids),
            g(&self.connections),
            g(&self.connections_refused),
            g(&self.batches_replayed),
            g(&self.states_truncated),
            g(&self.states_rebuilt)
        )
    }
}

/// The broker's state: topics, producer ids, counters.
#[derive(Debug)]
pub struct Broker {
    config: Config,
    topics_dir: PathBuf,
    /// The producer-state stores ([`partition`]); partition key `k` lives
    /// in `states[k % states.len()]` ([`Config::state_shards`]).
    states: Vec<Arc<ProducerStateStore>>,
    topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    /// The durable list of topics; its lock is held while a topic is
    /// created, so creations are one at a time.
    catalog: Mutex<Catalog>,
    pids: Mutex<ProducerIds>,
    /// Counters.
    pub stats: Stats,
    /// Woken whenever a batch is appended (long-polling fetches wait on it).
    pub(crate) data: tokio::sync::Notify,
    /// Partitions open (for the descriptors they hold).
    partitions_open: AtomicUsize,
    /// Consumer groups and their committed offsets.
    groups: group_coordinator::GroupCoordinator,
    /// Transactional ids and their transactions.
    txn: Mutex<txn_coordinator::TxnCoordinator>,
    /// The coordinator's ongoing transactions, read without its lock.
    txn_view: Arc<txn_coordinator::TxnView>,
    /// The late transactions already logged (store key, producer, first
    /// offset): each is logged once, when it becomes late.
    late_logged: Mutex<std::collections::HashSet<(i32, ProducerId, i64)>>,
}

/// Milliseconds since the Unix epoch (the clock of transaction timeouts
/// and marker timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl txn_coordinator::Markers for Broker {
    fn write_marker(
        &self,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> std::result::Result<(), String> {
        let t = self
            .topic(topic)
            .ok_or_else(|| format!("no topic {topic}"))?;
        let p = usize::try_from(partition)
            .ok()
            .and_then(|i| t.partitions.get(i))
            .ok_or_else(|| format!("no partition {topic}-{partition}"))?;
        p.write_marker(
            producer_id,
            producer_epoch,
            batch::ControlMarker {
                commit,
                coordinator_epoch,
            },
            now_ms(),
        )?;
        self.data.notify_waiters();
        Ok(())
    }

    fn complete_offsets(
        &self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> std::result::Result<(), String> {
        self.groups
            .complete_txn(group, producer_id, commit)
            .map_err(|e| e.to_string())
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.`
/// or `..`. It also keeps a name safe as a directory name.
pub fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// The topics of a data directory from before the catalog, by its
/// partition directories (`<topic>-<partition>`): a topic has as many
/// partitions as its highest partition number plus one.
fn topics_in(topics_dir: &Path, max_partitions: usize) -> Result<BTreeMap<String, i32>> {
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    let entries = fs::read_dir(topics_dir).map_err(|e| Error::io("list", topics_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", topics_dir, e))?;
        let name = entry.file_name();
        let Some((topic, index)) = name.to_str().and_then(|n| n.rsplit_once('-')) else {
            continue;
        };
        let Ok(index) = index.parse::<i32>() else {
            continue;
        };
        if valid_topic_name(topic) && index >= 0 {
            if usize::try_from(index).unwrap_or(usize::MAX) >= max_partitions {
                return Err(Error::TooManyPartitions {
                    topic: topic.to_string(),
                    partitions: index.saturating_add(1),
                    held: 0,
                    max: max_partitions,
                });
            }
            let c = counts.entry(topic.to_string()).or_default();
            *c = (*c).max(index + 1);
        }
    }
    Ok(counts)
}

/// Opens (or creates) the partitions of topic `name`, whose states are
/// keys `t.first_key ..` of `states` (each in the store of its key: see
/// [`store_of`]; `known`: the producers the stores knew of each key when
/// the broker opened).
fn open_topic(
    topics_dir: &Path,
    (name, t): (&str, CatalogTopic),
    states: &[Arc<ProducerStateStore>],
    known: &std::collections::HashMap<i32, Vec<ProducerId>>,
    stats: &Stats,
) -> Result<(Topic, i64)> {
    let mut partitions = Vec::new();
    let mut max_pid = -1;
    for i in 0..t.partitions {
        let key = t.first_key + i;
        let ids = known.get(&key).map_or(&[][..], |v| v.as_slice());
        let (p, report) = Partition::open(
            &partition_dir(topics_dir, name, i),
            (name, i, key),
            store_of(states, key),
            ids,
        )?;
        max_pid = max_pid.max(report.max_producer_id);
        stats
            .batches_replayed
            .fetch_add(report.replayed, Ordering::Relaxed);
        if report.truncated.is_some() {
            stats.states_truncated.fetch_add(1, Ordering::Relaxed);
        }
        if report.rebuilt.is_some() {
            stats.states_rebuilt.fetch_add(1, Ordering::Relaxed);
        }
        partitions.push(Arc::new(p));
    }
    Ok((Topic { partitions }, max_pid))
}

/// The store of partition key `key`.
fn store_of(states: &[Arc<ProducerStateStore>], key: i32) -> &Arc<ProducerStateStore> {
    &states[shard_of(key, states.len())]
}

/// Which of `n` stores (at least one) holds partition key `key`.
fn shard_of(key: i32, n: usize) -> usize {
    key.unsigned_abs() as usize % n
}

impl Broker {
    /// Opens the broker's data directory (created if missing) and recovers
    /// every partition of every topic in its catalog, creating those a
    /// crash left uncreated ([`catalog`]).
    pub fn open(config: Config) -> Result<Broker> {
        let topics_dir = config.dir.join("topics");
        fs::create_dir_all(&topics_dir)
            .map_err(|e| Error::io("create directory", &topics_dir, e))?;
        let catalog = Catalog::open(&config.dir, || {
            topics_in(&topics_dir, config.limits.max_partitions)
        })?;
        let mut pids = ProducerIds::open(&config.dir)?;
        let mut topics = BTreeMap::new();
        let stats = Stats::default();
        let states = (0..config.state_shards.max(1))
            .map(|i| {
                partition::open_state(&config.dir, i, config.producer_id_expiration).map(Arc::new)
            })
            .collect::<Result<Vec<_>>>()?;
        // Each key's producers as its own store knows them: another store
        // may still hold a key it served before `state_shards` changed.
        let mut known = std::collections::HashMap::new();
        for (i, state) in states.iter().enumerate() {
            let own = partition::known_producers(state)
                .into_iter()
                .filter(|(key, _)| shard_of(*key, states.len()) == i);
            known.extend(own);
        }
        for (name, &t) in catalog.topics() {
            let (topic, max_pid) = open_topic(&topics_dir, (name, t), &states, &known, &stats)?;
            pids.at_least_above(max_pid);
            topics.insert(name.clone(), Arc::new(topic));
        }
        drop(known);
        // What the partitions replayed is durable before the per-partition
        // states of an older broker, which it replaces, go.
        for state in &states {
            state.sync().map_err(|source| Error::State {
                partition: "(all)".into(),
                source,
            })?;
        }
        let mut migrated = 0usize;
        for (name, t) in catalog.topics() {
            for i in 0..t.partitions {
                migrated += usize::from(partition::remove_legacy_state(&partition_dir(
                    &topics_dir,
                    name,
                    i,
                ))?);
            }
        }
        if migrated > 0 {
            tracing::info!(
                partitions = migrated,
                "removed the per-partition producer states of an older broker (the shared state replaces them)"
            );
        }
        let open: usize = topics
            .values()
            .map(|t: &Arc<Topic>| t.partitions.len())
            .sum();
        // One line for the whole recovery (a line per partition would be
        // ten thousand): what was replayed, truncated and rebuilt.
        tracing::info!(
            partitions = open,
            batches_replayed = stats.batches_replayed.load(Ordering::Relaxed),
            states_truncated = stats.states_truncated.load(Ordering::Relaxed),
            states_rebuilt = stats.states_rebuilt.load(Ordering::Relaxed),
            "partitions opened"
        );
        let groups = group_coordinator::GroupCoordinator::open(
            &config.dir.join("offsets.log"),
            config.group.clone(),
        )?;
        let txn = txn_coordinator::TxnCoordinator::open(&config.dir.join("transactions.log"))?;
        let broker = Broker {
            txn_view: txn.view(),
            txn: Mutex::new(txn),
            groups,
            partitions_open: AtomicUsize::new(open),
            config,
            topics_dir,
            states,
            topics: RwLock::new(topics),
            catalog: Mutex::new(catalog),
            pids: Mutex::new(pids),
            stats,
            data: tokio::sync::Notify::new(),
            late_logged: Mutex::default(),
        };
        // Transactions the log left prepared (a crash between EndTxn and
        // its last marker) complete now that the partitions are open.
        let done = broker.transactions(|c| c.recover(&broker));
        if done > 0 {
            tracing::info!(
                transactions = done,
                "completed transactions a crash left prepared"
            );
        }
        Ok(broker)
    }

    /// Aborts the transactions past their `transaction.timeout.ms`, and
    /// completes those a failed marker left prepared (blocking IO).
    pub fn sweep_transactions(&self) {
        let now = now_ms();
        let aborted = self.transactions(|c| {
            let aborted = c.abort_expired(now, self);
            c.recover(self);
            aborted
        });
        if !aborted.is_empty() {
            tracing::warn!(transactional_ids = ?aborted, "aborted transactions past their timeout");
        }
        self.log_late_transactions(now);
    }

    /// The hanging transactions at `now_ms`: each partition's oldest open
    /// transaction whose producer wrote nothing for longer than
    /// `transaction.max.timeout.ms` plus 5 minutes (Kafka's
    /// `hasLateTransaction`), with its topic and partition number. The
    /// coordinator aborts a transaction at its timeout, so one still open
    /// then is one it does not know: written by an earlier coordinator
    /// whose log was lost, or left by a bug. It holds the partition's last
    /// stable offset back, and `read_committed` consumers with it, until
    /// its producer or an operator ends it. Sets the store's gauge
    /// `producer_state_partitions_with_late_transactions`.
    pub fn late_transactions(&self, now_ms: i64) -> Vec<(String, i32, LateTransaction)> {
        let max = i64::from(txn_coordinator::MAX_TIMEOUT_MS);
        let late: Vec<LateTransaction> = self
            .states
            .iter()
            .flat_map(|s| s.late_transactions(now_ms, max))
            .collect();
        if late.is_empty() {
            return Vec::new();
        }
        let mut names = std::collections::HashMap::new();
        for (name, t) in self.topics() {
            for (i, p) in t.partitions.iter().enumerate() {
                names.insert(p.key(), (name.clone(), i as i32));
            }
        }
        late.into_iter()
            .filter_map(|t| {
                let (name, p) = names.get(&t.partition)?.clone();
                Some((name, p, t))
            })
            .collect()
    }

    /// Logs each transaction the moment it becomes late (once), and
    /// forgets those no longer late.
    fn log_late_transactions(&self, now_ms: i64) {
        let late = self.late_transactions(now_ms);
        let mut logged = self.late_logged.lock().unwrap_or_else(|p| p.into_inner());
        let mut now = std::collections::HashSet::with_capacity(late.len());
        for (topic, partition, t) in &late {
            let key = (t.partition, t.producer_id.clone(), t.first_offset);
            if !logged.contains(&key) {
                tracing::warn!(
                    topic = %topic,
                    partition,
                    producer_id = %t.producer_id,
                    first_offset = t.first_offset,
                    idle_ms = now_ms.saturating_sub(t.last_timestamp),
                    "a hanging transaction holds the last stable offset back: open past \
                     transaction.max.timeout.ms + 5 min"
                );
            }
            now.insert(key);
        }
        *logged = now;
    }

    /// The ongoing transactions, checked by partitions without the
    /// coordinator's lock.
    pub fn txn_view(&self) -> Arc<txn_coordinator::TxnView> {
        self.txn_view.clone()
    }

    /// Runs `f` on the transaction coordinator (one call at a time).
    pub fn transactions<R>(&self, f: impl FnOnce(&mut txn_coordinator::TxnCoordinator) -> R) -> R {
        f(&mut self.txn.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The group coordinator.
    pub fn groups(&self) -> &group_coordinator::GroupCoordinator {
        &self.groups
    }

    /// Partitions open now.
    pub fn partitions_open(&self) -> usize {
        self.partitions_open.load(Ordering::Relaxed)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The topic, if it exists.
    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Every topic, by name.
    pub fn topics(&self) -> Vec<(String, Arc<Topic>)> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The topic, created with the configured partition count if missing
    /// (blocking IO: creating opens a store per partition). Refused with
    /// [`Error::TooManyPartitions`] past `max.partitions`.
    pub fn topic_or_create(&self, name: &str) -> Result<Arc<Topic>> {
        if let Some(t) = self.topic(name) {
            return Ok(t);
        }
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = self.topic(name) {
            return Ok(t);
        }
        let entry = match catalog.topics().get(name) {
            // Catalogued by a creation that failed part-way: finish it.
            Some(&t) => t,
            None => {
                let n = self.config.partitions;
                let held = catalog.partitions();
                let max = self.config.limits.max_partitions;
                if held + usize::try_from(n).unwrap_or(usize::MAX) > max {
                    return Err(Error::TooManyPartitions {
                        topic: name.to_string(),
                        partitions: n,
                        held,
                        max,
                    });
                }
                catalog.add(name, n)?
            }
        };
        let none = std::collections::HashMap::new();
        let (topic, _) = open_topic(
            &self.topics_dir,
            (name, entry),
            &self.states,
            &none,
            &self.stats,
        )?;
        tracing::info!(
            topic = name,
            partitions = entry.partitions,
            first_key = entry.first_key,
            "created topic"
        );
        self.partitions_open
            .fetch_add(topic.partitions.len(), Ordering::Relaxed);
        let topic = Arc::new(topic);
        self.topics
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), topic.clone());
        Ok(topic)
    }

    /// Where the produce path's time went, over all partitions:
    /// `batches=.. state_ms=.. log_ms=.. produce_ms=.. state_share=..%
    /// state_fsyncs=..` (the share of the produce path spent in
    /// `producer-state`, and the fsyncs its stores did in the background).
    pub fn timing_summary(&self) -> String {
        let (mut batches, mut state, mut log, mut total) = (0u64, 0u64, 0u64, 0u64);
        let state_fsyncs: u64 = self.states.iter().map(|s| s.stats().log_fsyncs).sum();
        for (_, t) in self.topics() {
            for p in &t.partitions {
                let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let tm = p.timings();
                batches += g(&tm.batches);
                state += g(&tm.state_ns);
                log += g(&tm.log_ns);
                total += g(&tm.total_ns);
            }
        }
        format!(
            "batches={batches} state_ms={:.1} log_ms={:.1} produce_ms={:.1} state_share={:.1}% \
             state_fsyncs={state_fsyncs}",
            state as f64 / 1e6,
            log as f64 / 1e6,
            total as f64 / 1e6,
            if total == 0 {
                0.0
            } else {
                100.0 * state as f64 / total as f64
            }
        )
    }

    /// Hands out a new producer id, durably (blocking IO).
    pub fn allocate_producer_id(&self) -> Result<i64> {
        let id = self
            .pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocate()?;
        self.stats.producer_ids.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// The producer state of the first store: every partition's with the
    /// default single store ([`Config::state_shards`]).
    pub fn state(&self) -> &ProducerStateStore {
        &self.states[0]
    }

    /// Every producer-state store, store `i` holding partition keys `k`
    /// with `k % n == i`.
    pub fn states(&self) -> &[Arc<ProducerStateStore>] {
        &self.states
    }

    /// Closes the producer states (durable, a clean shutdown marked) once
    /// no partition shares them any more; a request still in flight holding
    /// a partition leaves its store to be closed when the last user drops
    /// it.
    pub fn close(self) -> Result<()> {
        drop(self.topics.into_inner().unwrap_or_else(|p| p.into_inner()));
        let state_err = |source| Error::State {
            partition: "(all)".into(),
            source,
        };
        for state in self.states {
            match Arc::try_unwrap(state) {
                Ok(store) => store.close().map_err(state_err)?,
                Err(shared) => shared.sync().map_err(state_err)?,
            }
        }
        Ok(())
    }
}
