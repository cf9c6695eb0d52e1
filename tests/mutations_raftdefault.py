"""Planted bugs for Raft placement as the cluster default (issue 24: "placement is state, not a
hash"), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py raftdefault-``).

Each names the tests that must catch it: the real 3-node cluster started from a minimal config
(``tests/cluster/test_raft_default.py``) and the config cases
(``tests/meshmq/test_cluster_config.py``). The same branch cut CI time; where a test was made
cheaper and, on the way, able to catch a bug it passed before, that plant is here too.
"""

from __future__ import annotations

from typing import Any

CFG = "tests/meshmq/test_cluster_config.py"
CASE = CFG + "::test_misconfiguration_exits_2_naming_the_key"
LIVE = "tests/cluster/test_raft_default.py"
FDS = "tests/commitlog/test_commitlog_store.py::test_many_devices_within_open_files_limit"
SPLIT = "tests/protocol/test_protocol_roundtrip.py::test_random_stream_split_anywhere"


def raftdefault_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("raftdefault-static-default",
          "cluster/settings.py: a [cluster] without placement is the static hash again (a lost "
          "node's acknowledged messages lost with it)",
          "cluster/settings.py", '    placement: str = "raft"\n',
          '    placement: str = "static"\n',
          (LIVE, f"{CFG}::test_placement_defaults_to_raft_and_static_is_explicit")),
        m("raftdefault-derived-port-off-by-one",
          "meshmq/config.py: a missing raft_port derived past the first free port (port + "
          "routers + 1: not what the docs and the deploy files open)",
          "meshmq/config.py", "n = NodeAddress(n.id, n.host, n.port, n.port + routers, n.mqtt)",
          "n = NodeAddress(n.id, n.host, n.port, n.port + routers + 1, n.mqtt)",
          (f"{CFG}::test_three_node_cluster_loads",
           f"{CFG}::test_placement_defaults_to_raft_and_static_is_explicit",
           f"{CFG}::test_kubernetes_statefulset_matches_its_config", LIVE)),
        m("raftdefault-derived-collision-unchecked",
          "meshmq/config.py: a derived Raft port is not checked against the other nodes' mesh "
          "ports on its host (two processes on one port: a node that cannot start)",
          "meshmq/config.py",
          "            if _same_host(m.host, n.host) and m.port <= n.raft_port <= "
          "m.port + routers - 1:\n",
          "            if i not in derived and _same_host(m.host, n.host) and m.port <= "
          "n.raft_port <= m.port + routers - 1:\n",
          (f"{CASE}[derived-raft-port-in-next-mesh-range]",)),
        m("raftdefault-listener-clash-unchecked",
          "meshmq/config.py: this node's Raft port (derived) not checked against its MQTT and "
          "admin ports",
          "meshmq/config.py", "        if port and port == own.raft_port:\n",
          "        if False:\n",
          (f"{CASE}[derived-raft-port-is-admin-port]",
           f"{CASE}[shorthand-derived-raft-port-is-mqtt-port]")),
        m("raftdefault-read-fds-never-evicted",
          "commitlog/store.py: segment files opened for reads are never closed (the read fd "
          "cache grows with the segments read; passed the 100,000-device version of the test, "
          "whose reads came from the tail cache over 12 segments)",
          "commitlog/store.py", "        while len(fds) > self.settings.read_fd_cache:\n",
          "        while False and len(fds) > self.settings.read_fd_cache:\n", (FDS,)),
        m("raftdefault-split-after-first-byte",
          "broker/protocol/codec.py: a stream cut right after a packet's first byte is refused "
          "instead of waiting for the rest (still caught with CI's 50 streams per level)",
          "broker/protocol/codec.py",
          "                if pos + 1 >= n:\n                    break\n"
          "                rl = data[pos + 1]\n",
          "                if pos + 1 >= n:\n                    raise protocol_error(\"cut\")\n"
          "                rl = data[pos + 1]\n", (SPLIT,)),
    )
