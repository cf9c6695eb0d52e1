"""A reader that meets a corrupt record: find what it lost, the way recovery would.

Why readers need this at all: after a clean shutdown the checkpoint covers the whole log, so
start-up scans nothing (Kafka trusts its clean-shutdown marker the same way and recovers only
unflushed segments). A byte that rots on disk afterwards is therefore met by the first reader,
and before this every reader of that device failed on it: ``GET /records`` answered 500, an MQTT
replay closed the connection, the Spark source stopped; 299 of 300 records were intact.

Scanning the tail at a clean start would not help: rot can be anywhere, and a scan of the whole
store at every start is what the checkpoint exists to avoid. Every reader already verifies
every record's CRC, so the read path is where corruption is found, at the cost of one walk
here per corrupt record, and its answer is kept (``quarantine/gaps.json``).

:func:`walk_device` is that walk: the authoritative one, from a position of one of the
device's records, every record's framing and CRC checked, resynchronising over a bad range
on the next record whose header and CRC check out (``quarantine.next_valid_record``, as
recovery does). It trusts neither the position index nor a damaged length field. The store
(``LogStore._salvage``) turns its answer into what recovery produces: a gap of the device's
lost offsets that readers skip, the bad bytes in quarantine/, an ERROR line and
``meshmq_log_corrupt_*``. Offsets are never renumbered: the lost ones stay lost.

Pure functions over bytes; knows nothing of MQTT, HTTP or sockets.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable
from typing import NamedTuple

from commitlog.quarantine import next_valid_record
from commitlog.record import FLAG_CONTROL, HEADER, HEADER_SIZE, frame_end


class Walk(NamedTuple):
    """What :func:`walk_device` found in one stretch of segment bytes."""

    found: int  # offset of the device's first intact record at or after ``want``; -1: none
    # bad byte ranges: (start, end) store positions, and whether the damaged header still
    # names another device's record (``is_other``): then it is that device's loss to report
    bad: list[tuple[int, int, bool]]
    end: int  # store position where the walk stopped (the found record, or the end)
    # ``bad[mine:]`` follow the device's last intact record below ``want`` (the ranges that
    # can hold what it lost); -1 when this stretch has no such record (all may be its)
    mine: int


def walk_device(data: bytes, pos0: int, kb: bytes, want: int,
                is_stale: Callable[[int, int], bool] | None = None,
                is_other: Callable[[bytes, int], bool] | None = None) -> Walk:
    """Walk ``data`` (segment bytes starting at store position ``pos0``, record-aligned) for
    the first intact, non-stale record of key ``kb`` with offset >= ``want``.

    ``bad`` lists every range that failed its checks on the way: the ones before the device's
    last intact record below ``want`` (``bad[:mine]``) are other devices' (the store
    remembers them too, so that a header walk of the segment steps over them)."""
    n = len(data)
    mv = memoryview(data)
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    klen = len(kb)
    bad: list[tuple[int, int, bool]] = []
    mine = -1
    p = 0
    try:
        while p < n:
            ok = n - p >= HEADER_SIZE
            if ok:
                length, crc, magic, flags, _a, off, _ts, kl, _tl, _hc = unpack(data, p)
                end = frame_end(length, magic, p, n)
                ok = end > 0 and crc32(mv[p + 8 : end]) == crc
            if not ok:
                q = next_valid_record(data, p)
                q = n if q < 0 else q
                other = False
                if is_other is not None and q - p >= HEADER_SIZE:
                    _l, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = unpack(data, p)
                    if p + HEADER_SIZE + kl <= q:
                        other = is_other(data[p + HEADER_SIZE : p + HEADER_SIZE + kl], off)
                bad.append((pos0 + p, pos0 + q, other))
                p = q
                continue
            if (kl == klen and not flags & FLAG_CONTROL
                    and data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == kb
                    and not (is_stale is not None and is_stale(pos0 + p, off))):
                if off >= want:
                    return Walk(off, bad, pos0 + p, mine)
                mine = len(bad)
            p = end
        return Walk(-1, bad, pos0 + n, mine)
    finally:
        mv.release()


def verified_positions(data: bytes, new_positions: Callable[[], array]) -> dict[bytes, array]:
    """Device positions of a whole sealed segment (``rel << 32 | size``, as ``.pidx`` holds
    them), every record CRC-checked and bad bytes stepped over.

    For a segment whose header-only walk (``store.walk_positions``) stopped early: a damaged
    length field that still looks plausible sends that walk into the middle of the next
    record, so resynchronising from where it stopped could skip an intact record of another
    device and leave it out of the index (its reads would then stop there). Costs a CRC per
    record, paid only for a damaged segment."""
    out: dict[bytes, array] = {}
    n = len(data)
    mv = memoryview(data)
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    p = 0
    try:
        while n - p >= HEADER_SIZE:
            length, crc, magic, flags, _a, _off, _ts, kl, _tl, _hc = unpack(data, p)
            end = frame_end(length, magic, p, n)
            if end < 0 or crc32(mv[p + 8 : end]) != crc:
                p = next_valid_record(data, p)
                if p < 0:
                    break
                continue
            if not flags & FLAG_CONTROL:
                kb = data[p + HEADER_SIZE : p + HEADER_SIZE + kl]
                arr = out.get(kb)
                if arr is None:
                    arr = out[kb] = new_positions()
                arr.append((p << 32) | (end - p))
            p = end
        return out
    finally:
        mv.release()
