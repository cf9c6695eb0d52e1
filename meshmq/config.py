"""Node configuration: one TOML file plus ``MESHMQ_<SECTION>__<KEY>`` environment overrides.

Why this shape:

* The file is parsed and validated **once**, at start-up, into typed frozen objects; each room
  receives only its part (``BrokerSettings`` for the broker). Nothing else reads TOML or the
  environment, so a bad value fails the start, not the first client that trips over it.
* Every key is described by one entry of a schema table (``_SCHEMA``). The same entry parses the
  TOML value, parses the environment string, checks the range and writes the error message, so the
  file, the environment and the documentation cannot drift apart. The ``[mqtt]`` entries are
  derived from ``broker.settings.MqttSettings`` itself: a field the broker adds shows up here with
  its default, and the ``config.example.toml`` test notices that the example lacks it.
* Environment overrides follow EMQX's convention (``EMQX_MQTT__MAX_INFLIGHT``): sections joined by
  a double underscore, upper case. A ``MESHMQ_`` variable that names no key is an error, because a
  typo in a container spec must not be silently ignored.
* Every error is a ``ConfigError`` whose ``str()`` is one line: the key, what is wrong, what is
  allowed, and where the value came from. It is what an operator sees in ``journalctl``.

``[commitlog]`` is typed like every other section: its scalar keys are derived from
``commitlog.settings.LogSettings`` (plus ``enabled`` and ``dir``), so a knob the store adds shows up
here with its default. The one exception is ``[[commitlog.rules]]``, an array of tables that only
the file can set: a list of filters does not fit in one environment variable without inventing a
second syntax, and rules change with the deployment's topic design, not per container.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import ssl
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from broker.auth import AuthFileError, load_acl, load_passwords
from broker.clientid import USERNAME_TOKEN, ClientIdRule
from broker.logrules import DEFAULT_RULES, LogRule, validate_rule
from broker.settings import AuthSettings, BrokerSettings, ListenerSettings, MqttSettings
from cluster.settings import (
    LEASE_SLACK,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ClusterSettings,
    NodeAddress,
)
from commitlog.settings import LogSettings
from meshmq.admin_auth import TokenFileError, load_tokens
from meshmq.bridgeconfig import BridgeConfig, BridgeConfigError, parse_bridges

__all__ = ["ConfigError", "NodeConfig", "CommitLogConfig", "ENV_PREFIX", "LOG_LEVELS",
           "LOG_FORMATS", "load_config", "parse_bind"]

ENV_PREFIX = "MESHMQ_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
COMMITLOG_SECTION = "commitlog"
DEFAULT_DATA_DIR = "./meshmq-data"
# Sub-directory of node.data_dir holding the commit-log store when commitlog.dir is "".
COMMITLOG_SUBDIR = "log"
CLUSTER_SECTION = "cluster"
# Mesh base port when [cluster] has no [[cluster.nodes]] list: router r links on 7883 + r
# (1883's sibling, as the admin port 9883 is; free of MQTT 1883, TLS 8883, WS 8083).
DEFAULT_MESH_PORT = 7883
MAX_ROUTERS = 64  # a router is a process per core; more than 64 per host is a typo
MIN_SECRET_BYTES = 16

# MQTT "Remaining Length" is at most 4 bytes of 7 bits: 268,435,455 bytes (MQTT-2.2.3).
MAX_MQTT_PACKET = 268_435_455
_U16 = 65_535
_U32 = 4_294_967_295
_CLUSTER_DEFAULTS = ClusterSettings(name="", node_id="", routers=1, nodes=(), secret=b"")


class ConfigError(ValueError):
    """A configuration problem; ``str()`` is one line an operator can act on.

    ``key`` is the dotted key ("mqtt.max_inflight") or section, ``source`` the file or environment
    variable the value came from (None for cross-key problems with no single origin).
    """

    def __init__(self, key: str, problem: str, source: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        text = f"config error: {key}: {problem}"
        if source:
            text += f" (from {source})"
        # One line, always: values are shown JSON-escaped, but OS messages and paths may not be.
        super().__init__(" ".join(text.split("\n")).replace("\r", " "))


@dataclass(frozen=True)
class CommitLogConfig:
    """The ``[commitlog]`` section, validated: what the node needs to open and feed the store.

    ``enabled``: False runs the node as a pure live pub/sub broker (no store is opened, QoS 1
    acks do not wait for a disk). ``directory``: where the store lives; ``commitlog.dir``, or
    ``<node.data_dir>/log`` when that is empty, so one data_dir setting moves all of a node's
    state. ``settings``: the store's knobs (see ``LogSettings``). ``rules``: which device log a
    topic belongs to, first match wins (see ``broker.logrules``).
    """

    enabled: bool = True
    directory: str = os.path.join(DEFAULT_DATA_DIR, COMMITLOG_SUBDIR)
    settings: LogSettings = field(default_factory=LogSettings)
    rules: tuple[LogRule, ...] = DEFAULT_RULES


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``meshmq serve`` needs, validated."""

    node_id: str = "meshmq-1"
    data_dir: str = DEFAULT_DATA_DIR
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    admin_bind: str = "127.0.0.1:9883"
    admin_token_file: str | None = None  # bearer tokens for the admin API (admin_auth.py)
    admin_certfile: str | None = None  # with admin_keyfile: the admin server speaks HTTPS
    admin_keyfile: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    commitlog: CommitLogConfig = field(default_factory=CommitLogConfig)
    # [cluster]; None = a plain single node (no mesh, no supervisor): today's broker unchanged
    cluster: ClusterSettings | None = None
    bridges: tuple[BridgeConfig, ...] = ()  # [[bridge]] sections (meshmq/bridgeconfig.py)


# --------------------------------------------------------------------------------------------
# Bind addresses

_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def parse_bind(s: str) -> tuple[str, int]:
    """Split ``"host:port"`` / ``"[v6]:port"`` into ``(host, port)``; raise ``ValueError``.

    The host is required (write ``0.0.0.0`` or ``[::]`` for "all interfaces") so that a config
    never binds every interface by accident. An IPv6 address must be bracketed because
    ``::1:1883`` is ambiguous. Port 0 is allowed: the OS picks a free port (tests use it).
    The returned host has no brackets, ready for ``loop.create_server(host=...)``.
    """
    if not isinstance(s, str) or not s:
        raise ValueError("expected host:port")
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1:end + 2] != ":":
            raise ValueError("expected [ipv6-address]:port")
        host, port_text = s[1:end], s[end + 2:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = s.rpartition(":")
        if not sep or not host:
            raise ValueError("expected host:port, e.g. 0.0.0.0:1883")
        if ":" in host:
            raise ValueError("an IPv6 address must be in brackets, e.g. [::1]:1883")
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv4 address") from None
        elif len(host) > 253 or not all(_HOSTNAME_LABEL.match(p) for p in host.split(".")):
            raise ValueError(f"{host!r} is not a valid host name")
    if not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"port {port_text!r} is not a number")
    port = int(port_text)
    if port > _U16:
        raise ValueError(f"port {port} is out of range 0-65535")
    return host, port


