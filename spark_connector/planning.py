"""Pure planning: how many records each device gets in a trigger, and how ranges become tasks.

No I/O and no Spark here, so the rules are plain functions the driver-side reader calls.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["admit", "group_ranges", "DeviceRange"]

# (device, from_offset, until_offset, is_new): records [from, until) of one device log. ``is_new``
# marks a device that was not in the trigger's start offsets: it is read from its earliest
# retained record, so retention that ran before we first saw it is not data loss.
DeviceRange = tuple[str, int, int, bool]


def admit(available: Mapping[str, int], max_records: int) -> dict[str, int]:
    """Split ``max_records`` over devices by water-filling: every device gets an equal share,
    what a small device does not use goes to the others. Kafka's ``maxOffsetsPerTrigger``
    splits proportionally to lag instead, which lets one backlogged device starve the rest of a
    trigger; equal shares keep every device's latency bounded. Deterministic (sorted devices),
    so a restarted driver plans the same batch from the same offsets."""
    want = {d: n for d, n in available.items() if n > 0}
    total = sum(want.values())
    if total <= max_records:
        return dict(want)
    out = dict.fromkeys(want, 0)
    left = max_records
    active = sorted(want)
    while left > 0 and active:
        share = max(1, left // len(active))
        nxt: list[str] = []
        for d in active:
            if left <= 0:
                break
            take = min(share, want[d] - out[d], left)
            out[d] += take
            left -= take
            if out[d] < want[d]:
                nxt.append(d)
        active = nxt
    return {d: n for d, n in out.items() if n > 0}


def group_ranges(ranges: list[DeviceRange], max_per_partition: int) -> list[list[DeviceRange]]:
    """Pack device ranges into partitions of at most ``max_per_partition`` records: a big range
    is cut into several partitions, small ones share one. So a partition is neither a single
    tiny device (one Spark task and one HTTP round trip per device would dominate at 10k
    devices) nor unbounded (a 50M-record backlog in one task runs on one core and buffers in
    one worker). Same idea as Kafka's ``minPartitions`` splitting big offset ranges."""
    parts: list[list[DeviceRange]] = []
    cur: list[DeviceRange] = []
    room = max_per_partition
    for device, lo, hi, is_new in sorted(ranges):
        while lo < hi:
            take = min(hi - lo, room)
            cur.append((device, lo, lo + take, is_new))
            lo += take
            room -= take
            if room == 0:
                parts.append(cur)
                cur, room = [], max_per_partition
    if cur:
        parts.append(cur)
    return parts
