"""Listeners: TCP, TLS and MQTT over WebSocket, all feeding the same ``Connection`` protocol.

TCP uses ``loop.create_server`` directly (uvloop's fastest path); TLS accepts sockets itself and
gives each to ``loop.connect_accepted_socket`` so a failed handshake can be logged (see
``_TlsListener``), after which the data path is the same. WebSocket uses aiohttp's
server (a real HTTP/WebSocket implementation, not a hand-rolled parser) and adapts each socket to
the small transport surface ``Connection`` needs, so the MQTT code cannot tell the difference.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from aiohttp import WSMsgType, web

from broker.connection import Connection
from broker.router import Router
from broker.settings import ListenerSettings
from broker.stats import BrokerStats, ListenerStats

log = logging.getLogger("broker.listener")


def parse_bind(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    return host.strip("[]"), int(port)


class _WsTransport(asyncio.Transport):
    """The slice of ``asyncio.Transport`` that ``Connection`` uses, over an aiohttp WebSocket.

    Each ``write`` becomes one binary frame (the connection already batches per tick). Sends are
    chained on one task so frame order is kept without an ``await`` in the MQTT code path.
    """

    def __init__(self, ws: web.WebSocketResponse, peer: Any, loop: asyncio.AbstractEventLoop,
                 high: int = 1_048_576) -> None:
        super().__init__()
        self._ws = ws
        self._peer = peer
        self._loop = loop
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._sender: asyncio.Task | None = None
        self._closing = False
        self._high = high
        self._paused_protocol = False
        self.protocol: Connection | None = None
        self.reading_paused = asyncio.Event()
        self.reading_paused.set()  # set = reading allowed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is not None:
            self._high = high

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > self._high and not self._paused_protocol and self.protocol:
            self._paused_protocol = True
            self.protocol.pause_writing()
        if self._sender is None:
            self._sender = self._loop.create_task(self._send_all())

    async def _send_all(self) -> None:
        try:
            while self._pending:
                data = b"".join(self._pending)
                self._pending.clear()
                self._pending_bytes = 0
                await self._ws.send_bytes(data)
                if self._paused_protocol and self.protocol:
                    self._paused_protocol = False
                    self.protocol.resume_writing()
        except (ConnectionError, RuntimeError):
            self._pending.clear()
        finally:
            self._sender = None
            if self._closing:
                await self._ws.close()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._sender is None:
            self._loop.create_task(self._ws.close())

    def abort(self) -> None:
        self._closing = True
        self._pending.clear()
        self._loop.create_task(self._ws.close())

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        self.reading_paused.clear()

    def resume_reading(self) -> None:
        self.reading_paused.set()


def _handshake_failure(exc: BaseException, timed_out: float | None) -> tuple[str, str]:
    """(reason label for the metric, text for the log) of a failed server-side TLS handshake;
    ``timed_out`` is the deadline in seconds when it had passed."""
    if timed_out is not None or isinstance(exc, TimeoutError) or \
            "taking longer than" in str(exc):
        # uvloop aborts an overdue handshake with ConnectionAbortedError("... taking longer")
        within = f" within {timed_out:g} s (mqtt.connect_timeout)" if timed_out else " in time"
        return "timeout", f"the client did not finish the handshake{within}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "client_certificate", f"client certificate refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        text = exc.reason or str(exc)
        if exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "client_certificate", "the client sent no certificate (listener.tls.cafile " \
                                         "requires one)"
        if exc.reason in ("TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
                          "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_CERTIFICATE_EXPIRED"):
            # The client's alert: it does not trust what listener.tls.certfile presents.
            return "server_certificate", f"the client refused this server's certificate " \
                f"({text}): does a CA the device trusts sign listener.tls.certfile, for the " \
                "name it connects to?"
        if exc.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNEXPECTED_RECORD",
                          "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
            return "not_tls", f"the client is not speaking TLS ({text}): plain MQTT belongs " \
                              "on the TCP listener"
        return "tls_error", text
    return "closed", "the client closed the connection during the handshake"


class _TlsListener:
    """The TLS listener: accepts sockets itself and runs each handshake as its own task.

    ``create_server(ssl=...)`` would do the same handshake, but uvloop reports a failed one (an
    ``SSLError`` is an ``OSError``) only with loop debug on, and no ``Connection`` exists yet to
    notice: a device with the wrong CA, an unsigned client certificate, or plain MQTT on the TLS
    port just vanished without a log line. Mosquitto and EMQX log those; so do we, with a count
    per reason. ``loop.connect_accepted_socket`` wraps the socket in the same ``SSLProtocol``
    from its first byte (no race with ``start_tls``, which is for STARTTLS) and raises the
    handshake's error; the data path afterwards is the one ``create_server`` would have built.
    """

    def __init__(self, listeners: Listeners, ctx: ssl.SSLContext, lstats: ListenerStats) -> None:
        self._listeners = listeners
        self.ctx = ctx  # replaced by Listeners.reload_tls; each handshake takes the current one
        self._lstats = lstats
        self._socks: list[socket.socket] = []
        self._handshakes: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        self.reuse_port = listeners.settings.reuse_port  # a cluster node's routers share it

    def listen(self, host: str, port: int) -> None:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        seen = set()
        for family, type_, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, type_, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:  # as create_server: v4 gets its own socket
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(4096)
                sock.setblocking(False)
            except OSError:
                sock.close()
                self.close()
                raise
            self._socks.append(sock)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, lsock: socket.socket) -> None:
        for _ in range(64):  # a bounded batch per wake-up, like asyncio's server
            try:
                sock, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: out of descriptors or memory
                log.error("accept failed on the TLS listener; pausing it for 1 s (raise the "
                          "process's open-files limit?)", extra={"error": str(exc)})
                self._loop.remove_reader(lsock.fileno())
                self._loop.call_later(1.0, self._resume, lsock)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._handshake(sock))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    def _resume(self, lsock: socket.socket) -> None:
        if lsock in self._socks:
            self._loop.add_reader(lsock.fileno(), self._accept, lsock)

    async def _handshake(self, sock: socket.socket) -> None:
        lst = self._listeners
        try:
            peer = sock.getpeername()
        except OSError:
            peer = None
        # The CONNECT deadline also bounds the handshake: no CONNECT can come before it.
        timeout = lst.router.settings.mqtt.connect_timeout
        started = self._loop.time()
        try:
            await self._loop.connect_accepted_socket(
                lambda: Connection(lst.router, self._lstats, lst.stats), sock, ssl=self.ctx,
                ssl_handshake_timeout=timeout)
        except asyncio.CancelledError:
            sock.close()
            raise
        except (OSError, TimeoutError, ConnectionError) as exc:
            sock.close()  # the transport closed it already, unless it failed before taking it
            late = self._loop.time() - started >= timeout
            reason, text = _handshake_failure(exc, timeout if late else None)
            self._lstats.tls_handshake_failures[reason] = \
                self._lstats.tls_handshake_failures.get(reason, 0) + 1
            extra = {"listener": self._lstats.name, "reason": reason,
                     "peer": f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"}
            # A load balancer's TCP probe connects and closes: that is not a broken device.
            level = logging.DEBUG if reason == "closed" else logging.WARNING
            log.log(level, f"TLS handshake failed: {text}", extra=extra)

    def close(self) -> None:
        for sock in self._socks:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._socks.clear()
        for task in self._handshakes:  # not a client yet: nothing to drain
            task.cancel()

    async def wait_closed(self) -> None:
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)


def _bound(bind: str, socks: object) -> str:
    """The address a listener really got: with port 0 the kernel picks one, and the log and the
    ready line must say which (they said ":0")."""
    for sock in socks or ():  # type: ignore[attr-defined]
        addr = sock.getsockname()
        if isinstance(addr, tuple):
            host = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
            return f"{host}:{addr[1]}"
    return bind


class Listeners:
    def __init__(self, router: Router, settings: ListenerSettings, stats: BrokerStats) -> None:
        self.router = router
        self.settings = settings
        self.stats = stats
        self._servers: list[asyncio.AbstractServer | _TlsListener] = []
        self._ws_runner: web.AppRunner | None = None
        self.ws_handlers: set[asyncio.Task] = set()
        # listener -> the address really bound ("host:port"; differs from the config for port 0)
        self.bound: dict[str, str] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.settings
        if s.tcp_bind:
            await self._serve(loop, "tcp", s.tcp_bind, None)
        if s.tls_bind:
            await self._serve(loop, "tls", s.tls_bind, self._tls_context())
        if s.ws_bind:
            await self._serve_ws(s.ws_bind, s.ws_path)

    def _tls_context(self) -> ssl.SSLContext:
        s = self.settings
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(s.tls_certfile, s.tls_keyfile)
        if s.tls_cafile:
            ctx.load_verify_locations(s.tls_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def reload_tls(self) -> bool | None:
        """Re-read the TLS listener's certificate, key and CA files (SIGHUP; Mosquitto 2.0 does
        the same, so a renewed certificate needs no restart). New handshakes use them; open
        connections keep the session they have. Unreadable or mismatched files leave the old
        context serving and log which setting to fix. None when there is no TLS listener."""
        tls = [srv for srv in self._servers if isinstance(srv, _TlsListener)]
        if not tls:
            return None
        s = self.settings
        try:
            ctx = self._tls_context()
        except (OSError, ssl.SSLError) as exc:
            log.error("SIGHUP: TLS files not reloaded, still serving the previous certificate: "
                      "%s (check listener.tls.certfile, keyfile and cafile)", exc,
                      extra={"certfile": s.tls_certfile, "keyfile": s.tls_keyfile,
                             "cafile": s.tls_cafile or ""})
            return False
        for srv in tls:
            srv.ctx = ctx
        log.info("SIGHUP: TLS certificate reloaded",
                 extra={"certfile": s.tls_certfile, "cafile": s.tls_cafile or ""})
        return True

    async def _serve(self, loop: asyncio.AbstractEventLoop, name: str, bind: str,
                     ctx: ssl.SSLContext | None) -> None:
        host, port = parse_bind(bind)
        lstats = self.stats.listener(name)
        server: asyncio.AbstractServer | _TlsListener
        if ctx is None:
            server = await loop.create_server(
                lambda: Connection(self.router, lstats, self.stats), host, port, backlog=4096,
                reuse_address=True, reuse_port=self.settings.reuse_port or None)
        else:
            server = _TlsListener(self, ctx, lstats)
            server.listen(host, port)
        self._servers.append(server)
        socks = server.sockets if ctx is None else server._socks
        self.bound[name] = _bound(bind, socks)
        log.info("listening", extra={"listener": name, "bind": self.bound[name]})

    async def _serve_ws(self, bind: str, path: str) -> None:
        host, port = parse_bind(bind)
        lstats = self.stats.listener("ws")
        router = self.router
        stats = self.stats
        max_size = router.settings.mqtt.max_packet_size + 5

        async def handler(request: web.Request) -> web.StreamResponse:
            # MQTT over WebSocket: subprotocol "mqtt" [MQTT-6.0.0-3]; binary frames only.
            ws = web.WebSocketResponse(protocols=("mqtt", "mqttv3.1"), max_msg_size=max_size)
            await ws.prepare(request)
            task = asyncio.current_task()
            if task is not None:
                self.ws_handlers.add(task)
            loop = asyncio.get_running_loop()
            transport = _WsTransport(ws, request.transport.get_extra_info("peername"), loop)
            conn = Connection(router, lstats, stats)
            transport.protocol = conn
            conn.connection_made(transport)
            try:
                async for msg in ws:
                    if msg.type == WSMsgType.BINARY:
                        await transport.reading_paused.wait()
                        conn.data_received(msg.data)
                    elif msg.type in (WSMsgType.TEXT,):
                        # [MQTT-6.0.0-1]: MQTT must be sent in binary frames
                        log.info("closing WebSocket: text frame", extra={"peer": conn.peer})
                        break
                    if transport.is_closing():
                        break
            finally:
                conn.connection_lost(None)
                if task is not None:
                    self.ws_handlers.discard(task)
                if not ws.closed:
                    await ws.close()
            return ws

        app = web.Application()
        app.router.add_get(path, handler)
        self._ws_runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._ws_runner.setup()
        site = web.TCPSite(self._ws_runner, host, port, reuse_address=True,
                           reuse_port=self.settings.reuse_port or None)
        await site.start()
        server = getattr(site, "_server", None)
        self.bound["ws"] = _bound(bind, server.sockets if server is not None else ())
        log.info("listening", extra={"listener": "ws", "bind": self.bound["ws"], "path": path})

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def close(self) -> None:
        self.stop_accepting()
        for server in self._servers:
            await server.wait_closed()
        if self._ws_runner is not None:
            await self._ws_runner.cleanup()