# --------------------------------------------------------------------------------------------
# Value kinds: each parses a TOML value and an environment string, or raises _Bad(expected).


class _Bad(Exception):
    """Internal: a value did not fit; ``expected`` says what would have."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


def _show(value: object) -> str:
    """Render a rejected value for a one-line message (strings JSON-quoted, TOML-ish otherwise)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


class _Kind:
    expected: str = ""

    def from_toml(self, value: object) -> object:
        raise NotImplementedError

    def from_env(self, text: str) -> object:
        raise NotImplementedError


class _Int(_Kind):
    def __init__(self, lo: int, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi
        if hi is None:
            self.expected = f"an integer >= {lo}"
        else:
            self.expected = f"an integer between {lo} and {hi}"

    def check(self, value: int) -> int:
        if value < self.lo or (self.hi is not None and value > self.hi):
            raise _Bad(self.expected)
        return value

    def from_toml(self, value: object) -> object:
        # bool is an int subclass in Python; `max_inflight = true` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(self.expected)
        return self.check(value)

    def from_env(self, text: str) -> object:
        t = text.strip().replace("_", "")
        if not re.fullmatch(r"[+-]?[0-9]+", t):
            raise _Bad(self.expected)
        return self.check(int(t))


class _Float(_Kind):
    def __init__(self, lo: float, inclusive: bool) -> None:
        self.lo, self.inclusive = lo, inclusive
        self.expected = f"a number {'>=' if inclusive else '>'} {lo:g}"

    def check(self, value: float) -> float:
        if not math.isfinite(value) or value < self.lo or (value == self.lo and not self.inclusive):
            raise _Bad(self.expected)
        return float(value)

    def from_toml(self, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Bad(self.expected)
        return self.check(value)

    def from_env(self, text: str) -> object:
        try:
            return self.check(float(text.strip()))
        except ValueError:
            raise _Bad(self.expected) from None


class _Bool(_Kind):
    expected = "true or false (1 or 0 in the environment)"
    _WORDS = {"true": True, "false": False, "1": True, "0": False}

    def from_toml(self, value: object) -> object:
        if not isinstance(value, bool):
            raise _Bad("true or false")
        return value

    def from_env(self, text: str) -> object:
        try:
            return self._WORDS[text.strip().lower()]
        except KeyError:
            raise _Bad(self.expected) from None


class _Str(_Kind):
    def __init__(self, expected: str = "a string",
                 check: Callable[[str], None] | None = None) -> None:
        self.expected = expected
        self._check = check

    def from_toml(self, value: object) -> object:
        if not isinstance(value, str):
            raise _Bad(self.expected)
        if self._check is not None:
            try:
                self._check(value)
            except ValueError as exc:
                raise _Bad(f"{self.expected} ({exc})") from None
        return value

    def from_env(self, text: str) -> object:
        return self.from_toml(text)


class _Choice(_Kind):
    def __init__(self, choices: typing.Iterable[str], enum: type[Enum] | None = None) -> None:
        self.choices = tuple(choices)
        self.enum = enum
        self.expected = "one of " + ", ".join(self.choices)

    def from_toml(self, value: object) -> object:
        if not isinstance(value, str) or value.lower() not in self.choices:
            raise _Bad(self.expected)
        v = value.lower()
        return self.enum(v) if self.enum is not None else v

    def from_env(self, text: str) -> object:
        return self.from_toml(text.strip())


class _Fsync(_Kind):
    """``commitlog.fsync``: the word "batch" or a positive interval in milliseconds."""

    expected = '"batch" or a positive interval in ms'

    def from_toml(self, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "batch":
            return "batch"
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _Bad(self.expected)
        return value

    def from_env(self, text: str) -> object:
        t = text.strip()
        if t.lower() == "batch":
            return "batch"
        if not (t.isascii() and t.isdigit()) or int(t) <= 0:
            raise _Bad(self.expected)
        return int(t)


def _check_bind_or_empty(s: str) -> None:
    if s:
        parse_bind(s)


def _check_bind(s: str) -> None:
    parse_bind(s)


def _check_node_id(s: str) -> None:
    # The id names the node to its peers and may become part of file names: keep it tame.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", s):
        raise ValueError("1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit")


def _check_cluster_name(s: str) -> None:
    # Sent in every link handshake and shown in logs: the node-id alphabet, or "" (no cluster).
    if s:
        _check_node_id(s)


def _check_nonempty(s: str) -> None:
    if not s:
        raise ValueError("must not be empty")


def _check_ws_path(s: str) -> None:
    if not s.startswith("/") or any(c.isspace() for c in s):
        raise ValueError("must start with / and contain no spaces")


def _check_clientid_pattern(s: str) -> None:
    if USERNAME_TOKEN not in s:
        raise ValueError('must contain "%u" (the username), or the id is bound to nobody')


_BIND_OPT = "host:port, [ipv6]:port, or \"\" to disable"

# Known ranges for MqttSettings fields. A field missing here still works: ints default to >= 0,
# floats to > 0. MQTT fixes several bounds: packet ids and Receive Maximum are 16-bit, the
# session expiry interval is 32-bit, Remaining Length caps a packet at 268,435,455 bytes.
_MQTT_KINDS: dict[str, _Kind] = {
    "max_packet_size": _Int(1, MAX_MQTT_PACKET),
    "max_inflight": _Int(1, _U16),
    "receive_maximum": _Int(1, _U16),
    "max_queued_messages": _Int(1),
    "max_lagging_devices": _Int(1),
    "max_retained_pending": _Int(1),
    "max_session_expiry": _Int(0, _U32),
    "max_keepalive": _Int(0, _U16),
    "topic_alias_maximum": _Int(0, _U16),
    "max_qos": _Int(0, 2),
    "write_buffer_limit": _Int(1),
    "connect_timeout": _Float(0.0, inclusive=False),
    "max_topic_levels": _Int(1, _U16),
    "max_connections": _Int(1),
    "max_connect_packet_size": _Int(16, MAX_MQTT_PACKET),
    "packet_timeout": _Float(0.0, inclusive=False),
    "max_offline_sessions": _Int(0),
    "max_queued_bytes": _Int(1),
    "dedupe_window": _Int(1, 1 << 24),  # records read back per device (broker/pubdedupe.py)
}


def _mqtt_schema() -> dict[str, tuple[_Kind, object]]:
    """Derive the ``[mqtt]`` keys from ``MqttSettings`` so the two cannot drift apart."""
    hints = typing.get_type_hints(MqttSettings)
    out: dict[str, tuple[_Kind, object]] = {}
    for f in fields(MqttSettings):
        tp = hints[f.name]
        kind: _Kind
        if f.name in _MQTT_KINDS:
            kind = _MQTT_KINDS[f.name]
        elif tp is bool:
            kind = _Bool()
        elif tp is int:
            kind = _Int(0)
        elif tp is float:
            kind = _Float(0.0, inclusive=False)
        elif tp is str:
            kind = _Str()
        elif isinstance(tp, type) and issubclass(tp, Enum):
            kind = _Choice([str(m.value) for m in tp], tp)
        else:  # pragma: no cover - a loud failure for whoever adds an unsupported field type
            raise TypeError(f"meshmq.config cannot map MqttSettings.{f.name}: {tp!r}")
        out[f.name] = (kind, f.default)
    return out


# Known ranges for LogSettings fields (LogSettings.__post_init__ enforces the same bounds; here
# they become one-line errors naming the key). Unlisted int fields default to >= 0.
_LOG_KINDS: dict[str, _Kind] = {
    "segment_bytes": _Int(1024),
    "index_interval_bytes": _Int(1),
    "fsync": _Fsync(),
    "checkpoint_interval_s": _Float(0.0, inclusive=False),
    "read_fd_cache": _Int(1),
}


def _commitlog_schema() -> dict[str, tuple[_Kind, object]]:
    """``[commitlog]`` keys: ``enabled``, ``dir`` and every ``LogSettings`` field, derived from
    the dataclass so the store's knobs and the config cannot drift apart."""
    out: dict[str, tuple[_Kind, object]] = {
        "enabled": (_Bool(), True),
        "dir": (_Str('a directory path, or "" for <node.data_dir>/log'), ""),
    }
    hints = typing.get_type_hints(LogSettings)
    for f in fields(LogSettings):
        tp = hints[f.name]
        kind: _Kind
        if f.name in _LOG_KINDS:
            kind = _LOG_KINDS[f.name]
        elif tp is int:
            kind = _Int(0)
        elif tp is float:
            kind = _Float(0.0, inclusive=False)
        elif tp is bool:
            kind = _Bool()
        else:  # pragma: no cover - a loud failure for whoever adds an unsupported field type
            raise TypeError(f"meshmq.config cannot map LogSettings.{f.name}: {tp!r}")
        out[f.name] = (kind, f.default)
    return out


# [[commitlog.rules]] is an array of tables, parsed by _parse_rules (file only, no env).
_RULES_KEY = "rules"
_RULE_KEYS = ("filter", "log")
# [[cluster.nodes]] likewise (_parse_nodes): a list of addresses does not fit one variable.
_NODES_KEY = "nodes"
_NODE_KEYS = ("id", "host", "port", "raft_port", "mqtt")
_NODE_REQUIRED = ("id", "host", "port")
PLACEMENTS = ("static", "raft")
ACKS = ("all", "leader")  # cluster.acks (cluster/replication.py)
MAX_RAFT_VOTERS = 5  # Raft groups of more voters commit slower and gain nothing (etcd, KRaft)
_ARRAY_KEYS: dict[tuple[str, ...], list[str]] = {(COMMITLOG_SECTION,): [_RULES_KEY],
                                                 (CLUSTER_SECTION,): [_NODES_KEY]}

_SectionSchema = dict[str, tuple[_Kind, object]]

# Section path -> key -> (kind, default). Defaults here are what config.example.toml must say.
_SCHEMA: dict[tuple[str, ...], _SectionSchema] = {
    ("node",): {
        "id": (_Str("a node id", _check_node_id), "meshmq-1"),
        "data_dir": (_Str("a directory path", _check_nonempty), DEFAULT_DATA_DIR),
    },
    ("listener", "tcp"): {
        "bind": (_Str(_BIND_OPT, _check_bind_or_empty), "0.0.0.0:1883"),
        "max_connections": (_Int(0), 0),
    },
    ("listener", "tls"): {
        "bind": (_Str(_BIND_OPT, _check_bind_or_empty), ""),
        "certfile": (_Str("a file path or \"\""), ""),
        "keyfile": (_Str("a file path or \"\""), ""),
        "cafile": (_Str("a file path or \"\""), ""),
        "max_connections": (_Int(0), 0),
    },
    ("listener", "ws"): {
        "bind": (_Str(_BIND_OPT, _check_bind_or_empty), ""),
        "path": (_Str("a URL path", _check_ws_path), "/mqtt"),
        "max_connections": (_Int(0), 0),
    },
    ("admin",): {
        "bind": (_Str("host:port or [ipv6]:port", _check_bind), "127.0.0.1:9883"),
        "token_file": (_Str("a file path or \"\""), ""),
        "certfile": (_Str("a file path or \"\""), ""),
        "keyfile": (_Str("a file path or \"\""), ""),
    },
    ("mqtt",): _mqtt_schema(),
    ("auth",): {
        "allow_anonymous": (_Bool(), True),
        "password_file": (_Str("a file path or \"\""), ""),
        "acl_file": (_Str("a file path or \"\""), ""),
        "clientid_rule": (_Choice([r.value for r in ClientIdRule]), "any"),
        "clientid_pattern": (_Str('a pattern containing "%u"', _check_clientid_pattern), "%u"),
        "max_concurrent_checks": (_Int(1, 1024), 2),
        "max_failures": (_Int(1), 15),
        "failure_window": (_Float(0.0, inclusive=False), 60.0),
        "max_address_failures": (_Int(1), 100),
    },
    ("log",): {
        "level": (_Choice(LOG_LEVELS), "info"),
        "format": (_Choice(LOG_FORMATS), "text"),
    },
    (COMMITLOG_SECTION,): _commitlog_schema(),
    (CLUSTER_SECTION,): {
        # "" = no cluster (today's single node); any other value turns the supervisor on.
        "name": (_Str('a cluster name, or "" for a single node', _check_cluster_name), ""),
        "routers": (_Int(1, MAX_ROUTERS), 1),
        "secret": (_Str('a shared secret of at least 16 bytes, or ""'), ""),
        "secret_file": (_Str('a file path or ""'), ""),
        # Mesh base port of this node when [[cluster.nodes]] is absent (the one-host shorthand).
        "port": (_Int(1, _U16), DEFAULT_MESH_PORT),
        "link_window": (_Int(1), _CLUSTER_DEFAULTS.link_window),
        "link_max_queued_bytes": (_Int(1024), _CLUSTER_DEFAULTS.link_max_queued_bytes),
        "reconnect_min": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.reconnect_min),
        "reconnect_max": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.reconnect_max),
        "link_timeout": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.link_timeout),
        "append_timeout": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.append_timeout),
        "placement": (_Choice(PLACEMENTS), _CLUSTER_DEFAULTS.placement),
        # Raft placement only: nodes holding each new device log (capped by the node count)
        "replication_factor": (_Int(1, 5), _CLUSTER_DEFAULTS.replication_factor),
        # Raft placement only: publishes held per router while their logs are being placed
        "placement_max_held": (_Int(1), _CLUSTER_DEFAULTS.placement_max_held),
        # Raft placement only: seconds between saves of persistent sessions in the registry
        "session_checkpoint_interval": (_Float(0.0, inclusive=False),
                                        _CLUSTER_DEFAULTS.session_checkpoint_interval),
        # Raft placement only: seconds between batches of device-log floors in Raft
        "log_floor_interval": (_Float(0.0, inclusive=False),
                               _CLUSTER_DEFAULTS.log_floor_interval),
        # Raft placement, failover: a node unheard this long is dead (cluster/controller.py)
        "node_timeout": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.node_timeout),
        # Raft placement: a router acks only within this of its voter's majority contact
        "leader_lease": (_Float(0.0, inclusive=False), _CLUSTER_DEFAULTS.leader_lease),
        # Raft placement: publishes held, not refused, this long after the lease ran out
        "lease_hold": (_Float(0.0, inclusive=True), _CLUSTER_DEFAULTS.lease_hold),
        "lease_hold_max": (_Int(1), _CLUSTER_DEFAULTS.lease_hold_max),
        # Raft placement only: replication (cluster/replication.py, docs/replication.md)
        "acks": (_Choice(ACKS), _CLUSTER_DEFAULTS.acks),
        "min_insync_replicas": (_Int(1, 5), _CLUSTER_DEFAULTS.min_insync_replicas),
        "replica_lag_time_max": (_Float(0.0, inclusive=False),
                                 _CLUSTER_DEFAULTS.replica_lag_time_max),
        "replica_fetch_wait": (_Float(0.0, inclusive=False),
                               _CLUSTER_DEFAULTS.replica_fetch_wait),
        # Raft placement only: leadership follows the device (cluster/affinity.py); 0: off
        "leader_affinity_stable": (_Float(0.0, inclusive=True),
                                   _CLUSTER_DEFAULTS.leader_affinity_stable),
        "leader_affinity_min_interval": (_Float(0.0, inclusive=True),
                                         _CLUSTER_DEFAULTS.leader_affinity_min_interval),
        "leader_affinity_max_devices": (_Int(1), _CLUSTER_DEFAULTS.leader_affinity_max_devices),
        # Raft port of this node's metadata process when [[cluster.nodes]] is absent (0: the
        # first port after the routers' mesh ports).
        "raft_port": (_Int(0, _U16), 0),
        # the highest mesh protocol version this node speaks (pin the old one while rolling)
        "protocol_version": (_Int(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION),
                             _CLUSTER_DEFAULTS.protocol_version),
    },
}
# Tables that only hold other tables ([listener] holds [listener.tcp] ...).
_PARENTS = {path[:i] for path in _SCHEMA for i in range(1, len(path))}
_TOP_SECTIONS = sorted({path[0] for path in _SCHEMA} | {"bridge"})  # [[bridge]]: bridgeconfig


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(p.upper() for p in path)


