"""Listeners: TCP, TLS and MQTT over WebSocket, all feeding the same ``Connection`` protocol.

TCP and TLS use ``loop.create_server`` directly (uvloop's fastest path). WebSocket uses aiohttp's
server (a real HTTP/WebSocket implementation, not a hand-rolled parser) and adapts each socket to
the small transport surface ``Connection`` needs, so the MQTT code cannot tell the difference.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiohttp import WSMsgType, web

from broker.connection import Connection
from broker.router import Router
from broker.settings import ListenerSettings
from broker.stats import BrokerStats

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


class Listeners:
    def __init__(self, router: Router, settings: ListenerSettings, stats: BrokerStats) -> None:
        self.router = router
        self.settings = settings
        self.stats = stats
        self._servers: list[asyncio.AbstractServer] = []
        self._ws_runner: web.AppRunner | None = None
        self.ws_handlers: set[asyncio.Task] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.settings
        if s.tcp_bind:
            await self._serve(loop, "tcp", s.tcp_bind, None)
        if s.tls_bind:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(s.tls_certfile, s.tls_keyfile)
            if s.tls_cafile:
                ctx.load_verify_locations(s.tls_cafile)
                ctx.verify_mode = ssl.CERT_REQUIRED
            await self._serve(loop, "tls", s.tls_bind, ctx)
        if s.ws_bind:
            await self._serve_ws(s.ws_bind, s.ws_path)

    async def _serve(self, loop: asyncio.AbstractEventLoop, name: str, bind: str,
                     ctx: ssl.SSLContext | None) -> None:
        host, port = parse_bind(bind)
        lstats = self.stats.listener(name)
        server = await loop.create_server(
            lambda: Connection(self.router, lstats, self.stats), host, port, ssl=ctx,
            backlog=4096, reuse_address=True,
        )
        self._servers.append(server)
        log.info("listening", extra={"listener": name, "bind": bind})

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
        site = web.TCPSite(self._ws_runner, host, port, reuse_address=True)
        await site.start()
        log.info("listening", extra={"listener": "ws", "bind": bind, "path": path})

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def close(self) -> None:
        self.stop_accepting()
        for server in self._servers:
            await server.wait_closed()
        if self._ws_runner is not None:
            await self._ws_runner.cleanup()
