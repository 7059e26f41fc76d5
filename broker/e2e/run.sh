#!/usr/bin/env bash
# The end-to-end proofs: librdkafka (confluent-kafka, from PyPI)
# with enable.idempotence=true against producer-state-broker, through a
# fault-injecting proxy, with the broker killed (SIGKILL) and restarted.
#
#   broker/e2e/run.sh [driver options, e.g. --messages 20000 --kills 2]
#
# Installs what it needs itself: builds the broker and the proxy in release
# mode and creates a Python virtual environment with confluent-kafka (its
# wheel bundles librdkafka) under target/e2e/. Exits non-zero when a check
# fails. E2E_TIMEOUT (seconds, default 900) bounds the whole run.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
# Where cargo puts what it builds: CARGO_TARGET_DIR if set, else target/.
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/e2e
mkdir -p "$out"

cargo build --release -p producer-state-broker --bins

venv=$out/venv
if ! "$venv/bin/python" -c 'import confluent_kafka' 2>/dev/null; then
  python3 -m venv "$venv" || {
    # Debian/Ubuntu ship venv separately.
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      exit 1
    fi
  }
  "$venv/bin/pip" install -q --disable-pip-version-check 'confluent-kafka>=2.3,<3'
fi
"$venv/bin/python" -c 'import confluent_kafka as c; print("confluent-kafka", c.version()[0], "librdkafka", c.libversion()[0])'

work=$(mktemp -d "$out/run.XXXXXX")
echo "work directory: $work"
status=0
timeout --kill-after=30 "${E2E_TIMEOUT:-900}" \
  "$venv/bin/python" broker/e2e/driver.py \
    --broker "$target/release/producer-state-broker" \
    --proxy "$target/release/fault-proxy" \
    --work "$work" --timeout "$(( ${E2E_TIMEOUT:-900} - 30 ))" "$@" || status=$?
# Exactly-once pipelines: transactions, fencing, timeouts, and the
# consume-transform-produce loop through the proxy with kill -9.
if [ "$status" -eq 0 ]; then
  timeout --kill-after=30 "${E2E_TXN_TIMEOUT:-600}" \
    "$venv/bin/python" broker/e2e/txn.py \
      --broker "$target/release/producer-state-broker" \
      --proxy "$target/release/fault-proxy" \
      --work "$work" --timeout "$(( ${E2E_TXN_TIMEOUT:-600} - 30 ))" || status=$?
fi
# Keep the data of a failed run for inspection, drop a passing one's.
if [ "$status" -eq 0 ] && [ -z "${E2E_KEEP:-}" ]; then rm -rf "$work"; fi
exit "$status"