def _all_keys() -> list[tuple[str, ...]]:
    return [section + (key,) for section, keys in _SCHEMA.items() for key in keys]


def _suggest(word: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


# --------------------------------------------------------------------------------------------
# Loading


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("config file",
                          f"cannot read {json.dumps(path)}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config file", f"invalid TOML: {exc}", path) from None
    except UnicodeDecodeError:
        raise ConfigError("config file", "not UTF-8 text", path) from None


def _merge_file(data: Mapping[str, Any], path: str,
                values: dict[tuple[str, ...], object]
                ) -> tuple[tuple[LogRule, ...] | None, tuple[NodeAddress, ...] | None]:
    """Check every table and key of the file against the schema and store the parsed values.

    Returns the ``[[commitlog.rules]]`` list when the file has one (None: keep the defaults) and
    the ``[[cluster.nodes]]`` list when it has one (None: the one-host shorthand, if any)."""
    rules: tuple[LogRule, ...] | None = None
    nodes: tuple[NodeAddress, ...] | None = None

    def walk(table: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        nonlocal rules, nodes
        for name, value in table.items():
            here = prefix + (name,)
            if here in _SCHEMA:
                if not isinstance(value, dict):
                    raise ConfigError(_dotted(here), f"expected a table ([{_dotted(here)}])",
                                      path)
                schema = _SCHEMA[here]
                for key, item in value.items():
                    full = here + (key,)
                    if here == (COMMITLOG_SECTION,) and key == _RULES_KEY:
                        rules = _parse_rules(item, path)
                        continue
                    if here == (CLUSTER_SECTION,) and key == _NODES_KEY:
                        nodes = _parse_nodes(item, path)
                        continue
                    if key not in schema:
                        allowed = list(schema) + _ARRAY_KEYS.get(here, [])
                        raise ConfigError(
                            _dotted(full),
                            "unknown key; allowed: " + ", ".join(allowed) + _suggest(key, allowed),
                            path)
                    kind = schema[key][0]
                    try:
                        values[full] = kind.from_toml(item)
                    except _Bad as bad:
                        raise ConfigError(_dotted(full),
                                          f"expected {bad.expected}, got {_show(item)}",
                                          path) from None
            elif here in _PARENTS:
                if not isinstance(value, dict):
                    raise ConfigError(_dotted(here), "expected a table", path)
                walk(value, here)
            else:
                if prefix:
                    allowed = sorted({p[len(prefix)] for p in _SCHEMA if p[:len(prefix)] == prefix})
                    what = "unknown section"
                else:
                    allowed = _TOP_SECTIONS
                    what = "unknown section" if isinstance(value, dict) else \
                        "keys must be inside a section"
                raise ConfigError(_dotted(here),
                                  f"{what}; allowed: " + ", ".join(allowed)
                                  + _suggest(name, allowed), path)

    walk(data, ())
    return rules, nodes


def _parse_rules(value: object, path: str) -> tuple[LogRule, ...]:
    """``[[commitlog.rules]]`` -> LogRules, each checked with ``validate_rule`` so a bad filter
    stops the start naming ``commitlog.rules[i].filter`` instead of misrouting publishes."""
    base = f"{COMMITLOG_SECTION}.{_RULES_KEY}"
    if not isinstance(value, list):
        raise ConfigError(base, "expected an array of tables ([[commitlog.rules]] with filter "
                                "and log keys)", path)
    out: list[LogRule] = []
    for i, item in enumerate(value):
        here = f"{base}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(here, "expected a table with filter and log keys "
                                    "([[commitlog.rules]])", path)
        for key in item:
            if key not in _RULE_KEYS:
                raise ConfigError(f"{here}.{key}", "unknown key; allowed: " + ", ".join(_RULE_KEYS)
                                  + _suggest(key, _RULE_KEYS), path)
        if "filter" not in item:
            raise ConfigError(f"{here}.filter", "required (an MQTT filter, e.g. "
                                                '"devices/{device}/#")', path)
        flt = item["filter"]
        if not isinstance(flt, str) or not flt:
            raise ConfigError(f"{here}.filter", "expected a non-empty MQTT filter string, got "
                              + _show(flt), path)
        log_flag = item.get("log", True)
        if not isinstance(log_flag, bool):
            raise ConfigError(f"{here}.log", f"expected true or false, got {_show(log_flag)}",
                              path)
        rule = LogRule(flt, log_flag)
        problem = validate_rule(rule)
        if problem is not None:
            raise ConfigError(f"{here}.filter", f"{problem}, got {_show(flt)}", path)
        out.append(rule)
    return tuple(out)


def _parse_nodes(value: object, path: str) -> tuple[NodeAddress, ...]:
    """``[[cluster.nodes]]`` -> NodeAddresses, each entry checked on its own (cross-entry and
    cross-section checks are in ``_build_cluster``), errors naming ``cluster.nodes[i].key``."""
    base = f"{CLUSTER_SECTION}.{_NODES_KEY}"
    if not isinstance(value, list):
        raise ConfigError(base, "expected an array of tables ([[cluster.nodes]] with id, host "
                                "and port keys)", path)
    out: list[NodeAddress] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        here = f"{base}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(here, "expected a table with id, host and port keys "
                                    "([[cluster.nodes]])", path)
        for key in item:
            if key not in _NODE_KEYS:
                raise ConfigError(f"{here}.{key}", "unknown key; allowed: " + ", ".join(_NODE_KEYS)
                                  + _suggest(key, _NODE_KEYS), path)
        for key in _NODE_REQUIRED:
            if key not in item:
                raise ConfigError(f"{here}.{key}", "required (every node needs id, host and "
                                                   "port)", path)
        node_id, host, port = item["id"], item["host"], item["port"]
        if isinstance(node_id, str) and "/" in node_id:
            raise ConfigError(f"{here}.id", "must not contain \"/\" (router ids are "
                                            f"<node id>/<index>), got {_show(node_id)}", path)
        try:
            if not isinstance(node_id, str):
                raise ValueError("not a string")
            _check_node_id(node_id)
        except ValueError as exc:
            raise ConfigError(f"{here}.id", f"expected a node id ({exc}), got {_show(node_id)}",
                              path) from None
        if node_id in seen:
            raise ConfigError(f"{here}.id", f"duplicate node id {_show(node_id)} (also "
                                            f"{base}[{seen[node_id]}]); ids must be unique",
                              path)
        seen[node_id] = i
        if isinstance(host, str) and host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            if not isinstance(host, str) or not host:
                raise ValueError("empty")
            parse_bind(f"[{host}]:1" if ":" in host else f"{host}:1")
        except ValueError as exc:
            raise ConfigError(f"{here}.host", f"expected a host name or IP address the other "
                                              f"nodes can reach ({exc}), got {_show(host)}",
                              path) from None
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= _U16:
            raise ConfigError(f"{here}.port", f"expected an integer between 1 and {_U16}, got "
                                              f"{_show(port)}", path)
        raft_port = item.get("raft_port", 0)
        if isinstance(raft_port, bool) or not isinstance(raft_port, int) \
                or not 0 <= raft_port <= _U16:
            raise ConfigError(f"{here}.raft_port", f"expected an integer between 1 and {_U16} "
                                                   "(0 or left out: port + cluster.routers), "
                                                   f"got {_show(raft_port)}", path)
        mqtt = item.get("mqtt", "")
        try:
            if not isinstance(mqtt, str):
                raise ValueError("not a string")
            if mqtt:
                parse_bind(mqtt)
        except ValueError as exc:
            raise ConfigError(f"{here}.mqtt", f"expected \"host:port\" MQTT clients can reach "
                                              f"this node at, or \"\" ({exc}), got "
                                              f"{_show(mqtt)}", path) from None
        out.append(NodeAddress(node_id, host, port, raft_port, mqtt))
    if not out:
        raise ConfigError(base, "empty: list every node of the cluster, this one included "
                                "(or leave [[cluster.nodes]] out for one node on loopback)", path)
    return tuple(out)


