//! A partition's truncation reads only its own records where the store
//! knows where they lie (docs/lifecycle.md, "One partition's
//! truncation"), and must get exactly what reading the log from its base
//! gets. Two stores take the same random histories, one of them made to
//! read the log (`read_the_log_to_truncate_for_tests`): after every step
//! both hold the same state, answer the same, and the first has read its
//! records alone in most of its partition truncations. The histories mix
//! what a partition's replay must find among the others' records:
//! batches of named and numeric producers, single-sequence appends (which
//! are not placed: those replays read the log), transactions and their
//! markers, expirations, other partitions' truncations, removals and
//! moves, store-wide truncations, snapshots and reopens.

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::store_util::{dir, sim_opts};
use producer_state::fs::{DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, SimFs, WriteFile};
use producer_state::{
    AppendOptions, Batch, FsyncPolicy, ManualClock, Marker, Origin, ProducerId, ProducerStateStore,
    Semantics, StoreOptions, UnknownProducer,
};
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};

const DAY: i64 = 86_400_000;
const PARTITIONS: i32 = 4;
const PRODUCERS: u64 = 3;

/// proptest's deterministic generator, seeded by a number.
struct Rng(TestRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Rng(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }
}

fn producer(k: u64) -> ProducerId {
    if k == 2 {
        ProducerId::named("producer two")
    } else {
        ProducerId::numeric(k)
    }
}

/// The two stores of one history: `skim` reads a partition's records
/// alone where it can, `walk` always reads the log.
struct Pair {
    kafka: bool,
    /// Single-sequence appends are made too (they are not placed).
    singles: bool,
    policy: FsyncPolicy,
    /// Automatic snapshots every this many records.
    snapshot_every: Option<u64>,
    /// `UnknownProducer::AcceptAny`: a key without state may start above
    /// sequence 0, and the log holds a record that takes no position
    /// before that append.
    accept_any: bool,
    clock: Arc<ManualClock>,
    fs: (SimFs, SimFs),
    skim: Option<ProducerStateStore>,
    walk: Option<ProducerStateStore>,
    /// Each partition's next batch offset.
    offsets: Vec<i64>,
    partition_truncations: u64,
    /// Batches accepted, and keys expired.
    accepted: u64,
    expired: u64,
    /// Truncations each store read its records alone in, before its last
    /// reopen (a store counts from its open).
    skimmed: (u64, u64),
}

impl Pair {
    /// Two stores of the semantics `kafka` under `policy`, with
    /// snapshots every `snapshot_every` records, open; no single appends
    /// and no accept-any unless set (and the stores opened again) before
    /// the first step.
    fn new(kafka: bool, policy: FsyncPolicy, snapshot_every: Option<u64>) -> Pair {
        let mut pair = Pair {
            kafka,
            singles: false,
            accept_any: false,
            policy,
            snapshot_every,
            clock: Arc::new(ManualClock::new(DAY)),
            fs: (SimFs::new(), SimFs::new()),
            skim: None,
            walk: None,
            offsets: vec![0; PARTITIONS as usize],
            partition_truncations: 0,
            accepted: 0,
            expired: 0,
            skimmed: (0, 0),
        };
        pair.open();
        pair
    }

    fn opts(&self, fs: &SimFs) -> StoreOptions {
        let semantics = if self.kafka {
            Semantics::Kafka
        } else {
            Semantics::Strict
        };
        // The semantics first: choosing Kafka's turns expiration off.
        sim_opts(fs)
            .semantics(semantics)
            .fsync(self.policy)
            .clock(self.clock.clone())
            .producer_expiration(Some(Duration::from_millis(DAY as u64)))
            .snapshot_every_records(self.snapshot_every)
            .unknown_producer(if self.accept_any {
                UnknownProducer::AcceptAny
            } else {
                UnknownProducer::RequireZero
            })
    }

    fn open(&mut self) {
        if let (Some(a), Some(b)) = (&self.skim, &self.walk) {
            self.skimmed.0 += a.stats().skimmed_truncations;
            self.skimmed.1 += b.stats().skimmed_truncations;
        }
        self.skim = None;
        self.walk = None;
        self.skim = Some(ProducerStateStore::open_with(dir(), self.opts(&self.fs.0)).unwrap());
        let walk = self.opts(&self.fs.1).read_the_log_to_truncate_for_tests();
        self.walk = Some(ProducerStateStore::open_with(dir(), walk).unwrap());
    }

