"""``[[bridge]]``: connections from this broker to another MQTT broker (Mosquitto's bridge model).

Parsed and checked once at start-up (``meshmq/config.py`` calls ``parse_bridges`` and turns a
``BridgeConfigError`` into its one-line ``ConfigError``, exit 2 naming the key, e.g.
``bridge[0].topics[1].direction``). The keys follow Mosquitto's bridge settings (``address``,
``remote_clientid``, ``bridge_cafile``, ``bridge_insecure``, ``topic pattern direction qos
local_prefix remote_prefix``) in TOML form; what each does is in ``config.example.toml``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from broker.protocol.topics import has_wildcards, is_valid_topic_filter

DIRECTIONS = ("out", "in", "both")
PROTOCOLS = {"mqttv5": 5, "mqttv311": 4}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

_BRIDGE_KEYS = ("name", "address", "protocol", "client_id", "username", "password_file", "tls",
                "cafile", "certfile", "keyfile", "insecure", "keepalive", "reconnect_min",
                "reconnect_max", "topics")
_TOPIC_KEYS = ("pattern", "direction", "qos", "local_prefix", "remote_prefix")


class BridgeConfigError(ValueError):
    """``key`` (dotted, with indexes) and what is wrong with it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class BridgeTopic:
    pattern: str
    direction: str  # "out" | "in" | "both"
    qos: int
    local_prefix: str = ""
    remote_prefix: str = ""

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    @property
    def outbound(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def inbound(self) -> bool:
        return self.direction in ("in", "both")


@dataclass(frozen=True)
class BridgeConfig:
    name: str
    host: str
    port: int
    level: int  # MQTT protocol level: 5 or 4
    client_id: str
    topics: tuple[BridgeTopic, ...]
    username: str | None = None
    password: bytes | None = None  # read from password_file at start-up
    tls: bool = False
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False
    keepalive: int = 60
    reconnect_min: float = 1.0
    reconnect_max: float = 30.0

    @property
    def local_client_id(self) -> str:
        """The client id of the bridge's own session on this broker (its outbound position)."""
        return f"$bridge/{self.name}"


def _show(value: object) -> str:
    return json.dumps(value, default=str)


def _str(table: dict, key: str, where: str, default: str | None = None,
         required: bool = False) -> str | None:
    value = table.get(key, default)
    if value is None:
        if required:
            raise BridgeConfigError(f"{where}.{key}", "required")
        return None
    if not isinstance(value, str):
        raise BridgeConfigError(f"{where}.{key}", f"expected a string, got {_show(value)}")
    return value


def _bool(table: dict, key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise BridgeConfigError(f"{where}.{key}", f"expected true or false, got {_show(value)}")
    return value


def _number(table: dict, key: str, where: str, default: float, lo: float, hi: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BridgeConfigError(f"{where}.{key}",
                                f"expected a number between {lo:g} and {hi:g}, got {_show(value)}")
    return value


def _file(table: dict, key: str, where: str) -> str | None:
    path = _str(table, key, where)
    if path is None or path == "":
        return None
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise BridgeConfigError(f"{where}.{key}", f"cannot read file {_show(path)}")
    return path


def _unknown(table: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise BridgeConfigError(f"{where}.{key}", "unknown key; allowed: " + ", ".join(allowed))


def _topic(item: object, where: str) -> BridgeTopic:
    if not isinstance(item, dict):
        raise BridgeConfigError(where, "expected a table ([[bridge.topics]] with pattern, "
                                       "direction, qos, local_prefix, remote_prefix)")
    _unknown(item, _TOPIC_KEYS, where)
    pattern = _str(item, "pattern", where, required=True)
    if not pattern or not is_valid_topic_filter(pattern) or pattern.startswith("$share/"):
        raise BridgeConfigError(f"{where}.pattern",
                                f"expected an MQTT topic filter (e.g. \"devices/#\"), got "
                                f"{_show(pattern)}")
    direction = _str(item, "direction", where, default="out")
    if direction not in DIRECTIONS:
        raise BridgeConfigError(f"{where}.direction",
                                f"expected one of {', '.join(DIRECTIONS)}, got {_show(direction)}")
    qos = item.get("qos", 1)
    if isinstance(qos, bool) or qos not in (0, 1):
        raise BridgeConfigError(f"{where}.qos",
                                f"expected 0 or 1, got {_show(qos)} (QoS 2 is not bridged: QoS 1 "
                                "is at least once end to end, which the bridge guarantees)")
    prefixes = {}
    for key in ("local_prefix", "remote_prefix"):
        prefix = _str(item, key, where, default="") or ""
        if has_wildcards(prefix) or "\0" in prefix:
            raise BridgeConfigError(f"{where}.{key}", "must not contain + or # (a topic "
                                                      f"prefix), got {_show(prefix)}")
        if prefix and not is_valid_topic_filter(prefix + pattern):
            raise BridgeConfigError(f"{where}.{key}",
                                    f"{_show(prefix)} + pattern is not a valid filter")
        prefixes[key] = prefix
    return BridgeTopic(pattern, direction, int(qos), **prefixes)


def _bridge(item: object, where: str, owner: str) -> BridgeConfig:
    if not isinstance(item, dict):
        raise BridgeConfigError(where, "expected a table ([[bridge]] with name, address and "
                                       "[[bridge.topics]])")
    _unknown(item, _BRIDGE_KEYS, where)
    name = _str(item, "name", where, required=True)
    if not _NAME.fullmatch(name or ""):
        raise BridgeConfigError(f"{where}.name", "expected 1-64 characters of A-Z a-z 0-9 _ . - "
                                                 f"(it names metrics and a $SYS topic), got "
                                                 f"{_show(name)}")
    address = _str(item, "address", where, required=True) or ""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65_535:
        raise BridgeConfigError(f"{where}.address",
                                f"expected \"host:port\", got {_show(address)}")
    protocol = _str(item, "protocol", where, default="mqttv5")
    if protocol not in PROTOCOLS:
        raise BridgeConfigError(f"{where}.protocol",
                                f"expected one of {', '.join(PROTOCOLS)}, got {_show(protocol)}")
    client_id = _str(item, "client_id", where, default=f"{owner}.{name}") or ""
    if not client_id or len(client_id.encode()) > 65_535:
        raise BridgeConfigError(f"{where}.client_id", "expected a non-empty client id")
    username = _str(item, "username", where) or None
    password = None
    password_file = _file(item, "password_file", where)
    if password_file:
        with open(password_file, "rb") as f:
            lines = f.read().splitlines()
        password = lines[0] if lines else b""  # the first line, as mosquitto_passwd users expect
    cafile = _file(item, "cafile", where)
    certfile = _file(item, "certfile", where)
    keyfile = _file(item, "keyfile", where)
    if bool(certfile) != bool(keyfile):
        missing = "keyfile" if certfile else "certfile"
        raise BridgeConfigError(f"{where}.{missing}",
                                "certfile and keyfile go together (a client certificate)")
    tls = _bool(item, "tls", where, bool(cafile or certfile))
    insecure = _bool(item, "insecure", where, False)
    keepalive = int(_number(item, "keepalive", where, 60, 0, 65_535))
    if "keepalive" in item and not isinstance(item["keepalive"], int):
        raise BridgeConfigError(f"{where}.keepalive", "expected an integer of seconds")
    rmin = float(_number(item, "reconnect_min", where, 1.0, 0.01, 3600))
    rmax = float(_number(item, "reconnect_max", where, 30.0, 0.01, 86_400))
    if rmin > rmax:
        raise BridgeConfigError(f"{where}.reconnect_min", "must not exceed reconnect_max")
    topics = item.get("topics")
    if not isinstance(topics, list) or not topics:
        raise BridgeConfigError(f"{where}.topics", "required: at least one [[bridge.topics]] "
                                                   "with a pattern and a direction")
    parsed = tuple(_topic(t, f"{where}.topics[{i}]") for i, t in enumerate(topics))
    return BridgeConfig(name=name or "", host=host, port=int(port_text),
                        level=PROTOCOLS[protocol or "mqttv5"], client_id=client_id,
                        topics=parsed, username=username, password=password, tls=tls,
                        cafile=cafile, certfile=certfile, keyfile=keyfile, insecure=insecure,
                        keepalive=keepalive, reconnect_min=rmin, reconnect_max=rmax)


def parse_bridges(value: object, node_id: str, cluster_name: str = ""
                  ) -> tuple[BridgeConfig, ...]:
    """The file's ``[[bridge]]`` array, checked; raises ``BridgeConfigError``.

    The default remote client id is ``<cluster.name>.<name>`` in a cluster and
    ``<node.id>.<name>`` on a single node. In a cluster the bridge moves between nodes (its
    router dies, a rolling restart) and must come back to the *same* session at the remote:
    that session (clean start 0) is where the remote keeps the inbound messages published while
    the bridge moved, and a second client id per node would leave them queued for a client
    that never comes back (and queue everything again for it at the remote while another node
    runs the bridge). Mosquitto's ``remote_clientid`` and EMQX's bridge ``clientid`` are per
    bridge, not per node, for the same reason."""
    if not isinstance(value, list):
        raise BridgeConfigError("bridge", "expected an array of tables ([[bridge]] sections)")
    out = []
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        bridge = _bridge(item, f"bridge[{i}]", cluster_name or node_id)
        if bridge.name in seen:
            raise BridgeConfigError(f"bridge[{i}].name",
                                    f"duplicate bridge name {_show(bridge.name)} (also "
                                    f"bridge[{seen[bridge.name]}])")
        seen[bridge.name] = i
        out.append(bridge)
    return tuple(out)
