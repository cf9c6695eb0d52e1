"""Rate-limited log lines: a flood of the same event gives a few lines and a count, not one each.

500 idle sockets that never send CONNECT gave 500 INFO lines, which buries everything else in
the log and costs the loop time exactly when it is under attack. Mosquitto prints one line per
socket; syslog and journald rate-limit at their end, which loses the count. This keeps the first
``burst`` lines of each window and then says how many more there were.
"""

from __future__ import annotations

import logging
import time
from typing import Any


class RateLimitedLog:
    """At most ``burst`` lines per ``window`` seconds for one kind of event, then a summary."""

    __slots__ = ("_log", "_level", "_burst", "_window", "_start", "_count", "_suppressed",
                 "_what")

    def __init__(self, log: logging.Logger, level: int, what: str, burst: int = 10,
                 window: float = 10.0) -> None:
        self._log = log
        self._level = level
        self._what = what
        self._burst = burst
        self._window = window
        self._start = 0.0
        self._count = 0
        self._suppressed = 0

    def __call__(self, msg: str, *args: Any, extra: dict | None = None) -> None:
        self.tick()
        self._count += 1
        if self._count <= self._burst:
            self._log.log(self._level, msg, *args, extra=extra)
        else:
            self._suppressed += 1

    def tick(self) -> None:
        """Close the window once it has passed, logging how many lines it held back (called
        by each event and by a periodic timer, so the count is not left until the next one)."""
        now = time.monotonic()
        if now - self._start < self._window:
            return
        if self._suppressed:
            self._log.log(self._level, "%d more %s in the last %.0f s (not logged one by one)",
                          self._suppressed, self._what, now - self._start,
                          extra={"suppressed": self._suppressed})
        self._start = now
        self._count = 0
        self._suppressed = 0
