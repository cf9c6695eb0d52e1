"""Wills obey the ACL and the commit log (issue 11, item 3).

A will is a PUBLISH the broker makes on a client's behalf when it drops: it is authorised at
CONNECT like a PUBLISH from that client (refused with CONNACK 0x87 / 3.1.1 return code 5, as
Mosquitto does), and a will on a logged topic is appended to its device log and delivered only
once stored, like any other publish.
"""

from __future__ import annotations

import pytest
from helpers import raw as R
from helpers.authfiles import auth_overrides
from helpers.clients import unique
from helpers.devicelog import fetch_all, log_position

pytestmark = pytest.mark.timeout(90)

USERS = {"alice": "wonderland", "bob": "builder"}
ACL = """\
user alice
topic readwrite devices/alicedev/#

user bob
topic readwrite devices/bobdev/#
"""


@pytest.fixture(scope="module")
def acl_broker(module_broker_factory, tmp_path_factory):
    return module_broker_factory(**auth_overrides(tmp_path_factory.mktemp("willacl"), USERS, ACL))


@pytest.fixture(scope="module")
def log_broker(module_broker_factory):
    return module_broker_factory()


@pytest.mark.parametrize("version, code", [(5, 0x87), (4, 5)])
def test_will_on_denied_topic_refused_at_connect(acl_broker, raw, version, code):
    """The issue's scenario: alice may not publish to devices/bobdev/x, so a will there is refused
    at CONNECT (v5 0x87, 3.1.1 return code 5) and never reaches Bob's subscriber."""
    bob = raw(acl_broker, version=5)
    bob.connect(unique("bob"), username="bob", password="builder")
    bob.subscribe("devices/bobdev/#", 1)
    alice = raw(acl_broker, version=version)
    alice.connect(unique("alice"), expect_rc=code, username="alice", password="wonderland",
                  will=R.Will("devices/bobdev/x", b"forged", qos=1))
    alice.wait_closed()
    bob.expect_none(1.0)


def test_will_on_allowed_topic_accepted_and_published(acl_broker, raw):
    """The ACL check is the PUBLISH rule, not a blanket refusal: alice's will on her own device
    is accepted and published when she drops."""
    watcher = raw(acl_broker, version=5)
    watcher.connect(unique("aw"), username="alice", password="wonderland")
    watcher.subscribe("devices/alicedev/#", 1)
    alice = raw(acl_broker, version=5)
    alice.connect(unique("alice"), username="alice", password="wonderland",
                  will=R.Will("devices/alicedev/status", b"offline", qos=1))
    alice.abort()
    got = watcher.expect(R.PUBLISH)
    assert (got.topic, got.payload) == ("devices/alicedev/status", b"offline")


def test_will_on_logged_topic_is_stored_then_delivered(log_broker, raw):
    """A will on devices/<id>/... is appended to that device's log: it is in the fetch API, and a
    subscriber that holds an offset receives it with its log position (so it came through the
    durable path, not around it)."""
    device = unique("wdev")
    sub = raw(log_broker, version=5)
    sub.connect(unique("ws"))
    sub.subscribe(f"devices/{device}/#", 1,
                  properties={R.USER_PROPERTY: [("offset", "earliest")]})
    c = raw(log_broker, version=5)
    c.connect(unique("wc"), will=R.Will(f"devices/{device}/status", b"gone", qos=1))
    c.abort()
    got = sub.expect(R.PUBLISH)
    assert (got.topic, got.payload) == (f"devices/{device}/status", b"gone")
    assert log_position(got) == (device, 0), got
    records = fetch_all(log_broker, device)
    assert [(r.topic, bytes(r.payload)) for r in records] == [(f"devices/{device}/status",
                                                               b"gone")]
