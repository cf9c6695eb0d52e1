"""Helpers for the commit-log (device log) end-to-end tests.

* ``BrokerGroup`` starts brokers like ``conftest.start_broker`` does (same ``BrokerProc``), but can
  also write ``[[commitlog.rules]]`` tables, which the generic TOML writer cannot express; every
  broker is stopped by its PID in ``stop_all``.
* ``Publisher``: a raw-socket MQTT publisher that keeps a window of QoS 1/2 publishes in flight
  and records every acknowledgement with the ``device``/``offset`` user properties it carries.
* ``Subscriber``: a raw-socket subscriber that acknowledges what it receives and keeps every
  PUBLISH it was sent (including those that arrive before the SUBACK).
* ``http_get`` / ``fetch_records`` / ``fetch_all``: the fetch API with status, headers and bytes.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commitlog.fetch import decode_fetch_response
from commitlog.record import HEADER, HEADER_SIZE, Record
from helpers import raw as R
from helpers.broker import BrokerProc, toml_value

# --------------------------------------------------------------------------------------------
# Brokers
# --------------------------------------------------------------------------------------------


class BrokerGroup:
    """Starts ``BrokerProc`` brokers (optionally with log rules) and stops each by its PID."""

    def __init__(self) -> None:
        self.started: list[BrokerProc] = []
        self._count = 0

    def start(self, workdir: Path, *, rules: list[dict[str, Any]] | None = None,
              wait: bool = True, **overrides: Any) -> BrokerProc:
        self._count += 1
        proc = BrokerProc(Path(workdir) / f"logbroker{self._count}", overrides, ws=False)
        if rules is not None:
            text = proc.config_path.read_text()
            for rule in rules:
                text += "\n[[commitlog.rules]]\n"
                for key, value in rule.items():
                    text += f"{key} = {toml_value(value)}\n"
            proc.config_path.write_text(text)
        self.started.append(proc)
        proc.start(wait=wait)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            try:
                proc.stop(timeout=10)
            except Exception:  # noqa: BLE001 - every process must be reached
                proc.kill()


def data_dir(proc: BrokerProc) -> Path:
    return Path(proc.config["node"]["data_dir"])


def log_dir(proc: BrokerProc) -> Path:
    return data_dir(proc) / "log"


# --------------------------------------------------------------------------------------------
# v5 user properties
# --------------------------------------------------------------------------------------------


def user_props(pkt: R.Packet) -> list[tuple[str, str]]:
    return list(pkt.properties.get(R.USER_PROPERTY, []))


def log_position(pkt: R.Packet) -> tuple[str | None, int | None]:
    """(device, offset) from the user properties of a PUBACK/PUBREC/PUBLISH (None if absent).
    Fails when one of them appears more than once or the offset is not a decimal integer."""
    props = user_props(pkt)
    devices = [v for k, v in props if k == "device"]
    offsets = [v for k, v in props if k == "offset"]
    assert len(devices) <= 1 and len(offsets) <= 1, f"repeated device/offset properties: {pkt!r}"
    offset = None
    if offsets:
        assert offsets[0].isdigit(), f"offset property is not a decimal integer: {pkt!r}"
        offset = int(offsets[0])
    return (devices[0] if devices else None), offset


# --------------------------------------------------------------------------------------------
# Publisher with a window of in-flight QoS 1/2 publishes
# --------------------------------------------------------------------------------------------


@dataclass
class Sent:
    tag: Any
    topic: str
    payload: bytes
    qos: int
    packet_id: int


@dataclass
class Ack:
    sent: Sent
    reason_code: int
    device: str | None
    offset: int | None
    packet: R.Packet


class ConnectionLost(Exception):
    """The broker closed the connection (or died)."""


@dataclass
class Publisher:
    """A raw MQTT client publishing QoS 1/2 with ``window`` messages in flight.

    ``acks`` holds every PUBACK / PUBREC received, in arrival order. ``inflight`` maps packet
    ids to messages not acknowledged yet; a QoS 2 message leaves it at its PUBREC (that is the
    acknowledgement that it was stored); its PUBREL/PUBCOMP exchange is finished in the
    background (``releasing``)."""

    host: str
    port: int
    client_id: str
    version: int = 5
    window: int = 16
    timeout: float = 10.0
    acks: list[Ack] = field(default_factory=list)
    inflight: dict[int, Sent] = field(default_factory=dict)
    releasing: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.client = R.RawClient(self.host, self.port, version=self.version,
                                  timeout=self.timeout)
        self._next_id = 0
        # v5: ask for device/offset on every PUBACK/PUBREC (opt-in, mqtt.ack_offsets)
        props = {R.USER_PROPERTY: [("ack-offsets", "true")]} if self.version == 5 else None
        ack = self.client.connect(self.client_id, clean=True, keepalive=60, properties=props)
        assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
        # Never exceed the server's Receive Maximum (MQTT 5 section 3.2.2.3.3).
        self.window = min(self.window, ack.properties.get(R.RECEIVE_MAXIMUM, 65535))

    def _packet_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self.inflight and self._next_id not in self.releasing:
                return self._next_id
        raise AssertionError("no free packet id")

    def send(self, topic: str, payload: bytes, *, qos: int = 1, tag: Any = None,
             properties: list[tuple[int, Any]] | dict[int, Any] | None = None) -> Sent:
        pid = self._packet_id()
        sent = Sent(tag, topic, payload, qos, pid)
        self.inflight[pid] = sent
        try:
            self.client.send(R.publish(topic, payload, qos=qos, packet_id=pid,
                                       version=self.version, properties=properties))
        except OSError as exc:
            raise ConnectionLost(f"send failed: {exc!r}") from exc
        return sent

    def poll(self, timeout: float) -> Ack | None:
        """Handle at most one packet from the broker; the Ack if it was one."""
        try:
            pkt = self.client.recv(timeout)
        except TimeoutError:
            return None
        except (ConnectionError, OSError) as exc:
            raise ConnectionLost(str(exc)) from exc
        if pkt.type in (R.PUBACK, R.PUBREC):
            sent = self.inflight.pop(pkt.packet_id, None)
            assert sent is not None, f"{R.PACKET_NAMES[pkt.type]} for a packet id not in " \
                                     f"flight: {pkt!r}"
            expected = R.PUBACK if sent.qos == 1 else R.PUBREC
            assert pkt.type == expected, f"got {pkt!r} for a QoS {sent.qos} publish"
            rc = pkt.reason_code or 0
            device, offset = log_position(pkt) if self.version == 5 else (None, None)
            ack = Ack(sent, rc, device, offset, pkt)
            self.acks.append(ack)
            if pkt.type == R.PUBREC and rc < 0x80:
                self.releasing.add(pkt.packet_id)
                try:
                    self.client.send(R.pubrel(pkt.packet_id))
                except OSError as exc:
                    raise ConnectionLost(f"send failed: {exc!r}") from exc
            return ack
        if pkt.type == R.PUBCOMP:
            assert pkt.packet_id in self.releasing, f"unexpected {pkt!r}"
            self.releasing.discard(pkt.packet_id)
            return None
        if pkt.type == R.DISCONNECT:
            raise ConnectionLost(f"server sent {pkt!r}")
        raise AssertionError(f"publisher got an unexpected packet: {pkt!r}")

    @property
    def busy(self) -> int:
        """Packet ids in use: what the server's Receive Maximum counts (a QoS 2 publish until
        its PUBCOMP, [MQTT-3.3.4-9])."""
        return len(self.inflight) + len(self.releasing)

    def has_room(self) -> bool:
        return self.busy < self.window

    def wait_window(self, deadline: float) -> None:
        """Block until fewer than ``window`` messages are in flight."""
        while not self.has_room():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(self.inflight)} publishes unacknowledged for too long: "
                    f"{sorted((s.topic, s.payload[:30]) for s in self.inflight.values())[:5]}"
                )
            self.poll(0.2)

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every in-flight publish (and QoS 2 release) to complete."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self.inflight or self.releasing:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(self.inflight)} publishes still unacknowledged after "
                    f"{timeout or self.timeout}s"
                )
            self.poll(0.2)

    def publish_all(self, items: list[tuple[str, bytes]], *, qos: int = 1,
                    properties: list[tuple[int, Any]] | None = None,
                    timeout: float = 30.0) -> list[Ack]:
        """Publish every (topic, payload) with the window and return their acks in send order.
        Every ack must be a success."""
        deadline = time.monotonic() + timeout
        first = len(self.acks)
        sent: list[Sent] = []
        for topic, payload in items:
            self.wait_window(deadline)
            sent.append(self.send(topic, payload, qos=qos, properties=properties))
        self.drain(max(0.1, deadline - time.monotonic()))
        by_sent = {id(a.sent): a for a in self.acks[first:]}
        out = [by_sent[id(s)] for s in sent]
        bad = [a for a in out if a.reason_code >= 0x80]
        assert not bad, f"publishes refused: {[(a.sent.topic, hex(a.reason_code)) for a in bad]}"
        return out

    def close(self) -> None:
        self.client.try_send(R.disconnect())
        self.client.close()


# --------------------------------------------------------------------------------------------
# Subscriber
# --------------------------------------------------------------------------------------------


class Subscriber:
    """A raw MQTT client that subscribes and collects (and acknowledges) PUBLISH packets."""

    def __init__(self, host: str, port: int, client_id: str, *, version: int = 5,
                 timeout: float = 10.0, receive_maximum: int | None = None,
                 session_expiry: int | None = None) -> None:
        """``session_expiry`` (v5): a persistent session (clean start 0) kept that long."""
        self.client = R.RawClient(host, port, version=version, timeout=timeout)
        self.version = version
        self.messages: list[R.Packet] = []
        self._next_pid = 0
        props = {R.RECEIVE_MAXIMUM: receive_maximum} if receive_maximum and version == 5 else None
        if session_expiry is not None:
            props = {**(props or {}), R.SESSION_EXPIRY_INTERVAL: session_expiry}
        ack = self.client.connect(client_id, clean=session_expiry is None, keepalive=60,
                                  properties=props)
        assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
        self.session_present = ack.session_present

    def _pid(self) -> int:
        self._next_pid = self._next_pid % 65535 + 1
        return self._next_pid

    def _handle(self, pkt: R.Packet) -> R.Packet | None:
        """Acknowledge/keep a PUBLISH; answer a PUBREL; return anything else."""
        if pkt.type == R.PUBLISH:
            self.messages.append(pkt)
            if pkt.qos == 1:
                self.client.send(R.puback(pkt.packet_id))
            elif pkt.qos == 2:
                self.client.send(R.pubrec(pkt.packet_id))
            return None
        if pkt.type == R.PUBREL:
            self.client.send(R.pubcomp(pkt.packet_id))
            return None
        return pkt

    def _expect(self, ptype: int, timeout: float, what: str) -> R.Packet:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout}s")
            try:
                pkt = self.client.recv(remaining)
            except TimeoutError:
                continue
            except ConnectionError:
                raise AssertionError(f"server closed the connection while waiting for {what}"
                                     ) from None
            other = self._handle(pkt)
            if other is None:
                continue
            if other.type == ptype:
                return other
            raise AssertionError(f"expected {what}, got {other!r}")

    def subscribe(self, flt: str, qos: int = 1, *, offset: str | None = None,
                  reset: str | None = None, timeout: float = 10.0) -> R.Packet:
        """SUBSCRIBE (v5: with the ``offset``/``offset-reset`` user properties); the SUBACK."""
        props = None
        if self.version == 5:
            users = []
            if offset is not None:
                users.append(("offset", offset))
            if reset is not None:
                users.append(("offset-reset", reset))
            props = {R.USER_PROPERTY: users} if users else None
        pid = self._pid()
        self.client.send(R.subscribe(pid, [(flt, qos)], version=self.version,
                                     properties=props))
        ack = self._expect(R.SUBACK, timeout, f"SUBACK for {flt!r}")
        assert ack.packet_id == pid, f"SUBACK for packet id {ack.packet_id}, sent {pid}"
        return ack

    def unsubscribe(self, flt: str, timeout: float = 10.0) -> R.Packet:
        pid = self._pid()
        self.client.send(R.unsubscribe(pid, [flt], version=self.version))
        ack = self._expect(R.UNSUBACK, timeout, f"UNSUBACK for {flt!r}")
        assert ack.packet_id == pid
        return ack

    def collect(self, n: int, timeout: float = 15.0) -> list[R.Packet]:
        """Wait until ``n`` PUBLISH packets have been received in all; return all of them."""
        deadline = time.monotonic() + timeout
        while len(self.messages) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                got = [(m.topic, log_position(m)[1] if self.version == 5 else None,
                        m.payload[:24]) for m in self.messages]
                raise AssertionError(
                    f"received {len(self.messages)} of {n} messages within {timeout}s; "
                    f"first ones: {got[:8]}, last ones: {got[-8:]}"
                )
            try:
                pkt = self.client.recv(min(remaining, 1.0))
            except TimeoutError:
                continue
            except ConnectionError:
                raise AssertionError(
                    f"server closed the connection after {len(self.messages)} of {n} messages"
                ) from None
            other = self._handle(pkt)
            if other is not None:
                raise AssertionError(f"subscriber got an unexpected packet: {other!r}")
        return list(self.messages)

    def pump(self, duration: float) -> None:
        """Receive and acknowledge whatever arrives during ``duration`` seconds."""
        deadline = time.monotonic() + duration
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                pkt = self.client.recv(remaining)
            except TimeoutError:
                return
            except ConnectionError:
                raise AssertionError(
                    f"server closed the connection after {len(self.messages)} messages"
                ) from None
            other = self._handle(pkt)
            if other is not None:
                raise AssertionError(f"subscriber got an unexpected packet: {other!r}")

    def expect_quiet(self, wait: float = 0.5) -> None:
        """No further PUBLISH arrives within ``wait`` seconds."""
        before = len(self.messages)
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                pkt = self.client.recv(remaining)
            except TimeoutError:
                break
            except ConnectionError:
                raise AssertionError("server closed the connection") from None
            other = self._handle(pkt)
            if other is not None and other.type != R.PINGRESP:
                raise AssertionError(f"subscriber got an unexpected packet: {other!r}")
        extra = self.messages[before:]
        assert not extra, (
            f"{len(extra)} unexpected extra messages: "
            f"{[(m.topic, user_props(m), m.payload[:24]) for m in extra[:8]]}"
        )

    def close(self) -> None:
        self.client.try_send(R.disconnect())
        self.client.close()


def offsets_of(packets: list[R.Packet], device: str) -> list[int]:
    """The ``offset`` user property of each PUBLISH, checking its ``device`` property."""
    out = []
    for p in packets:
        dev, off = log_position(p)
        assert dev == device, f"device property {dev!r}, expected {device!r}: {p!r}"
        assert off is not None, f"no offset property: {p!r}"
        out.append(off)
    return out


# --------------------------------------------------------------------------------------------
# Fetch API
# --------------------------------------------------------------------------------------------


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise AssertionError(
                f"HTTP {self.status} body is not JSON: {self.body[:300]!r}"
            ) from None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()


def http_get(proc: BrokerProc, path: str, timeout: float = 10.0) -> HttpResponse:
    url = f"http://{proc.host}:{proc.admin_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return HttpResponse(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                                resp.read())
    except urllib.error.HTTPError as exc:
        return HttpResponse(exc.code, {k.lower(): v for k, v in exc.headers.items()},
                            exc.read())


def log_list(proc: BrokerProc) -> dict[str, tuple[int, int]]:
    """GET /api/v1/logs as {device: (start, end)}."""
    resp = http_get(proc, "/api/v1/logs")
    assert resp.status == 200, f"GET /api/v1/logs: HTTP {resp.status}: {resp.body[:300]!r}"
    doc = resp.json()
    assert isinstance(doc, dict) and isinstance(doc.get("logs"), list), doc
    return {e["device"]: (e["start"], e["end"]) for e in doc["logs"]}


def fetch_records(proc: BrokerProc, device: str, **params: Any
                  ) -> tuple[HttpResponse, list[Record]]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    resp = http_get(proc, f"/api/v1/logs/{device}/records" + (f"?{query}" if query else ""))
    assert resp.status == 200, (
        f"GET records of {device!r} {params}: HTTP {resp.status}: {resp.body[:300]!r}"
    )
    assert resp.content_type == "application/octet-stream", resp.headers
    return resp, decode_fetch_response(resp.body)


def fetch_all(proc: BrokerProc, device: str, page: int = 500) -> list[Record]:
    """Every committed record of ``device``, paging with ``X-Meshmq-Next-Offset``."""
    out: list[Record] = []
    resp, _ = fetch_records(proc, device, max_records=1)
    offset = int(resp.headers["x-meshmq-start"])
    for _ in range(100_000):
        resp, recs = fetch_records(proc, device, offset=offset, max_records=page)
        end = int(resp.headers["x-meshmq-end"])
        out.extend(recs)
        nxt = int(resp.headers["x-meshmq-next-offset"])
        if nxt >= end:
            return out
        assert recs and nxt > offset, (
            f"paging {device!r} made no progress at offset {offset} (end {end}): {resp.headers}"
        )
        offset = nxt
    raise AssertionError("paging did not finish")


# --------------------------------------------------------------------------------------------
# Retention: a log whose start has moved past 0
# --------------------------------------------------------------------------------------------

# Byte retention small enough that a few thousand bytes of one device move its start; retention
# runs with the maintenance timer (every checkpoint_interval_s).
RETENTION_CONFIG = {
    "retention_bytes_per_device": 2000,
    "index_interval_bytes": 200,
    "checkpoint_interval_s": 0.2,
}


def retained_log(proc: BrokerProc, device: str, n: int = 120, timeout: float = 20.0
                 ) -> tuple[int, int, list[bytes]]:
    """Publish ``n`` QoS 1 messages to devices/<device>/t and wait until retention has moved
    the log start past 0; returns (start, end, payloads by offset)."""
    pub = Publisher(proc.host, proc.port, f"retention-{device}", window=16)
    try:
        payloads = [f"{device}-ret-{i:05d}-".encode() + b"x" * 40 for i in range(n)]
        acks = pub.publish_all([(f"devices/{device}/t", p) for p in payloads])
        assert [a.offset for a in acks] == list(range(n))
    finally:
        pub.close()
    deadline = time.monotonic() + timeout
    while True:
        start, end = log_list(proc).get(device, (0, 0))
        if start > 0:
            assert end == n, (start, end, n)
            return start, end, payloads
        if time.monotonic() > deadline:
            raise AssertionError(
                f"retention did not move the start of {device!r} within {timeout}s "
                f"(range [{start}, {end}], config {RETENTION_CONFIG})"
            )
        time.sleep(0.1)


def flip_record(log_dir: str | Path, device: str, offset: int) -> None:
    """Flip one payload bit of ``device``'s record at ``offset`` in a stopped router's
    segment files (its CRC no longer matches)."""
    for seg in sorted(Path(log_dir).glob("*.log")):
        data = seg.read_bytes()
        p = 0
        while p + HEADER_SIZE <= len(data):
            length, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
            key = data[p + HEADER_SIZE:p + HEADER_SIZE + kl].decode("utf-8", "replace")
            if key == device and off == offset:
                pos = p + 4 + length - 2  # inside the payload (its last bytes)
                with open(seg, "r+b") as f:
                    f.seek(pos)
                    b = f.read(1)
                    f.seek(pos)
                    f.write(bytes([b[0] ^ 0x04]))
                return
            p += 4 + length
    raise AssertionError(f"no record {device}@{offset} in {log_dir}")
