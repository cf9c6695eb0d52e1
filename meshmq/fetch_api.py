"""The commit-log fetch API: per-device logs over the admin HTTP server.

Why HTTP on the admin server: readers of a device log (Spark, ``meshmq log tail``, tools, later
followers) want "give me records from offset N" with plain pull semantics, the admin server
already runs on the node's event loop, and HTTP needs no client library. The body reuses the
store's record framing (``commitlog.fetch``), so every record keeps its CRC end to end and the
Spark connector decodes it straight into columns.

HTTP contract (all under the admin bind, default ``http://127.0.0.1:9883``)
--------------------------------------------------------------------------

Only **committed** records are visible anywhere in this API: a record appended but not yet
durable (fsynced and committed) is neither served nor counted in ``high_watermark``, the
high-water mark: the first offset not yet committed (``LogStore.high_watermark``, the visible
end every reader stops at). A device that has no committed record yet is unknown (404),
exactly as if it had never published.

**Names** (issue 26; Kafka's, as in ``commitlog/store.py``): ``log_start`` and
``high_watermark`` in JSON, ``X-Meshmq-Log-Start`` and ``X-Meshmq-High-Watermark`` in headers,
``high_watermark`` and ``durable_end`` in fetch sections. **Deprecated, kept for one release**
(same values; readers move to the new names): JSON ``start`` and ``end``, headers
``X-Meshmq-Start`` and ``X-Meshmq-End``, and the decoded attributes ``high_water`` and
``log_end`` (``commitlog/fetch.py``).

``GET /api/v1/logs?after=D&limit=N``
    200 ``application/json``: ``{"logs": [{"device": "d1", "log_start": 0, "high_watermark":
    42, "start": 0, "end": 42}, ...], "next_after": "d1000"}``, one **page** sorted by device:
    the devices after ``D`` (exclusive; default: from the first), at most ``N`` of them (1 to
    10000, default 1000). ``next_after`` is the ``after`` of the next page, absent on the last
    page (100k devices must not be one JSON blob; a page costs O(N), the sorted key list is
    cached until a device is added). ``log_start`` is the first offset still retained
    (retention moves it). ``start`` and ``end`` are the deprecated names of ``log_start`` and
    ``high_watermark``. 400 naming the parameter if bad.

    In a cluster the page covers **every router's** logs: the router asks every other router
    for the same page over the mesh and merges them (``merge_pages``; each device from its
    owner only, paging exact). A router that does not answer is named, with why, under
    ``"unreachable": {"n1/0": "..."}`` (absent when all answered): its logs are missing from
    the page, and a reader must not take them as gone. A request carrying
    ``X-Meshmq-Relayed`` lists only the logs of the router it reaches (what a peer asks for).

    With authentication, a log the reader's read ACL does not allow is not listed, and
    ``"hidden_by_acl": N`` (absent when 0) counts those the page skipped (issue 27): an
    empty page with it means "not allowed", not "no logs" (``meshmq log list`` says so).

``GET /api/v1/logs/{device}``
    200 ``{"device": "d1", "log_start": 0, "high_watermark": 42, "start": 0, "end": 42}``;
    404 ``{"error": "unknown device 'd1'"}``.

``GET /api/v1/logs/{device}/records?offset=N&max_records=M&max_bytes=B``
    200 ``application/octet-stream``: a fetch response (``commitlog.fetch``: 24-byte header with
    record count, log start and high-water mark, then the records) holding the device's committed
    records from ``N`` on, at most ``M`` records and at most ``B`` bytes of records, except that
    the first record is always returned even if it alone is larger than ``B`` (so a reader can
    always make progress). Headers:

    * ``X-Meshmq-Log-Start``: first retained offset; ``X-Meshmq-High-Watermark``: the
      high-water mark (deprecated names, same values: ``X-Meshmq-Start``, ``X-Meshmq-End``);
    * ``X-Meshmq-Next-Offset``: the offset to ask for next (last returned + 1, or ``N`` when
      nothing was returned, or past offsets lost to corruption); ``X-Meshmq-Record-Count``:
      records in the body;
    * ``X-Meshmq-Lost-Offsets`` (only when some were lost): ``lo-hi[,lo-hi...]``, half-open
      ranges of offsets between ``N`` and the next offset that a corrupt record took (found by
      recovery or by a read; quarantined and logged at ERROR by the node). Offsets are never
      reused, so the records around a gap keep theirs. The many-device fetch says the same
      thing by its section's ``offset``, records and ``next_offset``: any offset between the
      first and ``next_offset`` without a record is lost.

    Parameters (all optional, decimal integers):

    * ``offset``: first offset wanted; default = ``log_start``. ``offset == high_watermark``
      is valid and
      returns 200 with zero records (the 24-byte header only): a follower polls this way.
    * ``timestamp_us``: instead of ``offset``, start at the first record whose timestamp
      (µs since the epoch) is ``>=`` it; ``high_watermark`` if there is none. Not together
      with ``offset``.
    * ``max_records``: 1 to 100000, default 1000.
    * ``max_bytes``: 1 to 67108864 (64 MiB), default 1048576 (1 MiB).

    Errors, all ``application/json`` with an ``error`` message:

    * 400 ``{"error": ..., "parameter": "max_records"}``: a parameter that is empty, not an
      integer, negative, outside its range, repeated, unknown, or ``offset`` together with
      ``timestamp_us``; ``parameter`` names it.
    * 404 ``{"error": "unknown device 'd1'"}``.
    * 416 ``{"error": ..., "parameter": "offset", "offset": N, "log_start": S,
      "high_watermark": E, "start": S, "end": E}``: ``N`` is below ``log_start`` (deleted by
      retention: data loss for this reader, restart from ``log_start``) or above
      ``high_watermark`` (the log was truncated, or the offset is from the future).
    * 500 ``{"error": ...}``: a stored record failed its CRC (see ``meshmq log inspect``).

``POST /api/v1/fetch`` (many devices in one request, for Spark and other bulk readers)
    Request body ``application/json`` (at most 1 MiB)::

        {"devices": [{"device": "d1", "offset": 42}, {"device": "d2"}, ...],
         "max_records_per_device": 1000, "max_bytes": 1048576,
         "max_bytes_per_device": 1048576, "max_wait_ms": 0}

    ``devices``: 1 to ``MAX_FETCH_DEVICES`` (10000) entries, each a device and optionally the
    offset to start from (default: its log start), no device twice. ``max_records_per_device``
    1 to 100000 (default 1000); ``max_bytes`` 1 to 64 MiB (default 1 MiB), the budget of the
    whole response; ``max_bytes_per_device`` (default ``max_bytes``); ``max_wait_ms`` 0 to
    30000 (default 0): long-poll: when no device has a record to return, wait until one of
    them commits a new record (or appears) or the time passes, then answer once.

    200 ``application/octet-stream``: a many-device fetch response (``commitlog.fetch``,
    magic ``MQFM``): per device in request order a section header with a ``status``
    (0 ok, 1 offset below the log start: deleted by retention, 2 offset above the
    high-water mark: truncated or from the future, 3 unknown device), the offset asked,
    ``log_start``, ``high_watermark``, ``durable_end`` (one past the last record durable on
    the device's router, >= ``high_watermark``; formerly ``log_end``), ``next_offset``, the
    record count and the records in the record framing (committed records only, as
    everywhere here). Devices
    are served in request order until ``max_bytes`` is used (the first record of the first
    device with data is always served, so a reader always progresses); later devices get
    ``ok`` with no records and ``next_offset`` = the offset asked: rotate the order to be
    fair. Decode with ``commitlog.fetch.decode_multi_fetch`` / ``decode_multi_records``.
    Errors: 400 ``{"error", "parameter"}`` for a malformed body or parameter (``parameter``
    names it, e.g. ``devices[3].offset``); 503 when ``MAX_LONG_POLLS`` (64) long polls already
    wait (a WARNING is logged): retry, or poll without ``max_wait_ms``.

    In a cluster any router answers for every device: the devices are split by owner router,
    each owner reads its own (sent the same request for its devices over the mesh, with the
    caller's ``Authorization``: it authenticates and applies its read ACL itself), and the
    parts are merged into one response, the format, order and budget rules unchanged
    (``_fetch_spread``). A long poll ends when any part has news or the wait ends. A part
    that fails fails the request with its status and ``{"error", "router"}`` naming the
    router: 503 when its link is down, 504 when it did not answer in time, or its own
    4xx/5xx; with ``X-Meshmq-Relayed`` only this router's store is read.

Reads run **on the event loop**, not in an executor: ``LogStore`` is single-threaded by
contract (only ``sync()`` may run on another thread; ``read`` mutates the read-fd cache, the
tail-cache LRU and the stats, and races with ``append``/``commit`` over the tail cache). To keep
one large request from stalling every MQTT client on the node, a request is served in slices
of at most ``READ_SLICE_RECORDS`` records / ``READ_SLICE_BYTES`` bytes with a yield to the loop
in between. The response stays consistent: records are immutable once committed, a reader
racing retention just gets the slices read before its start moved, and one racing a
truncation is read again in one go.

Records are sent as stored (``LogStore.read_raw``): bytes read from the segment files are
checked (framing, key, offset, CRC) and forwarded without being decoded into ``Record`` objects
and encoded again; that round trip cost ~3 µs per record and capped the Spark source near 300k
records/s. The wire format is the store's record framing either way.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple, Protocol
from urllib.parse import urlencode

from aiohttp import web

from commitlog import fetch as _fetch
from commitlog.fetch import encode_fetch_raw
from commitlog.record import HEADER as RECORD_HEADER
from commitlog.record import U32, CorruptRecordError
from commitlog.store import LogStore, OffsetOutOfRangeError
from commitlog.waiters import Watch

__all__ = [
    "register_fetch_routes",
    "attach_cluster",
    "ClusterView",
    "merge_pages",
    "RELAYED_HEADER",
    "LOGS_PATH",
    "FETCH_PATH",
    "MAX_FETCH_DEVICES",
    "MAX_LONG_POLLS",
    "DEFAULT_MAX_RECORDS",
    "MAX_MAX_RECORDS",
    "DEFAULT_MAX_BYTES",
    "MAX_MAX_BYTES",
]

log = logging.getLogger("meshmq.fetch_api")

LOGS_PATH = "/api/v1/logs"
DEFAULT_MAX_RECORDS = 1000
MAX_MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 1 << 20
MAX_MAX_BYTES = 64 << 20
# One slice of a request read between two yields to the event loop (see the module docstring).
# Slices are stored bytes (LogStore.read_raw: pread + CRC check, no decoding), ~0.1-0.3 ms of
# loop time each.
READ_SLICE_RECORDS = 4096
READ_SLICE_BYTES = 256 * 1024

_PARAMS = ("offset", "timestamp_us", "max_records", "max_bytes")
FETCH_PATH = "/api/v1/fetch"
MAX_FETCH_DEVICES = 10_000
MAX_WAIT_MS = 30_000
# Concurrent long polls (each holds one waiter per device it names): bounded, 503 beyond.
MAX_LONG_POLLS = 64
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
# Devices read between two yields to the loop in a many-device fetch.
FETCH_SLICE_DEVICES = 64
# Set on a request one router runs for another (cluster_wiring's relay): it is answered from
# this router's own store only, never relayed or gathered again (no loops, no double counts).
RELAYED_HEADER = "X-Meshmq-Relayed"
# How long a router waits for a peer's listing page or fetch part (beyond any long poll).
RELAY_TIMEOUT_S = 30.0
# Budget of one relayed fetch part: the part travels as one mesh frame (cluster/frames.py
# MAX_FRAME is 64 MiB, headers and section heads included), so a 64 MiB request must not ask
# a peer for a 64 MiB part. The merged response still honours the request's max_bytes.
RELAY_MAX_BYTES = 32 << 20
# A long poll spread over routers waits on each peer in slices of this length: a slice
# abandoned (another part woke the poll) keeps the peer's long-poll slot only this long.
PROBE_SLICE_S = 1.0
_STORE_KEY = web.AppKey("meshmq_log_store", LogStore)
# Whether the request's reader may read a device's log (meshmq/admin_auth.py: the MQTT read ACL);
# absent when the admin server has no authentication.
ReadCheck = Callable[[web.Request, str], bool]
_READ_CHECK_KEY = web.AppKey("meshmq_read_check", ReadCheck)


def _may_read(request: web.Request, device: str) -> bool:
    check = request.app.get(_READ_CHECK_KEY)
    return check is None or check(request, device)


def _denied(device: str) -> web.Response:
    return _json(403, {"error": f"not authorised to read the log of {device!r}"})


class _HttpError(Exception):
    """A request problem, rendered as a JSON body with ``status``."""

    def __init__(self, status: int, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, object] = {"error": message, **extra}


def _json(status: int, body: Mapping[str, object]) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        text=json.dumps(body))


def _int_param(query: Mapping[str, str], name: str, lo: int, hi: int | None) -> int | None:
    """Parse one decimal parameter; None when absent. 400 naming it when it does not fit."""
    if name not in query:
        return None
    text = query[name]
    allowed = f"an integer >= {lo}" if hi is None else f"an integer between {lo} and {hi}"
    t = text.strip()
    if not (t.isascii() and t.lstrip("-").isdigit() and t.count("-") <= 1):
        raise _HttpError(400, f"{name} must be {allowed}, got {text!r}", parameter=name)
    value = int(t)
    if value < lo or (hi is not None and value > hi):
        raise _HttpError(400, f"{name} must be {allowed}, got {value}", parameter=name)
    return value


def _committed_range(store: LogStore, device: str) -> tuple[int, int] | None:
    """(start, end) of a device that has committed something; None for an unknown device
    (including one whose only appends are not committed yet: they must not leak)."""
    if device not in store:
        return None
    start, end = store.log_range(device)
    if end == 0:
        return None
    return start, end


def _log_entry(device: str, log_start: int, high_watermark: int) -> dict[str, object]:
    """A device's range as the listing and the info endpoint give it: the names of the
    store, and the deprecated ``start``/``end`` (same values) for one release, so Spark jobs
    and scripts written against them keep working while they move."""
    return {"device": device, "log_start": log_start, "high_watermark": high_watermark,
            "start": log_start, "end": high_watermark}


def _unknown(device: str) -> _HttpError:
    return _HttpError(404, f"unknown device {device!r}")


def _list_params(query: Mapping[str, str]) -> tuple[str | None, int]:
    """``after`` and ``limit`` of a listing; 400 naming a bad or unknown parameter."""
    for name in query:
        if name not in ("after", "limit"):
            raise _HttpError(400, f"unknown parameter {name!r}; allowed: after, limit",
                             parameter=name)
    return query.get("after"), _int_param(query, "limit", 1, MAX_PAGE) or DEFAULT_PAGE


def _local_page(request: web.Request, store: LogStore, after: str | None, limit: int,
                ) -> tuple[list[dict[str, object]], str | None]:
    """One page of this router's own logs: ``(logs, next_after)``, ``next_after`` None on
    the last page. A page that is not the last holds exactly ``limit`` logs (hidden and
    uncommitted devices are skipped, not counted): the cluster merge relies on it. How many
    the read ACL hid is left in ``request[HIDDEN_KEY]`` (issue 27: an empty listing caused by
    the ACL must say so, or the reader cannot tell it from a node with no logs)."""
    keys = _sorted_keys(request.app, store)
    i = 0 if after is None else bisect.bisect_right(keys, after)
    logs: list[dict[str, object]] = []
    hidden = 0
    while i < len(keys) and len(logs) < limit:
        device = keys[i]
        i += 1
        if not _may_read(request, device):
            hidden += 1
            request[HIDDEN_KEY] = hidden
            continue  # listed only to readers who may read it
        rng = _committed_range(store, device)
        if rng is not None:
            logs.append(_log_entry(device, rng[0], rng[1]))
    if i < len(keys):  # more pages follow (absent on the last page)
        return logs, str(logs[-1]["device"]) if logs else keys[i - 1]
    return logs, None


async def _list_logs(request: web.Request) -> web.Response:
    store = request.app[_STORE_KEY]
    try:
        after, limit = _list_params(request.query)
    except _HttpError as err:
        return _json(err.status, err.body)
    logs, next_after = _local_page(request, store, after, limit)
    view = request.app.get(_CLUSTER_KEY)
    if view is None or RELAYED_HEADER in request.headers:
        page: dict[str, object] = {"logs": logs}
        if next_after is not None:
            page["next_after"] = next_after
        if request.get(HIDDEN_KEY):
            page["hidden_by_acl"] = request[HIDDEN_KEY]
        return _json(200, page)
    return _json(200, await _cluster_page(request, view, logs, next_after, after, limit))


_SORTED_KEY = web.AppKey("meshmq_sorted_keys", dict)
# request key: logs of this page the reader's read ACL hid (``hidden_by_acl`` in the listing)
HIDDEN_KEY = "meshmq_hidden_by_acl"


def _sorted_keys(app: web.Application, store: LogStore) -> list[str]:
    """The store's keys, sorted; re-sorted only when the device count changed (devices
    are never removed from a store, so the count is a version)."""
    cache = app[_SORTED_KEY]
    n = store.device_count
    if cache.get("n") != n:
        cache["keys"] = sorted(store.keys())
        cache["n"] = n
    return cache["keys"]


async def _log_info(request: web.Request) -> web.Response:
    store = request.app[_STORE_KEY]
    device = request.match_info["device"]
    if not _may_read(request, device):
        return _denied(device)
    rng = _committed_range(store, device)
    if rng is None:
        return _json(404, _unknown(device).body)
    return _json(200, _log_entry(device, rng[0], rng[1]))


async def _records(request: web.Request) -> web.Response:
    store = request.app[_STORE_KEY]
    device = request.match_info["device"]
    if not _may_read(request, device):
        return _denied(device)
    try:
        return await _serve_records(store, device, request.query)
    except _HttpError as err:
        return _json(err.status, err.body)
    except CorruptRecordError as exc:
        log.error("fetch API: corrupt record while reading a device log",
                  extra={"device": device, "error": str(exc)})
        return _json(500, {"error": f"corrupt record in the log of {device!r}: {exc}"})


async def _serve_records(store: LogStore, device: str,
                         query: Mapping[str, str]) -> web.Response:
    multi = getattr(query, "getall", None)
    for name in query:
        if name not in _PARAMS:
            raise _HttpError(400, f"unknown parameter {name!r}; allowed: " + ", ".join(_PARAMS),
                             parameter=name)
        if multi is not None and len(multi(name)) > 1:
            raise _HttpError(400, f"{name} given more than once", parameter=name)
    offset = _int_param(query, "offset", 0, None)
    timestamp_us = _int_param(query, "timestamp_us", 0, None)
    max_records = _int_param(query, "max_records", 1, MAX_MAX_RECORDS) or DEFAULT_MAX_RECORDS
    max_bytes = _int_param(query, "max_bytes", 1, MAX_MAX_BYTES) or DEFAULT_MAX_BYTES
    if offset is not None and timestamp_us is not None:
        raise _HttpError(400, "give offset or timestamp_us, not both", parameter="timestamp_us")
    rng = _committed_range(store, device)
    if rng is None:
        raise _unknown(device)
    start, end = rng
    if timestamp_us is not None:
        offset = store.offset_for_timestamp(device, timestamp_us)
    elif offset is None:
        offset = start
    if not start <= offset <= end:
        raise _out_of_range(device, offset, start, end)
    try:
        data, count, next_offset, _ = await _read_raw_sliced(store, device, offset,
                                                             max_records, max_bytes)
    except OffsetOutOfRangeError as exc:  # retention or truncation moved the range meanwhile
        raise _out_of_range(device, offset, exc.start, exc.end) from None
    start, end = store.log_range(device)
    if not count:
        # Nothing at ``offset`` below the end: its records were lost to quarantined corruption
        # (commitlog/quarantine.py); the reader goes on past the gap instead of asking forever.
        next_offset = store.past_gap(device, offset)
    body = encode_fetch_raw(data, count, start, end)
    headers = {
        "X-Meshmq-Log-Start": str(start),
        "X-Meshmq-High-Watermark": str(end),
        "X-Meshmq-Start": str(start),  # deprecated name, one release
        "X-Meshmq-End": str(end),  # deprecated name, one release
        "X-Meshmq-Next-Offset": str(next_offset),
        "X-Meshmq-Record-Count": str(count),
        "Cache-Control": "no-store",
    }
    lost = store.lost_ranges(device, offset, next_offset)
    if lost:
        # Offsets between ``offset`` and next_offset lost to a corrupt record (quarantined,
        # reported at ERROR): half-open ranges, so a reader can apply its own data-loss rule
        # (Spark's failOnDataLoss) instead of guessing from the records' offsets.
        headers["X-Meshmq-Lost-Offsets"] = ",".join(f"{lo}-{hi}" for lo, hi in lost)
    return web.Response(body=body, content_type="application/octet-stream", headers=headers)


def _out_of_range(device: str, offset: int, start: int, end: int) -> _HttpError:
    why = ("deleted by retention" if offset < start else "beyond the committed end")
    return _HttpError(416, f"offset {offset} of {device!r} is outside [{start}, {end}] ({why})",
                      parameter="offset", offset=offset, log_start=start,
                      high_watermark=end, start=start, end=end)


async def _read_raw_sliced(store: LogStore, device: str, offset: int, max_records: int,
                           max_bytes: int) -> tuple[list[bytes], int, int, int]:
    """Up to ``max_records`` / ``max_bytes`` of stored records in loop-friendly slices:
    ``(chunks, count, next_offset, bytes)``. The first record is kept whatever its size,
    later ones only while they fit (exact encoded sizes: what goes on the wire). The chunks
    are joined once, into the response."""
    parts: list[bytes] = []
    count = used = 0
    nxt = offset
    while count < max_records and used < max_bytes:
        want = min(max_records - count, READ_SLICE_RECORDS)
        room = min(max_bytes - used, READ_SLICE_BYTES)
        try:
            chunks, n, after = store.read_raw(device, nxt, want, room)
        except OffsetOutOfRangeError:
            if parts:
                break  # what we have is still valid; the reader asks again from next_offset
            raise
        if not n:
            # Nothing at ``nxt`` below the end: lost to quarantined corruption (found by
            # recovery or by this very read, commitlog/salvage.py). Go on past the gap; the
            # reader sees which offsets are missing (``X-Meshmq-Lost-Offsets``, or the
            # section's offsets against its next_offset).
            past = store.past_gap(device, nxt)
            if past <= nxt:
                break
            nxt = past
            if nxt >= store.high_watermark(device):
                break
            continue
        size = sum(len(c) for c in chunks)
        if parts and used + size > max_bytes:
            break  # (read_raw always gives one record, even one over this slice's room)
        parts.extend(chunks)
        count += n
        used += size
        nxt = after
        if nxt >= store.high_watermark(device):
            break
        await asyncio.sleep(0)
    end = store.high_watermark(device)
    if nxt > end:
        # The log was truncated below what we read while we yielded (a leader change): read
        # again in one go, without yielding, so no cut record is served.
        if offset > end:
            return [], 0, offset, 0
        chunks, count, nxt = store.read_raw(device, offset, min(max_records, end - offset),
                                            max_bytes)
        return chunks, count, nxt, sum(len(c) for c in chunks)
    return parts, count, nxt, used


def register_fetch_routes(app: web.Application, store: LogStore,
                          may_read: ReadCheck | None = None) -> None:
    """Add the ``/api/v1/logs`` routes serving ``store`` to ``app`` (before it starts, e.g.
    ``register_fetch_routes(admin_server.app, store)``). See the module docstring.
    ``may_read(request, device)``, when given, hides (list) or refuses with 403 (per device)
    the logs the request's reader may not read."""
    app[_STORE_KEY] = store
    app[_SORTED_KEY] = {}
    app[_POLLS_KEY] = [0]
    app.router.add_post(FETCH_PATH, _fetch_many)
    if may_read is not None:
        app[_READ_CHECK_KEY] = may_read
    app.router.add_get(LOGS_PATH, _list_logs)
    app.router.add_get(LOGS_PATH + "/{device}", _log_info)
    app.router.add_get(LOGS_PATH + "/{device}/records", _records)


