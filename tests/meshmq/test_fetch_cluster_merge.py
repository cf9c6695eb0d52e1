"""The cluster side of the fetch API without processes (issue 15): merging listing pages from
several routers, merging many-device fetch parts under one byte budget, and a long poll over
several owners ending when any one has news. The real-cluster tests are in
tests/cluster/test_cluster_fetch.py; these pin the rules those cannot reach (a stale copy of a
log on a non-owner, paging exactness, waking on the first part)."""

from __future__ import annotations

import asyncio
import bisect

from commitlog.fetch import (
    STATUS_OK,
    decode_multi_fetch,
    decode_multi_records,
    encode_multi_fetch,
    encode_section,
)
from commitlog.record import decode_batch, encode_batch, make_record
from meshmq import fetch_api
from meshmq.fetch_api import merge_pages

HANG_S = 60  # a hang deadline, never a timing assertion

# --------------------------------------------------------------------------- listing


def _page(keys: list[str], after: str | None, limit: int) -> tuple[list[dict], str | None]:
    """One router's own page, by the fetch API's rule (a page that is not the last holds
    ``limit`` logs)."""
    i = 0 if after is None else bisect.bisect_right(keys, after)
    logs = [{"device": k, "start": 0, "end": 1} for k in keys[i:i + limit]]
    return logs, (logs[-1]["device"] if i + limit < len(keys) else None)


def _list_cluster(stores: dict[str | None, list[str]], owner: dict[str, str | None],
                  limit: int) -> list[str]:
    listed: list[str] = []
    after = None
    for _ in range(1000):
        sources = [(router, *_page(sorted(keys), after, limit))
                   for router, keys in stores.items()]
        page = merge_pages(sources, limit, owner.__getitem__)
        assert len(page["logs"]) <= limit
        listed += [e["device"] for e in page["logs"]]
        after = page.get("next_after")
        if after is None:
            return listed
    raise AssertionError("the listing never ended")


def test_every_owned_log_is_listed_once_across_pages_even_with_stale_copies() -> None:
    """Router A (the merging one) still holds logs of devices B owns now (a changed layout):
    copies of logs B also has, and logs B never got. Each device is listed once, from its
    owner; and A's pages, short once the copies are left out, must not let B's later logs
    push the merged page past A's next ones (they would be skipped)."""
    owner: dict[str, str | None] = {}
    a = [f"d{i:02d}" for i in range(0, 20, 2)]  # owned by A (None: the merging router)
    b = [f"m{i:02d}" for i in range(10)]  # owned by B, after every d.. in sort order
    c = [f"e{i:02d}" for i in range(5)]  # owned by C
    lost = [f"d{i:02d}" for i in range(1, 20, 2)]  # owned by B, held only by A
    owner.update({d: None for d in a})
    owner.update({d: "B" for d in b + lost})
    owner.update({d: "C" for d in c})
    stores = {None: a + lost + b[:3], "B": b, "C": c}  # A: B's lost logs, copies of 3 others
    want = sorted(a + b + c)
    for limit in (1, 2, 3, 7, 1000):
        assert _list_cluster(stores, owner, limit) == want, limit


def test_a_peer_lists_nothing_it_does_not_own() -> None:
    page = merge_pages([(None, [{"device": "x", "start": 0, "end": 3}], None),
                        ("B", [{"device": "x", "start": 0, "end": 9}], None)], 10,
                       lambda d: "B")
    assert page == {"logs": [{"device": "x", "start": 0, "end": 9}]}


# --------------------------------------------------------------------------- fetch merge


def _records(device: str, first: int, n: int, size: int = 40) -> bytes:
    return encode_batch([make_record(first + i, 1, device, f"devices/{device}/t", 1, [],
                                     b"p" * size) for i in range(n)])


def _section(device: str, first: int, n: int) -> fetch_api._Section:
    data = _records(device, first, n)
    return fetch_api._Section(device, STATUS_OK, first, 0, first + n, first + n, first + n, n,
                              [data], len(data))


def test_merged_parts_keep_one_budget_in_request_order() -> None:
    one = len(_records("a", 0, 1))  # every record here has the same size
    parts = [_section("a", 0, 3), _section("b", 10, 4), _section("c", 5, 2)]
    body = fetch_api._merge_sections(parts, 5 * one + one // 2)
    secs = {s.device: s for s in decode_multi_fetch(body)}
    recs = decode_multi_records(body)
    assert [s.device for s in decode_multi_fetch(body)] == ["a", "b", "c"]
    assert [r.offset for r in recs["a"]] == [0, 1, 2]
    assert [r.offset for r in recs["b"]] == [10, 11]  # cut after what fits, whole records
    assert secs["b"].next_offset == 12 and secs["b"].record_count == 2
    assert recs["c"] == [] and secs["c"].next_offset == 5  # nothing left: ask again at 5
    assert sum(len(s.records) for s in secs.values()) <= 5 * one + one // 2


def test_the_first_record_is_served_whatever_the_budget() -> None:
    """A part returns one record over its budget when it is its first: the merge keeps the
    response's first one, and only that."""
    body = fetch_api._merge_sections([_section("a", 7, 1), _section("b", 0, 1)], 1)
    recs = decode_multi_records(body)
    assert [r.offset for r in recs["a"]] == [7]
    assert recs["b"] == []
    cut = fetch_api._cut(_section("a", 7, 3), len(_records("a", 7, 1)))
    assert cut.count == 1 and cut.next_offset == 8
    assert [r.offset for r in decode_batch(bytes(cut.records[0]), 0, cut.size)] == [7]


# --------------------------------------------------------------------------- long poll


class _FakeMesh:
    """Router "quiet" never answers until cancelled; router "busy" answers a record."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.asked: list[str] = []

    def owner_of(self, device: str) -> str | None:
        return device

    def peers(self) -> list[str]:
        return ["quiet", "busy"]

    async def relay(self, router: str, method: str, path: str, headers: list, body: bytes,
                    timeout: float) -> tuple[int, str, list, bytes]:
        self.asked.append(router)
        if router == "busy":
            data = _records("busy", 4, 1)
            return 200, "application/octet-stream", [], encode_multi_fetch(
                [encode_section("busy", STATUS_OK, 4, 0, 5, 5, 5, 1, data)])
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(router)
            raise
        raise AssertionError("unreachable")


def test_a_long_poll_over_owners_ends_when_the_first_has_news() -> None:
    mesh = _FakeMesh()
    groups: dict[str | None, list[tuple[str, int | None]]] = {"quiet": [("quiet", 0)],
                                                              "busy": [("busy", 4)]}
    lim = fetch_api._Limits(max_records=10, max_bytes=1000, per_dev=1000, wait_ms=30_000)

    async def main() -> None:
        await asyncio.wait_for(fetch_api._wait_spread(None, mesh, groups, [], lim, []),
                               HANG_S)  # type: ignore[arg-type]

    asyncio.run(main())
    assert "busy" in mesh.asked and mesh.cancelled == ["quiet"]
