"""Options of ``format("meshmq")``, parsed and validated once, when the data source is built.

Why validate in the data source's constructor: Spark builds the Python ``DataSource`` inside
``load()`` (to ask for its schema), so an error raised here fails ``load()`` itself, naming the
option, before a query is started and a checkpoint written. Spark's own Kafka source does the
same (``KafkaSourceProvider.validateStreamOptions``); a typo that silently falls back to a
default (``maxRecordPerTrigger``) is the classic way to run an unbounded first batch.

Spark hands Python sources a case-insensitive dict of strings with lower-cased keys, so every
key below is compared lower-cased and messages use the documented camelCase spelling. An
unknown key is shown as it arrived (lower-cased by Spark; as written when the options come
from Python directly) with the closest known option in its documented spelling.

Kafka's names are accepted as aliases with the same meaning (issue 27: Spark users coming from
the Kafka source type them): ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``,
``subscribePattern`` (a device regex here), ``startingOffsetsByTimestamp`` (per device).
Credentials for a node with admin authentication: ``username``/``password`` (HTTP Basic, an
MQTT user of ``auth.password_file``) or ``token``/``tokenFile`` (bearer, ``admin.token_file``);
HTTPS with ``caFile`` (alias ``ssl.cafile``) and ``insecure``, or ``https://`` servers.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "OptionError",
    "SourceOptions",
    "SinkOptions",
    "parse_source_options",
    "parse_sink_options",
    "parse_servers",
    "unknown_option",
    "ALIASES",
    "KNOWN_KEYS",
    "OPTION_KEYS",
    "HttpAuth",
    "EARLIEST",
    "LATEST",
]

# Per-device sentinels in startingOffsets / endingOffsets JSON (Kafka's convention).
EARLIEST = -2
LATEST = -1

DEFAULT_ADMIN_SERVER = "127.0.0.1:9883"
DEFAULT_MQTT_SERVER = "127.0.0.1:1883"

# Keys Spark itself may put into a source's or sink's options; accepted and ignored.
_SPARK_KEYS = {"path", "checkpointlocation", "queryname"}

_SOURCE_KEYS = {
    "servers", "devices", "devicepattern", "topicfilter", "startingoffsets",
    "startingtimestamp", "endingoffsets", "maxrecordspertrigger", "minrecordspertrigger",
    "maxtriggerdelay", "failondataloss", "includeheaders", "maxrecordsperpartition",
    "fetchmaxbytes", "requesttimeout",
    # issue 27: credentials and HTTPS for a node with admin authentication
    "username", "password", "token", "tokenfile", "cafile", "insecure",
    "startingoffsetsbytimestamp",
}
# Kafka source names -> ours (same meaning): accepted as written in a Kafka job
ALIASES = {"maxoffsetspertrigger": "maxrecordspertrigger",
           "minoffsetspertrigger": "minrecordspertrigger",
           "subscribepattern": "devicepattern",
           "ssl.cafile": "cafile"}
_SINK_KEYS = {"servers", "clientid", "username", "password", "requesttimeout", "maxinflight",
              "cafile", "insecure"}  # issue 27: TLS to the MQTT listener
_CAMEL = {k.lower(): k for k in (
    "servers", "devices", "devicePattern", "topicFilter", "startingOffsets",
    "startingTimestamp", "endingOffsets", "maxRecordsPerTrigger", "minRecordsPerTrigger",
    "maxTriggerDelay", "failOnDataLoss", "includeHeaders", "maxRecordsPerPartition",
    "fetchMaxBytes", "requestTimeout", "clientId", "username", "password", "maxInflight",
    "token", "tokenFile", "caFile", "insecure", "startingOffsetsByTimestamp",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "subscribePattern", "ssl.cafile",
)}

# Every key format("meshmq") takes (source, sink, aliases, Spark's own), lower-cased.
OPTION_KEYS = _SOURCE_KEYS | _SINK_KEYS | set(ALIASES)
KNOWN_KEYS = OPTION_KEYS | _SPARK_KEYS

# The fetch API serves at most 64 MiB per request (meshmq/fetch_api.py MAX_MAX_BYTES).
_MAX_FETCH_BYTES = 64 << 20
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class OptionError(ValueError):
    """A meshmq option that is unknown or does not parse; the message names it."""


@dataclass(frozen=True)
class HttpAuth:
    """Credentials and transport of the fetch API client (spark_connector/client.py)."""

    username: str | None = None
    password: str | None = None
    token: str | None = None
    tls: bool = False
    cafile: str | None = None
    insecure: bool = False

    def header(self) -> str | None:
        """The ``Authorization`` header value, None without credentials."""
        if self.token is not None:
            return "Bearer " + self.token
        if self.username is not None:
            import base64

            pair = f"{self.username}:{self.password or ''}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None

    def who(self) -> str:
        """The identity for an error message (never the secret)."""
        if self.token is not None:
            return "the bearer token (option token/tokenFile)"
        if self.username is not None:
            return f"user {self.username!r}"
        return "no credentials"


@dataclass(frozen=True)
class SourceOptions:
    """What the reader needs, typed. See the README's "Spark" section for each option."""

    servers: tuple[tuple[str, int], ...]
    devices: tuple[str, ...] | None = None
    device_pattern: str | None = None
    topic_filter: str | None = None
    # "earliest" | "latest" | {device: offset or EARLIEST/LATEST}
    starting_offsets: str | dict[str, int] | None = None
    starting_timestamp_ms: int | None = None
    ending_offsets: str | dict[str, int] = "latest"
    ending_offsets_given: bool = False
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_s: float = 15 * 60.0
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_records_per_partition: int = 250_000
    fetch_max_bytes: int = 16 << 20
    request_timeout_s: float = 30.0
    extra: dict[str, str] = field(default_factory=dict)
    # {device: ms since the epoch} (startingOffsetsByTimestamp); devices left out: earliest
    starting_timestamps_ms: dict[str, int] | None = None
    # who reads (a node with admin authentication) and how (HTTPS)
    auth: HttpAuth | None = None

    def wants(self, device: str) -> bool:
        """Whether ``device`` is selected by ``devices`` / ``devicePattern`` (all when neither)."""
        if self.devices is not None:
            return device in self.devices
        if self.device_pattern is not None:
            return re.fullmatch(self.device_pattern, device) is not None
        return True


