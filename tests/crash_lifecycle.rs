//! Crash safety of the producer lifecycle, under the simulated file system
//! that keeps written and durable bytes apart: a workload of appends,
//! expiration sweeps, evictions at a cap, partition removals and
//! truncations is crashed at every one of its IO operations, and every
//! crash image (unsynced bytes dropped, kept, torn, lost by sector) must
//! recover to exactly what was acknowledged, plus at most what the
//! operation in flight may have left: for an append, its eviction alone or
//! all of it; for a sweep, any of the keys it was removing (it logs one
//! record per shard); for a partition removal, a truncation or an import
//! (one atomic group each), all of it or nothing (a partition moved out
//! and back in is two groups).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::model::{Key, Model, ModelConfig};
use common::store_util::{diff, dir, matches, sim_opts};
use producer_state::fs::{Fault, SimFs, Unsynced};
use producer_state::{
    AppendRequest, Batch, Clock, ManualClock, ProducerStateStore, StoreOptions, StoreStats,
};

const CAP: usize = 10;
const EXPIRATION_MS: i64 = 1_000;

/// One operation of the workload.
#[derive(Clone, Debug)]
enum LOp {
    Append(AppendRequest),
    Tick(u64),
    Expire,
    RemovePartition(i32),
    /// Truncate this far below the end.
    Truncate(i64),
    /// Export a partition, remove it and import it back.
    Move(i32),
}

fn config() -> ModelConfig {
    ModelConfig {
        cap: Some(CAP),
        expiration_ms: Some(EXPIRATION_MS),
        ..ModelConfig::default()
    }
}

fn opts(fs: &SimFs, clock: &ManualClock) -> StoreOptions {
    sim_opts(fs)
        .clock(Arc::new(clock.clone()))
        .producer_expiration(Some(Duration::from_millis(EXPIRATION_MS as u64)))
        .max_producers(Some(CAP))
        .snapshot_every_records(Some(120))
}

/// A deterministic workload over 16 keys in 4 partitions (more keys than
/// the cap: new keys evict), the clock moving so that keys expire.
fn workload(n: usize) -> Vec<LOp> {
    let mut model = Model {
        config: config(),
        ..Model::default()
    };
    let mut out = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut now = 1_700_000_000_000i64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let op = match x % 100 {
            0..6 => LOp::Tick(400 + x % 1000),
            6..9 => LOp::Expire,
            9..11 => LOp::RemovePartition(((x >> 8) % 4) as i32),
            11..14 => LOp::Truncate(((x >> 8) % 12) as i64),
            14..16 => LOp::Move(((x >> 8) % 4) as i32),
            _ => {
                let k = (x >> 8) % 16;
                let p = (k % 4) as i32;
                let next = model.entry(&(k.into(), p)).map_or(0, |e| e.last + 1);
                LOp::Append(if (x >> 20).is_multiple_of(2) {
                    AppendRequest::single(k, p, 0, next)
                } else {
                    AppendRequest::batch(k, p, 0, Batch::new(next, next + 1, i as i64, now))
                })
            }
        };
        match &op {
            LOp::Append(r) => {
                model.append_at(r, now);
            }
            LOp::Tick(ms) => now += *ms as i64,
            LOp::Expire => {
                model.expire(now);
            }
            LOp::RemovePartition(p) => {
                model.remove_partition(*p);
            }
            LOp::Truncate(back) => {
                let _ = model.truncate(model.high + 1 - back);
            }
            LOp::Move(_) => {}
        }
        out.push(op);
    }
    out
}

/// Runs the workload until the first error: the model of what was
/// acknowledged, and the states the operation in flight may have left
/// (exact states, and a sweep's partial removal).
struct Outcome {
    acked: Model,
    exact: Vec<Model>,
    sweep: Option<(Model, Vec<Key>)>,
    failed: bool,
    /// The store's counters, if the run completed.
    stats: Option<StoreStats>,
}

