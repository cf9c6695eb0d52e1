"""Issue 24's acceptance, as a user runs it: ``meshmq dev-cluster --nodes 3`` with defaults
(RF 3, acks=all); a QoS 1 publisher streams to a device whose log is led by node X; kill -9
node X (supervisor, routers, metadata process) and delete its data directory; the publisher
reconnects to another node and goes on; every acknowledged message is then replayed from a
surviving node with ``offset=earliest`` (the fetch API), once, in order; writes are accepted
again within 2 s of the kill (measured and printed; asserted generously, 10 s, on this
shared box: the figure goes in the issue's closing note).

Skipped until replication is in the tree (detected by its config key,
``cluster.min_insync_replicas``: tests/chaos/replicas.py), so nothing has to be removed when
it lands. ``MESHMQ_ACCEPTANCE_FORCE=1`` runs it anyway: on a tree without replication it must
fail (the killed node's disk held the only copy of the acknowledged messages), which is how
this test was shown able to fail.

The publisher is the chaos suite's (tests/chaos/workload.py): one message at a time, each
attempt ``device|seq|attempt`` on a clean connection, an unknown outcome retried as a new
attempt on the next node. A retried attempt whose first try's outcome was unknown may be in
the log too (dedupe is its own rule); an *acknowledged* attempt must be there exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.cluster import free_port_range
from helpers.clusternode import pid_alive

from commitlog.fetch import decode_fetch_response
from tests.chaos.checker import parse_payload
from tests.chaos.workload import DevicePublisher

FORCE = os.environ.get("MESHMQ_ACCEPTANCE_FORCE", "") == "1"


def _missing() -> str | None:
    from tests.chaos.replicas import replication_missing

    return replication_missing()


pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not FORCE and _missing() is not None,
                       reason=f"issue 24 acceptance: {_missing()}"),
]

DEVICE = "acc1"
BEFORE_KILL = 150  # acknowledged messages before the kill
AFTER_KILL = 100  # and after writes are accepted again
WRITES_BACK_LIMIT_S = 10.0  # the target is 2 s (printed); generous on a loaded 2-core box


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _http(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes, dict[str, str]]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def _leader_node(admin: int) -> str | None:
    """The node leading DEVICE's log, as ``meshmq cluster status --device`` says: its line
    ``leader of device 'D': <router>`` (issue 24's operations), else the JSON owner."""
    proc = subprocess.run([sys.executable, "-m", "meshmq", "cluster", "status", "--admin",
                           f"127.0.0.1:{admin}", "--device", DEVICE], capture_output=True,
                          text=True, timeout=30, env=_env())
    m = re.search(rf"leader of device '{DEVICE}': (\S+)", proc.stdout)
    router = m.group(1) if m else None
    if router is None:
        proc = subprocess.run([sys.executable, "-m", "meshmq", "cluster", "status", "--admin",
                               f"127.0.0.1:{admin}", "--device", DEVICE, "--json"],
                              capture_output=True, text=True, timeout=30, env=_env())
        with contextlib.suppress(ValueError, KeyError, TypeError):
            doc = json.loads(proc.stdout)
            router = (doc.get("leader") or doc["owner"])["router"]
    return None if router is None else str(router).rpartition("/")[0]


def _node_pids(admin: int) -> list[int]:
    """The node's supervisor, routers and metadata process (a lost machine: all of them)."""
    code, body, _ = _http(admin, "/readyz", timeout=5)  # the supervisor answers it
    assert code == 200, body[:300]
    pids = [int(json.loads(body)["pid"])]
    code, body, _ = _http(admin, "/api/v1/cluster", timeout=5)
    assert code == 200, body[:300]
    doc = json.loads(body)
    pids += [int(r["pid"]) for r in doc.get("routers", []) if r.get("pid")]
    meta = doc.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("pid"), int):
        pids.append(int(meta["pid"]))
    return pids


def _replay(admin: int) -> list[tuple[int, str]]:
    """DEVICE's whole log from offset 0 (earliest) through the fetch API of one node."""
    rows: list[tuple[int, str]] = []
    offset = 0
    while True:
        code, body, headers = _http(
            admin, f"/api/v1/logs/{DEVICE}/records?offset={offset}&max_records=1000")
        assert code == 200, f"fetch at offset {offset}: HTTP {code} {body[:300]!r}"
        for rec in decode_fetch_response(body):
            rows.append((rec.offset, rec.payload.decode("utf-8", "replace")))
        nxt, end = int(headers["x-meshmq-next-offset"]), int(headers["x-meshmq-end"])
        if nxt >= end:
            return rows
        assert nxt > offset, f"paging made no progress at {offset}"
        offset = nxt