def _same_host(a: str, b: str) -> bool:
    """Whether two mesh hosts are one machine as far as we can tell without resolving names."""
    def norm(h: str) -> str:
        h = h.lower()
        return "127.0.0.1" if h in ("localhost", "::1") or h.startswith("127.") else h
    return norm(a) == norm(b)


def _build_cluster(values: Mapping[tuple[str, ...], object],
                   sources: Mapping[tuple[str, ...], str],
                   nodes: tuple[NodeAddress, ...] | None,
                   path: str | None) -> ClusterSettings | None:
    """``[cluster]`` -> ClusterSettings, or None for a plain single node.

    A node is a cluster member when ``cluster.name`` is set (EMQX names its cluster too, and a
    name is what two clusters on one network are told apart by in the link handshake). Without
    ``[[cluster.nodes]]`` it is the one-host shorthand: this node alone, its ``routers`` meshing
    on loopback from ``cluster.port``. Checked here, each naming the key to change: this node
    in the list, mesh port ranges inside 1-65535, not overlapping on one host nor with this
    node's MQTT/admin ports, and a secret whenever there is a link to authenticate."""
    def get(key: str) -> Any:
        return values[(CLUSTER_SECTION, key)]

    def src(key: str) -> str | None:
        return sources.get((CLUSTER_SECTION, key))

    name = get("name")
    if not name:
        # A key set to its default (the example file sets them all) asks for nothing.
        schema = _SCHEMA[(CLUSTER_SECTION,)]
        stray = sorted(k[1] for k in sources
                       if k[0] == CLUSTER_SECTION and values[k] != schema[k[1]][1])
        if nodes is not None or stray:
            what = "[[cluster.nodes]]" if nodes is not None else f"cluster.{stray[0]}"
            raise ConfigError("cluster.name", f"required: {what} is set, but a node is a "
                              "cluster member only with a cluster name (the same on every "
                              "node)", path if nodes is not None else src(stray[0]))
        return None
    node_id = values[("node", "id")]
    node_src = sources.get(("node", "id"))
    routers = get("routers")
    assert isinstance(node_id, str) and isinstance(routers, int)
    if nodes is None:
        base = int(get("port"))
        # raft_port 0: derived below (base + routers) when the placement is raft
        nodes = (NodeAddress(node_id, "127.0.0.1", base, int(get("raft_port"))),)
        port_keys = ["cluster.port"]
        port_src: list[str | None] = [src("port")]
    else:
        for key in ("port", "raft_port"):
            if src(key) is not None:
                raise ConfigError(f"cluster.{key}", "only for one node without [[cluster.nodes]]"
                                  f"; with a nodes list, each node's {key} is in its entry",
                                  src(key))
        port_keys = [f"cluster.nodes[{i}].port" for i in range(len(nodes))]
        port_src = [path] * len(nodes)
    ids = [n.id for n in nodes]
    if node_id not in ids:
        raise ConfigError("node.id", f"own address not in the list: this node's id "
                          f"{_show(node_id)} is none of the cluster.nodes ids ("
                          + ", ".join(ids) + "); set node.id (MESHMQ_NODE__ID) to this node's "
                          "entry or add it to [[cluster.nodes]]", node_src or path)
    for i, n in enumerate(nodes):
        last = n.port + routers - 1
        if last > _U16:
            raise ConfigError(port_keys[i], f"node {_show(n.id)}'s {routers} routers need mesh "
                              f"ports {n.port}-{last}, beyond 65535 (router r listens on "
                              "port + r)", port_src[i])
    for j, b in enumerate(nodes):
        for a in nodes[:j]:
            if _same_host(a.host, b.host) and a.port <= b.port + routers - 1 \
                    and b.port <= a.port + routers - 1:
                raise ConfigError(port_keys[j], f"node {_show(b.id)}'s mesh ports {b.port}-"
                                  f"{b.port + routers - 1} overlap node {_show(a.id)}'s "
                                  f"{a.port}-{a.port + routers - 1} on host {a.host} (router r "
                                  f"listens on port + r: space nodes on one host at least "
                                  f"routers = {routers} apart)", port_src[j])
    own_index = ids.index(node_id)
    own = nodes[own_index]
    derived: set[int] = set()
    if get("placement") == "raft":
        nodes, derived = _derive_raft_ports(nodes, routers)
        _check_raft_ports(nodes, routers, port_keys, port_src, path, derived)
        own = nodes[own_index]
    for key in (("listener", "tcp", "bind"), ("listener", "tls", "bind"),
                ("listener", "ws", "bind"), ("admin", "bind")):
        text = values[key]
        if not isinstance(text, str) or not text:
            continue
        port = parse_bind(text)[1]
        if port and port == own.raft_port:
            raft_key = port_keys[own_index].replace(".port", ".raft_port")
            how = (f" (derived: port + cluster.routers; set {raft_key})"
                   if own_index in derived else "")
            raise ConfigError(raft_key, f"this node's Raft port {port}{how} is also the port "
                              f"of {_dotted(key)}; move one of them", port_src[own_index])
        if port and own.port <= port <= own.port + routers - 1:
            raise ConfigError(port_keys[own_index], f"this node's mesh ports {own.port}-"
                              f"{own.port + routers - 1} include port {port} of "
                              f"{_dotted(key)}; move one of them", port_src[own_index])
    if float(get("reconnect_min")) > float(get("reconnect_max")):
        raise ConfigError("cluster.reconnect_min", "must not exceed cluster.reconnect_max",
                          src("reconnect_min"))
    _check_failover_timeouts(float(get("node_timeout")), float(get("leader_lease")), src)
    secret = _cluster_secret(get("secret"), get("secret_file"), src)
    total = len(nodes) * routers
    if total > 1 and not secret:
        raise ConfigError("cluster.secret", f"required: the cluster has {total} routers and "
                          "every link between them is authenticated with it; set "
                          "cluster.secret_file (a file only meshmq can read, e.g. from "
                          "`head -c 32 /dev/urandom | base64`) or cluster.secret "
                          "(MESHMQ_CLUSTER__SECRET), the same on every node", path)
    if get("replica_fetch_wait") >= get("replica_lag_time_max"):
        # a parked fetch must answer before its follower counts as behind (Kafka requires
        # replica.fetch.wait.max.ms < replica.lag.time.max.ms for the same reason)
        raise ConfigError("cluster.replica_fetch_wait", "must be below "
                          "cluster.replica_lag_time_max (a follower whose fetch is parked "
                          "that long would leave the ISR while caught up)",
                          src("replica_fetch_wait"))
    return ClusterSettings(
        name=name, node_id=node_id, routers=routers, nodes=nodes, secret=secret,
        link_window=get("link_window"), link_max_queued_bytes=get("link_max_queued_bytes"),
        reconnect_min=float(get("reconnect_min")), reconnect_max=float(get("reconnect_max")),
        link_timeout=float(get("link_timeout")),
        append_timeout=float(get("append_timeout")), placement=str(get("placement")),
        replication_factor=get("replication_factor"),
        placement_max_held=get("placement_max_held"),
        session_checkpoint_interval=float(get("session_checkpoint_interval")),
        log_floor_interval=float(get("log_floor_interval")),
        node_timeout=float(get("node_timeout")), leader_lease=float(get("leader_lease")),
        lease_hold=float(get("lease_hold")), lease_hold_max=get("lease_hold_max"),
        acks=str(get("acks")), min_insync_replicas=get("min_insync_replicas"),
        replica_lag_time_max=float(get("replica_lag_time_max")),
        replica_fetch_wait=float(get("replica_fetch_wait")),
        leader_affinity_stable=float(get("leader_affinity_stable")),
        leader_affinity_min_interval=float(get("leader_affinity_min_interval")),
        leader_affinity_max_devices=get("leader_affinity_max_devices"),
        protocol_version=get("protocol_version"))


