"""What an operator reads in the log about clients (issue 13): connects and disconnects at INFO
with who, from where and how (Mosquitto logs both), refused CONNECTs with what was tried (never
the password), the protocol level under its own key in JSON logs, and a flood of idle sockets as
a few lines and a count."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def jbroker(module_broker_factory, tmp_path_factory):
    pw = tmp_path_factory.mktemp("pw") / "passwd"
    subprocess.run([sys.executable, "-m", "meshmq", "passwd", str(pw), "alice"], input="s3cret\n",
                   text=True, check=True, capture_output=True)
    return module_broker_factory(log={"format": "json", "level": "info"},
                                 auth={"password_file": str(pw), "allow_anonymous": True},
                                 mqtt={"connect_timeout": 0.5})


def _json_lines(b) -> list[dict]:
    out = []
    for line in b.log_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_connect_and_disconnect_are_logged_at_info(jbroker):
    cid = unique("logc")
    c = R.RawClient(jbroker.host, jbroker.port, version=5)
    c.connect(cid, keepalive=42, username="alice", password="s3cret")
    c.send(R.publish("x/y", b"12345", qos=0, version=5))
    c.send(R.disconnect(0))
    c.close()
    wait_for(lambda: any(d.get("msg", "").startswith("client disconnected")
                         and d.get("client_id") == cid for d in _json_lines(jbroker)), timeout=10,
             message="the disconnect line")
    lines = {d["msg"].split(":")[0]: d for d in _json_lines(jbroker) if d.get("client_id") == cid}
    conn = lines["client connected"]
    assert conn["level"] == "info"
    assert (conn["protocol_level"], conn["keepalive"], conn["username"],
            conn["clean_start"]) == (5, 42, "alice", True), conn
    assert conn["peer"].startswith("127.0.0.1:")
    gone = lines["client disconnected"]
    assert gone["level"] == "info" and "DISCONNECT" in gone["msg"], gone
    assert gone["bytes_in"] > 5 and gone["bytes_out"] >= 4 and gone["duration_s"] >= 0, gone


def test_refused_connect_names_client_and_user_never_the_password(jbroker):
    cid = unique("logbad")
    c = R.RawClient(jbroker.host, jbroker.port, version=4)
    c.connect(cid, username="alice", password="wrong-pass-xyz", expect_rc=None)
    c.close()
    wait_for(lambda: any(d.get("msg", "").startswith("connection refused")
                         and d.get("client_id") == cid for d in _json_lines(jbroker)), timeout=10,
             message="the refusal line")
    line = next(d for d in _json_lines(jbroker) if d.get("client_id") == cid
                and d["msg"].startswith("connection refused"))
    assert line["username"] == "alice"
    assert "wrong-pass-xyz" not in jbroker.log_text()


def test_idle_socket_flood_is_a_few_lines_and_a_count(jbroker):
    """40 sockets that never send CONNECT (connect_timeout 0.5 s): at most 10 lines one by one,
    then one line with how many more (within the 5 s window)."""
    before = len(_json_lines(jbroker))
    socks = [socket.create_connection((jbroker.host, jbroker.port)) for _ in range(40)]
    try:
        def summary():
            return [d for d in _json_lines(jbroker)[before:]
                    if "connections closed for sending no CONNECT" in d["msg"]]
        wait_for(lambda: summary(), timeout=20, message="the summary line")
        single = [d for d in _json_lines(jbroker)[before:]
                  if d["msg"].startswith("closing connection: no CONNECT")]
        assert len(single) <= 10, len(single)
        total = len(single) + sum(d["suppressed"] for d in summary())
        assert 30 <= total <= 40, total  # each counted once; a few may fall in the next window
    finally:
        for s in socks:
            s.close()


def test_mosquitto_hash_warning_is_logged_once_in_the_log_format(tmp_path):
    """A password file with a Mosquitto $7$ line warns once, as a JSON line under
    --log-format json (config validation read the file first and warned before logging was set
    up: a second, plain-text line)."""
    import base64
    import hashlib

    from helpers.broker import BrokerProc

    salt = b"0123456789abcdef"
    digest = hashlib.pbkdf2_hmac("sha512", b"pw", salt, 101, 64)
    pw = tmp_path / "passwd"
    pw.write_text(f"bob:$7$101${base64.b64encode(salt).decode()}$"
                  f"{base64.b64encode(digest).decode()}\n")
    b = BrokerProc(tmp_path / "m7", {"auth": {"password_file": str(pw)},
                                     "log": {"format": "json"}})
    b.start()
    try:
        lines = [ln for ln in b.log_text().splitlines() if "$7$" in ln]
        assert len(lines) == 1, lines
        assert json.loads(lines[0])["level"] == "warning"
    finally:
        b.stop()
