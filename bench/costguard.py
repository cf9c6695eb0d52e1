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

- ``qos0``: 1 publisher -> 1 subscriber, QoS 0, a topic that is not logged.
- ``qos1``: 1 publisher -> 1 subscriber, QoS 1 on a device topic: logged, fsynced, acked.
- ``fanout``: 1 publisher -> 50 subscribers of one QoS 0 topic (the cost is per *delivery*).

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
WORKLOADS = ("qos0", "qos1", "fanout")


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
    listener = node.stats.listener("tcp")

    def connection() -> tuple[Connection, ListTransport]:
        conn = Connection(node.router, listener, node.stats)
        t = ListTransport()
        conn.connection_made(t)
        return conn, t

    qos = 1 if workload == "qos1" else 0
    topic = "devices/cost-0001/telemetry" if workload == "qos1" else "bench/cost/telemetry"
    nsubs = FANOUT if workload == "fanout" else 1
    subs = []
    for i in range(nsubs):
        conn, t = connection()
        conn.data_received(P.connect(f"cost-sub-{i}"))
        conn.data_received(P.subscribe(1, [(topic, qos)]))
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
    else:  # QoS 0 packets carry no id: one batch, the same every round
        ring, size = P.publish(topic, b"x" * 64, 0) * (BATCH * 2), 0
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
        for conn, t in subs:
            while t.out:
                data = b"".join(t.out)
                t.out.clear()
                if qos:
                    conn.data_received(pubacks(data))
                    await asyncio.sleep(0)
        pub_t.out.clear()

    for _ in range(max(5, rounds // 5)):  # warm-up: caches, first-use paths, interning
        await one_round()
    before = node.stats.messages_out
    with CallCounter() as counter:
        for _ in range(rounds):
            await one_round()
    delivered = node.stats.messages_out - before
    expected = rounds * BATCH * nsubs
    if delivered != expected:
        raise SystemExit(f"{workload}: delivered {delivered} messages, expected {expected}")
    return counter, expected


async def measure(workload: str, rounds: int, data_dir: str | None) -> dict[str, float]:
    """Calls and instructions per message (per delivery for fan-out), on a fresh node."""
    work = tempfile.mkdtemp(dir=data_dir, prefix=f"costguard-{workload}-")
    try:
        path = os.path.join(work, "meshmq.toml")
        with open(path, "w") as f:
            f.write(meshmq_config(os.path.join(work, "data"), 0, 0))
        node = Node(load_config(path, {}))
        await node.start()
        try:
            counter, messages = await _drive(node, workload, rounds)
        finally:
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
