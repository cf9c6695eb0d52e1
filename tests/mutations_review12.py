"""Planted bugs for review12's attacks on the crossings' runs and ``route_again`` (issue 25's
cheaper crossings; the QoS 0 duplicate of a record routed again), run by ``tests/mutate.py
review12-``."""

from __future__ import annotations

from typing import Any

X = "tests/cluster/test_review12_route_again.py"
GAP = X + "::test_a_resend_routed_again_before_the_peers_routes_are_known_is_no_qos0_copy_there"
TWO = X + "::test_a_publishers_run_crosses_to_two_peers_each_split_by_its_window"


def review12_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("review12-gap-again-unmarked", "cluster/mesh.py peer_routes: a record routed again "
          "before the peer's routes were known is sent to it unmarked (its QoS 0 subscriber "
          "gets the copy again)",
          "cluster/mesh.py",
          "self.routes, self.encode, link, rec, unrouted.again(rec)))",
          "self.routes, self.encode, link, rec, False))", (GAP,)),
        m("review12-gap-again-forgotten", "cluster/mesh.py forward_again: the route gap "
          "remembers the record as routed, not as routed again (sent unmarked later)",
          "cluster/mesh.py",
          "            self.unrouted.routed_again(msg.device, msg.offset)\n",
          "            self.unrouted.routed(msg.device, msg.offset)\n", (GAP,)),
        m("review12-run-items-shared", "cluster/link.py deliver_run: a new run takes the "
          "items list itself (shared by every link the run goes to: one link's window split "
          "cuts the others' entries)",
          "cluster/linkqueue.py",
          "        run.items += items\n",
          "        run.items = items if not run.items else run.items + items\n", (TWO,)),
    )