def _check_failover_timeouts(node_timeout: float, lease: float, src: Any) -> None:
    """The controller elects a dead node's logs elsewhere only after ``node_timeout``; the
    node's routers must have stopped acking by then (their ``leader_lease`` ran out, plus the
    slack of cluster/controller.py): otherwise two leaders could ack in one epoch."""
    if node_timeout <= lease + LEASE_SLACK:
        raise ConfigError("cluster.node_timeout", f"must exceed cluster.leader_lease ({lease}) "
                          f"+ {LEASE_SLACK} s, got {node_timeout}: a node is declared dead only "
                          "after its routers stopped acknowledging (lower leader_lease or raise "
                          "node_timeout)", src("node_timeout"))


def _derive_raft_ports(nodes: tuple[NodeAddress, ...], routers: int
                       ) -> tuple[tuple[NodeAddress, ...], set[int]]:
    """Raft placement is the default, so a minimal ``[[cluster.nodes]]`` list (id, host, port)
    must work without a Raft port per entry: a node without one gets ``port + routers``, the
    first port after its routers' mesh ports (router r listens on port + r), as the one-host
    shorthand has always done. Derived from the mesh port rather than one fixed port so that
    several nodes on one host (dev, tests) each get their own, and an operator opening a node's
    port range in a firewall opens "mesh base .. base + routers" (Kafka's KRaft likewise needs
    its controller listener on a port of its own, 9093 beside 9092). Returns the nodes and the
    indexes whose port was derived (their collision errors say so)."""
    out, derived = [], set()
    for i, n in enumerate(nodes):
        if not n.raft_port:
            n = NodeAddress(n.id, n.host, n.port, n.port + routers, n.mqtt)
            derived.add(i)
        out.append(n)
    return tuple(out), derived


