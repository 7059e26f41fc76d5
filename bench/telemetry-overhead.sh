#!/usr/bin/env bash
# What the store's metrics cost (docs/performance.md, "Metrics"): builds
# the telemetry_overhead example without the library's metrics and events
# (the baseline) and with them, then runs the second against the first,
# interleaved round by round. About four minutes on 2 cores.
#   bench/telemetry-overhead.sh [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p producer-state-bench --example telemetry_overhead --no-default-features
cp "$target/release/examples/telemetry_overhead" "$target/release/telemetry_overhead_baseline"
cargo build --release -p producer-state-bench --example telemetry_overhead
exec "$target/release/examples/telemetry_overhead" --baseline "$target/release/telemetry_overhead_baseline" "$@"
