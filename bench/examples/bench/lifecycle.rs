//! The producer lifecycle's rows of the `bench` example:
//!
//! - churn: 10M distinct producer ids through a store capped at 1M keys,
//!   against the same store holding 1M keys (resident memory) and an
//!   uncapped store taking the same 10M (throughput); each measured in a
//!   fresh child process (RSS after minus RSS before), so one
//!   measurement's freed memory cannot hide another's;
//! - an expiration sweep that removes 1M keys: the longest pause an
//!   appender sees while it runs;
//! - `truncate_to` on a 1M-key store with a 10M-record log, against
//!   recovering the same store.
//!
//! Every timed figure is the median of three rounds.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use producer_state::{FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions};
use serde_json::{Value, json};

use super::{Result, append_rounds, build, median, ms, round2, while_appending};

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Appends one single-sequence append for each of `keys` (numeric ids
/// `first..first + keys`) in `append_all` calls of 10,000; returns the
/// seconds it took.
fn append_keys(store: &ProducerStateStore, first: u64, keys: u64) -> Result<f64> {
    let t = Instant::now();
    append_rounds(store, first..first + keys, 1)?;
    Ok(t.elapsed().as_secs_f64())
}

fn churn_opts(cap: Option<usize>) -> StoreOptions {
    StoreOptions::default()
        .fsync(FsyncPolicy::Never)
        .snapshot_every_records(None)
        .snapshot_every_bytes(None)
        .expiration_interval(None)
        .max_producers(cap)
}

/// A child process's measurement: `keys` distinct ids into a store capped
/// at `cap`; prints appends/s, the RSS the store added, and its keys.
/// With `step`, the store's clock is a manual one moved `step` ms per
/// `append_all` call instead of the wall clock (for profiling only).
pub fn churn_child(dir: &Path, keys: u64, cap: Option<usize>, step: Option<u64>) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let before = rss_bytes();
    let secs = match step {
        None => {
            let store = ProducerStateStore::open_with(dir, churn_opts(cap))?;
            let secs = append_keys(&store, 0, keys)?;
            (store, secs)
        }
        Some(step) => {
            let clock = ManualClock::new(1_700_000_000_000);
            let opts = churn_opts(cap).clock(Arc::new(clock.clone()));
            let store = ProducerStateStore::open_with(dir, opts)?;
            let t = Instant::now();
            let mut first = 0;
            while first < keys {
                let n = (keys - first).min(10_000);
                append_keys(&store, first, n)?;
                clock.advance(Duration::from_millis(step));
                first += n;
            }
            (store, t.elapsed().as_secs_f64())
        }
    };
    let (store, secs) = secs;
    let after = rss_bytes();
    println!(
        "{} {} {}",
        keys as f64 / secs,
        after.saturating_sub(before),
        store.len()
    );
    store.close()?;
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

/// Runs `churn_child` in a fresh process: (appends/s, RSS bytes, keys).
fn measure_child(dir: &Path, keys: u64, cap: Option<usize>) -> Result<(f64, f64, u64)> {
    let exe = std::env::current_exe()?;
    let mut args = vec![
        "--child".to_string(),
        "churn".into(),
        "--dir".into(),
        dir.display().to_string(),
        "--keys".into(),
        keys.to_string(),
    ];
    if let Some(c) = cap {
        args.extend(["--cap".into(), c.to_string()]);
    }
    let out = Command::new(exe).args(&args).output()?;
    if !out.status.success() {
        return Err(format!("child: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = text.split_whitespace().collect();
    let parse = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    Ok((parse(0), parse(1), parse(2) as u64))
}

/// Churn through a capped store against a store holding the cap's worth
/// of keys (memory) and an uncapped store taking the same churn
/// (throughput).
pub fn churn(dir: &Path, quick: bool) -> Result<Value> {
    let (cap, churn) = if quick {
        (100_000u64, 1_000_000u64)
    } else {
        (1_000_000, 10_000_000)
    };
    let dir = dir.join("churn");
    let (mut held, mut capped, mut uncapped) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved rounds: drift hits the three alike.
    for _ in 0..3 {
        held.push(measure_child(&dir, cap, None)?);
        capped.push(measure_child(&dir, churn, Some(cap as usize))?);
        uncapped.push(measure_child(&dir, churn, None)?);
    }
    let med =
        |v: &[(f64, f64, u64)], f: fn(&(f64, f64, u64)) -> f64| median(v.iter().map(f).collect());
    let held_rss = med(&held, |r| r.1);
    let capped_rss = med(&capped, |r| r.1);
    let capped_ops = med(&capped, |r| r.0);
    let uncapped_ops = med(&uncapped, |r| r.0);
    assert!(capped.iter().all(|r| r.2 <= cap));
    Ok(json!({
        "cap": cap,
        "distinct_ids": churn,
        "store_holding_cap_keys_rss_bytes_per_key": round2(held_rss / cap as f64),
        "capped_churn_rss_bytes_per_cap_key": round2(capped_rss / cap as f64),
        "capped_churn_rss_over_cap_keys_rss": round2(capped_rss / held_rss),
        "capped_churn_keys_held": capped[0].2,
        "capped_churn_appends_per_s": round2(capped_ops),
        "uncapped_churn_appends_per_s": round2(uncapped_ops),
        "uncapped_churn_rss_bytes_per_key": round2(med(&uncapped, |r| r.1) / churn as f64),
        "capped_over_uncapped_throughput": round2(capped_ops / uncapped_ops),
        "store_holding_cap_keys_appends_per_s": round2(med(&held, |r| r.0)),
    }))
}

/// A sweep expiring `keys` keys while an appender appends to other keys:
/// the sweep's duration and the longest append during it and outside it.
pub fn expiration_pause(dir: &Path, keys: u64, policy: FsyncPolicy) -> Result<Value> {
    let dir = dir.join("expire");
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let _ = std::fs::remove_dir_all(&dir);
        let clock = ManualClock::new(1_700_000_000_000);
        let opts = StoreOptions::default()
            .fsync(policy)
            .snapshot_every_records(None)
            .snapshot_every_bytes(None)
            .expiration_interval(None)
            .producer_expiration(Some(Duration::from_secs(3600)))
            .clock(Arc::new(clock.clone()));
        {
            let store =
                ProducerStateStore::open_with(&dir, opts.clone().fsync(FsyncPolicy::Never))?;
            append_keys(&store, 0, keys)?;
            store.close()?;
        }
        let store = Arc::new(ProducerStateStore::open_with(&dir, opts)?);
        clock.advance(Duration::from_secs(7200));
        let mut k = 1u64 << 40;
        let (n, took, p) = while_appending(
            &store,
            move |_| {
                k += 1;
                (k, 0, 0)
            },
            || Ok(store.expire_now()?),
        )?;
        assert_eq!(n as u64, keys);
        rounds.push((
            ms(took),
            p.longest_during_ms,
            p.longest_otherwise_ms,
            p.appends_during as f64,
        ));
        Arc::try_unwrap(store)
            .map_err(|_| "store still shared")?
            .close()?;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(json!({
        "keys_expired": keys,
        "policy": format!("{policy:?}"),
        "sweep_ms": round2(median(rounds.iter().map(|r| r.0).collect())),
        "longest_append_ms_during_sweep": round2(median(rounds.iter().map(|r| r.1).collect())),
        "longest_append_ms_otherwise": round2(median(rounds.iter().map(|r| r.2).collect())),
        "appends_during_sweep": median(rounds.iter().map(|r| r.3).collect()),
    }))
}

/// Copies the store files of `from` into a fresh `to`.
fn copy_store(from: &Path, to: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let p = e?.path();
        let name = p.file_name().ok_or("name")?.to_owned();
        if name != "LOCK" {
            std::fs::copy(&p, to.join(name))?;
        }
    }
    Ok(())
}

/// `truncate_to` on a store of `keys` keys and `records` single-sequence
/// appends (their positions are their offsets), cutting the second half
/// of the last round, against opening the same store. With the default
/// snapshot interval (a snapshot per 1M records: truncation starts from
/// the last but one) and with no snapshot (truncation and recovery both
/// replay the whole log).
pub fn truncation(dir: &Path, keys: u64, records: u64) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (name, every) in [
        ("snapshots_every_1m", Some(1_000_000u64)),
        ("no_snapshot", None),
    ] {
        let built = dir.join("truncate-built");
        let work = dir.join("truncate-work");
        let opts = || {
            StoreOptions::default()
                .fsync(FsyncPolicy::Never)
                .snapshot_every_records(every)
                .snapshot_every_bytes(None)
                .expiration_interval(None)
        };
        build(&built, keys, records / keys, opts())?.close()?;
        let offset = (records - keys / 2) as i64;
        let (mut opens, mut truncations) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            copy_store(&built, &work)?;
            let t = Instant::now();
            let store = ProducerStateStore::open_with(&work, opts())?;
            opens.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            store.truncate_to(offset)?;
            truncations.push(t.elapsed().as_secs_f64());
            assert_eq!(store.len() as u64, keys);
            assert_eq!(store.end_offset(), offset);
            store.close()?;
        }
        let (open, cut) = (median(opens), median(truncations));
        out.insert(
            name.into(),
            json!({
                "keys": keys,
                "records": records,
                "truncate_to": offset,
                "keys_set_back": keys / 2,
                "recover_ms": round2(open * 1e3),
                "truncate_ms": round2(cut * 1e3),
                "truncate_over_recover": round2(cut / open),
            }),
        );
        std::fs::remove_dir_all(&built)?;
        std::fs::remove_dir_all(&work)?;
    }
    Ok(Value::Object(out))
}
