"""Bytes the broker allocates per idle client connection, counted by ``tracemalloc``: a memory
cost CI can guard without reading RSS.

``python -m bench.idlemem [--connections N] [--top K] [--check]``

Why: the bench's ``idle`` workload weighs the broker's RSS with 10,000 idle connections (issue
25: 4.62 KiB each, Mosquitto 0.72). RSS is the figure users see, but it moves with the
allocator's arenas and with whatever else the process did; what each connection *holds* does
not. Here a real ``Node`` runs in this process on a real loopback listener, a child process
opens N real TCP connections and sends each an MQTT 3.1.1 CONNECT (clean session, keep-alive 0:
what ``bench/loadgen.py``'s storm sends) and waits for every CONNACK, and ``tracemalloc``
compares the heap before and after: the difference divided by N is the cost of one idle
connection, Python objects and uvloop's transport and libuv handle alike (uvloop allocates
its handles with ``PyMem_RawMalloc``, which tracemalloc traces). 200 connections opened and
closed first take the first-use costs out. The same bytes in give the same objects, so the
figure repeats to a few bytes on a loaded 2-core box.

``--check`` exits 1 when the cost is above ``BUDGET_BYTES`` and prints the allocation sites
that hold the most per connection (``--top``): ``tests/bench/test_idle_memory.py`` runs it in
CI. Lowering the cost: lower the budget in the same commit, so the next rise is caught from
there.

Breakdown on 2026-11-26 (10,000 connections; issue 25), bytes per connection. Before: 4,964
in all: the ``Connection``'s instance dict 1,584; uvloop's transport (680), libuv handle (248),
context and cached ``data_received`` 1,092 with its weak-value entry 118; the session's
``DeliveryQueue`` (a deque allocates its first 64-slot block at once) 768; the ``Session`` 208
and its five empty dicts 320; the CONNECT packet the protocol kept, with its protocol name,
157; the parser, its empty bytearray and the alias dict 200; peer strings 122; the router's
set entry 52. After the first issue-25 change: 2,591 (``Connection`` slots 312; the queue,
the parser's buffer and the alias dict made on first use; the CONNECT dropped once handled).
After the second: 2,157 (the session's five maps shared empty until written, the write list
made by the first write after a flush, the peer's host computed when asked). Of what is
left, 1,210 is uvloop's and libuv's; ours: ``Connection`` 312, ``Session`` 208, the protocol
and its parser 152, the peer and client id strings 122, two floats, the epoch and the
router's set and dict entries.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import tracemalloc

import uvloop

from bench.brokers import free_port, meshmq_config
from meshmq.config import load_config
from meshmq.node import Node

# Traced bytes per idle connection: measured 2,180.0 at 2,000 connections (the same to 0.1
# byte run after run), ~1,200 of them uvloop's and libuv's. Tight on purpose: the bench's
# idle figure is 1.94 KiB of RSS against issue 25's 2 KiB, so one more empty dict (+64) or
# list (+56) per connection must fail here (2,230: 50 bytes of headroom, for a slot or two).
BUDGET_BYTES = 2230
WARMUP = 200

# The client side, in its own process so that its allocations are not traced: N sockets, each
# sends CONNECT and reads its CONNACK (64 handshakes in flight, as the bench's storm), then
# "ready" and hold until stdin closes.
_CLIENT = r'''
import socket, sys
from bench import mqttpkt as mp
port, n, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks = []
def settle(group):
    for s in group:
        got = s.recv(4)
        if len(got) < 2 or got[0] != 0x20:
            sys.exit(f"bad CONNACK {got!r}")
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(mp.connect(f"{tag}-{i}"))
    socks.append(s)
    if len(socks) % 64 == 0:
        settle(socks[-64:])
settle(socks[len(socks) - len(socks) % 64:])
print("ready", flush=True)
sys.stdin.read()
'''


def _raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256:
        if hard != resource.RLIM_INFINITY and hard < n + 256:
            raise SystemExit(f"RLIMIT_NOFILE hard limit {hard} is below {n + 256}: "
                             "ask for fewer --connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, hard))


async def _clients(port: int, n: int, tag: str) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, str(port), str(n), tag,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        preexec_fn=lambda: _raise_fd_limit(n))
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=max(120.0, n / 50))
    if line.strip() != b"ready":
        proc.kill()
        await proc.wait()
        raise SystemExit(f"the client process did not connect its {n} clients: {line!r}")
    return proc


async def _close(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), timeout=30)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _wait_connections(node: Node, n: int) -> None:
    for _ in range(3000):  # the CONNACKs were read, but wait on the broker's own count too
        if len(node.router.connections) == n and len(node.router.sessions) == n:
            return
        await asyncio.sleep(0.01)
    raise SystemExit(f"broker holds {len(node.router.connections)} connections and "
                     f"{len(node.router.sessions)} sessions, expected {n}")


async def measure(n: int, top: int) -> tuple[float, list[str]]:
    """(traced bytes per idle connection, the ``top`` allocation sites by bytes per connection)."""
    _raise_fd_limit(n + WARMUP)
    work = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                            prefix="idlemem-")
    try:
        path = os.path.join(work, "meshmq.toml")
        with open(path, "w") as f:
            port = free_port()
            f.write(meshmq_config(os.path.join(work, "data"), port, free_port()))
        node = Node(load_config(path, {}))
        await node.start()
        try:
            warm = await _clients(port, WARMUP, "warm")
            await _wait_connections(node, WARMUP)
            await _close(warm)
            await _wait_connections(node, 0)
            gc.collect()
            tracemalloc.start(1)
            try:
                before = tracemalloc.take_snapshot()
                proc = await _clients(port, n, "idle")
                try:
                    await _wait_connections(node, n)
                    await asyncio.sleep(0.2)  # let the last CONNACK flushes finish
                    gc.collect()
                    after = tracemalloc.take_snapshot()
                finally:
                    await _close(proc)
            finally:
                tracemalloc.stop()
        finally:
            await node.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    own = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(own).compare_to(before.filter_traces(own), "lineno")
    total = sum(s.size_diff for s in stats)
    lines = [f"{s.size_diff / n:8.1f} B {s.count_diff / n:5.2f} blocks  {s.traceback[0]}"
             for s in stats[:top]]
    return total / n, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idlemem",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--top", type=int, default=15, help="allocation sites to print")
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 above the budget ({BUDGET_BYTES} bytes per connection)")
    args = ap.parse_args(argv)
    per_conn, lines = uvloop.run(measure(args.connections, args.top))
    print(f"{per_conn:.1f} bytes traced per idle connection ({args.connections} connections, "
          f"MQTT 3.1.1, clean session, keep-alive 0; budget {BUDGET_BYTES})")
    print("\n".join(lines))
    if args.check and per_conn > BUDGET_BYTES:
        print(f"OVER BUDGET idle connection: {per_conn:.1f} bytes traced per connection, budget "
              f"{BUDGET_BYTES}: something new is held per connection (see the sites above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
