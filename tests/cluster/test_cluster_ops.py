"""Operating a Raft-placed cluster (issue 24, Operations), on real nodes:

* ``meshmq cluster status`` from any node names the Raft leader, term and commit index, every
  node's liveness as the Raft leader sees it, the counts and (bounded) lists of
  under-replicated, offline and lost logs, and with ``--device D`` the log's leader, epoch,
  ISR and replicas on the ``leader of device 'D': <router>`` line; ``--json`` for scripts;
  exit 1 while anything is unhealthy.
* The same as metrics on every node: ``meshmq_raft_leader_changes_total``,
  ``meshmq_node_alive{node}``, ``meshmq_logs``, ``meshmq_logs_under_replicated``,
  ``meshmq_logs_offline``, ``meshmq_logs_lost``.
* An ISR shrunk through Raft (``set_isr``, what the leader proposes when a follower falls
  behind) is reported under-replicated on every node; a node killed -9 is reported down and
  the logs it leads offline, from the surviving nodes, whichever of them leads Raft.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

from cluster.metaclient import MetadataClient
from meshmq.clustercli import render_status
from meshmq.metadata_proc import metadata_socket

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("ops"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 3.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _place(raw, cluster: Cluster, i: int, prefix: str) -> str:
    """A new device whose log is led by node i's router (its publisher is connected there)."""
    device = unique(prefix)
    pub = raw(cluster.nodes[i], version=5)
    pub.connect(unique(f"pub{i}"), properties=ACK_OFFSETS)
    pub.send(R.publish(f"devices/{device}/t", b"x", qos=1, packet_id=1, version=5))
    ack = pub.expect(R.PUBACK, timeout=60)
    assert ack.reason_code == 0, ack
    for j in range(len(cluster.nodes)):
        if cluster.nodes[j].alive:
            wait_for(lambda j=j: cluster.status(j, device)["owner"]["router"] == f"n{i}/0", 30,
                     message=f"n{j} knows n{i}/0 leads {device}")
    return device


def _text(cluster: Cluster, i: int, device: str | None = None, limit: int = 20) -> str:
    out = io.StringIO()
    query = f"?limit={limit}" + (f"&device={device}" if device else "")
    code, body = cluster.nodes[i].http_get("/api/v1/cluster" + query)
    assert code == 200, body
    render_status(json.loads(body), out)
    return out.getvalue()


def _cli(cluster: Cluster, i: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meshmq", "cluster", "status", "--admin",
         f"127.0.0.1:{cluster.nodes[i].admin_port}", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))


def _propose(cluster: Cluster, i: int, cmd: list) -> tuple[bool, dict]:
    sock = metadata_socket(cluster.nodes[i].config["node"]["data_dir"])

    async def run() -> tuple[bool, dict]:
        client = MetadataClient(sock)
        await client.connect()
        try:
            return tuple(await asyncio.wait_for(client.propose(cmd), 30))  # type: ignore
        finally:
            await client.close()
    return asyncio.run(run())


def _healthy_line(cluster: Cluster, i: int) -> bool:
    text = _text(cluster, i)
    return "nodes: n0 alive" in text and "n1 alive" in text and "n2 alive" in text \
        and " 0 under-replicated, 0 offline, 0 lost" in text


def test_status_names_the_raft_leader_node_liveness_and_the_device_isr(trio: Cluster,
                                                                        raw) -> None:
    device = _place(raw, trio, 1, "st")
    for i in range(3):  # any node answers, and the same
        wait_for(lambda i=i: _healthy_line(trio, i), 30, message=f"n{i}: all alive, no bad log")
        text = _text(trio, i, device)
        assert "metadata: raft leader 127.0.0.1:" in text and "term " in text, text
        assert text.count("(raft leader)") == 1, text
        line = next(ln for ln in text.splitlines() if ln.startswith(
            f"leader of device '{device}': "))
        assert line.startswith(f"leader of device '{device}': n1/0 ("), line
        assert "epoch 0, isr n1/0," in line and "replicas n1/0," in line, line
        for r in ("n0/0", "n2/0"):
            assert r in line.split("isr ")[1].split(", replicas")[0], line
    done = _cli(trio, 2, "--json", "--device", device)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert [n["alive"] for n in doc["node_liveness"]] == [True, True, True], doc
    assert doc["logs"]["logs"] >= 1 and doc["logs"]["under_replicated"]["count"] == 0
    assert doc["owner"]["isr"][0] == "n1/0" and doc["owner"]["epoch"] == 0
    for node in trio.nodes:
        m = node.metrics()
        assert m["meshmq_raft_leader_changes_total"] >= 1, "no Raft leader ever seen"
        assert m['meshmq_node_alive{node="n2"}'] == 1 and m["meshmq_logs"] >= 1
        assert m["meshmq_logs_under_replicated"] == 0 and m["meshmq_logs_offline"] == 0
        assert m["meshmq_logs_lost"] == 0


