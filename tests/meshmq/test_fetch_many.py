"""Many-device fetch (POST /api/v1/fetch) and the paged device listing: a real LogStore behind
a real AdminServer on a free port, requests from a worker thread (the store stays on the loop)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from commitlog.fetch import (
    STATUS_ABOVE_END,
    STATUS_BELOW_START,
    STATUS_OK,
    STATUS_UNKNOWN_DEVICE,
    decode_multi_fetch,
    decode_multi_records,
)
from commitlog.settings import LogSettings
from commitlog.store import LogStore
from meshmq.admin import AdminServer
from meshmq.fetch_api import FETCH_PATH, MAX_FETCH_DEVICES, register_fetch_routes
from meshmq.metrics import MetricsRegistry

HANG_S = 60  # generous hang deadline, never a timing assertion


def serve(store: LogStore, scenario) -> None:
    """Run ``scenario(base_url, metrics)`` against an AdminServer serving ``store``."""

    async def main() -> None:
        metrics = MetricsRegistry()
        server = AdminServer("127.0.0.1:0", metrics, lambda: True)
        register_fetch_routes(server.app, store)
        await server.start()
        try:
            await scenario(f"http://127.0.0.1:{server.port}", metrics)
        finally:
            await server.stop()

    asyncio.run(main())


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=HANG_S) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def ajson(url: str) -> tuple[int, dict]:
    return await asyncio.to_thread(get_json, url)


def post(url: str, body: object) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def apost(url: str, body: object) -> tuple[int, bytes]:
    return await asyncio.to_thread(post, url, body)


def put(store: LogStore, device: str, n: int) -> None:
    for _ in range(n):
        off = store.log_end(device)
        store.append(device, 1000 + off, f"devices/{device}/t", 1, None, f"{device}:{off}".encode())


def test_thousand_devices_in_one_request_with_reasons(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"), LogSettings(retention_bytes_per_device=0))
    for i in range(1000):
        put(store, f"dev{i:04d}", 3 + i % 5)
    store.flush_sync_commit()
    put(store, "dev0000", 2)  # appended, not committed: invisible
    store.set_high_watermark("dev0001", 2)  # replicated: readers stop at 2 of 4

    async def scenario(base: str, _metrics) -> None:
        devices = [{"device": f"dev{i:04d}", "offset": 1} for i in range(1000)]
        devices[5]["offset"] = 99  # above the high-water mark
        devices.append({"device": "ghost"})
        status, body = await apost(base + FETCH_PATH, {"devices": devices,
                                                        "max_bytes": 64 << 20})
        assert status == 200, body[:300]
        parts = decode_multi_fetch(body)
        recs = decode_multi_records(body)
        assert [p.device for p in parts] == [d["device"] for d in devices]
        for i, p in enumerate(parts[:1000]):
            n = 3 + i % 5
            if i == 5:
                assert (p.status, p.high_watermark, p.record_count) == (STATUS_ABOVE_END, n, 0)
                continue
            hw = 2 if i == 1 else n
            assert p.status == STATUS_OK and p.log_start == 0 and p.high_watermark == hw
            assert p.durable_end == (4 if i == 1 else n) and p.next_offset == hw
            assert (p.high_water, p.log_end) == (p.high_watermark, p.durable_end)  # deprecated
            assert [r.offset for r in recs[p.device]] == list(range(1, hw))
            assert recs[p.device][0].payload == f"{p.device}:1".encode()
        assert parts[1000].status == STATUS_UNKNOWN_DEVICE
        # A byte budget: devices in order until it is used, the rest get nothing (ok).
        status, body = await apost(base + FETCH_PATH, {"devices": devices[:10],
                                                        "max_bytes": 200})
        parts = decode_multi_fetch(body)
        assert parts[0].record_count >= 1 and sum(p.record_count for p in parts) < 25
        assert all(p.status in (STATUS_OK, STATUS_ABOVE_END) for p in parts)
        # Bad requests name the parameter.
        for bad, param in (({"devices": []}, "devices"),
                           ({"devices": [{"device": "a", "offset": -1}]}, "devices[0].offset"),
                           ({"devices": [{"device": "a"}, {"device": "a"}]}, "devices[1]"),
                           ({"devices": [{"device": "a"}], "max_wait_ms": 10**9}, "max_wait_ms"),
                           ({"devices": [{"device": "a"}], "nope": 1}, "nope"),
                           ({"devices": [{"device": f"x{i}"} for i in
                                         range(MAX_FETCH_DEVICES + 1)]}, "devices")):
            status, body = await apost(base + FETCH_PATH, bad)
            assert status == 400 and json.loads(body)["parameter"] == param, (bad, body)

    serve(store, scenario)
    store.close()


def test_retention_reason_and_long_poll_wakes_on_append(tmp_path: Path):
    settings = LogSettings(segment_bytes=4096, index_interval_bytes=256,
                           retention_bytes_per_device=1024, retention_ms=0)
    store = LogStore.open(str(tmp_path / "log"), settings)
    for _ in range(10):
        put(store, "big", 20)
        put(store, "idle", 1)
        store.flush_sync_commit()
    store.apply_retention(0)
    big_start = store.log_range("big")[0]
    assert big_start > 0

    async def scenario(base: str, _metrics) -> None:
        status, body = await apost(base + FETCH_PATH, {"devices": [{"device": "big",
                                                                    "offset": 0}]})
        (p,) = decode_multi_fetch(body)
        assert (p.status, p.log_start, p.record_count) == (STATUS_BELOW_START, big_start, 0)
        # Long poll: nothing new for "idle" (offset == high-water mark) nor "later".
        req = {"devices": [{"device": "idle", "offset": 10}, {"device": "later"}],
               "max_wait_ms": 30_000}
        task = asyncio.ensure_future(apost(base + FETCH_PATH, req))
        deadline = time.monotonic() + HANG_S
        while store.high_watermark_waiters < 2:  # the poll is registered and waiting
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        put(store, "idle", 2)
        store.flush_sync_commit()
        status, body = await asyncio.wait_for(task, HANG_S)
        assert status == 200
        parts = decode_multi_fetch(body)
        assert (parts[0].status, parts[0].record_count, parts[0].next_offset) == (
            STATUS_OK, 2, 12)
        assert parts[1].status == STATUS_UNKNOWN_DEVICE
        assert store.high_watermark_waiters == 0  # the poll removed its waiters
        # A poll that times out returns the empty answer and leaves no waiter behind.
        status, body = await apost(base + FETCH_PATH, {
            "devices": [{"device": "idle", "offset": 12}], "max_wait_ms": 50})
        assert status == 200 and decode_multi_fetch(body)[0].record_count == 0
        assert store.high_watermark_waiters == 0

    serve(store, scenario)
    store.close()


def test_listing_pages(tmp_path: Path):
    store = LogStore.open(str(tmp_path / "log"))
    for i in range(2500):
        put(store, f"d{i:05d}", 1)
    store.flush_sync_commit()

    async def scenario(base: str, _metrics) -> None:
        seen: list[str] = []
        after = None
        while True:
            url = base + "/api/v1/logs?limit=1000" + (f"&after={after}" if after else "")
            status, page = await ajson(url)
            assert status == 200 and len(page["logs"]) <= 1000
            seen += [e["device"] for e in page["logs"]]
            after = page.get("next_after")
            if after is None:
                break
        assert seen == [f"d{i:05d}" for i in range(2500)]
        status, err = await ajson(base + "/api/v1/logs?limit=0")
        assert status == 400 and err["parameter"] == "limit"

    serve(store, scenario)
    store.close()
