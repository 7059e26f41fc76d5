//! Benchmarks of producer-state. The criterion benches are in `benches/`
//! (`cargo bench -p producer-state-bench`), the durable store's report is
//! the `bench` example
//! (`cargo run --release -p producer-state-bench --example bench`). This
//! library holds what the examples share.

/// The value after `--name` on the command line `args`, if given.
pub fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The 1M-key benches' command line: `--keys N` (1,000,000), `--rounds
/// N` (`rounds`), `--dir PATH` (a temporary directory, kept alive by the
/// returned guard). Returns keys, rounds, the directory and the guard.
pub fn keys_rounds_dir(
    rounds: u64,
) -> Result<(u64, u64, std::path::PathBuf, tempfile::TempDir), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| arg(&args, name);
    let keys: u64 = arg("--keys").map_or(Ok(1_000_000), |v| v.parse())?;
    let rounds: u64 = arg("--rounds").map_or(Ok(rounds), |v| v.parse())?;
    let tmp = tempfile::tempdir()?;
    let base = arg("--dir").map_or_else(|| tmp.path().to_path_buf(), std::path::PathBuf::from);
    Ok((keys, rounds, base, tmp))
}

/// The median of `v` (the upper one of an even count); `v` is not empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `ops` appends to keys drawn at random (xorshift, a fixed seed) from
/// `0..keys`, each key's sequences in order from 0: as (key, sequence).
pub fn in_order_stream(keys: u64, ops: usize) -> Vec<(u64, i32)> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut seqs = vec![0i32; keys as usize];
    (0..ops)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % keys;
            let s = seqs[k as usize];
            seqs[k as usize] += 1;
            (k, s)
        })
        .collect()
}

/// The store `snapshot_bench` and `snapprof` measure: 1M-key-scale stores
/// of single-record batches, one partition, a snapshot at the end.
pub mod snapshot_store {
    use std::path::Path;

    use producer_state::{AppendRequest, Batch, FsyncPolicy, ProducerStateStore, StoreOptions};

    /// The first batch's timestamp; batch `i` is stamped `T0 + i`.
    pub const T0: i64 = 1_700_000_000_000;

    /// No fsyncs, no automatic snapshots, and segments of 1 MiB so that
    /// retention leaves at most one segment of records a snapshot covers.
    pub fn opts() -> StoreOptions {
        StoreOptions::default()
            .fsync(FsyncPolicy::Never)
            .snapshot_every_records(None)
            .snapshot_every_bytes(None)
            .segment_size(1 << 20)
    }

    /// A fresh store in `dir` (whatever was there is removed) of `keys`
    /// numeric producers with `per_key` batches each (batch `b` of a key
    /// at sequence `b`), in `append_all` calls of 10,000, then a snapshot.
    pub fn build(dir: &Path, keys: u64, per_key: u64) -> Result<(), Box<dyn std::error::Error>> {
        let _ = std::fs::remove_dir_all(dir);
        let store = ProducerStateStore::open_with(dir, opts())?;
        let mut chunk = Vec::with_capacity(10_000);
        let flush = |chunk: &mut Vec<AppendRequest>| -> Result<(), Box<dyn std::error::Error>> {
            for o in store.append_all(chunk) {
                if !o?.is_accepted() {
                    return Err("an append of the benchmark's store was not accepted".into());
                }
            }
            chunk.clear();
            Ok(())
        };
        for b in 0..per_key {
            for k in 0..keys {
                let at = (b * keys + k) as i64;
                let s = b as i32;
                chunk.push(AppendRequest::batch(k, 0, 0, Batch::new(s, s, at, T0 + at)));
                if chunk.len() == 10_000 {
                    flush(&mut chunk)?;
                }
            }
        }
        flush(&mut chunk)?;
        store.sync()?;
        store.snapshot()?;
        store.close()?;
        Ok(())
    }
}
