"""Planted bugs for stored messages reaching subscribers after restarts and session moves
(issue 28, defects 2 to 4: ``broker/positions.py``), run by ``tests/mutate.py`` like every other
guard (``tests/mutate.py delivery-``). Kept in their own module so work going on side by side
does not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

POS = "tests/cluster/test_delivery_positions.py"
BACK = f"{POS}::test_a_restarted_owner_s_backlog_reaches_a_peer_whose_link_came_back_later"
CRASH = (f"{POS}::test_deliveries_acknowledged_by_the_link_survive_a_kill_of_the_subscriber_s"
         "_router")
MOVE = f"{POS}::test_a_session_moved_while_its_old_router_s_link_lost_everything_misses_nothing"
NEW = f"{POS}::test_a_restarted_owner_sends_a_device_new_to_the_peer_once_it_knows_its_routes"
BOUND = ("tests/broker/test_log_positions.py::"
         "test_a_session_s_positions_are_bounded_by_max_lagging_devices")
INFLIGHT = ("tests/cluster/test_remote_lag.py::"
            "test_messages_in_flight_from_the_owners_log_survive_a_restart_of_a_non_owner")
BACKWARD = ("tests/broker/test_log_positions.py::"
            "test_a_retained_message_sent_on_subscribe_does_not_move_a_position_back")


def delivery_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("delivery-owner-back-ignored", "cluster/mesh.py link_up: a link to an owner coming "
          "up reads nothing back (what it routed before it had our routes is lost)",
          "cluster/mesh.py", "        self.router.positions.owner_back(link.peer, self.owner_of)\n",
          "", (BACK,)),
        m("delivery-routegap-off", "cluster/mesh.py peer_routes: what a restarted router "
          "routed before a peer's routes arrived is never sent to it (a device the peer's "
          "sessions have no position in is lost)", "cluster/mesh.py",
          "            if self.unrouted.pending is not None:\n", "            if False:\n",
          (NEW,)),
        m("delivery-positions-not-kept", "broker/delivery.py deliver: no position recorded per "
          "device (nothing to resume from)", "broker/delivery.py",
          "        if group is None and msg.device is not None and not position:\n"
          "            positions = session.positions",
          "        if False:\n            positions = session.positions",
          (BACK, CRASH, MOVE)),
        m("delivery-positions-not-checkpointed", "broker/sessionstore.py _encode: positions left "
          "out of the checkpoint (a restart resumes remote logs from nothing)",
          "broker/sessionstore.py",
          "        for device, offset in s.positions.items():\n",
          "        for device, offset in (s.positions if copies else {}).items():\n", (CRASH,)),
        m("delivery-positions-not-exported", "broker/sessionstore.py _encode: positions left "
          "out of a session handed to another router (what went to the old router is lost)",
          "broker/sessionstore.py",
          "        for device, offset in s.positions.items():\n",
          "        for device, offset in ({} if copies else s.positions).items():\n", (MOVE,)),
        m("delivery-positions-unbounded", "broker/delivery.py deliver: a session's positions "
          "grow past mqtt.max_lagging_devices (no count, no log line)", "broker/delivery.py",
          "                if len(positions) >= self.positions.max_devices:\n",
          "                if False:\n", (BOUND,)),
        m("delivery-position-moves-back", "broker/delivery.py deliver: a delivery of an older "
          "offset (a retained message on SUBSCRIBE) moves the position back (repeats after a "
          "restart)", "broker/delivery.py",
          "            elif msg.offset >= at:  # never back: a retained message sent on SUBSCRIBE "
          "is old\n", "            else:\n", (BACKWARD,)),
        m("delivery-remote-inflight-by-reference", "broker/sessionstore.py _msg_ref: a message "
          "read from another router's log is checkpointed as a reference into this router's "
          "log, which does not hold it (lost at restart)", "broker/sessionstore.py",
          "    if msg.device is not None and not msg.remote and not copy:\n",
          "    if msg.device is not None and not copy:\n", (INFLIGHT,)),
    )
