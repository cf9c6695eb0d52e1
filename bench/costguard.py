"""Python function calls per message on the broker's hot paths: a cost CI can guard without a clock.

``python -m bench.costguard [--check | --update] [--rounds N]``

Why calls, not time: the single node lost ~30 % of its speed over ~190 commits and nobody
noticed, because CI cannot time anything on a shared 2-core VM whose CPU time moves 10-30 %
with hypervisor steal (issue 25). The number of Python function calls (and C functions called
from Python) the broker makes per message is a proxy for its CPU cost that does not move with
the machine's load: the same bytes in, the same batches, the same calls. CPython's own
pyperformance suite and Mercurial's perf guards count instructions for the same reason;
counting calls needs no valgrind.

How: a real ``Node`` (router, device logs, commit log) is started in this process, and real
``Connection`` objects are fed bytes directly (as ``bench/inproc.py`` does): each round writes
``BATCH`` PUBLISH packets in one read, waits until they are durable (logged workloads), then
feeds the subscribers' acks in one read. The socket is a list. Batching is therefore the same
in every run. ``sys.setprofile`` counts "call" and "c_call" events on the event loop's thread
only (the fsync worker's thread is not counted: its work is one syscall per batch) while the
measured rounds run; the count divided by messages is the cost.

Workloads (each a fixed script):

- ``qos0``: 1 publisher -> 1 subscriber, QoS 0, a topic that is not logged: each read is one
  run of one topic, routed once (broker/publishrun.py), as the bench's qos0 is.
- ``qos0mix``: ``qos0`` with two topics alternating in each read: no run forms, every message
  takes the per-packet path (``_on_publish`` -> ``route`` -> ``_write_qos0``), the path of a
  device that publishes seldom or several topics at once.
- ``qos1``: 1 publisher -> 1 subscriber, QoS 1 on a device topic: logged, fsynced, acked.
- ``fanout``: 1 publisher -> 50 subscribers of one QoS 0 topic (the cost is per *delivery*).
- ``catchup``: ``qos1`` with the subscriber behind: its queue holds ``CATCHUP_QUEUE`` and its
  window ``CATCHUP_WINDOW`` messages, so most of each round's 100 go to the log, and the session
  reads them back from there as its acks free the window (broker/catchup.py). This is what the
  bench's qos1 subscriber does once a group-commit batch outruns the queue (issue 25: the
  catch-up read cost ~10 % more per message than a live delivery, unguarded).
- ``crossing``: a mesh crossing (issue 25): two routers of one cluster node (``routers = 2``,
  static placement) started in this process on one event loop, linked by their real mesh link
  (loopback TCP, the real handshake, frames and window); 1 QoS 0 publisher on router 0 -> 1
  subscriber on router 1, so every message is parsed and routed on router 0, crosses the link
  as a DELIVER entry (encode, window, ACK) and is decoded, routed and written on router 1.
  Both routers' work is counted (one thread); ``crossing`` minus ``qos0`` is what a crossing
  adds on top of a local delivery, printed as such (router 0 routes each read as a run and
  forwards it as one, ``Forwarder.forward_run``, as ``qos0`` routes it).

The budget (``bench/cost_budget.json``) holds the accepted cost of each; ``--check`` fails
(exit 1) naming each workload whose count rose more than ``TOLERANCE`` above it; a change that
raises a cost on purpose runs ``--update`` and commits the new budget with the reason, in the
same commit (a drop is welcome and also updated, so the next rise is measured from there).
``tests/bench/test_cost_guard.py`` runs ``--check`` in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import uvloop

from bench import mqttpkt as P
from bench.brokers import meshmq_config
from bench.inproc import ListTransport, pubacks
from broker.connection import Connection
from meshmq.config import load_config
from meshmq.node import Node

BUDGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cost_budget.json")
TOLERANCE = 0.10  # a rise above 10 % fails: well above the run-to-run spread (see _spread)
BATCH = 100
FANOUT = 50
WORKLOADS = ("qos0", "qos0mix", "qos1", "fanout", "catchup", "crossing")
CATCHUP_QUEUE = 10  # catchup: a queue and a window far below the round's 100 messages
CATCHUP_WINDOW = 20
TOPIC_QOS0 = "bench/cost/telemetry"  # bench/# is not logged (brokers.meshmq_config)
TOPIC_QOS0_B = "bench/cost/status"  # qos0mix's second topic


class GuardTransport(ListTransport):
    """A ``ListTransport`` that closes like a socket (the router's drain waits for
    ``connection_lost``: without it every node's stop waited the drain's full 5 s) and can
    tell a waiter once ``bytes_out`` bytes were written (the crossing's sentinel: no polling
    loop, whose iterations would vary with the machine's load, runs while counting)."""

    def __init__(self, protocol: Any) -> None:
        super().__init__()
        self.protocol = protocol
        self.bytes_out = 0
        self.target = 0
        self.reached: asyncio.Future | None = None
        self.failed = ""  # why the watchdog gave up (then every wait fails at once)

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))
        self.bytes_out += len(data)
        if self.reached is not None and self.bytes_out >= self.target:
            self.reached.set_result(None)
            self.reached = None

    def wait_for(self, total: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if self.failed:
            fut.set_exception(SystemExit(self.failed))
        elif self.bytes_out >= total:
            fut.set_result(None)
        else:
            self.target, self.reached = total, fut
        return fut

    def give_up(self, why: str) -> None:
        """The watchdog: a waiter that would wait for ever (messages lost) fails instead."""
        self.failed = why
        if self.reached is not None:
            self.reached.set_exception(SystemExit(why))
            self.reached = None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    abort = close


def _client(node: Node) -> tuple[Connection, GuardTransport]:
    conn = Connection(node.router, node.stats.listener("tcp"), node.stats)
    t = GuardTransport(conn)
    conn.connection_made(t)
    return conn, t


async def _until(ready: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Set-up waits (never while counting): generous, for a loaded CI box."""
    for _ in range(int(timeout / 0.005)):
        if ready():
            return
        await asyncio.sleep(0.005)
    raise SystemExit(f"{what} after {timeout:.0f} s")


class CallCounter:
    """Counts, on this thread while active, Python and C function calls (``sys.setprofile``)
    and Python bytecode instructions executed (``sys.settrace`` with opcode events): calls
    catch a new layer of indirection, instructions catch work added inline."""

    def __init__(self) -> None:
        self.calls = 0
        self.instructions = 0

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.instructions += 1
        return self._local

    def __enter__(self) -> CallCounter:
        sys.setprofile(self._profile)
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        sys.setprofile(None)


async def _drive(node: Node, workload: str, rounds: int) -> tuple[CallCounter, int]:
    """Run ``rounds`` measured rounds (after warm-up rounds); returns (counts, messages)."""
    def connection() -> tuple[Connection, GuardTransport]:
        return _client(node)

    qos = 1 if workload in ("qos1", "catchup") else 0
    topic = "devices/cost-0001/telemetry" if qos else TOPIC_QOS0
    topics = (TOPIC_QOS0, TOPIC_QOS0_B) if workload == "qos0mix" else (topic,)
    nsubs = FANOUT if workload == "fanout" else 1
    subs = []
    for i in range(nsubs):
        conn, t = connection()
        conn.data_received(P.connect(f"cost-sub-{i}"))
        conn.data_received(P.subscribe(1, [(t_, qos) for t_ in topics]))
        subs.append((conn, t))
    pub, pub_t = connection()
    pub.data_received(P.connect("cost-pub"))
    # CONNECT completes asynchronously (session store, auth): wait for every CONNACK and
    # SUBACK, never a fixed sleep (a loaded machine takes longer, and publishes sent before
    # the CONNACK would wait in the connection's pending list, changing the counts)
    for _ in range(2000):
        if pub_t.out and all(b"".join(t.out).count(b"\x90") for _c, t in subs):
            break
        await asyncio.sleep(0.005)
    else:
        raise SystemExit(f"{workload}: clients not connected and subscribed after 10 s")
    for _conn, t in subs:
        t.out.clear()
    if qos:
        ring, size = P.publish_ring(topic, b"x" * 64, qos)
    else:  # QoS 0 packets carry no id: one batch, the same every round (qos0mix: the two
        # topics alternate, so no run of one topic forms and each packet takes the per-packet
        # path, broker/publishrun.py)
        ring, size = b"".join(P.publish(topics[i % len(topics)], b"x" * 64, 0)
                              for i in range(BATCH * 2)), 0
    pos = 0

    async def one_round() -> None:
        nonlocal pos
        if qos:
            pub.data_received(ring[pos * size:(pos + BATCH) * size])
            pos = (pos + BATCH) % 65535
        else:
            pub.data_received(ring[:len(ring) // 2])
        await asyncio.sleep(0)
        if qos:
            await node.committer.wait_durable()
            await asyncio.sleep(0)
        if behind is not None:
            behind.append(bool(node.router.catchup.lagging))
        for conn, t in subs:
            while t.out:
                data = b"".join(t.out)
                t.out.clear()
                if qos:
                    conn.data_received(pubacks(data))
                    await asyncio.sleep(0)
        pub_t.out.clear()

    # catchup's premise, checked in the warm-up (not counted): the subscriber is behind, on the
    # log, every round (else that workload measures qos1 again)
    behind: list[bool] | None = [] if workload == "catchup" else None
    for _ in range(max(5, rounds // 5)):  # warm-up: caches, first-use paths, interning
        await one_round()
    if behind is not None:
        if not all(behind):
            raise SystemExit(f"catchup: the subscriber fell behind in {sum(behind)} of "
                             f"{len(behind)} warm-up rounds, not all: the workload lost its "
                             "premise")
        behind = None
    before = node.stats.messages_out
    with CallCounter() as counter:
        for _ in range(rounds):
            await one_round()
    delivered = node.stats.messages_out - before
    expected = rounds * BATCH * nsubs
    if delivered != expected:
        raise SystemExit(f"{workload}: delivered {delivered} messages, expected {expected}")
    return counter, expected


async def _drive_crossing(a: Node, b: Node, rounds: int) -> tuple[CallCounter, int]:
    """Publisher on router ``a``, subscriber on router ``b``: every message crosses the link.
    Each round: ``BATCH`` QoS 0 PUBLISH packets in one read at ``a``, then a wait (one future,
    no polling) until ``b`` wrote them all to its subscriber."""
    peer = b.mesh.rid
    await _until(lambda: a.mesh.links[peer].state == "up"
                 and b.mesh.links[a.mesh.rid].state == "up", "crossing: mesh link not up")
    sub, sub_t = _client(b)
    sub.data_received(P.connect("cost-sub-0"))
    sub.data_received(P.subscribe(1, [(TOPIC_QOS0, 0)]))
    pub, pub_t = _client(a)
    pub.data_received(P.connect("cost-pub"))
    # the SUBACK, the CONNACK, and b's route for the filter known at a (a ROUTES frame)
    await _until(lambda: bool(pub_t.out) and b"\x90" in b"".join(sub_t.out)
                 and bool(a.mesh.routes.peers_for(TOPIC_QOS0)),
                 "crossing: clients not connected or the route not known at the publisher's")
    sub_t.out.clear()
    link = a.mesh.links[peer]
    batch = P.publish(TOPIC_QOS0, b"x" * 64, 0) * BATCH
    per_message = 0

    async def one_round() -> None:
        nonlocal per_message
        start, delivered = sub_t.bytes_out, b.stats.messages_out
        pub.data_received(batch)
        if not per_message:  # the first warm-up round learns the size of one delivery
            await _until(lambda: b.stats.messages_out - delivered >= BATCH,
                         "crossing: nothing delivered across the link")
            await asyncio.sleep(0.01)  # its last write (the router flushes once per tick)
            per_message = (sub_t.bytes_out - start) // BATCH
        await sub_t.wait_for(start + per_message * BATCH)
        sub_t.out.clear()
        pub_t.out.clear()

    # one timer for the whole run, not a timeout per round (that would be counted): a message
    # lost on the way (none may be, on a healthy link) fails the guard instead of hanging it
    watchdog = asyncio.get_running_loop().call_later(300, lambda: sub_t.give_up(
        f"crossing: messages not delivered across the link within 300 s (delivered "
        f"{b.stats.messages_out}, link {link.stats})"))
    try:
        for _ in range(max(5, rounds // 5)):
            await one_round()
        await _until(lambda: not link.inflight, "crossing: warm-up entries never acknowledged")
        before = b.stats.messages_out
        with CallCounter() as counter:
            for _ in range(rounds):
                await one_round()
            while link.inflight:  # the last round's ACK, counted like every other round's
                await asyncio.sleep(0)
    finally:
        watchdog.cancel()
    delivered = b.stats.messages_out - before
    expected = rounds * BATCH
    if delivered != expected or link.stats["msgs_out"] < expected:
        raise SystemExit(f"crossing: delivered {delivered} messages, expected {expected} "
                         f"(link entries sent: {link.stats['msgs_out']})")
    return counter, expected


def _crossing_config(work: str) -> str:
    """One node, ``routers = 2`` meshing on loopback (the config each router runs is made by
    ``router_config``, as the supervisor's routers do); static placement: no Raft process."""
    from bench.cluster import free_port_range  # (not imported by the single-node workloads)

    return meshmq_config(os.path.join(work, "data"), 0, 0) + "\n".join([
        "", "[cluster]", 'name = "costguard"', "routers = 2", 'secret = "costguard-secret"',
        'placement = "static"', f"port = {free_port_range(2)}", ""])


async def measure(workload: str, rounds: int, data_dir: str | None) -> dict[str, float]:
    """Calls and instructions per message (per delivery for fan-out), on a fresh node (two
    routers of one for the crossing)."""
    from meshmq.router_proc import router_config

    work = tempfile.mkdtemp(dir=data_dir, prefix=f"costguard-{workload}-")
    try:
        path = os.path.join(work, "meshmq.toml")
        with open(path, "w") as f:
            text = meshmq_config(os.path.join(work, "data"), 0, 0)
            if workload == "catchup":
                text = text.replace("max_inflight = 100", f"max_inflight = {CATCHUP_WINDOW}\n"
                                    f"max_queued_messages = {CATCHUP_QUEUE}")
            f.write(_crossing_config(work) if workload == "crossing" else text)

        config = load_config(path, {})
        nodes = ([Node(router_config(config, r), r) for r in range(2)]
                 if workload == "crossing" else [Node(config)])
        try:
            for node in nodes:
                await node.start()
            if workload == "crossing":
                counter, messages = await _drive_crossing(nodes[0], nodes[1], rounds)
            else:
                counter, messages = await _drive(nodes[0], workload, rounds)
        finally:
            for node in nodes:
                await node.stop()
        return {"calls": round(counter.calls / messages, 1),
                "instructions": round(counter.instructions / messages, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


Costs = dict[str, dict[str, float]]  # workload -> {"calls": n, "instructions": n} per message


def measure_all(workloads: tuple[str, ...] = WORKLOADS, rounds: int = 20,
                data_dir: str | None = None) -> Costs:
    return {w: uvloop.run(measure(w, rounds, data_dir)) for w in workloads}


def load_budget(path: str = BUDGET) -> Costs:
    with open(path) as f:
        return {w: {k: float(v) for k, v in c.items()}
                for w, c in json.load(f)["per_message"].items()}


def over_budget(costs: Costs, budget: Costs, tolerance: float = TOLERANCE) -> list[str]:
    """One line per workload and count that rose more than ``tolerance`` above its budget."""
    out = []
    for w, cost in costs.items():
        for kind, value in cost.items():
            limit = budget.get(w, {}).get(kind)
            if limit is None:
                out.append(f"{w}: {value:.1f} {kind} per message, no budget in {BUDGET} "
                           "(run python -m bench.costguard --update)")
            elif value > limit * (1 + tolerance):
                out.append(f"{w}: {value:.1f} {kind} per message, budget {limit:.1f} "
                           f"(+{(value / limit - 1) * 100:.0f} %, more than {tolerance:.0%}): "
                           "a hot-path change made every message dearer; if that is on "
                           "purpose, run python -m bench.costguard --update and commit the "
                           "budget with the reason")
    return out


def write_budget(costs: Costs, path: str = BUDGET) -> None:
    doc = {"about": "Python function calls and bytecode instructions per message (fan-out: "
                    "per delivery), counted by python -m bench.costguard on a fixed in-process "
                    f"workload; CI fails when one rises more than {TOLERANCE:.0%} above its "
                    "budget. Update with --update, in the commit that raises (or lowers) it, "
                    "saying why.",
           "per_message": costs}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")


def main(argv: list[str] | None = None, report: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.costguard",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the budget; exit 1 over it")
    ap.add_argument("--update", action="store_true", help="write the measured costs as budget")
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds of 100 messages")
    ap.add_argument("--workload", action="append", choices=WORKLOADS,
                    help="measure only these (default: all)")
    ap.add_argument("--data-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args(argv)
    workloads = tuple(args.workload or WORKLOADS)
    costs = measure_all(workloads, args.rounds, args.data_dir)
    budget = load_budget() if os.path.exists(BUDGET) else {}
    for w, c in costs.items():
        b = budget.get(w, {})
        report(f"{w}: " + ", ".join(
            f"{v:.1f} {k}" + (f" (budget {b[k]:.1f})" if k in b else "")
            for k, v in sorted(c.items())) + " per message")
    if "crossing" in costs and "qos0" in costs:  # issue 25: what a crossing adds
        local = costs["qos0"]
        report("a crossing adds, over a local QoS 0 delivery: " + ", ".join(
            f"{costs['crossing'][k] - local[k]:.1f} {k}" for k in sorted(local)))
    if args.update:
        write_budget({**budget, **costs})
        report(f"budget written to {BUDGET}")
        return 0
    if args.check:
        bad = over_budget(costs, budget)
        for line in bad:
            report("OVER BUDGET " + line)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
