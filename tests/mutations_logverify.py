"""Planted bugs for the follower's read of its log at start (cluster/logverify.py), run by
``tests/mutate.py`` (``tests/mutate.py logverify-``)."""

from __future__ import annotations

from typing import Any

FLIP = ("tests/cluster/test_review5_replication_faults.py::test_a_follower_with_a_flipped_byte_"
        "is_never_elected_with_the_hole[clean]")


def logverify_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("logverify-off", "cluster/logverify.py: no followed log is read at start (a clean "
          "start trusts its checkpoint: a rotted record stays until elected and read)",
          "cluster/logverify.py", "        return device not in self.verified",
          "        return False", (FLIP,)),
        m("logverify-no-repair", "cluster/logverify.py: the read finds the rot, but the "
          "fetcher starts before it looks (no repair from the leader)",
          "cluster/fetcher.py",
          "            self.verifier.verify(device, partial(self._start, device, leader, epoch))\n"
          "            return\n",
          "            self.verifier.verify(device, lambda: None)\n", (FLIP,)),
    )
