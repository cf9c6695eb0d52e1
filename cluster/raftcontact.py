"""When this node's Raft voter last heard from the others: the clock behind node liveness (the
controller, cluster/controller.py) and behind the routers' leader lease (cluster/lease.py).

Fed by the metadata process's transport (``cluster/metaserver.py``, ``DurableTransport``) with
every message it receives; sans-I/O apart from that, so the rules are unit-tested alone.

- **Liveness** (``last_heard``): the last time any message came from a voter. The Raft leader
  sends append_entries every 10 ms and each follower answers every one, so at the leader this
  is at most ~10 ms old for a live, connected voter; a voter killed, frozen (SIGSTOP) or cut off
  stops answering, and a TCP connection that stays open (a frozen peer) changes nothing.
- **Majority contact** (``majority_at``): the last moment this voter *knows* a majority of the
  voters still counted it in. A leader: the time by which a quorum (itself and enough
  followers) had acknowledged it, i.e. the (quorum-1)-th newest follower answer. A follower: the
  leader's own majority time, which rides each append_entries as an age (``AGE_KEY``, seconds
  before the send; pysyncobj ignores keys it does not know), taken from the receive time, so it
  is at most one message delay late (too early, never too late: on the safe side). A follower
  hearing a leader that itself lost its majority therefore sees that leader's lease age, not a
  fresh one (on 5 voters, a partition {old leader, one follower} must not keep the follower's
  routers acknowledging while the other three elect a new leader).

All times are ``time.monotonic()``: CLOCK_MONOTONIC is one clock for every process of a host,
so a router (same host) compares them with its own ``time.monotonic()`` directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

AGE_KEY = "mq_majority_age"  # added to append_entries by the sender (cluster/metaserver.py)


class RaftContact:
    """What this voter heard and when (see the module docstring)."""

    def __init__(self, voters: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.quorum = voters // 2 + 1  # voters counting this one
        self.clock = clock
        self.heard: dict[str, float] = {}  # voter address -> last message received
        self.acked: dict[str, float] = {}  # voter address -> last next_node_idx (answer to us)
        self.leader_majority = -math.inf  # a follower: the leader's majority time, our clock

    def received(self, node: str, message: object) -> None:
        """A message from voter ``node`` (the transport's receive callback)."""
        now = self.clock()
        self.heard[node] = now
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "next_node_idx":
            self.acked[node] = now
        elif kind == "append_entries":
            age = message.get(AGE_KEY)
            if isinstance(age, (int, float)) and math.isfinite(age) and age >= 0:
                self.leader_majority = max(self.leader_majority, now - age)

    def last_heard(self, node: str) -> float:
        return self.heard.get(node, -math.inf)

    def majority_at(self, leader: bool) -> float:
        """The last time a majority counted this voter in (see the module docstring); with one
        voter, now."""
        if self.quorum <= 1:
            return self.clock()
        if not leader:
            return self.leader_majority
        answers = sorted(self.acked.values(), reverse=True)
        need = self.quorum - 1  # followers besides this voter
        return answers[need - 1] if len(answers) >= need else -math.inf

    def age(self, leader: bool) -> float:
        """Seconds since ``majority_at`` (what goes into append_entries)."""
        return max(0.0, self.clock() - self.majority_at(leader))
