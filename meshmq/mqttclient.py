"""A small asyncio MQTT client on the broker's own codec, for the bridge (``meshmq/bridge.py``).

Why not a library: amqtt (a dependency of the tests and bench) hides acknowledgements behind
its own in-memory retry queue and acks QoS 1 deliveries itself as soon as they are read, so a
bridge on it cannot say "PUBACK the remote only once the local broker stored the message";
paho-mqtt is threaded and a test dependency only. ``broker/protocol`` already encodes and
decodes every packet in both roles (``PacketParser(protocol_level=N)`` is the client role), so
this client is the I/O around it: one reader task, writes straight to the transport, a future
per QoS 1 publish and per SUBSCRIBE, keepalive pings. Acknowledging a received QoS 1 PUBLISH is
the caller's decision (``puback``), which is the whole point.

MQTT 3.1.1 bridges may set bit 0x80 of the CONNECT protocol level (``bridge_bit``): Mosquitto's
``try_private`` marks a bridge that way, and a Mosquitto that sees it treats the connection as a
bridge (its 3.1.1 subscriptions get No Local and Retain As Published), which is how a 3.1.1
bridge avoids getting its own publishes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from broker.protocol.codec import PacketParser, encode
from broker.protocol.packets import (
    Connack,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    Suback,
    Subscribe,
    SubscriptionOptions,
)
from broker.protocol.properties import Prop

log = logging.getLogger("meshmq.mqttclient")

OnPublish = Callable[[Publish], None]


class ClientClosed(ConnectionError):
    """The connection ended (or was never made): every pending future fails with this."""


class PacketTooLarge(ValueError):
    """A PUBLISH bigger than the server's Maximum Packet Size (its v5 CONNACK): not sent. Sent,
    the server would close the connection (0x95), and the same message sent again after the
    reconnect would close it again: the caller decides what to do with a message that can
    never pass (``meshmq/bridge.py`` lets it go, counted and logged)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a PUBLISH of {size} bytes exceeds the server's Maximum Packet Size "
                         f"{limit}")
        self.size = size
        self.limit = limit


