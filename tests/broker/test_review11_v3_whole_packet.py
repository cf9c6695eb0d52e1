"""Review of 2ae833d (a v3.x QoS 1/2 copy written whole by ``publish_packet_pid`` in C,
``broker/delivery.py`` ``_write_publish``), on real brokers: the packets a 3.1.1 subscriber
gets are the same bytes from a broker with the C speedups and from one with
``BROKER_PURE_PYTHON=1`` (which writes them from ``Message.parts``), and each re-encodes
field by field to itself (an encoder of this test's own: a fault both paths shared is caught
too). Every way a v3 QoS 1/2 copy leaves: live (QoS 1 and 2, retain as published off), a
retained message on SUBSCRIBE (RETAIN set), an empty payload, payloads whose remaining length
needs 2 and 3 bytes, a UTF-8 topic and one of 300 bytes (the topic length's high byte), a
persistent session's catch-up read from the device log after it was offline (payloads that
are views of a log read), and the DUP resend of an unacknowledged copy after a reconnect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import raw as R
from helpers.broker import BrokerProc

DEV = "devices/r11v3"
LONG = f"{DEV}/" + "l" * (300 - len(DEV) - 1)  # a 300-byte topic


def _encode(p: R.Packet) -> bytes:
    """A v3.1.1 PUBLISH from its fields (MQTT 3.1.1 section 3.3)."""
    topic = p.topic.encode()
    body = len(topic).to_bytes(2, "big") + topic
    if p.qos:
        body += int(p.packet_id or 0).to_bytes(2, "big")
    body += p.payload
    n, rl = len(body), b""
    while True:
        b, n = n & 127, n >> 7
        rl += bytes((b | (128 if n else 0),))
        if not n:
            break
    b0 = 0x30 | (0x08 if p.dup else 0) | (p.qos << 1) | (1 if p.retain else 0)
    return bytes((b0,)) + rl + body


def _scenario(broker: BrokerProc) -> list[bytes]:
    """What one 3.1.1 subscriber receives, every PUBLISH's raw bytes in order."""
    got: list[R.Packet] = []
    pub = R.RawClient(broker.host, broker.port, version=4, timeout=30)
    sub = R.RawClient(broker.host, broker.port, version=4, timeout=30)
    try:
        pub.connect("r11v3-pub")
        assert pub.publish(f"{DEV}/kept", b"retained one", qos=1, retain=True, packet_id=1)
        sub.connect("r11v3-sub", clean=False)
        sub.send(R.subscribe(1, [(f"{DEV}/#", 2)], version=4))
        assert sub.expect(R.SUBACK, skip=(R.PUBLISH,)).packet_id == 1  # nothing else yet
        kept = sub.expect(R.PUBLISH)
        assert kept.retain, kept
        got.append(kept)
        sub.ack(kept)
        live = [(f"{DEV}/e", b"", 1), (f"{DEV}/é/ü", b"x" * 200, 1),
                (f"{DEV}/big", bytes(range(256)) * 80, 2), (LONG, b"long topic", 1),
                (f"{DEV}/r", b"retain flag off live", 1)]
        for k, (topic, payload, qos) in enumerate(live):
            assert pub.publish(topic, payload, qos=qos, retain=topic.endswith("/r"),
                               packet_id=10 + k)
            pkt = sub.expect(R.PUBLISH)
            got.append(pkt)
            if pkt.qos == 2:
                sub.complete_qos2(pkt)
            else:
                sub.ack(pkt)
        sub.disconnect()
        for k in range(3):  # offline: the session reads them from the device log
            assert pub.publish(f"{DEV}/off", b"offline %d" % k + b"!" * 150 * k, qos=1,
                               packet_id=20 + k)
        sub = R.RawClient(broker.host, broker.port, version=4, timeout=30)
        assert sub.connect("r11v3-sub", clean=False).session_present
        for k in range(3):
            pkt = sub.expect(R.PUBLISH)
            got.append(pkt)
            if k < 2:
                sub.ack(pkt)  # the third stays unacknowledged: resent with DUP
        sub.close()
        sub = R.RawClient(broker.host, broker.port, version=4, timeout=30)
        assert sub.connect("r11v3-sub", clean=False).session_present
        again = sub.expect(R.PUBLISH)
        assert again.dup and again.payload == got[-1].payload, (again, got[-1])
        got.append(again)
        sub.ack(again)
    finally:
        pub.close()
        sub.close()
    for p in got:
        assert p.raw == _encode(p), (
            f"a v3.x PUBLISH is not what its fields encode to: {p.raw[:40]!r}... vs "
            f"{_encode(p)[:40]!r}... ({p.topic!r}, qos {p.qos}, pid {p.packet_id})")
    return [p.raw for p in got]


def _started(path: Path, env: dict[str, str]) -> BrokerProc:
    return BrokerProc(path, {}, ws=False, extra_env=env).start()


def test_v3_qos1_and_2_copies_are_the_same_bytes_from_c_and_pure_python(tmp_path: Path) -> None:
    made: list[Any] = []
    try:
        c = _started(tmp_path / "c", {"BROKER_PURE_PYTHON": ""})
        made.append(c)
        from_c = _scenario(c)
        py = _started(tmp_path / "py", {"BROKER_PURE_PYTHON": "1"})
        made.append(py)
        from_py = _scenario(py)
    finally:
        for b in made:
            b.stop()
    assert len(from_c) == len(from_py) == 10
    for k, (a, b) in enumerate(zip(from_c, from_py, strict=True)):
        assert a == b, f"copy {k} differs: C {a[:48]!r}... pure {b[:48]!r}..."
