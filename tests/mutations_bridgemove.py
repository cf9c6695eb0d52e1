"""Planted bugs for a bridge that moves to another node (issue 27's last gap: meshmq/bridge.py,
meshmq/bridgeconfig.py, the resume of ``$bridge/<name>``'s held offsets from the Raft session
registry), run by ``tests/mutate.py bridgemove``.

Each test of ``tests/cluster/test_bridge_moves.py`` (a 3-node Raft cluster and a real
Mosquitto, the node running the bridge killed -9) is named by at least one mutation it must
catch.
"""

from __future__ import annotations

from typing import Any

MV = "tests/cluster/test_bridge_moves.py"
KILL = f"{MV}::test_kill9_of_the_bridge_node_loses_nothing_either_way"
BR = "meshmq/bridge.py"
BC = "meshmq/bridgeconfig.py"
SS = "broker/sessionstore.py"
NOCOPY = f"{MV}::test_kill9_resumes_logs_the_new_node_holds_no_copy_of"
ROLL = f"{MV}::test_rolling_restart_of_the_bridge_node_loses_nothing"


def bridgemove_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("bridgemove-client-id-per-node", "bridge: the default remote client id names the "
          "node, not the cluster: the bridge moved to another node opens a new session at the "
          "remote, and what the remote kept for the old one while it moved never arrives", BC,
          '        bridge = _bridge(item, f"bridge[{i}]", cluster_name or node_id)\n',
          '        bridge = _bridge(item, f"bridge[{i}]", node_id)\n', (KILL,)),
        m("bridgemove-early-order", "bridge: inbound messages that arrive while the local "
          "CONNECT waits for its claim are published at once, ahead of the ones buffered "
          "before (out of the remote's order)", BR,
          "        if remote is not None and self._early is not None:\n",
          "        if local is None and remote is not None and self._early is not None:\n",
          (KILL,)),
        m("bridgemove-resume-local-only", "a session resumed from the registry reads from its "
          "resume time only the logs this router holds a copy of (a log led elsewhere, with no "
          "copy here, is never read: its backlog is lost)", SS,
          "                self.resume_points.start(s, device, resume_us)\n",
          "                pass\n", (NOCOPY,)),
        m("bridgemove-resume-placed-ignored", "a resumed session with a filter spanning every "
          "log reads the logs of this router's store only, not every log Raft placed", SS,
          "            if placed is not None:\n", "            if False:\n", (NOCOPY,)),
        m("bridgemove-stale-copy-kept", "a CONNECT whose claim names another router as the "
          "holder before keeps this router's older offline copy of the session (restored from "
          "its disk at a restart) and discards what that router handed over or saved",
          "broker/registry.py", "            self._drop_stale(cid)\n", "            pass\n",
          (ROLL,)),
    )
