"""Planted memory bloat per idle connection (issue 25, ``tests/mutate.py idleconn``): each puts back
one thing an idle connection used to hold, and the guard (tests/bench/test_idle_memory.py,
bench/idlemem.py: tracemalloc bytes per idle connection against a budget) must catch it
without reading RSS or a clock. The shared empty queue's own guard is the existing queueing
tests: a delivery queued past ``Session.own_queue()`` must fail loudly, never vanish."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_idle_memory.py::test_idle_connection_within_its_memory_budget"
QUEUED = "tests/broker/test_resource_limits.py::test_max_queued_bytes_drops_oldest"
QUEUED_UNLOGGED = "tests/broker/test_sessions.py::test_offline_queue_bound_policy"


def idle_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("idleconn-dict", "broker/connection.py: Connection without __slots__ (an "
          "instance dict per connection, +1,270 bytes)", "broker/connection.py",
          "    __slots__ = (\n        \"router\", \"listener\",",
          "    _no_slots = (\n        \"router\", \"listener\",", (GUARD,)),
        m("idleconn-eager-queue", "broker/session.py: every session makes its DeliveryQueue at "
          "once (a deque's first block, +768 bytes)", "broker/session.py",
          "        self.queue: DeliveryQueue = NO_QUEUE\n",
          "        self.queue: DeliveryQueue = DeliveryQueue()\n", (GUARD,)),
        m("idleconn-queue-never-owned", "broker/session.py own_queue: the shared empty queue "
          "handed out to add to (a queued delivery must not be lost or shared)",
          "broker/session.py", "        if q is NO_QUEUE:\n", "        if False:\n",
          (QUEUED, QUEUED_UNLOGGED)),
    )
