"""A synchronous wrapper around paho-mqtt 2.x for the behaviour tests.

Every wait is bounded and fails with a message that says what was awaited. The client never
reconnects on its own (``reconnect_on_failure=False``): tests decide when to reconnect.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

V31 = mqtt.MQTTv31
V311 = mqtt.MQTTv311
V5 = mqtt.MQTTv5

DEFAULT_TIMEOUT = 10.0


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def props(packet_type: int = PacketTypes.PUBLISH, **values: Any) -> Properties:
    """Build paho Properties: props(PacketTypes.CONNECT, SessionExpiryInterval=60)."""
    p = Properties(packet_type)
    for key, value in values.items():
        setattr(p, key, value)
    return p


class Client:
    """One paho client with queues for messages, acks and disconnects."""

    def __init__(self, broker: Any = None, client_id: str | None = None, *,
                 protocol: int = V311, clean: bool = True, transport: str = "tcp",
                 host: str | None = None, port: int | None = None,
                 username: str | None = None, password: str | None = None,
                 manual_ack: bool = False) -> None:
        self.protocol = protocol
        self.client_id = client_id if client_id is not None else unique("paho")
        self.host = host or (broker.host if broker else "127.0.0.1")
        self.port = port or (broker.port if broker else 1883)
        self.clean = clean
        kwargs: dict[str, Any] = {}
        if protocol != V5:
            kwargs["clean_session"] = clean
        self.mqtt = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=self.client_id,
            protocol=protocol, transport=transport, reconnect_on_failure=False,
            manual_ack=manual_ack, **kwargs,
        )
        if username is not None:
            self.mqtt.username_pw_set(username, password)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.subacks: dict[int, list[Any]] = {}
        self.unsubacks: dict[int, list[Any]] = {}
        self.pubacks: dict[int, Any] = {}
        self.connack: tuple[Any, Any, Any] | None = None
        self.disconnects: list[tuple[Any, Any]] = []
        self._cond = threading.Condition()
        self.mqtt.on_connect = self._on_connect
        self.mqtt.on_disconnect = self._on_disconnect
        self.mqtt.on_message = self._on_message
        self.mqtt.on_subscribe = self._on_subscribe
        self.mqtt.on_unsubscribe = self._on_unsubscribe
        self.mqtt.on_publish = self._on_publish
        self._looping = False

    # -- callbacks (paho's network thread) ----------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._cond:
            self.connack = (flags, reason_code, properties)
            self._cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._cond:
            self.disconnects.append((reason_code, properties))
            self._cond.notify_all()

    def _on_message(self, client, userdata, message) -> None:
        self.messages.put(message)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._cond:
            self.subacks[mid] = list(reason_codes)
            self._cond.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._cond:
            self.unsubacks[mid] = list(reason_codes) if reason_codes else []
            self._cond.notify_all()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._cond:
            self.pubacks[mid] = reason_code
            self._cond.notify_all()

    def _wait(self, predicate: Any, timeout: float, what: str) -> Any:
        with self._cond:
            ok = self._cond.wait_for(predicate, timeout)
        if not ok:
            raise AssertionError(f"{self.client_id}: timed out after {timeout}s waiting for {what}")
        return ok

    # -- operations ---------------------------------------------------------------------------
    def connect(self, *, keepalive: int = 30, properties: Properties | None = None,
                clean_start: bool | None = None, expect_success: bool = True,
                will: tuple[str, bytes, int, bool] | None = None,
                will_properties: Properties | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> Client:
        if will is not None:
            topic, payload, qos, retain = will
            self.mqtt.will_set(topic, payload, qos, retain, properties=will_properties)
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.protocol == V5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            kwargs["properties"] = properties
        self.connack = None
        self.mqtt.connect(self.host, self.port, **kwargs)
        if not self._looping:
            self.mqtt.loop_start()
            self._looping = True
        self._wait(lambda: self.connack is not None or self.disconnects, timeout, "CONNACK")
        if expect_success:
            assert self.connack is not None, f"{self.client_id}: closed before CONNACK"
            rc = self.connack[1]
            assert not rc.is_failure, f"{self.client_id}: CONNACK refused: {rc} ({rc.value})"
        return self

    @property
    def session_present(self) -> bool:
        assert self.connack is not None
        return bool(self.connack[0].session_present)

    @property
    def connack_properties(self) -> Any:
        assert self.connack is not None
        return self.connack[2]

    def subscribe(self, topic: str | list[tuple[str, Any]], qos: int = 0, *,
                  options: SubscribeOptions | None = None, properties: Properties | None = None,
                  timeout: float = DEFAULT_TIMEOUT) -> list[int]:
        """Subscribe and wait for the SUBACK; returns its reason codes as ints."""
        if isinstance(topic, list):
            rc, mid = self.mqtt.subscribe(topic, properties=properties)
        elif options is not None:
            rc, mid = self.mqtt.subscribe(topic, options=options, properties=properties)
        else:
            rc, mid = self.mqtt.subscribe(topic, qos, properties=properties)
        assert rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe not sent: {rc}"
        self._wait(lambda: mid in self.subacks, timeout, f"SUBACK for {topic!r}")
        return [int(getattr(c, "value", c)) for c in self.subacks[mid]]

    def unsubscribe(self, topic: str | list[str], *, timeout: float = DEFAULT_TIMEOUT
                    ) -> list[int]:
        rc, mid = self.mqtt.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS, f"unsubscribe not sent: {rc}"
        self._wait(lambda: mid in self.unsubacks, timeout, f"UNSUBACK for {topic!r}")
        return [int(getattr(c, "value", c)) for c in self.unsubacks[mid]]

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                *, properties: Properties | None = None, wait: bool = True,
                timeout: float = DEFAULT_TIMEOUT) -> mqtt.MQTTMessageInfo:
        info = self.mqtt.publish(topic, payload, qos, retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish not sent: {info.rc}"
        if wait:
            if qos == 0:
                info.wait_for_publish(timeout)
            else:
                self._wait(lambda: info.mid in self.pubacks, timeout,
                           f"the QoS {qos} acknowledgement of a PUBLISH to {topic!r}")
        return info

    def puback_code(self, info: mqtt.MQTTMessageInfo) -> int:
        code = self.pubacks.get(info.mid)
        return int(getattr(code, "value", code or 0))

    def expect_message(self, timeout: float = DEFAULT_TIMEOUT, topic: str | None = None
                       ) -> mqtt.MQTTMessage:
        """Next message (optionally the next one on ``topic``, others are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"{self.client_id}: no message{' on ' + topic if topic else ''} "
                    f"within {timeout}s"
                )
            try:
                msg = self.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if topic is None or msg.topic == topic:
                return msg

    def expect_messages(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[mqtt.MQTTMessage]:
        out: list[mqtt.MQTTMessage] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"{self.client_id}: got {len(out)} of {n} messages within {timeout}s: "
                    f"{[(m.topic, m.payload[:30]) for m in out]!r}"
                )
            try:
                out.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                continue
        return out

    def expect_no_message(self, wait: float = 1.0, topic: str | None = None) -> None:
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                msg = self.messages.get(timeout=remaining)
            except queue.Empty:
                return
            if topic is None or msg.topic == topic:
                raise AssertionError(
                    f"{self.client_id}: unexpected message on {msg.topic!r}: {msg.payload[:60]!r}"
                    f" (qos={msg.qos}, retain={msg.retain})"
                )

    def drain(self) -> list[mqtt.MQTTMessage]:
        out = []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out

    def wait_disconnected(self, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Wait for the connection to end; return the reason code paho reported."""
        self._wait(lambda: self.disconnects, timeout, "the server to close the connection")
        return self.disconnects[-1][0]

    def is_connected(self) -> bool:
        return self.mqtt.is_connected()

    def disconnect(self, reason_code: int | None = None, properties: Properties | None = None
                   ) -> None:
        if self.mqtt.is_connected():
            if reason_code is not None:
                from paho.mqtt.reasoncodes import ReasonCode

                rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code)
                self.mqtt.disconnect(reasoncode=rc, properties=properties)
            else:
                self.mqtt.disconnect(properties=properties)
            try:
                self._wait(lambda: self.disconnects, 5.0, "disconnect")
            except AssertionError:
                pass
        self.stop()

    def stop(self) -> None:
        if self._looping:
            self.mqtt.loop_stop()
            self._looping = False
        try:
            self.mqtt.socket() and self.mqtt.socket().close()  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - best effort in finalizers
            pass

    def abort(self) -> None:
        """Drop the connection without DISCONNECT (the will must fire)."""
        sock = self.mqtt.socket()
        self.stop_loop_only()
        if sock is not None:
            import socket
            import struct

            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except (OSError, AttributeError):
                pass
            try:
                sock.close()
            except OSError:
                pass

    def stop_loop_only(self) -> None:
        if self._looping:
            self.mqtt.loop_stop()
            self._looping = False


class ClientFactory:
    """Creates clients and disconnects every one of them at the end of the test."""

    def __init__(self) -> None:
        self.clients: list[Client] = []

    def __call__(self, broker: Any = None, client_id: str | None = None, **kwargs: Any) -> Client:
        c = Client(broker, client_id, **kwargs)
        self.clients.append(c)
        return c

    def connected(self, broker: Any = None, client_id: str | None = None, *,
                  connect: dict[str, Any] | None = None, **kwargs: Any) -> Client:
        c = self(broker, client_id, **kwargs)
        c.connect(**(connect or {}))
        return c

    def close_all(self) -> None:
        for c in self.clients:
            try:
                c.disconnect()
            except Exception:  # noqa: BLE001 - finalizer
                c.stop()
        self.clients.clear()


__all__ = [
    "V31", "V311", "V5", "Client", "ClientFactory", "PacketTypes", "Properties",
    "SubscribeOptions", "props", "unique",
]
