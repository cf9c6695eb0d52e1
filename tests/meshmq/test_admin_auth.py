"""The admin HTTP server under authentication (issue 11, item 7).

With a password file (or an admin token file) the fetch API needs credentials, HTTP Basic with an
MQTT user or a bearer token, and applies the MQTT read ACL per device log; ``/metrics``,
``/healthz`` and ``/readyz`` stay open. The admin server can speak HTTPS, and binding it beyond
loopback without authentication logs a warning.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from helpers import raw as R
from helpers.authfiles import auth_overrides
from helpers.broker import REPO_ROOT, free_port, wait_for
from helpers.certs import self_signed
from helpers.clients import unique

from meshmq.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)

USERS = {"alice": "wonderland", "bob": "builder"}
ACL = """\
user alice
topic readwrite devices/alicedev/#

user bob
topic readwrite devices/bobdev/#

user reader
topic read devices/#
"""
TOKEN = "reader-token-0123456789abcdef"


def get(broker, path: str, auth: str | None = None, scheme: str = "http",
        context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{broker.admin_port}{path}")
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=20, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def node(module_broker_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("adminauth")
    (d / "tokens").write_text(f"# name:token\nreader:{TOKEN}\n")
    overrides = auth_overrides(d, USERS, ACL)
    b = module_broker_factory(admin={"token_file": str(d / "tokens")}, **overrides)
    for user, device in (("alice", "alicedev"), ("bob", "bobdev")):
        c = R.RawClient(b.host, b.port, version=5)
        c.connect(unique(user), username=user, password=USERS[user])
        assert c.publish(f"devices/{device}/t", device.encode(), 1).reason_code in (0, None)
        c.close()
    return b


def test_probes_and_metrics_stay_open(node):
    for path in ("/metrics", "/healthz", "/readyz"):
        assert get(node, path)[0] == 200, path


@pytest.mark.parametrize("path", ["/api/v1/logs", "/api/v1/logs/alicedev",
                                  "/api/v1/logs/alicedev/records"])
def test_fetch_api_needs_credentials(node, path):
    status, headers, _ = get(node, path)
    assert status == 401
    assert "Basic" in headers.get("WWW-Authenticate", "")
    assert get(node, path, basic("alice", "wrong"))[0] == 401
    assert get(node, path, "Bearer not-a-token-at-all-xxxxxxxx")[0] == 401


def test_basic_auth_applies_the_read_acl(node):
    """alice sees and reads her device's log only; bob's is hidden from the list and 403."""
    auth = basic("alice", USERS["alice"])
    status, _, body = get(node, "/api/v1/logs", auth)
    assert status == 200
    assert [e["device"] for e in json.loads(body)["logs"]] == ["alicedev"]
    status, headers, _ = get(node, "/api/v1/logs/alicedev/records", auth)
    assert status == 200 and headers["X-Meshmq-Record-Count"] == "1"
    assert get(node, "/api/v1/logs/bobdev", auth)[0] == 403
    assert get(node, "/api/v1/logs/bobdev/records", auth)[0] == 403


def test_bearer_token_reads_what_its_name_may_read(node):
    auth = f"Bearer {TOKEN}"
    status, _, body = get(node, "/api/v1/logs", auth)
    assert status == 200
    assert [e["device"] for e in json.loads(body)["logs"]] == ["alicedev", "bobdev"]
    assert get(node, "/api/v1/logs/bobdev/records", auth)[0] == 200


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("admintls"))


def test_admin_over_tls(start_broker, cert):
    """admin.certfile/keyfile: the admin server speaks HTTPS (and not plain HTTP)."""
    b = start_broker(ws=False, wait=False, admin={"certfile": cert[0], "keyfile": cert[1]})
    ctx = ssl.create_default_context(cafile=cert[0])

    def ready() -> bool:
        try:
            return get(b, "/readyz", scheme="https", context=ctx)[0] == 200
        except OSError:
            assert b.alive, b.log_tail()
            return False

    wait_for(ready, timeout=30, message="the admin server ready over HTTPS")
    with pytest.raises(OSError):
        get(b, "/healthz")


def test_wide_bind_without_auth_warns(start_broker):
    """Binding the admin server beyond loopback with no authentication logs a warning (the
    node still starts: a management network may be the operator's protection)."""
    port = free_port()
    b = start_broker(ws=False, wait=False, admin={"bind": f"0.0.0.0:{port}"})
    b.admin_port = port
    b.wait_ready()
    assert "without authentication" in b.log_since(0)


def test_loopback_without_auth_does_not_warn(start_broker):
    b = start_broker(ws=False)
    assert "without authentication" not in b.log_since(0)


@pytest.mark.parametrize("text, key", [
    ("reader:short\n", "admin.token_file"),
    ("no-colon-here-0123456789\n", "admin.token_file"),
])
def test_bad_token_file_names_the_key(tmp_path, text, key):
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    cfg = tmp_path / "meshmq.toml"
    cfg.write_text(f'[admin]\ntoken_file = "{tokens}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg), {})
    assert info.value.key == key


def test_certfile_without_keyfile_names_the_key(tmp_path, cert):
    cfg = tmp_path / "meshmq.toml"
    cfg.write_text(f'[admin]\ncertfile = "{cert[0]}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg), {})
    assert info.value.key == "admin.keyfile"


def test_log_cli_uses_a_token_file(node, tmp_path):
    """`meshmq log list --token-file` reads an authenticated node; without it the CLI says 401."""
    token_file = tmp_path / "token"
    token_file.write_text(f"reader:{TOKEN}\n")
    base = [sys.executable, "-m", "meshmq", "log", "list", "--admin",
            f"127.0.0.1:{node.admin_port}", "--format", "json"]
    ok = subprocess.run(base + ["--token-file", str(token_file)], capture_output=True,
                        text=True, timeout=60, cwd=str(REPO_ROOT))
    assert ok.returncode == 0, ok.stderr
    assert [json.loads(line)["device"] for line in ok.stdout.splitlines()] == ["alicedev",
                                                                              "bobdev"]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=60,
                             cwd=str(REPO_ROOT))
    assert refused.returncode != 0 and "HTTP 401" in refused.stderr, refused


def _post_fetch(broker, devices: list[str], auth: str) -> int:
    body = json.dumps({"devices": [{"device": d, "offset": 0} for d in devices]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}/api/v1/fetch",
                                 data=body, method="POST",
                                 headers={"Authorization": auth,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_many_device_fetch_applies_the_read_acl(node):
    """POST /api/v1/fetch (many devices in one request) is held to the same read ACL as the
    per-device routes: a request naming a log its reader may not read is refused with 403."""
    alice = basic("alice", USERS["alice"])
    assert _post_fetch(node, ["alicedev"], alice) == 200
    assert _post_fetch(node, ["alicedev", "bobdev"], alice) == 403
    assert _post_fetch(node, ["alicedev", "bobdev"], f"Bearer {TOKEN}") == 200
    assert _post_fetch(node, ["alicedev"], basic("alice", "wrong")) == 401
