#!/usr/bin/env python3
"""End-to-end proof: librdkafka (confluent-kafka) against producer-state-broker.

Produces N unique messages with enable.idempotence=true through a
fault-injecting proxy (dropped connections, in particular right after a
Produce request was forwarded; delays; split packets), kills the broker with
SIGKILL several times and restarts it on the same directory, then reads every
partition back and checks:

- every successful delivery report is in the log exactly once, at the offset
  the report gave;
- no message is in the log twice;
- per partition, the log's order is the produce order.

It prints retries (librdkafka's own counter), duplicates the broker answered
(from its logs), dropped connections (from the proxy) and kills, and fails
when a check fails or when nothing was retried. A second run with
idempotence off shows the duplicates the broker cannot catch (printed, not a
failure). Every wait is bounded; the whole run has a deadline.
"""

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition, OFFSET_BEGINNING


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return max(0.0, self.end - time.monotonic())

    def check(self, what):
        if self.left() <= 0:
            raise SystemExit(f"FAIL: overall timeout while {what}")


class Broker:
    """The broker process: start, SIGKILL, restart on the same directory."""

    def __init__(self, binary, data_dir, port, advertise, partitions, log_dir):
        self.binary, self.data_dir, self.port = binary, data_dir, port
        self.advertise, self.partitions, self.log_dir = advertise, partitions, log_dir
        self.proc = None
        self.incarnation = 0
        self.kills = 0

    def start(self, advertise=None):
        self.incarnation += 1
        log = open(os.path.join(self.log_dir, f"broker-{self.incarnation}.log"), "wb")
        cmd = [self.binary, "--dir", self.data_dir, "--listen", f"127.0.0.1:{self.port}",
               "--advertise", advertise or self.advertise, "--partitions", str(self.partitions),
               # Room for every topic a phase creates (the codec phase
               # makes four) however many partitions each has.
               "--max.partitions", str(max(1000, 8 * self.partitions))]
        cmd += getattr(self, "extra", [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
        log.close()
        line = [None]

        def read():
            line[0] = self.proc.stdout.readline().decode(errors="replace").strip()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(60)
        if not line[0] or not line[0].startswith("listening on"):
            self.proc.kill()
            raise SystemExit(f"FAIL: broker did not start (stdout {line[0]!r}); see {log.name}")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.kills += 1

    def stop(self):
        """SIGTERM: the clean shutdown; must exit 0 within 30 s."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise SystemExit("FAIL: broker did not stop within 30 s of SIGTERM")
            if rc != 0:
                raise SystemExit(f"FAIL: broker exited {rc} after SIGTERM")

    def duplicates_answered(self):
        n = 0
        for i in range(1, self.incarnation + 1):
            with open(os.path.join(self.log_dir, f"broker-{i}.log"), "rb") as f:
                n += sum(1 for l in f if b"DUPLICATE produce answered" in l)
        return n

    def opened(self, field):
        """The sum of `field` (batches_replayed, states_truncated,
        states_rebuilt) over the broker's "partitions opened" lines: what
        each start's recovery did."""
        n = 0
        for i in range(1, self.incarnation + 1):
            with open(os.path.join(self.log_dir, f"broker-{i}.log"), "rb") as f:
                for l in f:
                    if b"partitions opened" in l:
                        m = re.search(field.encode() + rb"=(\d+)", l)
                        n += int(m.group(1)) if m else 0
        return n

    def log_lines(self, needle):
        n = 0
        for i in range(1, self.incarnation + 1):
            with open(os.path.join(self.log_dir, f"broker-{i}.log"), "rb") as f:
                n += sum(1 for l in f if needle in l)
        return n


def start_proxy(binary, port, upstream, seed, stats, produce_drop, random_drop):
    p = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}", "--upstream",
                          f"127.0.0.1:{upstream}", "--seed", str(seed), "--stats", stats,
                          "--produce-drop", str(produce_drop), "--random-drop", str(random_drop)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = p.stdout.readline().decode().strip()
    if not first.startswith("proxy listening"):
        p.kill()
        raise SystemExit(f"FAIL: proxy did not start: {first!r}")
    return p


def proxy_stats(path):
    try:
        with open(path) as f:
            return dict(kv.split("=") for kv in f.read().split())
    except OSError:
        return {}


def produce(args, bootstrap, topic, n, idempotent, broker, deadline, kills):
    """Produces n messages round-robin over the partitions, paced at
    args.rate messages/s, killing the broker `kills` times along the way.
    Returns (sent per partition in order, delivered {value: (partition, offset)},
    failed count, librdkafka retries)."""
    retries = {"tx": 0, "last": None}

    def on_stats(js):
        s = json.loads(js)
        retries["last"] = js
        retries["tx"] = max(retries["tx"], sum(b.get("txretries", 0) for b in s.get("brokers", {}).values()))

    conf = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": idempotent,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": int(max(60, deadline.left() - 30) * 1000),
        "retry.backoff.ms": 20,
        "retry.backoff.max.ms": 200,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 300,
        "socket.timeout.ms": 10000,
        "statistics.interval.ms": 500,
        "stats_cb": on_stats,
        "log.connection.close": False,  # the proxy closes many; it counts them
        # The broker counts every produced batch's records, decompressing
        # them: the main run sends compressed batches.
        "compression.type": args.compression if idempotent else "none",
    }
    if not idempotent:
        conf["max.in.flight.requests.per.connection"] = 5
        conf["retries"] = 1000000
    p = Producer(conf)
    sent = [[] for _ in range(args.partitions)]
    delivered = {}
    failed = [0]
    errors = {}

    def on_delivery(err, msg):
        if err is None:
            delivered[msg.value()] = (msg.partition(), msg.offset())
        else:
            failed[0] += 1
            errors[str(err)] = errors.get(str(err), 0) + 1

    kill_at = sorted(random.sample(range(n // 10, n - n // 10), kills)) if kills else []
    start = time.monotonic()
    for i in range(n):
        part = i % args.partitions
        value = b"%s-%d-%07d-" % (topic.encode(), part, i)
        value += b"x" * max(0, args.size - len(value))
        while True:
            try:
                p.produce(topic, value=value, partition=part, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
                deadline.check("producing (queue full)")
        sent[part].append(value)
        if kill_at and i == kill_at[0]:
            kill_at.pop(0)
            broker.kill9()
            time.sleep(random.uniform(0.05, 0.8))
            broker.start()
        if i % 20 == 0:
            p.poll(0)
            ahead = i / args.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            deadline.check("producing")
    while len(p) > 0:
        p.flush(min(5, deadline.left()))
        deadline.check(f"waiting for {len(p)} deliveries")
    p.poll(1)  # one more statistics callback
    if retries["last"]:
        with open(os.path.join(args.work, f"stats-{topic}.json"), "w") as f:
            f.write(retries["last"])
    if errors:
        print(f"  delivery errors: {errors}")
    return sent, delivered, failed[0], retries["tx"]


def consume(bootstrap, topic, partitions, deadline):
    """Reads every partition from the start to its end: [(offset, value)] each."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "e2e-verify",  # required by the client; no group API is used:
        "enable.auto.commit": False,  # partitions are assign()ed, offsets never committed
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
    })
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = [[] for _ in range(partitions)]
    at_eof = set()
    while len(at_eof) < partitions:
        deadline.check("reading back")
        for m in c.consume(1000, 1.0):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(m.partition())
                    continue
                raise SystemExit(f"FAIL: consumer error {m.error()}")
            at_eof.discard(m.partition())
            out[m.partition()].append((m.offset(), m.value()))
    c.close()
    return out


def check(sent, delivered, logs):
    """Returns (problems, duplicates in the log, order violations)."""
    problems = []
    where = {}
    dups = 0
    for part, records in enumerate(logs):
        for off, value in records:
            if value in where:
                dups += 1
            where.setdefault(value, []).append((part, off))
    for value, (part, off) in delivered.items():
        found = where.get(value, [])
        if found != [(part, off)]:
            problems.append(f"delivered {value[:24]!r} at {part}/{off}, in the log at {found}")
    order_violations = 0
    for part, records in enumerate(logs):
        rank = {v: i for i, v in enumerate(sent[part])}
        last = -1
        for off, value in records:
            r = rank.get(value)
            if r is None:
                problems.append(f"partition {part} offset {off}: {value[:24]!r} was never produced")
            elif r <= last:
                order_violations += 1
            else:
                last = r
    if dups:
        problems.append(f"{dups} messages are in the log more than once")
    if order_violations:
        problems.append(f"{order_violations} records out of produce order")
    return problems, dups, order_violations


def codecs(args, deadline):
    """Each of Kafka's codecs, as librdkafka writes it, through the broker's
    record count check: every message delivered and read back once."""
    problems = []
    work = os.path.join(args.work, "codecs")
    os.makedirs(work, exist_ok=True)
    port = free_port()
    broker = Broker(args.broker, os.path.join(work, "data"), port, f"127.0.0.1:{port}",
                    args.partitions, work)
    broker.start()
    try:
        for codec in ["gzip", "snappy", "lz4", "zstd"]:
            topic = f"codec-{codec}"
            p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                          "compression.type": codec, "linger.ms": 20,
                          "message.timeout.ms": 30000})
            errors = []
            sent = [b"%s-%05d-" % (codec.encode(), i) + b"y" * 200 for i in range(2000)]
            for i, v in enumerate(sent):
                p.produce(topic, value=v, partition=i % args.partitions,
                          on_delivery=lambda err, msg: err and errors.append(str(err)))
            p.flush(min(60, deadline.left()))
            got = sorted(v for part in consume(f"127.0.0.1:{port}", topic, args.partitions, deadline)
                         for _, v in part)
            ok = not errors and got == sorted(sent)
            print(f"[codecs] {codec}: delivered={len(sent) - len(errors)} read_back={len(got)} "
                  f"errors={set(errors) or 'none'}")
            if not ok:
                problems.append(f"{codec}: {len(errors)} delivery errors, {len(got)} of {len(sent)} read back")
    finally:
        broker.stop()
    return problems


def run(args, name, idempotent, n, kills, deadline):
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data")
    bport, pport = free_port(), free_port()
    broker = Broker(args.broker, data, bport, f"127.0.0.1:{pport}", args.partitions, work)
    stats = os.path.join(work, "proxy-stats")
    proxy = None
    try:
        broker.start()
        proxy = start_proxy(args.proxy, pport, bport, args.seed, stats,
                            args.produce_drop, args.random_drop)
        topic = f"e2e-{name}"
        t0 = time.monotonic()
        sent, delivered, failed, retries = produce(
            args, f"127.0.0.1:{pport}", topic, n, idempotent, broker, deadline, kills)
        elapsed = time.monotonic() - t0
        proxy.terminate()
        proxy.wait(10)
        proxy = None
        # A clean stop (SIGTERM), then a restart advertising itself: the
        # read-back goes to the broker directly, past the proxy.
        broker.stop()
        broker.start(advertise=f"127.0.0.1:{bport}")
        logs = consume(f"127.0.0.1:{bport}", topic, args.partitions, deadline)
        broker.stop()
        problems, dups, order = check(sent, delivered, logs)
        ps = proxy_stats(stats)
        drops = int(ps.get("produce_drops", 0)) + int(ps.get("random_drops", 0))
        print(f"[{name}] idempotence={'on' if idempotent else 'off'} messages={n} "
              f"partitions={args.partitions} in {elapsed:.1f}s")
        print(f"  delivered={len(delivered)} failed_deliveries={failed} "
              f"in_log={sum(len(l) for l in logs)}")
        resent = int(ps.get("resent_batches", 0))
        # Without idempotence librdkafka rebuilds a retried batch, so the
        # proxy cannot match it to its first attempt: the log shows them.
        shown = resent if idempotent else "n/a"
        print(f"  retries={shown} (batches sent again, of {ps.get('produce_batches', 0)} sent; "
              f"librdkafka txretries={retries}) duplicates_answered={broker.duplicates_answered()} "
              f"dropped_connections={drops} (after_produce={ps.get('produce_drops', 0)}, "
              f"random={ps.get('random_drops', 0)}) split_writes={ps.get('splits', 0)} "
              f"delays={ps.get('delays', 0)} kills={broker.kills} "
              f"torn_tails_cut={broker.log_lines(b'cut a torn tail')} "
              f"batches_replayed={broker.opened('batches_replayed')} "
              f"states_truncated={broker.opened('states_truncated')} "
              f"states_rebuilt={broker.opened('states_rebuilt')}")
        print(f"  duplicates_in_log={dups} out_of_order_records={order}")
        return problems, resent, drops, broker.kills
    finally:
        if proxy:
            proxy.kill()
        if broker.proc and broker.proc.poll() is None:
            broker.proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--contrast-messages", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--rate", type=float, default=4000, help="messages/s offered")
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--compression", default="lz4",
                    choices=["none", "gzip", "snappy", "lz4", "zstd"],
                    help="compression.type of the main (idempotent) run")
    ap.add_argument("--produce-drop", type=float, default=0.03)
    ap.add_argument("--random-drop", type=float, default=0.002)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--timeout", type=float, default=900, help="overall deadline, s")
    args = ap.parse_args()
    random.seed(args.seed)
    print(f"seed={args.seed}")
    deadline = Deadline(args.timeout)

    problems = codecs(args, deadline)
    more, retries, drops, kills = run(args, "idempotent", True, args.messages, args.kills, deadline)
    problems += more
    if retries == 0:
        problems.append("nothing was retried: a run without faults proves nothing")
    if kills == 0 and args.kills > 0:
        problems.append("the broker was never killed")

    if args.contrast_messages > 0:
        # The contrast: no producer ids, so the broker cannot tell a retry
        # from new data. Not a failure, only shown.
        _, _, _, _ = run(args, "contrast", False, args.contrast_messages, 0, deadline)
        print("  (contrast run: without idempotence every retried batch whose first attempt "
              "reached the log is in it twice; not a failure)")

    if problems:
        print("FAIL:")
        for p in problems[:20]:
            print(f"  {p}")
        sys.exit(1)
    print("PASS: every delivered message is in the log exactly once, in produce order")


if __name__ == "__main__":
    main()
