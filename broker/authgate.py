"""Password checks that a flood of wrong passwords cannot use to starve legitimate clients.

A password check is scrypt, ~50 ms of CPU by design. Before this gate every CONNECT with a
password went to the loop's default executor in arrival order: 300 wrong-password CONNECTs were
answered at ~51/s and a valid client's CONNACK waited 5.35 s behind them (issue 11). The gate:

* runs at most ``auth.max_concurrent_checks`` checks at once, on threads of its own (the default
  executor stays free for everything else), the rest waiting in arrival order;
* refuses at once, without hashing, a login for a (client address, username) pair that failed
  ``auth.max_failures`` times in the last ``auth.failure_window`` seconds, and any login from an
  address that failed ``auth.max_address_failures`` times (whatever the usernames); checked
  again when a queued check reaches the front, so a burst queued before its first failures
  were known is cut short too. This is EMQX's flapping detection (max_count within
  window_time -> banned) applied to failed logins. The refusal is v5 0x9F Connection rate
  exceeded (3.1.1: 3 Server unavailable), which tells a client "later", not "wrong password";
* skips a queued check whose client has gone away meanwhile.

An attacker's failures lock out only its own address (with the usernames it tries there), for
at most one window after its last failure: never a username for everyone. Until issue 27 a
username was also counted alone, so anyone who knew it could keep its owner out from every
address (300 wrong passwords from one host locked the real user out for 59.5 s); the lockout
key is now the pair, as fail2ban's and sshd's per-source counting is. Every other client's
check waits for at most the checks already running and those queued before it by clients
that are not locked out.
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
THROTTLED_WHY = ("login refused without a password check: too many failed logins for this user "
                 "name from this address (auth.max_failures), or from this address "
                 "(auth.max_address_failures)")
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
                 max_address_failures: int | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._loop = loop
        self._check = check
        self._max = max_concurrent
        self._max_failures = max_failures  # per (address, username)
        # per address, any usernames (a host spraying many names); default: the pair's bound
        self._max_address = max_address_failures or max_failures
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
                   max_failures=settings.max_failures, failure_window=settings.failure_window,
                   max_address_failures=settings.max_address_failures)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def locked_out(self, address: str, username: str | None) -> bool:
        return (self._over("a:" + address, self._max_address)
                or self._over(_pair(address, username), self._max_failures))

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
            self._failed("a:" + address, self._max_address)
            self._failed(_pair(address, username), self._max_failures)
        try:
            done(code)
        finally:
            self._start_next()

    def _over(self, key: str, bound: int) -> bool:
        times = self._failures.get(key)
        if times is None:
            return False
        horizon = self._clock() - self._window
        while times and times[0] < horizon:
            times.popleft()
        if not times:
            del self._failures[key]
            return False
        return len(times) >= bound

    def _failed(self, key: str, bound: int) -> None:
        times = self._failures.get(key)
        if times is None:
            if len(self._failures) >= _MAX_KEYS:
                del self._failures[next(iter(self._failures))]
            times = self._failures[key] = deque(maxlen=bound)
        times.append(self._clock())


def _pair(address: str, username: str | None) -> str:
    """The lockout key of one username tried from one address (no username: the address's
    anonymous attempts)."""
    return "p:" + address + "\0" + (username if username is not None else "")
