"""Client ids are bound to users (issue 11, item 4).

With a password file, a session is taken over or resumed only by the user that owns it (alice
connecting as ``bobdev`` used to kick Bob off with 0x8E and replay his history), and
``auth.clientid_rule`` can bind the id itself to the username: ``username`` (id = username) or
``pattern`` (``auth.clientid_pattern`` with ``%u``). Refusals: 0x85 / 3.1.1 return code 2 for the
rule, 0x87 / 5 for another user's session.
"""

from __future__ import annotations

import pytest
from helpers import raw as R
from helpers.authfiles import auth_overrides
from helpers.clients import unique

from broker.clientid import ClientIdPolicy
from meshmq.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(90)

USERS = {"alice": "wonderland", "bob": "builder"}


def login(c: R.RawClient, client_id: str, user: str, **kwargs) -> R.Packet:
    return c.connect(client_id, username=user, password=USERS[user], **kwargs)


@pytest.fixture(scope="module")
def any_rule(module_broker_factory, tmp_path_factory):
    return module_broker_factory(**auth_overrides(tmp_path_factory.mktemp("cid-any"), USERS))


@pytest.fixture(scope="module")
def username_rule(module_broker_factory, tmp_path_factory):
    return module_broker_factory(**auth_overrides(tmp_path_factory.mktemp("cid-user"), USERS,
                                                  clientid_rule="username"))


@pytest.fixture(scope="module")
def pattern_rule(module_broker_factory, tmp_path_factory):
    return module_broker_factory(**auth_overrides(tmp_path_factory.mktemp("cid-pat"), USERS,
                                                  clientid_rule="pattern",
                                                  clientid_pattern="%u-*"))


@pytest.mark.parametrize("version, code", [(5, 0x87), (4, 5)])
def test_other_user_cannot_take_over_a_live_session(any_rule, raw, version, code):
    """The issue's scenario: alice connecting with bob's client id is refused, and Bob stays
    connected (no 0x8E) and keeps working."""
    cid = unique("bobdev")
    bob = raw(any_rule, version=5)
    login(bob, cid, "bob")
    alice = raw(any_rule, version=version)
    login(alice, cid, "alice", expect_rc=code)
    alice.wait_closed()
    assert bob.is_open()
    assert bob.publish(f"t/{cid}", b"x", 1).reason_code in (0, None)


def test_other_user_cannot_resume_an_offline_session(any_rule, raw):
    """Nor can alice resume bob's offline persistent session (and receive what was queued for
    him); Bob then resumes it with session present."""
    cid = unique("bobdev")
    bob = raw(any_rule, version=4)
    login(bob, cid, "bob", clean=False)
    bob.subscribe(f"q/{cid}", 1)
    bob.disconnect()
    pub = raw(any_rule, version=5)
    login(pub, unique("pub"), "bob")
    pub.publish(f"q/{cid}", b"for-bob", 1)
    alice = raw(any_rule, version=4)
    login(alice, cid, "alice", clean=False, expect_rc=5)
    alice.wait_closed()
    bob = raw(any_rule, version=4)
    ack = login(bob, cid, "bob", clean=False)
    assert ack.session_present
    assert bob.expect(R.PUBLISH).payload == b"for-bob"


def test_same_user_takeover_still_works(any_rule, raw):
    """[MQTT-3.1.4-3] is kept for the owner: bob's second connection takes over (0x8E)."""
    cid = unique("bobdev")
    first = raw(any_rule, version=5)
    login(first, cid, "bob")
    second = raw(any_rule, version=5)
    login(second, cid, "bob")
    got = first.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x8E], got


@pytest.mark.parametrize("version, code", [(5, 0x85), (4, 2)])
def test_username_rule_refuses_other_ids(username_rule, raw, version, code):
    c = raw(username_rule, version=version)
    login(c, "bobdev", "alice", expect_rc=code)
    c.wait_closed()
    ok = raw(username_rule, version=version)
    login(ok, "alice", "alice")


def test_username_rule_assigns_the_username_to_an_empty_id(username_rule, raw):
    c = raw(username_rule, version=5)
    ack = login(c, "", "bob")
    assert ack.properties.get(R.ASSIGNED_CLIENT_IDENTIFIER) == "bob"


@pytest.mark.parametrize("client_id, code", [("alice-sensor1", 0), ("alice-", 0),
                                             ("bob-sensor1", 0x85), ("alice", 0x85),
                                             ("xalice-1", 0x85)])
def test_pattern_rule(pattern_rule, raw, client_id, code):
    """clientid_pattern "%u-*": alice may use alice-<anything>, nothing else."""
    c = raw(pattern_rule, version=5)
    login(c, client_id, "alice", expect_rc=code)


def test_pattern_username_is_literal():
    """A username is matched literally inside the pattern, never as a regular expression."""
    policy = ClientIdPolicy("pattern", "%u-*")
    assert policy.refusal("a.b-1", "a.b") is None
    assert policy.refusal("axb-1", "a.b") is not None


@pytest.mark.parametrize("text, key", [
    ('[auth]\nclientid_rule = "everyone"\n', "auth.clientid_rule"),
    ('[auth]\nclientid_rule = "pattern"\nclientid_pattern = "dev-*"\n', "auth.clientid_pattern"),
])
def test_bad_config_names_the_key(tmp_path, text, key):
    path = tmp_path / "meshmq.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert info.value.key == key, str(info.value)