def _check_raft_ports(nodes: tuple[NodeAddress, ...], routers: int, port_keys: list[str],
                      port_src: list[str | None], path: str | None,
                      derived: set[int] | None = None) -> None:
    """cluster.placement = "raft": every node has a Raft port (its own or derived), inside
    1-65535, clear of every mesh range and other Raft port on its host, and the group has at
    most MAX_RAFT_VOTERS voters (non-voting members are not built yet: docs/replication.md)."""
    if len(nodes) > MAX_RAFT_VOTERS:
        raise ConfigError("cluster.placement", f'"raft" (the default) takes at most '
                          f"{MAX_RAFT_VOTERS} nodes for now (every node votes; the cluster "
                          f'lists {len(nodes)}): set placement = "static" or list fewer nodes',
                          path)
    derived = derived or set()
    for i, n in enumerate(nodes):
        key = port_keys[i].replace(".port", ".raft_port")
        how = (f" (derived: port + cluster.routers, as {key} is not set; set it, or space the "
               "nodes further apart)" if i in derived else "")
        if not 1 <= n.raft_port <= _U16:
            raise ConfigError(key, f"node {_show(n.id)}'s Raft port {n.raft_port}{how} is "
                              f"beyond {_U16}", port_src[i])
        for m in nodes:
            if _same_host(m.host, n.host) and m.port <= n.raft_port <= m.port + routers - 1:
                raise ConfigError(key, f"node {_show(n.id)}'s Raft port {n.raft_port}{how} is "
                                  f"one of node {_show(m.id)}'s mesh ports {m.port}-"
                                  f"{m.port + routers - 1} on host {m.host}", port_src[i])
            if m is not n and _same_host(m.host, n.host) and m.raft_port == n.raft_port:
                raise ConfigError(key, f"node {_show(n.id)}'s Raft port {n.raft_port}{how} is "
                                  f"also node {_show(m.id)}'s on host {m.host}", port_src[i])


