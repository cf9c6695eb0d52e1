"""Server-side connection state machine (h11-style): bytes in, checked packets out.

Thin on purpose: it enforces the rules that only need per-connection protocol state (CONNECT
first and once, inbound v5 topic aliases, which packets a client may send) and encodes at the
negotiated level. Sessions, QoS flows and outbound alias choices belong to the broker.
"""

from __future__ import annotations

from enum import Enum

from .codec import MAX_PACKET_SIZE, PacketParser, encode
from .errors import ProtocolError
from .packets import Connack, Connect, Disconnect, Packet, PingResp, Publish, Suback, Unsuback
from .properties import Prop
from .wire import protocol_error

_TOPIC_ALIAS = Prop.TOPIC_ALIAS
_SUBSCRIPTION_IDENTIFIER = Prop.SUBSCRIPTION_IDENTIFIER
#: Packets only a server sends; receiving one from a client is a protocol error.
_SERVER_ONLY = frozenset((Connack, Suback, Unsuback, PingResp))
# the packet classes ``receive_data``'s checks act on: a batch without any of them (and, on a
# v5 connection, without a PUBLISH, whose properties are resolved) passes as it is
_CHECKED = frozenset((Connect, Disconnect, *_SERVER_ONLY))


class ConnectionState(Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


AWAIT_CONNECT = ConnectionState.AWAIT_CONNECT
CONNECTED = ConnectionState.CONNECTED
CLOSED = ConnectionState.CLOSED


class ServerProtocol:
    """One client connection seen from the server.

    ``receive_data`` returns the client's packets with inbound topic aliases resolved: a returned
    ``Publish`` always has its ``topic`` filled in and its TOPIC_ALIAS property removed (aliases are
    per connection and must never be forwarded; ``properties`` becomes ``None`` if nothing else was
    in it). Any :class:`ProtocolError` moves the state to CLOSED; the broker then sends DISCONNECT
    with ``err.reason_code`` (v5, after CONNACK) or CONNACK with it (during CONNECT), and closes.
    """

    __slots__ = (
        "_parser",
        "_aliases",
        "state",
        "topic_alias_maximum",
        "client_maximum_packet_size",
        "connect",
    )

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, topic_alias_maximum: int = 0,
        max_connect_size: int | None = None,
    ) -> None:
        self._parser = PacketParser(max_packet_size)
        if max_connect_size is not None:
            # the first packet (the CONNECT) is refused with 0x95 above this size
            self._parser.max_connect_size = min(max_connect_size, max_packet_size)
        # inbound topic aliases, made by the first alias a client defines (most never do:
        # an empty dict is 64 bytes per connection, issue 25)
        self._aliases: dict[int, str] | None = None
        self.state = AWAIT_CONNECT
        #: the Topic Alias Maximum this server announces in CONNACK (3.2.2.3.8)
        self.topic_alias_maximum = topic_alias_maximum
        #: the client's Maximum Packet Size from CONNECT (3.1.2.11.4), None if unlimited
        self.client_maximum_packet_size: int | None = None
        #: the CONNECT packet, once received (until ``forget_connect``)
        self.connect: Connect | None = None

    @property
    def protocol_level(self) -> int | None:
        """3, 4 or 5 once CONNECT was parsed, else None."""
        return self._parser.protocol_level

    @property
    def max_packet_size(self) -> int:
        return self._parser.max_packet_size

    @property
    def buffered(self) -> int:
        """Bytes of a started, unfinished packet held by the parser."""
        return self._parser.buffered

    def fits(self, n_bytes: int) -> bool:
        """Whether a packet of ``n_bytes`` may be sent to this client [MQTT-3.1.2-24]."""
        limit = self.client_maximum_packet_size
        return limit is None or n_bytes <= limit

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Parse received bytes; return the complete packets, checked against connection state.

        On a :class:`ProtocolError`, ``err.packets`` holds the (checked, alias-resolved) packets
        that preceded the offending one; garbage after a DISCONNECT is ignored.
        """
        if self.state is CLOSED:
            return []
        parse_error: ProtocolError | None = None
        try:
            packets = self._parser.feed(data)
        except ProtocolError as err:
            parse_error = err
            packets = err.packets
        level = self._parser.protocol_level
        if parse_error is None:
            # the batch's classes in one C pass: a connected client's publishes and acks pass
            # without a Python step per packet (it was a quarter of a QoS 0 publish's cost in
            # the router: bench.costguard qos0, 2026-11-27)
            kinds = set(map(type, packets))
            if kinds.isdisjoint(_CHECKED) and (level != 5 or Publish not in kinds):
                return packets
        i = 0
        try:
            for i, pkt in enumerate(packets):
                cls = type(pkt)
                if cls is Publish:
                    if level == 5 and pkt.properties is not None:  # type: ignore[union-attr]
                        self._inbound_publish_props(pkt)  # type: ignore[arg-type]
                elif cls is Connect:
                    if self.state is not AWAIT_CONNECT:  # [MQTT-3.1.0-2]
                        raise protocol_error("second CONNECT")
                    self._on_connect(pkt)  # type: ignore[arg-type]
                elif cls is Disconnect:
                    # [MQTT-3.14.4-1]: nothing may follow DISCONNECT; drop anything that did
                    self.state = CLOSED
                    del packets[i + 1 :]
                    return packets
                elif cls in _SERVER_ONLY:
                    raise protocol_error(f"{cls.__name__} sent by a client")
        except ProtocolError as err:
            self.state = CLOSED
            err.packets = packets[:i]
            raise
        if parse_error is not None:
            self.state = CLOSED
            parse_error.packets = packets
            # Raised from a local, it would make a cycle (this frame -> the error -> its
            # traceback -> this frame) that holds the received bytes and the parser's frames
            # until the cyclic collector runs: with the young generation at 10,000
            # (meshmq/node.py) a client repeating a 1 MB malformed PUBLISH kept ~600 MB
            # alive. Cleared on the way out, reference counting frees it at once (asyncio
            # clears such locals for the same reason).
            try:
                raise parse_error
            finally:
                del parse_error
        return packets

    def _on_connect(self, pkt: Connect) -> None:
        self.state = CONNECTED
        self.connect = pkt
        if pkt.properties is not None:
            self.client_maximum_packet_size = pkt.properties.get(Prop.MAXIMUM_PACKET_SIZE)

    def forget_connect(self) -> None:
        """Drop the CONNECT packet (``connect``): the broker calls it once it has taken what it
        keeps (client id, will, properties), so an idle connection does not hold its CONNECT,
        password and all, for its whole life (issue 25: ~160 bytes per idle connection)."""
        self.connect = None

    def _inbound_publish_props(self, pkt: Publish) -> None:
        props = pkt.properties
        assert props is not None
        if _SUBSCRIPTION_IDENTIFIER in props:  # [MQTT-3.3.4-6]: only servers send these
            raise protocol_error("PUBLISH from a client with a subscription identifier")
        alias = props.get(_TOPIC_ALIAS)
        if alias is None:
            return
        if alias > self.topic_alias_maximum:  # [MQTT-3.3.2-9]; 3.3.2.3.4 -> 0x94
            raise ProtocolError(0x94, f"topic alias {alias} above maximum")
        aliases = self._aliases
        if pkt.topic:
            if aliases is None:
                aliases = self._aliases = {}
            aliases[alias] = pkt.topic  # [MQTT-3.3.2-12]: (re)define the mapping
        else:
            topic = aliases.get(alias) if aliases is not None else None
            if topic is None:  # 3.3.4: alias with no mapping is a Protocol Error
                raise protocol_error(f"unknown topic alias {alias}")
            pkt.topic = topic
        del props[_TOPIC_ALIAS]
        if not props:
            pkt.properties = None

    def send(self, packet: Packet) -> bytes:
        """Encode ``packet`` at the negotiated level (sending DISCONNECT closes the state)."""
        level = self._parser.protocol_level
        if level is None:
            raise RuntimeError("no protocol level before CONNECT")
        if type(packet) is Disconnect:
            self.state = CLOSED
        return encode(packet, level)

    def close(self) -> None:
        """Mark the connection closed (network gone); later data is ignored."""
        self.state = CLOSED
