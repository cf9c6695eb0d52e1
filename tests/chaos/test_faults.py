"""The fault injections of issue 24 do what they say (a fault that silently does nothing makes
every chaos run pass): on three real nodes with Raft placement, in network namespaces (root,
as CI runs; skipped otherwise with the reason):

* ``raft-cut`` of one node: its metadata process loses its connections to the other voters
  (pysyncobj's ``has_quorum`` turns false there) while the other two keep a quorum and every
  mesh link stays up; healed, it has a quorum again.
* ``fetch-cut`` of n1 towards n0 (a follower's fetch from its leader): n1's mesh link to
  n0/0 goes down (what n1 sends is dropped, so the link times out) while every voter keeps
  its quorum (the Raft port is untouched); healed, the link comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.net import can_use_netns
from tests.chaos.nodes import MESH_PORT, Node
from tests.chaos.replicas import raft_status
from tests.chaos.runner import Run, finish_opts, parser

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(can_use_netns() is not None,
                                 reason=f"port cuts need network namespaces: {can_use_netns()}")]


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def quorum(node: Node) -> bool | None:
    st = raft_status(node.meta_socket)
    return None if st is None else bool(st.get("has_quorum"))


def link_state(node: Node, peer: str) -> str | None:
    st = node.status() or {}
    for r in st.get("routers", []):
        for lk in (r.get("mesh") or {}).get("links", []):
            if lk.get("peer") == peer:
                return str(lk.get("state"))
    return None


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory):
    """One cluster for both tests (each heals what it cut and waits for it): CI time."""
    run_dir: Path = tmp_path_factory.mktemp("faults") / "run"
    opts = finish_opts(parser().parse_args(
        ["--placement", "raft", "--net", "netns", "--faults", "0", "--seed", "1",
         "--kinds", "raft-cut,fetch-cut", "--run-dir", str(run_dir)]))
    run = Run(opts)
    try:
        run.build()
        wait(lambda: all(quorum(n) for n in run.nodes), 60, "a Raft quorum on every node")
        yield run
    finally:
        run.close()


def test_raft_cut_isolates_the_voter_alone(trio: Run) -> None:
    n0, n1, n2 = trio.nodes
    trio.net.cut_ports(0, "raft", n0.raft_port, n0.raft_port)
    try:
        wait(lambda: quorum(n0) is False, 60, "n0's voter to lose its quorum")
        assert quorum(n1) and quorum(n2), "the other two voters lost their quorum too"
        assert link_state(n1, "n0/0") == "up" and link_state(n0, "n2/0") == "up", \
            "a Raft port cut took mesh links down"
    finally:
        trio.net.heal_ports(0, "raft")
    wait(lambda: quorum(n0), 60, "n0's voter back in the quorum after the heal")


def test_fetch_cut_takes_one_mesh_link_down_not_raft(trio: Run) -> None:
    n0, n1, n2 = trio.nodes
    wait(lambda: all(quorum(n) for n in (n0, n1, n2)), 60, "a quorum on every voter")
    trio.net.cut_ports(1, "mesh", MESH_PORT, MESH_PORT, to=0)
    try:
        wait(lambda: link_state(n1, "n0/0") not in ("up", None), 60, "n1's link to n0/0 down")
        assert all(quorum(n) for n in (n0, n1, n2)), "a mesh cut took Raft's quorum away"
        assert link_state(n1, "n2/0") == "up", "the cut took n1's link to n2 down too"
    finally:
        trio.net.heal_ports(1, "mesh")
    wait(lambda: link_state(n1, "n0/0") == "up", 60, "n1's link to n0/0 back up")
