"""Logged messages a router stored before it knew a peer's routes, sent to that peer once it does.

A router that starts (a restart after kill -9 included) knows no peer's routes until each link
comes up and sends its full route set, 70 ms to seconds apart. Meanwhile it stores and routes
what reaches it: its own clients' publishes and the APPENDs the first link back resends (issue
28: 450 to 2,528 messages at 300 msg/s). Those reach no subscriber at a peer whose routes are
still unknown. The peer's sessions read back from their own positions in this router's logs
when the link comes up (``broker/positions.py``), which covers every device they had been
delivered from; this covers the rest (a device new to them): per peer not yet heard from, the
first offset of each device log routed meanwhile, and when that peer's full route set arrives
the records from there to the log end are sent to it as DELIVERs, filtered by its routes as
live routing would have, ahead of everything routed after (per-device order holds on the
link). Duplicates with the peer's own read back are dropped there by the catch-up seam, or
arrive as QoS 1 repeats (never a loss).

The price: DELIVERs carry no time, so a subscription made at that peer while its link to this
router was down also gets what was stored here (since this router started) shortly before it
was made: at least once wins over "nothing older than the subscription" in that window.

Once every peer's routes have arrived this costs nothing: ``pending`` becomes None and
``Mesh.forward`` checks just that. Memory: at most ``mqtt.max_lagging_devices`` devices per peer
(a device name and an offset each); past it a device is not remembered, logged (its messages
are then left to the peer's read back from positions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from broker.devicelogs import record_message
from broker.message import Message
from cluster import frames
from commitlog.store import OffsetOutOfRangeError

log = logging.getLogger("cluster.routegap")

_CHUNK = 1000  # records read per step


class UnroutedPeers:
    """Per peer whose routes are not known yet: device -> first offset routed meanwhile."""

    def __init__(self, peers: list[str], store: Any, max_devices: int) -> None:
        self.pending: dict[str, dict[str, int]] | None = (
            {peer: {} for peer in peers} if peers and store is not None else None)
        self._store = store
        self._max = max_devices
        self._warned: set[str] = set()

    def routed(self, device: str, offset: int) -> None:
        """A logged message was routed here while some peers' routes are unknown."""
        for peer, devices in self.pending.items():  # type: ignore[union-attr]
            if device in devices:
                continue
            if len(devices) >= self._max:
                if peer not in self._warned:
                    self._warned.add(peer)
                    log.warning("more device logs routed before router %s's routes are known "
                                "than mqtt.max_lagging_devices: the rest are left to its "
                                "sessions' read back from their positions", peer,
                                extra={"peer": peer})
                continue
            devices[device] = offset

    def routes_known(self, peer: str, send: Callable[[Any], bool]) -> int:
        """``peer``'s full route set arrived (its first since this router started): ``send``
        each stored record routed before it (``send`` filters by the peer's routes and says
        whether it sent one). Returns how many were sent."""
        if self.pending is None:
            return 0
        devices = self.pending.pop(peer, None)
        if not self.pending:
            self.pending = None
        if not devices:
            return 0
        store = self._store
        sent = 0
        for device, offset in devices.items():
            while True:
                try:
                    records = store.read(device, offset, _CHUNK)
                except OffsetOutOfRangeError:
                    break  # retention removed it meanwhile: nothing left to send
                if not records:
                    break
                for rec in records:
                    offset = rec.offset + 1
                    if send(rec):
                        sent += 1
        if sent:
            log.info("router %s's routes arrived: %d messages stored here before then sent to it",
                     peer, sent, extra={"peer": peer, "devices": len(devices)})
        return sent


def redeliver(routes: Any, encode: Callable, link: Any, rec: Any) -> bool:
    """A stored record routed before ``link``'s peer's routes were known: a DELIVER to that
    peer if one of its routes matches now, encoded (``encode``: ``Mesh._encode``) as
    ``Mesh.forward`` would have sent it."""
    if rec.topic.startswith("$") or link.peer not in routes.peers_for(rec.topic):
        return False
    msg = record_message(rec, Message)
    if msg.expiry_at is not None and msg.expired(time.monotonic()):
        return False
    head, body = encode(msg, frames.DELIVER, msg.device)
    return link.enqueue(frames.DELIVER, msg.qos, head, body)