# ------------------------------------------------------------------ many-device fetch

_POLLS_KEY = web.AppKey("meshmq_long_polls", list)


def _body_int(obj: Mapping[str, object], name: str, lo: int, hi: int, default: int,
              where: str = "") -> int:
    value = obj.get(name, default)
    label = where + name
    if type(value) is not int or not lo <= value <= hi:
        raise _HttpError(400, f"{label} must be an integer between {lo} and {hi}, got "
                         f"{value!r}", parameter=label)
    return value


def _parse_fetch(body: object) -> tuple[list[tuple[str, int | None]], int, int, int, int]:
    if not isinstance(body, dict):
        raise _HttpError(400, "the body must be a JSON object", parameter="body")
    allowed = ("devices", "max_records_per_device", "max_bytes", "max_bytes_per_device",
               "max_wait_ms")
    for name in body:
        if name not in allowed:
            raise _HttpError(400, f"unknown field {name!r}; allowed: " + ", ".join(allowed),
                             parameter=name)
    devs = body.get("devices")
    if not isinstance(devs, list) or not 1 <= len(devs) <= MAX_FETCH_DEVICES:
        raise _HttpError(400, f"devices must be a list of 1 to {MAX_FETCH_DEVICES} entries",
                         parameter="devices")
    out: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    for i, d in enumerate(devs):
        where = f"devices[{i}]"
        if not isinstance(d, dict) or not isinstance(d.get("device"), str) or not d["device"] \
                or set(d) - {"device", "offset"}:
            raise _HttpError(400, f"{where} must be {{\"device\": str, \"offset\": int}}",
                             parameter=where)
        if d["device"] in seen:
            raise _HttpError(400, f"{where}: device {d['device']!r} named twice", parameter=where)
        seen.add(d["device"])
        off = d.get("offset")
        if off is not None and (type(off) is not int or off < 0):
            raise _HttpError(400, f"{where}.offset must be an integer >= 0, got {off!r}",
                             parameter=f"{where}.offset")
        out.append((d["device"], off))
    max_records = _body_int(body, "max_records_per_device", 1, MAX_MAX_RECORDS,
                            DEFAULT_MAX_RECORDS)
    max_bytes = _body_int(body, "max_bytes", 1, MAX_MAX_BYTES, DEFAULT_MAX_BYTES)
    per_dev = _body_int(body, "max_bytes_per_device", 1, MAX_MAX_BYTES, max_bytes)
    wait_ms = _body_int(body, "max_wait_ms", 0, MAX_WAIT_MS, 0)
    return out, max_records, max_bytes, per_dev, wait_ms


