"""The fetch client reads every page of the device listing: GET /api/v1/logs is paged
(``next_after``), and a client that read only the first page would never read devices past it,
silently (no Spark needed)."""

from __future__ import annotations

import pytest
from helpers.spark import device_messages, publish

from spark_connector import client as client_mod


def test_list_logs_follows_every_page(start_broker, monkeypatch: pytest.MonkeyPatch) -> None:
    b = start_broker()
    devices = [f"page-{i}" for i in range(5)]
    publish(b, [m for d in devices for m in device_messages(d, 0, 2)])
    monkeypatch.setattr(client_mod, "LIST_PAGE", 2)  # 5 devices: 3 pages
    c = client_mod.LogClient((("127.0.0.1", b.admin_port),))
    try:
        logs = c.list_logs()
    finally:
        c.close()
    assert sorted(logs) == devices
    assert all((r.start, r.end) == (0, 2) for r in logs.values())


def test_ranges_from_a_server_of_the_previous_release() -> None:
    """A Spark job upgraded before its nodes reads the names the previous release sends
    (``start``/``end``, deprecated now, kept one release), and the new ones when both are
    there (the values are the same; the new names win)."""
    old = {"device": "d1", "start": 3, "end": 42}  # GET /api/v1/logs of the previous release
    new = {"device": "d1", "log_start": 3, "high_watermark": 42, "start": 3, "end": 42}
    old_416 = {"error": "...", "parameter": "offset", "offset": 50, "start": 3, "end": 42}
    assert client_mod._range_of(old) == client_mod._range_of(new) == (3, 42)
    assert client_mod._range_of(old_416) == (3, 42)
    assert client_mod._range_of({"log_start": 1, "high_watermark": 2, "start": 9, "end": 9}) \
        == (1, 2)
