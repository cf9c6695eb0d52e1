"""A device log whose every replica lost its records is reported lost, never restarted at
offset 0 (issue 24; cluster/logfloor.py), on real nodes.

Each router records in Raft, in batches, how far each log it leads was acknowledged (the log's
floor). A node killed -9 and started again with its whole data directory gone (its routers'
stores and its Raft journal: a replaced disk) finds Raft naming it the leader of logs it has no
records of. Followers do not fetch yet, so no replica holds them: each is reported lost (an
ERROR naming the device and what to do, ``meshmq_logs_lost`` and ``cluster status`` on every
node) and its publishes are refused as not stored, at that node and at any other. Without the
floor, the next publish would be acknowledged at offset 0, and a reader that saved offset 3
would silently read other messages there.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.clusternode import pid_alive
from helpers.devicelog import http_get

from meshmq.clustercli import render_status

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


def _publisher(raw, cluster: Cluster, i: int) -> R.RawClient:
    pub = raw(cluster.nodes[i], version=5)
    pub.connect(unique(f"pub{i}"), properties=ACK_OFFSETS)
    return pub


def _publish(pub: R.RawClient, device: str, payload: bytes, pid: int) -> R.Packet:
    pub.send(R.publish(f"devices/{device}/t", payload, qos=1, packet_id=pid, version=5))
    return pub.expect(R.PUBACK, timeout=60)


def test_a_log_lost_with_its_only_replica_is_reported_lost_not_restarted(
        tmp_path: Path, raw) -> None:
    cluster = Cluster(tmp_path, n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 3.0, "log_floor_interval": 0.2,
                                              "replication_factor": 1}})
    try:
        cluster.start()
        device, kept = unique("lost"), unique("kept")
        pub = _publisher(raw, cluster, 1)
        for pid in range(1, 5):
            assert _publish(pub, device, b"m%d" % pid, pid).reason_code == 0
        assert _publish(_publisher(raw, cluster, 0), kept, b"k0", 1).reason_code == 0
        # the floor of n1's log reaches its 4 acknowledged records, in Raft
        wait_for(lambda: cluster.status(2, device)["owner"].get("floor") == 4, 30,
                 message="the log's floor (4) recorded in Raft")
        # (n1 counts the raise when Raft's answer reaches it, which may come after n2's
        # watch showed the floor: CI 2026-11-27 read 0 there)
        wait_for(lambda: cluster.nodes[1].metric("meshmq_log_floors_raised_total") >= 1, 30,
                 message="n1 counted the floor it raised")
        n1 = cluster.nodes[1]
        pids = [r["pid"] for r in cluster.status(1)["routers"]] \
            + [cluster.status(1)["metadata"]["pid"]]
        n1.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not any(pid_alive(p) for p in pids), 30,
                 message="n1's processes gone")
        shutil.rmtree(n1.config["node"]["data_dir"])  # its disk: stores and Raft journal
        n1.start()
        wait_for(lambda: cluster.status(1, device)["owner"]["router"] is not None, 60,
                 message="n1 has caught up with Raft's record of the log")
        ack = _publish(_publisher(raw, cluster, 1), device, b"after", 1)
        assert ack.reason_code == 0x80, f"n1 acked a publish to the log it lost: {ack!r}"
        wait_for(lambda: f"device log {device!r} LOST" in n1.log_text(), 60,
                 message="n1's ERROR naming the lost log")
        assert "Restore this node's data directory" in n1.log_text()
        for i in range(3):
            wait_for(lambda i=i: cluster.status(i)["logs"]["lost"]["count"] == 1, 30,
                     message=f"n{i} reports the log lost")
            assert cluster.nodes[i].metric("meshmq_logs_lost") == 1
            assert cluster.status(i)["logs"]["lost"]["devices"] == [device]
        out = io.StringIO()
        assert not render_status(cluster.status(0, device), out)
        text = out.getvalue()
        assert "0 offline, 1 lost" in text and f"device '{device}': LOST: acknowledged " \
            "up to offset 4" in text, text
        # refused at its (former) leader and elsewhere: never stored at offset 0 again
        for i in (1, 0, 2):
            ack = _publish(_publisher(raw, cluster, i), device, b"after", 1)
            assert ack.reason_code == 0x80, f"n{i} acked a publish to a lost log: {ack!r}"
            assert "lost acknowledged records" in ack.properties.get(R.REASON_STRING, ""), ack
        for node in cluster.nodes:  # reads fail too: nothing is served from a new offset 0
            got = http_get(node, f"/api/v1/logs/{device}/records?offset=0")
            assert got.status == 503 and b"log lost" in got.body, (got.status, got.body)
        assert cluster.nodes[1].metric("meshmq_logs_lost_here") == 1
        # the other logs work: one led by a surviving node
        ack = _publish(_publisher(raw, cluster, 1), kept, b"k1", 9)
        assert ack.reason_code == 0, ack
    finally:
        cluster.stop()
