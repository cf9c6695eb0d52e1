"""The metadata process (issue 24, first part): three real ``python -m cluster.metaserver``
processes on loopback form a Raft group (pysyncobj, batch mode); routers' proposals go in
through each node's Unix socket; committed changes come out of every node's watch stream.

What must hold: a committed change is seen by every voter; a compare-and-set refused on a
stale epoch changes nothing; kill -9 of the Raft leader loses nothing committed and the
survivors commit again within seconds; a restarted voter catches up; all three stopped and
started again restore the state from their journals; the journal is fsynced (counted).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import free_port, wait_for

from cluster.metaclient import MetadataClient, MetadataUnavailable, Proposer, watch

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


class Voter:
    def __init__(self, base: Path, i: int, addrs: list[str]) -> None:
        self.i = i
        self.addr = addrs[i]
        self.peers = [a for a in addrs if a != self.addr]
        self.dir = base / f"m{i}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock = str(self.dir / "meta.sock")
        self.secret = self.dir / "secret"
        self.secret.write_text("test-secret")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "cluster.metaserver", "--self", self.addr,
               "--data-dir", str(self.dir / "data"), "--socket", self.sock,
               "--secret-file", str(self.secret)]
        for p in self.peers:
            cmd += ["--peer", p]
        self.log = open(self.dir / "stderr.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=self.log, stdout=self.log)
        wait_for(lambda: os.path.exists(self.sock) and self._connectable(), timeout=30)

    def _connectable(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(self.sock)
            return True
        except OSError:
            return False

    def status(self) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.sock)
            s.sendall(b'{"op":"status","id":1}\n')
            return json.loads(s.makefile().readline())["status"]

    def snapshot(self) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.sock)
            s.sendall(b'{"op":"watch"}\n')
            return json.loads(s.makefile().readline())["snapshot"]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=20)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        self.proc = None


@pytest.fixture()
def voters(tmp_path: Path) -> Iterator[list[Voter]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    vs = [Voter(tmp_path, i, addrs) for i in range(3)]
    try:
        for v in vs:
            v.start()
        yield vs
    finally:
        for v in vs:
            if v.proc is not None:
                v.proc.kill()
                v.proc.wait(timeout=20)


def leader_of_group(vs: list[Voter]) -> Voter:
    """The Raft leader, once every running voter names the same one."""
    named: list[str | None] = []

    def agreed() -> bool:
        named.clear()
        for v in vs:
            if v.proc is None:
                continue
            try:
                named.append(v.status()["leader"])
            except OSError:
                return False
        return named[0] is not None and len(set(named)) == 1
    wait_for(agreed, timeout=30)
    return next(v for v in vs if v.addr == named[0])


def propose(v: Voter, *cmds: list) -> list:
    async def run() -> list:
        client = MetadataClient(v.sock)
        await client.connect()
        try:
            return list(await asyncio.wait_for(
                asyncio.gather(*(client.propose(c) for c in cmds)), 20))
        finally:
            await client.close()
    return asyncio.run(run())


class Watcher:
    """``cluster.metaclient.watch`` on its own thread and loop, as a router would run it."""

    def __init__(self, v: Voter) -> None:
        self.snapshots: list[dict] = []
        self.changes: list[list] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, args=(v.sock,), daemon=True)
        self.thread.start()
        wait_for(lambda: self.snapshots, timeout=10)

    def _run(self, sock: str) -> None:
        self.task = self.loop.create_task(
            watch(sock, self.snapshots.append, lambda ch, _i: self.changes.extend(ch)))
        try:
            self.loop.run_until_complete(self.task)
        except (asyncio.CancelledError, OSError):
            pass

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout=10)


def test_a_committed_change_reaches_every_voter_and_a_stale_epoch_is_refused(
        voters: list[Voter]) -> None:
    leader_of_group(voters)
    follower = voters[1]
    watcher = Watcher(voters[2])
    (ok, rec), (ok2, again) = propose(
        follower, ["create_log", "d1", "n0/0", ["n0/0", "n1/0", "n2/0"]],
        ["create_log", "d1", "n1/0", ["n1/0", "n2/0"]])
    assert ok and rec["leader"] == "n0/0" and rec["epoch"] == 0
    assert not ok2 and again == rec  # placed once: the second create gets the winner
    [(ok, moved)] = propose(voters[2], ["elect", "d1", 0, "n1/0"])
    assert ok and moved["leader"] == "n1/0" and moved["epoch"] == 1
    [(ok, kept)] = propose(voters[0], ["elect", "d1", 0, "n2/0"])  # stale epoch 0
    assert not ok and kept["leader"] == "n1/0" and kept["epoch"] == 1
    [(ok, shrunk)] = propose(voters[0], ["set_isr", "d1", 1, 0, ["n1/0", "n2/0"]])
    assert ok and shrunk["isr"] == ["n1/0", "n2/0"] and shrunk["isr_version"] == 1
    for v in voters:
        wait_for(lambda v=v: v.snapshot()["logs"].get("d1", {}).get("isr_version") == 1,
                 timeout=10)
        assert v.snapshot()["logs"]["d1"]["leader"] == "n1/0"
    assert sum(v.status()["fsyncs"] for v in voters) > 0
    # the change stream, in commit order: created, moved, ISR shrunk (the refusals: nothing)
    wait_for(lambda: len(watcher.changes) >= 3, timeout=10)
    watcher.stop()
    assert [(c[0], c[1], c[2]["epoch"], c[2]["isr_version"]) for c in watcher.changes] == [
        ("log", "d1", 0, 0), ("log", "d1", 1, 0), ("log", "d1", 1, 1)]


def test_kill_9_of_the_raft_leader_loses_nothing_committed(voters: list[Voter]) -> None:
    leader = leader_of_group(voters)
    other = next(v for v in voters if v is not leader)
    results = propose(other, *(["create_log", f"k{i}", "n0/0", ["n0/0", "n1/0"]]
                               for i in range(50)))
    assert all(ok for ok, _ in results)
    leader.kill()
    killed_at = time.monotonic()
    survivors = [v for v in voters if v.proc is not None]

    def commits() -> bool:
        try:
            [(ok, _)] = propose(survivors[0], ["claim_session", "c1", "n1/0"])
            return ok
        except MetadataUnavailable:
            return False
    wait_for(commits, timeout=30, interval=0.1)
    took = time.monotonic() - killed_at
    print(f"kill -9 of the Raft leader -> next commit in {took:.2f} s")
    for v in survivors:
        logs = v.snapshot()["logs"]
        assert all(f"k{i}" in logs for i in range(50))
    leader.start()  # back with its journal: catches up
    wait_for(lambda: leader.snapshot()["sessions"].get("c1", {}).get("epoch") == 1,
             timeout=30)
    assert len(leader.snapshot()["logs"]) == 50


def test_the_state_survives_a_restart_of_every_voter(voters: list[Voter]) -> None:
    leader_of_group(voters)
    propose(voters[0], ["create_log", "r1", "n2/0", ["n2/0", "n0/0"]],
            ["claim_session", "cid", "n2/0"])
    for v in voters:
        wait_for(lambda v=v: "r1" in v.snapshot()["logs"], timeout=10)
    for v in voters:
        v.kill()
    for v in voters:
        v.start()
    leader_of_group(voters)
    for v in voters:
        wait_for(lambda v=v: "r1" in v.snapshot()["logs"], timeout=30)
        assert v.snapshot()["sessions"]["cid"]["router"] == "n2/0"


# Review of f34ef22 (review11): a proposal attempt that times out is proposed again on a new
# request, so the old request's answer may never come (pysyncobj keeps a dropped forward's
# callback until the Raft leader changes). The router's bookkeeping of it (MetadataClient's
# requests awaiting an answer) must not outlive its callers: on a long stall every timed-out
# attempt left one behind, holding its commands (a session's saved state among them). The
# voter the router talks to is frozen (SIGSTOP) so nothing is answered.


def test_attempts_that_timed_out_leave_no_request_behind(voters: list[Voter]) -> None:
    leader_of_group(voters)
    v = voters[0]
    stats = {"retries": 0}

    async def run() -> tuple[object, int, int]:
        proposer = Proposer(v.sock, stats, attempt_timeout=0.3)
        try:
            # connected and answered once, before the freeze
            first = await proposer.propose_until(["claim_session", "r11c", "n0/0"],
                                                 time.monotonic() + 20)
            assert not isinstance(first, str), first
            assert v.proc is not None
            v.proc.send_signal(signal.SIGSTOP)
            try:
                answer = await proposer.propose_until(
                    ["save_session", "r11c", "n0/0", 1, "x" * 1000], time.monotonic() + 3.0)
                return answer, proposer.client.waiting, stats["retries"]
            finally:
                v.proc.send_signal(signal.SIGCONT)
        finally:
            proposer.close_now()
    answer, waiting, retries = asyncio.run(run())
    assert isinstance(answer, str), f"nothing can answer a frozen process, got {answer!r}"
    assert retries >= 2, f"the attempts must have timed out and been retried ({retries})"
    assert waiting == 0, (
        f"{waiting} requests whose callers all stopped waiting are still kept for an answer "
        f"that may never come")


