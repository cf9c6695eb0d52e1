"""meshmq.fetch_api (+ the commit-log metrics): a real LogStore behind a real AdminServer on a
free port, fetched with urllib from a worker thread (the store stays on the loop thread)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from commitlog.fetch import decode_fetch_meta, decode_fetch_response
from commitlog.record import Record, encoded_size
from commitlog.settings import LogSettings
from commitlog.store import LogStore
from meshmq.admin import AdminServer
from meshmq.fetch_api import READ_SLICE_RECORDS, register_fetch_routes
from meshmq.metrics import MetricsRegistry

Response = tuple[int, dict[str, str], bytes]


def get(url: str) -> Response:
    """Blocking GET returning (status, headers, body) for every status."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read()


def serve(store: LogStore, scenario: Callable[[str, MetricsRegistry], Awaitable[None]]) -> None:
    """Run ``scenario(base_url, metrics)`` against an AdminServer serving ``store``."""

    async def main() -> None:
        metrics = MetricsRegistry()
        metrics.add_commitlog(store.stats, store)
        server = AdminServer("127.0.0.1:0", metrics, lambda: True)
        register_fetch_routes(server.app, store)
        await server.start()
        try:
            await scenario(f"http://127.0.0.1:{server.port}", metrics)
        finally:
            await server.stop()

    asyncio.run(main())


async def aget(url: str) -> Response:
    return await asyncio.to_thread(get, url)


async def ajson(url: str) -> tuple[int, object]:
    status, headers, body = await aget(url)
    assert headers["Content-Type"].startswith("application/json"), headers
    return status, json.loads(body)


def fill(store: LogStore, device: str, n: int, ts0: int = 1000, step: int = 1000,
         payload: bytes = b"") -> None:
    """Append ``n`` records (timestamps ts0, ts0+step, ...) without committing them."""
    start = store.log_end(device)
    for i in range(n):
        off = start + i
        store.append(device, ts0 + step * off, f"devices/{device}/t", 1 | (4 if off % 2 else 0),
                     None, payload or f"{device}-{off}".encode())


def entry(device: str, log_start: int, high_watermark: int) -> dict[str, object]:
    """A device as the listing and the info endpoint give it (new names and the deprecated
    ``start``/``end``, kept one release)."""
    return {"device": device, "log_start": log_start, "high_watermark": high_watermark,
            "start": log_start, "end": high_watermark}


def offsets(records: list[Record]) -> list[int]:
    return [r.offset for r in records]


