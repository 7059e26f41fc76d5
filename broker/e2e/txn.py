#!/usr/bin/env python3
"""Exactly-once pipelines through producer-state-broker, with librdkafka.

Four checks, each with a real client (confluent-kafka) on 127.0.0.1:

1. transactions: a transactional producer runs N transactions, committing
   or aborting each at random; a read_committed consumer reads exactly the
   committed messages, each once and in order per partition, both with
   assign() and with subscribe() (a consumer group), and a read_uncommitted
   consumer reads the aborted ones too;
2. fencing: a second producer with the same transactional.id fences the
   first, which gets librdkafka's fatal error;
3. timeout: a transaction left open past transaction.timeout.ms is aborted
   by the broker, and the last stable offset moves on;
4. the pipeline: input topic -> a transformer (a consumer in a group plus a
   transactional producer using send_offsets_to_transaction) -> output
   topic, through the fault proxy, with the broker killed (SIGKILL) at
   random points and restarted: every input message appears exactly once
   in the committed output, and the group's committed offsets are the
   input's ends.

Every wait is bounded; the whole run has a deadline. Exits non-zero when a
check fails.
"""

import argparse
import os
import random
import sys
import threading
import time

from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition, OFFSET_BEGINNING)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import Broker, Deadline, consume, free_port, proxy_stats, start_proxy  # noqa: E402


def retried(what, deadline, f):
    """f(), tried again while it fails with a Kafka error (a broker being
    restarted, a connection dropped), until the deadline."""
    while True:
        try:
            return f()
        except KafkaException as e:
            if deadline.left() < 5:
                raise
            print(f"  ({what}: {e.args[0].str()}; trying again)", flush=True)
            time.sleep(0.5)


def read_all(bootstrap, topic, partitions, isolation, deadline, group=None):
    """Every (partition, offset, value) of `topic`, read to its end (for
    read_committed: to the last stable offset) with assign(), or with
    subscribe() in `group`."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group or f"verify-{random.random()}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }
    c = Consumer(conf)
    if group:
        c.subscribe([topic])
    else:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    at_eof = set()
    quiet_since = time.monotonic()
    while len(at_eof) < partitions:
        deadline.check(f"reading {topic} ({isolation})")
        msgs = c.consume(500, 0.5)
        if not msgs and time.monotonic() - quiet_since > 30:
            raise SystemExit(f"FAIL: {topic} ({isolation}): nothing for 30 s, eof on {sorted(at_eof)}")
        for m in msgs:
            quiet_since = time.monotonic()
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(m.partition())
                    continue
                raise SystemExit(f"FAIL: consumer error {m.error()}")
            at_eof.discard(m.partition())
            out.append((m.partition(), m.offset(), m.value()))
    c.close()
    return out


def check_order(records, sent_order):
    """Each partition's values in the order they were produced."""
    rank = {v: i for i, v in enumerate(sent_order)}
    last = {}
    for part, _, v in sorted(records, key=lambda r: (r[0], r[1])):
        r = rank.get(v, -1)
        if r <= last.get(part, -1):
            return False
        last[part] = r
    return True


def transactions(args, bootstrap, deadline):
    problems = []
    topic = "txn-random"
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "txn-random",
                  "linger.ms": 5})
    p.init_transactions(30)
    committed, aborted, order = [], [], []
    t0 = time.monotonic()
    for t in range(args.transactions):
        deadline.check("running transactions")
        p.begin_transaction()
        vals = [b"t%05d-%03d" % (t, i) for i in range(args.per_txn)]
        for i, v in enumerate(vals):
            p.produce(topic, value=v, partition=(t + i) % args.partitions)
        order += vals
        # Sent before the decision, so that an abort leaves its batches in
        # the log (librdkafka drops what an abort finds still queued).
        p.flush(30)
        if random.random() < 0.5:
            p.commit_transaction(30)
            committed += vals
        else:
            p.abort_transaction(30)
            aborted += vals
    elapsed = time.monotonic() - t0
    print(f"[transactions] {args.transactions} transactions of {args.per_txn} in {elapsed:.1f}s: "
          f"{len(committed)} messages committed, {len(aborted)} aborted")
    for how, group in [("assign", None), ("subscribe", "txn-readers")]:
        rc = read_all(bootstrap, topic, args.partitions, "read_committed", deadline, group)
        vals = [v for _, _, v in rc]
        ok = sorted(vals) == sorted(committed) and len(set(vals)) == len(vals) and check_order(rc, order)
        print(f"  read_committed with {how}(): {len(vals)} read, exactly the committed: {ok}")
        if not ok:
            problems.append(f"read_committed with {how}() read {len(vals)}, not exactly the {len(committed)} committed")
    ru = read_all(bootstrap, topic, args.partitions, "read_uncommitted", deadline)
    vals = [v for _, _, v in ru]
    ok = sorted(vals) == sorted(committed + aborted)
    print(f"  read_uncommitted: {len(vals)} read, committed and aborted: {ok}")
    if not ok:
        problems.append(f"read_uncommitted read {len(vals)}, not the {len(committed) + len(aborted)} written")
    return problems


