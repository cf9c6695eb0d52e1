"""meshmq.config: defaults, the example file, env overrides, and one-line errors naming the key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from broker.logrules import DEFAULT_RULES, LogRule
from broker.settings import MqttSettings, QueueFullPolicy
from commitlog.settings import LogSettings
from meshmq.config import (
    CommitLogConfig,
    ConfigError,
    NodeConfig,
    env_names,
    load_config,
    parse_bind,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"


def write(tmp_path: Path, text: str, name: str = "meshmq.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(path: str | None, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ or {})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("config error: ")
    return info.value


# ---------------------------------------------------------------------------- defaults


def test_defaults_without_file():
    cfg = load_config(None, {})
    assert isinstance(cfg, NodeConfig)
    assert cfg.node_id == "meshmq-1" == cfg.broker.node_id
    assert cfg.data_dir == "./meshmq-data"
    assert cfg.admin_bind == "127.0.0.1:9883"
    assert (cfg.log_level, cfg.log_format) == ("info", "text")
    assert cfg.commitlog == CommitLogConfig(True, "./meshmq-data/log", LogSettings(),
                                            DEFAULT_RULES)
    assert not hasattr(cfg, "raw")
    assert cfg.broker.listeners.tcp_bind == "0.0.0.0:1883"
    assert cfg.broker.listeners.tls_bind is None
    assert cfg.broker.listeners.ws_bind is None
    assert cfg.broker.listeners.ws_path == "/mqtt"
    assert cfg.broker.mqtt == MqttSettings()
    assert cfg.broker.auth.allow_anonymous is True
    assert cfg.broker.auth.password_file is None and cfg.broker.auth.acl_file is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.node_id = "x"  # type: ignore[misc]


def test_example_file_equals_defaults():
    assert load_config(str(EXAMPLE), {}) == load_config(None, {})


def test_example_file_lists_every_mqtt_field():
    data = tomllib.loads(EXAMPLE.read_text())
    names = {f.name for f in dataclasses.fields(MqttSettings)}
    assert set(data["mqtt"]) == names


def test_example_file_lists_every_commitlog_key():
    data = tomllib.loads(EXAMPLE.read_text())
    names = {f.name for f in dataclasses.fields(LogSettings)} | {"enabled", "dir"}
    assert set(data["commitlog"]) == names  # rules stay commented out: the default applies


def test_example_file_commented_rules_are_valid(tmp_path):
    """The commented [[commitlog.rules]] example, uncommented, must load as documented."""
    lines = EXAMPLE.read_text().splitlines()
    first = lines.index("# [[commitlog.rules]]")
    block = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines[first:]]
    cfg = load_config(write(tmp_path, "[commitlog]\n" + "\n".join(block) + "\n"), {})
    assert cfg.commitlog.rules == (LogRule("devices/{device}/#"),
                                   LogRule("fleet/+/{device}/telemetry/#"),
                                   LogRule("live/#", log=False))


def test_commitlog_file_values(tmp_path):
    path = write(tmp_path, """
[node]
data_dir = "/srv/mq"
[commitlog]
enabled = false
segment_bytes = 2048
index_interval_bytes = 512
fsync = 20
retention_ms = 0
retention_bytes_per_device = 1000000
tail_cache_bytes_per_device = 0
tail_cache_bytes_total = 0
checkpoint_interval_s = 5
read_fd_cache = 4

[[commitlog.rules]]
filter = "devices/{device}/#"

