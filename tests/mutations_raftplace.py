"""Planted bugs in Raft placement of device logs (issue 24 step 2: cluster/raftplace.py and its
wiring), each caught by a test on real processes: ``tests/cluster/test_raft_placement.py``
(three real nodes) or ``tests/cluster/test_raftplace_voters.py`` (the placer against three real
metadata processes). Run: ``tests/mutate.py raftplace-``."""

from __future__ import annotations

from typing import Any

NODES = "tests/cluster/test_raft_placement.py"
VOTERS = "tests/cluster/test_raftplace_voters.py"
AFFINITY = f"{NODES}::test_a_new_device_is_led_by_the_router_its_publisher_is_connected_to"
NO_MAJORITY = f"{NODES}::test_without_a_raft_majority_a_new_device_is_refused_and_known_ones_work"
REGISTER = f"{NODES}::test_logs_from_static_placement_are_registered_where_they_are"
GROW = f"{NODES}::test_adding_a_node_moves_no_log"
RESTART = f"{NODES}::test_placements_survive_a_full_restart"
CONFLICT = f"{NODES}::test_a_log_on_disk_that_raft_places_elsewhere_is_reported_not_served"
LATE = f"{NODES}::test_an_append_reaching_a_leader_before_its_placement_waits_for_it"
RACE = f"{NODES}::test_two_routers_placing_the_same_new_devices_at_once_make_one_log_each"
EARLY = f"{NODES}::test_a_replay_subscription_before_the_first_publish_gets_it_once"
WINNER = f"{VOTERS}::test_held_publishes_go_to_the_router_that_placed_the_log_first"
BOUNDED = f"{VOTERS}::test_held_publishes_are_bounded"
V_NO_MAJORITY = f"{VOTERS}::test_without_a_majority_held_publishes_are_refused_not_placed"
INFLIGHT = f"{VOTERS}::test_placements_in_flight_when_the_raft_leader_dies_are_retried_not_lost"
CFG = "tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"


def raftplace_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("raftplace-hash-fallback", "cluster/placement.py: under Raft placement a device Raft "
          "has not placed gets the static hash's leader (two routers may append to one log)",
          "cluster/placement.py", "                                              if static "
          "else self._unplaced)", "                                              if True "
          "else self._unplaced)", (AFFINITY,)),
        m("raftplace-mesh-no-hold", "cluster/mesh.py append_at: a publish of an unplaced "
          "device is refused instead of held for its placement", "cluster/mesh.py",
          "            if owner == UNPLACED and self.placer is not None:\n",
          "            if False:\n", (AFFINITY,)),
        m("raftplace-resolve-unplaced", "cluster/mesh.py resolve: an offset subscription of a "
          "device not placed yet is asked of no router (refused) instead of starting at an "
          "empty log", "cluster/mesh.py",
          "        if owner == UNPLACED and self.store is not None:\n", "        if False:\n",
          (EARLY,)),
        m("raftplace-peer-append-not-waited", "cluster/mesh.py _apply: a peer's APPEND for a "
          "log this router has not heard placed yet is fenced at once (the first publishes of "
          "a raced device refused, though the compare-and-set placed it here)",
          "cluster/peerentries.py",
          "            if placer is not None and (e.epoch > self.placement.epoch_of(e.device)\n",
          "            if False and (e.epoch > self.placement.epoch_of(e.device)\n",
          (LATE, RACE)),
        m("raftplace-winner-ignored", "cluster/raftplace.py _release: held publishes are "
          "appended here even when another router placed the log first (two logs, offsets "
          "restarted)", "cluster/raftplace.py", "            if owner is None:\n"
          "                self._here(", "            if True:\n                self._here(",
          (WINNER,)),
        m("raftplace-no-hold-limit", "cluster/raftplace.py hold: held publishes unbounded "
          "(cluster.placement_max_held ignored)", "cluster/raftplace.py",
          "        if self.held_count >= self.max_held:\n", "        if False:\n", (BOUNDED,)),
        m("raftplace-unplaced-acked", "cluster/raftplace.py _place: no Raft answer within "
          "cluster.append_timeout: the log is taken as placed here and the publish acked "
          "(an unknown outcome taken as success)", "cluster/raftplace.py",
          '            self._refuse(device, f"not stored: the device log could not be placed: '
          '{answer}")\n            return\n',
          "            self.placement.update(device, self.me, 0)\n"
          "            self._learned(device)\n            return\n",
          (V_NO_MAJORITY, NO_MAJORITY)),
        m("raftplace-unknown-outcome-refused", "cluster/metaclient.py Proposer.propose_until "
          "(the placer's proposals): an unknown outcome (the Raft leader lost mid-proposal) "
          "ends the proposal: the publish is refused though the same compare-and-set would "
          "place it a moment later",
          "cluster/metaclient.py",
          '                if err.kind not in ("no_leader", "queue_full"):\n'
          "                    self._redial(client)  # the connection may be the one lost\n",
          '                if err.kind not in ("no_leader", "queue_full"):\n'
          "                    return why\n", (INFLIGHT,)),
        m("raftplace-no-register", "cluster/raftplace.py register: logs on disk Raft does not "
          "know are not registered (another router places a new log under the same device, "
          "offsets restart)", "cluster/raftplace.py",
          "        if not todo:\n            return\n", "        if True:\n            return\n",
          (REGISTER,)),
        m("raftplace-conflict-silent", "cluster/raftplace.py _conflict: a log on disk that "
          "Raft places on another router is not counted (meshmq_placement_conflicts_total "
          "stays 0: nobody hears of the second copy)", "cluster/raftplace.py",
          '        self.stats["conflicts"] += 1\n', "", (CONFLICT,)),
        m("raftplace-admin-hash", "meshmq/node_admin.py: the node admin's ?device= answers the "
          "static hash under Raft placement (a second answer to 'who leads D')",
          "meshmq/node_admin.py",
          "        self.placement = Placement(self.cluster.router_ids(), static=metadata is None)",
          "        self.placement = Placement(self.cluster.router_ids())", (AFFINITY,)),
        m("raftplace-cli-line", "meshmq/clustercli.py: no 'leader of device' line for scripts",
          "meshmq/clustercli.py", '            print(f"leader of device {owner.get(\'device\')!r}: '
          '{owner.get(\'router\')}', '            print(f"leader device {owner.get(\'device\')!r}: '
          '{owner.get(\'router\')}', (AFFINITY,)),
        m("raftplace-cfg-rf-zero", "meshmq/config.py: cluster.replication_factor = 0 accepted",
          "meshmq/config.py", '        "replication_factor": (_Int(1, 5),',
          '        "replication_factor": (_Int(0, 5),', (f"{CFG}[replication-factor-zero]",)),
        m("raftplace-cfg-held-zero", "meshmq/config.py: cluster.placement_max_held = 0 "
          "accepted (every new device refused)", "meshmq/config.py",
          '        "placement_max_held": (_Int(1),', '        "placement_max_held": (_Int(0),',
          (f"{CFG}[placement-max-held-zero]",)),
    )
