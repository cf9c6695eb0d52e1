"""``ShareDispatch``: which router's members of a shared group get a message, cluster-wide.

Kept out of ``cluster/mesh.py`` (links, frames, claims): only the choice of router for
``$share/<name>/<filter>`` groups whose members sit on several routers. The router that routes a
message first (its publisher's, or its log's owner) picks round-robin over the routers holding
members of the group (itself included); a peer's pick travels as a SHARE entry naming the group,
and the peer picks the member (broker/shared.py). Two faults must not lose a share (issue 28):

* a peer that is unreachable keeps its routes (``Mesh.link_down``: EMQX learned to treat "down"
  as "unreachable", not "dead"), but a share queued to it waits for the whole outage and then
  meets no member (clean members reconnected elsewhere): reachable routers are picked first;
* a share that reaches a router with no connected member left (the member moved or ended while
  it travelled, or left it unacked) is handed on once (SHARE_ON) to a router that has one, as
  MQTT 5 4.8.2 asks and EMQX's re-dispatch does; a SHARE_ON is never handed on again, so a
  share makes at most two hops however stale the routes are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster import frames

if TYPE_CHECKING:
    from broker.message import Message
    from cluster.link import MeshLink
    from cluster.routes import RouteTable

Encode = Callable[..., tuple[tuple[int, int], bytes]]


class ShareDispatch:
    def __init__(self, routes: RouteTable, links: dict[str, MeshLink], encode: Encode) -> None:
        self.routes = routes
        self.links = links
        self._encode = encode  # Mesh's entry encoder, handed in by the mesh itself
        self._cursor: dict[tuple[str, str], int] = {}

    def _next(self, key: tuple[str, str]) -> int:
        cursor = self._cursor.get(key, 0)
        self._cursor[key] = cursor + 1
        return cursor

    def share(self, msg: Message, groups: list) -> list:
        """Shared subscriptions cluster-wide: each message to exactly one member of a group,
        wherever its members are. The router that routes a message first (its publisher's, or
        its log's owner) picks, round-robin over the routers holding members of the group (this
        one included); a peer's pick travels as a SHARE entry naming the group, and the peer
        picks the member. A router receiving a plain DELIVER never shares it again."""
        if not self.routes.has_groups or msg.topic.startswith("$"):
            return groups
        remote = self.routes.groups_for(msg.topic)
        if not remote:
            return groups
        local = {(g.name, g.filter): g for g in groups if g.members}
        targets: dict[tuple[str, str], list[str | None]] = {
            key: [None] for key in local}
        for g in remote:
            targets.setdefault((g.name, g.filter), []).extend(g.members)
        out = []
        links = self.links
        for key, routers in targets.items():
            # A peer whose link is down keeps its routes (link_down), but a share queued to it
            # waits for the whole outage and then finds its members gone (they reconnected
            # elsewhere): pick among reachable routers while there is one (EMQX drops a dead
            # node's members from the dispatch; we may not know it is dead, only unreachable).
            # With none reachable the share queues on a link and is handed on where it lands.
            up = [r for r in routers if r is None or links[r].state == "up"]
            if up:
                routers = up
            pick = routers[self._next(key) % len(routers)]
            if pick is None:
                out.append(local[key])
                continue
            head, body = self._encode(msg, frames.SHARE, msg.device, group=key)
            links[pick].enqueue(frames.SHARE, msg.qos, head, body)
        return out

    def hand_on(self, msg: Message, key: tuple[str, str]) -> bool:
        """A share this router cannot place (no connected member of group ``key`` left here:
        it moved to another router or ended while the share travelled, or a departing member
        left it unacked) goes to another router with members of the group, as MQTT 5 4.8.2
        and EMQX's re-dispatch want, as a SHARE_ON that is never handed on again. False when
        no reachable peer has a member (the caller keeps or counts it)."""
        if not self.routes.has_groups:
            return False
        links = self.links
        peers = [peer for g in self.routes.groups_for(msg.topic)
                 if g.name == key[0] and g.filter == key[1]
                 for peer in g.members if links[peer].state == "up"]
        if not peers:
            return False
        head, body = self._encode(msg, frames.SHARE_ON, msg.device, group=key)
        pick = peers[self._next(key) % len(peers)]
        return links[pick].enqueue(frames.SHARE_ON, msg.qos, head, body)

