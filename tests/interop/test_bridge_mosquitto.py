"""The MQTT bridge (``[[bridge]]``, meshmq/bridge.py) against a real Eclipse Mosquitto.

Every test runs a real ``meshmq serve`` and a real ``mosquitto -c`` on free loopback ports, with
paho clients on both; faults are process kills and restarts. Counts, never timings, decide:
a QoS 1 stream is numbered and every number must arrive (duplicates are allowed and counted).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import BrokerProc, wait_for
from helpers.clients import V5, Client, unique
from helpers.mosquitto import ALL_MOSQUITTOS, MosquittoProc, make_ca


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


def bridged_broker(tmp_path: Path, made: list[Any], mosq: MosquittoProc,
                   topics: list[dict[str, Any]], **bridge: Any) -> BrokerProc:
    cfg = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "keepalive": 10, "topics": topics, **bridge}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [cfg],
                                         "mqtt": {"persistence_interval": 0.5}}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge=cfg["name"]) == 1, timeout=30,
             message="the bridge to connect (meshmq_bridge_up 1)")
    return b


def client(made: list[Any], host: str, port: int, protocol: int = V5, **kw: Any) -> Client:
    c = Client(host=host, port=port, protocol=protocol, **kw)
    c.connect()
    made.append(c)
    return c


def test_out_in_and_prefixes(tmp_path: Path, made: list[Any], mosq: MosquittoProc) -> None:
    """out: devices/# here -> cloud/devices/# there; in: commands/# there -> edge/commands/#
    here; an outbound message outside its pattern and an inbound one outside its own stay
    where they were published."""
    b = bridged_broker(tmp_path, made, mosq, [
        {"pattern": "devices/#", "direction": "out", "qos": 1, "remote_prefix": "cloud/"},
        {"pattern": "commands/#", "direction": "in", "qos": 1, "local_prefix": "edge/"},
    ])
    remote_sub = client(made, mosq.host, mosq.port)
    remote_sub.subscribe("#", qos=1)
    local_sub = client(made, b.host, b.port)
    local_sub.subscribe("edge/#", qos=1)
    time.sleep(0.5)  # (the inbound subscription is made before meshmq_bridge_up is 1)

    pub = client(made, b.host, b.port)
    assert pub.puback_code(pub.publish("other/x", b"not bridged", qos=1)) == 0
    assert pub.puback_code(pub.publish("devices/d1/temp", b"21.5", qos=1)) == 0
    m = remote_sub.expect_message(timeout=20)
    assert (m.topic, m.payload) == ("cloud/devices/d1/temp", b"21.5"), \
        "a topic outside the out pattern was bridged, or the prefix was not applied"

    rpub = client(made, mosq.host, mosq.port)
    assert rpub.puback_code(rpub.publish("misc/y", b"stays there", qos=1)) == 0
    assert rpub.puback_code(rpub.publish("commands/d1/reboot", b"now", qos=1)) == 0
    m = local_sub.expect_message(timeout=20)
    assert (m.topic, m.payload, m.qos) == ("edge/commands/d1/reboot", b"now", 1)
    assert b.metric("meshmq_bridge_messages_total", bridge="up", direction="in") >= 1
    assert b.metric("meshmq_bridge_messages_total", bridge="up", direction="out") >= 1
    # Mosquitto's bridge notification: retained "1" while connected
    state = client(made, b.host, b.port)
    state.subscribe("$SYS/broker/connection/up/state", qos=0)
    m = state.expect_message(timeout=20)
    assert (m.payload, m.retain) == (b"1", True)
    # $bridge/<name> is the bridge's own session (its stored position): no client takes it
    thief = Client(host=b.host, port=b.port, protocol=V5, client_id="$bridge/up")
    made.append(thief)
    thief.connect(expect_success=False)
    assert thief.connack is not None and thief.connack[1].value == 0x85, thief.connack
    assert b.metric("meshmq_bridge_up", bridge="up") == 1


@pytest.mark.parametrize("protocol", ["mqttv5", "mqttv311"])
def test_both_directions_no_loop(tmp_path: Path, made: list[Any], mosq: MosquittoProc,
                                 protocol: str) -> None:
    """direction both: each side's message reaches the other once and never comes back (v5:
    No Local on both subscriptions; 3.1.1: the bridge bit Mosquitto honours). A sentinel
    after each: when it has arrived, an echo would have."""
    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "sync/#", "direction": "both", "qos": 1}],
                       protocol=protocol)
    remote = client(made, mosq.host, mosq.port)
    remote.subscribe("sync/#", qos=1)
    local = client(made, b.host, b.port)
    local.subscribe("sync/#", qos=1)
    time.sleep(0.5)

    pub = client(made, b.host, b.port)
    assert pub.puback_code(pub.publish("sync/a", b"from-meshmq", qos=1)) == 0
    rpub = client(made, mosq.host, mosq.port)
    assert rpub.puback_code(rpub.publish("sync/b", b"from-mosquitto", qos=1)) == 0
    for i in range(3):  # sentinels both ways
        pub.publish("sync/s", f"local-{i}".encode(), qos=1)
        rpub.publish("sync/s", f"remote-{i}".encode(), qos=1)

    def payloads(c: Client, n: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += [m.payload for m in c.drain()]
            time.sleep(0.05)
        return got

    # each side: its own 4 messages + the other side's 4 = 8; an echo makes more
    at_local = payloads(local, 8)
    at_remote = payloads(remote, 8)
    time.sleep(1.0)
    at_local += [m.payload for m in local.drain()]
    at_remote += [m.payload for m in remote.drain()]
    for side, got in (("meshmq", at_local), ("mosquitto", at_remote)):
        assert sorted(got) == sorted([b"from-meshmq", b"from-mosquitto"]
                                     + [f"local-{i}".encode() for i in range(3)]
                                     + [f"remote-{i}".encode() for i in range(3)]), \
            f"{side} subscriber got {got}: a message looped (or was lost)"


class RemoteCounter:
    """A persistent QoS 1 subscriber on Mosquitto that reconnects by itself (paho's loop,
    clean session 0: Mosquitto keeps what arrives while it is away) and counts every copy."""

    def __init__(self, mosq: MosquittoProc, topic: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.copies: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.topic = topic
        self.c = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                             client_id=unique("counter"), protocol=mqtt.MQTTv311,
                             clean_session=False)
        self.c.reconnect_delay_set(0.1, 0.5)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect(mosq.host, mosq.port, keepalive=5)
        self.c.loop_start()
        assert self.subscribed.wait(20), "the Mosquitto subscriber never got its SUBACK"

    def _on_message(self, c: Any, u: Any, m: Any) -> None:
        with self.lock:
            self.copies[m.payload] = self.copies.get(m.payload, 0) + 1

    def missing(self, expected: set[bytes]) -> set[bytes]:
        with self.lock:
            return expected - set(self.copies)

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.copies.values())

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def publish_all(pub: Client, start: int, n: int, topic: str = "devices/d1/seq") -> set[bytes]:
    """QoS 1, one at a time, each acknowledged (so stored) before the next."""
    sent = set()
    for i in range(start, start + n):
        payload = str(i).encode()
        assert pub.puback_code(pub.publish(topic, payload, qos=1, timeout=30)) == 0
        sent.add(payload)
    return sent


def test_remote_restart_during_qos1_stream_loses_nothing(
        tmp_path: Path, made: list[Any], mosq: MosquittoProc) -> None:
    """Mosquitto restarted while a QoS 1 publisher streams into meshmq: once the bridge is
    back, every acknowledged message is at the subscriber on Mosquitto (duplicates allowed,
    counted)."""
    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "devices/#", "direction": "out", "qos": 1}])
    counter = RemoteCounter(mosq, "devices/#")
    made.append(counter)
    pub = client(made, b.host, b.port)
    sent: set[bytes] = set()
    done = threading.Event()
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            for i in range(0, 600, 20):
                sent.update(publish_all(pub, i, 20))
                time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_for(lambda: len(sent) >= 150 or done.is_set(), timeout=60,
             message="the first 150 publishes")
    mosq.stop()  # mid-stream: what the bridge had in flight is unacknowledged here
    wait_for(lambda: len(sent) >= 300 or done.is_set(), timeout=60,
             message="150 more publishes while Mosquitto is down")
    mosq.start()
    assert done.wait(120), "the publisher did not finish"
    t.join(5)
    assert not errors, errors
    assert len(sent) == 600
    wait_for(lambda: not counter.missing(sent), timeout=90,
             message="every acknowledged message at the Mosquitto subscriber")
    print(f"bridge across a Mosquitto restart: 600 sent, all received, "
          f"{counter.duplicates()} duplicates")
    assert b.metric("meshmq_bridge_reconnects_total", bridge="up") >= 1


def test_meshmq_kill9_resumes_from_stored_position(
        tmp_path: Path, made: list[Any], mosq: MosquittoProc) -> None:
    """meshmq killed (-9) with a backlog the bridge has not sent (the remote was down): after
    the restart the bridge resumes from its stored position and sends all of it."""
    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "devices/#", "direction": "out", "qos": 1}])
    counter = RemoteCounter(mosq, "devices/#")
    made.append(counter)
    pub = client(made, b.host, b.port)
    sent = publish_all(pub, 0, 100)
    wait_for(lambda: not counter.missing(sent), timeout=60, message="batch A at Mosquitto")
    mosq.stop()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 0, timeout=30,
             message="the bridge to see Mosquitto gone")
    sent |= publish_all(pub, 100, 100, topic="devices/d2/seq")  # stored here only
    sent |= publish_all(pub, 200, 50)
    # the backlog is visible as the bridge's lag, and its state topic says "0"
    wait_for(lambda: b.metric("meshmq_bridge_lag_messages", bridge="up") >= 150, timeout=30,
             message="meshmq_bridge_lag_messages to count the 150 unsent messages")
    state = client(made, b.host, b.port)
    state.subscribe("$SYS/broker/connection/up/state", qos=0)
    assert state.expect_message(timeout=20).payload == b"0"
    state.stop()
    made.remove(state)
    pub.abort()
    b.kill()
    b.start()
    mosq.start()
    pub = client(made, b.host, b.port)
    sent |= publish_all(pub, 250, 50)
    wait_for(lambda: not counter.missing(sent), timeout=90,
             message="every acknowledged message (the backlog too) at the Mosquitto subscriber")
    print(f"bridge across meshmq kill -9: {len(sent)} sent, all received, "
          f"{counter.duplicates()} duplicates")


def test_tls_to_mosquitto_with_a_test_ca(tmp_path: Path, made: list[Any]) -> None:
    """TLS to Mosquitto: the bridge that trusts the test CA connects and carries; one that
    trusts another CA never connects (the chain is verified) and says why."""
    certs = tmp_path / "certs"
    certs.mkdir()
    ca, crt, key = make_ca(certs)
    other = tmp_path / "other"
    other.mkdir()
    other_ca = make_ca(other)[0]
    mosq = MosquittoProc(tmp_path / "mosquitto", tls=(crt, key)).start()
    made.append(mosq)
    topics = [{"pattern": "devices/#", "direction": "out", "qos": 1}]
    good = {"name": "good", "address": f"localhost:{mosq.tls_port}", "cafile": ca,
            "reconnect_min": 0.2, "reconnect_max": 1.0, "topics": topics}
    bad = {"name": "bad", "address": f"localhost:{mosq.tls_port}", "cafile": other_ca,
           "reconnect_min": 0.2, "reconnect_max": 1.0, "topics": topics}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [good, bad]}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="good") == 1, timeout=30,
             message="the TLS bridge to connect")
    counter = RemoteCounter(mosq, "devices/#")
    made.append(counter)
    pub = client(made, b.host, b.port)
    sent = publish_all(pub, 0, 10)
    wait_for(lambda: not counter.missing(sent), timeout=30, message="messages over TLS")
    wait_for(lambda: b.metric("meshmq_bridge_reconnects_total", bridge="bad") >= 2,
             timeout=30, message="the untrusted bridge to retry")
    assert b.metric("meshmq_bridge_up", bridge="bad") == 0, \
        "a bridge connected to a server whose certificate its CA did not sign"
    assert "CERTIFICATE_VERIFY_FAILED" in b.log_text()


def test_inbound_acked_to_remote_only_once_stored(tmp_path: Path, made: list[Any],
                                                  mosq: MosquittoProc) -> None:
    """An inbound QoS 1 message gets its PUBACK on Mosquitto only once meshmq acknowledged it:
    with the device's high-water mark held here (tests/README.md, the hold failpoint), the
    bridge's PUBACK is not in Mosquitto's log; released, it is. A sentinel on another device
    reaching a local subscriber shows the bridge processed what came after it."""
    hold = tmp_path / "hold"
    hold.write_text("")
    cfg = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "client_id": "edge-bridge",
           "topics": [{"pattern": "commands/#", "direction": "in", "qos": 1},
                      {"pattern": "alerts/#", "direction": "in", "qos": 1}]}
    b = BrokerProc(tmp_path / "meshmq", {"bridge": [cfg]}, ws=False,
                   extra_env={"MESHMQTEST_HWM_HOLD_FILE": str(hold)})
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=30,
             message="the bridge to connect")
    local = client(made, b.host, b.port)
    local.subscribe([("commands/#", 1), ("alerts/#", 1)])
    rpub = client(made, mosq.host, mosq.port)
    time.sleep(0.5)
    # the held device's log must exist before it can be held (hwmhold.py)
    rpub.publish("commands/held/x", b"first", qos=1)
    local.expect_message(timeout=20)

    def mosquitto_log() -> str:
        return mosq.log_path.read_text(errors="replace")

    def acked(payload_len: int, topic: str) -> bool | None:
        """Whether Mosquitto got the bridge's PUBACK for its last PUBLISH on ``topic`` (None:
        not sent yet), read from its own log (log_type all)."""
        sent = re.findall(r"Sending PUBLISH to edge-bridge \(d\d, q1, r\d, m(\d+), "
                          + re.escape(repr(topic)) + rf", \.\.\. \({payload_len} bytes\)\)",
                          mosquitto_log())
        if not sent:
            return None
        return f"Received PUBACK from edge-bridge (Mid: {sent[-1]}," in mosquitto_log()

    wait_for(lambda: acked(5, "commands/held/x"), timeout=20,
             message="the first message's PUBACK")
    hold.write_text("commands\n")  # the first level keys the log of commands/... topics
    wait_for(lambda: "high-water mark of 'commands' held" in b.log_text(), timeout=20,
             message="the hold to take effect")
    rpub.publish("commands/held/x", b"held", qos=1, wait=False)
    rpub.publish("alerts/x", b"sentinel", qos=1, wait=False)  # another log: not held
    m = local.expect_message(timeout=20)
    assert m.payload == b"sentinel", "the held message was delivered before it was stored"
    wait_for(lambda: acked(8, "alerts/x"), timeout=20, message="the sentinel's PUBACK")
    assert acked(4, "commands/held/x") is False, \
        "Mosquitto got a PUBACK for a message meshmq had not acknowledged (not stored)"
    hold.write_text("")
    m = local.expect_message(timeout=20)
    assert m.payload == b"held"
    wait_for(lambda: acked(4, "commands/held/x"), timeout=20,
             message="the held message's PUBACK once stored")


def test_remote_crash_loses_nothing(tmp_path: Path, made: list[Any],
                                    mosq: MosquittoProc) -> None:
    """Mosquitto frozen (SIGSTOP) while messages stream, then killed (-9): what the bridge
    wrote into the dead socket was never acknowledged by Mosquitto, so it must be sent again
    after the restart: every acknowledged message reaches the subscriber."""
    import os
    import signal

    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "devices/#", "direction": "out", "qos": 1}])
    counter = RemoteCounter(mosq, "devices/#")
    made.append(counter)
    pub = client(made, b.host, b.port)
    sent = publish_all(pub, 0, 50)
    wait_for(lambda: not counter.missing(sent), timeout=60, message="the first batch")
    # Mosquitto writes its persistence file every second (autosave_interval 1): let it write
    # the subscriber's session before it is killed (its own loss is not the bridge's).
    time.sleep(2.5)
    os.kill(mosq.proc.pid, signal.SIGSTOP)
    sent |= publish_all(pub, 50, 200)  # stored here; the bridge writes into a frozen socket
    os.kill(mosq.proc.pid, signal.SIGKILL)
    mosq.proc.wait(10)
    mosq.start()
    sent |= publish_all(pub, 250, 20)
    wait_for(lambda: not counter.missing(sent), timeout=90,
             message="every acknowledged message after Mosquitto's crash")
    print(f"bridge across a Mosquitto crash: {len(sent)} sent, all received, "
          f"{counter.duplicates()} duplicates")


def test_unlogged_outbound_waits_in_a_bounded_queue(tmp_path: Path, made: list[Any],
                                                    mosq: MosquittoProc) -> None:
    """An unlogged outbound topic (log = false) has no log to read back from: while Mosquitto
    is away its messages wait in the bridge session's queue, bounded by
    mqtt.max_queued_messages; past it the oldest go (queue_full_policy drop_oldest), counted
    in meshmq_limit_hits_total{limit="max_queued_messages"} and logged naming the session."""
    cfg = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
           "reconnect_max": 1.0, "topics": [{"pattern": "live/#", "direction": "out"},
                                           {"pattern": "devices/#", "direction": "out"}]}
    b = BrokerProc(tmp_path / "meshmq", {
        "bridge": [cfg], "mqtt": {"max_queued_messages": 5},
        "commitlog": {"rules": [{"filter": "devices/{device}/#"},
                                {"filter": "live/#", "log": False}]}}, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=30,
             message="the bridge to connect")
    counter = RemoteCounter(mosq, "#")
    made.append(counter)
    mosq.stop()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 0, timeout=30,
             message="the bridge to see Mosquitto gone")
    pub = client(made, b.host, b.port)
    for i in range(20):
        assert pub.puback_code(pub.publish("live/x", str(i).encode(), qos=1)) == 0
    wait_for(lambda: b.metric("meshmq_limit_hits_total", limit="max_queued_messages") >= 1,
             timeout=20, message="the queue bound to be counted")
    assert "limit max_queued_messages hit" in b.log_text() and "$bridge/up" in b.log_text()
    mosq.start()
    newest = {str(i).encode() for i in range(15, 20)}
    wait_for(lambda: not counter.missing(newest), timeout=60,
             message="the 5 queued messages at Mosquitto")
    pub.publish("devices/d1/x", b"sentinel", qos=1)  # logged: sent after the queue
    wait_for(lambda: not counter.missing({b"sentinel"}), timeout=60, message="the sentinel")
    dropped = {str(i).encode() for i in range(15)}
    assert not dropped & set(counter.copies), "more than max_queued_messages were kept"


def test_inbound_published_while_meshmq_is_down_arrives(tmp_path: Path, made: list[Any],
                                                        mosq: MosquittoProc) -> None:
    """commands/# in: what is published on Mosquitto while meshmq is stopped waits in the
    bridge's persistent session there and arrives once meshmq is back."""
    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "commands/#", "direction": "in", "qos": 1}])
    sub = Client(host=b.host, port=b.port, protocol=V5, client_id="edge-app", clean=False)
    sub.connect(properties=_expiry())
    sub.subscribe("commands/#", qos=1)
    made.append(sub)
    rpub = client(made, mosq.host, mosq.port)
    assert rpub.puback_code(rpub.publish("commands/a", b"before", qos=1)) == 0
    assert sub.expect_message(timeout=20).payload == b"before"
    sub.stop()
    made.remove(sub)
    b.stop()
    sent = {f"cmd-{i}".encode() for i in range(30)}
    for payload in sorted(sent):
        assert rpub.puback_code(rpub.publish("commands/a", payload, qos=1)) == 0
    b.start()
    sub = Client(host=b.host, port=b.port, protocol=V5, client_id="edge-app", clean=False)
    sub.connect(properties=_expiry())
    made.append(sub)
    got: set[bytes] = set()

    def all_there() -> bool:
        got.update(m.payload for m in sub.drain())
        return sent <= got

    wait_for(all_there, timeout=60, message="every command published while meshmq was down")


