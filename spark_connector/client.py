"""The connector's only door to meshmq: the admin HTTP fetch API (``meshmq/fetch_api.py``).

Everything the source asks a node goes through ``LogClient`` (list the logs, fetch records from
offsets, find an offset by time). Records are read with the many-device fetch
(``POST /api/v1/fetch``, ``fetch_many``): one request serves every device range of a Spark
partition, up to a byte budget, and each device's section says where its log stands
(``log_start``, ``high_watermark``, ``durable_end``). Only records below the high-water mark
are ever in a section (the server's rule; ``high_watermark`` is what ``list_logs`` reports and
what the driver plans with), so a reader never sees a record a replica could still lose.
Names are the store's (issue 26); the server's deprecated ones (JSON ``start``/``end``,
headers ``X-Meshmq-Start``/``X-Meshmq-End``) are read when the new ones are absent, so this
connector also reads a server of the previous release.
The per-device ``GET .../records`` is kept for ``offset_for_timestamp`` (startingTimestamp).

Why plain ``http.client`` and not a library: the connector runs inside every Spark Python worker
and must add nothing heavier than pyarrow; one keep-alive connection per ``LogClient`` is all we
need, and the body is the store's own framing (decoded by ``commitlog.fetch``), not JSON.

Failover: ``servers`` are tried in turn, starting from the one that answered last. A connection
error, a timeout or a 5xx moves to the next server; 4xx answers are facts about the request
(unknown device, offset out of range) and are returned as such. Only committed records are ever
served by a node, so any server that answers gives a correct (possibly older) view; Spark's
offsets decide what is read, so switching servers mid-query neither skips nor repeats a record.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from dataclasses import dataclass
from urllib.parse import quote

from commitlog.fetch import DeviceFetch, decode_multi_fetch
from spark_connector.options import HttpAuth

# Devices per page of GET /api/v1/logs (the server's maximum page).
LIST_PAGE = 10_000

__all__ = ["LogClient", "LogRange", "FetchResult", "ServerUnavailable", "OffsetOutOfRange",
           "UnknownDevice", "AuthenticationFailed", "MAX_DEVICES_PER_REQUEST"]

log = logging.getLogger("spark_connector.client")

LOGS_PATH = "/api/v1/logs"
FETCH_PATH = "/api/v1/fetch"
# The fetch API's own caps (meshmq/fetch_api.py MAX_MAX_RECORDS, MAX_FETCH_DEVICES).
MAX_RECORDS_PER_REQUEST = 100_000
MAX_DEVICES_PER_REQUEST = 10_000


class ServerUnavailable(ConnectionError):
    """No server in ``servers`` answered within the request timeout."""


class AuthenticationFailed(Exception):
    """The node refused the credentials (401) or the reader's ACL (403): a configuration to
    fix, never a server to fail over from (issue 27: it used to surface as ServerUnavailable).
    The message names the node, the identity and the option to set."""


class UnknownDevice(LookupError):
    """The node has no committed record for this device (never published, or its log is gone)."""


class OffsetOutOfRange(LookupError):
    """416: the offset is below the first retained one (retention) or past the end."""

    def __init__(self, message: str, offset: int, start: int, end: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.start = start
        self.end = end


@dataclass(frozen=True)
class LogRange:
    """A device log's committed range: ``start`` first retained offset, ``end`` high-water mark."""

    start: int
    end: int


@dataclass(frozen=True)
class FetchResult:
    body: bytes
    count: int
    next_offset: int
    start: int
    end: int


