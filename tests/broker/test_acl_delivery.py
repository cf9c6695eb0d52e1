"""ACL on delivery: a wildcard subscription never carries a topic whose read is denied.

A SUBSCRIBE to ``acl/room/#`` is allowed while ``acl/room/secret`` is denied, so the read check
must run per message at delivery (Mosquitto's ``mosquitto_acl_check(..., MOSQ_ACL_READ)`` runs
in its delivery path for the same reason). Every way a message reaches a subscriber goes through
that check, and each has its own test here: live routing, retained messages on subscribe, replay
from the commit log (offset subscription), a shared subscription, and a will.

Each test uses a sentinel: the denied message is published first and an allowed one after it
on the same connection, so when the allowed one arrives the denied one would have arrived
before it (per-publisher order); no "wait and see nothing" timing is needed.

Planted bug this guards: ``Router._deliver`` skipping ``acl.can_deliver`` (all five fail).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import raw as R
from helpers.broker import REPO_ROOT
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)

ACL = """\
user reader
topic read acl/#
topic deny acl/+/secret
topic read devices/dev1/#
topic deny devices/dev1/secret

user writer
topic readwrite #
"""
USERS = {"reader": "r-pass", "writer": "w-pass"}


@pytest.fixture(scope="module")
def acl_broker(module_broker_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("acl-delivery")
    pw = d / "passwd"
    for user, password in USERS.items():
        res = subprocess.run([sys.executable, "-m", "meshmq", "passwd", str(pw), user],
                             input=password + "\n", capture_output=True, text=True, timeout=30,
                             cwd=str(REPO_ROOT))
        assert res.returncode == 0, res.stderr
    acl = d / "acl"
    acl.write_text(ACL)
    return module_broker_factory(auth={"allow_anonymous": False, "password_file": str(pw),
                                       "acl_file": str(acl)})


def _login(broker, raw, user: str, *, will: R.Will | None = None,
           client_id: str | None = None) -> R.RawClient:
    c = raw(broker, version=5)
    c.connect(client_id or unique(user), username=user, password=USERS[user], will=will)
    return c


def _until(c: R.RawClient, sentinel: bytes, timeout: float = 15.0) -> list[tuple[str, bytes]]:
    """Every PUBLISH (acknowledged) up to and including the one carrying ``sentinel``."""
    got: list[tuple[str, bytes]] = []
    while True:
        pkt = c.expect(R.PUBLISH, timeout)
        c.ack(pkt)
        got.append((pkt.topic, pkt.payload))
        if pkt.payload == sentinel:
            return got


def _no_secret(got: list[tuple[str, bytes]]) -> None:
    leaked = [t for t, _ in got if t.endswith("/secret")]
    assert not leaked, f"denied topics delivered: {leaked} (all: {got})"


def _publish(writer: R.RawClient, topic: str, payload: bytes, **kw) -> None:
    ack = writer.publish(topic, payload, qos=1, packet_id=7, **kw)
    assert ack is not None and (ack.reason_code or 0) == 0, f"publish {topic}: {ack!r}"


def test_live_wildcard_never_carries_a_denied_topic(acl_broker, raw):
    reader = _login(acl_broker, raw, "reader")
    assert reader.subscribe("acl/room/#", 1).reason_codes == [1]
    writer = _login(acl_broker, raw, "writer")
    _publish(writer, "acl/room/secret", b"s")
    _publish(writer, "acl/room/open", b"sentinel-live")
    got = _until(reader, b"sentinel-live")
    _no_secret(got)
    assert got == [("acl/room/open", b"sentinel-live")]


def test_retained_denied_topic_not_sent_on_subscribe(acl_broker, raw):
    writer = _login(acl_broker, raw, "writer")
    _publish(writer, "acl/ret/secret", b"s", retain=True)
    _publish(writer, "acl/ret/open", b"r-open", retain=True)
    reader = _login(acl_broker, raw, "reader")
    # Retained messages are sent right after the SUBACK, before any later live publish.
    assert reader.subscribe("acl/ret/#", 1).reason_codes == [1]
    _publish(writer, "acl/ret/live", b"sentinel-ret")
    got = _until(reader, b"sentinel-ret")
    _no_secret(got)
    assert ("acl/ret/open", b"r-open") in got, f"the allowed retained message is missing: {got}"


def test_replay_from_the_log_skips_a_denied_topic(acl_broker, raw):
    writer = _login(acl_broker, raw, "writer")
    _publish(writer, "devices/dev1/open", b"h1")
    _publish(writer, "devices/dev1/secret", b"s")
    _publish(writer, "devices/dev1/open", b"h2")
    reader = _login(acl_broker, raw, "reader")
    ack = reader.subscribe("devices/dev1/#", 1,
                           properties={R.USER_PROPERTY: [("offset", "earliest")]})
    assert ack.reason_codes == [1], f"offset subscription refused: {ack!r}"
    got = _until(reader, b"h2")  # history comes from the log (replay), not live routing
    _no_secret(got)
    assert [p for _, p in got] == [b"h1", b"h2"], got


def test_shared_subscription_member_never_gets_a_denied_topic(acl_broker, raw):
    reader = _login(acl_broker, raw, "reader")
    assert reader.subscribe("$share/g1/acl/shr/#", 1).reason_codes == [1]
    writer = _login(acl_broker, raw, "writer")
    _publish(writer, "acl/shr/secret", b"s")
    _publish(writer, "acl/shr/open", b"sentinel-shr")
    got = _until(reader, b"sentinel-shr")
    _no_secret(got)
    assert got == [("acl/shr/open", b"sentinel-shr")]


def test_will_on_a_denied_topic_not_delivered(acl_broker, raw):
    reader = _login(acl_broker, raw, "reader")
    assert reader.subscribe("acl/will/#", 1).reason_codes == [1]
    secret = _login(acl_broker, raw, "writer", will=R.Will("acl/will/secret", b"s", qos=1))
    secret.abort()  # no DISCONNECT: the will is published
    opened = _login(acl_broker, raw, "writer",
                    will=R.Will("acl/will/open", b"sentinel-will", qos=1))
    opened.abort()
    got = _until(reader, b"sentinel-will")
    _no_secret(got)
    assert got == [("acl/will/open", b"sentinel-will")]