def test_a_shrunk_isr_is_reported_under_replicated_on_every_node(trio: Cluster, raw) -> None:
    devices = [_place(raw, trio, 0, f"ur{k}") for k in range(3)]
    # n2's router stops fetching (SIGSTOP; its Raft voter stays up): after
    # cluster.replica_lag_time_max each log's leader shrinks it out of the ISR (the replica
    # fetcher keeps a live follower in the ISR, so a set_isr proposed by hand would be undone)
    router = trio.status(2)["routers"][0]["pid"]
    os.kill(router, signal.SIGSTOP)
    try:
        # every log has a replica on n2 (RF 3 on 3 nodes): the three here, and any an earlier
        # test of this module placed
        total = trio.status(0)["logs"]["logs"]
        assert total >= 3
        for i in range(2):
            wait_for(lambda i=i: trio.status(i)["logs"]["under_replicated"]["count"] == total,
                     60, message=f"n{i} counts all {total} logs under-replicated")
            assert trio.nodes[i].metric("meshmq_logs_under_replicated") == total
        text = _text(trio, 1, devices[0], limit=2)
        assert f"{total} under-replicated, 0 offline, 0 lost" in text, text
        listed = next(ln for ln in text.splitlines() if ln.startswith("under-replicated logs"))
        assert f" and {total - 2} more (--limit)" in listed, listed
        assert f"leader of device '{devices[0]}': n0/0 (node n0, epoch 0, isr " in text, text
        done = _cli(trio, 1)
        assert done.returncode == 1, f"unhealthy, yet exit 0:\n{done.stdout}"
        assert f"{total} under-replicated" in done.stdout
    finally:
        os.kill(router, signal.SIGCONT)  # it fetches again and rejoins every ISR
    wait_for(lambda: _healthy_line(trio, 0), 60, message="in sync again")


def test_a_dead_node_is_down_and_the_logs_it_leads_are_offline(trio: Cluster, raw) -> None:
    """Runs last in this module: it kills n2 (supervisor, routers and voter) and starts it
    again at the end."""
    led = [_place(raw, trio, 2, f"off{k}") for k in range(2)]
    other = _place(raw, trio, 0, "on")
    pids = [r["pid"] for r in trio.status(2)["routers"]] + [trio.status(2)["metadata"]["pid"]]
    trio.nodes[2].kill()
    for pid in pids:  # no orphan waits for its parent check
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        for i in (0, 1):  # whichever of the survivors leads Raft, both say the same
            def reported(i: int = i) -> bool:
                doc = trio.status(i)
                return doc["logs"]["offline"]["count"] == len(led) and \
                    [n["alive"] for n in doc["node_liveness"]] == [True, True, False]
            wait_for(reported, 60, message=f"n{i} reports n2 down and its logs offline")
            doc = trio.status(i)
            assert sorted(doc["logs"]["offline"]["devices"]) == sorted(led), doc["logs"]
            assert other not in doc["logs"]["offline"]["devices"]
            m = trio.nodes[i].metrics()
            assert m['meshmq_node_alive{node="n2"}'] == 0
            assert m['meshmq_node_alive{node="n0"}'] == 1
            assert m["meshmq_logs_offline"] == len(led)
            text = _text(trio, i)
            assert "n2 DOWN" in text and f"{len(led)} offline" in text, text
            assert "offline logs (" in text and led[0] in text, text
    finally:
        trio.nodes[2].start()
    wait_for(lambda: _healthy_line(trio, 0), 60, message="n2 back: alive, logs online")
