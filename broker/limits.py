"""Resource limits a client cannot grow past, and the rate-limited log line each one writes.

Every resource a client controls is bounded by a documented config key; when a limit is hit the
broker refuses or closes the one client involved, counts it in ``meshmq_limit_hits_total`` with
the key's name as the label, and writes a log line, at most one per limit every few seconds, so a
flood of refusals cannot flood the log too (Mosquitto logs every refusal; EMQX rate-limits its
"flapping" and "overload" warnings the same way).

The checks are small pure functions and counters; the router and listener call them through one
line each (router.py stays a router, not a policy file).
"""

from __future__ import annotations

import logging
import time

from broker.stats import BrokerStats

log = logging.getLogger("broker.limits")

#: The label values of ``meshmq_limit_hits_total``: the config key of each limit. Listed up front
#: so every series exists at zero (a series that appears only on its first hit breaks alerting).
LIMIT_NAMES = (
    "max_topic_levels",
)

_LOG_EVERY_S = 10.0  # at most one log line per limit in this many seconds


def too_many_levels(topic: str, max_levels: int) -> bool:
    """Whether ``topic`` (a name or filter) has more than ``max_levels`` levels.

    One C-level ``str.count`` per PUBLISH: the cost on the hot path is a few tens of
    nanoseconds for ordinary topics. EMQX's default of 128 levels is far above any real topic
    design and far below the ~1,000 levels that used to overflow the recursive trie walks.
    """
    return topic.count("/") >= max_levels


class LimitLog:
    """Count a limit hit and log it, at most once per limit every ``_LOG_EVERY_S`` seconds.

    The line carries how many hits were not logged since the last one, so an operator reading
    the log still sees the rate; the exact count is in the metric.
    """

    def __init__(self, stats: BrokerStats) -> None:
        self._stats = stats
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def hit(self, limit: str, message: str, **extra: object) -> None:
        self._stats.limit_hit(limit)
        now = time.monotonic()
        last = self._last.get(limit)
        if last is not None and now - last < _LOG_EVERY_S:
            self._quiet[limit] = self._quiet.get(limit, 0) + 1
            return
        self._last[limit] = now
        suppressed = self._quiet.pop(limit, 0)
        log.warning("limit %s hit: %s%s", limit, message,
                    f" ({suppressed} more hits since the last line)" if suppressed else "",
                    extra={"limit": limit, **extra})
