"""Authentication (password file, anonymous) and ACL (Mosquitto acl_file format)."""

import subprocess
import sys

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)

ACL = """\
# "pattern" lines apply to every client, wherever they stand (Mosquitto semantics; "topic"
# lines before the first "user" line would apply to anonymous clients only).
pattern read acl/everyone/#

user alice
topic readwrite acl/alice/#
topic deny acl/alice/secret
topic read acl/public/#
pattern readwrite acl/users/%u/#
pattern readwrite acl/clients/%c/#

user bob
topic write acl/public/#
topic read acl/bob/#
pattern readwrite acl/users/%u/#

client sensor-1
topic write acl/sensors/1/#
"""

USERS = {"alice": "wonderland", "bob": "builder"}


def _passwd(path, user, password):
    res = subprocess.run([sys.executable, "-m", "meshmq", "passwd", str(path), user],
                         input=password + "\n", capture_output=True, text=True, timeout=30,
                         cwd=str(REPO_ROOT))
    assert res.returncode == 0, (
        f"`python -m meshmq passwd {path} {user}` failed ({res.returncode}): {res.stderr}"
    )


@pytest.fixture(scope="module")
def auth_broker(module_broker_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    pw = d / "passwd"
    for user, password in USERS.items():
        _passwd(pw, user, password)
    assert "wonderland" not in pw.read_text(), "password file stores a plain-text password"
    acl = d / "acl"
    acl.write_text(ACL)
    return module_broker_factory(auth={"allow_anonymous": False, "password_file": str(pw),
                                       "acl_file": str(acl)})


def _login(b, clients, user, protocol=V5, client_id=None):
    return clients.connected(b, client_id, protocol=protocol, username=user,
                             password=USERS[user])


# --------------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------------


def test_anonymous_refused_v311_rc5(auth_broker, raw):
    """3.2.2.3 (3.1.1) / [MQTT-3.1.4-2]: with allow_anonymous off, a CONNECT without user name
    gets return code 5 (Not authorized) and the connection is closed."""
    c = raw(auth_broker, version=4)
    ack = c.connect(unique("anon"), expect_rc=None)
    assert ack.raw == b"\x20\x02\x00\x05"
    c.wait_closed()


def test_anonymous_refused_v5_0x87(auth_broker, raw):
    """[MQTT-3.2.2-7] (5.0): anonymous is refused with CONNACK 0x87 (Not authorized), Session
    Present 0 [MQTT-3.2.2-6], and the connection is closed."""
    c = raw(auth_broker, version=5)
    ack = c.connect(unique("anon5"), expect_rc=None)
    assert ack.reason_code == 0x87 and not ack.session_present
    c.wait_closed()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "x"),
                                                ("alice", "")])
def test_bad_credentials_v311_rc4(auth_broker, raw, user, password):
    """3.2.2.3 (3.1.1): wrong password or unknown user -> return code 4 (Bad user name or
    password), then close."""
    c = raw(auth_broker, version=4)
    ack = c.connect(unique("bad"), username=user, password=password, expect_rc=None)
    assert ack.raw == b"\x20\x02\x00\x04"
    c.wait_closed()


def test_bad_credentials_v5_0x86(auth_broker, raw):
    """3.2.2.2 (5.0): wrong password -> CONNACK 0x86 (Bad User Name or Password), then close."""
    c = raw(auth_broker, version=5)
    ack = c.connect(unique("bad5"), username="alice", password="nope", expect_rc=None)
    assert ack.reason_code == 0x86
    c.wait_closed()


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_good_credentials_accepted(auth_broker, clients, protocol):
    """The right password from the password file is accepted (CONNACK success)."""
    c = _login(auth_broker, clients, "alice", protocol)
    assert c.is_connected()


def test_auth_failures_counted_and_logged(auth_broker, raw):
    """A refused login is visible to operators: meshmq_auth_failures_total counts it and the
    log has a line saying why, naming the peer address (not just any new log text). (The line
    says client_id=null: the id is not bound before authentication succeeds.)"""
    before = auth_broker.metric("meshmq_auth_failures_total")
    offset = auth_broker.log_size()
    cid = unique("logbad")
    c = raw(auth_broker, version=4)
    host, port = c.sock.getsockname()[:2]
    peer = f"{host}:{port}"
    ack = c.connect(cid, username="alice", password="bad", expect_rc=None)
    assert ack.reason_code == 4, ack
    c.wait_closed()
    wait_for(lambda: auth_broker.metric("meshmq_auth_failures_total") == before + 1,
             timeout=10, message="meshmq_auth_failures_total to grow by exactly 1")

    def refusal_line() -> str | None:
        for line in auth_broker.log_since(offset).splitlines():
            if "bad user name or password" in line and f"peer={peer}" in line:
                return line
        return None

    line = wait_for(refusal_line, timeout=10,
                    message=f"a log line 'bad user name or password' naming peer {peer}")
    assert "wonderland" not in line and "password=bad" not in line, line


# --------------------------------------------------------------------------------------------
# ACL
# --------------------------------------------------------------------------------------------