    fn both(&self) -> [&ProducerStateStore; 2] {
        [self.skim.as_ref().unwrap(), self.walk.as_ref().unwrap()]
    }

    /// Runs `f` on both stores; their answers must be the same.
    fn each<R: std::fmt::Debug + PartialEq>(
        &self,
        what: &str,
        f: impl Fn(&ProducerStateStore) -> R,
    ) -> R {
        let [a, b] = self.both();
        let (x, y) = (f(a), f(b));
        assert_eq!(x, y, "{what}: the stores answer differently");
        x
    }

    /// The next sequence and epoch of producer `k` on partition `p`.
    fn next(&self, k: u64, p: i32) -> (i32, i16) {
        let a = self.skim.as_ref().unwrap();
        a.producers(p)
            .into_iter()
            .find(|i| i.producer_id == producer(k))
            .map_or((0, 0), |i| {
                (i.entry.last_sequence().wrapping_add(1), i.entry.epoch())
            })
    }

    fn step(&mut self, rng: &mut Rng) -> String {
        let p = rng.below(PARTITIONS as u64) as i32;
        let k = rng.below(PRODUCERS);
        match rng.below(100) {
            0..=59 => {
                let (mut seq, epoch) = self.next(k, p);
                if seq == 0 && self.accept_any && rng.below(2) == 0 {
                    // A producer the store does not know, at sequence 5.
                    seq = 5;
                }
                let n = rng.below(3) as i32;
                let offset = self.offsets[p as usize];
                self.offsets[p as usize] += i64::from(n) + 1;
                let now = producer_state::Clock::now_ms(&*self.clock);
                let opts = if self.kafka && k == 1 {
                    AppendOptions::client().transactional().verified()
                } else {
                    AppendOptions::client()
                };
                let b = Batch::new(seq, seq + n, offset, now);
                let kafka = self.kafka;
                let r = self.each("batch", |s| {
                    let r = if kafka {
                        s.append_with(producer(k), p, epoch, b, opts)
                    } else {
                        s.append_batch(producer(k), p, epoch, b)
                    };
                    r.map(|o| o.is_accepted()).map_err(|e| e.to_string())
                });
                self.accepted += u64::from(r == Ok(true));
                format!("batch {k} {p} {seq}+{n} at {offset}: {r:?}")
            }
            60..=64 if !self.kafka && self.singles => {
                let (seq, epoch) = self.next(k, p);
                let r = self.each("single", |s| {
                    s.append(producer(k), p, epoch, seq)
                        .map(|o| format!("{o:?}"))
                        .map_err(|e| e.to_string())
                });
                format!("single {k} {p} {seq}: {r:?}")
            }
            60..=64 => {
                let (_, epoch) = self.next(k, p);
                let offset = self.offsets[p as usize];
                self.offsets[p as usize] += 1;
                let now = producer_state::Clock::now_ms(&*self.clock);
                let m = if rng.below(2) == 0 {
                    Marker::commit(1, offset, now)
                } else {
                    Marker::abort(1, offset, now)
                };
                let r = self.each("marker", |s| {
                    s.append_marker(producer(k), p, epoch, m, Origin::Coordinator)
                        .map(|o| format!("{o:?}"))
                        .map_err(|e| e.to_string())
                });
                format!("marker {k} {p}: {r:?}")
            }
            65..=69 => {
                self.clock.advance(Duration::from_millis(DAY as u64 / 3));
                let r = self.each("expire", |s| s.expire_now().map_err(|e| e.to_string()));
                self.expired += r.clone().unwrap_or(0) as u64;
                format!("expire: {r:?}")
            }
            70..=84 => {
                let end = self.each("end", |s| s.partition_end_offset(p));
                let back = rng.below(12) as i64;
                self.partition_truncations += 1;
                let r = self.each("truncate partition", |s| {
                    s.truncate_partition_to(p, end - back)
                        .map_err(|e| e.to_string())
                });
                format!("truncate partition {p} to {}: {r:?}", end - back)
            }
            85..=86 => {
                let end = self.each("end", |s| s.end_offset());
                let back = rng.below(6) as i64;
                let r = self.each("truncate", |s| {
                    s.truncate_to(end - back).map_err(|e| e.to_string())
                });
                format!("truncate to {}: {r:?}", end - back)
            }
            87..=88 => {
                let r = self.each("remove", |s| {
                    s.remove_partition(p).map_err(|e| e.to_string())
                });
                format!("remove {p}: {r:?}")
            }
            89..=91 => {
                let r = self.each("move", |s| {
                    let e = s.export_partition(p).map_err(|e| e.to_string())?;
                    s.remove_partition(p).map_err(|e| e.to_string())?;
                    s.import_partition(&e).map_err(|e| e.to_string())
                });
                format!("move {p}: {r:?}")
            }
            92..=95 => {
                for s in self.both() {
                    s.snapshot().unwrap();
                }
                "snapshot".into()
            }
            _ => {
                self.open();
                "reopen".into()
            }
        }
    }

