//! Benchmarks of producer-state; nothing to link against. The criterion
//! benches are in `benches/` (`cargo bench -p producer-state-bench`), the
//! durable store's report is the `bench` example
//! (`cargo run --release -p producer-state-bench --example bench`).
