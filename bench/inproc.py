"""CPU per message of the broker's QoS 1 device path, in process and without sockets.

``python -m bench.inproc [--rounds N] [--repeats K] [--data-dir DIR]``

A real ``Node`` (router, device logs, commit log with fsync) is started, and two real
``Connection`` objects are fed bytes directly: each round is 100 QoS 1 PUBLISH packets in one
read, a wait until they are durable, then the subscriber's 100 PUBACKs in one read. The socket
transport is replaced by a list that keeps what the broker writes. Batching is therefore the
same in every run, so the cost per message does not move with scheduling, and under
``valgrind --tool=callgrind`` the instruction count is repeatable: that is how to A/B a hot-path
change on a VM whose wall and CPU times move 10-30% with hypervisor steal (measured 2026-11-22:
79.6k -> 63.9k instructions per message for the C parse loop and the C tail-cache trim).

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python -m bench.inproc --rounds 100 --repeats 1

Subtract a ``--rounds 1`` run to remove start-up. Prints main-thread CPU per message (the
fsync worker is not counted) for each repeat; includes this driver's own per-round work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import uvloop

from bench import mqttpkt as P
from bench.brokers import meshmq_config
from broker.connection import Connection
from meshmq.config import load_config
from meshmq.node import Node

TOPIC = "devices/bench-0001/telemetry"
BATCH = 100


class ListTransport:
    """Stands in for the socket: keeps what the broker writes."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.out.append(bytes(data))

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed


def pubacks(data: bytes) -> bytes:
    """One PUBACK per QoS 1 PUBLISH in ``data`` (short packets only, as this driver sends)."""
    out = []
    i = 0
    while i < len(data):
        b0, rl = data[i], data[i + 1]
        if b0 & 0xF0 == 0x30:
            tl = (data[i + 2] << 8) | data[i + 3]
            out.append(b"\x40\x02" + data[i + 4 + tl:i + 6 + tl])
        i += 2 + rl
    return b"".join(out)


async def run(rounds: int, repeats: int, data_dir: str) -> list[float]:
    work = tempfile.mkdtemp(dir=data_dir)
    path = os.path.join(work, "meshmq.toml")
    with open(path, "w") as f:
        f.write(meshmq_config(os.path.join(work, "data"), 0, 0))
    node = Node(load_config(path, {}))
    await node.start()
    try:
        listener = node.stats.listener("tcp")

        def connection() -> tuple[Connection, ListTransport]:
            conn = Connection(node.router, listener, node.stats)
            t = ListTransport()
            conn.connection_made(t)
            return conn, t

        sub, sub_t = connection()
        pub, pub_t = connection()
        sub.data_received(P.connect("inproc-sub"))
        sub.data_received(P.subscribe(1, [(TOPIC, 1)]))
        pub.data_received(P.connect("inproc-pub"))
        await asyncio.sleep(0.01)
        sub_t.out.clear()
        ring, size = P.publish_ring(TOPIC, b"x" * 64, 1)
        pos = 0
        costs = []
        for rep in range(repeats + 1):  # the first repeat warms up
            t0 = time.thread_time()
            for _ in range(rounds):
                pub.data_received(ring[pos * size:(pos + BATCH) * size])
                pos = (pos + BATCH) % 65535
                await asyncio.sleep(0)
                await node.committer.wait_durable()
                await asyncio.sleep(0)
                while sub_t.out:
                    data = b"".join(sub_t.out)
                    sub_t.out.clear()
                    sub.data_received(pubacks(data))
                    await asyncio.sleep(0)
                pub_t.out.clear()
            if rep:
                costs.append((time.thread_time() - t0) / (rounds * BATCH) * 1e6)
        delivered = node.stats.messages_out
        expected = (repeats + 1) * rounds * BATCH
        if delivered != expected:
            raise SystemExit(f"delivered {delivered} messages, expected {expected}")
        return costs
    finally:
        await node.stop()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.inproc", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=400, help="rounds of 100 messages per repeat")
    ap.add_argument("--repeats", type=int, default=5, help="measured repeats (after a warm-up)")
    ap.add_argument("--data-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="where the commit log goes (default /dev/shm: fsync costs nothing)")
    args = ap.parse_args()
    costs = uvloop.run(run(args.rounds, args.repeats, args.data_dir))
    print(f"us of main-thread CPU per QoS 1 message: min {min(costs):.2f}, median "
          f"{sorted(costs)[len(costs) // 2]:.2f} (repeats: "
          + " ".join(f"{c:.2f}" for c in costs) + ")")


if __name__ == "__main__":
    main()
