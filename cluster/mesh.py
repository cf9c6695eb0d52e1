"""``Mesh``: this router's place in the full mesh, and the forwarder the router calls.

One ``MeshLink`` per other router of the cluster (the lower id dials, the higher accepts on its
mesh port). The router sees only the forwarder side (``broker/forwarding.py`` says what it
calls): ``forward`` after local delivery, ``owner_of``/``append_at`` for logged publishes whose
device log another router owns, ``appended`` when such an append is durable here, ``retained``
for retained-message changes, ``resolve``/``fetch`` to read a log another router owns (offset
replay and catch-up at any router). The cluster calls the router back through ``route(msg,
forward=False)``, ``router.remote`` (``append_for_peer``, ``retain_from_peer``),
``router.shared.deliver_share`` and ``router.sessions_remote.release_session``.

One-hop rule (NATS routes, VerneMQ): a message that arrived over a link is delivered to local
subscribers and never forwarded again, so a full mesh needs no loop detection. Logged messages
are routed by their owner once stored, so every subscriber anywhere sees one device's messages
in the owner's log order. Pushing is not all: when a link comes up, this router's sessions read
the peer's logs back from their positions there (``broker/positions.py``), so what the peer
stored while unreachable, or routed before it had this router's routes, is not lost.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from typing import Any

from broker.devicelogs import resolve_offset
from broker.forwarding import FetchResult, OwnerNotStored
from broker.lograte import RateLimitedLog
from broker.message import Message
from cluster import frames
from cluster.adminrelay import AdminRelay
from cluster.claims import SessionClaims
from cluster.connection import LinkConnection
from cluster.deliverfence import DeliverFence
from cluster.link import Done, LinkFull, MeshLink
from cluster.logserve import FETCH_MAX_RECORDS, RawRecords, fetch_result, serve_fetch
from cluster.peerentries import PeerEntries
from cluster.placement import LOST, UNPLACED, PlacedLogs, Placement
from cluster.requests import Requests
from cluster.retainsync import RetainSync
from cluster.routegap import UnroutedPeers, redeliver
from cluster.routes import CACHE_MAX, RouteTable
from cluster.sendrun import entry_items
from cluster.settings import ClusterSettings, router_id, router_sort_key
from cluster.shares import ShareDispatch

log = logging.getLogger("cluster.mesh")

_ROUTE_OP = {True: frames.ROUTE_ADD, False: frames.ROUTE_DEL}
_DELIVER = frames.DELIVER
# each router's own $SYS view (broker/systopics.py): never forwarded; $SYS/brokers/<node>/<r>/
# (every router's status, named) is
_LOCAL_SYS = "$SYS/broker/"
_READ_TIMEOUT = 10.0  # seconds a FETCH waits for the owner before it fails
# A RESOLVE holds its client's SUBACK and next packets (reading paused): shorter, so a client
# with a short keepalive is not dropped meanwhile.
_RESOLVE_TIMEOUT = 5.0
_MAX_QUEUED_ANSWERS = 64  # FETCH answers waiting on a link that is not writing


class Mesh(PeerEntries):
    def __init__(self, settings: ClusterSettings, router_index: int, router: Any, store: Any,
                 stats: Any, placement: Placement | None = None) -> None:
        self.settings = settings
        self.rid = router_id(settings.node_id, router_index)
        self.router = router
        self.store = store
        self.stats = stats
        self.loop: asyncio.AbstractEventLoop = router.loop
        self.incarnation = os.urandom(16)
        # who leads each device log: the process's one Placement (cluster/placement.py)
        self.placement = placement or Placement(settings.router_ids(), self.rid)
        self.routes = RouteTable()
        # topic -> the links a message on it is forwarded to (() for none): one dict lookup
        # per routed message, emptied at every route change (RouteTable.cache)
        self._forward_to: dict[str, tuple[MeshLink, ...]] = self.routes.cache()
        me = router_sort_key(self.rid)
        self.links: dict[str, MeshLink] = {
            peer: MeshLink(self, peer, me < router_sort_key(peer), settings.address_of(peer))
            for peer in settings.router_ids() if peer != self.rid}
        self.connections: set[LinkConnection] = set()
        self._dirty: set[MeshLink] = set()
        self._flush_handle: asyncio.Handle | None = None
        self._ping_handle: asyncio.TimerHandle | None = None
        self._expire_handle: asyncio.TimerHandle | None = None
        self.server: asyncio.AbstractServer | None = None
        # shared groups across routers; it encodes entries the way every other entry is
        self.shares = ShareDispatch(self.routes, self.links, self.encode)
        # claims, admin relays and log reads waiting for a peer's answer (cluster/requests.py)
        self.requests = Requests(self.loop, self.answer)
        # set by the node wiring: runs an admin request against this router's own admin API
        self.admin_executor: Any = None
        # set by the node wiring under Raft placement: places a device log on its first
        # publish (cluster/raftplace.py, RaftPlacer)
        self.placer: Any = None
        # set by the node wiring under Raft placement: serves followers' FETCHes of the logs
        # this router leads (cluster/replication.py, ReplicaManager)
        self.replication: Any = None
        # set by the node wiring when cluster.leader_affinity_stable > 0: sees each publish
        # proxied to a leader, and may hold it while the leadership moves here
        # (cluster/affinity.py, LeaderAffinity)
        self.affinity: Any = None
        self._refused_log = RateLimitedLog(log, logging.ERROR, "mesh handshakes refused",
                                           burst=3, window=10.0)
        self._entry_log = RateLimitedLog(log, logging.ERROR, "mesh entries not applied",
                                         burst=3, window=10.0)
        self.entry_failures = 0
        self._fenced_log = RateLimitedLog(log, logging.WARNING, "mesh APPENDs fenced",
                                          burst=3, window=10.0)
        self.retain_sync = RetainSync(self)  # peer retained changes (cluster/retainsync.py)
        # what was routed here before a peer's routes were known (cluster/routegap.py)
        self.unrouted = UnroutedPeers(list(self.links), store,
                                      router.mqtt.max_lagging_devices)
        # a deposed leader's DELIVERs dropped, sessions read back (cluster/deliverfence.py)
        self.deliver_fence = DeliverFence(self.placement.known_epoch, router.positions.logs_moved,
                                          self.loop.call_soon)
        self.admin_relay = AdminRelay(self)  # admin requests run at a log's owner
        self.claims = SessionClaims(self)  # a client's session released by other routers

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        host, port = self.settings.address_of(self.rid)
        bind = host if _is_ip(host) else "0.0.0.0"
        self.server = await self.loop.create_server(lambda: LinkConnection(self, None), bind,
                                                    port, reuse_address=True)
        self.router.forwarder = self
        self.router.trie.on_route_change = self._route_changed
        if self.router.logs is not None:
            self.router.logs.remote_owner = self.owner_of
        for link in self.links.values():
            if link.dial:
                link.dial_now()
        self._ping_handle = self.loop.call_later(self.settings.link_timeout / 3, self._ping)
        self._expire_handle = self.loop.call_later(self._expire_every(), self._expire)
        log.info("mesh listening", extra={"router": self.rid, "mesh": f"{bind}:{port}",
                                          "peers": len(self.links)})

    async def close(self) -> None:
        if self._ping_handle is not None:
            self._ping_handle.cancel()
        if self._expire_handle is not None:
            self._expire_handle.cancel()
        self._flush()
        self.requests.fail_all("this router is shutting down")
        for link in self.links.values():
            link.fail_pending("this router is shutting down")
            link.close()
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.close()
        self.router.forwarder = None

    def handshake_args(self) -> tuple:
        return (self.settings.name, self.rid, self.settings.secret, self.incarnation,
                set(self.links), self._resume_point, self.settings.protocol_version)

    def _resume_point(self, peer: str, incarnation: bytes) -> int:
        return self.links[peer].resume_point(incarnation)

    def refused(self, peer: str | None, why: str) -> None:
        self._refused_log("mesh link refused (%s): %s", peer or "unknown peer", why)

    def _ping(self) -> None:
        now = time.monotonic()
        timeout = self.settings.link_timeout
        for link in self.links.values():
            conn = link.conn
            if conn is None:
                continue
            if now - conn.last_recv > timeout:
                log.warning("mesh link silent for %.1f s (cluster.link_timeout): closing it",
                            now - conn.last_recv, extra={"peer": link.peer})
                conn.close()
                continue
            conn.write(frames.encode_ping(frames.PING, time.monotonic_ns()))
        self._ping_handle = self.loop.call_later(timeout / 3, self._ping)

    def _expire_every(self) -> float:
        # a quarter of the timeout, at most 0.5 s: a publish is refused at most that late
        return min(0.5, self.settings.append_timeout / 4)

    def _expire(self) -> None:
        """cluster.append_timeout: publishes whose owner has not answered are refused (the
        link does it, ``MeshLink.expire_appends``; the refusals go out with the router's next
        write flush)."""
        now = time.monotonic()
        timeout = self.settings.append_timeout
        try:
            for link in self.links.values():
                if link.awaiting:
                    link.expire_appends(now, timeout)
        finally:  # (whatever happened, the timer goes on: else nothing is refused any more)
            self._expire_handle = self.loop.call_later(self._expire_every(), self._expire)

    # -- batching ---------------------------------------------------------------------------
    def want_flush(self, link: MeshLink) -> None:
        # ``flush_wanted`` lets the link skip this call for its 2nd..Nth entry of a tick (it
        # was two calls per crossing message): set only here, with the link in ``_dirty``
        link.flush_wanted = True
        self._dirty.add(link)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        dirty, self._dirty = self._dirty, set()
        for link in dirty:  # all first: a flush that raises must not leave a link marked
            link.flush_wanted = False  # as wanting a flush that is no longer scheduled
        for link in dirty:
            link.flush()

    # -- routes -----------------------------------------------------------------------------
    def local_routes(self) -> list[tuple[int, str, str | None]]:
        return [(frames.ROUTE_ADD, flt, group) for flt, group in self.router.trie.routes()]

    def _route_changed(self, flt: str, group: str | None, added: bool) -> None:
        change = [(_ROUTE_OP[added], flt, group)]
        for link in self.links.values():
            if link.state == "up":
                link.send_routes(change)

    def peer_routes(self, link: MeshLink, full: bool,
                    changes: list[tuple[int, str, str | None]]) -> None:
        if full:
            self.routes.replace(link.peer, [(f, g) for op, f, g in changes
                                            if op == frames.ROUTE_ADD])
            if self.unrouted.pending is not None:
                unrouted = self.unrouted
                unrouted.routes_known(link.peer, lambda rec: redeliver(
                    self.routes, self.encode, link, rec, unrouted.again(rec)))
            return
        for op, flt, group in changes:
            if op == frames.ROUTE_ADD:
                self.routes.add(link.peer, flt, group)
            else:
                self.routes.remove(link.peer, flt, group)

    def link_up(self, link: MeshLink) -> None:
        # Retained messages the peer may lack (it restarted, or missed changes while apart):
        # it keeps its own where it has one (see RETAIN_SYNC in on_entries).
        for msg in self.router.retained.match("#"):
            head, body = self.encode(msg, frames.RETAIN_SYNC)
            link.enqueue(frames.RETAIN_SYNC, 1, head, body)
        # What the peer stored while unreachable (or routed before it had our routes, just
        # restarted) is read back from its logs from each session's position there
        # (broker/positions.py); after the routes written just before, so nothing falls between.
        self.router.positions.owner_back(link.peer, self.owner_of)

    def link_down(self, link: MeshLink) -> None:
        # The peer's routes stay: what is published meanwhile queues on the link (bounded) and
        # is delivered when it heals (EMQX learned to treat "down" as "unreachable", not "dead",
        # PR emqx#14248); the full sync on reconnect replaces them.
        self.retain_sync.link_down(link)
        self.fail_requests(link, f"the link to owner router {link.peer} went down")

    def fail_requests(self, link: MeshLink, why: str) -> None:
        """Requests sent on a connection that is gone (down, or replaced by a newer one) stop
        waiting for it: a log read fails now (its reader retries), a relay answers 503, a
        claim no longer waits for that router. An answer can no longer come for them."""
        self.requests.link_down(link, why)

    def on_request_frame(self, link: MeshLink, ftype: int, body: bytes) -> None:
        """A request or an answer from a peer (the link hands them up: MeshLink.on_frame)."""
        if ftype == frames.CLAIM or ftype == frames.CLAIMED:
            self.claims.on_frame(link, ftype, body)
        elif ftype == frames.ADMIN_REQUEST or ftype == frames.ADMIN_RESPONSE:
            self.admin_relay.on_frame(link, ftype, body)
        else:
            self.on_fetch_frame(link, ftype, body)

    # -- the forwarder (called by the router) -------------------------------------------------
    def forward(self, msg: Message) -> None:
        """Once to each peer with a matching filter, after local delivery (never from a peer)."""
        if self.unrouted.pending is not None and msg.device is not None:
            self.unrouted.routed(msg.device, msg.offset)  # some peers' routes not known yet
        links = self._forward_to.get(msg.topic)
        if links is None:
            links = self._links_for(msg.topic)
        if not links:
            return
        # a logged message carries its log position: a peer's offset subscription needs it for
        # the seam between the history it reads and live delivery (devicelogs.ReplayCursor).
        # The plain case (no properties, no expiry) in one C call, as ``encode`` would do it.
        body_of = frames.c_entry_body
        encoded = (body_of(msg.topic, msg.payload, msg.qos, msg.retain, msg.origin,
                           msg.device, msg.offset, None, None)
                   if body_of is not None and not msg.properties and msg.expiry_at is None
                   else None)
        head, body = (encoded if encoded is not None
                      else self.encode(msg, frames.DELIVER, msg.device))
        # the epoch it is routed at: a receiver that knows a newer one drops it (protocol 4)
        epoch = 0 if msg.device is None else self.placement.epoch_of(msg.device)
        for link in links:  # a full link counts and logs what it drops (MeshLink.enqueue)
            link.deliver(msg.qos, head, body, epoch)

    def forward_again(self, msg: Message) -> None:
        """``forward`` for ``route_again`` (a record a restarted router found stored by its
        previous run): each DELIVER marked ``frames.AGAIN``, so the peer routes it as
        ``route_again`` does, without QoS 0 copies. Rare (a resend after a restart): no run,
        no C shortcut."""
        if self.unrouted.pending is not None and msg.device is not None:
            self.unrouted.routed_again(msg.device, msg.offset)
        links = self._forward_to.get(msg.topic)
        if links is None:
            links = self._links_for(msg.topic)
        if not links:
            return
        head, body = self.encode(msg, frames.DELIVER, msg.device, None, frames.AGAIN)
        epoch = 0 if msg.device is None else self.placement.epoch_of(msg.device)
        for link in links:
            link.deliver(msg.qos, head, body, epoch)

    def forward_run(self, topic: str, payloads: list[bytes], origin: str | None) -> None:
        """``forward`` for a run of plain QoS 0 messages on an unlogged topic, no properties,
        no expiry (broker/publishrun.py): the links looked up once, each entry encoded by
        the same C call, in order on every link (a run is asked for only while no peer has
        shared-group members: ``plain_runs``)."""
        links = self._forward_to.get(topic)
        if links is None:
            links = self._links_for(topic)
        if not links:
            return
        # the run's entries made in one call, appended to each link's queue in one step
        # (a call and a Python step per entry on each side were most of what a crossing cost
        # the sending router: bench.costguard crossing, 2026-11-27)
        made = (frames.c_entry_items or entry_items)(topic, payloads, 0, origin, 0)
        if made is None:  # a payload not bytes: the per-message path, as ``forward`` does
            for payload in payloads:
                self.forward(Message(topic, payload, 0, False, None, None, origin))
            return
        items, body_bytes = made
        count = len(payloads)
        for link in links:
            link.deliver_run(0, items, count, body_bytes)

    def plain_runs(self) -> bool:
        """Whether a run of plain QoS 0 publishes may be routed as one: not while a peer has
        members of a shared group, whose share is picked per message (cluster/shares.py)."""
        return not self.routes.has_groups

    def _links_for(self, topic: str) -> tuple[MeshLink, ...]:
        """``forward``'s cache miss: the links of the peers with a matching filter (none for
        this router's own $SYS topics), cached until the next route change."""
        peers = () if topic.startswith(_LOCAL_SYS) else self.routes.match_peers(topic)
        links = tuple(self.links[peer] for peer in peers)
        if len(self._forward_to) >= CACHE_MAX:
            self._forward_to.clear()
        self._forward_to[topic] = links
        return links

    def share(self, msg: Message, groups: list) -> list:
        """Which router's members of each matching group get ``msg`` (cluster/shares.py)."""
        if not self.routes.has_groups:  # no peer has members: the local groups (one call less
            return groups  # per routed message, almost every one)
        return self.shares.share(msg, groups)

    def hand_on(self, msg: Message, key: tuple[str, str]) -> bool:
        """A share with no connected member here, to another router's (cluster/shares.py)."""
        return self.shares.hand_on(msg, key)

    def devices(self) -> PlacedLogs | None:
        """Every device log Raft placed (None under the static hash): broker/resumepoints.py."""
        return self.placement.devices()

    def owner_of(self, device: str) -> str | None:
        """The router leading a device log now, or None when it is this one (asked of the
        placement at every call: a leader moves; before that, the router whose DELIVERs
        showed a newer epoch than the placement knows: cluster/deliverfence.py)."""
        if self.deliver_fence.ahead:  # almost always empty: one truth test per call
            newer = self.deliver_fence.leader_ahead(device)
            if newer is not None:
                return None if newer == self.rid else newer
        return self.placement.owner_of(device)

    def append_at(self, owner: str, device: str, msg: Message, expiry: int | None,
                  done: Done) -> None:
        """Send a publish to its device log's owner; ``done(error, offset)`` once it is durable
        there (or refused)."""
        link = self.links.get(owner)
        if link is None:
            if owner == UNPLACED and self.placer is not None:
                # Raft has not placed this log yet: held until it does (cluster/raftplace.py)
                self.placer.hold(device, msg, expiry, done)
                return
            # no router leads the log now (placement.NO_LEADER), or it was lost (LOST)
            done(OwnerNotStored(f"the log of {device!r} lost acknowledged records with every "
                                "replica (meshmq cluster status)" if owner == LOST else
                                f"no router leads the log of {device!r} now"), -1)
            return
        if self.affinity is not None:
            done = self.affinity.observe(owner, device, msg, expiry, done)
            if done is None:
                return  # held: its device's leadership moves here (cluster/affinity.py)
        pub = msg.publisher  # the client's identity, for a resend's lookup there
        head, body = self.encode(msg, frames.APPEND, device, expiry, None if pub is None
                                 else frames.publisher_fields(pub, msg.maybe_stored))
        # the epoch we believe the owner leads at: it fences the APPEND if that is stale
        if not link.enqueue(frames.APPEND, msg.qos, head, body, done,
                            self.placement.epoch_of(device), (device, msg, expiry)):
            done(LinkFull(f"the link to owner router {owner} is full"), -1)

    def appended(self, ticket: Any, msg: Message, exc: BaseException | None) -> None:
        """A remote APPEND is durable here (or failed): tell the publisher's router."""
        link, slot, incarnation = ticket
        if link is None:  # a publish held for its placement, appended here (raftplace.py)
            slot(exc, msg.offset)
            return
        link.append_done(slot, incarnation, exc, msg.offset)


    def retained(self, msg: Message) -> None:
        """A retained message set or cleared here: every router keeps the same set."""
        if msg.topic.startswith(_LOCAL_SYS):
            return
        head, body = self.encode(msg, frames.RETAIN)
        for link in self.links.values():
            link.enqueue(frames.RETAIN, 1, head, body)

    def encode(self, msg: Message, kind: int, device: str | None = None,
                expiry: int | None = None, group: tuple[str, str] | None = None
                ) -> tuple[tuple[int, int], bytes]:
        if expiry is None and msg.expiry_at is not None:
            expiry = msg.remaining_expiry()
        if not msg.properties and frames.c_entry_body is not None:
            # the same bytes in one C call (cluster/_speedups.c); None: a payload not bytes
            encoded = frames.c_entry_body(msg.topic, msg.payload, msg.qos, msg.retain,
                                          msg.origin, device, msg.offset, expiry, group)
            if encoded is not None:
                return encoded
        flags, tlen, body = frames.entry_body(
            kind, msg.topic, msg.payload, msg.qos, msg.retain, msg.properties, msg.origin,
            device, msg.offset, expiry, group)
        return (flags, tlen), body

    # -- sessions across routers -------------------------------------------------------------
    def claim(self, client_id: str, clean: bool, done: Any, to: str | None = None,
              timeout: float | None = None) -> None:
        """A client connected here: ``SessionClaims.claim`` (cluster/claims.py)."""
        self.claims.claim(client_id, clean, done, to, timeout)

    # -- admin requests relayed to a device log's owner (cluster/adminrelay.py) ----------------
    async def relay(self, owner: str, method: str, path: str, headers: list[tuple[str, str]],
                    body: bytes, timeout: float) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Run an admin request at ``owner``: ``AdminRelay.relay``."""
        return await self.admin_relay.relay(owner, method, path, headers, body, timeout)

    # -- reading device logs other routers own (offset replay at any router) -------------------
    def resolve(self, owner: str, device: str, spec: str, reset: str, done: Any) -> None:
        """Ask ``owner`` where an offset subscription of ``device`` starts; ``done(offset or
        None, why)``. Sent after the routes of the same flush (MeshLink.requests): the owner
        has the subscription's route before it resolves, so what it routes after the answer
        reaches this router, and what it stored before is below the answered offset."""
        if owner == UNPLACED and self.store is not None:
            # Raft placement, no log yet: it starts empty wherever its first publish places it
            # (the route above reaches that router first), so it resolves as an empty log
            self.loop.call_soon(self.answer, done,
                                *resolve_offset(self.store, device, spec, reset))
            return
        req = self._read(owner, done, lambda why: done(None, why), _RESOLVE_TIMEOUT)
        if req:
            self.links[owner].send_request(frames.encode_resolve(req, device, spec, reset))

    def fetch(self, owner: str, device: str, offset: int, max_records: int, done: Any) -> None:
        """Read committed records of ``device`` from ``offset`` at its owner; ``done`` gets a
        ``FetchResult`` (the records decoded here, from the bytes the owner stored)."""
        req = self._read(owner, done,
                         lambda why: done(FetchResult("failed", [], -1, -1, offset, why)),
                         _READ_TIMEOUT)
        if req:
            link = self.links[owner]
            # a reader, not a replica: no replica id and no last fetched epoch, so the leader
            # serves it as a read even when this router is also one of the log's followers
            # (the follower's own fetch, cluster/fetcher.py, names itself: a reader naming
            # itself was taken for the follower, its offset for the follower's log end)
            link.send_request(frames.encode_fetch(frames.Fetch(
                req, device, offset, min(max_records, FETCH_MAX_RECORDS), ""),
                link.version))

    def _read(self, owner: str, done: Any, fail: Any, timeout: float) -> int:
        """Register a read of ``owner``'s log; 0 (and ``fail`` soon) when it is unreachable."""
        link = self.links.get(owner)
        if link is None or link.state != "up" or link.conn is None:
            self.loop.call_soon(fail, f"the owner router {owner} is unreachable")
            return 0
        req = self.requests.open((link,), timeout, lambda why, _late: fail(why),
                                 f"no answer from the owner router {owner} in {timeout:.0f} s")
        req.done = done
        return req.id

    def _read_answered(self, link: MeshLink, req_id: int) -> Any:
        """The read's ``done``, or None when it was answered after its timeout (the reader
        asked again, or gave up) or on another link."""
        req = self.requests.answer(link, req_id)
        return None if req is None else req.done

    def on_fetch_frame(self, link: MeshLink, ftype: int, body: bytes) -> None:
        if ftype == frames.FETCH:
            fetch = frames.decode_fetch(body, link.version)
            if len(link.requests) >= _MAX_QUEUED_ANSWERS:
                # the link is not writing (paused) and answers pile up outside its queue's
                # bound: a short refusal instead of another MiB (the reader retries)
                link.send_request(frames.encode_records(frames.Records(
                    fetch.request, frames.RECORDS_FAILED, -1, -1, fetch.offset,
                    b"the owner's link to this router is busy"), link.version))
                return
            rep = self.replication
            # a replica's fetch comes from that replica itself: its id is the link's peer (a
            # reader's FETCH names no replica; one naming another router is served as a read,
            # never counted toward the high-water mark)
            if rep is not None and fetch.replica == link.peer \
                    and rep.serves(fetch.device, fetch.replica):
                rep.serve(fetch, lambda r: link.send_request(  # maybe later: parked
                    frames.encode_records(r, link.version)))
                return
            link.send_request(frames.encode_records(self._serve_fetch(fetch), link.version))
        elif ftype == frames.RESOLVE:
            req, device, spec, reset = frames.decode_resolve(body)
            if self.owner_of(device) is not None or self.router.logs is None:
                offset, why = None, f"router {self.rid} does not own the log of {device!r}"
            else:
                offset, why = resolve_offset(self.store, device, spec, reset)
            link.send_request(frames.encode_resolved(req, offset, why))
        elif ftype == frames.RESOLVED:
            req, offset, why = frames.decode_resolved(body)
            done = self._read_answered(link, req)
            if done is not None:
                self.answer(done, offset, why)
        else:
            self._on_records(link, body)

    def answer(self, done: Any, *args: Any) -> None:
        """Run a read's callback: it delivers to clients right away, and whatever one of them
        raises must not escape into the link's frame loop (that would close the link, for
        every flow on it, as in on_entries)."""
        try:
            done(*args)
        except Exception as err:  # noqa: BLE001 - logged, the link goes on
            self.entry_failures += 1
            self._entry_log("handling the answer to a log read failed (counted in "
                            "meshmq_link_entry_failures_total): %r", err)

    def _serve_fetch(self, f: frames.Fetch) -> frames.Records:
        """A peer's read of a log this router leads (cluster/logserve.py)."""
        if self.owner_of(f.device) is not None or self.router.logs is None:
            return frames.Records(f.request, frames.RECORDS_NOT_OWNER, -1, -1, f.offset,
                                  f"router {self.rid} does not own {f.device!r}".encode(),
                                  leader_epoch=self.placement.epoch_of(f.device))
        return serve_fetch(self.store, f, self.placement.epoch_of(f.device))

    def _on_records(self, link: MeshLink, body: bytes) -> None:
        r = frames.decode_records(body, link.version)
        done = self._read_answered(link, r.request)
        if done is not None:
            self.answer(done, r if isinstance(done, RawRecords) else fetch_result(r))

    # -- operations -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        local = len(self.router.trie.routes())  # what every up link has been told
        return {
            "router": self.rid, "cluster": self.settings.name,
            "links": [link.status(local) for link in self.links.values()],
            "local_filters": local,
            "peer_routes": len(self.routes),
        }


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False