class _Limits(NamedTuple):
    """A many-device fetch's limits, as parsed from its body."""

    max_records: int
    max_bytes: int
    per_dev: int
    wait_ms: int


async def _fetch_many(request: web.Request) -> web.Response:
    store = request.app[_STORE_KEY]
    try:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise _HttpError(400, "the body is not valid JSON", parameter="body") from None
        devices, *limits = _parse_fetch(body)
        lim = _Limits(*limits)
        denied = next((d for d, _ in devices if not _may_read(request, d)), None)
        if denied is not None:  # the same read ACL as the per-device routes
            return _denied(denied)
        view = request.app.get(_CLUSTER_KEY)
        if view is not None and RELAYED_HEADER not in request.headers:
            groups = _by_owner(view, devices)
            if set(groups) != {None}:  # some devices live at other routers
                body_out = await _fetch_spread(request, store, view, devices, groups, lim)
                return _fetch_response(body_out)
        sections, found = await _read_many(store, devices, lim.max_records, lim.max_bytes,
                                           lim.per_dev)
        if not found and lim.wait_ms:
            with _long_poll_slot(request.app):
                await _wait_for_data(store, _wait_targets(devices, sections),
                                     lim.wait_ms / 1000)
            sections, found = await _read_many(store, devices, lim.max_records, lim.max_bytes,
                                               lim.per_dev)
    except _HttpError as err:
        return _json(err.status, err.body)
    except CorruptRecordError as exc:
        log.error("fetch API: corrupt record while reading device logs",
                  extra={"error": str(exc)})
        return _json(500, {"error": f"corrupt record: {exc}"})
    return _fetch_response(_fetch.encode_multi_fetch_parts([s[0] for s in sections]))


