"""An application message inside the broker, and its cached wire encodings.

Fan-out encodes a PUBLISH once per *shape* — (v5 or not, QoS, retain flag, subscription ids,
remaining expiry) — and every subscriber of that shape shares the same ``(head, tail)`` bytes; a
QoS>0 copy only differs by the 2-byte packet id written between them. 1→1000 fan-out therefore costs
one encode, not a thousand.
"""

from __future__ import annotations

import math
import time
from typing import Any

from broker.protocol import codec
from broker.protocol.codec import publish_packet0, publish_parts
from broker.protocol.properties import Prop

Parts = tuple[bytes, bytes]

# How many shapes one message keeps encoded. A shape key holds what subscribers choose (their
# Subscription Identifiers) and the remaining expiry (a new value each second), so an unbounded
# cache grew one copy of the payload per distinct key: on a retained message, which lives as
# long as its topic, one client re-subscribing with new identifiers grew the broker by a
# payload per SUBSCRIBE, for good. Past the bound a shape is encoded per send, uncached, which
# is what a per-subscriber shape costs anyway; a fan-out's common shapes come first and stay
# cached. (Mosquitto and EMQX encode per subscriber and keep nothing.)
MAX_SHAPES = 8


class Message:
    __slots__ = (
        "topic", "payload", "qos", "retain", "properties", "expiry_at", "origin", "_shapes",
        "device", "offset", "remote", "publisher", "maybe_stored", "_plain0",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: dict | None,
        expiry_at: float | None,
        origin: str | None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        # v5 properties forwarded to subscribers, without topic alias and subscription ids
        # (those are per connection / per subscription) and without the expiry interval, which
        # is recomputed from expiry_at at send time [MQTT-3.3.2-6].
        self.properties = properties
        self.expiry_at = expiry_at  # time.monotonic() deadline, None = never expires
        self.origin = origin  # publisher's client id, for the v5 No Local option
        self._shapes: dict | None = None
        self._plain0: bytes | None = None  # the v3.x non-retained QoS 0 packet (packet0)
        self.device: str | None = None  # the device log holding it, when logged
        self.offset = -1  # its offset in that log
        # True when that log is another router's (a cluster): its position is known, for
        # offset subscriptions, but it cannot be read back here, so a queue keeps a copy
        self.remote = False
        # Who published it, for publisher dedupe (broker/pubdedupe.py): client hash, session
        # epoch and packet id of a client's QoS 1/2 publish on a logged topic, kept in its
        # record; and whether it may already be stored (DUP=1, or a message id property), so
        # its log's leader looks for it before appending
        self.publisher: bytes | None = None
        self.maybe_stored = False

    def log_position(self) -> list[tuple[str, str]]:
        return [("device", self.device or ""), ("offset", str(self.offset))]

    def expired(self, now: float) -> bool:
        return self.expiry_at is not None and now >= self.expiry_at

    def remaining_expiry(self) -> int:
        """Seconds left of the v5 Message Expiry Interval (0 = none) [MQTT-3.3.2-6]."""
        if self.expiry_at is None:
            return 0
        return max(1, math.ceil(self.expiry_at - time.monotonic()))

    def v5_properties(self, sub_ids: tuple[int, ...] | None, remaining: int,
                      position: bool) -> dict | None:
        """The properties one v5 subscriber gets: the forwarded ones plus per-delivery ones."""
        props = self.properties
        if not (sub_ids or remaining or position):
            return props
        props = dict(props) if props else {}
        if sub_ids:
            props[Prop.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)
        if remaining:
            props[Prop.MESSAGE_EXPIRY_INTERVAL] = remaining
        if position:
            # where the message sits in its device log, for a subscriber that holds its own
            # offset. Only such subscriptions get it: [MQTT-3.3.2-17] wants everyone else to
            # see the publisher's user properties unaltered.
            props[Prop.USER_PROPERTY] = [*props.get(Prop.USER_PROPERTY, ()),
                                         *self.log_position()]
        return props

    def parts(self, v5: bool, qos: int, retain: bool, sub_ids: tuple[int, ...] | None,
              position: bool = False) -> Parts:
        remaining = self.remaining_expiry() if v5 else 0
        position = position and v5 and self.device is not None
        key = (v5, qos, retain, sub_ids, remaining, position)
        shapes = self._shapes
        if shapes is None:
            shapes = self._shapes = {}
        parts = shapes.get(key)
        if parts is None:
            encode = codec.c_publish_packet  # (looked up here: tests switch it off)
            if not v5 and encode is not None:
                # v3.x: no properties, the payload is the tail: codec.publish_parts' compiled
                # path without its frame (one call less per QoS 1 delivery; issue 25)
                parts = encode(self.topic, self.payload, 0x30 | (qos << 1) | (1 if retain else 0),
                               False)
            else:
                props = self.v5_properties(sub_ids, remaining, position) if v5 else None
                level = 5 if v5 else 4
                parts = publish_parts(self.topic, self.payload, qos, retain, False, props, level)
            if not shapes or len(shapes) < MAX_SHAPES:  # (no len() call for the first)
                shapes[key] = parts
        return parts

    def packet0(self, v5: bool, retain: bool, sub_ids: tuple[int, ...] | None,
                position: bool = False) -> bytes:
        """The whole QoS 0 PUBLISH for one shape, cached like ``parts``: a QoS 0 copy needs no
        packet id between head and tail, so every subscriber of a shape is written the same
        bytes object, with no concatenation per copy. The commonest shape (v3.x, not
        retained) has a slot of its own: no key tuple, no dict."""
        if not v5 and not retain:
            data = self._plain0
            if data is None:
                encode = codec.c_publish_packet  # (looked up here: tests switch it off)
                data = self._plain0 = (encode(self.topic, self.payload, 0x30, True)
                                       if encode is not None else
                                       publish_packet0(self.topic, self.payload, False, None, 4))
            return data
        remaining = self.remaining_expiry() if v5 else 0
        position = position and v5 and self.device is not None
        key = (v5, -1, retain, sub_ids, remaining, position)  # -1: whole, beside parts' keys
        shapes = self._shapes
        if shapes is None:
            shapes = self._shapes = {}
        data = shapes.get(key)
        if data is None:
            props = self.v5_properties(sub_ids, remaining, position) if v5 else None
            data = publish_packet0(self.topic, self.payload, retain, props, 5 if v5 else 4)
            if not shapes or len(shapes) < MAX_SHAPES:
                shapes[key] = data
        return data


class Delivery:
    """One message on its way to one session: queued, or in flight awaiting the client's ack."""

    __slots__ = ("msg", "qos", "retain", "sub_ids", "pid", "state", "group", "position", "live")

    QUEUED = 0
    SENT = 1  # PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
    RELEASED = 2  # QoS 2: PUBREL sent, waiting for PUBCOMP

    def __init__(
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...] | None,
        group: object | None = None,
        position: bool = False,
    ) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.pid = 0
        self.state = Delivery.QUEUED
        # The shared subscription group this copy was chosen for: if the member leaves before
        # acking, the router hands the message to another member instead of losing it.
        self.group = group
        self.position = position  # add device/offset user properties (offset subscribers)
        # Routed live from a just-stored append: if it waits in the queue when the session falls
        # behind, the log can serve it again (broker/catchup.py), so the copy can go.
        self.live = False


