#!/usr/bin/env python3
"""Produce throughput of producer-state-broker with librdkafka's defaults
(acks=all, idempotent, linger 5 ms), no faults, one machine.

  target/e2e/venv/bin/python broker/e2e/bench.py --broker target/release/producer-state-broker

For each message size: messages/s and MB/s from the first produce() to the
last delivery report, and the broker's own account of where its produce
path spent its time (`state_share`: the share inside producer-state's
append_batch; the state's fsync runs on the store's own thread, once per
STATE_FSYNC_INTERVAL, and is not in it). A bench, not a test: it fails only if
the broker does not start or a delivery fails.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from confluent_kafka import Producer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(binary, size, n, partitions):
    d = tempfile.mkdtemp(prefix="broker-bench-")
    port = free_port()
    log_path = os.path.join(d, "broker.log")
    with open(log_path, "wb") as log:
        b = subprocess.Popen([binary, "--dir", os.path.join(d, "data"), "--listen", f"127.0.0.1:{port}",
                              "--partitions", str(partitions)], stdout=subprocess.PIPE, stderr=log)
    try:
        if not b.stdout.readline().startswith(b"listening on"):
            raise SystemExit("broker did not start")
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                      "linger.ms": 5, "acks": "all"})
        failed = [0]

        def cb(err, _msg):
            if err is not None:
                failed[0] += 1

        # Create the topic and warm up the connection before timing.
        p.produce("bench", b"warmup", on_delivery=cb)
        p.flush(30)
        payload = b"x" * size
        t0 = time.monotonic()
        for i in range(n):
            while True:
                try:
                    p.produce("bench", payload, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.01)
        p.flush(300)
        dt = time.monotonic() - t0
        if failed[0]:
            raise SystemExit(f"{failed[0]} deliveries failed")
        b.send_signal(signal.SIGTERM)
        b.wait(30)
        with open(log_path, "rb") as f:
            stopped = [l.decode() for l in f if b"stopped" in l][-1]
        timings = re.search(r"timings=(.*)$", stopped).group(1).strip()
        print(f"{size:>5} B x {n}: {n / dt:>9,.0f} msg/s {n * size / dt / 1e6:7.2f} MB/s "
              f"({dt:.1f} s)  broker: {timings}")
    finally:
        if b.poll() is None:
            b.kill()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    for size in (100, 1024):
        bench(args.broker, size, args.messages, args.partitions)


if __name__ == "__main__":
    main()
