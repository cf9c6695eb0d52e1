"""The controller on three real metadata processes (``python -m cluster.metaserver`` with the
node map, as the node supervisor starts them): when a node's voter is killed -9, the Raft
leader's controller moves the leadership of **all 2,000 logs** that node's router led to live
in-sync replicas **in one proposal** (Kafka's controller fails a broker's partitions over in one
batch too), at a bumped epoch with the dead router out of the ISR, naming the registered
incarnation of the router it chose. The time is printed (``-s``), not asserted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.broker import free_port, wait_for

from cluster.metaclient import MetadataClient, MetadataUnavailable

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
NODES = ("a", "b", "c")
LOGS = 2000


def _ask(sock: str, op: bytes) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock)
        s.sendall(op)
        return json.loads(s.makefile().readline())


class Voter:
    def __init__(self, base: Path, node: str, addrs: dict[str, str]) -> None:
        self.node = node
        self.dir = base / node
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock = str(self.dir / "meta.sock")
        (self.dir / "secret").write_text("test-secret")
        self.cmd = [sys.executable, "-m", "cluster.metaserver", "--self", addrs[node],
                    "--data-dir", str(self.dir / "data"), "--socket", self.sock,
                    "--secret-file", str(self.dir / "secret"), "--node-timeout", "1.0"]
        for n, a in addrs.items():
            self.cmd += ["--node", f"{n}={a}"]
            if n != node:
                self.cmd += ["--peer", a]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.dir / "stderr.log", "ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stderr=log, stdout=log)
        wait_for(lambda: os.path.exists(self.sock), timeout=30)

    def status(self) -> dict:
        return _ask(self.sock, b'{"op":"status","id":1}\n')["status"]

    def snapshot(self) -> dict:
        return _ask(self.sock, b'{"op":"watch"}\n')["snapshot"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def voter_groups(tmp_path: Path) -> Iterator[Callable[[], dict[str, Voter]]]:
    """Factory of groups of three voters (a fresh group per try), each stopped at the end."""
    made: list[dict[str, Voter]] = []

    def start() -> dict[str, Voter]:
        addrs = {n: f"127.0.0.1:{free_port()}" for n in NODES}
        group = {n: Voter(tmp_path / f"group{len(made)}", n, addrs) for n in NODES}
        made.append(group)
        for v in group.values():
            v.start()
        return group

    try:
        yield start
    finally:
        for group in made:
            for v in group.values():
                v.stop()


def _leader(group: dict[str, Voter]) -> str:
    found: list[str] = []

    def agreed() -> bool:
        try:
            seen = {v.status()["leader"] for v in group.values()
                    if v.proc is not None and v.proc.poll() is None}
        except (OSError, ValueError, KeyError):
            return False
        addr = seen.pop() if len(seen) == 1 else None
        found[:] = [n for n, v in group.items() if addr and v.cmd[4] == addr]
        return bool(found)
    wait_for(agreed, 60, message="the voters agree on a Raft leader")
    return found[0]


async def _propose_all(sock: str, cmds: list[list]) -> list:
    for _ in range(100):
        client = MetadataClient(sock)
        await client.connect()
        try:  # one loop tick: one batch (one JSON line), one Raft entry
            return list(await asyncio.wait_for(
                asyncio.gather(*(client.propose(c) for c in cmds)), 30))
        except (MetadataUnavailable, ConnectionError):  # compare-and-sets: retry harmless
            await asyncio.sleep(0.2)
        finally:
            await client.close()
    raise AssertionError("not committed")


def _fail_over(voters: dict[str, Voter]) -> tuple[dict | None, float, str]:
    """Kill a follower's voter and wait until the Raft leader's controller moved its logs;
    (the leader's controller stats, seconds taken, victim). Stats None: that voter no longer
    leads, so its controller (and its counters) stopped: nothing to measure on this group."""
    leader = _leader(voters)
    victim = next(n for n in NODES if n != leader)  # the controller itself survives
    sock = voters[leader].sock
    regs = [["register_router", f"{n}/0", f"{n}-inc1", {"kept_logs": True}] for n in NODES]
    assert all(applied for applied, _ in asyncio.run(_propose_all(sock, regs)))
    others = [f"{n}/0" for n in NODES if n != victim]
    creates = [["create_log", f"d{k}", f"{victim}/0", [f"{victim}/0", *others], f"{victim}-inc1"]
               for k in range(LOGS)]
    assert all(applied for applied, _ in asyncio.run(_propose_all(sock, creates)))
    before = voters[leader].status()["controller"]
    if before is None:
        return None, 0.0, victim
    assert before["proposals"] == 0, before

    voters[victim].proc.kill()
    voters[victim].proc.wait(5)
    killed = time.monotonic()

    def moved() -> bool:
        logs = voters[leader].snapshot()["logs"]
        return len(logs) == LOGS and all(r["leader"] != f"{victim}/0" for r in logs.values())
    wait_for(moved, 60, interval=0.02, message=f"all {LOGS} logs moved off {victim}/0")
    took = time.monotonic() - killed
    logs = voters[leader].snapshot()["logs"]
    for device, rec in logs.items():
        assert rec["epoch"] == 1 and rec["leader"] in others, (device, rec)
        assert f"{victim}/0" not in rec["isr"] and rec["leader"] in rec["isr"], (device, rec)
        assert rec["leader_incarnation"] == rec["leader"][0] + "-inc1", (device, rec)
    # a proposal's answer reaches the controller's counters just after the entry applied
    deadline = time.monotonic() + 10
    while True:
        stats = voters[leader].status()["controller"]
        if stats is None or stats["elections"] >= LOGS or time.monotonic() > deadline:
            return stats, took, victim
        time.sleep(0.02)


def test_a_dead_nodes_thousands_of_logs_fail_over_in_one_proposal(voter_groups) -> None:
    """Premise: the voter that leads Raft when the node dies still leads when the test reads
    its controller's counters. Applying 2,000 elections costs every voter CPU; on a loaded
    2-core box (two test workers) a follower once timed out meanwhile and took the lead 60 ms
    after the failover, which stopped the old controller and its counters (its log line said
    2,000 logs moved in one proposal). Such a group proves nothing either way: a fresh group
    tries again, up to three times."""
    tries: list[str] = []
    for _ in range(3):
        stats, took, victim = _fail_over(voter_groups())
        if stats is not None:
            break
        tries.append("the Raft leader changed during the failover")
    assert stats is not None, f"no group kept its Raft leader through the failover: {tries}"
    print(f"\n[failover] kill -9 of voter {victim}: {LOGS} logs re-led after {took:.2f} s "
          f"(node_timeout 1.0 s) in {stats['proposals']} proposal(s) ({len(tries)} retries)")
    assert stats["elections"] == LOGS, stats
    # one round for the whole node (a stale or failed proposal may add a retry, not thousands)
    assert stats["proposals"] <= 3, f"{LOGS} logs took {stats['proposals']} proposals"
    assert sorted(stats["alive"]) == sorted(n for n in NODES if n != victim), stats
