"""Is a listening address free for a process that does not share it? Asked before starting
processes that *do* share theirs.

Why: a cluster node's routers bind the node's MQTT ports with ``SO_REUSEPORT`` so the kernel
spreads clients over them. The kernel lets any socket of the same user with that option join
the port, so a second node started by mistake on a port already served (the same config twice,
or a node restarted while the previous one's routers still run) would not fail with
EADDRINUSE as a single node does: its routers would silently take a share of the first one's
clients. A plain bind without ``SO_REUSEPORT`` (``SO_REUSEADDR`` as every listener sets it, so
a TIME_WAIT left by a previous run does not count) is refused by any listener on the port, which
is the question the supervisor and ``meshmq dev-cluster`` ask before starting anything.
"""

from __future__ import annotations

import socket

from broker.settings import ListenerSettings
from meshmq.config import parse_bind

__all__ = ["bind_conflict", "listener_conflicts"]


def bind_conflict(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (the OS's words), or None when it can. Port 0 and
    names that do not resolve are None: the listener itself reports those."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return None
    seen = set()
    for family, type_, proto, _, addr in infos:
        if (family, addr) in seen:
            continue
        seen.add((family, addr))
        with socket.socket(family, type_, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as the listeners: v4 has its own socket
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(addr)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def listener_conflicts(listeners: ListenerSettings) -> list[tuple[str, str, str]]:
    """``(config key, bind, why)`` for each MQTT listener whose address is taken now."""
    taken = []
    for key, bind in (("listener.tcp.bind", listeners.tcp_bind),
                      ("listener.tls.bind", listeners.tls_bind),
                      ("listener.ws.bind", listeners.ws_bind)):
        if bind:
            host, port = parse_bind(bind)
            why = bind_conflict(host, port)
            if why is not None:
                taken.append((key, bind, why))
    return taken
