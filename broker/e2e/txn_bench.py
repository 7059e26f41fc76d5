#!/usr/bin/env python3
"""Transactional produce throughput of producer-state-broker against
idempotent produce, measured in the same run, with librdkafka's defaults
otherwise (acks=all, linger 5 ms), 100-byte messages, one machine, no
faults.

  target/e2e/venv/bin/python broker/e2e/txn_bench.py --broker target/release/producer-state-broker

Sides, each on a topic of its own on one broker per round:
- idempotent: enable.idempotence, produce() and one flush() at the end;
- transactional, K messages per transaction (K = 1, 10, 100):
  begin_transaction(), K produce(), commit_transaction(), again and again
  (K = 1,000 too, to show where the fixed cost stops mattering).

For each side: messages per second from the first produce() to the last
commit (or flush), and for the transactional sides the ratio to the
idempotent side of the same round, and the median commit_transaction() in
milliseconds (the coordinator's round trips: EndTxn, the markers written
and fsync'ed, and the wait for the transaction's last deliveries). Rounds
interleave the sides; the table shows medians over the rounds. A bench,
not a test: it fails only if the broker does not start or a delivery or
a transaction fails. Every loop is bounded in count and time (--timeout).
"""

import argparse
import os
import shutil
import signal
import statistics
import sys
import subprocess
import tempfile
import time

from confluent_kafka import Producer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import Deadline, free_port  # noqa: E402

PAYLOAD = b"x" * 100
# Messages per transaction: 1, 10 and 100, and 1,000 to show
# where the fixed cost of a transaction stops mattering.
SIZES = (1, 10, 100, 1000)


def idempotent(bootstrap, topic, n, deadline):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5, "acks": "all"})
    failed = [0]

    def cb(err, _msg):
        if err is not None:
            failed[0] += 1

    p.produce(topic, b"warmup", on_delivery=cb)  # creates the topic
    p.flush(30)
    t0 = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, PAYLOAD, on_delivery=cb)
                break
            except BufferError:
                deadline.check("idempotent produce")
                p.poll(0.01)
    remaining = p.flush(300)
    dt = time.monotonic() - t0
    if failed[0] or remaining:
        raise SystemExit(f"idempotent: {failed[0]} deliveries failed, {remaining} not delivered")
    return n / dt


def transactional(bootstrap, topic, per_txn, txns, deadline, tid):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "linger.ms": 5, "acks": "all"})
    p.init_transactions(30)
    # Create the topic and warm the coordinator up before timing.
    p.begin_transaction()
    p.produce(topic, b"warmup")
    p.commit_transaction(30)
    commits = []
    t0 = time.monotonic()
    for _ in range(txns):
        deadline.check(f"transactions of {per_txn}")
        p.begin_transaction()
        for _ in range(per_txn):
            while True:
                try:
                    p.produce(topic, PAYLOAD)
                    break
                except BufferError:
                    p.poll(0.01)
        c0 = time.monotonic()
        p.commit_transaction(60)
        commits.append(time.monotonic() - c0)
    dt = time.monotonic() - t0
    return per_txn * txns / dt, statistics.median(commits) * 1e3


def one_round(binary, args, r, deadline):
    d = tempfile.mkdtemp(prefix="broker-txn-bench-")
    port = free_port()
    log = open(os.path.join(d, "broker.log"), "wb")
    b = subprocess.Popen([binary, "--dir", os.path.join(d, "data"), "--listen", f"127.0.0.1:{port}",
                          "--partitions", str(args.partitions)], stdout=subprocess.PIPE, stderr=log)
    try:
        if not b.stdout.readline().startswith(b"listening on"):
            raise SystemExit("broker did not start")
        bootstrap = f"127.0.0.1:{port}"
        rates = {"idempotent": idempotent(bootstrap, f"idem-{r}", args.messages, deadline)}
        commits = {}
        for k in SIZES:
            txns = max(1, min(args.transactions, args.messages // k))
            rate, commit_ms = transactional(bootstrap, f"txn{k}-{r}", k, txns, deadline, f"bench-{r}-{k}")
            rates[k], commits[k] = rate, commit_ms
        b.send_signal(signal.SIGTERM)
        b.wait(30)
        return rates, commits
    finally:
        if b.poll() is None:
            b.kill()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--messages", type=int, default=20_000, help="idempotent messages per round")
    ap.add_argument("--transactions", type=int, default=300, help="transactions per side per round, at most")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    deadline = Deadline(args.timeout)
    rounds = [one_round(args.broker, args, r, deadline) for r in range(args.rounds)]
    idem = statistics.median(r[0]["idempotent"] for r in rounds)
    print(f"{args.rounds} rounds, {args.partitions} partition(s), 100-byte messages; medians")
    print("| side | messages/s | / idempotent (same round) | commit_transaction() ms | goal |")
    print("|---|---:|---:|---:|---|")
    print(f"| idempotent | {idem:,.0f} | 1.00x | | |")
    for k in SIZES:
        rate = statistics.median(r[0][k] for r in rounds)
        ratio = statistics.median(r[0][k] / r[0]["idempotent"] for r in rounds)
        commit = statistics.median(r[1][k] for r in rounds)
        goal = ">= 0.7x" if k == 100 else ""
        print(f"| {k} per transaction | {rate:,.0f} | {ratio:.2f}x | {commit:.2f} | {goal} |")


if __name__ == "__main__":
    main()
