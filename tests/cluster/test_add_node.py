"""Placement is state, not a hash (issue 24): adding a node to a Raft-placed cluster, the way an
operator does it (every existing node restarted in turn with the new ``[[cluster.nodes]]``
entry, then the new node started), hides and moves no existing log, on real nodes:

* the cluster-wide listing is the same before, during (from the node that is up) and after the
  roll, from every node, the new one included;
* the record at offset 100 of each log is the same record before and after; the next publish,
  at the new node, is acknowledged at offset 101 by the log's old leader;
* a new device published at the new node is led there (new logs use the new node);
* ``meshmq cluster rebalance --dry-run`` then plans moves onto the new node and changes
  nothing (carrying them out: tests/cluster/test_rebalance.py).

Every device is chosen so that the static hash over the three nodes names another router than
the one Raft placed it on: a placement that fell back to the hash is caught, not passed by luck.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import to_toml, wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_records, log_list

from cluster.placement import Placement

pytestmark = pytest.mark.timeout(400)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}
RECORDS = 101  # offsets 0..100


def _device(prefix: str, leader: str) -> str:
    """A device whose three-node static hash is not ``leader`` (where Raft will place it)."""
    hashed = Placement(["n0/0", "n1/0", "n2/0"])
    base = unique(prefix)
    return next(f"{base}x{k}" for k in range(10_000)
                if hashed.leader_of(f"{base}x{k}").router != leader)


def _offset(ack: R.Packet) -> int:
    return int(dict(ack.properties.get(R.USER_PROPERTY, []))["offset"])


def _publisher(raw, node) -> R.RawClient:
    pub = raw(node, version=5)
    pub.connect(unique("pub"), properties=ACK_OFFSETS)
    return pub


def _fill(pub: R.RawClient, device: str) -> None:
    """RECORDS publishes, a window of 20 in flight, each acked at its offset."""
    acked: dict[int, int] = {}
    sent = 0
    while len(acked) < RECORDS:
        while sent < RECORDS and sent - len(acked) < 20:
            pub.send(R.publish(f"devices/{device}/t", b"%s-%d" % (device.encode(), sent),
                               qos=1, packet_id=sent + 1, version=5))
            sent += 1
        ack = pub.expect(R.PUBACK, timeout=60)
        assert ack.reason_code == 0, ack
        acked[ack.packet_id] = _offset(ack)
    assert sorted(acked.values()) == list(range(RECORDS))


def _record_100(node, device: str) -> bytes:
    _, recs = fetch_records(node, device, offset=100, max_records=1)
    assert recs and recs[0].offset == 100, recs
    return bytes(recs[0].payload)


def _listing(node, devices: list[str]) -> dict[str, tuple[int, int]]:
    got = log_list(node)
    return {d: got[d] for d in devices if d in got}


def _leader(cluster: Cluster, i: int, device: str) -> str | None:
    return cluster.status(i, device)["owner"]["router"]


def _restart_with(node, entries: list[dict]) -> None:
    node.stop(timeout=20)
    node.config["cluster"]["nodes"] = copy.deepcopy(entries)
    node.config_path.write_text(to_toml(node.config))
    node.start()


def _rebalance(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshmq", "cluster", "rebalance", "--admin",
                           f"127.0.0.1:{node.admin_port}", *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_adding_a_node_rolling_hides_and_moves_no_log(tmp_path: Path, raw) -> None:
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={"cluster": {"append_timeout": 3.0}})
    n0, n1, n2 = cluster.nodes
    three = copy.deepcopy(n0.config["cluster"]["nodes"])
    try:
        for node in (n0, n1):  # the cluster as it was: two nodes
            node.config["cluster"]["nodes"] = copy.deepcopy(three[:2])
            node.config_path.write_text(to_toml(node.config))
            node.start(wait=False)
        for node in (n0, n1):
            node.wait_ready()
        placed = {}
        for i, node in ((0, n0), (1, n1)):
            pub = _publisher(raw, node)
            for k in range(2):
                device = _device(f"grow{i}{k}", f"n{i}/0")
                _fill(pub, device)
                placed[device] = f"n{i}/0"
        devices = sorted(placed)
        before = {d: (0, RECORDS) for d in devices}
        # (a node lists a log once it has heard of its placement: a moment after the ack)
        wait_for(lambda: _listing(n0, devices) == before, 30, message="n0 lists every log")
        at_100 = {d: _record_100(n1, d) for d in devices}
        assert at_100 == {d: b"%s-100" % d.encode() for d in devices}

        for i, node in ((0, n0), (1, n1)):  # rolling: one node at a time, the other serves
            _restart_with(node, three)
            other = (n1, n0)[i]
            wait_for(lambda other=other: _listing(other, devices) == before, 60,
                     message=f"the listing complete at the other node after n{i} rolled")
        n2.start()
        cluster.wait_links_up(60)
        for i, node in enumerate(cluster.nodes):
            wait_for(lambda node=node: _listing(node, devices) == before, 60,
                     message=f"n{i}'s listing hides no log and moves none")
            # a rolling restart may move a log's leadership to its other in-sync replica (the
            # controller never re-elects a restarted router while another ISR member lives):
            # the log stays on its replicas, never on the new node
            for device in placed:
                wait_for(lambda i=i, d=device: _leader(cluster, i, d) in ("n0/0", "n1/0"), 30,
                         message=f"n{i} names one of {device}'s replicas as its leader")
        assert {d: _record_100(n2, d) for d in devices} == at_100
        pub = _publisher(raw, n2)
        for pid, device in enumerate(devices, 1):
            pub.send(R.publish(f"devices/{device}/t", b"after", qos=1, packet_id=pid,
                               version=5))
            ack = pub.expect(R.PUBACK, timeout=60)
            assert ack.reason_code == 0, ack
            assert _offset(ack) == RECORDS, f"{device}'s log did not continue where it was"
        new = _device("new", "n2/0")
        pub.send(R.publish(f"devices/{new}/t", b"n", qos=1, packet_id=99, version=5))
        assert _offset(pub.expect(R.PUBACK, timeout=60)) == 0
        wait_for(lambda: _leader(cluster, 0, new) == "n2/0", 30, message="new logs use n2")

        planned = _rebalance(n1, "--dry-run")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        moves = [ln for ln in planned.stdout.splitlines() if ln.startswith("move ")]
        assert moves and any("n2/0" in ln.split("replicas ")[1].split(" -> ")[1]
                             for ln in moves), planned.stdout
        assert f"{len(moves)} of 5 logs would move" in planned.stdout, planned.stdout
        for device in placed:  # nothing moved
            owner = cluster.status(2, device)["owner"]
            assert owner["router"] in ("n0/0", "n1/0") and "n2/0" not in owner["replicas"], \
                owner
    finally:
        cluster.stop()
