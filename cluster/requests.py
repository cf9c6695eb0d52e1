"""``Requests``: the mesh's one table of requests waiting for answers from peer routers.

Every request a router sends a peer and waits on goes through it: session claims (CLAIM to
every up link, CLAIMED back from each), admin requests relayed to a device log's leader
(ADMIN_REQUEST/RESPONSE), and log reads (RESOLVE/RESOLVED, FETCH/RECORDS). One policy for all:

- an id from one counter (the frames carry it as a u64; the kinds have their own frame types,
  so one id space is enough);
- a request waits on the links it was sent on; an answer counts only from one of those links
  (an answer on another link, or after the request ended, is dropped);
- it ends when every link answered, when its timeout runs out, or when a link it still waits
  on goes down or reconnects (its answer can no longer come: requests are never resent, the
  asker retries). Ended without every answer, the caller's ``fail(why, timed_out)`` runs: an
  unknown outcome is never a success.

The timeout values stay the callers' (claims 2 s, resolves 5 s, reads 10 s, relays the fetch
API's 35 s); Kafka's NetworkClient is the model (one in-flight table per connection, every
request failed with a disconnect error when its connection closes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

# fail(why, timed_out): the request ended without every answer
Fail = Callable[[str, bool], None]
# how a callback is run: the mesh's guard, so that a caller's bug never escapes into a link's
# frame loop or a timer (cluster/mesh.py ``_answer``)
Guard = Callable[..., None]


class Pending:
    """One request: the links it waits on, what happens if it ends unanswered, its timer.
    ``done`` and ``value`` are the caller's (what an answer is given to; a claim keeps there
    the session state it was handed)."""

    __slots__ = ("id", "waiting", "fail", "timer", "done", "value")

    def __init__(self, req: int, waiting: set[Any], fail: Fail) -> None:
        self.id = req
        self.waiting = waiting
        self.fail = fail
        self.timer: asyncio.TimerHandle | None = None
        self.done: Any = None
        self.value: Any = None


class Requests:
    def __init__(self, loop: asyncio.AbstractEventLoop, guard: Guard) -> None:
        self._loop = loop
        self._guard = guard
        self._seq = 0
        self._pending: dict[int, Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def open(self, links: Collection[Any], timeout: float, fail: Fail, late: str) -> Pending:
        """A request sent (by the caller) on ``links``; ``fail(late, True)`` after ``timeout``
        seconds unless every link answered first."""
        self._seq += 1
        req = Pending(self._seq, set(links), fail)
        req.timer = self._loop.call_later(timeout, self._expire, req.id, late)
        self._pending[req.id] = req
        return req

    def answer(self, link: Any, req_id: int) -> Pending | None:
        """An answer to ``req_id`` came on ``link``: the request, or None when it is not
        waiting for one from there (ended, or another link). ``not req.waiting`` tells the
        caller this was the last answer (the request has ended)."""
        req = self._pending.get(req_id)
        if req is None or link not in req.waiting:
            return None
        req.waiting.discard(link)
        if not req.waiting:
            self._end(req)
        return req

    def drop(self, req: Pending) -> None:
        """The asker gave up (its coroutine was cancelled): forget it, call nothing."""
        if self._pending.get(req.id) is req:
            self._end(req)

    def link_down(self, link: Any, why: str) -> None:
        """``link`` went down or reconnected: every request waiting on it stops waiting for
        it, and one left waiting on no link ends with ``fail(why, False)``."""
        for req in [r for r in self._pending.values() if link in r.waiting]:
            req.waiting.discard(link)
            if not req.waiting:
                self._end(req)
                self._guard(req.fail, why, False)

    def fail_all(self, why: str) -> None:
        """At shutdown: every request fails now."""
        for req in list(self._pending.values()):
            self._end(req)
            self._guard(req.fail, why, False)

    def _expire(self, req_id: int, late: str) -> None:
        req = self._pending.get(req_id)
        if req is not None:
            self._end(req)
            self._guard(req.fail, late, True)

    def _end(self, req: Pending) -> None:
        del self._pending[req.id]
        if req.timer is not None:
            req.timer.cancel()
