"""Review 6: the bridge (``[[bridge]]``, meshmq/bridge.py) attacked with faults, against a real
Eclipse Mosquitto and a real ``meshmq serve``.

A poison message: an inbound message this broker can never store (bigger than its
``mqtt.max_packet_size``, or denied by the ACL of ``$bridge/<name>``) must not stop the bridge.
Before review 6 the bridge answered both by closing the remote connection unacknowledged, so
Mosquitto sent the same message first again after every reconnect, forever: nothing published
behind it ever arrived. Each test publishes the poison message on Mosquitto, then a sentinel
behind it, and waits (generous deadline, no timing assertion) for the sentinel here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import BrokerProc, wait_for
from helpers.clients import V5, Client
from helpers.mosquitto import ALL_MOSQUITTOS, MosquittoProc
from helpers.volume import tmpfs_volume

pytestmark = pytest.mark.timeout(300)  # generous deadlines on a loaded box, never a timing check


@pytest.fixture
def mosq(tmp_path: Path) -> Iterator[MosquittoProc]:
    m = MosquittoProc(tmp_path / "mosquitto").start()
    try:
        yield m
    finally:
        m.stop()
        ALL_MOSQUITTOS.remove(m)


@pytest.fixture
def made() -> Iterator[list[Any]]:
    """Brokers and clients a test starts, stopped at its end (by PID / loop)."""
    things: list[Any] = []
    try:
        yield things
    finally:
        for t in reversed(things):
            try:
                t.stop()
            except Exception:  # noqa: BLE001 - clean up the rest
                pass


def client(made: list[Any], host: str, port: int, **kw: Any) -> Client:
    c = Client(host=host, port=port, protocol=V5, **kw)
    c.connect()
    made.append(c)
    return c


def start_bridged(tmp_path: Path, made: list[Any], mosq: MosquittoProc,
                  overrides: dict[str, Any]) -> BrokerProc:
    cfg = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "keepalive": 10,
           "topics": [{"pattern": "commands/#", "direction": "in", "qos": 1}]}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [cfg], **overrides}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=30,
             message="the bridge to connect (meshmq_bridge_up 1)")
    return b


def poison_then_sentinel(made: list[Any], b: BrokerProc, mosq: MosquittoProc, local: Client,
                         poison_topic: str, poison: bytes, n: int = 40) -> None:
    """The poison message, then ``n`` sentinels behind it, all QoS 1 on Mosquitto: every
    sentinel must arrive here, and the poison message must be counted as let go. Past the
    Receive Maximum the bridge announces (1,000), a poison message that stays in Mosquitto's
    window (resent first after every reconnect, never acknowledged) holds the rest back for
    good; within it, the ones behind it arrive again and again, one reconnect after another."""
    time.sleep(0.5)  # (the inbound subscription is made just before meshmq_bridge_up is 1)
    rpub = client(made, mosq.host, mosq.port)
    assert rpub.puback_code(rpub.publish(poison_topic, poison, qos=1)) == 0
    sentinels = {f"after-{i}".encode() for i in range(n)}
    for payload in sorted(sentinels):
        assert rpub.puback_code(rpub.publish("commands/ok/x", payload, qos=1)) == 0
    got: set[bytes] = set()

    def arrived() -> bool:
        got.update(m.payload for m in local.drain() if m.topic == "commands/ok/x")
        return sentinels <= got

    wait_for(arrived, timeout=90,
             message="the messages published on Mosquitto behind a message this broker can "
                     "never store (the bridge is wedged on it)")
    wait_for(lambda: b.metric("meshmq_bridge_refused_total", bridge="up", direction="in") >= 1,
             timeout=20, message="the poison message counted in meshmq_bridge_refused_total")
    assert f"inbound message on {poison_topic!r} was let go" in b.log_text()


def test_an_oversized_inbound_message_does_not_wedge_the_bridge(
        tmp_path: Path, made: list[Any], mosq: MosquittoProc) -> None:
    """A 10 kB message on Mosquitto, this broker's mqtt.max_packet_size 4 kB: let go
    (acknowledged to Mosquitto, counted, logged naming the key to raise); the messages behind
    it arrive."""
    b = start_bridged(tmp_path, made, mosq, {"mqtt": {"max_packet_size": 4096}})
    local = client(made, b.host, b.port)
    local.subscribe("commands/#", qos=1)
    poison_then_sentinel(made, b, mosq, local, "commands/big/x", b"x" * 10_000)
    assert "raise mqtt.max_packet_size" in b.log_text()


def test_an_inbound_message_the_acl_denies_does_not_wedge_the_bridge(
        tmp_path: Path, made: list[Any], mosq: MosquittoProc) -> None:
    """The ACL lets $bridge/up write commands/ok/# only: a message on commands/secret/x is
    refused here (PUBACK 0x87), which no resend changes: let go, counted, logged naming the
    client whose ACL to check; the messages behind it arrive."""
    from helpers.authfiles import auth_overrides

    acl = ("user alice\ntopic readwrite #\n\n"
           "client $bridge/up\ntopic write commands/ok/#\n")
    b = start_bridged(tmp_path, made, mosq,
                      auth_overrides(tmp_path / "auth", {"alice": "wonderland"}, acl))
    local = client(made, b.host, b.port, username="alice", password="wonderland")
    local.subscribe("commands/#", qos=1)
    poison_then_sentinel(made, b, mosq, local, "commands/secret/x", b"denied", n=1100)
    assert "reason 0x87" in b.log_text() and "'$bridge/up'" in b.log_text()


class GarbageRemote:
    """Not Mosquitto: a TCP server that answers each connection's CONNECT with an accepting
    MQTT 5 CONNACK and then sends ``garbage``, keeping the socket open (so only the bridge's
    own parsing can end the connection, not an EOF); counts the connections it got."""

    def __init__(self, garbage: bytes) -> None:
        import socket
        import threading

        self.garbage = garbage
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.halt.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.conns.append(conn)
            try:
                conn.settimeout(5)
                conn.recv(65_536)  # the CONNECT
                conn.sendall(b"\x20\x03\x00\x00\x00" + self.garbage)
            except OSError:
                pass

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(5)
        for c in [*self.conns, self.sock]:
            c.close()


@pytest.mark.parametrize("garbage", [b"\x00\x00", b"\x30\xff\xff\xff\xff\x7f"],
                         ids=["reserved-packet-type", "remaining-length-over-4-bytes"])
def test_a_remote_sending_malformed_packets_is_dropped_and_retried(
        tmp_path: Path, made: list[Any], garbage: bytes) -> None:
    """A remote that sends a malformed packet right after its CONNACK: the bridge ends that
    connection at once (not at its keepalive, 60 s here), says why in its log, and keeps
    retrying with backoff; this broker serves its own clients throughout."""
    remote = GarbageRemote(garbage)
    made.append(remote)
    cfg = {"name": "up", "address": f"127.0.0.1:{remote.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "keepalive": 60,
           "topics": [{"pattern": "devices/#", "direction": "out", "qos": 1}]}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [cfg]}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: remote.accepted >= 3, timeout=40,
             message="the bridge to drop the malformed remote and retry (3 connections)")
    wait_for(lambda: any("is down" in line and "ProtocolError" in line
                         for line in b.log_text().splitlines()), timeout=20,
             message="the bridge's log to say the remote sent a malformed packet")
    pub = client(made, b.host, b.port)
    assert pub.puback_code(pub.publish("devices/d1/x", b"stored", qos=1)) == 0
    assert b.metric("meshmq_bridge_reconnects_total", bridge="up") >= 2


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs for the commit log (as tests/broker/test_disk_full.py: needs root)."""
    yield from tmpfs_volume(tmp_path)


