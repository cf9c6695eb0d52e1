"""Settings of the commit log, parsed once at start-up by the node wiring."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class LogSettings:
    """Every knob of the store and the group committer, with the reason it exists.

    segment_bytes: size at which the shared store rolls to a new segment file. Retention
        frees disk a whole segment at a time (unlink is O(1), no compaction), so smaller
        segments free space sooner; larger ones mean fewer files and fewer rolls.
    index_interval_bytes: a device gets a sparse index entry (offset -> store position,
        plus the time index) every this many bytes of *its own* records, and always at its
        first record in each segment. A read by offset or time starts at most this many
        device bytes before the target, instead of at a segment start (Spark pitfall 8).
        Smaller = faster seeks, more memory (32 bytes per entry).
    fsync: ``"batch"`` (default) fsyncs every write batch before its QoS 1/2 acks, so an
        acknowledged publish survives power loss. An int is an interval in ms: writes
        still happen every loop tick, but fsync runs at most once per interval and acks
        wait for it: fewer fsyncs on slow disks, at the price of ack latency up to the
        interval. (Neither policy acks unsynced data; the interval only trades latency.)
    retention_ms: records whose whole segment is older than this are deleted (by record
        timestamp). 0 keeps everything forever.
    retention_bytes_per_device: cap on one device's retained bytes; its start offset
        advances past older records (granularity: index_interval_bytes). 0 = unlimited.
        This bounds a chatty device's share without a per-device file.
    tail_cache_bytes_per_device: newest records kept in memory per device so live
        subscribers and near-head readers never touch the disk.
    tail_cache_bytes_total: global cap of the tail cache; least recently used devices
        lose their cache first, so 100k devices cannot exhaust memory.
    checkpoint_interval_s: how often the in-memory indexes are written to disk. Recovery
        rescans only what was written after the last checkpoint, so this bounds restart
        time; each checkpoint costs time proportional to the number of devices.
    read_fd_cache: how many segment files stay open for reads. The store needs
        1 write fd + this many + 2 (lock, directory), whatever the number of devices.
    """

    segment_bytes: int = 64 * MiB
    index_interval_bytes: int = 4096
    fsync: str | int = "batch"
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes_per_device: int = 0
    tail_cache_bytes_per_device: int = 1 * MiB
    tail_cache_bytes_total: int = 256 * MiB
    checkpoint_interval_s: float = 60.0
    read_fd_cache: int = 16

    def __post_init__(self) -> None:
        if self.segment_bytes < 1024:
            raise ValueError("segment_bytes must be at least 1024")
        if self.index_interval_bytes < 1:
            raise ValueError("index_interval_bytes must be positive")
        if not (self.fsync == "batch" or (isinstance(self.fsync, int) and self.fsync > 0)):
            raise ValueError('fsync must be "batch" or a positive interval in ms')
        for name in (
            "retention_ms",
            "retention_bytes_per_device",
            "tail_cache_bytes_per_device",
            "tail_cache_bytes_total",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_interval_s must be positive")
        if self.read_fd_cache < 1:
            raise ValueError("read_fd_cache must be >= 1")

    @property
    def fsync_interval_ms(self) -> int | None:
        """None for per-batch fsync, else the interval."""
        return None if self.fsync == "batch" else int(self.fsync)
