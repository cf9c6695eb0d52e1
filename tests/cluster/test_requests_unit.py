"""cluster/requests.py: the mesh's one request table (claims, relays, reads) on a real event
loop. Links are plain keys to it (any object), so strings stand in for them here."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.requests import Requests


def _guard(fn: Any, *args: Any) -> None:
    fn(*args)


def _run(body: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(body(loop))
    finally:
        loop.close()


def test_a_link_going_down_fails_what_waits_on_it_at_once():
    """An answer that can no longer come is a failure now, not at the timeout (and never a
    success): the reads of that link fail, the others wait on."""

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        reqs = Requests(loop, _guard)
        failed: list[tuple[str, str, bool]] = []
        a = reqs.open(("A",), 60.0, lambda why, late: failed.append(("a", why, late)), "late")
        b = reqs.open(("B",), 60.0, lambda why, late: failed.append(("b", why, late)), "late")
        reqs.link_down("A", "the link to A went down")
        assert failed == [("a", "the link to A went down", False)]
        assert reqs.answer("A", a.id) is None  # ended: a late answer is dropped
        assert len(reqs) == 1
        assert reqs.answer("A", b.id) is None  # an answer on another link does not count
        assert reqs.answer("B", b.id) is b and not b.waiting
        assert len(reqs) == 0 and len(failed) == 1

    _run(body)


def test_a_claim_ends_when_every_link_answered_or_went_down():
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        reqs = Requests(loop, _guard)
        failed: list[str] = []
        claim = reqs.open(("A", "B", "C"), 60.0, lambda why, late: failed.append(why), "late")
        assert reqs.answer("A", claim.id) is claim and claim.waiting == {"B", "C"}
        reqs.link_down("B", "B down")
        assert not failed and len(reqs) == 1  # C may still answer
        reqs.link_down("C", "C down")
        assert failed == ["C down"] and len(reqs) == 0

    _run(body)


def test_the_timeout_fails_a_request_once_and_ids_are_never_reused():
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        reqs = Requests(loop, _guard)
        failed: list[tuple[str, bool]] = []
        first = reqs.open(("A",), 0.01, lambda why, late: failed.append((why, late)),
                          "no answer in 0.01 s")
        second = reqs.open(("A",), 60.0, lambda why, late: failed.append((why, late)), "late")
        assert first.id != second.id
        for _ in range(500):
            if failed:
                break
            await asyncio.sleep(0.01)
        assert failed == [("no answer in 0.01 s", True)]
        reqs.link_down("A", "down")  # the timed-out one is not failed twice
        assert failed == [("no answer in 0.01 s", True), ("down", False)]
        dropped = reqs.open(("A",), 60.0, lambda why, late: failed.append((why, late)), "late")
        reqs.drop(dropped)  # the asker gave up: nothing is called
        kept = reqs.open(("B",), 60.0, lambda why, late: failed.append((why, late)), "late")
        reqs.fail_all("shutting down")
        assert failed[-1] == ("shutting down", False) and len(failed) == 3
        assert reqs.answer("B", kept.id) is None and len(reqs) == 0

    _run(body)
