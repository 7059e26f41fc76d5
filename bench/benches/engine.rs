//! Engine throughput against a bare map doing the same four rules.
//!
//! Every workload runs twice in the same process: through
//! `ProducerStateManager` and through the baseline the engine's goals are
//! stated against, a bare
//! `HashMap<(u64, u32), (u16, u32)>` with FxHash applying the four rules and
//! nothing else (no retry window). String-id workloads also run against the
//! same bare map keyed by `(String, u32)`, looked up by `&str` without
//! allocating, which is the fair baseline for names. After criterion has
//! run, the report at the end reads criterion's medians back and prints
//! each engine figure as a ratio of its baseline from this run.
//!
//! Each measured iteration is one pass of a pre-generated stream of appends
//! over a fresh copy of a pre-warmed map, so generating the stream and
//! copying the map are not timed.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, SamplingMode, Throughput};
use producer_state::{AppendOutcome, Batch, ProducerStateManager, Semantics};
use rustc_hash::FxBuildHasher;

const OPS: usize = 1_000_000;

#[derive(Clone, Copy)]
struct Op {
    key: u32,
    epoch: i16,
    seq: i32,
}

struct Workload {
    name: &'static str,
    keys: u32,
    /// Initial (epoch, last sequence) of every key.
    start_epoch: i16,
    ops: Vec<Op>,
}

/// A small deterministic generator (splitmix64), so both sides see the same stream.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

/// In-order appends to random keys (all accepted), or the realistic mix:
/// ~90% in-order, 5% duplicates, 3% gaps, 2% fenced.
fn workload(name: &'static str, keys: u32, mix: bool, seed: u64) -> Workload {
    let mut rng = Rng(seed);
    let start_epoch = 1;
    let mut last = vec![0i32; keys as usize];
    let ops = (0..OPS)
        .map(|_| {
            let key = rng.below(keys);
            let l = &mut last[key as usize];
            let roll = if mix { rng.below(100) } else { 0 };
            match roll {
                0..90 => {
                    *l += 1;
                    Op {
                        key,
                        epoch: start_epoch,
                        seq: *l,
                    }
                }
                90..95 => Op {
                    key,
                    epoch: start_epoch,
                    seq: *l - rng.below(2) as i32,
                },
                95..98 => Op {
                    key,
                    epoch: start_epoch,
                    seq: *l + 2 + rng.below(5) as i32,
                },
                _ => Op {
                    key,
                    epoch: start_epoch - 1,
                    seq: *l + 1,
                },
            }
        })
        .collect();
    Workload {
        name,
        keys,
        start_epoch,
        ops,
    }
}

fn name(key: u32) -> String {
    format!("producer-{key:07}")
}

type Bare = HashMap<(u64, u32), (u16, u32), FxBuildHasher>;

/// The four rules over a bare map: the baseline.
#[inline]
fn bare_append(map: &mut Bare, pid: u64, partition: u32, epoch: u16, seq: u32) -> AppendOutcome {
    match map.entry((pid, partition)) {
        std::collections::hash_map::Entry::Occupied(mut e) => bare_rules(e.get_mut(), epoch, seq),
        std::collections::hash_map::Entry::Vacant(v) => {
            if seq == 0 {
                v.insert((epoch, 0));
                AppendOutcome::Accepted
            } else {
                AppendOutcome::OutOfOrder
            }
        }
    }
}

#[inline]
fn bare_rules(st: &mut (u16, u32), epoch: u16, seq: u32) -> AppendOutcome {
    let (e, last) = *st;
    if epoch < e {
        AppendOutcome::FencedEpoch
    } else if epoch > e {
        if seq == 0 {
            *st = (epoch, 0);
            AppendOutcome::Accepted
        } else {
            AppendOutcome::OutOfOrder
        }
    } else if seq == if last == i32::MAX as u32 { 0 } else { last + 1 } {
        st.1 = seq;
        AppendOutcome::Accepted
    } else if seq <= last {
        AppendOutcome::Duplicate
    } else {
        AppendOutcome::OutOfOrder
    }
}