def _fetch_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/octet-stream",
                        headers={"Cache-Control": "no-store"})


@contextlib.contextmanager
def _long_poll_slot(app: web.Application) -> Iterator[None]:
    """One of the ``MAX_LONG_POLLS`` slots for as long as a long poll waits; 503 when all
    are taken."""
    polls = app[_POLLS_KEY]
    if polls[0] >= MAX_LONG_POLLS:
        log.warning("fetch API: %d long polls already wait; refusing another (503)", polls[0])
        raise _HttpError(503, f"too many long polls waiting (limit {MAX_LONG_POLLS}); "
                         "retry, or poll without max_wait_ms")
    polls[0] += 1
    try:
        yield
    finally:
        polls[0] -= 1


def _wait_targets(devices: list[tuple[str, int | None]],
                  sections: list[tuple[list[bytes], int, int]]) -> list[tuple[str, int]]:
    """``(device, offset)`` a long poll waits on: devices with nothing to say yet (ok with no
    record, or unknown), at the offset their section reports."""
    return [(device, off) for (device, _), (_enc, status, off) in zip(devices, sections,
                                                                     strict=True)
            if status in (_fetch.STATUS_OK, _fetch.STATUS_UNKNOWN_DEVICE)]


async def _read_many(store: LogStore, devices: list[tuple[str, int | None]], max_records: int,
                     max_bytes: int, per_dev: int,
                     ) -> tuple[list[tuple[list[bytes], int, int]], bool]:
    """Sections ``(parts, status, offset)`` in request order, and whether any device has
    records or a range error to report (what ends a long poll)."""
    out: list[tuple[list[bytes], int, int]] = []
    used = 0
    found = False
    for i, (device, asked) in enumerate(devices):
        if i and i % FETCH_SLICE_DEVICES == 0:
            await asyncio.sleep(0)  # many devices: let MQTT clients run in between
        rng = _committed_range(store, device)
        durable = store.durable_end(device)
        if rng is None:
            off = asked or 0
            out.append(([_fetch.section_head(device, _fetch.STATUS_UNKNOWN_DEVICE, off, 0, 0,
                                             durable, off, 0, 0)],
                        _fetch.STATUS_UNKNOWN_DEVICE, off))
            continue
        start, hw = rng
        off = start if asked is None else asked
        if off < start or off > hw:
            status = _fetch.STATUS_BELOW_START if off < start else _fetch.STATUS_ABOVE_END
            out.append(([_fetch.section_head(device, status, off, start, hw, durable, off, 0,
                                             0)], status, off))
            found = True
            continue
        chunks: list[bytes] = []
        count, nxt, size = 0, off, 0
        budget = min(per_dev, max_bytes - used)
        if off < hw and (budget > 0 or not found):
            # Capped at ``hw`` as read above: slices yield, and records committed meanwhile
            # must not appear past the high_watermark this section reports.
            want = min(max_records, hw - off) if budget > 0 else 1
            chunks, count, nxt, size = await _read_raw_sliced(store, device, off, want,
                                                              max(budget, 1))
        if count and used and used + size > max_bytes:
            chunks, count, nxt, size = [], 0, off, 0  # (one record over the budget came)
        used += size
        found = found or bool(count)
        out.append(([_fetch.section_head(device, _fetch.STATUS_OK, off, start, hw, durable,
                                         nxt, count, size), *chunks], _fetch.STATUS_OK, off))
    return out, found