def test_list_info_and_records(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"))
    fill(store, "d1", 10)
    fill(store, "d2", 3)
    store.flush_sync_commit()
    fill(store, "d3", 2)  # appended, never committed: invisible
    fill(store, "d1", 2)  # d1 has 2 uncommitted records past its end

    async def scenario(base: str, metrics: MetricsRegistry) -> None:
        status, data = await ajson(base + "/api/v1/logs")
        assert status == 200
        assert data == {"logs": [entry("d1", 0, 10), entry("d2", 0, 3)]}
        # the names are the store's; start/end are their deprecated aliases (one release)
        assert data["logs"][0] == {"device": "d1", "log_start": 0, "high_watermark": 10,
                                   "start": 0, "end": 10}

        assert await ajson(base + "/api/v1/logs/d2") == (200, entry("d2", 0, 3))
        assert await ajson(base + "/api/v1/logs/nope") == (
            404, {"error": "unknown device 'nope'"})
        assert await ajson(base + "/api/v1/logs/d3") == (404, {"error": "unknown device 'd3'"})
        status, data = await ajson(base + "/api/v1/logs/d3/records?offset=0")
        assert status == 404 and data == {"error": "unknown device 'd3'"}

        # defaults: from start, everything committed, nothing uncommitted
        status, headers, body = await aget(base + "/api/v1/logs/d1/records")
        assert status == 200
        assert headers["Content-Type"] == "application/octet-stream"
        assert (headers["X-Meshmq-Log-Start"], headers["X-Meshmq-High-Watermark"],
                headers["X-Meshmq-Next-Offset"], headers["X-Meshmq-Record-Count"]) == (
            "0", "10", "10", "10")
        assert (headers["X-Meshmq-Start"], headers["X-Meshmq-End"]) == ("0", "10")  # deprecated
        recs = decode_fetch_response(body)
        assert offsets(recs) == list(range(10))
        assert recs[3][:5] == (3, 4000, "d1", "devices/d1/t", 5) and recs[3].payload == b"d1-3"
        assert not recs[3].headers
        meta = decode_fetch_meta(body)
        assert (meta.record_count, meta.log_start, meta.high_watermark) == (10, 0, 10)

        # a range, and following X-Meshmq-Next-Offset
        seen: list[int] = []
        nxt = 2
        for _ in range(10):
            status, headers, body = await aget(
                f"{base}/api/v1/logs/d1/records?offset={nxt}&max_records=3")
            assert status == 200
            got = offsets(decode_fetch_response(body))
            assert len(got) <= 3
            seen += got
            nxt = int(headers["X-Meshmq-Next-Offset"])
            if not got:
                break
        assert seen == list(range(2, 10)) and nxt == 10

        # offset == end: 200 with zero records, so a follower can poll
        status, headers, body = await aget(base + "/api/v1/logs/d1/records?offset=10")
        assert status == 200 and decode_fetch_response(body) == []
        assert len(body) == 24 and headers["X-Meshmq-Next-Offset"] == "10"

        # uncommitted appends are not served, not even at offset == end ...
        status, _, body = await aget(base + "/api/v1/logs/d1/records?offset=10&max_records=5")
        assert decode_fetch_response(body) == []
        store.flush()  # written but not fsynced/committed: still invisible
        status, data = await ajson(base + "/api/v1/logs/d1/records?offset=11")
        assert status == 416 and (data["log_start"], data["high_watermark"]) == (0, 10)
        assert (data["start"], data["end"]) == (0, 10)  # deprecated aliases
        # ... until committed
        store.commit(store.sync())
        status, headers, body = await aget(base + "/api/v1/logs/d1/records?offset=10")
        assert offsets(decode_fetch_response(body)) == [10, 11]
        assert headers["X-Meshmq-High-Watermark"] == headers["X-Meshmq-End"] == "12"
        assert (await ajson(base + "/api/v1/logs/d3"))[1] == entry("d3", 0, 2)

        # out of range above the end
        status, data = await ajson(base + "/api/v1/logs/d1/records?offset=13")
        assert status == 416
        assert data["parameter"] == "offset" and (data["offset"], data["start"], data["end"]) \
            == (13, 0, 12)
        assert "outside [0, 12]" in data["error"]

        # the commit-log metrics read the same store at scrape time
        _, _, body = await aget(base + "/metrics")
        text = body.decode()
        for line in ("meshmq_log_appends_total 17.0", "meshmq_log_devices 3.0",
                     "meshmq_log_segments 1.0", "meshmq_log_batches_total 2.0",
                     "meshmq_log_batch_records_count 2.0", "meshmq_log_batch_records_sum 17.0",
                     'meshmq_log_fsync_seconds_bucket{le="+Inf"} 2.0',
                     "meshmq_log_fsync_seconds_count 2.0",
                     "meshmq_log_retention_deleted_segments_total 0.0",
                     "meshmq_log_recovery_truncations_total 0.0",
                     f"meshmq_log_bytes {float(store.committed_position)}"):
            assert line in text, line
        assert "meshmq_log_tail_cache_hits_total" in text
        assert "meshmq_log_tail_cache_misses_total" in text

    try:
        serve(store, scenario)
    finally:
        store.close()


def test_byte_and_record_limits(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"))
    fill(store, "big", 5, payload=b"x" * 1000)
    store.flush_sync_commit()
    size = encoded_size(store.read("big", 0, 1)[0])

    async def scenario(base: str, metrics: MetricsRegistry) -> None:
        url = base + "/api/v1/logs/big/records?offset=0"
        _, _, body = await aget(f"{url}&max_bytes={2 * size + size // 2}")
        assert offsets(decode_fetch_response(body)) == [0, 1]
        _, _, body = await aget(f"{url}&max_bytes={2 * size}")
        assert offsets(decode_fetch_response(body)) == [0, 1]
        # the first record always comes, even when it alone exceeds max_bytes
        _, headers, body = await aget(f"{url}&max_bytes=1")
        assert offsets(decode_fetch_response(body)) == [0]
        assert headers["X-Meshmq-Next-Offset"] == "1"
        _, _, body = await aget(f"{url}&max_records=4&max_bytes=67108864")
        assert offsets(decode_fetch_response(body)) == [0, 1, 2, 3]
        _, _, body = await aget(f"{url}&max_records=1")
        assert offsets(decode_fetch_response(body)) == [0]

    try:
        serve(store, scenario)
    finally:
        store.close()


def test_bad_parameters_are_400_naming_them(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"))
    fill(store, "d1", 3)
    store.flush_sync_commit()
    cases = [
        ("offset=abc", "offset"), ("offset=-1", "offset"), ("offset=", "offset"),
        ("offset=1.5", "offset"), ("max_records=0", "max_records"),
        ("max_records=100001", "max_records"), ("max_records=x", "max_records"),
        ("max_bytes=0", "max_bytes"), ("max_bytes=67108865", "max_bytes"),
        ("max_bytes=-3", "max_bytes"), ("timestamp_us=soon", "timestamp_us"),
        ("timestamp_us=-1", "timestamp_us"), ("offset=0&timestamp_us=5", "timestamp_us"),
        ("offest=1", "offset".replace("offset", "offest")), ("offset=1&offset=2", "offset"),
    ]

    async def scenario(base: str, metrics: MetricsRegistry) -> None:
        for query, param in cases:
            status, data = await ajson(f"{base}/api/v1/logs/d1/records?{query}")
            assert status == 400, query
            assert isinstance(data, dict) and data["parameter"] == param, (query, data)
            assert param in data["error"], (query, data)
        # a bad parameter is reported before an unknown device
        status, data = await ajson(f"{base}/api/v1/logs/nope/records?max_records=0")
        assert status == 400 and data["parameter"] == "max_records"
        # the caps themselves are accepted
        status, _, _ = await aget(f"{base}/api/v1/logs/d1/records?max_records=100000"
                                  "&max_bytes=67108864")
        assert status == 200

    try:
        serve(store, scenario)
    finally:
        store.close()


def test_timestamp_lookup(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"), LogSettings(index_interval_bytes=64))
    fill(store, "d1", 20, ts0=1000, step=1000)  # offset o has timestamp 1000 * (o + 1)
    fill(store, "other", 20, ts0=5, step=1)
    store.flush_sync_commit()

    async def scenario(base: str, metrics: MetricsRegistry) -> None:
        url = base + "/api/v1/logs/d1/records?max_records=2&timestamp_us="
        for ts, first in ((0, 0), (1000, 0), (1001, 1), (3500, 3), (20000, 19)):
            status, headers, body = await aget(f"{url}{ts}")
            assert status == 200
            recs = decode_fetch_response(body)
            assert recs[0].offset == first and recs[0].timestamp_us >= ts, ts
            assert headers["X-Meshmq-Next-Offset"] == str(first + len(recs))
        status, headers, body = await aget(f"{url}20001")  # after the last record: the end
        assert status == 200 and decode_fetch_response(body) == []
        assert headers["X-Meshmq-Next-Offset"] == "20"

    try:
        serve(store, scenario)
    finally:
        store.close()


def test_disk_reads_across_slices_and_retention(tmp_path: Path):
    """No tail cache: every read scans segments, interleaved with another device, across more
    than one slice; then retention moves start and an old offset answers 416."""
    settings = LogSettings(tail_cache_bytes_per_device=0, index_interval_bytes=256,
                           segment_bytes=16 * 1024, retention_bytes_per_device=8 * 1024)
    store = LogStore.open(str(tmp_path / "log"), settings)
    n = READ_SLICE_RECORDS * 2 + 37
    for _ in range(n // 100 + 1):
        fill(store, "d1", 100)
        fill(store, "noise", 100)
        store.flush_sync_commit()
    total = store.high_watermark("d1")
    assert total >= n and len(store.segments) > 1

    async def scenario(base: str, metrics: MetricsRegistry) -> None:
        status, headers, body = await aget(
            f"{base}/api/v1/logs/d1/records?offset=0&max_records={n}&max_bytes=67108864")
        assert status == 200
        recs = decode_fetch_response(body)
        assert offsets(recs) == list(range(n))
        assert all(r.key == "d1" and r.payload == f"d1-{r.offset}".encode() for r in recs)
        assert store.stats.tail_cache_misses > 0 and store.stats.disk_reads > 0

        store.apply_retention(2**62)
        start, end = store.log_range("d1")
        assert 0 < start < end == total
        status, data = await ajson(f"{base}/api/v1/logs/d1/records?offset=0")
        assert status == 416 and (data["start"], data["end"]) == (start, end)
        assert "retention" in data["error"]
        status, headers, body = await aget(f"{base}/api/v1/logs/d1/records")  # default = start
        assert status == 200 and decode_fetch_response(body)[0].offset == start
        assert headers["X-Meshmq-Start"] == str(start)
        _, data = await ajson(base + "/api/v1/logs")
        assert entry("d1", start, end) in data["logs"]
        _, _, body = await aget(base + "/metrics")
        deleted = store.stats.retention_segments_deleted
        assert f"meshmq_log_retention_deleted_segments_total {float(deleted)}" in body.decode()

    try:
        serve(store, scenario)
    finally:
        store.close()
