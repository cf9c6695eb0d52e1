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