def test_inbound_on_a_full_disk_is_never_acked_and_arrives_once_space_is_back(
        tmp_path: Path, made: list[Any], mosq: MosquittoProc, tmpfs: Path) -> None:
    """The commit log's volume full while Mosquitto sends inbound QoS 1 messages: this broker
    refuses them (0x80, not stored), a refusal that may pass later, so the bridge must not
    acknowledge them to Mosquitto (not let them go like an ACL denial): once space is freed,
    Mosquitto's resends are stored and every one reaches the subscriber here."""
    import errno

    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (512 * 1024))  # freed later: space comes back
    b = start_bridged(tmp_path, made, mosq,
                      {"commitlog": {"dir": str(tmpfs / "log"), "segment_bytes": 1 << 20}})
    local = client(made, b.host, b.port)
    local.subscribe("commands/#", qos=1)
    time.sleep(0.5)
    rpub = client(made, mosq.host, mosq.port)
    # the device log exists before the disk fills (its appends are what fail, as in
    # tests/broker/test_disk_full.py)
    assert rpub.puback_code(rpub.publish("commands/full/x", b"warm", qos=1)) == 0
    assert local.expect_message(timeout=30).payload == b"warm"
    with open(tmpfs / "topfill", "ab", buffering=0) as f:  # every byte left on the volume
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    # 1 kB each: the segment's last page may still take a record or two, not twenty
    sent = {f"cmd-{i}:".encode() + b"x" * 1000 for i in range(20)}
    for payload in sorted(sent):
        assert rpub.puback_code(rpub.publish("commands/full/x", payload, qos=1)) == 0
    wait_for(lambda: "this broker refused an inbound message" in b.log_text(), timeout=45,
             message="the bridge to see the full disk refuse an inbound message")
    assert b.metric("meshmq_bridge_refused_total", bridge="up", direction="in") >= 1
    filler.unlink()
    (tmpfs / "topfill").unlink()
    got: set[bytes] = set()

    def arrived() -> bool:
        got.update(m.payload for m in local.drain())
        return sent <= got

    wait_for(arrived, timeout=90,
             message="every inbound message refused on the full disk, once space was freed "
                     "(missing ones were acknowledged to Mosquitto and lost)")


