"""A follower reads its whole log once, checking every record's CRC, before it fetches.

Why (review5's flipped byte after a clean stop): a store that stopped cleanly trusts its
checkpoint at the next start and does not scan its segments, so a record whose bytes rotted
on disk while the router was down is found only when something reads it. Nothing reads a
follower's old records: it rejoined the ISR with the bad record, and once elected leader its
first reader met the CRC mismatch and the store quarantined the record: an acknowledged
message lost for good, although the old leader's ISR held good copies all along.

So the first time this router process follows a log, the fetcher (cluster/fetcher.py) first
reads it end to end through the store's checked read path (``read_durable``: every record's
CRC, a bad one quarantined as recovery would). Records lost that way are then below the log
end, and the fetcher's repair truncates there and fetches them again from the leader. Until
the read is done the follower sends no FETCH, so it cannot catch up, join the ISR, or be
elected with the hole (a follower still in the ISR from before its restart falls out after
``replica_lag_time_max`` while it reads). Kafka takes a log directory with a corrupt record
offline, and the controller moves its leaders elsewhere; a follower repairing from its leader
is the same rule one log at a time. Ceph and ZFS scrub for the same reason.

Cost: one read of every followed log per process start (not per leader change), in chunks of
``CHUNK`` records with the loop given back between chunks, so clients are served meanwhile.
On this box the checked read runs at a few hundred MB/s: a router following 10 GB catches up
tens of seconds after a start, its logs under-replicated (``meshmq_replica_*``) meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from commitlog.store import OffsetOutOfRangeError

log = logging.getLogger("cluster.fetcher")

CHUNK = 2000  # records per read; the loop is given back between reads
CHUNK_BYTES = 4 << 20


class LogVerifier:
    """Reads followed logs once per process (see the module docstring)."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.verified: set[str] = set()  # devices read end to end by this process
        self._reading: dict[str, list[Callable[[], None]]] = {}
        self.stats = {"logs": 0, "records": 0, "bytes": 0, "seconds": 0.0}

    def needed(self, device: str) -> bool:
        return device not in self.verified

    def verify(self, device: str, then: Callable[[], None]) -> None:
        """Read ``device``'s log end to end, then call ``then`` (also when the read failed:
        the fetcher's own checks go on from there)."""
        waiting = self._reading.get(device)
        if waiting is not None:
            waiting.append(then)
            return
        self._reading[device] = [then]
        start, _ = self.store.log_range(device)
        self.loop.call_soon(self._step, device, start, time.monotonic(), 0, 0)

    def _step(self, device: str, offset: int, began: float, records: int, size: int) -> None:
        store = self.store
        end = store.durable_end(device)
        try:
            if offset < end and device in store:
                got = store.read_durable(device, offset, CHUNK, CHUNK_BYTES)
                if got:
                    self.loop.call_soon(self._step, device, got[-1].offset + 1, began,
                                        records + len(got),
                                        size + sum(len(r.payload) for r in got))
                    return
                # nothing readable from here (a quarantined tail): the rest is lost ranges
        except OffsetOutOfRangeError:
            pass  # truncated or moved meanwhile: what remains was read
        except Exception as err:  # noqa: BLE001 - the fetcher's checks go on without it
            log.warning("reading a followed log to check it failed: %r; following it anyway",
                        err, extra={"device": device, "offset": offset})
        self._done(device, began, records, size)

    def _done(self, device: str, began: float, records: int, size: int) -> None:
        took = time.monotonic() - began
        self.verified.add(device)
        self.stats["logs"] += 1
        self.stats["records"] += records
        self.stats["bytes"] += size
        self.stats["seconds"] += took
        lost = self.store.lost_ranges(device, 0, self.store.durable_end(device))
        if lost:
            log.warning("a followed log failed its check at start: records %s lost to "
                        "corruption here; they are fetched again from the leader", lost,
                        extra={"device": device})
        elif took > 1.0:
            log.info("followed log checked end to end (%d records) in %.1f s", records, took,
                     extra={"device": device})
        for then in self._reading.pop(device, ()):
            then()
