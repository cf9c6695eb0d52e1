"""The node runs its Raft voter (``cluster.placement = "raft"``, issue 24 step 1): three real
``meshmq serve`` nodes each start a metadata process; together they elect one Raft leader,
shown by every node's ``/api/v1/cluster`` and ``meshmq cluster status``; a metadata process
killed -9 is restarted by its node and the group keeps (or regains) a leader; a node stopped
with SIGTERM stops its metadata process, and one whose supervisor is killed -9 does not leave
it behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers.broker import wait_for
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("raft"), n=3, raft=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _meta(cluster: Cluster, i: int) -> dict:
    return cluster.status(i)["metadata"]


def _one_leader(cluster: Cluster, nodes=(0, 1, 2)) -> str:
    seen: list[str] = []

    def agreed() -> bool:
        seen[:] = [_meta(cluster, i).get("leader") for i in nodes]
        return seen[0] is not None and len(set(seen)) == 1
    wait_for(agreed, 30, message=f"one Raft leader named by nodes {nodes}: {seen}")
    return seen[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_nodes_elect_one_raft_leader_and_the_cli_shows_it(trio: Cluster) -> None:
    leader = _one_leader(trio)
    assert leader in {f"127.0.0.1:{p}" for p in trio.raft_ports}
    assert trio.status(0)["placement"] == "raft"
    out = subprocess.run([sys.executable, "-m", "meshmq", "cluster", "status", "--admin",
                          f"127.0.0.1:{trio.nodes[1].admin_port}"],
                         capture_output=True, text=True, timeout=60)
    assert f"metadata: raft leader {leader}" in out.stdout, out.stdout + out.stderr
    leaders = sum(trio.nodes[i].metric("meshmq_raft_is_leader") for i in range(3))
    assert leaders == 1
    assert all(trio.nodes[i].metric("meshmq_metadata_up") == 1 for i in range(3))
    assert trio.nodes[0].metric("meshmq_raft_term") >= 1


def test_a_killed_metadata_process_is_restarted_and_the_group_has_a_leader(
        trio: Cluster) -> None:
    leader = _one_leader(trio)
    i = next(i for i in range(3) if _meta(trio, i)["raft"] == leader)
    old = _meta(trio, i)
    os.kill(old["pid"], signal.SIGKILL)  # the Raft leader's voter
    wait_for(lambda: _meta(trio, i).get("pid") not in (None, old["pid"])
             and not _meta(trio, i).get("error"), 30, message="the voter restarted")
    assert _meta(trio, i)["restarts"] == old["restarts"] + 1
    _one_leader(trio)


def test_stopping_a_node_stops_its_metadata_process(trio: Cluster) -> None:
    _one_leader(trio)
    pid = _meta(trio, 2)["pid"]
    trio.nodes[2].stop(timeout=20)
    assert not _alive(pid)
    _one_leader(trio, nodes=(0, 1))  # two of three voters: still a majority
    trio.nodes[2].start(wait=False)
    trio.nodes[2].wait_ready()
    pid = _meta(trio, 2)["pid"]
    trio.nodes[2].kill()  # the supervisor, -9: its voter must not stay behind
    try:
        wait_for(lambda: not _alive(pid), 15, message="the orphaned voter exits")
    finally:
        if _alive(pid):  # the bug under test: stop what we started, by its PID
            os.kill(pid, signal.SIGKILL)
    trio.nodes[2].start(wait=False)
    trio.nodes[2].wait_ready()
    _one_leader(trio)