class MqttClient:
    """One MQTT connection in the client role. ``on_publish`` gets every received PUBLISH; a
    QoS 1 one stays unacknowledged until the caller calls ``puback(packet_id)``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, level: int,
                 on_publish: OnPublish, name: str, max_packet_size: int = 268_435_460) -> None:
        self.level = level
        self.name = name
        self._reader = reader
        self._writer = writer
        self._on_publish = on_publish
        self._parser = PacketParser(max_packet_size, protocol_level=level)
        self._acks: dict[int, asyncio.Future] = {}  # packet id -> PUBACK/SUBACK future
        self._next_pid = 1
        self._connack: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self.closed = asyncio.get_running_loop().create_future()  # result: why it ended
        self.bytes_out = 0
        self.last_rx = asyncio.get_running_loop().time()
        self.receive_maximum = 65_535  # the server's (v5 CONNACK), for the caller's window
        self.max_packet_size: int | None = None  # the server's (v5 CONNACK); None: no limit

    # -- connection ---------------------------------------------------------------------------
    async def connect(self, pkt: Connect, bridge_bit: bool = False, timeout: float = 10.0
                      ) -> Connack:
        """Send CONNECT, wait for the CONNACK (raises ``ClientClosed`` on a refusal)."""
        loop = asyncio.get_running_loop()
        self._connack = loop.create_future()
        data = bytearray(encode(pkt, pkt.protocol_level))
        if bridge_bit:
            # the protocol level byte follows the protocol name ("\0\4MQTT" or "\0\6MQIsdp")
            at = data.index(b"MQTT" if pkt.protocol_level != 3 else b"MQIsdp") + \
                (4 if pkt.protocol_level != 3 else 6)
            data[at] |= 0x80
        self._write(bytes(data))
        self._task = loop.create_task(self._read_loop())
        try:
            ack: Connack = await asyncio.wait_for(asyncio.shield(self._connack), timeout)
        except TimeoutError:
            self.close(f"no CONNACK within {timeout:.0f} s")
            raise ClientClosed(f"{self.name}: no CONNACK within {timeout:.0f} s") from None
        if ack.reason_code:
            why = (ack.properties or {}).get(Prop.REASON_STRING, "")
            self.close(f"CONNACK refused: 0x{ack.reason_code:02X} {why}")
            raise ClientClosed(f"{self.name}: CONNECT refused with reason 0x{ack.reason_code:02X}"
                               + (f" ({why})" if why else ""))
        if ack.properties:
            self.receive_maximum = ack.properties.get(Prop.RECEIVE_MAXIMUM, 65_535)
            self.max_packet_size = ack.properties.get(Prop.MAXIMUM_PACKET_SIZE)
        return ack

    def close(self, why: str = "closed") -> None:
        if not self.closed.done():
            self.closed.set_result(why)
        for fut in self._acks.values():
            if not fut.done():
                fut.set_exception(ClientClosed(f"{self.name}: {why}"))
        self._acks.clear()
        if self._connack is not None and not self._connack.done():
            self._connack.set_exception(ClientClosed(f"{self.name}: {why}"))
        try:
            self._writer.close()
        except (OSError, RuntimeError):  # the loop is closing
            pass
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def disconnect(self) -> None:
        """A normal DISCONNECT (the server discards a will), then close."""
        if not self.closed.done():
            try:
                self._write(encode(Disconnect(), self.level))
            except (OSError, RuntimeError):
                pass
        self.close("disconnected")

    # -- packets --------------------------------------------------------------------------------
    def publish(self, topic: str, payload: bytes, qos: int, retain: bool = False,
                properties: dict | None = None, dup: bool = False) -> asyncio.Future | None:
        """Send a PUBLISH; for QoS 1 a future resolved with the PUBACK's reason code. Raises
        ``PacketTooLarge`` (nothing sent) past the server's Maximum Packet Size."""
        if self.closed.done():
            raise ClientClosed(f"{self.name}: {self.closed.result()}")
        pid = self._allocate() if qos else None
        props = properties if self.level == 5 else None
        data = encode(Publish(topic, payload, qos, retain, dup, pid, props), self.level)
        limit = self.max_packet_size
        if limit is not None and len(data) > limit:
            raise PacketTooLarge(len(data), limit)
        fut = None
        if pid is not None:
            fut = asyncio.get_running_loop().create_future()
            self._acks[pid] = fut
        self._write(data)
        return fut

    def puback(self, packet_id: int, reason: int = 0) -> None:
        if not self.closed.done():
            self._write(encode(PubAck(packet_id, reason), self.level))

    async def subscribe(self, subs: list[tuple[str, SubscriptionOptions]],
                        timeout: float = 10.0) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK; returns its reason codes (granted QoS or a
        failure code >= 0x80)."""
        pid = self._allocate()
        fut = asyncio.get_running_loop().create_future()
        self._acks[pid] = fut
        self._write(encode(Subscribe(pid, subs), self.level))
        ack = await asyncio.wait_for(fut, timeout)
        return list(ack.reason_codes)

    def ping(self) -> None:
        if not self.closed.done():
            self._write(encode(PingReq(), self.level))

    @property
    def inflight(self) -> int:
        return len(self._acks)

    # -- internals ------------------------------------------------------------------------------
    def _allocate(self) -> int:
        for _ in range(65_535):
            pid = self._next_pid
            self._next_pid = pid % 65_535 + 1
            if pid not in self._acks:
                return pid
        raise ClientClosed(f"{self.name}: no free packet identifier")

    def _write(self, data: bytes) -> None:
        self.bytes_out += len(data)
        self._writer.write(data)

    async def _read_loop(self) -> None:
        why = "connection closed by the server"
        try:
            while True:
                data = await self._reader.read(65_536)
                if not data:
                    break
                self.last_rx = asyncio.get_running_loop().time()
                for pkt in self._parser.feed(data):
                    self._dispatch(pkt)
        except asyncio.CancelledError:
            why = "closed"
        except Exception as exc:  # noqa: BLE001 - a bad packet or socket error ends this link
            why = f"{type(exc).__name__}: {exc}"
        self.close(why)

    def _dispatch(self, pkt: Any) -> None:
        if isinstance(pkt, Publish):
            self._on_publish(pkt)
        elif isinstance(pkt, PubAck | Suback):
            fut = self._acks.pop(pkt.packet_id, None)
            if fut is not None and not fut.done():
                fut.set_result(pkt if isinstance(pkt, Suback) else pkt.reason_code)
        elif isinstance(pkt, Connack):
            if self._connack is not None and not self._connack.done():
                self._connack.set_result(pkt)
        elif isinstance(pkt, PingResp):
            pass
        elif isinstance(pkt, Disconnect):
            why = (pkt.properties or {}).get(Prop.REASON_STRING, "")
            self.close(f"DISCONNECT 0x{pkt.reason_code:02X} from the server {why}".strip())
        else:
            # PUBREC/PUBREL/PUBCOMP: the bridge publishes and subscribes at QoS 0/1 only
            log.warning("unexpected %s from %s: closing", type(pkt).__name__, self.name)
            self.close(f"unexpected {type(pkt).__name__}")


async def open_client(host: str, port: int, ssl_ctx: Any, level: int, on_publish: OnPublish,
                      name: str, timeout: float = 10.0) -> MqttClient:
    """Dial ``host:port`` (TLS when ``ssl_ctx``) and wrap it; raises OSError/TimeoutError."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=ssl_ctx,
                                server_hostname=host if ssl_ctx is not None else None),
        timeout)
    return MqttClient(reader, writer, level, on_publish, name)