fn run(fs: &SimFs, ops: &[LOp]) -> Outcome {
    let clock = ManualClock::new(1_700_000_000_000);
    let mut acked = Model {
        config: config(),
        ..Model::default()
    };
    let mut out = Outcome {
        acked: acked.clone(),
        exact: Vec::new(),
        sweep: None,
        failed: false,
        stats: None,
    };
    let Ok(store) = ProducerStateStore::open_with(dir(), opts(fs, &clock)) else {
        out.failed = true;
        return out;
    };
    for op in ops {
        let now = clock.now_ms();
        acked.next_pos = store.next_position();
        let mut after = acked.clone();
        let result = match op {
            LOp::Append(r) => {
                let (want, trace) = after.append_all_trace(std::slice::from_ref(r), now, true);
                out.exact = trace.into_iter().flatten().collect();
                store.append_request(r).map(|got| {
                    assert_eq!(Ok(got), want[0], "{r:?}");
                })
            }
            LOp::Tick(ms) => {
                clock.advance(Duration::from_millis(*ms));
                Ok(())
            }
            LOp::Expire => {
                let n = after.expire(now);
                let removed: Vec<Key> = acked
                    .keys
                    .keys()
                    .filter(|k| !after.keys.contains_key(*k))
                    .cloned()
                    .collect();
                out.sweep = Some((acked.clone(), removed));
                store.expire_now().map(|got| assert_eq!(got, n))
            }
            LOp::RemovePartition(p) => {
                let n = after.remove_partition(*p);
                out.exact = vec![after.clone()];
                store.remove_partition(*p).map(|got| assert_eq!(got, n))
            }
            LOp::Move(p) => {
                let mine: Vec<_> = acked
                    .keys
                    .iter()
                    .filter(|((_, kp), _)| kp == p)
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect();
                after.remove_partition(*p);
                let removed = after.clone();
                after.import(mine);
                out.exact = vec![removed, after.clone()];
                store.export_partition(*p).and_then(|e| {
                    store.remove_partition(*p)?;
                    store.import_partition(&e).map(|n| assert_eq!(n, e.len()))
                })
            }
            LOp::Truncate(back) => {
                let offset = acked.high + 1 - back;
                after.truncate(offset).expect("within the end");
                out.exact = vec![after.clone()];
                match store.truncate_to(offset) {
                    // Not reached by a retained snapshot: nothing changed.
                    Err(producer_state::Error::TruncateBelowHistory { .. }) => {
                        after = acked.clone();
                        Ok(())
                    }
                    other => other,
                }
            }
        };
        if result.is_err() {
            out.acked = acked;
            out.failed = true;
            return out;
        }
        acked = after;
        out.exact.clear();
        out.sweep = None;
    }
    out.acked = acked;
    out.stats = Some(store.stats());
    out
}

/// Whether the recovered store holds a state the run may have left.
fn allowed(store: &ProducerStateStore, o: &Outcome) -> bool {
    if matches(store, &o.acked) || o.exact.iter().any(|m| matches(store, m)) {
        return true;
    }
    let Some((before, removed)) = &o.sweep else {
        return false;
    };
    let mut m = before.clone();
    for k in removed {
        if store.get(k.0.clone(), k.1).is_none() {
            m.keys.remove(k);
        }
    }
    matches(store, &m)
}

#[test]
fn a_crash_at_every_io_operation_of_the_lifecycle_loses_nothing_acknowledged() {
    let ops = workload(400);
    let full = SimFs::new();
    let o = run(&full, &ops);
    assert!(!o.failed);
    let total = full.ops();
    // The workload does what it is meant to: it evicts, expires and
    // removes partitions, and takes snapshots.
    {
        let clock = ManualClock::new(0);
        let img = full.crash_image(Unsynced::Drop);
        let s = ProducerStateStore::open_with(dir(), opts(&img, &clock)).unwrap();
        assert!(matches(&s, &o.acked), "{}", diff(&s, &o.acked));
    }
    let kinds = |f: &dyn Fn(&LOp) -> bool| ops.iter().filter(|o| f(o)).count();
    assert!(kinds(&|o| matches!(o, LOp::Expire)) > 5);
    assert!(kinds(&|o| matches!(o, LOp::RemovePartition(_))) > 3);
    assert!(kinds(&|o| matches!(o, LOp::Truncate(_))) > 5);
    assert!(kinds(&|o| matches!(o, LOp::Move(_))) > 3);
    let stats = o.stats.expect("completed");
    assert!(
        stats.evicted > 20
            && stats.expired > 10
            && stats.partition_removed > 5
            && stats.truncations > 5
            && stats.truncated_keys > 5
            && stats.imported > 3,
        "{stats:?}"
    );
    assert!(total > 800, "{total} operations");

    for n in 0..total {
        let fs = SimFs::new();
        fs.set_fault(n, Fault::Crash);
        let o = run(&fs, &ops);
        assert!(fs.crashed(), "operation {n} was reached");
        for mode in [
            Unsynced::Drop,
            Unsynced::Keep,
            Unsynced::TornPrefix(n),
            Unsynced::Sectors(n),
        ] {
            let img = fs.crash_image(mode);
            let clock = ManualClock::new(i64::MAX / 2);
            let store =
                ProducerStateStore::open_with(dir(), opts(&img, &clock)).unwrap_or_else(|e| {
                    panic!("crash at operation {n}, {mode:?}: recovery failed: {e}")
                });
            assert!(
                allowed(&store, &o),
                "crash at operation {n}, {mode:?}: {}",
                diff(&store, &o.acked)
            );
        }
    }
}
