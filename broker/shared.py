"""Shared subscriptions ($share/<name>/<filter>): one member of a group gets each message.

Kept out of router.py (which owns sessions and moves batches): which member, and where a
departing member's shares go. Round-robin over members, preferring connected, uncongested ones
(the spec leaves the choice to the server; Mosquitto and EMQX round-robin by default).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.lograte import RateLimitedLog
from broker.message import Delivery
from broker.stats import DropReason

if TYPE_CHECKING:
    from broker.message import Message
    from broker.port import RouterPort
    from broker.session import Session, Subscription
    from broker.trie import SharedGroup


log = logging.getLogger("broker.shared")


class SharedDelivery:
    def __init__(self, router: RouterPort) -> None:
        self.router = router
        self._unclaimed_log = RateLimitedLog(log, logging.WARNING,
                                             "shared messages with no member left",
                                             burst=3, window=10.0)

    def deliver(self, group: SharedGroup, msg: Message, exclude: str | None = None) -> bool:
        """Round-robin to one member, preferring connected, uncongested ones."""
        members = list(group.members.items())
        n = len(members)
        if not n:
            return False
        start = group.cursor % n
        chosen = None
        fallback = None
        for k in range(n):
            cid, sub = members[(start + k) % n]
            if cid == exclude:
                continue
            session = self.router.sessions.get(cid)
            if session is None:
                continue
            conn = session.conn
            if conn is not None and not conn.congested:
                chosen = (session, sub, (start + k) % n)
                break
            if fallback is None:
                fallback = (session, sub, (start + k) % n)
        pick = chosen or fallback
        if pick is None:
            return False
        session, sub, idx = pick
        group.cursor = idx + 1
        ids = (sub.sub_id,) if sub.sub_id else None
        self.router.deliver(session, msg, sub.qos, False, ids, group)
        return True

    def deliver_share(self, msg: Message, name: str, flt: str, last_hop: bool = False) -> None:
        """A peer router picked this router's members of ``$share/name/flt`` for a message:
        one of them gets it. When no member here is connected any more (it moved to another
        router, or its session ended, while the share travelled or waited on a link), the
        share is handed on to a router that has members (``last_hop``: it already was once,
        so it stays here); an offline member's session keeps it only when no router can take
        it; counted when no member is left anywhere we know of."""
        group = self.router.trie.group(flt, name)
        if group is not None and self._connected(group) and self.deliver(group, msg):
            return
        forwarder = self.router.forwarder
        if not last_hop and forwarder is not None and forwarder.hand_on(msg, (name, flt)):
            return
        if group is None or not self.deliver(group, msg):
            self.router.stats.dropped(DropReason.SHARE_UNCLAIMED)
            self._unclaimed_log(
                "a message for $share/%s/%s was dropped: no member of the group is left here "
                "or on any reachable router (counted in meshmq_messages_dropped_total"
                "{reason=\"share_unclaimed\"}): its members left while it travelled; if some "
                "should still exist, check that the routers holding them are reachable "
                "(links in GET /api/v1/cluster)", name, flt,
                extra={"topic": msg.topic})

    def _connected(self, group: SharedGroup) -> bool:
        sessions = self.router.sessions
        for cid in group.members:
            session = sessions.get(cid)
            if session is not None and session.conn is not None:
                return True
        return False

    def redispatch(self, session: Session, only_group: Subscription | None = None) -> None:
        """Give a departing shared member's unacked and queued shares to another member: here,
        else on another router (MQTT 5 4.8.2; EMQX re-dispatches the same way). A member that
        only went offline keeps those nobody can take (its session will deliver them when it
        comes back); a session that ends, or a subscription that goes, loses them (counted)."""
        moved: list[tuple[int | None, Delivery]] = []  # (packet id if it was in flight, copy)
        for pid, d in list(session.inflight.items()):
            # QoS 1 in flight may move (v5 4.8.2 SHOULD); a QoS 2 copy already sent must not
            # go to another member [MQTT-4.8.2-5]: it stays with this session.
            if d.group is not None and d.qos == 1 and d.state == Delivery.SENT and (
                    only_group is None or d.group.filter == only_group.filter):
                del session.inflight[pid]
                moved.append((pid, d))
        kept = []
        for d in session.queue:
            if d.group is not None and (only_group is None or d.group.filter == only_group.filter):
                moved.append((None, d))
            else:
                kept.append(d)
        if len(kept) != len(session.queue):
            queue = session.own_queue()
            queue.clear()
            queue.extend(kept)
        forwarder = self.router.forwarder
        stays = only_group is None and self.router.sessions.get(session.client_id) is session
        for pid, d in moved:
            if self.deliver(d.group, d.msg, exclude=session.client_id):
                continue
            if forwarder is not None and forwarder.hand_on(d.msg, (d.group.name, d.group.filter)):
                continue
            if not stays:
                self.router.stats.dropped(DropReason.QUEUE_FULL)
            elif pid is not None:  # resent (DUP) when the member comes back, as before
                session.own_inflight()[pid] = d
            else:
                session.own_queue().append(d)