def _maker(cls: type, template: object, fields: tuple[str, ...], required: int,
           sample: tuple) -> Any:
    """``cls`` itself, or the compiled maker of its instances (broker/protocol/_speedups.c,
    ``slot_maker``: no __init__ frame, ~0.07 us less per object) when one is built and makes,
    from ``sample``, an object equal to the class's own slot for slot. That comparison is
    the guard against an __init__ that grows more than slot stores: the maker would skip it,
    so it is not used then (tests/protocol/test_slot_maker.py fails on it)."""
    make = codec.c_slot_maker
    if make is None:
        return cls
    try:
        maker = make(cls, template, fields, required)
        ours, theirs = maker(*sample), cls(*sample)
    except (TypeError, ValueError):
        return cls
    if any(getattr(ours, n) != getattr(theirs, n) or type(getattr(ours, n)) is not
           type(getattr(theirs, n)) for n in cls.__slots__):
        return cls
    return maker


_TEMPLATE = Message("", b"", 0, False, None, None, None)
#: ``Message(...)``'s arguments, positional only: the hot paths' (a publish, a log read) way
#: to make one (``_maker``)
new_message = _maker(Message, _TEMPLATE, ("topic", "payload", "qos", "retain", "properties",
                                          "expiry_at", "origin"), 7,
                     ("t/1", b"p", 1, True, {"k": 1}, 1.5, "c"))
#: ``Delivery(...)``'s arguments, positional only (``_maker``)
new_delivery = _maker(Delivery, Delivery(_TEMPLATE, 0, False, None),
                      ("msg", "qos", "retain", "sub_ids", "group", "position"), 4,
                      (_TEMPLATE, 1, True, (3,), "g", True))


def aliased_parts(d: Delivery, aliases: dict[str, int], alias_max: int) -> Parts:
    """Outbound topic alias (v5): the first send of a topic carries topic + alias, later ones
    only the alias. Per connection, so these bytes are never shared with other subscribers."""
    msg = d.msg
    position = d.position and msg.device is not None
    props = dict(msg.v5_properties(d.sub_ids, msg.remaining_expiry(), position) or {})
    topic = msg.topic
    alias = aliases.get(topic)
    if alias is not None:
        props[Prop.TOPIC_ALIAS] = alias
        topic = ""
    elif len(aliases) < alias_max:
        alias = aliases[topic] = len(aliases) + 1
        props[Prop.TOPIC_ALIAS] = alias
    return publish_parts(topic, msg.payload, d.qos, d.retain, False, props or None, 5)