async def _wait_for_data(store: LogStore, targets: list[tuple[str, int]],
                         timeout: float) -> None:
    """Long poll: until one of the devices' high-water marks passes its offset in
    ``targets`` (a new committed record, or a device appearing), or ``timeout``. Uses the
    store's per-device commit waiters, removed again however the wait ends (a cancelled
    wait included: the cluster's spread long poll cancels it when another part wakes)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_exc: BaseException | None) -> None:
        if not fut.done():
            fut.set_result(None)

    # no ack: a leader refusing the acks its stuck mark holds leaves the poll waiting (it
    # was woken with nothing to read, and counted as a refused ack)
    poll = Watch(wake)

    handles = []
    try:
        for device, off in targets:
            handles.append(store.when_high_watermark(device, off + 1, poll))
            if fut.done():
                break
        if not fut.done():
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                pass
    finally:
        for h in handles:
            store.cancel_high_watermark_wait(h)


# ------------------------------------------------------------------ the cluster's view
#
# In a cluster every router's fetch API answers for every device log, wherever its owner is.
# A single-device request is relayed whole to the owner (meshmq/cluster_wiring.py). The two
# requests that name many devices are split here: the listing gathers one page from every
# router, the many-device fetch sends each owner its devices. Each peer runs its part against
# its own admin API (its authentication, its read ACL, its statuses) with RELAYED_HEADER set,
# so it answers from its own store only.


class ClusterView(Protocol):
    """What the fetch API needs of the cluster; meshmq/cluster_wiring.py builds it over the
    mesh. A protocol, so this module imports nothing of cluster/ (docs/architecture.md:
    the wiring connects the rooms)."""

    def owner_of(self, device: str) -> str | None:
        """The router owning ``device``'s log; None when it is this router."""
        ...

    def peers(self) -> list[str]:
        """Every other router of the cluster."""
        ...

    async def relay(self, router: str, method: str, path: str, headers: list[tuple[str, str]],
                    body: bytes, timeout: float,
                    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Run an admin request at ``router``: ``(status, content type, headers, body)``; 503
        when its link is down, 504 when it did not answer within ``timeout``."""
        ...


_CLUSTER_KEY = web.AppKey("meshmq_cluster_view", ClusterView)


def attach_cluster(app: web.Application, view: ClusterView) -> None:
    """Make the fetch API routes of ``app`` answer for the whole cluster (before the app
    starts). A no-op when the app serves no fetch API (commit log off)."""
    if _STORE_KEY in app:
        app[_CLUSTER_KEY] = view


def _relay_headers(request: web.Request, json_body: bool = False) -> list[tuple[str, str]]:
    """The caller's credentials go with every part: each owner authenticates the reader and
    applies its own read ACL, as for a single-device relay."""
    out = [(k, v) for k, v in request.headers.items() if k.lower() == "authorization"]
    if json_body:
        out.append(("Content-Type", "application/json"))
    return out


async def _relay(view: ClusterView, router: str, method: str, path: str,
                 headers: list[tuple[str, str]], body: bytes, timeout: float,
                 ) -> tuple[int, str, bytes]:
    """``view.relay`` with a failure of the relay itself turned into a 502 answer."""
    try:
        status, ctype, _headers, out = await view.relay(router, method, path, headers, body,
                                                        timeout)
    except Exception as exc:  # noqa: BLE001 - one peer's failure is reported, not raised
        log.warning("fetch API: relaying %s %s to router %s failed: %r", method, path, router,
                    exc)
        return 502, "text/plain", f"relaying to router {router} failed: {exc!r}".encode()
    return status, ctype, out


def _peer_error(router: str, status: int, ctype: str, body: bytes) -> _HttpError:
    """A peer's non-200 answer as this request's error, naming the router; the peer's JSON
    fields (``parameter``, ``offset``...) are kept."""
    message = body.decode("utf-8", "replace")[:500]
    extra: dict[str, object] = {}
    if ctype == "application/json":
        with contextlib.suppress(ValueError):
            doc = json.loads(body)
            if isinstance(doc, dict):
                message = str(doc.get("error", message))
                extra = {k: v for k, v in doc.items() if k not in ("error", "status", "message")}
    extra["router"] = router
    return _HttpError(status, f"router {router}: {message}", **extra)


# -- listing


async def _cluster_page(request: web.Request, view: ClusterView,
                        logs: list[dict[str, object]], next_after: str | None,
                        after: str | None, limit: int) -> dict[str, object]:
    """This page of the whole cluster's listing: the same page asked of every peer, merged
    with this router's (``merge_pages``). A peer that does not answer is named under
    ``unreachable`` (router -> why): its logs are missing from the page, and a reader must
    not take them as gone."""
    query = {"limit": str(limit)}
    if after is not None:
        query["after"] = after
    path = LOGS_PATH + "?" + urlencode(query)
    peers = view.peers()
    headers = _relay_headers(request)
    answers = await asyncio.gather(*(_relay(view, p, "GET", path, headers, b"",
                                            RELAY_TIMEOUT_S) for p in peers))
    sources: list[tuple[str | None, list[dict[str, object]], str | None]] = [
        (None, logs, next_after)]
    unreachable: dict[str, str] = {}
    hidden = int(request.get(HIDDEN_KEY) or 0)
    for peer, (status, ctype, body) in zip(peers, answers, strict=True):
        if status != 200:
            unreachable[peer] = str(_peer_error(peer, status, ctype, body))
            continue
        try:
            page = json.loads(body)
            entries = list(page["logs"])
            nxt = page.get("next_after")
            hidden += int(page.get("hidden_by_acl") or 0)
        except (ValueError, KeyError, TypeError):
            unreachable[peer] = f"router {peer}: answered a listing that is not one"
            continue
        sources.append((peer, entries, None if nxt is None else str(nxt)))
    if unreachable:
        log.warning("fetch API: the log listing misses routers that did not answer: %s",
                    "; ".join(unreachable.values()))
    out = merge_pages(sources, limit, view.owner_of)
    if unreachable:
        out["unreachable"] = unreachable
    if hidden:
        out["hidden_by_acl"] = hidden
    return out


def merge_pages(sources: list[tuple[str | None, list[dict[str, object]], str | None]],
                limit: int, owner_of: Callable[[str], str | None]) -> dict[str, object]:
    """Merge pages of the same listing request from several routers into one page.

    ``sources``: ``(router, logs, next_after)`` per router (router None: this one). A router
    lists only what its store holds; a device is kept from its owner only (``owner_of``, None
    meaning this router), so a stale copy left on another router (a changed layout) is
    neither listed twice nor listed at all when the owner does not have it, exactly what
    ``GET /api/v1/logs/<device>`` (relayed to the owner) says.

    Paging stays exact: a router whose page is not its last covered every one of its
    devices up to its ``next_after`` and none beyond, so the merged page is cut at the
    smallest such ``next_after`` (``bound``) and at ``limit``; ``next_after`` is then where
    the cut was, so the next page neither skips nor repeats a device."""
    bound = min((nxt for _, _, nxt in sources if nxt is not None), default=None)
    entries = [e for router, page, _ in sources for e in page
               if owner_of(str(e["device"])) == router
               and (bound is None or str(e["device"]) <= bound)]
    entries.sort(key=lambda e: str(e["device"]))
    out: dict[str, object] = {"logs": entries[:limit]}
    if len(entries) > limit:
        out["next_after"] = str(entries[limit - 1]["device"])
    elif bound is not None:
        out["next_after"] = bound
    return out


# -- many-device fetch


class _Section(NamedTuple):
    """One device's section of a many-device fetch, from this store or a peer's answer."""

    device: str
    status: int
    offset: int
    log_start: int
    high_watermark: int
    durable_end: int
    next_offset: int
    count: int
    records: list[bytes | memoryview]  # the records' bytes, in the record framing
    size: int  # bytes of ``records``


def _has_news(sections: list[_Section]) -> bool:
    """What ends a long poll (as ``_read_many``'s ``found``): a record, or a range error."""
    return any(s.count or s.status in (_fetch.STATUS_BELOW_START, _fetch.STATUS_ABOVE_END)
               for s in sections)


def _by_owner(view: ClusterView, devices: list[tuple[str, int | None]],
              ) -> dict[str | None, list[tuple[str, int | None]]]:
    """The request's devices per owner router (None: this one), in request order."""
    groups: dict[str | None, list[tuple[str, int | None]]] = {}
    for device, asked in devices:
        groups.setdefault(view.owner_of(device), []).append((device, asked))
    return groups


async def _fetch_spread(request: web.Request, store: LogStore, view: ClusterView,
                        devices: list[tuple[str, int | None]],
                        groups: dict[str | None, list[tuple[str, int | None]]],
                        lim: _Limits) -> bytes:
    """A many-device fetch whose devices have several owners: every part is read at once,
    this router's from its store and each peer's over the mesh, with the request's limits
    (the whole ``max_bytes`` each, so the merge can serve devices in request order as one
    router would, see ``_merge_sections``); then merged into one response in request order.

    Long poll: when no part has news, wait until any part has some or ``max_wait_ms`` ends
    (``_wait_spread``), then read every part again and answer once. A part that fails (a
    peer unreachable, 503; no answer in time, 504; its own 4xx/5xx) fails the request with
    that status, naming the router: the response format has no per-device "unavailable", and
    leaving the section out or empty would read as "no data" to a reader."""
    headers = _relay_headers(request, json_body=True)
    sections = await _read_spread(store, view, groups, lim, headers)
    if not _has_news(sections) and lim.wait_ms:
        with _long_poll_slot(request.app):
            await _wait_spread(store, view, groups, sections, lim, headers)
        sections = await _read_spread(store, view, groups, lim, headers)
    order = {device: i for i, (device, _) in enumerate(devices)}
    sections.sort(key=lambda s: order[s.device])
    return _merge_sections(sections, lim.max_bytes)


async def _read_spread(store: LogStore, view: ClusterView,
                       groups: dict[str | None, list[tuple[str, int | None]]], lim: _Limits,
                       headers: list[tuple[str, str]]) -> list[_Section]:
    """Every part read once, concurrently, without waiting; the sections of all parts, or
    the parts' errors raised together (each router named)."""
    reads = [_read_local(store, devs, lim) if router is None
             else _read_peer(view, router, devs, lim._replace(wait_ms=0), headers)
             for router, devs in groups.items()]
    results = await asyncio.gather(*reads, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        try:
            for exc in failed:
                if not isinstance(exc, _HttpError):
                    raise exc  # (a corrupt local record: the caller's 500)
            first = failed[0]
            assert isinstance(first, _HttpError)
            if len(failed) > 1:
                first.body["error"] = "; ".join(str(e) for e in failed)
                first.body["routers"] = [e.body.get("router") for e in failed
                                         if isinstance(e, _HttpError)]
            raise first
        finally:
            # raised from locals, the errors would hold this frame (and every part's sections)
            # in a cycle until the cyclic collector runs (rarer since meshmq/node.py's
            # threshold): broken here, as asyncio does
            failed = results = exc = first = None  # type: ignore[assignment]
    return [s for part in results if not isinstance(part, BaseException) for s in part]


async def _read_local(store: LogStore, devices: list[tuple[str, int | None]], lim: _Limits,
                      ) -> list[_Section]:
    raw, _found = await _read_many(store, devices, lim.max_records, lim.max_bytes, lim.per_dev)
    out = []
    for (device, _), (parts, _status, _off) in zip(devices, raw, strict=True):
        (_kl, status, off, start, hw, end, nxt, count,
         size) = _fetch.SECTION.unpack_from(parts[0], 0)
        out.append(_Section(device, status, off, start, hw, end, nxt, count, parts[1:], size))
    return out


async def _read_peer(view: ClusterView, router: str, devices: list[tuple[str, int | None]],
                     lim: _Limits, headers: list[tuple[str, str]]) -> list[_Section]:
    """The part of ``router``: the same request for its devices, sent over the mesh."""
    cap = min(lim.max_bytes, RELAY_MAX_BYTES)
    body = json.dumps({
        "devices": [{"device": d} if o is None else {"device": d, "offset": o}
                    for d, o in devices],
        "max_records_per_device": lim.max_records, "max_bytes": cap,
        "max_bytes_per_device": min(lim.per_dev, cap), "max_wait_ms": lim.wait_ms,
    }).encode()
    status, ctype, data = await _relay(view, router, "POST", FETCH_PATH, headers, body,
                                       RELAY_TIMEOUT_S + lim.wait_ms / 1000)
    if status != 200:
        raise _peer_error(router, status, ctype, data)
    try:
        got = _fetch.decode_multi_fetch(data)
    except CorruptRecordError as exc:
        raise _HttpError(502, f"router {router}: its fetch response does not decode: {exc}",
                         router=router) from None
    if [s.device for s in got] != [d for d, _ in devices]:
        raise _HttpError(502, f"router {router}: its sections do not match the devices asked",
                         router=router)
    return [_Section(s.device, s.status, s.offset, s.log_start, s.high_watermark, s.durable_end,
                     s.next_offset, s.record_count, [s.records], len(s.records)) for s in got]


async def _wait_spread(store: LogStore, view: ClusterView,
                       groups: dict[str | None, list[tuple[str, int | None]]],
                       sections: list[_Section], lim: _Limits,
                       headers: list[tuple[str, str]]) -> None:
    """Until any part has news or ``lim.wait_ms`` passed: this router's devices with the
    store's commit waiters, each peer's with long polls of at most ``PROBE_SLICE_S`` asking
    one record (a probe: its answer is only a signal, the caller reads every part again).
    Why slices: the mesh cannot cancel a relayed request, so a peer's poll abandoned when
    another part woke keeps one of that peer's ``MAX_LONG_POLLS`` slots until it ends; a
    slice bounds that to a second instead of the whole wait."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + lim.wait_ms / 1000
    tasks: list[asyncio.Task[None]] = []
    local = groups.get(None)
    if local:
        mine = {d for d, _ in local}
        targets = [(s.device, s.offset) for s in sections if s.device in mine
                   and s.status in (_fetch.STATUS_OK, _fetch.STATUS_UNKNOWN_DEVICE)]
        tasks.append(loop.create_task(_wait_for_data(store, targets, lim.wait_ms / 1000)))
    for router, devs in groups.items():
        if router is not None:
            tasks.append(loop.create_task(_probe_until(view, router, devs, headers, deadline)))
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                # The final read reports a peer that keeps failing; one that failed once and
                # answers again just ends the wait early.
                log.debug("fetch API: a long-poll part ended with %r", task.exception())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _probe_until(view: ClusterView, router: str, devices: list[tuple[str, int | None]],
                       headers: list[tuple[str, str]], deadline: float) -> None:
    """Long-poll ``router`` for ``devices`` in slices until one answer has news or the
    deadline passes (an error ends it too: the caller's final read reports it)."""
    loop = asyncio.get_running_loop()
    while (left := deadline - loop.time()) > 0:
        wait_ms = max(1, int(min(left, PROBE_SLICE_S) * 1000))
        probe = _Limits(max_records=1, max_bytes=1, per_dev=1, wait_ms=wait_ms)
        if _has_news(await _read_peer(view, router, devices, probe, headers)):
            return


def _merge_sections(sections: list[_Section], max_bytes: int) -> bytes:
    """One many-device response from sections in request order, with the budget rule of a
    single router: sections are served in order until ``max_bytes`` is used, the first
    record of the first section with records always; a section that does not fit whole is
    cut after its last record that does (``next_offset`` = the first record left out),
    and one of which nothing fits comes back ok with no records at the offset asked."""
    out: list[list[bytes | memoryview]] = []
    used = 0
    for s in sections:
        if s.count and used and used + s.size > max_bytes:
            s = _cut(s, max_bytes - used)
        used += s.size
        out.append([_fetch.section_head(s.device, s.status, s.offset, s.log_start,
                                        s.high_watermark, s.durable_end, s.next_offset, s.count,
                                        s.size), *s.records])
    return _fetch.encode_multi_fetch_parts(out)  # type: ignore[arg-type]


def _cut(s: _Section, room: int) -> _Section:
    """``s`` with only the records that fit in ``room`` bytes, whole (record framing: a u32
    length first, the offset in the header, commitlog/record.py)."""
    data = s.records[0] if len(s.records) == 1 else b"".join(s.records)
    p = count = 0
    while p + 4 <= room:
        (length,) = U32.unpack_from(data, p)
        if p + 4 + length > room:
            break
        p += 4 + length
        count += 1
    if not count:
        return s._replace(next_offset=s.offset, count=0, records=[], size=0)
    next_offset = RECORD_HEADER.unpack_from(data, p)[5]  # the first record left out
    return s._replace(next_offset=next_offset, count=count, records=[data[:p]], size=p)