    /// Both stores hold the same state.
    fn same(&self, history: &[String]) {
        for p in 0..PARTITIONS {
            let what = || {
                format!(
                    "partition {p} after {:?}",
                    &history[history.len().saturating_sub(8)..]
                )
            };
            self.each(&what(), |s| s.producers(p));
            self.each(&what(), |s| s.partition_end_offset(p));
            if self.kafka {
                self.each(&what(), |s| s.kafka_producers(p));
                self.each(&what(), |s| s.aborted_transactions(p));
                self.each(&what(), |s| s.first_unstable_offset(p));
            }
        }
    }
}

/// One history of `steps` steps drawn from `seed`: the truncations of
/// a partition that read its records alone, all of them, and the keys
/// expired.
fn run(kafka: bool, seed: u64, steps: usize) -> (u64, u64, u64) {
    // Group commits of one record or two (every append waits for its
    // fsync), or of 64 KiB.
    let policy = if seed.is_multiple_of(2) {
        FsyncPolicy::Always
    } else {
        FsyncPolicy::Never
    };
    let mut pair = Pair::new(kafka, policy, Some(97));
    pair.singles = seed.is_multiple_of(4);
    pair.accept_any = seed.is_multiple_of(3);
    // The unknown-producer policy is the stores' option: open them again.
    pair.open();
    let mut rng = Rng::new(seed);
    let mut history = Vec::new();
    for _ in 0..steps {
        history.push(pair.step(&mut rng));
        pair.same(&history);
    }
    pair.open();
    assert_eq!(pair.skimmed.1, 0, "the store that reads the log skimmed");
    (pair.skimmed.0, pair.partition_truncations, pair.expired)
}

#[test]
fn reading_a_partitions_records_alone_gets_what_reading_the_log_gets() {
    for kafka in [false, true] {
        let (mut skimmed, mut truncations, mut expired) = (0, 0, 0);
        for seed in 1..=12u64 {
            let (s, t, e) = run(kafka, seed, 400);
            skimmed += s;
            truncations += t;
            expired += e;
        }
        // Expirations log removals that touch partitions among the
        // others' records, in both semantics.
        assert!(expired > 0, "kafka {kafka}: no key expired");
        // Most partition truncations read their records alone: those
        // refused (below the history kept), those from a base older than
        // where a reopen began to place records, and those whose range
        // holds a single-sequence append do not.
        assert!(
            skimmed * 3 >= truncations,
            "kafka {kafka}: {skimmed} of {truncations} partition truncations read their records alone"
        );
        eprintln!("kafka {kafka}: {skimmed} of {truncations} skimmed, {expired} expired");
    }
}

/// A file system that, once armed, fails the first opening of a log
/// segment for reading (`every`: each one), and is `SimFs` otherwise.
#[derive(Debug)]
struct FailingOpen {
    inner: SimFs,
    armed: AtomicBool,
    every: bool,
    failed: AtomicU64,
}

impl FileSystem for FailingOpen {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        self.inner.kind(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.list(dir)
    }
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let segment = path.extension().is_some_and(|e| e == "wal");
        if segment
            && self.armed.load(Ordering::SeqCst)
            && (self.every || self.failed.load(Ordering::SeqCst) == 0)
        {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::other("the open this test fails"));
        }
        self.inner.open_read(path)
    }
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        self.inner.create_new(path)
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        self.inner.open_append(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.inner.try_lock(path)
    }
}

