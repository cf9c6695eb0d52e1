"""Retained changes from peer routers: stored like our own, and what a resync may not undo.

Every router keeps the whole cluster's retained set. A change made at one router reaches every
peer as a RETAIN entry (one hop, never broadcast again); on each link up both sides send every
retained message they hold as RETAIN_SYNC, which the receiver takes only where it holds none, so
a router that missed changes while apart (restarted, partitioned, or a link that dropped entries
past ``link_max_queued_bytes``) gets them back.

**Stored like our own.** A peer's change is written to this router's ``#retained`` state log in
the same group commit as everything else of the tick (``RemotePublishes.retain_from_peer``), so a
router restarted while its peers are down still has every retained message it knew. The link's
cumulative ACK is held until that write is durable, as for an APPEND: a change the peer saw
acknowledged is on our disk, one it did not is resent to our next incarnation.

**A resync does not undo a clear.** Persisting what peers taught us makes one conflict common: a
router that was down (or cut off) while a retained message was cleared comes back with the old
message on its disk and offers it in its RETAIN_SYNC; the routers that cleared it hold none, so
the plain rule ("take it where you have none") would bring the message back on all of them
while the returning router itself applies the queued clear: the cluster ends up diverged, the
message retained everywhere except where it was stale. The rule here: a RETAIN_SYNC for a topic
this router cleared (a client's clear here, or one learned from any peer) *while the link to the
sending peer was not up* is ignored, and the clear is sent back to that peer, so it converges
too (also when the link's queue had dropped the original clear). A clear made while the link was
up reached the peer in order, so whatever the peer offers afterwards is newer and is taken.
Concurrent changes while apart therefore resolve as "clear wins" (a remove-wins set).

Limits, said in README "Cluster": the clears are remembered in memory since this router started
(a router restarted after its clear no longer knows of it), at most ``CLEARS_KEPT`` of them; two
routers that *set* different values while apart each apply the other's queued RETAIN when the
link heals and may end up swapped. Both need a last-writer-wins rule, that is a timestamp in the
mesh entries (a frame change); none is compared here.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from broker.lograte import RateLimitedLog
from broker.message import Message
from cluster import frames

if TYPE_CHECKING:
    from cluster.link import MeshLink

log = logging.getLogger("cluster.retainsync")


class RetainHost(Protocol):
    """What the resync needs of the mesh (``cluster.mesh.Mesh``), declared here so this module
    does not import the mesh (which imports it)."""

    router: Any
    links: dict[str, MeshLink]

    def want_flush(self, link: MeshLink) -> None: ...

    def encode(self, msg: Message, kind: int) -> tuple[tuple[int, int], bytes]: ...


class RetainSync:
    """The mesh's half of peer retained changes: the link ACK held until stored, and the
    resync rule above. The router's half (memory, state log, clears) is in
    ``broker/forwarding.py``."""

    def __init__(self, mesh: RetainHost) -> None:
        self.mesh = mesh
        now = time.monotonic()
        # peer -> when its link last went down (or this router started): a clear at or after
        # it may be unknown to that peer
        self.apart_since: dict[str, float] = dict.fromkeys(mesh.links, now)
        self.refused_syncs = 0  # resynced messages ignored because we cleared them meanwhile
        self._refused_log = RateLimitedLog(log, logging.INFO,
                                           "resynced retained messages cleared while apart",
                                           burst=3, window=10.0)

    def link_down(self, link: MeshLink) -> None:
        self.apart_since[link.peer] = time.monotonic()
        self.mesh.router.remote.forget_clears_before(min(self.apart_since.values()))

    def on_retain(self, link: MeshLink, msg: Message, seq: int) -> None:
        """A RETAIN (or accepted RETAIN_SYNC) entry: kept and stored, ACK held until then."""
        slot = link.inbound.hold(seq)
        mesh = self.mesh

        def stored() -> None:
            link.inbound.release(slot)
            mesh.want_flush(link)  # the ACK that was held

        try:
            mesh.router.remote.retain_from_peer(msg, stored)
        except BaseException:
            # a held slot that is never released would pin the link's ACK for good (the
            # window fills, the peer's resends are dropped as already seen): let it go, and
            # let on_entries count the failure
            stored()
            raise

    def on_sync(self, link: MeshLink, msg: Message, seq: int) -> None:
        """A RETAIN_SYNC entry: taken where we hold nothing for its topic, unless we cleared
        that topic while apart from this peer (then the clear goes back to it)."""
        router: Any = self.mesh.router
        if not msg.payload or router.retained.match(msg.topic):
            return
        if router.remote.cleared_since(msg.topic, self.apart_since[link.peer]):
            self.refused_syncs += 1
            self._refused_log("retained message from %s not taken: it was cleared here while "
                              "the link was down; the clear is sent back to it", link.peer,
                              extra={"topic": msg.topic})
            clear = Message(msg.topic, b"", 0, True, None, None, None)
            head, body = self.mesh.encode(clear, frames.RETAIN)
            link.enqueue(frames.RETAIN, 1, head, body)
            return
        self.on_retain(link, msg, seq)
