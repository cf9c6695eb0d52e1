"""Compacted state logs in the commit log store: the newest value per name survives a restart.

Why in the commit log store, and not a file of the broker's own: a state record appended in the
same loop tick as a publish is written and fsynced *with* it (one write, one fsync: a retained
publish is acknowledged once its device record and its retained record are both durable, by the
acknowledgement path the logged publishes already have); the store brings CRCs, torn-tail
recovery and quarantine of corrupt records; and the cluster's log replication will carry these
logs like any other. Kafka's compacted topics are the model: records are keyed (here by the
record's topic field: a retained topic, a client id), the newest record of a name wins, and an
empty value deletes the name (a tombstone).

The logs live under internal keys (``commitlog.store.INTERNAL_PREFIX``): hidden from the device
listing and the fetch API, and never deleted by retention. Compaction is therefore ours: the owner
rewrites every live value at the head of the log (a snapshot) and, once that is durable, moves
the log's start to the snapshot's first record (``LogStore.advance_start``); the store then frees
the segments nothing needs any more. Replaying *any* suffix of the log that begins at or before
the start of a complete snapshot gives the current state: a name whose newest record lies before
the suffix is either deleted (that record is a tombstone) or rewritten in the snapshot. So a
crash in the middle of a snapshot costs nothing (the start has not moved), and restart reads at
most the live state plus what was written since the last snapshot (bounded below).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from commitlog.groupcommit import GroupCommitter
from commitlog.record import Header, Record
from commitlog.store import LogWriteError

log = logging.getLogger("broker.statelog")

#: Compact once this many bytes were written since the last snapshot and more than the
#: snapshot itself: the log holds at most about twice the live state plus this.
MIN_COMPACT_BYTES = 4 * 1024 * 1024
#: A segment holding a state record cannot be deleted by retention until the state log's
#: start moves past it. Rewrite a snapshot at least this often once the store has rolled to a
#: new segment since the last one, so device-log retention is held up by at most this long.
COMPACT_INTERVAL_S = 3600.0
_RECORD_OVERHEAD = 32  # bytes of framing per record, for the compaction trigger

# One live value to write in a snapshot: (name, attrs, headers, payload).
Item = tuple[str, int, "Sequence[Header] | None", bytes]


class StateLog:
    """One compacted log (one internal key) of the commit log store."""

    def __init__(self, committer: GroupCommitter, key: str) -> None:
        self.committer = committer
        self.store = committer.store
        self.key = key
        self.written = 0  # bytes appended since the last snapshot began
        self.snapshot_bytes = 0  # bytes of the last snapshot (or of what a restart read)
        self.snapshot_at = time.monotonic()
        self.snapshot_segment = -1  # base of the store's active segment at the last snapshot
        self.compacting = False
        self.corrupt = 0  # records that could not be read at restart (logged, counted)

    def append(self, name: str, payload: bytes, attrs: int = 0,
               headers: Sequence[Header] | None = None) -> int:
        """Append one value (empty ``payload``: a tombstone) to this tick's batch. Raises
        LogWriteError while the log cannot write (the caller must not acknowledge)."""
        self.written += len(name) + len(payload) + _RECORD_OVERHEAD
        return self.committer.append(self.key, time.time_ns() // 1000, name, attrs, headers,
                                     payload)

    def replay(self) -> tuple[dict[str, Record], int]:
        """The newest record of every live name, reading the whole log (from its start), and
        the newest record timestamp seen (µs, 0 if none).

        A record that cannot be read is logged, counted in ``corrupt`` and skipped: it costs
        its own name at most (that name keeps its previous value, if any), never the others.
        (The store already quarantined what recovery found damaged; this guards the rest.)"""
        store = self.store
        latest: dict[str, Record] = {}
        newest_us = 0
        start, end = store.log_range(self.key)
        off = start
        step = 1024
        while off < end:
            try:
                records = store.read(self.key, off, step, 1 << 24)
            except Exception as err:  # noqa: BLE001 - a damaged record, whatever it raises
                if step > 1:
                    step = 1  # find the bad one, one record at a time
                    continue
                self.corrupt += 1
                log.error("state log %s: record at offset %d unreadable (%r); skipped, the "
                          "other names are restored", self.key, off, err)
                off += 1
                step = 1024
                continue
            if not records:
                nxt = store.past_gap(self.key, off)
                if nxt == off:
                    break
                off = nxt
                continue
            for rec in records:
                if rec.payload:
                    latest[rec.topic] = rec
                else:
                    latest.pop(rec.topic, None)
                if rec.timestamp_us > newest_us:
                    newest_us = rec.timestamp_us
            off = records[-1].offset + 1
            step = 1024
        # Records the store itself found corrupt and skipped (commitlog/salvage.py: a reader
        # salvages them, so no exception reached the loop above): lost all the same, and
        # counted here, where the restored-state line and metric report what came back.
        self.corrupt += sum(hi - lo for lo, hi in store.lost_ranges(self.key, start, end))
        self.snapshot_bytes = sum(len(r.topic) + len(r.payload) + _RECORD_OVERHEAD
                                  for r in latest.values())
        self.written = max(0, (end - start) - len(latest)) * _RECORD_OVERHEAD
        return latest, newest_us

    def needs_compaction(self) -> bool:
        """Enough superseded records to rewrite (bounded restart time and disk), or the log
        holds up retention of an old segment (see COMPACT_INTERVAL_S)."""
        if self.compacting or not self.written:
            return False
        if self.written > max(self.snapshot_bytes, MIN_COMPACT_BYTES):
            return True
        segments = self.store.segments
        return (time.monotonic() - self.snapshot_at > COMPACT_INTERVAL_S
                and bool(segments) and segments[-1].base != self.snapshot_segment)

    def compact(self, items: Iterable[Item]) -> None:
        """Write a snapshot of every live value now (one loop turn: nothing interleaves), and
        move the start to it once it is durable."""
        first = self.store.log_end(self.key)
        self.compacting = True
        written, self.written = self.written, 0
        size = 0
        try:
            for name, attrs, headers, payload in items:
                self.committer.append(self.key, time.time_ns() // 1000, name, attrs, headers,
                                      payload)
                size += len(name) + len(payload) + _RECORD_OVERHEAD
        except LogWriteError as err:
            log.warning("state log %s: compaction postponed, the log cannot write (%s)",
                        self.key, err)
            self.compacting = False
            self.written += written
            return
        segments = self.store.segments
        self.snapshot_segment = segments[-1].base if segments else -1
        self.snapshot_at = time.monotonic()

        def done(exc: BaseException | None) -> None:
            self.compacting = False
            if exc is not None:
                log.warning("state log %s: compaction not stored (%s); retried later",
                            self.key, exc)
                self.written += written + size
                return
            self.snapshot_bytes = size
            self.store.advance_start(self.key, first)
            log.info("state log compacted", extra={"log": self.key, "bytes": size,
                                                   "from_offset": first})

        self.committer.when_durable(done)
