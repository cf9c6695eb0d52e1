"""``$SYS/broker/...`` (issue 13): Mosquitto's common status topics are published, retained, at
``mqtt.sys_interval``, and read access follows the ACL."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers.clients import V311, unique

pytestmark = pytest.mark.timeout(60)

ACL = """user ops
topic read $SYS/#

user dev
topic read devices/#
"""
EXPECTED = ["version", "uptime", "clients/connected", "clients/total", "clients/maximum",
            "messages/received", "messages/sent", "bytes/received", "bytes/sent",
            "subscriptions/count", "retained messages/count",
            "load/messages/received/1min", "load/messages/received/5min",
            "load/messages/received/15min"]


@pytest.fixture(scope="module")
def sys_broker(module_broker_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("sys")
    pw = d / "passwd"
    for user in ("ops", "dev"):
        subprocess.run([sys.executable, "-m", "meshmq", "passwd", str(pw), user], input="pw\n",
                       text=True, check=True, capture_output=True)
    (d / "acl").write_text(ACL)
    return module_broker_factory(mqtt={"sys_interval": 1},
                                 auth={"allow_anonymous": False, "password_file": str(pw),
                                       "acl_file": str(d / "acl")})


def _collect(c, seconds: float) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            m = c.messages.get(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty
            continue
        got[m.topic] = m.payload
    return got


def test_sys_tree_is_published_and_retained(sys_broker, clients):
    ops = clients(sys_broker, protocol=V311, username="ops", password="pw")
    ops.connect()
    ops.subscribe("$SYS/#", 0)
    got = _collect(ops, 3.0)
    missing = [k for k in EXPECTED if f"$SYS/broker/{k}" not in got]
    assert not missing, (missing, sorted(got))
    assert got["$SYS/broker/version"].startswith(b"meshmq version ")
    assert int(got["$SYS/broker/clients/connected"]) >= 1
    assert got["$SYS/broker/uptime"].endswith(b" seconds")
    # retained: a late subscriber gets the tree at once
    late = clients(sys_broker, unique("late"), protocol=V311, username="ops", password="pw")
    late.connect()
    late.subscribe("$SYS/broker/version", 0)
    m = late.expect_message(timeout=5)
    assert m.retain and m.payload.startswith(b"meshmq version ")


def test_sys_tree_follows_the_read_acl(sys_broker, clients):
    dev = clients(sys_broker, protocol=V311, username="dev", password="pw")
    dev.connect()
    dev.subscribe("$SYS/#", 0)  # "#" alone never matches $ topics [MQTT-4.7.2-1]
    got = _collect(dev, 2.5)
    assert not [t for t in got if t.startswith("$SYS")], sorted(got)