/// The bare map with the same retry window the engine keeps, stored inline
/// in the map's value: what one would write by hand for batch appends. The
/// fair baseline for `engine_numeric_batch`.
#[derive(Clone, Copy)]
struct BareWindow {
    epoch: u16,
    last: u32,
    len: u8,
    batches: [(u32, u32, i64, i64); 5],
}
type BareWindowed = HashMap<(u64, u32), BareWindow, FxBuildHasher>;

#[inline]
fn bare_windowed_append(map: &mut BareWindowed, pid: u64, epoch: u16, b: Batch) -> AppendOutcome {
    let (first, last) = (b.first_sequence as u32, b.last_sequence as u32);
    let push = |w: &mut BareWindow| {
        if w.len == 5 {
            w.batches.copy_within(1.., 0);
            w.len = 4;
        }
        w.batches[w.len as usize] = (first, last, b.offset, b.timestamp);
        w.len += 1;
        w.last = last;
    };
    match map.entry((pid, 0)) {
        std::collections::hash_map::Entry::Occupied(mut e) => {
            let w = e.get_mut();
            if epoch < w.epoch {
                AppendOutcome::FencedEpoch
            } else if epoch > w.epoch {
                if first == 0 {
                    w.epoch = epoch;
                    w.len = 0;
                    push(w);
                    AppendOutcome::Accepted
                } else {
                    AppendOutcome::OutOfOrder
                }
            } else if first
                == if w.last == i32::MAX as u32 {
                    0
                } else {
                    w.last + 1
                }
            {
                push(w);
                AppendOutcome::Accepted
            } else if w.batches[..w.len as usize]
                .iter()
                .any(|x| x.0 == first && x.1 == last)
            {
                AppendOutcome::Duplicate
            } else if first <= w.last {
                if first == last {
                    AppendOutcome::Duplicate
                } else {
                    AppendOutcome::OutOfOrder
                }
            } else {
                AppendOutcome::OutOfOrder
            }
        }
        std::collections::hash_map::Entry::Vacant(v) => {
            if first == 0 {
                let mut w = BareWindow {
                    epoch,
                    last,
                    len: 0,
                    batches: [(0, 0, 0, 0); 5],
                };
                push(&mut w);
                v.insert(w);
                AppendOutcome::Accepted
            } else {
                AppendOutcome::OutOfOrder
            }
        }
    }
}

/// The bare map keyed by names, looked up by `&str` without allocating.
type BareNamed = hashbrown::HashMap<(String, u32), (u16, u32), FxBuildHasher>;

#[derive(Hash)]
struct NameRef<'a>(&'a str, u32);
impl hashbrown::Equivalent<(String, u32)> for NameRef<'_> {
    fn equivalent(&self, k: &(String, u32)) -> bool {
        k.0 == self.0 && k.1 == self.1
    }
}

#[inline]
fn bare_named_append(
    map: &mut BareNamed,
    name: &str,
    partition: u32,
    epoch: u16,
    seq: u32,
) -> AppendOutcome {
    let probe = NameRef(name, partition);
    debug_assert_eq!(
        map.hasher().hash_one(&probe),
        map.hasher().hash_one((name.to_string(), partition))
    );
    match map.get_mut(&probe) {
        Some(st) => bare_rules(st, epoch, seq),
        None if seq == 0 => {
            map.insert((name.to_string(), partition), (epoch, 0));
            AppendOutcome::Accepted
        }
        None => AppendOutcome::OutOfOrder,
    }
}

fn count(o: AppendOutcome, n: &mut usize) {
    *n += (o == AppendOutcome::Accepted) as usize;
}

/// One contender: a pre-warmed state and the loop that runs a pass over it.
struct Contender {
    name: &'static str,
    run: Box<dyn Fn() -> std::time::Duration>,
    bench: Box<dyn FnMut(&mut criterion::Bencher)>,
}