def fencing(bootstrap, deadline):
    a = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fenced"})
    a.init_transactions(30)
    a.begin_transaction()
    a.produce("fence", value=b"from a", partition=0)
    a.flush(10)
    b = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fenced"})
    b.init_transactions(30)
    fatal = None
    try:
        a.produce("fence", value=b"a again", partition=0)
        a.commit_transaction(30)
    except KafkaException as e:
        fatal = e.args[0]
    ok = fatal is not None and fatal.fatal() and fatal.code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    print(f"[fencing] the first producer got: {fatal and fatal.name()} fatal={fatal and fatal.fatal()}: {ok}")
    b.begin_transaction()
    b.produce("fence", value=b"from b", partition=0)
    b.commit_transaction(30)
    vals = [v for _, _, v in read_all(bootstrap, "fence", 1, "read_committed", deadline)]
    print(f"  committed after the fence: {vals}")
    problems = [] if ok else [f"fencing: the first producer got {fatal!r}, not a fatal fencing error"]
    if vals != [b"from b"]:
        problems.append(f"fencing: read_committed read {vals}, not only the second producer's")
    return problems


def end_offset(bootstrap, topic, isolation):
    """The end of partition 0 as a consumer at `isolation` sees it: the high
    watermark, or for read_committed the last stable offset (librdkafka
    asks ListOffsets at its isolation level)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": isolation})
    hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    c.close()
    return hi


def timeout(bootstrap, deadline):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "abandoned",
                  "transaction.timeout.ms": 2000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce("abandon", value=b"never committed %d" % i, partition=0)
    p.flush(10)
    held = end_offset(bootstrap, "abandon", "read_committed")
    hw = end_offset(bootstrap, "abandon", "read_uncommitted")
    # Abandoned: no commit, no abort. The broker aborts it after 2 s.
    t0 = time.monotonic()
    moved = False
    while time.monotonic() - t0 < 15:
        deadline.check("waiting for the timeout abort")
        if end_offset(bootstrap, "abandon", "read_committed") == end_offset(bootstrap, "abandon", "read_uncommitted"):
            moved = True
            break
        time.sleep(0.25)
    took = time.monotonic() - t0
    vals = read_all(bootstrap, "abandon", 1, "read_committed", deadline)
    print(f"[timeout] open transaction: last stable offset {held}, high watermark {hw}; aborted by the "
          f"broker and the LSO moved to the end after {took:.1f}s: {moved}; read_committed reads {len(vals)}")
    problems = []
    if not moved or held != 0:
        problems.append(f"timeout: LSO {held} while open, moved: {moved}")
    if vals:
        problems.append(f"timeout: read_committed read {len(vals)} messages of the aborted transaction")
    return problems


# librdkafka 2.10 and later re-bootstrap when every broker they know is down
# (KIP-899). With one broker, a dropped connection is every broker down: the
# client decommissions the broker's handle, and a send_offsets_to_transaction
# in flight then waits on that handle for ever (seen with librdkafka 2.16.0:
# "Handle is terminating in state TRY_CONNECT: 3 refcnts" a thousand times a
# second, and the call never returns, its timeout notwithstanding). The
# pipeline's clients turn re-bootstrapping off; docs/broker.md says so.
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


class Transformer(threading.Thread):
    """Reads the input topic in a consumer group and writes each message,
    transformed, to the output topic in transactions that carry the
    consumed offsets (send_offsets_to_transaction). Rewinds to the group's
    committed offsets after an aborted transaction, and starts a new
    producer (init_transactions) after a fatal error."""

    def __init__(self, bootstrap, args, deadline):
        super().__init__(daemon=True)
        self.bootstrap, self.args, self.deadline = bootstrap, args, deadline
        self.stop = threading.Event()
        self.committed_txns = 0
        self.aborted_txns = 0
        self.restarts = 0
        self.dropped_batches = 0
        self.gaps = 0
        self.skipped = 0
        self.expected = {}
        self.rebalanced = False
        self.error = None
        # What each transaction carried and how it ended, printed when the
        # output is not exactly once: (time, {partition: (first, last)} of
        # the input it transformed, the offsets it sent, outcome).
        self.journal = []

    def producer(self):
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "transformer",
                      "transaction.timeout.ms": 10000, "linger.ms": 5,
                      "socket.timeout.ms": 5000, "message.timeout.ms": 9000,
                      "log.connection.close": False, **NO_REBOOTSTRAP})
        while True:
            try:
                p.init_transactions(30)
                return p
            except KafkaException as e:
                if self.stop.is_set() or self.deadline.left() < 30:
                    raise
                time.sleep(0.5)

    def rewind(self, c):
        """Seeks each assigned partition to the group's committed offset,
        the next input offset to transform."""
        for tp in c.assignment():
            committed = retried("the group's committed offsets", self.deadline,
                                lambda: c.committed([tp], timeout=10))[0]
            at = committed.offset if committed.offset >= 0 else 0
            self.expected[tp.partition] = at
            c.seek(TopicPartition(tp.topic, tp.partition, at))

    def take(self, msgs):
        """The messages of `msgs` that continue each partition's input
        where the last committed transaction (or rewind) left it, and the
        span of input offsets they cover per partition, (first, last);
        `None` when a message leaves a gap (the consumer is not where the
        group's offsets are: the batch is dropped and the consumer
        rewound). Messages below a partition's next offset were
        transformed already and are skipped."""
        batch, spans = [], {}
        for m in msgs:
            part, off = m.partition(), m.offset()
            want = spans[part][1] + 1 if part in spans else self.expected.get(part)
            if want is not None and off < want:
                self.skipped += 1
                continue
            if want is not None and off > want:
                return None, None
            batch.append(m)
            spans[part] = (spans.get(part, (off, off))[0], off)
        return batch, spans

    def run(self):
        try:
            self.loop()
        except Exception as e:  # noqa: BLE001 — reported to the main thread
            self.error = e

    def loop(self):
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "transformer",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
                      "log.connection.close": False, **NO_REBOOTSTRAP})
        # The input is contiguous (one idempotent producer, no
        # transactions), so the transformer can hold the consumer to the
        # group's committed offsets exactly: a rebalance (a broker restart
        # forgets the group's members) can land inside consume(), whose
        # batch may then mix messages of the old assignment with the new
        # one's, and position() answers for the new one (or -1001, which
        # send_offsets_to_transaction leaves out: the output would be
        # committed without its offsets). Such a batch, and one that does
        # not continue where the committed offsets are, is dropped and the
        # consumer rewound; every transaction commits the offsets of
        # exactly the messages it transformed.
        def rebalanced(_consumer, _partitions):
            self.rebalanced = True
        c.subscribe(["pipeline-in"], on_assign=rebalanced, on_revoke=rebalanced,
                    on_lost=rebalanced)
        p = self.producer()
        while not self.stop.is_set():
            self.rebalanced = False
            msgs = [m for m in c.consume(self.args.pipeline_batch, 0.5) if not m.error()]
            if self.rebalanced and msgs:
                self.dropped_batches += 1
                self.rewind(c)
                continue
            msgs, spans = self.take(msgs)
            if msgs is None:
                self.gaps += 1
                # A gap that rewinding does not close is the input's own:
                # a message the broker lost.
                if self.gaps > 100:
                    raise RuntimeError(f"the input has a gap: after {self.expected}")
                self.rewind(c)
                continue
            if not msgs:
                continue
            # The offsets to commit: each partition's next input offset.
            sent = [(part, last + 1) for part, (_, last) in sorted(spans.items())]
            offsets = [TopicPartition("pipeline-in", part, at) for part, at in sent]
            try:
                p.begin_transaction()
                for m in msgs:
                    p.produce("pipeline-out", value=b"out:" + m.value(), partition=m.partition())
                p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 30)
                p.commit_transaction(30)
                self.committed_txns += 1
                self.expected.update(sent)
                self.journal.append((time.time(), spans, sent, "committed"))
            except KafkaException as e:
                err = e.args[0]
                self.journal.append((time.time(), spans, sent, err.str()))
                if err.txn_requires_abort():
                    try:
                        p.abort_transaction(30)
                    except KafkaException:
                        pass
                    self.aborted_txns += 1
                elif err.fatal() or not err.retriable():
                    self.restarts += 1
                    p = self.producer()
                else:
                    # A retriable error of commit: whether it committed is
                    # unknown; a new producer (init_transactions) finishes it.
                    self.restarts += 1
                    p = self.producer()
                self.rewind(c)
        c.close()


class Churn(threading.Thread):
    """Rebalances the transformer's group `count` times: a second member
    joins, holds its share of the input for a moment without committing,
    and leaves; each join and each leave is a rebalance of the
    transformer."""

    def __init__(self, bootstrap, count, deadline):
        super().__init__(daemon=True)
        self.bootstrap, self.count, self.deadline = bootstrap, count, deadline
        self.stop = threading.Event()

    def run(self):
        for _ in range(self.count):
            if self.stop.wait(random.uniform(0.5, 3.0)) or self.deadline.left() < 60:
                return
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "transformer",
                          "isolation.level": "read_committed", "enable.auto.commit": False,
                          "session.timeout.ms": 6000, "log.connection.close": False})
            c.subscribe(["pipeline-in"])
            t0 = time.monotonic()
            while time.monotonic() - t0 < random.uniform(0.5, 2.0) and not self.stop.is_set():
                c.poll(0.1)
            c.close()


def explain(inputs, out, journal, partitions):
    """Prints, for the input messages not exactly once in the output, where
    each copy is and which of the transformer's transactions carried them
    (input message i is offset i // partitions of partition i % partitions:
    one idempotent producer wrote them in order): a copy from a committed
    transaction whose offsets did not cover it points at the offsets, one
    from a transaction that did not commit at the broker's aborts."""
    at = {}
    for part, off, v in out:
        at.setdefault(v, []).append((part, off))
    odd = [i for i, v in enumerate(inputs) if len(at.get(b"out:" + v, [])) != 1]
    print(f"  not exactly once: {len(odd)} input messages, the first of them:")
    for i in odd[:5]:
        part, off = i % partitions, i // partitions
        carried = [e for e in journal if part in e[1] and e[1][part][0] <= off <= e[1][part][1]]
        print(f"    {inputs[i]!r} (input {part}/{off}) at {at.get(b'out:' + inputs[i], [])} "
              f"of pipeline-out; carried by {[(round(e[0], 3), e[3]) for e in carried]}")
    print("  the transformer's transactions (time, input spans, offsets sent, outcome):")
    for e in journal:
        print(f"    {e[0]:.3f} {e[1]} {e[2]} {e[3]}")


