//! Resident memory per key at 1M keys, each figure measured in a fresh
//! child process (RSS after building the map minus RSS before), so one
//! measurement's freed memory cannot hide another's.
//!
//! Run: `cargo bench -p producer-state-bench --bench memory`.

use std::collections::HashMap;
use std::hint::black_box;
use std::process::Command;

use producer_state::{Batch, ProducerStateManager};
use rustc_hash::FxBuildHasher;

const KEYS: u64 = 1_000_000;

fn rss_bytes() -> u64 {
    let status =
        std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux only)");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line");
    kb * 1024
}

fn child(which: &str) {
    let names: Vec<String> = if which.contains("named") {
        (0..KEYS).map(|k| format!("producer-{k:07}")).collect()
    } else {
        Vec::new()
    };
    let before = rss_bytes();
    match which {
        "bare_map" => {
            let mut m: HashMap<(u64, u32), (u16, u32), FxBuildHasher> = HashMap::default();
            for k in 0..KEYS {
                m.insert((k, (k % 16) as u32), (0, 0));
            }
            report(which, before, black_box(&m).len());
        }
        "engine_single" => {
            let mut m = ProducerStateManager::new();
            for k in 0..KEYS {
                m.append(k, (k % 16) as i32, 0, 0);
                m.append(k, (k % 16) as i32, 0, 1);
            }
            report(which, before, black_box(&m).len());
        }
        "engine_window_full" => {
            let mut m = ProducerStateManager::new();
            for k in 0..KEYS {
                for b in 0..6 {
                    let batch =
                        Batch::new(b * 10, b * 10 + 9, i64::from(b) * 100, 1_700_000_000_000);
                    m.append_batch(k, (k % 16) as i32, 0, batch);
                }
            }
            assert!(
                m.iter()
                    .take(100)
                    .all(|(_, _, e)| e.retained_batches().len() == 5)
            );
            report(which, before, black_box(&m).len());
        }
        "engine_named_single" => {
            let before = rss_bytes();
            let mut m = ProducerStateManager::new();
            for n in &names {
                m.append(n.as_str(), 0, 0, 0);
            }
            report(which, before, black_box(&m).len());
        }
        other => panic!("unknown measurement {other}"),
    }
}

fn report(which: &str, before: u64, len: usize) {
    let after = rss_bytes();
    assert_eq!(len as u64, KEYS);
    println!("{which} {:.1}", (after - before) as f64 / KEYS as f64);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(&args[i + 1]);
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    let measure = |which: &str| -> f64 {
        let out = Command::new(&exe)
            .args(["--child", which])
            .output()
            .expect("spawn child");
        assert!(
            out.status.success(),
            "{which}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("child output")
    };
    println!("\nresident bytes per key at {KEYS} keys (RSS delta, fresh process each)\n");
    println!("| structure | bytes/key | goal |");
    println!("|---|---:|---:|");
    let bare = measure("bare_map");
    println!("| bare HashMap<(u64, u32), (u16, u32)>, FxHash | {bare:.1} | (baseline) |");
    let single = measure("engine_single");
    println!("| engine, numeric ids, single-sequence appends only | {single:.1} | <= 56 |");
    let full = measure("engine_window_full");
    println!("| engine, numeric ids, full 5-batch window | {full:.1} | <= 160 |");
    let named = measure("engine_named_single");
    println!("| engine, 15-byte names, single-sequence appends | {named:.1} | - |");
    println!("\nengine single / bare map: {:.2}x", single / bare);
}
