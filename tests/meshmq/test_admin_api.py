"""The admin API for clients, sessions, subscriptions and retained messages (issue 27), on one
real node with a password file and an ACL: what an EMQX operator does with its REST API.

Real ``meshmq serve``, real paho clients, HTTP Basic with MQTT users (the fetch API's
authentication); the ACL guards the routes with ``$CONTROL/meshmq/clients`` and retained topics
with the reader's own read/write rules.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from helpers.authfiles import auth_overrides
from helpers.broker import BrokerProc, wait_for
from helpers.clients import V5, V311, ClientFactory, props, unique
from paho.mqtt.packettypes import PacketTypes

pytestmark = pytest.mark.timeout(180)

USERS = {"ops": "ops-password", "viewer": "viewer-password", "dev": "dev-password"}
ACL = """\
user ops
topic readwrite $CONTROL/meshmq/#
topic readwrite #

user viewer
topic read $CONTROL/meshmq/#
topic read ret/public/#

user dev
topic readwrite #
"""


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()


OPS = basic("ops")


def call(broker: BrokerProc, method: str, path: str, auth: str | None = OPS,
         ) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}", method=method)
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, body


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("adminapi")
    broker = BrokerProc(base / "b", auth_overrides(base / "auth", USERS, ACL), ws=False)
    broker.admin_authorization = OPS
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _client(clients: ClientFactory, node: BrokerProc, cid: str, protocol: int = V5,
            clean: bool = True, **kw: Any) -> Any:
    c = clients(node, cid, protocol=protocol, clean=clean, username="dev",
                password=USERS["dev"])
    return c.connect(**kw)


def test_clients_list_show_filters_and_paging(node: BrokerProc, clients: ClientFactory) -> None:
    tag = unique("cl")
    a = _client(clients, node, f"{tag}-a", keepalive=17)
    _client(clients, node, f"{tag}-b", protocol=V311)
    _client(clients, node, f"{tag}-c")
    a.subscribe("x/1", 1)
    a.subscribe("x/2", 0)
    status, page = call(node, "GET", f"/api/v1/clients?prefix={tag}")
    assert status == 200, page
    rows = page["clients"]
    assert [r["client_id"] for r in rows] == [f"{tag}-a", f"{tag}-b", f"{tag}-c"]
    first = rows[0]
    assert first["username"] == "dev" and first["keepalive"] == 17
    assert first["protocol"] == "mqttv5" and first["subscriptions"] == 2
    assert first["address"].startswith("127.0.0.1:") and first["connected_at"] > 0
    assert rows[1]["protocol"] == "mqttv311"
    assert {"inflight", "queued", "router"} <= set(first)
    # filters
    status, page = call(node, "GET", f"/api/v1/clients?prefix={tag}&protocol=mqttv311")
    assert [r["client_id"] for r in page["clients"]] == [f"{tag}-b"]
    status, page = call(node, "GET", f"/api/v1/clients?prefix={tag}&username=nobody")
    assert page["clients"] == []
    # paging: two pages, nothing skipped or repeated
    status, p1 = call(node, "GET", f"/api/v1/clients?prefix={tag}&limit=2")
    assert [r["client_id"] for r in p1["clients"]] == [f"{tag}-a", f"{tag}-b"]
    after = urllib.parse.quote(p1["next_after"])
    status, p2 = call(node, "GET", f"/api/v1/clients?prefix={tag}&limit=2&after={after}")
    assert [r["client_id"] for r in p2["clients"]] == [f"{tag}-c"] and "next_after" not in p2
    # one client, with its subscriptions
    status, one = call(node, "GET", f"/api/v1/clients/{tag}-a")
    assert status == 200 and [s["filter"] for s in one["subscription_list"]] == ["x/1", "x/2"]
    status, missing = call(node, "GET", f"/api/v1/clients/{tag}-none")
    assert status == 404, missing
    status, bad = call(node, "GET", "/api/v1/clients?limit=0")
    assert status == 400 and bad["parameter"] == "limit"
    status, bad = call(node, "GET", "/api/v1/clients?colour=red")
    assert status == 400 and bad["parameter"] == "colour"


def test_kick_sends_0x98_and_keeps_the_session_unless_clean(node: BrokerProc,
                                                           clients: ClientFactory) -> None:
    tag = unique("kick")
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    c = _client(clients, node, f"{tag}-p", properties=expiry)
    c.subscribe("x/kick", 1)
    offset = node.log_size()
    status, body = call(node, "DELETE", f"/api/v1/clients/{tag}-p")
    assert status == 200 and body["kicked"] and not body["session_ended"], body
    rc = c.wait_disconnected()
    assert int(getattr(rc, "value", rc)) == 0x98, rc
    # who did it, at INFO
    wait_for(lambda: "admin: kicking client" in node.log_since(offset), 10)
    line = next(ln for ln in node.log_since(offset).splitlines() if "admin: kicking" in ln)
    assert "admin_user=ops" in line, line
    # the session stays, offline, with its subscription and expiry
    status, sess = call(node, "GET", f"/api/v1/sessions/{tag}-p")
    assert status == 200 and sess["connected"] is False, sess
    assert sess["expiry_interval"] == 300 and 0 < sess["expires_in"] <= 300
    assert [s["filter"] for s in sess["subscription_list"]] == ["x/kick"]
    status, _ = call(node, "GET", f"/api/v1/clients/{tag}-p")
    assert status == 404
    # offline sessions are listed, with their queue
    pub = _client(clients, node, f"{tag}-pub")
    for i in range(3):
        pub.publish("x/kick", f"m{i}", qos=1)
    status, page = call(node, "GET", f"/api/v1/sessions?prefix={tag}&connected=false")
    assert [r["client_id"] for r in page["sessions"]] == [f"{tag}-p"]
    wait_for(lambda: call(node, "GET", f"/api/v1/sessions/{tag}-p")[1]["queued"] +
             call(node, "GET", f"/api/v1/sessions/{tag}-p")[1]["lagging_devices"] >= 1, 10,
             message="the offline session's queue")
    # kick with clean=true: the session ends with the connection
    c2 = _client(clients, node, f"{tag}-p", clean=False, properties=expiry)
    assert c2.session_present
    status, body = call(node, "DELETE", f"/api/v1/clients/{tag}-p?clean=true")
    assert status == 200 and body["session_ended"], body
    c2.wait_disconnected()
    wait_for(lambda: call(node, "GET", f"/api/v1/sessions/{tag}-p")[0] == 404, 10,
             message="the session to end")
    c3 = _client(clients, node, f"{tag}-p", clean=False, properties=expiry)
    assert not c3.session_present


def test_delete_offline_session_and_subscriptions(node: BrokerProc,
                                                  clients: ClientFactory) -> None:
    tag = unique("sess")
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=600)
    c = _client(clients, node, f"{tag}-s", properties=expiry)
    c.subscribe("x/sub/+", 1)
    d = _client(clients, node, f"{tag}-t")
    d.subscribe("x/sub/+", 0)
    d.subscribe("x/other", 0)
    status, subs = call(node, "GET", f"/api/v1/subscriptions?client_id={tag}-t")
    assert [s["filter"] for s in subs["subscriptions"]] == ["x/other", "x/sub/+"]
    status, subs = call(node, "GET", "/api/v1/subscriptions?filter=x/sub/%2B")
    mine = [s for s in subs["subscriptions"] if s["client_id"].startswith(tag)]
    assert [(s["client_id"], s["qos"]) for s in mine] == [(f"{tag}-s", 1), (f"{tag}-t", 0)]
    c.disconnect()
    wait_for(lambda: call(node, "GET", f"/api/v1/sessions/{tag}-s")[1].get("connected")
             is False, 10)
    status, body = call(node, "DELETE", f"/api/v1/sessions/{tag}-s")
    assert status == 200 and body["deleted"], body
    assert call(node, "GET", f"/api/v1/sessions/{tag}-s")[0] == 404
    back = _client(clients, node, f"{tag}-s", clean=False, properties=expiry)
    assert not back.session_present
    assert call(node, "DELETE", f"/api/v1/sessions/{tag}-none")[0] == 404


def test_retained_list_get_delete_under_the_acl(node: BrokerProc,
                                               clients: ClientFactory) -> None:
    tag = unique("r")
    pub = _client(clients, node, f"{tag}-pub")
    pub.publish(f"ret/public/{tag}/a", "hello", qos=1, retain=True)
    pub.publish(f"ret/public/{tag}/b", b"\x00\xff", qos=1, retain=True)
    pub.publish(f"ret/private/{tag}", "secret", qos=1, retain=True)
    status, page = call(node, "GET", f"/api/v1/retained?match=ret/%2B/{tag}/%23")
    assert [r["topic"] for r in page["retained"]] == [  # '#' matches the parent level too
        f"ret/private/{tag}", f"ret/public/{tag}/a", f"ret/public/{tag}/b"]
    status, one = call(node, "GET", f"/api/v1/retained/ret/public/{tag}/a")
    assert status == 200 and one["payload"] == "hello" and one["payload_encoding"] == "utf-8"
    status, one = call(node, "GET", f"/api/v1/retained/ret/public/{tag}/b")
    assert base64.b64decode(one["payload"]) == b"\x00\xff"
    # the viewer reads only what its read ACL allows, and deletes nothing
    viewer = basic("viewer")
    status, page = call(node, "GET", "/api/v1/retained?match=ret/%23", auth=viewer)
    topics = [r["topic"] for r in page["retained"]]
    assert f"ret/public/{tag}/a" in topics and f"ret/private/{tag}" not in topics
    assert call(node, "GET", f"/api/v1/retained/ret/private/{tag}", auth=viewer)[0] == 403
    assert call(node, "DELETE", f"/api/v1/retained/ret/public/{tag}/a", auth=viewer)[0] == 403
    # delete: gone for a new subscriber
    status, body = call(node, "DELETE", f"/api/v1/retained/ret/public/{tag}/a")
    assert status == 200, body
    assert call(node, "GET", f"/api/v1/retained/ret/public/{tag}/a")[0] == 404
    sub = _client(clients, node, f"{tag}-sub")
    sub.subscribe(f"ret/public/{tag}/#", 1)
    msg = sub.expect_message()
    assert msg.topic == f"ret/public/{tag}/b"
    sub.expect_no_message(0.5)


def test_retained_delete_survives_a_restart(tmp_path: Any, clients: ClientFactory) -> None:
    broker = BrokerProc(tmp_path / "b", ws=False).start()
    try:
        c = clients(broker, unique("rp")).connect()
        c.publish("keep/a", "1", qos=1, retain=True)
        c.publish("keep/b", "2", qos=1, retain=True)
        c.stop()
        status, body = call(broker, "DELETE", "/api/v1/retained/keep/a", auth=None)
        assert status == 200, body
        broker.kill()  # kill -9: what was answered must be stored
        broker.start()
        status, page = call(broker, "GET", "/api/v1/retained?match=keep/%23", auth=None)
        assert [r["topic"] for r in page["retained"]] == ["keep/b"], page
    finally:
        broker.stop()


def test_acl_guards_the_client_routes(node: BrokerProc, clients: ClientFactory) -> None:
    tag = unique("acl")
    _client(clients, node, f"{tag}-x")
    viewer = basic("viewer")
    status, page = call(node, "GET", f"/api/v1/clients?prefix={tag}", auth=viewer)
    assert status == 200 and len(page["clients"]) == 1
    status, body = call(node, "DELETE", f"/api/v1/clients/{tag}-x", auth=viewer)
    assert status == 403 and "$CONTROL/meshmq/clients" in body["error"], body
    dev = basic("dev")  # readwrite '#' does not cover a $ topic: no admin rights
    assert call(node, "GET", "/api/v1/clients", auth=dev)[0] == 403
    assert call(node, "GET", "/api/v1/clients", auth=None)[0] == 401
    assert call(node, "GET", f"/api/v1/clients/{tag}-x")[0] == 200