def test_leader_lost_with_its_disk_loses_no_acknowledged_message(tmp_path: Path) -> None:
    mqtt, admin, mesh = free_port_range(3), free_port_range(3), free_port_range(3)
    root = tmp_path / "dev"
    out_path = tmp_path / "dev.out"
    seen: set[int] = set()
    attempts: list[dict[str, Any]] = []
    stop = threading.Event()
    with open(out_path, "wb") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "meshmq", "dev-cluster", "--nodes", "3",
             "--mqtt-port", str(mqtt), "--admin-port", str(admin), "--mesh-port", str(mesh),
             "--raft-port", str(free_port_range(3)),
             "--dir", str(root)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env())
    pub: DevicePublisher | None = None
    try:
        wait_for(lambda: "Ctrl-C stops every node" in out_path.read_text() or dev.poll(),
                 timeout=120, message="dev-cluster's table")
        assert dev.poll() is None, out_path.read_text()
        for i in range(3):
            seen.update(_node_pids(admin + i))
        # the publisher starts on node-0: the log is placed where the device is (affinity)
        nodes = [("127.0.0.1", mqtt + i) for i in range(3)]
        pub = DevicePublisher(DEVICE, nodes, 0, 200.0, attempts, stop, ack_timeout=3.0)
        pub.start()

        def acked() -> list[dict[str, Any]]:
            return [a for a in list(attempts) if a["outcome"] == "ok"]

        wait_for(lambda: len(acked()) >= 1, timeout=60, message="the first PUBACK")
        leader = wait_for(lambda: _leader_node(admin + 1), timeout=30,
                          message=f"the leader of {DEVICE}'s log")
        x = int(leader.rpartition("-")[2])
        wait_for(lambda: len(acked()) >= BEFORE_KILL, timeout=120,
                 message=f"{BEFORE_KILL} acknowledged messages")

        # node X lost with its disk: every process at once, then its data directory
        pids = _node_pids(admin + x)
        seen.update(pids)
        t_kill = time.time()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=20,
                 message=f"node-{x}'s processes gone")
        shutil.rmtree(root / f"node-{x}" / "data", ignore_errors=True)
        n_before = len(acked())

        def first_ok_after() -> float | None:
            done = [a["t_done"] for a in acked() if a["t_done"] and a["t_send"] >= t_kill]
            return min(done) if done else None

        t_back = wait_for(first_ok_after, timeout=60,
                          message="a PUBACK after the kill (writes accepted again)")
        back_s = t_back - t_kill
        print(f"\nwrites accepted again {back_s:.2f} s after kill -9 of node-{x} "
              f"(the leader of {DEVICE}) and the loss of its data directory (target 2 s)")
        wait_for(lambda: len(acked()) >= n_before + AFTER_KILL, timeout=120,
                 message=f"{AFTER_KILL} more acknowledged messages after the kill")
        stop.set()
        pub.join(10)

        # replay from a surviving node, from the earliest offset
        survivor = admin + (x + 1) % 3
        rows = _replay(survivor)
        where: dict[tuple[str, int, int], list[int]] = {}
        for off, payload in rows:
            key = parse_payload(payload)
            if key is not None:
                where.setdefault(key, []).append(off)
        ok = [a for a in attempts if a["outcome"] == "ok"]
        missing = [a for a in ok if (DEVICE, a["seq"], a["attempt"]) not in where]
        twice = {k: v for k, v in where.items() if len(v) > 1}
        placed = sorted((where[(DEVICE, a["seq"], a["attempt"])][0], a["seq"]) for a in ok
                        if (DEVICE, a["seq"], a["attempt"]) in where)
        inversions = [(o, s) for i, (o, s) in enumerate(placed) if i and s < placed[i - 1][1]]
        print(f"acknowledged {len(ok)} ({n_before} before the kill); replayed {len(rows)} "
              f"records from node-{(x + 1) % 3}: {len(missing)} acknowledged missing, "
              f"{len(twice)} stored twice, {len(inversions)} out of order")
        assert not missing, (f"{len(missing)} of {len(ok)} acknowledged messages are not in "
                             f"the log replayed from a surviving node, e.g. "
                             f"{[(a['seq'], a['attempt']) for a in missing[:5]]}")
        assert not twice, f"stored more than once: {list(twice.items())[:5]}"
        assert not inversions, f"acknowledged messages out of publish order: {inversions[:5]}"
        assert back_s <= WRITES_BACK_LIMIT_S, (
            f"writes accepted again only {back_s:.1f} s after the kill (target 2 s)")
    finally:
        stop.set()
        if pub is not None:
            pub.join(5)
        if dev.poll() is None:
            dev.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                dev.wait(60)
        for pid in seen:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if dev.poll() is None:
            dev.kill()
            dev.wait(10)
