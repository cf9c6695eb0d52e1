"""``LinkConnection``: one TCP connection carrying a mesh link for a while.

Thin I/O (rumqttd's link/router split): it feeds bytes to the frame reader and, until the
handshake is done, to the handshake (``cluster/handshake.py``), then hands whole frames to its
link (``cluster/link.py``). It knows the link and the mesh only through the two small
interfaces below, so nothing here imports them (the link imports this module: one way).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any, Protocol

from cluster import frames
from cluster.handshake import (
    AcceptorHandshake,
    DialerHandshake,
    Established,
    HandshakeRefused,
)

log = logging.getLogger("cluster.link")  # the link's logger: one place to look for a link

_WRITE_HIGH_WATER = 4 << 20  # transport buffer above which the link stops writing (paused)
_HANDSHAKE_TIMEOUT = 5.0


class ConnectedLink(Protocol):
    """What a connection needs of its link (``cluster.link.MeshLink``)."""

    peer: str
    state: str

    def on_frame(self, ftype: int, body: bytes) -> None: ...

    def established(self, conn: LinkConnection, est: Established) -> None: ...

    def lost(self, conn: LinkConnection, why: str) -> None: ...

    def schedule_dial(self) -> None: ...

    def want_flush(self) -> None: ...


class ConnectionHost(Protocol):
    """What a connection needs of the mesh (``cluster.mesh.Mesh``)."""

    loop: asyncio.AbstractEventLoop
    connections: set[Any]

    @property
    def links(self) -> Mapping[str, Any]: ...  # peer -> its ConnectedLink

    def handshake_args(self) -> tuple: ...

    def refused(self, peer: str | None, why: str) -> None: ...


class LinkConnection(asyncio.Protocol):
    """One TCP connection of a link: handshake first, then frames to the link."""

    def __init__(self, mesh: ConnectionHost, link: ConnectedLink | None) -> None:
        self.mesh = mesh
        self.link = link  # known when we dialled; set after the handshake when we accepted
        self.transport: asyncio.Transport | None = None
        self.reader = frames.FrameReader()
        self.paused = False
        self.remote: str | None = None
        self.last_recv = time.monotonic()
        self._closed = False
        if link is not None:
            self.hs: DialerHandshake | AcceptorHandshake | None = DialerHandshake(
                *mesh.handshake_args(), peer=link.peer)
        else:
            self.hs = AcceptorHandshake(*mesh.handshake_args())
        self.peer = link.peer if link is not None else None
        self.established = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        self.mesh.connections.add(self)
        # a connection that does not finish the handshake in time (a port scanner, a peer
        # frozen mid-handshake) is closed: nothing else would ever time it out
        self._deadline = self.mesh.loop.call_later(_HANDSHAKE_TIMEOUT, self._handshake_late)
        peername = transport.get_extra_info("peername")
        self.remote = f"{peername[0]}:{peername[1]}" if peername else None
        if isinstance(self.hs, DialerHandshake):
            self.write(self.hs.start())

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(data)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.link is not None and self.established:
            self.link.want_flush()

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        try:
            for ftype, body in self.reader.feed(data):
                if self._closed:
                    return
                if self.established:
                    self.link.on_frame(ftype, body)  # type: ignore[union-attr]
                    continue
                out, est = self.hs.on_frame(ftype, body)  # type: ignore[union-attr]
                if out:
                    self.write(out)
                if est is not None:
                    self._established(est)
        except HandshakeRefused as err:
            self.mesh.refused(self.peer, err.why)
            if err.tell_peer:
                self.write(frames.encode_refuse(err.tell_peer))
            self.close()
        except frames.FrameError as err:
            log.error("mesh link protocol error, closing the connection: %s", err,
                      extra={"peer": self.peer})
            self.close()

    def _handshake_late(self) -> None:
        if not self.established and not self._closed:
            log.warning("mesh handshake not finished in %.0f s: closing the connection",
                        _HANDSHAKE_TIMEOUT, extra={"peer": self.peer, "remote": self.remote})
            self.close()

    def _established(self, est: Established) -> None:
        self._deadline.cancel()
        self.hs = None
        self.established = True
        self.peer = est.peer
        if self.link is None:
            self.link = self.mesh.links[est.peer]
        self.link.established(self, est)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
        self.mesh.connections.discard(self)
        if self.link is not None and self.established:
            self.link.lost(self, f"connection closed ({exc or 'EOF'})")
        elif self.link is not None:
            self.link.state = "down"
            self.link.schedule_dial()

    def detach(self) -> None:
        """Superseded by a newer connection of the same link: its loss means nothing now."""
        self.established = False
        self.link = None

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._closed = True
            self.transport.close()