def pipeline(args, bootstrap_proxy, broker, deadline):
    n = args.pipeline_messages
    p = Producer({"bootstrap.servers": f"127.0.0.1:{broker.port}", "enable.idempotence": True})
    inputs = [b"in-%06d" % i for i in range(n)]
    for i, v in enumerate(inputs):
        p.produce("pipeline-in", value=v, partition=i % args.partitions)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)
    t = Transformer(bootstrap_proxy, args, deadline)
    t.start()
    churn = Churn(f"127.0.0.1:{broker.port}", args.pipeline_churn, deadline)
    churn.start()
    kills = 0
    t0 = time.monotonic()
    for k in range(args.pipeline_kills):
        time.sleep(random.uniform(1.0, 4.0))
        broker.kill9()
        kills += 1
        time.sleep(random.uniform(0.1, 1.0))
        broker.start()
    # Done when the group has committed every input message.
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{broker.port}", "group.id": "transformer-watch"})
    tps = [TopicPartition("pipeline-in", i) for i in range(args.partitions)]
    ends = {tp.partition: retried("the input's end", deadline,
                                  lambda: c.get_watermark_offsets(tp, timeout=10))[1] for tp in tps}
    done = False
    while not done and t.is_alive():
        deadline.check("waiting for the pipeline")
        time.sleep(1)
        watch = Consumer({"bootstrap.servers": f"127.0.0.1:{broker.port}", "group.id": "transformer"})
        committed = retried("the group's committed offsets", deadline,
                            lambda: watch.committed(tps, timeout=10))
        watch.close()
        done = all(tp.offset == ends[tp.partition] for tp in committed)
        if int(time.monotonic() - t0) % 10 == 0:
            print(f"  ... committed offsets {[tp.offset for tp in committed]} of {ends}, "
                  f"transactions {t.committed_txns} committed, {t.aborted_txns} aborted, "
                  f"{t.restarts} restarts", flush=True)
    t.stop.set()
    churn.stop.set()
    t.join(60)
    churn.join(60)
    c.close()
    elapsed = time.monotonic() - t0
    if t.error:
        return [f"pipeline: the transformer failed: {t.error!r}"]
    out = read_all(f"127.0.0.1:{broker.port}", "pipeline-out", args.partitions, "read_committed", deadline)
    vals = [v for _, _, v in out]
    want = sorted(b"out:" + v for v in inputs)
    dups = len(vals) - len(set(vals))
    ok = sorted(vals) == want
    print(f"[pipeline] {n} messages through the transformer in {elapsed:.1f}s: {t.committed_txns} "
          f"transactions committed, {t.aborted_txns} aborted, {t.restarts} producer restarts, "
          f"{t.dropped_batches} batches dropped at a rebalance, {t.gaps} at a gap, "
          f"{t.skipped} messages skipped as transformed already, "
          f"{kills} broker kills; committed output {len(vals)}, duplicates {dups}: exactly once: {ok}")
    problems = []
    if not ok:
        missing = len(set(want) - set(vals))
        problems.append(f"pipeline: {missing} input messages missing from the output, {dups} twice")
        explain(inputs, out, t.journal, args.partitions)
    if not done:
        problems.append("pipeline: the group never committed the whole input")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--transactions", type=int, default=60)
    ap.add_argument("--per-txn", type=int, default=20)
    ap.add_argument("--pipeline-messages", type=int, default=5000)
    ap.add_argument("--pipeline-kills", type=int, default=3)
    ap.add_argument("--pipeline-churn", type=int, default=0,
                    help="times a second member joins and leaves the transformer's group")
    ap.add_argument("--pipeline-batch", type=int, default=50, help="messages per transaction at most")
    ap.add_argument("--produce-drop", type=float, default=0.05)
    ap.add_argument("--random-drop", type=float, default=0.01)
    ap.add_argument("--pipeline-only", action="store_true", help="run the pipeline check alone")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    random.seed(args.seed)
    print(f"seed={args.seed}")
    deadline = Deadline(args.timeout)
    work = os.path.join(args.work, "txn")
    os.makedirs(work, exist_ok=True)
    bport, pport = free_port(), free_port()
    broker = Broker(args.broker, os.path.join(work, "data"), bport, f"127.0.0.1:{pport}",
                    args.partitions, work)
    broker.extra = ["--group.initial.rebalance.delay.ms", "300"]
    stats = os.path.join(work, "proxy-stats")
    proxy = None
    problems = []
    try:
        broker.start(advertise=f"127.0.0.1:{bport}")
        direct = f"127.0.0.1:{bport}"
        if not args.pipeline_only:
            problems += transactions(args, direct, deadline)
            problems += fencing(direct, deadline)
            problems += timeout(direct, deadline)
        broker.stop()
        broker.start()
        proxy = start_proxy(args.proxy, pport, bport, args.seed, stats, args.produce_drop, args.random_drop)
        problems += pipeline(args, f"127.0.0.1:{pport}", broker, deadline)
        ps = proxy_stats(stats)
        print(f"  proxy: dropped connections={int(ps.get('random_drops', 0)) + int(ps.get('produce_drops', 0))} "
              f"(after a produce: {ps.get('produce_drops', 0)}) split_writes={ps.get('splits', 0)}")
    finally:
        if proxy:
            proxy.kill()
        if broker.proc and broker.proc.poll() is None:
            broker.proc.kill()
    if problems:
        print("FAIL:")
        for p in problems:
            print(f"  {p}")
        sys.exit(1)
    print("PASS: transactions, fencing, timeouts and the exactly-once pipeline")


if __name__ == "__main__":
    main()
