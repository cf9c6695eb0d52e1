"""Planted bugs for shared-subscription groups across routers (issue 28, the chaos finding "a
shared group misses messages when members move or a node fails"), run by ``tests/mutate.py``
(``tests/mutate.py shared-``). Each test of ``tests/cluster/test_shared_moves.py`` and the
offline-member test of ``tests/broker/test_shared.py`` is named by one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

MOVES = "tests/cluster/test_shared_moves.py"
SH = "tests/broker/test_shared.py"


def shared_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("shared-share-to-down-link", "cluster/shares.py share: routers whose link is down "
          "stay in the round robin (a dead node's stale routes keep taking one share in N)",
          "cluster/shares.py", "            if up:\n                routers = up\n",
          "            if False:\n                routers = up\n",
          (f"{MOVES}::test_a_killed_members_node_gets_no_share_once_the_member_moved",)),
        m("shared-no-hand-on", "broker/shared.py deliver_share: a share arriving where no "
          "member is connected is not handed on (dropped as unclaimed, as before)",
          "broker/shared.py",
          "        if not last_hop and forwarder is not None and forwarder.hand_on(msg, "
          "(name, flt)):\n",
          "        if False:\n",
          (f"{MOVES}::test_shares_reaching_a_router_whose_member_moved_are_handed_on",)),
        m("shared-redispatch-local-only", "broker/shared.py redispatch: a departing member's "
          "unacked shares go only to members on this router (dropped when there is none)",
          "broker/shared.py",
          "            if forwarder is not None and forwarder.hand_on(d.msg, (d.group.name, "
          "d.group.filter)):\n",
          "            if False:\n",
          (f"{MOVES}::test_a_departing_members_unacked_shares_go_to_a_member_on_another_router",)),
        m("shared-offline-drops", "broker/shared.py redispatch: an offline member's unacked "
          "shares that nobody can take are dropped instead of kept in its session",
          "broker/shared.py", "            if not stays:\n", "            if True:\n",
          (f"{SH}::test_sole_members_unacked_shares_stay_in_its_offline_session",)),
    )
