"""The chaos workload: independent paho-mqtt clients that record everything they see.

* ``DevicePublisher``: one per device, MQTT 5 with ``ack-offsets``, QoS 1, one message at a
  time (so its send order is its seq order; the checker relies on it). Each PUBLISH is an
  *attempt* (payload ``device|seq|attempt``) sent once on a fresh clean connection; its outcome
  is ``ok`` / ``fail`` (reason code >= 0x80, retried on the same connection) / ``unknown`` (no
  PUBACK within ``ack_timeout`` or the connection lost: retried on the next node of its list,
  as a device with a node list does).
* ``Sub``: every subscriber kind (``live``, ``wildcard``, ``persistent``, ``replay``,
  ``group``), reconnecting to the next node when its connection drops; it records each
  interval in which it held its subscription (SUBACK to disconnect, with the node) and every
  message (device, seq, attempt, ``offset`` user property if any, time).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.chaos.checker import parse_payload, payload_for

KEEPALIVE = 3  # seconds: a dead connection is noticed within 1.5x this
SUBACK_TIMEOUT = 30.0  # a SUBSCRIBE unanswered this long: reconnect elsewhere


def _client(client_id: str) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                       protocol=mqtt.MQTTv5, reconnect_on_failure=False)


def _connect(client: mqtt.Client, host: str, port: int, props: Properties,
             clean_start: bool, timeout: float = 5.0) -> bool:
    """Connect and wait for a successful CONNACK; False (and the client stopped) otherwise."""
    done = threading.Event()
    ok = [False]

    def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any = None) -> None:
        ok[0] = not rc.is_failure
        client.session_present = bool(getattr(flags, "session_present", False))  # type: ignore[attr-defined]
        done.set()

    client.on_connect = on_connect
    try:
        client.connect(host, port, keepalive=KEEPALIVE, clean_start=clean_start,
                       properties=props)
    except OSError:
        return False
    client.loop_start()
    if not done.wait(timeout) or not ok[0]:
        _stop(client)
        return False
    return True


def _stop(client: mqtt.Client) -> None:
    with contextlib.suppress(Exception):
        client.disconnect()
    with contextlib.suppress(Exception):
        client.loop_stop()


class DevicePublisher(threading.Thread):
    def __init__(self, device: str, nodes: list[tuple[str, int]], first: int, rate: float,
                 attempts: list[dict[str, Any]], stop: threading.Event,
                 ack_timeout: float = 10.0) -> None:
        super().__init__(daemon=True, name=f"pub-{device}")
        self.device = device
        self.topic = f"devices/{device}/t"
        self.nodes = nodes
        self.node = first
        self.interval = 1.0 / rate
        self.attempts = attempts
        self.stop_event = stop
        self.ack_timeout = ack_timeout
        self.conns = 0

    def run(self) -> None:
        seq, attempt = 0, 0
        client: mqtt.Client | None = None
        lost = threading.Event()
        acked = threading.Event()
        result: dict[str, Any] = {}
        while not self.stop_event.is_set():
            if client is None:
                self.conns += 1
                client = _client(f"chaos-pub-{self.device}-{self.conns}")
                lost.clear()

                def on_publish(c: Any, u: Any, mid: int, rc: Any, props: Any) -> None:
                    result[mid] = (rc, props, time.time())
                    acked.set()

                def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, p: Any = None) -> None:
                    lost.set()
                    acked.set()

                client.on_publish = on_publish
                client.on_disconnect = on_disconnect
                props = Properties(PacketTypes.CONNECT)
                props.UserProperty = ("ack-offsets", "true")
                host, port = self.nodes[self.node]
                if not _connect(client, host, port, props, clean_start=True):
                    client = None
                    self.node = (self.node + 1) % len(self.nodes)
                    self.stop_event.wait(0.3)
                    continue
            t_send = time.time()
            rec: dict[str, Any] = {"device": self.device, "seq": seq, "attempt": attempt,
                                   "node": self.node, "t_send": t_send, "outcome": "unknown",
                                   "rc": None, "reason": None, "t_done": None, "offset": None}
            self.attempts.append(rec)
            acked.clear()
            info = client.publish(self.topic, payload_for(self.device, seq, attempt), qos=1)
            attempt += 1
            deadline = t_send + self.ack_timeout
            while info.mid not in result and not lost.is_set() and time.time() < deadline:
                acked.wait(0.2)
                acked.clear()
            got = result.pop(info.mid, None)
            result.clear()
            if got is not None:
                rc, props, t_done = got
                rec["t_done"] = t_done
                rec["rc"] = rc.value
                if rc.is_failure:
                    rec["outcome"], rec["reason"] = "fail", f"0x{rc.value:02X}"
                    self.stop_event.wait(0.2)
                    continue
                rec["outcome"] = "ok"
                for name, value in getattr(props, "UserProperty", None) or []:
                    if name == "offset":
                        rec["offset"] = int(value)
                seq, attempt = seq + 1, 0
                self.stop_event.wait(max(0.0, t_send + self.interval - time.time()))
                continue
            # no PUBACK: the outcome is unknown; go on at the next node
            rec["t_done"] = time.time()
            rec["reason"] = "disconnected" if lost.is_set() else "timeout"
            _stop(client)
            client = None
            self.node = (self.node + 1) % len(self.nodes)
        if client is not None:
            _stop(client)


class Sub:
    """One subscriber (see the module docstring); ``start()`` connects in a thread that keeps
    it connected until ``close()``."""

    def __init__(self, name: str, kind: str, flt: str, nodes: list[tuple[str, int]],
                 first: int, device: str | None = None) -> None:
        self.name, self.kind, self.filter = name, kind, flt
        self.nodes = nodes
        self.node = first
        self.device = device
        self.intervals: list[list[Any]] = []
        self.received: list[tuple[str, int, int, int | None, float]] = []
        self.next_offset = 0  # replay: resume here
        self.events: list[list[Any]] = []  # failed connects and SUBACKs
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"sub-{name}")
        self._client: mqtt.Client | None = None

    def start(self) -> None:
        self._thread.start()

    def wait_subscribed(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.intervals and self.intervals[-1][1] is None:
                return True
            time.sleep(0.05)
        return False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "filter": self.filter,
                "device": self.device, "intervals": self.intervals,
                "received": self.received, "events": self.events}

    def _on_message(self, c: Any, u: Any, msg: mqtt.MQTTMessage) -> None:
        key = parse_payload(msg.payload.decode("utf-8", "replace"))
        if key is None:
            return
        offset = None
        props = getattr(msg, "properties", None)
        for name, value in getattr(props, "UserProperty", None) or []:
            if name == "offset":
                offset = int(value)
        if offset is not None and self.kind == "replay":
            self.next_offset = max(self.next_offset, offset + 1)
        self.received.append((key[0], key[1], key[2], offset, time.time()))

    def _run(self) -> None:
        persistent = self.kind == "persistent"
        n = 0
        while not self._stop.is_set():
            n += 1
            cid = f"chaos-{self.name}" if persistent else f"chaos-{self.name}-{n}"
            client = _client(cid)
            client.on_message = self._on_message
            subscribed = threading.Event()
            lost = threading.Event()
            node = self.node

            def on_subscribe(c: Any, u: Any, mid: int, rcs: Any, p: Any = None,
                             node: int = node, subscribed: threading.Event = subscribed,
                             lost: threading.Event = lost) -> None:
                if all(not rc.is_failure for rc in rcs):
                    self.intervals.append([time.time(), None, node,
                                           getattr(c, "session_present", False)])
                else:
                    why = getattr(p, "ReasonString", "") if p is not None else ""
                    self.events.append([time.time(), node, "suback " + ",".join(
                        f"0x{rc.value:02X}" for rc in rcs) + f" {why}"])
                    lost.set()  # try again (at the next node)
                subscribed.set()

            def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, p: Any = None,
                              lost: threading.Event = lost) -> None:
                if self.intervals and self.intervals[-1][1] is None:
                    self.intervals[-1][1] = time.time()
                lost.set()

            client.on_subscribe = on_subscribe
            client.on_disconnect = on_disconnect
            cprops = Properties(PacketTypes.CONNECT)
            if persistent:
                cprops.SessionExpiryInterval = 3600
            host, port = self.nodes[node]
            if not _connect(client, host, port, cprops, clean_start=not persistent):
                self.events.append([time.time(), node, "connect failed"])
                self.node = (self.node + 1) % len(self.nodes)
                self._stop.wait(0.5)
                continue
            sprops = Properties(PacketTypes.SUBSCRIBE)
            if self.kind == "replay":
                sprops.UserProperty = ("offset", str(self.next_offset))
            try:
                client.subscribe(self.filter, qos=1, properties=sprops)
            except Exception:  # noqa: BLE001 - a connection lost at once: try the next node
                lost.set()
            self._client = client
            asked = time.monotonic()
            while not self._stop.is_set() and not lost.is_set():
                lost.wait(0.2)
                if not subscribed.is_set() and time.monotonic() - asked > SUBACK_TIMEOUT:
                    self.events.append([time.time(), node, "no SUBACK"])
                    break
            if not lost.is_set():  # closing: the interval ends now
                if self.intervals and self.intervals[-1][1] is None:
                    self.intervals[-1][1] = time.time()
            _stop(client)
            if not self._stop.is_set():
                self.node = (self.node + 1) % len(self.nodes)
                self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
