"""Plain counters the metrics collector reads at scrape time (no prometheus here)."""

from __future__ import annotations

from collections import deque

# Upper bounds (seconds) of the fsync latency histogram buckets; the last is +Inf.
FSYNC_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, float("inf"),
)


class LogStats:
    """Monotonic ints (and one bounded deque). Written by the event loop thread, except
    the fsync fields which only the fsync worker writes; readers tolerate tearing
    between fields because each is a single int."""

    __slots__ = (
        "appends", "append_bytes", "batches", "batch_records_sum", "fsyncs",
        "fsync_seconds_sum", "fsync_buckets", "fsync_recent_s", "fsync_errors",
        "write_errors", "recovery_truncations", "recovery_truncated_bytes",
        "retention_segments_deleted", "retention_bytes_deleted", "retention_held_by_hwm",
        "segments",
        "segments_rolled", "tail_cache_hits", "tail_cache_misses", "tail_cache_bytes",
        "tail_cache_evictions", "disk_reads", "checkpoints", "index_rebuilds",
        "writable", "corrupt_records", "corrupt_bytes",
    )

    def __init__(self) -> None:
        self.appends = 0
        self.append_bytes = 0
        self.batches = 0
        self.batch_records_sum = 0
        self.fsyncs = 0
        self.fsync_seconds_sum = 0.0
        self.fsync_buckets = [0] * len(FSYNC_BUCKETS_S)
        self.fsync_recent_s: deque[float] = deque(maxlen=1024)
        self.fsync_errors = 0
        self.write_errors = 0
        self.recovery_truncations = 0
        self.recovery_truncated_bytes = 0
        self.retention_segments_deleted = 0
        self.retention_bytes_deleted = 0
        # retention passes that left a device's start at its high-water mark (not committed
        # past it yet: a lagging follower or a held ISR), instead of where the limit said
        self.retention_held_by_hwm = 0
        self.segments = 0
        self.segments_rolled = 0
        self.tail_cache_hits = 0
        self.tail_cache_misses = 0
        self.tail_cache_bytes = 0
        self.tail_cache_evictions = 0
        self.disk_reads = 0
        self.checkpoints = 0
        self.index_rebuilds = 0
        # 1 while the log accepts writes, 0 from a write/fsync failure until a probe write
        # succeeds (set by the GroupCommitter; a gauge, not a counter).
        self.writable = 1
        # Recovery found a corrupt record with intact records after it: the bad bytes were
        # copied to quarantine/ and skipped (see LogStore._quarantine).
        self.corrupt_records = 0
        self.corrupt_bytes = 0

    def observe_fsync(self, seconds: float) -> None:
        """Record one fsync latency (count, sum, cumulative-friendly buckets, recent)."""
        self.fsyncs += 1
        self.fsync_seconds_sum += seconds
        for i, bound in enumerate(FSYNC_BUCKETS_S):
            if seconds <= bound:
                self.fsync_buckets[i] += 1
                break
        self.fsync_recent_s.append(seconds)

    def as_dict(self) -> dict[str, object]:
        """A snapshot for logs, tests and the collector."""
        out: dict[str, object] = {}
        for name in self.__slots__:
            v = getattr(self, name)
            out[name] = list(v) if isinstance(v, deque | list) else v
        return out
