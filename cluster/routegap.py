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

Bounded in time and work, because the send is one synchronous read on the event loop (it must
be: a live DELIVER to that peer slipping in between would break per-device order). A peer that
stays away (down for hours while this router restarted and took writes) would otherwise have
every record stored since this start read at once when it comes back, stalling every client
and link of this router, and queued onto a link that drops past
``cluster.link_max_queued_bytes`` anyway (review3). So: a peer whose routes have not arrived
``GAP_MAX_S`` after this router started is not waited for (the gap this covers is the seconds
of a restart; a peer away longer was itself down or cut off, and its sessions read back from
their positions, ``broker/positions.py``); the read stops at ``GAP_SCAN_MAX`` records, and at
the first DELIVER the link refuses as full. Each is logged with what is left to the positions.
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
#: A peer's routes arriving later than this after our start get nothing sent (see above).
GAP_MAX_S = 60.0
#: Records read for one peer when its routes arrive: bounds the event loop's stall.
GAP_SCAN_MAX = 100_000


class UnroutedPeers:
    """Per peer whose routes are not known yet: device -> first offset routed meanwhile."""

    def __init__(self, peers: list[str], store: Any, max_devices: int,
                 clock: Callable[[], float] = time.monotonic,
                 scan_max: int = GAP_SCAN_MAX) -> None:
        self.pending: dict[str, dict[str, int]] | None = (
            {peer: {} for peer in peers} if peers and store is not None else None)
        self._store = store
        self._max = max_devices
        self._warned: set[str] = set()
        self._clock = clock
        self._deadline = clock() + GAP_MAX_S
        self._scan_max = scan_max
        # (device, offset) of the records routed again meanwhile (``routed_again``): sent
        # marked ``frames.AGAIN`` when a peer's routes arrive, as they would have gone live
        self._again: set[tuple[str, int]] = set()

    def _past_deadline(self) -> bool:
        """``GAP_MAX_S`` since our start: stop waiting for the peers still unheard of."""
        if self._clock() <= self._deadline:
            return False
        peers = sorted(self.pending or ())
        self.pending = None
        self._again = set()
        log.warning("routes of router(s) %s did not arrive within %g s of this router's start: "
                    "what was routed here before is not sent to them; their sessions read it "
                    "back from their log positions (a device new to a session there is not)",
                    ", ".join(peers), GAP_MAX_S, extra={"peers": peers})
        return True

    def routed(self, device: str, offset: int) -> None:
        """A logged message was routed here while some peers' routes are unknown."""
        if self._past_deadline():
            return
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

    def routed_again(self, device: str, offset: int) -> None:
        """``routed`` for a record routed again (broker/delivery.py ``route_again``: one this
        router's previous run stored, and may have routed): the peers whose routes are not
        known yet get it marked as such (``again``), without QoS 0 copies, as they would
        have live. At most ``scan_max`` remembered (a resend burst after a restart is
        thousands): past it, one goes as a plain DELIVER, as before ``route_again``."""
        self.routed(device, offset)
        if self.pending is not None and len(self._again) < self._scan_max:
            self._again.add((device, offset))

    def again(self, rec: Any) -> bool:
        """Whether the stored record ``rec`` was routed again here (``routed_again``)."""
        return (rec.key, rec.offset) in self._again

    def routes_known(self, peer: str, send: Callable[[Any], bool]) -> int:
        """``peer``'s full route set arrived (its first since this router started): ``send``
        each stored record routed before it (``send`` filters by the peer's routes and says
        whether it sent one: True, False not for that peer, None the link is full). Returns
        how many were sent."""
        if self.pending is None or self._past_deadline():
            return 0
        devices = self.pending.pop(peer, None)
        try:
            return self._send(peer, devices, send) if devices else 0
        finally:
            if not self.pending:
                self.pending = None
                self._again = set()

    def _send(self, peer: str, devices: dict[str, int], send: Callable[[Any], bool]) -> int:
        store = self._store
        sent = 0
        budget = self._scan_max
        stopped = ""
        for device, offset in devices.items():
            while not stopped:
                try:
                    records = store.read(device, offset, min(_CHUNK, budget))
                except OffsetOutOfRangeError:
                    break  # retention removed it meanwhile: nothing left to send
                if not records:
                    break
                for rec in records:
                    offset = rec.offset + 1
                    ok = send(rec)
                    if ok is None:
                        stopped = "its link is full (cluster.link_max_queued_bytes)"
                        break
                    if ok:
                        sent += 1
                budget -= len(records)
                if budget <= 0 and not stopped:
                    stopped = f"{self._scan_max} records were read"
            if stopped:
                break
        if stopped:
            log.warning("router %s's routes arrived: sending it what was stored here before "
                        "then stopped after %d messages, as %s; its sessions read the rest back "
                        "from their log positions", peer, sent, stopped,
                        extra={"peer": peer, "devices": len(devices)})
        elif sent:
            log.info("router %s's routes arrived: %d messages stored here before then sent to it",
                     peer, sent, extra={"peer": peer, "devices": len(devices)})
        return sent


def redeliver(routes: Any, encode: Callable, link: Any, rec: Any,
              again: bool = False) -> bool | None:
    """A stored record routed before ``link``'s peer's routes were known: a DELIVER to that
    peer if one of its routes matches now, encoded (``encode``: ``Mesh.encode``) as
    ``Mesh.forward`` would have sent it (``again``: as ``Mesh.forward_again`` would, marked
    ``frames.AGAIN``). True: sent; False: not for that peer; None: the link is full (it
    counted and logged the drop; nothing more should be tried)."""
    if rec.topic.startswith("$") or link.peer not in routes.peers_for(rec.topic):
        return False
    msg = record_message(rec, Message)
    if msg.expiry_at is not None and msg.expired(time.monotonic()):
        return False
    head, body = encode(msg, frames.DELIVER, msg.device, None,
                        frames.AGAIN if again else None)
    return True if link.enqueue(frames.DELIVER, msg.qos, head, body) else None
