"""Interop with the amqtt (3.1.1) client library."""

import asyncio

import pytest
from amqtt.client import MQTTClient
from amqtt.mqtt.constants import QOS_0, QOS_1, QOS_2
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _client(broker, **config):
    c = MQTTClient(client_id=unique("amqtt"), config={"auto_reconnect": False, **config})
    await c.connect(f"mqtt://{broker.host}:{broker.port}/")
    return c


@pytest.mark.parametrize("qos", [QOS_0, QOS_1, QOS_2])
def test_amqtt_pub_sub(broker, qos):
    """amqtt subscribes (granted QoS = requested) and receives what another amqtt client
    publishes, at each QoS."""
    topic = unique("am") + "/t"

    async def scenario():
        sub = await _client(broker)
        pub = await _client(broker)
        try:
            granted = await sub.subscribe([(topic, qos)])
            assert granted == [qos]
            await pub.publish(topic, f"amqtt-{qos}".encode(), qos=qos)
            msg = await sub.deliver_message(timeout_duration=10)
            assert msg is not None
            assert msg.topic == topic
            assert bytes(msg.data) == f"amqtt-{qos}".encode()
            assert msg.qos == qos
        finally:
            await pub.disconnect()
            await sub.disconnect()

    _run(scenario())


@pytest.mark.parametrize("qos", [QOS_1, QOS_2])
def test_amqtt_publisher_paho_v5_subscriber(broker, clients, qos):
    """amqtt (3.1.1) publishes, a paho MQTT 5 subscriber receives (cross-version routing)."""
    topic = unique("am5") + "/t"
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(topic, qos)

    async def scenario():
        pub = await _client(broker)
        try:
            await pub.publish(topic, b"cross-version", qos=qos)
        finally:
            await pub.disconnect()

    _run(scenario())
    m = sub.expect_message()
    assert (m.payload, m.qos) == (b"cross-version", qos)


def test_paho_publisher_amqtt_subscriber_wildcard_and_retained(broker, clients):
    """paho publishes a retained message and a live one; amqtt subscribed to a wildcard gets
    the retained one (retain flag set) and then the live one."""
    p = unique("amw")
    pub = clients.connected(broker, protocol=V311)
    pub.publish(f"{p}/r", b"retained", 1, retain=True)

    async def scenario():
        sub = await _client(broker)
        try:
            assert await sub.subscribe([(f"{p}/#", QOS_1)]) == [QOS_1]
            first = await sub.deliver_message(timeout_duration=10)
            assert (first.topic, bytes(first.data), first.retain) == (f"{p}/r", b"retained", True)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: pub.publish(f"{p}/live", b"live", 1))
            second = await sub.deliver_message(timeout_duration=10)
            assert (second.topic, bytes(second.data), second.retain) == (
                f"{p}/live", b"live", False)
        finally:
            await sub.disconnect()

    _run(scenario())


def test_amqtt_persistent_session_offline_messages(broker, clients):
    """amqtt with clean session off: QoS 1 messages published while it is away arrive after it
    reconnects ([MQTT-3.1.2-5] 3.1.1)."""
    topic = unique("amp") + "/t"
    cid = unique("amp")

    async def first():
        c = MQTTClient(client_id=cid, config={"auto_reconnect": False})
        await c.connect(f"mqtt://{broker.host}:{broker.port}/", cleansession=False)
        await c.subscribe([(topic, QOS_1)])
        await c.disconnect()

    _run(first())
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"while-away", 1)

    async def second():
        c = MQTTClient(client_id=cid, config={"auto_reconnect": False})
        await c.connect(f"mqtt://{broker.host}:{broker.port}/", cleansession=False)
        try:
            msg = await c.deliver_message(timeout_duration=10)
            assert bytes(msg.data) == b"while-away"
        finally:
            await c.disconnect()

    _run(second())
