"""Publishes waiting on a deposed leader go to the new one (Kafka's producer retry).

A publish whose device log another router leads is held by its publisher's router until that
leader answers (cluster/link.py ``awaiting``; broker/forwarding.py holds the PUBACK). When
Raft moves the leadership (the leader's node died, froze or was cut off, or the controller
moved it), the APPENDs still waiting on the old leader's link would get no answer until
``cluster.append_timeout`` (5 s) and then be refused as "not stored": an MQTT 3.1.1 client is
disconnected, a v5 one gets 0x80, both resend. Measured before this module, kill -9 of a
leader's node with a publisher streaming through another node: the log accepted writes again
1.05 s after the kill, yet every publish sent in that second waited 5 s and was refused.

Kafka's producer resends a batch to the new leader on NOT_LEADER_OR_FOLLOWER or a lost
connection; its idempotence (producer id, sequence) makes the resend safe when the first
copy may have been written. meshmq does the same, at the moment this router's placement
learns the new leader (``Placement.subscribe``: before any later publish of that device is
routed, so a device's publishes keep their order):

- an APPEND **never sent** is known not stored: it goes to the new leader as it is;
- an APPEND **sent** has an unknown outcome: the old leader may have written it, and a
  follower may have fetched it before the move (then it is in the new leader's log). It goes
  with ``maybe_stored``, so the new leader looks for the publisher's earlier copy
  (client id, session epoch, packet id: broker/pubdedupe.py) and answers with its offset
  instead of storing it twice. An APPEND without the publisher's identity (publisher dedupe
  off, or a will) cannot be looked up: it stays and gets its outcome from the old leader or
  the timeout, as before;
- the old link keeps a sent one's bytes only until the peer's ACK, with the new epoch in its
  head: if the old leader hears it again after a reconnect, it is fenced there, never applied.

Nothing is acknowledged that is not stored: the new leader acknowledges only once its
high-water mark passes the record (or its earlier copy), exactly as for a fresh publish.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.lograte import RateLimitedLog
from cluster.placement import Leader

log = logging.getLogger("cluster.appendmove")


class AppendMover:
    """``Placement.subscribe`` handler of one router's mesh (see the module docstring)."""

    def __init__(self, mesh: Any, append_here: Any) -> None:
        self.mesh = mesh
        self.append_here = append_here  # (device, msg, expiry, done): this router leads now
        self.moved = 0  # APPENDs sent to a new leader (meshmq_link_appends_moved_total)
        self._log = RateLimitedLog(log, logging.INFO, "pending publishes moved to a new "
                                   "leader", burst=3, window=10.0)

    def on_change(self, device: str, before: Leader, after: Leader) -> None:
        mesh = self.mesh
        old, new = before.router, after.router
        if old is None or new is None or old == new or old == mesh.rid:
            return  # no peer held them, or the same router leads again (its resend check)
        if new != mesh.rid and new not in mesh.links:
            return  # no router leads it now (lost, or not in this config): they wait, as before
        link = mesh.links.get(old)
        if link is None or not link.awaiting:
            return
        moved = link.take_appends(device, after.epoch, _resendable)
        if not moved:
            return
        self.moved += len(moved)
        self._log("%d publishes waiting on router %s, which no longer leads the log, sent to "
                  "its new leader %s at epoch %d (the sent ones to be looked up there first)",
                  len(moved), old, new, after.epoch,
                  extra={"device": device, "from": old, "to": new})
        for done, (_, msg, expiry), sent in moved:
            if sent:
                msg.maybe_stored = True  # the new leader looks for its earlier copy first
            if new == mesh.rid:
                self.append_here(device, msg, expiry, done)
            else:
                mesh.append_at(new, device, msg, expiry, done)


def _resendable(retry: tuple[str, Any, Any]) -> bool:
    """A sent APPEND may go again only with the publisher's identity to look it up by."""
    return retry[1].publisher is not None