/// Wraps a pre-warmed state `S` and a pass over the stream into both a
/// criterion routine and a one-shot timed pass (setup untimed).
fn contender<S: Clone + 'static>(
    name: &'static str,
    state: S,
    pass: impl Fn(&mut S) -> usize + Clone + 'static,
) -> Contender {
    let (s1, p1) = (state.clone(), pass.clone());
    Contender {
        name,
        run: Box::new(move || {
            let mut m = s1.clone();
            let t = std::time::Instant::now();
            black_box(p1(&mut m));
            let d = t.elapsed();
            drop(black_box(m));
            d
        }),
        bench: Box::new(move |b| {
            b.iter_batched(
                || state.clone(),
                |mut m| {
                    let n = pass(&mut m);
                    black_box((n, m))
                },
                BatchSize::LargeInput,
            )
        }),
    }
}

fn contenders(w: &Workload) -> Vec<Contender> {
    let names: std::rc::Rc<Vec<String>> = std::rc::Rc::new((0..w.keys).map(name).collect());
    let ops = std::rc::Rc::new(w.ops.clone());
    let epoch = w.start_epoch;

    let mut engine = ProducerStateManager::new();
    let mut engine_batch = ProducerStateManager::new();
    let mut engine_named = ProducerStateManager::new();
    let mut engine_kafka = ProducerStateManager::with_semantics(Semantics::Kafka);
    let mut bare = Bare::default();
    let mut bare_named = BareNamed::default();
    let mut bare_windowed = BareWindowed::default();
    for k in 0..w.keys {
        engine.append(u64::from(k), 0, epoch, 0);
        engine_batch.append_batch(u64::from(k), 0, epoch, Batch::new(0, 0, 0, 0));
        engine_named.append(names[k as usize].as_str(), 0, epoch, 0);
        engine_kafka.append_batch(u64::from(k), 0, epoch, Batch::new(0, 0, 0, 0));
        bare_append(&mut bare, u64::from(k), 0, epoch as u16, 0);
        bare_named_append(&mut bare_named, &names[k as usize], 0, epoch as u16, 0);
        bare_windowed_append(
            &mut bare_windowed,
            u64::from(k),
            epoch as u16,
            Batch::new(0, 0, 0, 0),
        );
    }

    // The same stream gives the same outcomes on every side.
    {
        let (mut e, mut eb, mut b, mut bw) = (
            engine.clone(),
            engine_batch.clone(),
            bare.clone(),
            bare_windowed.clone(),
        );
        for (i, op) in ops.iter().take(100_000).enumerate() {
            let x = e.append(u64::from(op.key), 0, op.epoch, op.seq);
            let y = bare_append(&mut b, u64::from(op.key), 0, op.epoch as u16, op.seq as u32);
            assert_eq!(x, y, "engine and baseline disagree");
            let batch = Batch::new(op.seq, op.seq, i as i64, 0);
            let x = eb
                .append_batch(u64::from(op.key), 0, op.epoch, batch)
                .outcome();
            let y = bare_windowed_append(&mut bw, u64::from(op.key), op.epoch as u16, batch);
            assert_eq!(x, y, "engine and windowed baseline disagree");
        }
    }

    let o = ops.clone();
    let bare_c = contender("bare_map", bare, move |m| {
        let mut n = 0;
        for op in o.iter() {
            count(
                bare_append(m, u64::from(op.key), 0, op.epoch as u16, op.seq as u32),
                &mut n,
            );
        }
        n
    });
    let o = ops.clone();
    let engine_c = contender("engine_numeric", engine, move |m| {
        let mut n = 0;
        for op in o.iter() {
            count(m.append(u64::from(op.key), 0, op.epoch, op.seq), &mut n);
        }
        n
    });
    let o = ops.clone();
    let batch_c = contender("engine_numeric_batch", engine_batch, move |m| {
        let mut n = 0;
        for (i, op) in o.iter().enumerate() {
            let batch = Batch::new(op.seq, op.seq, i as i64, 1_700_000_000_000 + i as i64);
            count(
                m.append_batch(u64::from(op.key), 0, op.epoch, batch)
                    .outcome(),
                &mut n,
            );
        }
        n
    });
    // Kafka's verdicts over the same stream: plain producers stay in the
    // compact map, but each append reads the entry and installs the next
    // (two probes where the strict path needs one).
    let o = ops.clone();
    let kafka_c = contender("engine_kafka_batch", engine_kafka, move |m| {
        let mut n = 0;
        for (i, op) in o.iter().enumerate() {
            let batch = Batch::new(op.seq, op.seq, i as i64, 1_700_000_000_000 + i as i64);
            count(
                m.append_batch(u64::from(op.key), 0, op.epoch, batch)
                    .outcome(),
                &mut n,
            );
        }
        n
    });
    let o = ops.clone();
    let bare_w_c = contender("bare_map_windowed", bare_windowed, move |m| {
        let mut n = 0;
        for (i, op) in o.iter().enumerate() {
            let batch = Batch::new(op.seq, op.seq, i as i64, 1_700_000_000_000 + i as i64);
            count(
                bare_windowed_append(m, u64::from(op.key), op.epoch as u16, batch),
                &mut n,
            );
        }
        n
    });
    let (o, nm) = (ops.clone(), names.clone());
    let bare_n_c = contender("bare_map_named", bare_named, move |m| {
        let mut n = 0;
        for op in o.iter() {
            count(
                bare_named_append(m, &nm[op.key as usize], 0, op.epoch as u16, op.seq as u32),
                &mut n,
            );
        }
        n
    });
    let (o, nm) = (ops, names);
    let named_c = contender("engine_named", engine_named, move |m| {
        let mut n = 0;
        for op in o.iter() {
            count(
                m.append(nm[op.key as usize].as_str(), 0, op.epoch, op.seq),
                &mut n,
            );
        }
        n
    });
    vec![
        bare_c, engine_c, bare_w_c, batch_c, kafka_c, bare_n_c, named_c,
    ]
}