/// A store of batches on partitions 0 and 1, interleaved, with a snapshot
/// after the first half, on `fs`; `walk` makes it read the log.
fn interleaved(fs: Arc<dyn FileSystem>, walk: bool) -> ProducerStateStore {
    let mut o = sim_opts(&SimFs::new())
        .file_system(fs)
        .snapshot_every_records(None);
    if walk {
        o = o.read_the_log_to_truncate_for_tests();
    }
    let s = ProducerStateStore::open_with(dir(), o).unwrap();
    for i in 0..60 {
        if i == 30 {
            s.snapshot().unwrap();
        }
        for p in 0..2 {
            let b = Batch::new(i, i, i64::from(i), 1_000);
            assert!(s.append_batch(7u64, p, 0, b).unwrap().is_accepted());
        }
    }
    s
}

/// A failed read where a partition's records were placed does not fail
/// the truncation: it reads the log instead, and gets what reading the
/// log gets. When the log cannot be read either, the truncation fails
/// and changes nothing.
#[test]
fn a_failed_read_of_the_placed_records_reads_the_log_instead() {
    let walk = interleaved(Arc::new(SimFs::new()), true);
    walk.truncate_partition_to(0, 45).unwrap();
    for every in [false, true] {
        let fs = Arc::new(FailingOpen {
            inner: SimFs::new(),
            armed: AtomicBool::new(false),
            every,
            failed: AtomicU64::new(0),
        });
        let s = interleaved(fs.clone(), false);
        let before = (s.producers(0), s.producers(1));
        fs.armed.store(true, Ordering::SeqCst);
        match (every, s.truncate_partition_to(0, 45)) {
            (false, Ok(())) => {
                assert_eq!(fs.failed.load(Ordering::SeqCst), 1);
                assert_eq!(s.stats().skimmed_truncations, 0);
                assert_eq!(s.producers(0), walk.producers(0));
                assert_eq!(s.producers(1), walk.producers(1));
            }
            (true, Err(e)) => {
                assert!(e.to_string().contains("the open this test fails"), "{e}");
                assert_eq!((s.producers(0), s.producers(1)), before);
            }
            (every, r) => panic!("failing every open {every}: {r:?}"),
        }
    }
    // Unarmed, it reads the records where they were placed.
    let s = interleaved(Arc::new(SimFs::new()), false);
    s.truncate_partition_to(0, 45).unwrap();
    assert_eq!(s.stats().skimmed_truncations, 1);
    assert_eq!(s.producers(0), walk.producers(0));
}

/// A partition whose appends fill many runs of the bookkeeping (256
/// each), cut at many points after a record that touches it at the log's
/// end (its own first truncation, a group of its partition): the replay
/// reads to the end, and the runs wholly at or above the cut are left out.
/// Both semantics, fresh and after a reopen; the store that reads the log
/// agrees every time.
#[test]
fn runs_above_the_cut_are_left_out_and_nothing_changes() {
    for (kafka, reopen) in [(false, false), (false, true), (true, false), (true, true)] {
        // No snapshot: every cut's base is the log's start.
        let mut pair = Pair::new(kafka, FsyncPolicy::Never, None);
        // Partitions 0 and 1 interleave, 1,500 batches each.
        for seq in 0..1_500 {
            for p in 0..2 {
                let b = Batch::new(seq, seq, i64::from(seq), DAY);
                let ok = pair.each("batch", |s| {
                    s.append_batch(producer(1), p, 0, b)
                        .map(|o| o.is_accepted())
                        .map_err(|e| e.to_string())
                });
                assert_eq!(ok, Ok(true));
            }
        }
        let first = pair.each("truncate", |s| {
            s.truncate_partition_to(0, 1_490).map_err(|e| e.to_string())
        });
        assert_eq!(first, Ok(()));
        if reopen {
            pair.open();
        }
        // 768: a run boundary (runs of 256 appends, offsets from 0).
        for cut in [1_400, 900, 768, 300, 20] {
            let r = pair.each("truncate", |s| {
                s.truncate_partition_to(0, cut).map_err(|e| e.to_string())
            });
            assert_eq!(r, Ok(()), "cut at {cut}, reopen {reopen}");
            pair.same(&[format!("cut at {cut}, reopen {reopen}")]);
        }
        pair.open();
        assert!(
            pair.skimmed.0 >= 4,
            "kafka {kafka}, reopen {reopen}: {} read their records alone",
            pair.skimmed.0
        );
        assert_eq!(pair.skimmed.1, 0);
    }
}
