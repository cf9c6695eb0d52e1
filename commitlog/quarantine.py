"""Corrupt records in the middle of the log: find the intact ones after them, keep the bad bytes.

Recovery mode, made explicit (RocksDB names its WAL recovery modes for the same choice):

* A **torn tail** (the end of the last write, cut by a crash) has no valid record after the
  first bad byte, in its segment and in any later one. It is truncated, as RocksDB's
  ``kTolerateCorruptedTailRecords`` does: those records were never acknowledged (an ack
  waits for the fsync that covers the whole batch).
* A **corrupt record followed by intact ones** (bit rot, a bad sector, a stray write) is not
  a crash artefact. RocksDB's default ``kPointInTimeRecovery`` would stop there and drop
  every later record; for a DB WAL that keeps the state consistent, but here records are
  independent messages of many devices, every later record was acknowledged, and cutting
  them is exactly the silent loss the broker promises never to cause (the issue measured
  12,468 of 25,088 acked records deleted by one flipped bit). So we do what
  ``kSkipAnyCorruptedRecords`` does, with evidence kept: the scan resynchronises on the next
  record whose header and CRC check out, the bad byte range is copied to
  ``quarantine/<device>-<segment base>-<position>-<bytes>.bad`` (fsynced), reported at ERROR
  with device, offsets and byte counts and counted in ``meshmq_log_corrupt_*``; the bytes
  stay in the segment (positions are global, nothing moves) and no index points at them.
* The offsets that were in the bad range are a **gap**: recorded per device in
  ``quarantine/gaps.json`` so that readers (disk reads, replay, fetch) skip them with the
  reason instead of reporting an index error or stalling. A device's offsets after a gap are
  never reassigned: when the bad range held the device's last record, its header (if it
  still names the device and exactly the next offset) moves the device's next offset past it.

Knows nothing of MQTT; imports nothing of ours but the record format.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
import zlib

from commitlog.record import HEADER, HEADER_SIZE, MAGIC, frame_end

log = logging.getLogger("meshmq.commitlog")

QUARANTINE_DIR = "quarantine"
GAPS_NAME = "gaps.json"


def next_valid_record(data: bytes, p: int) -> int:
    """Position of the first record after ``p`` whose framing and CRC check out, or -1.

    Candidates are the bytes where the magic would be; a false match needs a 32-bit CRC to
    agree by chance on a plausible length."""
    n = len(data)
    mv = memoryview(data)
    q = p + 1
    try:
        while True:
            m = data.find(bytes((MAGIC,)), q + 8)
            if m < 0:
                return -1
            q = m - 8
            if q + HEADER_SIZE > n:
                return -1
            length, crc, magic, *_ = HEADER.unpack_from(data, q)
            end = frame_end(length, magic, q, n)
            if end > 0 and zlib.crc32(mv[q + 8 : end]) == crc:
                return q
            q += 1
    finally:
        mv.release()


def header_hints(data: bytes, p: int, end: int) -> list[tuple[str, int]]:
    """(key, offset) of the records in a bad range whose headers still read as such (walked
    by their length fields; untrusted: only used when they agree with the log)."""
    out: list[tuple[str, int]] = []
    while p + HEADER_SIZE <= end:
        length, _crc, magic, _flags, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        nxt = frame_end(length, magic, p, end)
        if nxt < 0 or p + HEADER_SIZE + kl > nxt:
            break
        try:
            out.append((data[p + HEADER_SIZE : p + HEADER_SIZE + kl].decode(), off))
        except UnicodeDecodeError:
            break
        p = nxt
    return out


def write_quarantine(directory: str, device: str, seg_base: int, pos: int,
                     data: bytes) -> str:
    """Copy a bad byte range to the quarantine directory (fsynced); return its path."""
    qdir = os.path.join(directory, QUARANTINE_DIR)
    os.makedirs(qdir, exist_ok=True)
    name = (f"{urllib.parse.quote(device, safe='')}-{seg_base:020d}-{pos:020d}-"
            f"{len(data)}.bad")
    path = os.path.join(qdir, name)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(qdir)
    return path


def quarantined_ranges(directory: str) -> list[tuple[int, int, str]]:
    """The store byte ranges ``[start, end)`` already copied to quarantine/, with their files,
    from the files' names (``write_quarantine``: device, segment base, store position,
    length). Few files: a directory listing."""
    qdir = os.path.join(directory, QUARANTINE_DIR)
    try:
        names = os.listdir(qdir)
    except OSError:
        return []
    out = []
    for name in names:
        parts = name[: -len(".bad")].rsplit("-", 3) if name.endswith(".bad") else []
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            pos, size = int(parts[2]), int(parts[3])
            out.append((pos, pos + size, os.path.join(qdir, name)))
    return out


def uncovered(copies: list[tuple[int, int, str]], lo: int,
              hi: int) -> tuple[list[tuple[int, int]], list[str]]:
    """The parts of ``[lo, hi)`` no copy in ``copies`` covers, and the files of the copies
    that cover some of it."""
    pieces: list[tuple[int, int]] = []
    files: list[str] = []
    at = lo
    for a, b, path in sorted(copies):
        if b <= at or a >= hi:
            continue
        files.append(path)
        if a > at:
            pieces.append((at, a))
        at = max(at, b)
        if at >= hi:
            break
    if at < hi:
        pieces.append((at, hi))
    return pieces, files


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_gaps(directory: str) -> dict[str, list[tuple[int, int]]]:
    """Per device, the offset ranges [lo, hi) lost to quarantined corruption."""
    path = os.path.join(directory, QUARANTINE_DIR, GAPS_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    except (ValueError, OSError) as exc:
        log.error("commitlog %s: %s unreadable (%s); readers may report the quarantined "
                  "gaps as errors", directory, path, exc)
        return {}
    return {k: [(int(lo), int(hi)) for lo, hi in v] for k, v in raw.items()}


def save_gaps(directory: str, gaps: dict[str, list[tuple[int, int]]]) -> None:
    qdir = os.path.join(directory, QUARANTINE_DIR)
    os.makedirs(qdir, exist_ok=True)
    path = os.path.join(qdir, GAPS_NAME)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({k: [list(r) for r in v] for k, v in sorted(gaps.items())}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fsync_dir(qdir)


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