/// (engine, baseline) pairs of the ratio table.
const PAIRS: [(&str, &str); 5] = [
    ("engine_numeric", "bare_map"),
    ("engine_named", "bare_map_named"),
    ("engine_numeric_batch", "bare_map_windowed"),
    ("engine_numeric_batch", "bare_map"),
    ("engine_kafka_batch", "engine_numeric_batch"),
];

/// Interleaved passes (engine, baseline, engine, ...), so that drift on a
/// shared machine hits both sides alike; medians of each side.
fn interleaved(cs: &[Contender], engine: &str, base: &str, rounds: usize) -> (f64, f64) {
    let find = |n: &str| cs.iter().find(|c| c.name == n).expect("contender");
    let (e, b) = (find(engine), find(base));
    let (mut te, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        te.push((e.run)().as_secs_f64());
        tb.push((b.run)().as_secs_f64());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(te), median(tb))
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let workloads = [
        workload("hot_1k", 1_000, false, 1),
        workload("random_1m", 1_000_000, false, 2),
        workload("mix_100k", 100_000, true, 3),
    ];
    let mut rows = Vec::new();
    for w in &workloads {
        let mut cs = contenders(w);
        let mut g = c.benchmark_group(w.name);
        g.throughput(Throughput::Elements(w.ops.len() as u64));
        g.sampling_mode(SamplingMode::Flat);
        g.sample_size(15);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(3));
        for ct in cs.iter_mut() {
            g.bench_function(ct.name, |b| (ct.bench)(b));
        }
        g.finish();
        for (engine, base) in PAIRS {
            let (e, b) = interleaved(&cs, engine, base, 15);
            rows.push((w.name, engine, base, e, b));
        }
    }
    c.final_summary();

    let mops = |secs: f64| OPS as f64 / secs / 1e6;
    println!(
        "\nengine report: 15 interleaved passes of {OPS} appends per side, medians; Mops/s = million appends per second\n"
    );
    println!("| workload | engine | Mops/s | baseline | Mops/s | ratio |");
    println!("|---|---|---:|---|---:|---:|");
    for (w, engine, base, e, b) in rows {
        println!(
            "| {w} | {engine} | {:.1} | {base} | {:.1} | {:.2}x |",
            mops(e),
            mops(b),
            b / e
        );
    }
}
