"""Password checks that a flood of wrong passwords cannot use to starve legitimate clients.

A password check is scrypt, ~50 ms of CPU by design. Before this gate every CONNECT with a
password went to the loop's default executor in arrival order: 300 wrong-password CONNECTs were
answered at ~51/s and a valid client's CONNACK waited 5.35 s behind them (issue 11). The gate:

* runs at most ``auth.max_concurrent_checks`` checks at once, on threads of its own (the default
  executor stays free for everything else), the rest waiting in arrival order;
* refuses at once, without hashing, a CONNECT from an address or for a username that failed
  ``auth.max_failures`` times in the last ``auth.failure_window`` seconds; checked again when a
  queued check reaches the front, so a burst queued before its first failures were known is cut
  short too. This is EMQX's flapping detection (max_count within window_time -> banned) applied to
  failed logins, keyed as EMQX's banned table is (peer host and username). The refusal is v5
  0x9F Connection rate exceeded (3.1.1: 3 Server unavailable), which tells a client "later", not
  "wrong password";
* skips a queued check whose client has gone away meanwhile.

An attacker's failures lock out only its own address and the usernames it tries, for at most one
window after its last failure; every other client's check waits for at most the checks already
running and those queued before it by clients that are not locked out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("broker.authgate")

#: v5 CONNACK 0x9F Connection rate exceeded: the answer to a locked-out address or username.
THROTTLED = 0x9F
THROTTLED_WHY = ("login refused without a password check: too many failed logins from this "
                 "address or for this user name (auth.max_failures)")
_FAILED = (0x86, 0x87)  # bad user name or password, not authorised
_MAX_KEYS = 100_000  # addresses + usernames with recent failures remembered (oldest forgotten)

Done = Callable[[int], None]


def refusal_text(code: int) -> str:
    """The CONNACK reason string for a refused login."""
    if code == THROTTLED:
        return "too many failed logins; retry later"
    return "not authorised" if code == 0x87 else "bad user name or password"


class PasswordCheckGate:
    def __init__(self, loop: asyncio.AbstractEventLoop,
                 check: Callable[[str | None, bytes | None], int], *, max_concurrent: int,
                 max_failures: int, failure_window: float,
                 clock: Callable[[], float] | None = None) -> None:
        self._loop = loop
        self._check = check
        self._max = max_concurrent
        self._max_failures = max_failures
        self._window = failure_window
        self._clock = clock or loop.time
        self._executor: ThreadPoolExecutor | None = None
        self._running = 0
        # (address, username, password, done, alive) in arrival order
        self._waiting: deque[tuple[str, str | None, bytes | None, Done, Callable[[], bool]]] = \
            deque()
        self._failures: dict[str, deque[float]] = {}

    @classmethod
    def for_logins(cls, loop: asyncio.AbstractEventLoop, authenticator: Any,
                   settings: Any) -> PasswordCheckGate | None:
        """The MQTT login gate from ``AuthSettings``; None without a password file."""
        if authenticator is None or not settings.password_file:
            return None
        return cls(loop, authenticator.authenticate, max_concurrent=settings.max_concurrent_checks,
                   max_failures=settings.max_failures, failure_window=settings.failure_window)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def locked_out(self, address: str, username: str | None) -> bool:
        return self._over("a:" + address) or (username is not None and self._over("u:" + username))

    def submit(self, address: str, username: str | None, password: bytes | None, done: Done,
               alive: Callable[[], bool]) -> int | None:
        """Queue a check; ``done(code)`` is called on the loop later. Returns THROTTLED at once
        (and never calls ``done``) when the address or username is locked out."""
        if self.locked_out(address, username):
            return THROTTLED
        self._waiting.append((address, username, password, done, alive))
        self._start_next()
        return None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -- internals ----------------------------------------------------------------------------
    def _start_next(self) -> None:
        waiting = self._waiting
        while waiting and self._running < self._max:
            address, username, password, done, alive = waiting.popleft()
            if not alive():
                continue
            if self.locked_out(address, username):
                done(THROTTLED)
                continue
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._max, thread_name_prefix="meshmq-auth")
            self._running += 1
            fut = self._loop.run_in_executor(self._executor, self._check, username, password)
            fut.add_done_callback(
                lambda f, a=address, u=username, d=done: self._finished(f, a, u, d))

    def _finished(self, fut: asyncio.Future[Any], address: str, username: str | None,
                  done: Done) -> None:
        self._running -= 1
        try:
            code = fut.result()
        except Exception:  # noqa: BLE001 - a backend failure refuses, it does not crash
            log.exception("password check failed with an error", extra={"peer": address})
            code = 0x88  # Server unavailable
        if code in _FAILED:
            self._failed("a:" + address)
            if username is not None:
                self._failed("u:" + username)
        try:
            done(code)
        finally:
            self._start_next()

    def _over(self, key: str) -> bool:
        times = self._failures.get(key)
        if times is None:
            return False
        horizon = self._clock() - self._window
        while times and times[0] < horizon:
            times.popleft()
        if not times:
            del self._failures[key]
            return False
        return len(times) >= self._max_failures

    def _failed(self, key: str) -> None:
        times = self._failures.get(key)
        if times is None:
            if len(self._failures) >= _MAX_KEYS:
                del self._failures[next(iter(self._failures))]
            times = self._failures[key] = deque(maxlen=self._max_failures)
        times.append(self._clock())