def _cluster_secret(secret: str, secret_file: str,
                    src: Callable[[str], str | None]) -> bytes:
    """The link handshake key from cluster.secret or cluster.secret_file (never both: which one
    wins would be a guess). The file's trailing newline is not part of it (``echo`` adds one)."""
    if secret and secret_file:
        raise ConfigError("cluster.secret_file", "set cluster.secret or cluster.secret_file, "
                          "not both", src("secret_file") or src("secret"))
    key, where = "cluster.secret", src("secret")
    if secret_file:
        key, where = "cluster.secret_file", src("secret_file")
        _readable_file(key, secret_file, where)
        with open(secret_file, "rb") as fh:
            data = fh.read().rstrip(b"\r\n")
    else:
        data = secret.encode()
    if data and len(data) < MIN_SECRET_BYTES:
        raise ConfigError(key, f"too short ({len(data)} bytes): at least {MIN_SECRET_BYTES} "
                          "bytes, e.g. `head -c 32 /dev/urandom | base64`", where)
    return data


def _merge_env(environ: Mapping[str, str], values: dict[tuple[str, ...], object],
               sources: dict[tuple[str, ...], str]) -> None:
    known = {_env_name(k): k for k in _all_keys()}
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        text = environ[name]
        parts = name[len(ENV_PREFIX):].lower().split("__")
        full = known.get(name.upper())
        if full is None:
            section = tuple(parts)
            if parts[:2] == [COMMITLOG_SECTION, _RULES_KEY]:
                raise ConfigError(name, "commitlog.rules can only be set in the config file "
                                        "([[commitlog.rules]] tables)", "environment")
            if parts[:2] == [CLUSTER_SECTION, _NODES_KEY]:
                raise ConfigError(name, "cluster.nodes can only be set in the config file "
                                        "([[cluster.nodes]] tables); MESHMQ_NODE__ID picks "
                                        "this node among them", "environment")
            if section in _SCHEMA or section in _PARENTS:
                problem = "names a section, not a key"
            else:
                problem = "names no configuration key"
            hint = _suggest(name.upper(), known) or "; keys look like MESHMQ_MQTT__MAX_INFLIGHT"
            raise ConfigError(name, problem + hint, "environment")
        kind = _SCHEMA[full[:-1]][full[-1]][0]
        try:
            values[full] = kind.from_env(text)
        except _Bad as bad:
            raise ConfigError(_dotted(full), f"expected {bad.expected}, got {_show(text)}",
                              name) from None
        sources[full] = name


def _readable_file(key: str, path: str, source: str | None) -> None:
    try:
        with open(path, "rb"):
            pass
    except IsADirectoryError:
        raise ConfigError(key, f"{json.dumps(path)} is a directory, expected a file",
                          source) from None
    except OSError as exc:
        raise ConfigError(key, f"cannot read {json.dumps(path)}: {exc.strerror}",
                          source) from None


