"""Planted bugs in the metadata process (issue 24's Raft part), caught by
``tests/cluster/test_metadata_raft.py`` against three real voter processes."""

from __future__ import annotations

from typing import Any

RAFT = "tests/cluster/test_metadata_raft.py"
UNIT = "tests/cluster/test_metastate_unit.py"
NODE = "tests/cluster/test_metadata_node.py"
CAS = f"{RAFT}::test_a_committed_change_reaches_every_voter_and_a_stale_epoch_is_refused"
KILL = f"{RAFT}::test_kill_9_of_the_raft_leader_loses_nothing_committed"


def metadata_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("metadata-not-restarted", "meshmq/metadata_proc.py _watch: a dead metadata process "
          "is logged and left dead (the node's voter stays missing)", "meshmq/metadata_proc.py",
          "            self.restarts += 1\n", "            return\n",
          (f"{NODE}::test_a_killed_metadata_process_is_restarted_and_the_group_has_a_leader",)),
        m("metadata-left-running-on-stop", "meshmq/cluster_node.py: SIGTERM drains the routers "
          "but leaves the metadata process running", "meshmq/cluster_node.py",
          "        if metadata is not None:\n            await metadata.stop()\n", "",
          (f"{NODE}::test_stopping_a_node_stops_its_metadata_process",)),
        m("metadata-orphaned", "cluster/metaserver.py: a voter whose supervisor was killed -9 "
          "keeps running (a restarted node finds its Raft port taken)",
          "cluster/metaserver.py", "            if os.getppid() != args.parent_pid:\n",
          "            if False:\n",
          (f"{NODE}::test_stopping_a_node_stops_its_metadata_process",)),
        m("metadata-isr-drops-leader", "cluster/metastate.py _set_isr: an ISR without its "
          "leader is accepted (the leader acks writes no ISR member holds)",
          "cluster/metastate.py",
          '                or rec["leader"] not in isr or not set(isr) <= set(rec["replicas"]):\n',
          '                or not set(isr) <= set(rec["replicas"]):\n',
          (f"{UNIT}::test_set_isr_keeps_the_leader_in_and_adds_no_stranger", UNIT)),
        m("metadata-elect-ignores-epoch", "cluster/metastate.py _elect: a stale epoch still "
          "moves the leader (two leaders for one log in one epoch)", "cluster/metastate.py",
          '        if rec["epoch"] != expected_epoch or leader not in rec["isr"]:\n',
          '        if leader not in rec["isr"]:\n', (CAS,)),
        m("metadata-create-twice", "cluster/metastate.py _create_log: a second create "
          "re-places an existing log (its offsets restart elsewhere)", "cluster/metastate.py",
          "        if rec is not None:\n            return False, rec, None\n        if leader "
          "not in replicas:\n",
          "        if leader not in replicas:\n", (CAS,)),
        m("metadata-no-fsync", "cluster/metaserver.py sync_journal: the journal is never "
          "fsynced (a power cut loses committed metadata)", "cluster/metaserver.py",
          "        if not self.dirty:\n            return\n",
          "        if True:\n            return\n", (CAS,)),
        m("metadata-changes-not-watched", "cluster/metaserver.py apply_batch: committed "
          "changes applied but never streamed to watchers", "cluster/metaserver.py",
          "            if changes:  # records copied",
          "            if False:  # records copied", (CAS,)),
    )
