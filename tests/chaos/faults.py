"""The fault kinds of issue 24 (``--placement raft``): each finds its target in the Raft
records at the moment it starts (the node leading the most device logs, or one log's leader
and follower), so a seeded schedule hits the parts replication depends on whatever the
placement turned out to be.

* ``kill-leader``: kill -9 of the node leading the most logs (supervisor, routers and its
  metadata process, a lost machine), restarted with its disk after the fault's duration.
  Failover must move its logs to ISR members; nothing it acknowledged may be lost.
* ``raft-cut``: the node's Raft port alone is cut (its metadata process neither reaches nor
  is reached by the other voters; MQTT and mesh links flow): a Raft follower that is cut
  misses commits, a Raft leader loses its majority and the others elect one. Netns only.
* ``fetch-cut``: a follower's fetch alone: what the follower of one log sends to that log's
  leader over the mesh is dropped (one direction, mesh ports only; Raft and clients flow),
  so the follower falls behind and must leave the ISR (``replica_lag_time_max``) instead of
  holding the high-water mark, and rejoin when healed.
* ``freeze-leader``: the node leading the most logs SIGSTOPped (whole node, its voter too)
  for longer than the routers' leader lease (``--lease-s`` + 2 s), then resumed: it must stop
  acknowledging when its lease runs out and, resumed, must not accept a write for a log
  that moved (fencing by epoch).
* ``diverge``: a returning old leader with a diverged tail: the leader is frozen, the run
  waits until Raft elects another leader for one of its logs (publishers go on writing
  there), then resumes it; whatever it appended but never committed must be truncated by
  the epoch lookup before it serves anything (the replica rules check the logs after).

Today (no followers, no failover) these run too: the kill and freezes are outages, the cuts
change little; ``rec["elected_after_s"]`` says whether an election happened.
"""

from __future__ import annotations

import time
from typing import Any

from tests.chaos.replicas import newest_snapshot


class RaftFaults:
    """Target resolution and application of the kinds above for one run (``runner.Run``)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.fetch_cuts = 0

    def snapshot(self, skip: int | None = None) -> dict[str, Any] | None:
        nodes = [n for n in self.run.nodes if n.index != skip and n.alive and not n.stopped]
        return newest_snapshot([n.meta_socket for n in nodes])

    def _index(self, router: str) -> int | None:
        node_id = router.rpartition("/")[0]
        for n in self.run.nodes:
            if n.id == node_id:
                return int(n.index)
        return None

    def leader_node(self, snap: dict[str, Any] | None) -> tuple[int | None, int]:
        """The node leading the most logs (lowest index on a tie) and how many it leads."""
        counts: dict[int, int] = {}
        for rec in ((snap or {}).get("logs") or {}).values():
            i = self._index(str(rec.get("leader", "")))
            if i is not None:
                counts[i] = counts.get(i, 0) + 1
        if not counts:
            return None, 0
        best = max(sorted(counts), key=lambda i: counts[i])
        return best, counts[best]

    def resolve(self, f: Any) -> None:
        """Set ``f.node`` (and ``f.peer`` for fetch-cut) from the Raft records now; the
        schedule's random choice stays when Raft knows no log yet (said in the output)."""
        snap = self.snapshot()
        if f.kind in ("kill-leader", "freeze-leader", "diverge"):
            node, count = self.leader_node(snap)
            if node is None:
                self.run.say(f"{f.kind}: Raft names no leader yet; hitting n{f.node}")
                return
            f.node = node
            self.run.say(f"{f.kind}: n{node} leads {count} logs")
        elif f.kind == "fetch-cut":
            logs = sorted(((snap or {}).get("logs") or {}).items())
            pairs = []
            for _device, rec in logs:
                leader = self._index(str(rec.get("leader", "")))
                followers = [self._index(str(r)) for r in rec.get("replicas") or []
                             if r != rec.get("leader")]
                followers = [i for i in followers if i is not None and i != leader]
                if leader is not None and followers:
                    pairs.append((followers[self.fetch_cuts % len(followers)], leader))
            if pairs:
                f.node, f.peer = pairs[self.fetch_cuts % len(pairs)]
            self.fetch_cuts += 1

    def apply(self, f: Any, rec: dict[str, Any]) -> None:
        run = self.run
        node = run.nodes[f.node]
        if f.kind == "kill-leader":
            node.kill9()
            time.sleep(f.duration)
            node.start()
            node.wait_ready(60)
        elif f.kind == "raft-cut":
            why = run.net.cut_ports(f.node, "raft", node.raft_port, node.raft_port)
            if why:
                rec["skipped"] = why
            time.sleep(f.duration)
            run.net.heal_ports(f.node, "raft")
        elif f.kind == "fetch-cut":
            assert f.peer is not None
            leader = run.nodes[f.peer]
            why = run.net.cut_ports(f.node, "mesh", leader.mesh_port,
                                    leader.mesh_port + run.opts.routers - 1, to=f.peer)
            if why:
                rec["skipped"] = why
            time.sleep(f.duration)
            run.net.heal_ports(f.node, "mesh")
        elif f.kind == "freeze-leader":
            hold = max(f.duration, run.opts.lease_s + 2.0)
            rec["frozen_s"] = hold
            node.sigstop()
            time.sleep(hold)
            node.sigcont()
        elif f.kind == "diverge":
            self._diverge(f, rec)

    def _diverge(self, f: Any, rec: dict[str, Any]) -> None:
        run = self.run
        node = run.nodes[f.node]
        before = self.snapshot()
        led = {d for d, r in ((before or {}).get("logs") or {}).items()
               if self._index(str(r.get("leader", ""))) == f.node}
        node.sigstop()
        t0 = time.monotonic()
        wait = max(f.duration, run.opts.lease_s + 10.0)
        elected = None
        while time.monotonic() - t0 < wait:
            snap = self.snapshot(skip=f.node)
            moved = [d for d in led if self._index(str(((snap or {}).get("logs") or {})
                                                       .get(d, {}).get("leader", ""))) != f.node]
            if moved:
                elected = round(time.monotonic() - t0, 2)
                rec["moved"] = len(moved)
                break
            time.sleep(0.3)
        rec["elected_after_s"] = elected
        run.say(f"diverge: n{f.node} frozen; "
                + (f"another leader elected after {elected} s" if elected is not None
                   else f"no election in {wait:.0f} s (no failover in this tree)"))
        if elected is not None:
            time.sleep(2.0)  # the new leader takes writes the frozen one will have to drop
        node.sigcont()
