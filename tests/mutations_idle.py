"""Planted memory bloat per idle connection (issue 25, ``tests/mutate.py idleconn``): each puts back
one thing an idle connection used to hold, and the guard (tests/bench/test_idle_memory.py,
bench/idlemem.py: tracemalloc bytes per idle connection against a budget) must catch it
without reading RSS or a clock. The shared empty queue and maps (broker/session.py NO_QUEUE,
NO_ENTRIES) are guarded by the tests of what writes them: an entry written past the session's
``own_*()`` must fail loudly, never land in every session or vanish; and a loop that bound one
of them to a local before writing through the session must not read a stale empty one
(tests/broker/test_limits.py's backlog-through-the-window test)."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_idle_memory.py::test_idle_connection_within_its_memory_budget"
QUEUED = "tests/broker/test_resource_limits.py::test_max_queued_bytes_drops_oldest"
QUEUED_UNLOGGED = "tests/broker/test_sessions.py::test_offline_queue_bound_policy"
QOS1_OUT = "tests/broker/test_publish_qos.py::test_server_packet_ids_unique_while_in_flight"
QOS2_IN = "tests/broker/test_publish_qos.py::test_qos2_inbound_flow_wire"
SUBSCRIBE = "tests/broker/test_publish_qos.py::test_qos1_order_preserved"
LAGS = "tests/broker/test_log_delivery.py::test_stalled_subscriber_lags_then_gets_everything"
POSITIONS = ("tests/broker/test_log_positions.py::"
             "test_a_session_s_positions_are_bounded_by_max_lagging_devices")
WINDOW = ("tests/broker/test_limits.py::"
          "test_a_backlog_from_the_log_is_read_as_the_window_frees")
LOCKOUT = ("tests/broker/test_resource_limits.py::"
           "test_an_address_spraying_usernames_is_locked_out")


# broker/catchup.py pump: from binding the window to its first check (a multi-line plant)
_PUMP_MEMO = (
    "        # The session's subscriptions cannot change while this runs (nothing in it awaits),\n"
    "        # so which of them take a topic is the same for every record no subscription is\n"
    "        # newer than: matched once per topic (a device's records carry a handful), unless a\n"
    "        # No Local subscription makes the answer depend on each record's publisher.\n"
    "        subs = session.subscriptions.values()\n"
    "        newest = max([sub.since_us for sub in subs], default=0)\n"
    "        memo: dict[str, tuple | bool] | None = (\n"
    "            None if any([sub.no_local for sub in subs]) else {})\n")
_PUMP_HEAD = ("        window = session.window\n        source = self.source\n"
              "        deliver = self._deliver\n        deliver_run = self.deliver_run\n"
              "        stats = self.stats\n" + _PUMP_MEMO +
              "        budget = _STEP\n        while budget > 0:\n            moved = False\n"
              "            for c in list(lag.values()):\n                if c.live:\n"
              "                    continue\n")
_PUMP_NOTE = ("                # (session.queue read each time: the first delivery queued makes "
              "the session\n                # its own queue, broker/session.py NO_QUEUE)\n")
_PUMP_FIXED = ("        inflight = session.own_inflight()\n" + _PUMP_HEAD + _PUMP_NOTE
               + "                if session.queue or")
_PUMP_STALE = ("        inflight = session.inflight\n        queue = session.queue\n" + _PUMP_HEAD
               + _PUMP_NOTE + "                if queue or")

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
        m("idleconn-eager-maps", "broker/session.py: subscriptions and inflight made per "
          "session again (two empty dicts, +128 bytes)", "broker/session.py",
          "        self.subscriptions: dict[str, Subscription] = NO_ENTRIES\n"
          "        self.inflight: dict[int, Delivery] = NO_ENTRIES",
          "        self.subscriptions: dict[str, Subscription] = {}\n"
          "        self.inflight: dict[int, Delivery] = {}", (GUARD,)),
        m("idleconn-eager-out", "broker/connection.py flush: an empty write list kept per "
          "connection again (+56 bytes)", "broker/connection.py",
          "        data = out[0] if len(out) == 1 else b\"\".join(out)\n        self._out = None\n",
          "        data = out[0] if len(out) == 1 else b\"\".join(out)\n        self._out = []\n",
          (GUARD,)),
        m("idleconn-inflight-never-owned", "broker/session.py own_inflight: the shared empty "
          "map handed out to write to", "broker/session.py",
          "        d = self.inflight\n        if d is NO_ENTRIES:\n",
          "        d = self.inflight\n        if False:\n", (QOS1_OUT,)),
        m("idleconn-qos2-never-owned", "broker/session.py own_incoming_qos2: the shared empty "
          "map handed out to write to", "broker/session.py",
          "        d = self.incoming_qos2\n        if d is NO_ENTRIES:\n",
          "        d = self.incoming_qos2\n        if False:\n", (QOS2_IN,)),
        m("idleconn-subscriptions-never-owned", "broker/session.py own_subscriptions: the "
          "shared empty map handed out to write to", "broker/session.py",
          "        d = self.subscriptions\n        if d is NO_ENTRIES:\n",
          "        d = self.subscriptions\n        if False:\n", (SUBSCRIBE,)),
        m("idleconn-lag-never-owned", "broker/session.py own_lag: the shared empty map handed "
          "out to write to", "broker/session.py",
          "        d = self.lag\n        if d is NO_ENTRIES:\n",
          "        d = self.lag\n        if False:\n", (LAGS,)),
        m("idleconn-positions-never-owned", "broker/session.py own_positions: the shared empty "
          "map handed out to write to", "broker/session.py",
          "        d = self.positions\n        if d is NO_ENTRIES:\n",
          "        d = self.positions\n        if False:\n", (POSITIONS,)),
        m("idleconn-stale-window", "broker/catchup.py pump: the window and queue checked "
          "through locals bound before the loop, as before the fix (bound to the shared empty "
          "ones, they stay empty: the loop reads the backlog into the 5-message queue, which "
          "drops the rest)", "broker/catchup.py",
          _PUMP_FIXED, _PUMP_STALE, (WINDOW,)),
        m("idleconn-peer-host-with-port", "broker/connection.py peer_host: the port left on "
          "(the failed-login lockout per address never adds up)", "broker/connection.py",
          "            host = self.peer.rpartition(\":\")[0] or self.peer",
          "            host = self.peer", (LOCKOUT,)),
    )
