"""Shared subscriptions ($share/<name>/<filter>): one member of a group gets each message.

Kept out of router.py (which owns sessions and moves batches): which member, and where a
departing member's shares go. Round-robin over members, preferring connected, uncongested ones
(the spec leaves the choice to the server; Mosquitto and EMQX round-robin by default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.message import Delivery
from broker.stats import DropReason

if TYPE_CHECKING:
    from broker.message import Message
    from broker.router import Router
    from broker.session import Session, Subscription
    from broker.trie import SharedGroup


class SharedDelivery:
    def __init__(self, router: Router) -> None:
        self.router = router

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
        self.router._deliver(session, msg, sub.qos, False, ids, group)
        return True

    def deliver_share(self, msg: Message, name: str, flt: str) -> None:
        """A peer router picked this router's members of ``$share/name/flt`` for a message:
        one of them gets it. Counted when none is left (the member left while it travelled)."""
        group = self.router.trie.group(flt, name)
        if group is None or not self.deliver(group, msg):
            self.router.stats.dropped(DropReason.SHARE_UNCLAIMED)

    def redispatch(self, session: Session, only_group: Subscription | None = None) -> None:
        """Give a departing shared member's unacked and queued shares to another member."""
        moved: list[Delivery] = []
        for pid, d in list(session.inflight.items()):
            # QoS 1 in flight may move (v5 4.8.2 SHOULD); a QoS 2 copy already sent must not
            # go to another member [MQTT-4.8.2-5]: it stays with this session.
            if d.group is not None and d.qos == 1 and d.state == Delivery.SENT and (
                    only_group is None or d.group.filter == only_group.filter):
                del session.inflight[pid]
                moved.append(d)
        kept = []
        for d in session.queue:
            if d.group is not None and (only_group is None or d.group.filter == only_group.filter):
                moved.append(d)
            else:
                kept.append(d)
        if len(kept) != len(session.queue):
            session.queue.clear()
            session.queue.extend(kept)
        for d in moved:
            if not self.deliver(d.group, d.msg, exclude=session.client_id):
                self.router.stats.dropped(DropReason.QUEUE_FULL)