def _expiry() -> Any:
    from helpers.clients import props
    from paho.mqtt.packettypes import PacketTypes

    return props(PacketTypes.CONNECT, SessionExpiryInterval=3600)


def test_secured_broker_bridge_needs_no_password_but_its_acl(tmp_path: Path, made: list[Any],
                                                             mosq: MosquittoProc) -> None:
    """On a broker with a password file and an ACL, the bridge's own session connects without
    a password (it is the node's) and is bound by the ACL like any client: its client section
    grants devices/# (carried out), not secret/# (refused at SUBSCRIBE, logged with the fix)."""
    from helpers.authfiles import auth_overrides

    acl = ("user alice\ntopic readwrite #\n\n"
           "client $bridge/up\ntopic read devices/#\n\n"
           "client $bridge/other\ntopic read devices/#\n")
    topics_ok = [{"pattern": "devices/#", "direction": "out"}]
    topics_denied = [{"pattern": "secret/#", "direction": "out"}]
    common = {"address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
              "reconnect_max": 1.0}
    overrides = {**auth_overrides(tmp_path / "auth", {"alice": "wonderland"}, acl),
                 "bridge": [{"name": "up", "topics": topics_ok, **common},
                            {"name": "other", "client_id": "other-bridge",
                             "topics": topics_denied, **common}]}
    b = BrokerProc(tmp_path / "meshmq", overrides, ws=False)
    made.append(b)
    b.start()
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=30,
             message="the bridge to connect to a password-protected broker")
    counter = RemoteCounter(mosq, "#")
    made.append(counter)
    pub = client(made, b.host, b.port, username="alice", password="wonderland")
    sent = publish_all(pub, 0, 5)
    wait_for(lambda: not counter.missing(sent), timeout=30, message="devices/# carried")
    wait_for(lambda: "local SUBSCRIBE refused for secret/# (0x87)" in b.log_text(),
             timeout=30, message="the refused subscription to be logged")
    assert "client '$bridge/other'" in b.log_text()
    assert b.metric("meshmq_bridge_up", bridge="other") == 0


def test_a_frozen_remote_is_detected_by_keepalive(tmp_path: Path, made: list[Any],
                                                  mosq: MosquittoProc) -> None:
    """Mosquitto frozen (SIGSTOP: the socket stays open, nothing answers): the bridge's
    keepalive (2 s here) notices the silence, reports the bridge down and keeps retrying."""
    import os
    import signal

    b = bridged_broker(tmp_path, made, mosq,
                       [{"pattern": "devices/#", "direction": "out"}], keepalive=2)
    os.kill(mosq.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 0, timeout=60,
                 message="the bridge to notice the frozen remote (keepalive)")
        assert "keepalive" in b.log_text()
    finally:
        os.kill(mosq.proc.pid, signal.SIGCONT)
    wait_for(lambda: b.metric("meshmq_bridge_up", bridge="up") == 1, timeout=60,
             message="the bridge back once the remote answers")