def load_config(path: str | None, environ: Mapping[str, str]) -> NodeConfig:
    """Build the validated ``NodeConfig`` from defaults < file < environment.

    ``path=None`` means built-in single-node defaults (no file needed), still overridable from
    ``environ``. ``environ`` is explicit (pass ``os.environ``) so tests never leak into each other.
    Raises ``ConfigError`` (one line) on the first problem found.
    """
    values: dict[tuple[str, ...], object] = {
        section + (key,): spec[1] for section, keys in _SCHEMA.items() for key, spec in keys.items()
    }
    sources: dict[tuple[str, ...], str] = {}
    rules: tuple[LogRule, ...] | None = None
    nodes: tuple[NodeAddress, ...] | None = None
    bridge_data: object = None
    if path is not None:
        data = _read_toml(path)
        if "bridge" in data:  # [[bridge]]: an array of tables, parsed by meshmq/bridgeconfig.py
            data = dict(data)
            bridge_data = data.pop("bridge")
        rules, nodes = _merge_file(data, path, values)
        sources.update({k: path for k in values if _was_set(data, k)})
    _merge_env(environ, values, sources)

    def get(*key: str) -> Any:
        return values[key]

    def src(*key: str) -> str | None:
        return sources.get(key)

    # Cross-key checks: things no single value can be wrong about.
    tls_bind = get("listener", "tls", "bind")
    if tls_bind:
        for k in ("certfile", "keyfile"):
            if not get("listener", "tls", k):
                raise ConfigError(f"listener.tls.{k}",
                                  "required when listener.tls.bind is set (TLS is enabled)",
                                  src("listener", "tls", "bind"))
        for k in ("certfile", "keyfile", "cafile"):
            if get("listener", "tls", k):
                _readable_file(f"listener.tls.{k}", get("listener", "tls", k),
                               src("listener", "tls", k))

    _check_port_clash(values, sources)
    cluster = _build_cluster(values, sources, nodes, path)

    password_file = get("auth", "password_file")
    acl_file = get("auth", "acl_file")
    try:
        if password_file:
            _readable_file("auth.password_file", password_file, src("auth", "password_file"))
            load_passwords(password_file, warn=False)
        if acl_file:
            _readable_file("auth.acl_file", acl_file, src("auth", "acl_file"))
            load_acl(acl_file)
    except AuthFileError as exc:
        key = "auth.password_file" if exc.path == password_file else "auth.acl_file"
        raise ConfigError(key, exc.detail, exc.where) from None
    if not get("auth", "allow_anonymous") and not password_file:
        raise ConfigError("auth.allow_anonymous",
                          "false with no auth.password_file would reject every client; "
                          "set auth.password_file or allow_anonymous = true",
                          src("auth", "allow_anonymous"))

    _check_admin_files(get, src)

    commitlog = _build_commitlog(values, sources, get("node", "data_dir"),
                                 DEFAULT_RULES if rules is None else rules)

    node_id = get("node", "id")
    cluster_name = cluster.name if cluster is not None else ""
    try:
        bridges = () if bridge_data is None else parse_bridges(bridge_data, node_id,
                                                               cluster_name)
    except BridgeConfigError as exc:
        raise ConfigError(exc.key, exc.problem, path) from None
    broker = BrokerSettings(
        node_id=node_id,
        listeners=ListenerSettings(
            tcp_bind=get("listener", "tcp", "bind") or None,
            tls_bind=tls_bind or None,
            tls_certfile=get("listener", "tls", "certfile") or None,
            tls_keyfile=get("listener", "tls", "keyfile") or None,
            tls_cafile=get("listener", "tls", "cafile") or None,
            ws_bind=get("listener", "ws", "bind") or None,
            ws_path=get("listener", "ws", "path"),
            tcp_max_connections=get("listener", "tcp", "max_connections"),
            tls_max_connections=get("listener", "tls", "max_connections"),
            ws_max_connections=get("listener", "ws", "max_connections"),
            # A cluster node's routers share the MQTT ports (the kernel spreads connections).
            reuse_port=cluster is not None,
        ),
        mqtt=MqttSettings(**{key: values[("mqtt", key)] for key in _SCHEMA[("mqtt",)]}),
        auth=AuthSettings(
            allow_anonymous=get("auth", "allow_anonymous"),
            password_file=password_file or None,
            acl_file=acl_file or None,
            clientid_rule=get("auth", "clientid_rule"),
            clientid_pattern=get("auth", "clientid_pattern"),
            max_concurrent_checks=get("auth", "max_concurrent_checks"),
            max_failures=get("auth", "max_failures"),
            failure_window=get("auth", "failure_window"),
            max_address_failures=get("auth", "max_address_failures"),
        ),
    )
    return NodeConfig(
        node_id=node_id,
        data_dir=get("node", "data_dir"),
        broker=broker,
        admin_bind=get("admin", "bind"),
        admin_token_file=get("admin", "token_file") or None,
        admin_certfile=get("admin", "certfile") or None,
        admin_keyfile=get("admin", "keyfile") or None,
        log_level=get("log", "level"),
        log_format=get("log", "format"),
        commitlog=commitlog,
        cluster=cluster,
        bridges=bridges,
    )


def _check_admin_files(get: Callable[..., Any], src: Callable[..., str | None]) -> None:
    """admin.token_file parses; admin.certfile and admin.keyfile come together and load."""
    token_file = get("admin", "token_file")
    if token_file:
        _readable_file("admin.token_file", token_file, src("admin", "token_file"))
        try:
            load_tokens(token_file)
        except TokenFileError as exc:
            raise ConfigError("admin.token_file", str(exc), src("admin", "token_file")) from None
    cert, key = get("admin", "certfile"), get("admin", "keyfile")
    if bool(cert) != bool(key):
        missing = "admin.keyfile" if cert else "admin.certfile"
        raise ConfigError(missing, "admin.certfile and admin.keyfile go together (HTTPS needs "
                          "both)", src(*missing.split(".")))
    if cert:
        for k in ("certfile", "keyfile"):
            _readable_file(f"admin.{k}", get("admin", k), src("admin", k))
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError("admin.certfile", f"cannot load the certificate and key: {exc}",
                              src("admin", "certfile")) from None


def _build_commitlog(values: Mapping[tuple[str, ...], object],
                     sources: Mapping[tuple[str, ...], str], data_dir: str,
                     rules: tuple[LogRule, ...]) -> CommitLogConfig:
    """Assemble ``CommitLogConfig``; LogSettings' own checks become ConfigErrors too."""
    names = [f.name for f in fields(LogSettings)]
    try:
        settings = LogSettings(**{n: values[(COMMITLOG_SECTION, n)] for n in names})
    except ValueError as exc:  # the kinds above check the same bounds; this is a backstop
        field_name = next((n for n in names if str(exc).startswith(n)), "")
        key = (COMMITLOG_SECTION, field_name) if field_name else (COMMITLOG_SECTION,)
        raise ConfigError(_dotted(key), str(exc), sources.get(key)) from None
    directory = values[(COMMITLOG_SECTION, "dir")]
    assert isinstance(directory, str)
    return CommitLogConfig(
        enabled=bool(values[(COMMITLOG_SECTION, "enabled")]),
        directory=directory or os.path.join(data_dir, COMMITLOG_SUBDIR),
        settings=settings,
        rules=rules,
    )


def _was_set(data: Mapping[str, Any], key: tuple[str, ...]) -> bool:
    node: Any = data
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _check_port_clash(values: Mapping[tuple[str, ...], object],
                      sources: Mapping[tuple[str, ...], str]) -> None:
    """Two listeners on one port fail at bind time with EADDRINUSE; say which keys clash now."""
    binds = [("listener", "tcp", "bind"), ("listener", "tls", "bind"), ("listener", "ws", "bind"),
             ("admin", "bind")]
    seen: list[tuple[tuple[str, ...], str, int]] = []
    wildcard = {"0.0.0.0", "::"}
    for key in binds:
        text = values[key]
        if not isinstance(text, str) or not text:
            continue
        host, port = parse_bind(text)
        if port == 0:
            continue
        for other, ohost, oport in seen:
            if oport == port and (host == ohost or host in wildcard or ohost in wildcard):
                raise ConfigError(_dotted(key),
                                  f"port {port} is already used by {_dotted(other)}; "
                                  "each listener needs its own port", sources.get(key))
        seen.append((key, host, port))


def env_names() -> list[str]:
    """Every accepted ``MESHMQ_...`` variable name (for docs and the CLI's error hints)."""
    return sorted(_env_name(k) for k in _all_keys())


def defaults() -> NodeConfig:
    """The built-in single-node configuration, i.e. ``load_config(None, {})``."""
    return load_config(None, {})