[[commitlog.rules]]
filter = "live/#"
log = false
""")
    cl = load_config(path, {}).commitlog
    assert cl.enabled is False
    assert cl.directory == "/srv/mq/log"  # "" = <data_dir>/log follows node.data_dir
    assert cl.settings == LogSettings(segment_bytes=2048, index_interval_bytes=512, fsync=20,
                                      retention_ms=0, retention_bytes_per_device=1_000_000,
                                      tail_cache_bytes_per_device=0, tail_cache_bytes_total=0,
                                      checkpoint_interval_s=5.0, read_fd_cache=4)
    assert isinstance(cl.settings.checkpoint_interval_s, float)
    assert cl.rules == (LogRule("devices/{device}/#", True), LogRule("live/#", False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cl.enabled = True  # type: ignore[misc]


def test_commitlog_dir_and_empty_rules(tmp_path):
    path = write(tmp_path, '[commitlog]\ndir = "/fast/log"\nfsync = "batch"\nrules = []\n')
    cl = load_config(path, {}).commitlog
    assert cl.directory == "/fast/log"
    assert cl.settings.fsync == "batch"
    assert cl.rules == ()  # every topic keyed by its first level


def test_commitlog_env_overrides(tmp_path):
    path = write(tmp_path, "[commitlog]\nfsync = 7\n")
    cl = load_config(path, {"MESHMQ_COMMITLOG__FSYNC": "5",
                            "MESHMQ_COMMITLOG__ENABLED": "0",
                            "MESHMQ_COMMITLOG__DIR": "/x/log",
                            "MESHMQ_COMMITLOG__RETENTION_MS": "60_000",
                            "MESHMQ_COMMITLOG__CHECKPOINT_INTERVAL_S": "0.5"}).commitlog
    assert cl.settings.fsync == 5 and cl.enabled is False and cl.directory == "/x/log"
    assert cl.settings.retention_ms == 60_000
    assert cl.settings.checkpoint_interval_s == 0.5
    assert load_config(path, {"MESHMQ_COMMITLOG__FSYNC": "BATCH"}).commitlog.settings.fsync \
        == "batch"
    assert "MESHMQ_COMMITLOG__FSYNC" in env_names()


@pytest.mark.parametrize(("var", "value", "key", "fragment"), [
    ("MESHMQ_COMMITLOG__FSYNC", "always", "commitlog.fsync", '"batch" or a positive'),
    ("MESHMQ_COMMITLOG__FSYNC", "0", "commitlog.fsync", '"batch" or a positive'),
    ("MESHMQ_COMMITLOG__FSYNC", "-5", "commitlog.fsync", '"batch" or a positive'),
    ("MESHMQ_COMMITLOG__SEGMENT_BYTES", "100", "commitlog.segment_bytes", ">= 1024"),
    ("MESHMQ_COMMITLOG__RETENTION_MS", "-1", "commitlog.retention_ms", ">= 0"),
    ("MESHMQ_COMMITLOG__READ_FD_CACHE", "0", "commitlog.read_fd_cache", ">= 1"),
    ("MESHMQ_COMMITLOG__CHECKPOINT_INTERVAL_S", "0", "commitlog.checkpoint_interval_s", "> 0"),
    ("MESHMQ_COMMITLOG__ENABLED", "maybe", "commitlog.enabled", "true or false"),
])
def test_commitlog_env_errors(var, value, key, fragment):
    err = error_of(None, {var: value})
    assert err.key == key and fragment in str(err) and f"(from {var})" in str(err)


@pytest.mark.parametrize("var", ["MESHMQ_COMMITLOG__RULES", "MESHMQ_COMMITLOG__RULES__0__FILTER"])
def test_commitlog_rules_are_file_only(var):
    err = error_of(None, {var: "devices/{device}/#"})
    assert err.key == var and "only be set in the config file" in str(err)


def test_commitlog_unknown_env_key():
    err = error_of(None, {"MESHMQ_COMMITLOG__SEGMENT_BYTE": "2048"})
    assert "names no configuration key" in str(err)
    assert "did you mean MESHMQ_COMMITLOG__SEGMENT_BYTES" in str(err)


@pytest.mark.parametrize(("text", "key", "fragment"), [
    ("[commitlog]\nsegment_byte = 2048\n", "commitlog.segment_byte",
     "did you mean segment_bytes"),
    ("[commitlog]\nnew_key = 1\n", "commitlog.new_key", "unknown key; allowed: enabled, dir"),
    ("[commitlog.retention]\nhours = 24\n", "commitlog.retention", "unknown key"),
    ('[commitlog]\nfsync = "always"\n', "commitlog.fsync", 'got "always"'),
    ("[commitlog]\nfsync = 0\n", "commitlog.fsync", "positive interval in ms"),
    ("[commitlog]\nfsync = true\n", "commitlog.fsync", "got true"),
    ("[commitlog]\nsegment_bytes = 10\n", "commitlog.segment_bytes", ">= 1024, got 10"),
    ('[commitlog]\ndir = 3\n', "commitlog.dir", "directory path"),
    ("commitlog = 1\n", "commitlog", "expected a table"),
    ('[commitlog]\nrules = "devices/#"\n', "commitlog.rules", "array of tables"),
    ('[commitlog.rules]\nfilter = "a/#"\n', "commitlog.rules", "array of tables"),
    ("[commitlog]\nrules = [1]\n", "commitlog.rules[0]", "expected a table"),
    ('[[commitlog.rules]]\nfilter = "a/#/b"\n', "commitlog.rules[0].filter",
     "'#' must be the last level"),
    ('[[commitlog.rules]]\nfilter = "devices/{device}/#"\n[[commitlog.rules]]\nlog = false\n',
     "commitlog.rules[1].filter", "required"),
    ('[[commitlog.rules]]\nfilter = "a/#"\n[[commitlog.rules]]\nfilter = "b/#"\n'
     '[[commitlog.rules]]\nfilter = "{device}/{device}"\n',
     "commitlog.rules[2].filter", "at most one {device} level"),
    ('[[commitlog.rules]]\nfilter = "+/x"\n', "commitlog.rules[0].filter",
     "needs a literal first level"),
    ('[[commitlog.rules]]\nfilter = "a/b{x}"\n', "commitlog.rules[0].filter", "invalid level"),
    ('[[commitlog.rules]]\nfilter = ""\n', "commitlog.rules[0].filter", "non-empty"),
    ("[[commitlog.rules]]\nfilter = 5\n", "commitlog.rules[0].filter", "got 5"),
    ('[[commitlog.rules]]\nfilter = "a/#"\nlog = "no"\n', "commitlog.rules[0].log",
     "true or false"),
    ('[[commitlog.rules]]\nfilter = "a/#"\nstore = false\n', "commitlog.rules[0].store",
     "allowed: filter, log"),
])
def test_commitlog_file_errors(tmp_path, text, key, fragment):
    path = write(tmp_path, text)
    err = error_of(path)
    assert err.key == key
    assert fragment in str(err)
    assert f"(from {path})" in str(err)


def test_log_false_rule_without_device_is_allowed(tmp_path):
    path = write(tmp_path, '[[commitlog.rules]]\nfilter = "#"\nlog = false\n')
    assert load_config(path, {}).commitlog.rules == (LogRule("#", False),)


def test_file_values(tmp_path):
    path = write(tmp_path, """
