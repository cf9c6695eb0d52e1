"""Hypothesis strategies for valid MQTT packets at each protocol level (shared by the tests)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from broker.protocol import (
    PROPERTY_SPECS,
    WILL_CONTEXT,
    Auth,
    Connack,
    Connect,
    Disconnect,
    PacketType,
    PingReq,
    PingResp,
    Prop,
    PropType,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    Will,
)
from broker.protocol.reasons import (
    AUTH_REASONS,
    CONNACK_REASONS,
    DISCONNECT_REASONS,
    PUBACK_REASONS,
    PUBREL_REASONS,
    SUBACK_REASONS,
    UNSUBACK_REASONS,
)

# Any Unicode scalar value except U+0000 (surrogates cannot be UTF-8 encoded).
text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
topic_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
    min_size=1,
    max_size=12,
)
filters = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=12,
)
small_bytes = st.binary(max_size=24)
pids = st.integers(1, 65535)

_BOOL_PROPS = {
    Prop.PAYLOAD_FORMAT_INDICATOR,
    Prop.REQUEST_PROBLEM_INFORMATION,
    Prop.REQUEST_RESPONSE_INFORMATION,
    Prop.MAXIMUM_QOS,
    Prop.RETAIN_AVAILABLE,
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE,
}


def _value(prop: Prop, context: int) -> st.SearchStrategy[Any]:
    ptype = PROPERTY_SPECS[prop][0]
    if prop in _BOOL_PROPS:
        return st.integers(0, 1)
    if prop is Prop.SUBSCRIPTION_IDENTIFIER:
        return st.lists(
            st.integers(1, 268_435_455), min_size=1, max_size=1 if context == 8 else 3
        )
    if prop is Prop.USER_PROPERTY:
        return st.lists(st.tuples(text, text), min_size=1, max_size=4)
    if prop is Prop.RESPONSE_TOPIC:
        return topic_names
    if ptype == PropType.TWO_BYTE_INT:
        return st.integers(1, 65535)
    if ptype == PropType.FOUR_BYTE_INT:
        return st.integers(1, 2**32 - 1)
    if ptype == PropType.UTF8:
        return text
    if ptype == PropType.BINARY:
        return small_bytes
    raise AssertionError(prop)


def properties(context: int) -> st.SearchStrategy[dict[int, Any] | None]:
    """Random valid property dicts for a packet type (or WILL_CONTEXT); ``None`` when empty."""
    optional = {
        prop: _value(prop, context)
        for prop, (_, contexts) in PROPERTY_SPECS.items()
        if context in contexts
    }
    if context == PacketType.CONNECT:
        optional.pop(Prop.AUTHENTICATION_DATA)  # only valid with a method; added below
    strat = st.fixed_dictionaries({}, optional=optional)
    if context == PacketType.CONNECT:
        strat = st.tuples(strat, st.none() | small_bytes).map(_with_auth_data)
    return strat.map(lambda d: d or None)


def _with_auth_data(args: tuple[dict[int, Any], bytes | None]) -> dict[int, Any]:
    props, data = args
    if data is not None and Prop.AUTHENTICATION_METHOD in props:
        props[Prop.AUTHENTICATION_DATA] = data
    return props


def _props(level: int, context: int) -> st.SearchStrategy[dict[int, Any] | None]:
    return properties(context) if level == 5 else st.none()


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    username = draw(st.none() | text)
    password = draw(st.none() | small_bytes)
    if level != 5 and username is None:
        password = None
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(small_bytes),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_props(level, WILL_CONTEXT)),
        )
    return Connect(
        client_id=draw(text),
        protocol_level=level,
        clean_start=draw(st.booleans()),
        keepalive=draw(st.integers(0, 65535)),
        username=username,
        password=password,
        will=will,
        properties=draw(_props(level, PacketType.CONNECT)),
        protocol_name="MQIsdp" if level == 3 else "MQTT",
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    if level == 5:
        code = draw(st.sampled_from(sorted(CONNACK_REASONS)))
    else:
        code = draw(st.integers(0, 5))
    return Connack(
        session_present=draw(st.booleans()) if level != 3 else False,
        reason_code=code,
        properties=draw(_props(level, PacketType.CONNACK)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(_props(level, PacketType.PUBLISH))
    topic = draw(topic_names)
    if props and Prop.TOPIC_ALIAS in props and draw(st.booleans()):
        topic = ""  # v5: alias-only PUBLISH
    return Publish(
        topic=topic,
        payload=draw(st.binary(max_size=300)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(pids) if qos else None,
        properties=props,
    )


def _acks(cls: type, ptype: int, reasons: frozenset[int], level: int) -> st.SearchStrategy[Any]:
    if level != 5:
        return st.builds(cls, pids)
    return st.builds(
        cls, pids, st.sampled_from(sorted(reasons)), properties(ptype)
    )


def _subscription(level: int) -> st.SearchStrategy[tuple[str, SubscriptionOptions]]:
    if level == 5:
        opts = st.builds(
            SubscriptionOptions,
            st.integers(0, 2),
            st.booleans(),
            st.booleans(),
            st.integers(0, 2),
        )
    else:
        opts = st.builds(SubscriptionOptions, st.integers(0, 2))
    return st.tuples(filters, opts)


def packets(level: int) -> st.SearchStrategy[Any]:
    """Any valid packet that exists at ``level``."""
    strategies = [
        connects(level),
        connacks(level),
        publishes(level),
        _acks(PubAck, PacketType.PUBACK, PUBACK_REASONS, level),
        _acks(PubRec, PacketType.PUBREC, PUBACK_REASONS, level),
        _acks(PubRel, PacketType.PUBREL, PUBREL_REASONS, level),
        _acks(PubComp, PacketType.PUBCOMP, PUBREL_REASONS, level),
        st.builds(
            Subscribe,
            pids,
            st.lists(_subscription(level), min_size=1, max_size=4),
            _props(level, PacketType.SUBSCRIBE),
        ),
        st.builds(
            Suback,
            pids,
            st.lists(
                st.sampled_from(sorted(SUBACK_REASONS) if level == 5 else [0, 1, 2, 0x80]),
                max_size=4,
            ),
            _props(level, PacketType.SUBACK),
        ),
        st.builds(
            Unsubscribe,
            pids,
            st.lists(filters, min_size=1, max_size=4),
            _props(level, PacketType.UNSUBSCRIBE),
        ),
        st.builds(
            Unsuback,
            pids,
            st.lists(st.sampled_from(sorted(UNSUBACK_REASONS)), max_size=4)
            if level == 5
            else st.just([]),
            _props(level, PacketType.UNSUBACK),
        ),
        st.just(PingReq()),
        st.just(PingResp()),
    ]
    if level == 5:
        strategies.append(
            st.builds(
                Disconnect,
                st.sampled_from(sorted(DISCONNECT_REASONS)),
                properties(PacketType.DISCONNECT),
            )
        )
        strategies.append(
            st.builds(Auth, st.sampled_from(sorted(AUTH_REASONS)), properties(PacketType.AUTH))
        )
    else:
        strategies.append(st.just(Disconnect()))
    return st.one_of(strategies)
