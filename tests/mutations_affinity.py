"""Planted bugs for leadership following the device (issue 24's affinity rule,
cluster/affinity.py), run by ``tests/mutate.py`` like every other guard
(``tests/mutate.py affinity-``). Each test of ``tests/cluster/test_leader_affinity.py`` is named
by at least one mutation it must catch, and each new config check by its case of
``tests/meshmq/test_cluster_config.py``."""

from __future__ import annotations

from typing import Any

T = "tests/cluster/test_leader_affinity.py"
MOVES = T + "::test_leadership_moves_to_the_follower_the_device_stays_on_losing_nothing"
FLAP = T + "::test_a_device_bouncing_between_nodes_does_not_move_leadership"
OFF = T + "::test_stable_time_zero_turns_the_move_off"
AGAIN = T + "::test_a_log_moves_again_only_after_the_minimum_interval"
CAP = T + "::test_tracked_devices_are_capped"
CASE = "tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"
AFF = "cluster/affinity.py"


def affinity_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("affinity-never-eligible", "affinity: the ISR check inverted (an ISR member never "
          "asks to lead)", AFF,
          'if rec is None or rec.get("leader") != owner or self.me not in '
          '(rec.get("isr") or ()):',
          'if rec is None or rec.get("leader") != owner or self.me in (rec.get("isr") or ()):',
          (MOVES,)),
        m("affinity-held-dropped", "affinity: the publish that started the move is never "
          "released (held, then forgotten: never stored, never answered)", AFF,
          "        for msg, expiry, done in move.held:\n",
          "        for msg, expiry, done in move.held[1:]:\n", (MOVES,)),
        m("affinity-flap-no-reset", "affinity: a reconnect does not start the stable time over "
          "(a client bouncing between nodes moves leadership)", AFF,
          "            if e.conn != key:  # another connection (a reconnect, another client): "
          "start over\n                e.conn, e.since = key, now\n            elif key",
          "            if False:\n                pass\n            elif key", (FLAP,)),
        m("affinity-no-min-interval", "affinity: the minimum interval between moves of one "
          "log ignored (a log moves again as soon as another router's stable time passed)", AFF,
          "                    and now - changed[1] >= self.min_interval \\\n",
          "                    and True \\\n", (AGAIN,)),
        m("affinity-no-cap", "affinity: leader_affinity_max_devices not enforced (one entry "
          "per forwarded device, without bound)", AFF,
          "            if len(self.devices) > self.max_devices:\n",
          "            if False:\n", (CAP,)),
        m("affinity-zero-not-off", "affinity: leader_affinity_stable = 0 moves at once "
          "instead of turning the move off", "meshmq/replication_wiring.py",
          "    if settings.leader_affinity_stable > 0:\n",
          "    if settings.leader_affinity_stable >= 0:\n", (OFF,)),
        m("affinity-cfg-stable-negative", "config: a negative leader_affinity_stable accepted",
          "meshmq/config.py", '"leader_affinity_stable": (_Float(0.0, inclusive=True),',
          '"leader_affinity_stable": (_Float(-1e9, inclusive=True),',
          (f"{CASE}[affinity-stable-negative]",)),
    )