[node]
id = "edge-7"
data_dir = "/var/lib/meshmq"
[listener.tcp]
bind = ""
[listener.ws]
bind = "[::]:8083"
path = "/ws"
[admin]
bind = "[::1]:9999"
[mqtt]
max_inflight = 64
queue_full_policy = "disconnect"
connect_timeout = 3
retain_available = false
[log]
level = "debug"
format = "json"
""")
    cfg = load_config(path, {})
    assert cfg.node_id == "edge-7" and cfg.data_dir == "/var/lib/meshmq"
    assert cfg.broker.listeners.tcp_bind is None
    assert cfg.broker.listeners.ws_bind == "[::]:8083"
    assert cfg.broker.listeners.ws_path == "/ws"
    assert cfg.admin_bind == "[::1]:9999"
    assert cfg.broker.mqtt.max_inflight == 64
    assert cfg.broker.mqtt.queue_full_policy is QueueFullPolicy.DISCONNECT
    assert cfg.broker.mqtt.connect_timeout == 3.0
    assert isinstance(cfg.broker.mqtt.connect_timeout, float)
    assert cfg.broker.mqtt.retain_available is False
    assert (cfg.log_level, cfg.log_format) == ("debug", "json")


# ---------------------------------------------------------------------------- env overrides


def test_env_overrides_every_type(tmp_path):
    path = write(tmp_path, "[mqtt]\nmax_inflight = 8\n")
    env = {
        "MESHMQ_MQTT__MAX_INFLIGHT": "64",  # int, overriding the file
        "MESHMQ_MQTT__CONNECT_TIMEOUT": "2.5",  # float
        "MESHMQ_MQTT__RETAIN_AVAILABLE": "false",  # bool word
        "MESHMQ_MQTT__SHARED_SUBSCRIPTIONS": "0",  # bool digit
        "MESHMQ_MQTT__WILDCARD_SUBSCRIPTIONS": "TRUE",
        "MESHMQ_MQTT__QUEUE_FULL_POLICY": "drop_new",  # enum
        "MESHMQ_LISTENER__TCP__BIND": "127.0.0.1:1884",  # nested section string
        "MESHMQ_NODE__ID": "n2",
        "MESHMQ_LOG__FORMAT": "json",
        "MESHMQ_LOG__LEVEL": "WARNING",
        "MESHMQ_AUTH__ALLOW_ANONYMOUS": "1",
        "PATH": "/usr/bin",  # unrelated variables are ignored
    }
    cfg = load_config(path, env)
    m = cfg.broker.mqtt
    assert m.max_inflight == 64
    assert m.connect_timeout == 2.5
    assert m.retain_available is False and m.shared_subscriptions is False
    assert m.wildcard_subscriptions is True
    assert m.queue_full_policy is QueueFullPolicy.DROP_NEW
    assert cfg.broker.listeners.tcp_bind == "127.0.0.1:1884"
    assert cfg.node_id == cfg.broker.node_id == "n2"
    assert (cfg.log_format, cfg.log_level) == ("json", "warning")


def test_env_empty_string_disables_listener():
    cfg = load_config(None, {"MESHMQ_LISTENER__TCP__BIND": ""})
    assert cfg.broker.listeners.tcp_bind is None


def test_env_names_cover_every_key_of_the_example():
    def flatten(table, prefix=()):
        for k, v in table.items():
            if isinstance(v, dict):
                yield from flatten(v, prefix + (k,))
            else:
                yield prefix + (k,)

    keys = list(flatten(tomllib.loads(EXAMPLE.read_text())))
    expected = {"MESHMQ_" + "__".join(p.upper() for p in key) for key in keys}
    assert set(env_names()) == expected
    assert "MESHMQ_LISTENER__TLS__CERTFILE" in expected


def test_unknown_env_var_is_an_error():
    err = error_of(None, {"MESHMQ_MQTT__MAX_INFLITE": "3"})
    assert "MESHMQ_MQTT__MAX_INFLITE" in str(err)
    assert "did you mean MESHMQ_MQTT__MAX_INFLIGHT" in str(err)


@pytest.mark.parametrize("name", ["MESHMQ_FOO", "MESHMQ_MQTT", "MESHMQ_LISTENER__TCP",
                                  "MESHMQ_LISTENER__UDP__BIND", "MESHMQ_MQTT____X"])
def test_env_names_that_are_not_keys(name):
    err = error_of(None, {name: "1"})
    assert name in str(err)


@pytest.mark.parametrize(("var", "value", "key", "allowed"), [
    ("MESHMQ_MQTT__MAX_INFLIGHT", "abc", "mqtt.max_inflight", "an integer between 1 and 65535"),
    ("MESHMQ_MQTT__MAX_INFLIGHT", "0", "mqtt.max_inflight", "an integer between 1 and 65535"),
    ("MESHMQ_MQTT__MAX_QOS", "3", "mqtt.max_qos", "between 0 and 2"),
    ("MESHMQ_MQTT__MAX_PACKET_SIZE", "268435456", "mqtt.max_packet_size", "268435455"),
    ("MESHMQ_MQTT__MAX_QUEUED_MESSAGES", "0", "mqtt.max_queued_messages", ">= 1"),
    ("MESHMQ_MQTT__WRITE_BUFFER_LIMIT", "-5", "mqtt.write_buffer_limit", ">= 1"),
    ("MESHMQ_MQTT__CONNECT_TIMEOUT", "0", "mqtt.connect_timeout", "a number > 0"),
    ("MESHMQ_MQTT__CONNECT_TIMEOUT", "nan", "mqtt.connect_timeout", "a number > 0"),
    ("MESHMQ_MQTT__RETAIN_AVAILABLE", "yes", "mqtt.retain_available", "true or false"),
    ("MESHMQ_MQTT__QUEUE_FULL_POLICY", "drop", "mqtt.queue_full_policy",
     "one of drop_oldest, drop_new, disconnect"),
    ("MESHMQ_MQTT__PUBLISHER_DEDUPE", "yes", "mqtt.publisher_dedupe", "one of cluster, on, off"),
    ("MESHMQ_MQTT__DEDUPE_WINDOW", "0", "mqtt.dedupe_window",
     "an integer between 1 and 16777216"),
    ("MESHMQ_LOG__LEVEL", "verbose", "log.level", "debug, info"),
    ("MESHMQ_LOG__FORMAT", "xml", "log.format", "text, json"),
    ("MESHMQ_LISTENER__TCP__BIND", "1883", "listener.tcp.bind", "host:port"),
    ("MESHMQ_LISTENER__TCP__BIND", "0.0.0.0:70000", "listener.tcp.bind", "out of range"),
    ("MESHMQ_LISTENER__TCP__BIND", "::1:1883", "listener.tcp.bind", "brackets"),
    ("MESHMQ_LISTENER__WS__PATH", "mqtt", "listener.ws.path", "must start with /"),
    ("MESHMQ_ADMIN__BIND", "", "admin.bind", "host:port"),
    ("MESHMQ_NODE__ID", "bad id!", "node.id", "A-Z a-z"),
])
def test_env_errors_name_key_value_and_source(var, value, key, allowed):
    err = error_of(None, {var: value})
    message = str(err)
    assert err.key == key
    assert message.startswith(f"config error: {key}: expected ")
    assert allowed in message
    assert f"(from {var})" in message
    if value:
        assert value in message


def test_error_message_format_exact():
    err = error_of(None, {"MESHMQ_MQTT__MAX_INFLIGHT": "abc"})
    assert str(err) == ('config error: mqtt.max_inflight: expected an integer between 1 and '
                        '65535, got "abc" (from MESHMQ_MQTT__MAX_INFLIGHT)')


# ---------------------------------------------------------------------------- file errors


@pytest.mark.parametrize(("text", "key", "fragment"), [
    ("[mqtt]\nmax_inflight = \"abc\"\n", "mqtt.max_inflight", 'got "abc"'),
    ("[mqtt]\nmax_inflight = true\n", "mqtt.max_inflight", "got true"),
    ("[mqtt]\nmax_qos = 5\n", "mqtt.max_qos", "between 0 and 2, got 5"),
    ("[mqtt]\nretain_available = \"true\"\n", "mqtt.retain_available", "true or false"),
    ("[mqtt]\nmax_inflite = 3\n", "mqtt.max_inflite", "did you mean max_inflight"),
    ("[mqtt]\nqueue_full_policy = \"drop\"\n", "mqtt.queue_full_policy", "drop_oldest"),
    ("[mqqt]\nx = 1\n", "mqqt", "unknown section"),
    ("[listener.udp]\nbind = \"\"\n", "listener.udp", "allowed: tcp, tls, ws"),
    ("[listener]\nbind = \"0.0.0.0:1\"\n", "listener.bind", "unknown section"),
    ("max_inflight = 3\n", "max_inflight", "keys must be inside a section"),
    ("mqtt = 3\n", "mqtt", "expected a table"),
    ("[listener.tcp]\nbind = \"localhost\"\n", "listener.tcp.bind", "host:port"),
    ("[listener.tcp]\nbind = \"[::1:1883\"\n", "listener.tcp.bind", "[ipv6-address]:port"),
    ("[listener.tcp]\nbind = \"999.1.1.1:1883\"\n", "listener.tcp.bind", "IPv4"),
    ("[admin]\nbind = \"0.0.0.0:1883\"\n", "admin.bind", "already used by listener.tcp.bind"),
    ("[node]\nid = \"\"\n", "node.id", "a node id"),
    ("[log]\nlevel = 3\n", "log.level", "got 3"),
])
def test_file_errors_name_key(tmp_path, text, key, fragment):
    path = write(tmp_path, text)
    err = error_of(path)
    assert err.key == key
    assert fragment in str(err)
    assert f"(from {path})" in str(err)


def test_invalid_toml_is_one_line(tmp_path):
    path = write(tmp_path, "[mqtt\nmax_inflight = 3\n")
    err = error_of(path)
    assert "invalid TOML" in str(err) and path in str(err)


def test_missing_config_file():
    err = error_of("/nonexistent/meshmq.toml")
    assert "cannot read" in str(err) and "/nonexistent/meshmq.toml" in str(err)


def test_tls_requires_cert_and_key(tmp_path):
    path = write(tmp_path, '[listener.tls]\nbind = "0.0.0.0:8883"\n')
    err = error_of(path)
    assert err.key == "listener.tls.certfile"
    assert "required when listener.tls.bind is set" in str(err)


def test_tls_files_must_be_readable(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    path = write(tmp_path, f'[listener.tls]\nbind = "0.0.0.0:8883"\ncertfile = "{cert}"\n'
                           f'keyfile = "{tmp_path}/missing.key"\n')
    err = error_of(path)
    assert err.key == "listener.tls.keyfile" and "missing.key" in str(err)
    assert "No such file" in str(err)


def test_tls_enabled(tmp_path):
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    cfg = load_config(None, {
        "MESHMQ_LISTENER__TLS__BIND": "0.0.0.0:8883",
        "MESHMQ_LISTENER__TLS__CERTFILE": str(tmp_path / "c.pem"),
        "MESHMQ_LISTENER__TLS__KEYFILE": str(tmp_path / "k.pem"),
        "MESHMQ_LISTENER__TLS__CAFILE": str(tmp_path / "ca.pem"),
    })
    ls = cfg.broker.listeners
    assert ls.tls_bind == "0.0.0.0:8883"
    assert ls.tls_certfile == str(tmp_path / "c.pem")
    assert ls.tls_cafile == str(tmp_path / "ca.pem")


def test_auth_files_missing(tmp_path):
    err = error_of(None, {"MESHMQ_AUTH__PASSWORD_FILE": str(tmp_path / "nope")})
    assert err.key == "auth.password_file" and "(from MESHMQ_AUTH__PASSWORD_FILE)" in str(err)
    path = write(tmp_path, f'[auth]\nacl_file = "{tmp_path}/acl"\n')
    err = error_of(path)
    assert err.key == "auth.acl_file" and f"(from {path})" in str(err)


def test_auth_file_content_errors_name_line(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic reed a/b\n")
    err = error_of(None, {"MESHMQ_AUTH__ACL_FILE": str(acl)})
    assert err.key == "auth.acl_file"
    assert f"{acl}:2" in str(err) and "reed" in str(err)
    pw = tmp_path / "pw"
    pw.write_text("alice:plaintext\n")
    err = error_of(None, {"MESHMQ_AUTH__PASSWORD_FILE": str(pw)})
    assert err.key == "auth.password_file" and f"{pw}:1" in str(err)


def test_auth_files_accepted(tmp_path):
    from broker.auth import write_password

    pw = tmp_path / "pw"
    write_password(str(pw), "alice", "secret")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\n")
    cfg = load_config(None, {"MESHMQ_AUTH__PASSWORD_FILE": str(pw),
                             "MESHMQ_AUTH__ACL_FILE": str(acl),
                             "MESHMQ_AUTH__ALLOW_ANONYMOUS": "false"})
    assert cfg.broker.auth.password_file == str(pw)
    assert cfg.broker.auth.acl_file == str(acl)
    assert cfg.broker.auth.allow_anonymous is False


def test_no_anonymous_without_password_file():
    err = error_of(None, {"MESHMQ_AUTH__ALLOW_ANONYMOUS": "false"})
    assert err.key == "auth.allow_anonymous"


# ---------------------------------------------------------------------------- parse_bind


@pytest.mark.parametrize(("text", "expected"), [
    ("0.0.0.0:1883", ("0.0.0.0", 1883)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:1883", ("::1", 1883)),
    ("[::]:8083", ("::", 8083)),
    ("localhost:9883", ("localhost", 9883)),
    ("broker-1.example.com:65535", ("broker-1.example.com", 65535)),
])
def test_parse_bind_ok(text, expected):
    assert parse_bind(text) == expected


@pytest.mark.parametrize("text", ["", "1883", ":1883", "host:", "host:-1", "host:65536",
                                  "::1:1883", "[::1]1883", "[zz]:1", "a b:1", "1.2.3:4",
                                  "[::1]:x", "h:١٢"])
def test_parse_bind_bad(text):
    with pytest.raises(ValueError):
        parse_bind(text)
