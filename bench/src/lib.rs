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