def test_an_outbound_message_over_the_remote_packet_limit_does_not_wedge_the_bridge(
        tmp_path: Path, made: list[Any]) -> None:
    """Mosquitto with max_packet_size 4096 (announced in its MQTT 5 CONNACK; it disconnects a
    client that sends more): a 10 kB message stored here on a bridged device log is let go
    (acknowledged here, counted, logged), and the messages stored behind it on the same log
    reach Mosquitto. Before review 6 the bridge sent it, was disconnected, and its session
    sent it first again after every reconnect."""
    from helpers.clients import unique

    mosq = MosquittoProc(tmp_path / "mosquitto")
    mosq.conf.write_text(mosq.conf.read_text() + "max_packet_size 4096\n")
    mosq.start()
    made.append(mosq)
    cfg = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "keepalive": 10,
           "topics": [{"pattern": "devices/#", "direction": "out", "qos": 1}]}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [cfg]}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=30,
             message="the bridge to connect (meshmq_bridge_up 1)")
    remote = client(made, mosq.host, mosq.port, client_id=unique("remote-sub"))
    remote.subscribe("devices/#", qos=1)
    pub = client(made, b.host, b.port)
    assert pub.puback_code(pub.publish("devices/d1/big", b"x" * 10_000, qos=1)) == 0
    sentinels = {f"after-{i}".encode() for i in range(3)}
    for payload in sorted(sentinels):
        assert pub.puback_code(pub.publish("devices/d1/x", payload, qos=1)) == 0
    got: set[bytes] = set()

    def arrived() -> bool:
        got.update(m.payload for m in remote.drain())
        return sentinels <= got

    wait_for(arrived, timeout=45,
             message="the messages stored behind one over the remote's maximum packet size "
                     "(the bridge is wedged on it)")
    assert b.metric("meshmq_bridge_refused_total", bridge="up", direction="out") >= 1
    assert "can never be sent to the remote" in b.log_text()