@dataclass(frozen=True)
class SinkOptions:
    """Where and how the sink publishes (MQTT listeners, not the admin HTTP)."""

    servers: tuple[tuple[str, int], ...]
    client_id: str = ""
    username: str | None = None
    password: str | None = None
    request_timeout_s: float = 30.0
    max_inflight: int = 32
    tls: HttpAuth | None = None  # TLS to the listener (caFile / insecure / mqtts:// servers)


def _name(key: str) -> str:
    return _CAMEL.get(key, key)


def parse_servers(text: str, default_port: int, option: str = "servers"
                  ) -> tuple[tuple[str, int], ...]:
    """``"host1:9883,host2"`` -> ((host1, 9883), (host2, default_port)); [v6]:port works."""
    out: list[tuple[str, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, port_text = item, ""
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise OptionError(f"option {option}: bad address {item!r} (unclosed '[')")
            host, rest = item[1:end], item[end + 1:]
            if rest and not rest.startswith(":"):
                raise OptionError(f"option {option}: bad address {item!r}")
            port_text = rest[1:]
        elif item.count(":") == 1:
            host, port_text = item.split(":")
        if not host:
            raise OptionError(f"option {option}: bad address {item!r} (empty host)")
        port = default_port
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise OptionError(f"option {option}: bad port in {item!r} (1 to 65535)")
            port = int(port_text)
        out.append((host, port))
    if not out:
        raise OptionError(f"option {option}: no server given (e.g. 'host1:9883,host2:9883')")
    return tuple(out)


def _int(opts: Mapping[str, str], key: str, lo: int, hi: int | None = None) -> int | None:
    if key not in opts:
        return None
    text = str(opts[key]).strip()
    if not re.fullmatch(r"-?\d+", text):
        raise OptionError(f"option {_name(key)} must be an integer, got {opts[key]!r}")
    value = int(text)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise OptionError(f"option {_name(key)} must be {bound}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in opts:
        return default
    text = str(opts[key]).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(f"option {_name(key)} must be true or false, got {opts[key]!r}")


def _duration(opts: Mapping[str, str], key: str, default: float) -> float:
    """'500ms', '10s', '5m', '1h' or a bare number of seconds (Kafka's maxTriggerDelay
    takes '15m'-style strings too)."""
    if key not in opts:
        return default
    m = _DURATION.match(str(opts[key]).lower())
    if m is None:
        raise OptionError(f"option {_name(key)} must be a duration like '500ms', '10s' or "
                          f"'15m', got {opts[key]!r}")
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def _offsets_json(opts: Mapping[str, str], key: str, allow_earliest: bool
                  ) -> str | dict[str, int] | None:
    if key not in opts:
        return None
    text = str(opts[key]).strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() == "earliest" and not allow_earliest:
            raise OptionError(f"option {_name(key)}: 'earliest' makes no sense here; use "
                              "'latest' or a JSON object")
        return text.lower()
    try:
        value = json.loads(text)
    except ValueError:
        raise OptionError(f"option {_name(key)} must be 'earliest', 'latest' or a JSON object "
                          f"like {{\"d1\": 0, \"d2\": -2}}, got {text!r}") from None
    if not isinstance(value, dict):
        raise OptionError(f"option {_name(key)} must be a JSON object {{device: offset}}, "
                          f"got {text!r}")
    out: dict[str, int] = {}
    lowest = EARLIEST if allow_earliest else LATEST
    for device, offset in value.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
            raise OptionError(
                f"option {_name(key)}: offset of device {device!r} must be an integer >= 0, "
                + ("-2 (earliest) " if allow_earliest else "")
                + f"or -1 (latest), got {offset!r}")
        out[str(device)] = offset
    return out


def unknown_option(key: str, allowed: set[str], what: str) -> OptionError:
    """The error for an unknown option: the name as it arrived and the closest known one."""
    close = difflib.get_close_matches(key.lower(), sorted(allowed), n=1, cutoff=0.6)
    hint = f" (did you mean {_name(close[0])!r}?)" if close else ""
    names = ", ".join(sorted(_name(a) for a in allowed))
    where = what if what.startswith("format(") else f"the meshmq {what}"
    return OptionError(f"unknown option {key!r} for {where}{hint}; known: {names}")


def _check_keys(opts: Mapping[str, str], allowed: set[str], what: str) -> None:
    for key in opts:
        k = key.lower()
        if k not in allowed and k not in _SPARK_KEYS:
            raise unknown_option(key, allowed, what)


def _resolve_aliases(opts: Mapping[str, str]) -> dict[str, str]:
    """Kafka's names replaced by ours; both spellings of one option is an error."""
    out = dict(opts)
    for alias, ours in ALIASES.items():
        if alias in out:
            if ours in out:
                raise OptionError(f"options {_name(alias)} and {_name(ours)} are the same "
                                  "option; give one")
            out[ours] = out.pop(alias)
    return out


def _http_auth(lower: Mapping[str, str], tls: bool) -> HttpAuth | None:
    user, password = lower.get("username"), lower.get("password")
    token, token_file = lower.get("token"), lower.get("tokenfile")
    if (user is None) != (password is None):
        raise OptionError("options username and password go together (HTTP Basic with an MQTT "
                          "user of the node's auth.password_file)")
    if token is not None and token_file is not None:
        raise OptionError("options token and tokenFile exclude each other; give one")
    if token_file is not None:
        token = _read_token_file(token_file)
    if user is not None and token is not None:
        raise OptionError("options username/password and token/tokenFile exclude each other")
    cafile = lower.get("cafile")
    insecure = _bool(lower, "insecure", False)
    if cafile is not None:
        try:
            with open(cafile, "rb"):
                pass
        except OSError as exc:
            raise OptionError(f"option caFile: cannot read {cafile!r}: {exc.strerror}") from None
    tls = tls or cafile is not None or insecure
    if user is None and token is None and not tls:
        return None
    return HttpAuth(user, password, token, tls, cafile, insecure)


def _read_token_file(path: str) -> str:
    """The token of a file holding it alone, or ``name:token`` lines as admin.token_file
    (the first one), as ``meshmq log --token-file`` reads it."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [ln.strip() for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    except OSError as exc:
        raise OptionError(f"option tokenFile: cannot read {path!r}: {exc.strerror}") from None
    if not lines:
        raise OptionError(f"option tokenFile: no token in {path!r}")
    return lines[0].rpartition(":")[2]


def _strip_scheme(text: str) -> tuple[str, bool]:
    """``servers`` may name ``https://host:port`` (every server then speaks HTTPS)."""
    items = [s.strip() for s in text.split(",")]
    tls = any(s.startswith("https://") for s in items)
    if tls and not all(s.startswith("https://") for s in items if s):
        raise OptionError("option servers: give https:// for every server or for none")
    return ",".join(s.removeprefix("https://").removeprefix("http://").rstrip("/")
                    for s in items), tls


def parse_source_options(opts: Mapping[str, str]) -> SourceOptions:
    """Validate the reader's options (stream and batch share them); OptionError naming the
    first bad one."""
    lower = {k.lower(): str(v) for k, v in opts.items()}
    for key in opts:  # unknown ones named as they arrived (Spark lower-cases them)
        k = key.lower()
        if k not in _SOURCE_KEYS and k not in ALIASES and k not in _SPARK_KEYS:
            raise unknown_option(key, _SOURCE_KEYS | set(ALIASES), "source")
    lower = _resolve_aliases(lower)
    server_text, tls = _strip_scheme(lower.get("servers", DEFAULT_ADMIN_SERVER))
    servers = parse_servers(server_text, 9883)
    devices = None
    if "devices" in lower:
        devices = tuple(sorted({d.strip() for d in lower["devices"].split(",") if d.strip()}))
        if not devices:
            raise OptionError("option devices: give at least one device id")
    pattern = lower.get("devicepattern")
    if pattern is not None:
        if devices is not None:
            raise OptionError("options devices and devicePattern exclude each other; give one")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option devicePattern is not a valid regex: {exc}") from None
    topic_filter = lower.get("topicfilter")
    if topic_filter is not None:
        _check_filter(topic_filter)
    starting = _offsets_json(lower, "startingoffsets", allow_earliest=True)
    ts = _int(lower, "startingtimestamp", 0)
    if ts is not None and starting is not None:
        raise OptionError("options startingOffsets and startingTimestamp exclude each other")
    by_ts = _timestamps_json(lower)
    if by_ts is not None and (starting is not None or ts is not None):
        raise OptionError("option startingOffsetsByTimestamp excludes startingOffsets and "
                          "startingTimestamp")
    ending = _offsets_json(lower, "endingoffsets", allow_earliest=False)
    max_rpt = _int(lower, "maxrecordspertrigger", 1)
    min_rpt = _int(lower, "minrecordspertrigger", 1)
    if max_rpt is not None and min_rpt is not None and min_rpt > max_rpt:
        raise OptionError(f"option minRecordsPerTrigger ({min_rpt}) is larger than "
                          f"maxRecordsPerTrigger ({max_rpt})")
    delay = _duration(lower, "maxtriggerdelay", 15 * 60.0)
    return SourceOptions(
        servers=servers,
        devices=devices,
        device_pattern=pattern,
        topic_filter=topic_filter,
        starting_offsets=starting,
        starting_timestamp_ms=ts,
        ending_offsets=ending if ending is not None else "latest",
        ending_offsets_given=ending is not None,
        max_records_per_trigger=max_rpt,
        min_records_per_trigger=min_rpt,
        max_trigger_delay_s=delay,
        fail_on_data_loss=_bool(lower, "failondataloss", True),
        include_headers=_bool(lower, "includeheaders", False),
        max_records_per_partition=_int(lower, "maxrecordsperpartition", 1) or 250_000,
        fetch_max_bytes=_int(lower, "fetchmaxbytes", 1, _MAX_FETCH_BYTES) or 16 << 20,
        request_timeout_s=_duration(lower, "requesttimeout", 30.0),
        starting_timestamps_ms=by_ts,
        auth=_http_auth(lower, tls),
    )


def _timestamps_json(opts: Mapping[str, str]) -> dict[str, int] | None:
    """startingOffsetsByTimestamp: ``{"d1": 1700000000000, ...}`` (ms since the epoch), as
    Kafka's option but per device instead of per topic partition."""
    key = "startingoffsetsbytimestamp"
    if key not in opts:
        return None
    try:
        value = json.loads(opts[key])
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()):
        raise OptionError(f"option {_name(key)} must be a JSON object {{device: ms since the "
                          f"epoch}} like {{\"d1\": 1700000000000}}, got {opts[key]!r}")
    return {str(d): int(v) for d, v in value.items()}


def parse_sink_options(opts: Mapping[str, str]) -> SinkOptions:
    """Validate the sink's options; OptionError naming the first bad one."""
    lower = {k.lower(): str(v) for k, v in opts.items()}
    _check_keys(lower, _SINK_KEYS | {"ssl.cafile"}, "sink")
    lower = _resolve_aliases(lower)
    text = lower.get("servers", DEFAULT_MQTT_SERVER)
    items = [s.strip() for s in text.split(",")]
    tls = any(s.startswith("mqtts://") for s in items)
    text = ",".join(s.removeprefix("mqtts://").removeprefix("mqtt://") for s in items)
    cafile = lower.get("cafile")
    if cafile is not None:
        try:
            with open(cafile, "rb"):
                pass
        except OSError as exc:
            raise OptionError(f"option caFile: cannot read {cafile!r}: {exc.strerror}") from None
    insecure = _bool(lower, "insecure", False)
    tls = tls or cafile is not None or insecure
    return SinkOptions(
        tls=HttpAuth(tls=True, cafile=cafile, insecure=insecure) if tls else None,
        servers=parse_servers(text, 1883),
        client_id=lower.get("clientid", ""),
        username=lower.get("username"),
        password=lower.get("password"),
        request_timeout_s=_duration(lower, "requesttimeout", 30.0),
        max_inflight=_int(lower, "maxinflight", 1, 65535) or 32,
    )


def _check_filter(text: str) -> None:
    """MQTT filter rules (MQTT 3.1.1 section 4.7): '#' last and alone in its level, '+' alone."""
    if not text:
        raise OptionError("option topicFilter: an MQTT filter cannot be empty")
    levels = text.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise OptionError(f"option topicFilter: '#' must be a whole, last level: {text!r}")
        if "+" in level and level != "+":
            raise OptionError(f"option topicFilter: '+' must be a whole level: {text!r}")