def test_acl_subscribe_denied_v5_0x87(auth_broker, clients):
    """3.9.3 (5.0): a subscription the ACL does not allow gets SUBACK 0x87 (Not authorized);
    allowed ones in the same SUBSCRIBE are granted."""
    alice = _login(auth_broker, clients, "alice")
    codes = alice.subscribe([("acl/alice/x", 1), ("acl/bob/x", 1), ("acl/everyone/x", 1)])
    assert codes == [1, 0x87, 1]


def test_acl_subscribe_denied_v311_0x80(auth_broker, raw):
    """3.9.3 (3.1.1): a refused subscription gets SUBACK return code 0x80 (Failure)."""
    c = raw(auth_broker, version=4)
    c.connect(unique("a4"), username="alice", password=USERS["alice"])
    ack = c.subscribe([("acl/bob/x", 1), ("acl/alice/y", 2)], packet_id=3)
    assert ack.reason_codes == [0x80, 2]


def test_acl_publish_denied_v5_puback_0x87(auth_broker, clients):
    """3.4.2.1 (5.0): a QoS 1 PUBLISH the ACL does not allow gets PUBACK 0x87 (Not authorized)
    and is not delivered; the not_authorized drop is counted."""
    bob = _login(auth_broker, clients, "bob")
    bob.subscribe("acl/bob/#", 1)
    before = auth_broker.metric("meshmq_messages_dropped_total", reason="not_authorized")
    alice = _login(auth_broker, clients, "alice")
    info = alice.publish("acl/bob/inbox", b"forbidden", 1)
    assert alice.puback_code(info) == 0x87
    bob.expect_no_message(1.0)
    assert alice.is_connected()
    wait_for(lambda: auth_broker.metric("meshmq_messages_dropped_total",
                                        reason="not_authorized") > before,
             timeout=5, message='dropped_total{reason="not_authorized"} to increase')


def test_acl_publish_denied_v311_silently_dropped(auth_broker, clients):
    """[MQTT-3.3.5-2] (3.1.1): a PUBLISH the server does not authorize is acknowledged (or the
    connection closed) but not delivered to any subscriber."""
    bob = _login(auth_broker, clients, "bob", V311)
    bob.subscribe("acl/bob/#", 1)
    alice = _login(auth_broker, clients, "alice", V311)
    alice.publish("acl/bob/inbox", b"forbidden", 1)
    bob.expect_no_message(1.0)
    # Positive control: bob writes acl/public, alice reads it.
    alice.subscribe("acl/public/#", 1)
    bob.publish("acl/public/news", b"hello", 1)
    assert alice.expect_message().payload == b"hello"


def test_acl_deny_line_overrides(auth_broker, clients):
    """Mosquitto ACL "topic deny": acl/alice/secret is denied to alice even though
    acl/alice/# is readwrite."""
    alice = _login(auth_broker, clients, "alice")
    info = alice.publish("acl/alice/secret", b"s", 1)
    assert alice.puback_code(info) == 0x87
    assert alice.subscribe("acl/alice/secret", 1) == [0x87]
    info_ok = alice.publish("acl/alice/open", b"o", 1)
    assert alice.puback_code(info_ok) == 0


def test_acl_patterns_username_and_clientid(auth_broker, clients):
    """Mosquitto ACL "pattern" with %u (user name) and %c (client id)."""
    alice = _login(auth_broker, clients, "alice", client_id="alice-dev")
    own = alice.publish("acl/users/alice/x", b"1", 1)
    other = alice.publish("acl/users/bob/x", b"2", 1)
    cid_ok = alice.publish("acl/clients/alice-dev/x", b"3", 1)
    cid_bad = alice.publish("acl/clients/someone-else/x", b"4", 1)
    assert [alice.puback_code(i) for i in (own, other, cid_ok, cid_bad)] == [0, 0x87, 0, 0x87]


def test_acl_client_section(auth_broker, clients):
    """meshmq ACL "client CLIENTID" section: rules that apply to one client id (bob as
    sensor-1 may write acl/sensors/1/#, bob under another client id may not)."""
    sensor = _login(auth_broker, clients, "bob", client_id="sensor-1")
    other = _login(auth_broker, clients, "bob", client_id="not-the-sensor")
    ok = sensor.publish("acl/sensors/1/temp", b"21", 1)
    denied = other.publish("acl/sensors/1/temp", b"99", 1)
    assert (sensor.puback_code(ok), other.puback_code(denied)) == (0, 0x87)


def test_acl_read_only_topic_refuses_publish(auth_broker, clients):
    """A "topic read" rule grants reading only: acl/everyone/# may be subscribed by all users,
    but a publish there is refused (v5 PUBACK 0x87) and reaches no subscriber."""
    bob = _login(auth_broker, clients, "bob")
    assert bob.subscribe("acl/everyone/#", 1) == [1]
    alice = _login(auth_broker, clients, "alice")
    assert alice.subscribe("acl/everyone/#", 1) == [1]
    info = alice.publish("acl/everyone/x", b"x", 1)
    assert alice.puback_code(info) == 0x87
    bob.expect_no_message(0.7)
    alice.expect_no_message(0.1)