class LogClient:
    """Blocking client of one or more nodes' fetch API. Not thread-safe; cheap to build, holds
    no connection until the first request (so objects holding one pickle only while idle)."""

    def __init__(self, servers: tuple[tuple[str, int], ...], timeout_s: float = 30.0,
                 auth: HttpAuth | None = None) -> None:
        if not servers:
            raise ValueError("no servers")
        self.servers = servers
        self.timeout_s = timeout_s
        self.auth = auth
        self._authorization = auth.header() if auth is not None else None
        self._current = 0
        self._conn: http.client.HTTPConnection | None = None

    # -- requests ---------------------------------------------------------------------------
    def list_logs(self) -> dict[str, LogRange]:
        """Every device with a committed record: {device: LogRange}. The listing is paged
        (``next_after`` while more pages follow): every page is read, or devices past the
        first page would silently never be read. In a cluster any node lists every router's
        logs; a page naming ``unreachable`` routers lacks their logs, and planning with it
        would take those devices for gone (a data-loss failure, or skipped data), so it
        raises ServerUnavailable naming them instead."""
        out: dict[str, LogRange] = {}
        after: str | None = None
        while True:
            path = f"{LOGS_PATH}?limit={LIST_PAGE}"
            if after is not None:
                path += "&after=" + quote(after, safe="")
            status, _, body = self._get(path)
            if status != 200:
                raise ServerUnavailable(f"GET {path} answered HTTP {status}: {body[:200]!r}")
            page = json.loads(body)
            if page.get("unreachable"):
                raise ServerUnavailable(
                    f"GET {LOGS_PATH}: the listing lacks the logs of routers that did not "
                    f"answer: {page['unreachable']}")
            for e in page["logs"]:
                out[e["device"]] = LogRange(*_range_of(e))
            after = page.get("next_after")
            if after is None:
                return out

    def fetch_many(self, positions: list[tuple[str, int]], max_records_per_device: int,
                   max_bytes: int) -> list[DeviceFetch]:
        """Committed records of several devices, each from its offset: one section per
        device in request order (``commitlog.fetch.decode_multi_fetch``; records left
        encoded). ``max_bytes`` is the budget of the whole response: devices after it is
        spent come back ``ok`` with no records (ask again). Range problems are per section
        (``status``), not exceptions: the caller decides what data loss means."""
        if not 1 <= len(positions) <= MAX_DEVICES_PER_REQUEST:
            raise ValueError(f"fetch_many takes 1 to {MAX_DEVICES_PER_REQUEST} devices")
        body = json.dumps({
            "devices": [{"device": d, "offset": int(o)} for d, o in positions],
            "max_records_per_device": max(1, min(max_records_per_device,
                                                 MAX_RECORDS_PER_REQUEST)),
            "max_bytes": max(1, max_bytes),
        }).encode()
        status, _, data = self._request("POST", FETCH_PATH, body)
        if status != 200:
            raise ValueError(f"POST {FETCH_PATH} answered HTTP {status}: "
                             f"{_json_or_text(data)!r}")
        sections = decode_multi_fetch(data)
        if [s.device for s in sections] != [d for d, _ in positions]:
            raise ValueError(f"POST {FETCH_PATH}: the sections do not match the devices asked")
        return sections

    def offset_for_timestamp(self, device: str, timestamp_us: int) -> int:
        """First offset whose record timestamp is >= ``timestamp_us`` (the end if none)."""
        res = self._records(device, f"timestamp_us={timestamp_us}&max_records=1")
        return res.next_offset - 1 if res.count else res.next_offset

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_conn"] = None  # no socket travels to a worker: each opens its own
        return state

    # -- plumbing ---------------------------------------------------------------------------
    def _records(self, device: str, query: str) -> FetchResult:
        path = f"{LOGS_PATH}/{quote(device, safe='')}/records?{query}"
        status, headers, body = self._get(path)
        if status == 200:
            return FetchResult(body, int(headers["x-meshmq-record-count"]),
                               int(headers["x-meshmq-next-offset"]),
                               int(headers.get("x-meshmq-log-start", headers["x-meshmq-start"])),
                               int(headers.get("x-meshmq-high-watermark",
                                               headers["x-meshmq-end"])))
        info = _json_or_text(body)
        if status == 404:
            raise UnknownDevice(f"device {device!r} has no log on the server")
        if status == 416 and isinstance(info, dict):
            raise OffsetOutOfRange(str(info.get("error")), int(info["offset"]),
                                   *_range_of(info))
        raise ValueError(f"fetch of {device!r} answered HTTP {status}: {info!r}")

    def _get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return self._request("GET", path)

    def _request(self, method: str, path: str, body: bytes | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        """A request with failover; 5xx and connection errors move on to the next server until
        every server has failed within one request timeout (then ServerUnavailable). Every
        request here is a read, so repeating it on another server is safe."""
        deadline = time.monotonic() + self.timeout_s
        errors: list[str] = []
        attempt = 0
        while True:
            host, port = self.servers[self._current]
            try:
                conn = self._conn
                if conn is None:
                    left = max(0.5, deadline - time.monotonic())
                    conn = self._conn = self._connect(host, port, left)
                headers = {"Connection": "keep-alive"}
                if self._authorization is not None:
                    headers["Authorization"] = self._authorization
                if body is not None:
                    headers["Content-Type"] = "application/json"
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                got = {k.lower(): v for k, v in resp.getheaders()}
                if resp.status in (401, 403):
                    self.close()
                    raise self._refused(resp.status, f"{host}:{port}", path, data)
                if resp.status < 500:
                    if resp.will_close:
                        self.close()
                    return resp.status, got, data
                errors.append(f"{host}:{port} HTTP {resp.status}")
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{host}:{port} {exc!r}")
            self.close()
            attempt += 1
            self._current = (self._current + 1) % len(self.servers)
            if time.monotonic() >= deadline:
                raise ServerUnavailable(
                    f"no meshmq server answered {method} {path.split('?')[0]} within "
                    f"{self.timeout_s:g}s: " + "; ".join(errors[-len(self.servers):]))
            if attempt % len(self.servers) == 0:  # every server failed once: back off a little
                log.warning("meshmq servers unavailable, retrying: %s", errors[-1])
                time.sleep(min(1.0, 0.05 * attempt))


    def _connect(self, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        auth = self.auth
        if auth is None or not auth.tls:
            return http.client.HTTPConnection(host, port, timeout=timeout)
        import ssl

        ctx = ssl.create_default_context(cafile=auth.cafile)
        if auth.insecure:  # option insecure: no certificate or name check (tests, labs)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)

    def _refused(self, status: int, node: str, path: str, body: bytes) -> AuthenticationFailed:
        who = self.auth.who() if self.auth is not None else "no credentials"
        info = _json_or_text(body)
        why = info.get("error") if isinstance(info, dict) else info
        if status == 401:
            fix = ("set the options username and password (an MQTT user of the node's "
                   "auth.password_file) or token / tokenFile (a token of admin.token_file)")
            what = "authentication failed" if self._authorization else \
                "the node requires credentials"
            return AuthenticationFailed(f"meshmq node {node}: {what} for {who} (HTTP 401 on "
                                        f"{path.split('?')[0]}: {why}): {fix}")
        return AuthenticationFailed(
            f"meshmq node {node}: authorization failed for {who} (HTTP 403 on "
            f"{path.split('?')[0]}: {why}): the node's ACL must let it read (subscribe to) "
            "the devices' topics, e.g. 'topic read devices/#'")


def _json_or_text(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return body[:200]


def _range_of(entry: dict) -> tuple[int, int]:
    """``(log_start, high_watermark)`` of a listing entry or a 416 body; a server of the
    previous release names them ``start`` and ``end`` (deprecated there, one release)."""
    return (int(entry["log_start"] if "log_start" in entry else entry["start"]),
            int(entry["high_watermark"] if "high_watermark" in entry else entry["end"]))
