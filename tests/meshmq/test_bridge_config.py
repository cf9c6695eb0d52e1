"""``[[bridge]]`` validation (meshmq/bridgeconfig.py through meshmq/config.py): every mistake
stops the start with exit 2 and one line naming the key, like every other config error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshmq.config import ConfigError, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]

GOOD = '''
[[bridge]]
name = "cloud"
address = "mq.example.com:8883"
protocol = "mqttv311"
cafile = "{ca}"

[[bridge.topics]]
pattern = "devices/#"
direction = "out"
qos = 1
remote_prefix = "edge1/"

[[bridge.topics]]
pattern = "commands/#"
direction = "in"
'''

# (id, text after [[bridge]], key named, words in the message)
CASES = [
    ("no-name", 'address = "h:1"\n[[bridge.topics]]\npattern = "a/#"\n', "bridge[0].name",
     "required"),
    ("bad-name", 'name = "a b"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#"\n',
     "bridge[0].name", "A-Z"),
    ("bad-address", 'name = "x"\naddress = "nohost"\n[[bridge.topics]]\npattern = "a/#"\n',
     "bridge[0].address", "host:port"),
    ("bad-protocol", 'name = "x"\naddress = "h:1"\nprotocol = "mqttv31"\n'
     '[[bridge.topics]]\npattern = "a/#"\n', "bridge[0].protocol", "mqttv5"),
    ("no-topics", 'name = "x"\naddress = "h:1"\n', "bridge[0].topics", "at least one"),
    ("bad-direction", 'name = "x"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#"\n'
     'direction = "sideways"\n', "bridge[0].topics[0].direction", "out, in, both"),
    ("bad-qos", 'name = "x"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#"\nqos = 2\n',
     "bridge[0].topics[0].qos", "0 or 1"),
    ("bad-pattern", 'name = "x"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#/b"\n',
     "bridge[0].topics[0].pattern", "topic filter"),
    ("wildcard-prefix", 'name = "x"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#"\n'
     'local_prefix = "+/"\n', "bridge[0].topics[0].local_prefix", "must not contain"),
    ("unknown-key", 'name = "x"\naddress = "h:1"\nretries = 3\n[[bridge.topics]]\n'
     'pattern = "a/#"\n', "bridge[0].retries", "unknown key"),
    ("missing-cafile", 'name = "x"\naddress = "h:1"\ncafile = "/nonexistent/ca.crt"\n'
     '[[bridge.topics]]\npattern = "a/#"\n', "bridge[0].cafile", "cannot read"),
    ("cert-without-key", 'name = "x"\naddress = "h:1"\ncertfile = "{ca}"\n'
     '[[bridge.topics]]\npattern = "a/#"\n', "bridge[0].keyfile", "go together"),
    ("backoff", 'name = "x"\naddress = "h:1"\nreconnect_min = 5\nreconnect_max = 1\n'
     '[[bridge.topics]]\npattern = "a/#"\n', "bridge[0].reconnect_min", "must not exceed"),
]


def _write(tmp_path: Path, body: str) -> str:
    ca = tmp_path / "ca.crt"
    ca.write_text("not parsed at load time\n")
    path = tmp_path / "meshmq.toml"
    path.write_text(body.replace("{ca}", str(ca)))
    return str(path)


def test_a_good_bridge_section_loads(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD), {})
    (b,) = cfg.bridges
    assert (b.name, b.host, b.port, b.level, b.tls) == ("cloud", "mq.example.com", 8883, 4, True)
    assert b.client_id == "meshmq-1.cloud" and b.local_client_id == "$bridge/cloud"
    out, inbound = b.topics
    assert (out.direction, out.qos, out.local_filter, out.remote_filter) == \
        ("out", 1, "devices/#", "edge1/devices/#")
    assert (inbound.direction, inbound.qos) == ("in", 1)  # the defaults: qos 1


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    one = 'name = "x"\naddress = "h:1"\n[[bridge.topics]]\npattern = "a/#"\n'
    with pytest.raises(ConfigError, match=r"bridge\[1\]\.name: duplicate bridge name"):
        load_config(_write(tmp_path, f"[[bridge]]\n{one}\n[[bridge]]\n{one}"), {})


@pytest.mark.parametrize(("body", "key", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_bridge_config_names_the_key(tmp_path: Path, body: str, key: str,
                                         words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "[[bridge]]\n" + body), {})
    line = str(err.value)
    assert line.startswith(f"config error: {key}: "), line
    assert words in line, line


def test_meshmq_serve_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[bridge]]\nname = "x"\naddress = "h:1"\n[[bridge.topics]]\n'
                            'pattern = "a/#"\ndirection = "up"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env.update(MESHMQ_NODE__DATA_DIR=str(tmp_path / "data"),
               MESHMQ_LISTENER__TCP__BIND="127.0.0.1:0", MESHMQ_ADMIN__BIND="127.0.0.1:0",
               PYTHONPATH=str(REPO_ROOT))
    try:
        proc = subprocess.run([sys.executable, "-m", "meshmq", "serve", "-c", path],
                              capture_output=True, text=True, timeout=30, env=env,
                              cwd=str(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail("meshmq serve accepted a bad [[bridge]] direction")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "config error: bridge[0].topics[0].direction: "), proc.stderr


def test_the_documented_example_loads(tmp_path: Path) -> None:
    """config.example.toml's [[bridge]] block, uncommented (its files made real), loads as
    documented."""
    lines = (REPO_ROOT / "config.example.toml").read_text().splitlines()
    first = lines.index("# [[bridge]]")
    last = lines.index("[commitlog]")
    block = []
    for ln in lines[first:last]:
        text = ln[2:] if ln.startswith("# ") else ""
        if text.startswith(("[[", "name", "address", "protocol", "username", "password_file",
                            "cafile", "certfile", "keyfile", "tls", "insecure", "keepalive",
                            "reconnect_", "pattern", "direction", "qos", "local_prefix",
                            "remote_prefix")):
            block.append(text)
    body = "\n".join(block)
    for name in ("bridge-cloud.pass", "cloud-ca.crt", "edge1.crt", "edge1.key"):
        (tmp_path / name).write_text("secret\n")
        body = body.replace(f"/etc/meshmq/{name}", str(tmp_path / name))
    (b,) = load_config(_write(tmp_path, body), {}).bridges
    assert (b.name, b.host, b.port, b.level, b.password) == (
        "cloud", "mq.example.com", 8883, 5, b"secret")
    assert [(t.pattern, t.direction, t.qos, t.remote_prefix) for t in b.topics] == [
        ("devices/#", "out", 1, "edge1/"), ("commands/#", "in", 1, "")]
