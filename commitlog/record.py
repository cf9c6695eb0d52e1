"""Record model and byte framing of the commit log.

One framing serves three places, so a record is never re-encoded between them:
the store's segment files, the HTTP fetch response (``commitlog.fetch``) and, later,
the replication stream a follower pulls. A record is self-delimiting and carries its
own CRC, so a reader can verify any single record without context and recovery can
find the exact byte where a torn write begins.

Record layout (little-endian, ``HEADER_SIZE`` = 34 bytes of fixed header)::

    off  size  field
    0    4     length       u32  bytes that follow this field (= total size - 4)
    4    4     crc32        u32  zlib.crc32 of bytes [8, 4 + length)
    8    1     magic        u8   format version, currently 1
    9    1     flags        u8   bit 0: control record (key truncation marker); others 0
    10   2     attrs        u16  opaque to the log; broker convention: bits 0-1 QoS,
                                 bit 2 retain (see ATTR_*)
    12   8     offset       i64  dense per-key offset, from 0
    20   8     timestamp_us i64  microseconds since the Unix epoch
    28   2     key_len      u16
    30   2     topic_len    u16
    32   2     header_count u16
    34   ...   key (UTF-8), topic (UTF-8),
               header_count x [name_len u16, value_len u32, name UTF-8, value bytes],
               payload (the rest, up to 4 + length)

The checksum is zlib.crc32 (the standard IEEE CRC-32) because it is in the
standard library, runs in C at several GB/s and catches torn writes and bit rot;
it is not a defence against deliberate tampering.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

MAGIC = 1
FLAG_CONTROL = 0x01
ATTR_QOS_MASK = 0x03
ATTR_RETAIN = 0x04

HEADER = struct.Struct("<IIBBHqqHHH")
HEADER_SIZE = HEADER.size  # 34
LEN_CRC = struct.Struct("<II")
U32 = struct.Struct("<I")
HDR_ENTRY = struct.Struct("<HI")
MAX_RECORD_BYTES = 0x7FFFFFFF

Header = tuple[str, bytes]


def frame_end(length: int, magic: int, pos: int, limit: int) -> int:
    """The byte after the record at ``pos`` whose header reads ``length``/``magic``, or -1.

    The one framing rule every reader applies (the C fast path's ``frame_ok`` too): the length
    covers at least the header, the record ends inside ``limit``, and the magic is ours. Each
    caller keeps its own reaction: raise, truncate a torn tail, or treat an index as stale.
    """
    end = pos + 4 + length
    return end if length >= HEADER_SIZE - 4 and end <= limit and magic == MAGIC else -1


class CorruptRecordError(ValueError):
    """A record failed its length or CRC check: the bytes at ``position`` are not a record."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at byte {position}")
        self.position = position


class Record(NamedTuple):
    """One stored message. A tuple so that creating one on the hot path is one allocation
    and records can be shared between the tail cache and readers without copying."""

    offset: int
    timestamp_us: int
    key: str
    topic: str
    attrs: int
    headers: Sequence[Header]
    payload: bytes


_new_record = tuple.__new__

# Optional compiled fast path (commitlog/_speedups.c): C versions of the per-record loops
# of flush, recovery, device reads, the position walk and batch/columnar decode, and the
# plain case of LogStore.append. Each C function only fast-forwards over records that
# take the loop's plain path and hands every other record (errors, control records, index
# entries, odd types) back to the Python loop, so the Python code below and in store.py
# stays the reference and raises every error. COMMITLOG_PURE_PYTHON=1 (or a failed
# build) runs the pure-Python loops only. See README.md, "Compiled fast path".
_speedups = None
if os.environ.get("COMMITLOG_PURE_PYTHON", "").strip() in ("", "0"):
    try:
        from commitlog import _speedups
    except ImportError:  # not built (optional extension): pure Python
        _speedups = None
if _speedups is not None:
    _speedups.setup(Record)
SPEEDUPS: bool = _speedups is not None
"""True when the compiled fast path is in use (reported by the bench and the metrics)."""

# The hooks the loops call; None runs pure Python. Looked up at call time, so a test can
# switch one implementation off with monkeypatch.
c_encode_run = _speedups.encode_run if _speedups else None
c_decode_run = _speedups.decode_run if _speedups else None
c_read_run = _speedups.read_run if _speedups else None
c_trim_count = _speedups.trim_count if _speedups else None
c_scan_run = _speedups.scan_run if _speedups else None
c_walk_run = _speedups.walk_run if _speedups else None
c_columns_run = _speedups.columns_run if _speedups else None
c_coalesce = _speedups.coalesce if _speedups else None
c_raw_run = _speedups.raw_run if _speedups else None
c_arrow_run = _speedups.arrow_run if _speedups else None
c_make_append = _speedups.make_append if _speedups else None  # bound once, in store.py


def make_record(
    offset: int,
    timestamp_us: int,
    key: str,
    topic: str,
    attrs: int,
    headers: Sequence[Header],
    payload: bytes,
) -> Record:
    """Build a Record without NamedTuple's Python-level ``__new__`` (about 3x faster)."""
    return _new_record(Record, (offset, timestamp_us, key, topic, attrs, headers, payload))


def headers_size(headers: Sequence[Header]) -> int:
    """Upper bound of the encoded size of headers (names assumed worst-case UTF-8)."""
    n = 0
    for name, value in headers:
        n += 6 + 4 * len(name) + len(value)
    return n


def record_bound(key_bytes: bytes, topic: str, headers: Sequence[Header], payload: bytes) -> int:
    """Upper bound on a record's encoded size, so a batch buffer is allocated once."""
    n = HEADER_SIZE + len(key_bytes) + 4 * len(topic) + len(payload)
    if headers:
        n += headers_size(headers)
    return n


def encode_into(
    buf: bytearray,
    pos: int,
    offset: int,
    timestamp_us: int,
    key_bytes: bytes,
    topic: str,
    attrs: int,
    headers: Sequence[Header],
    payload: bytes,
    flags: int = 0,
    mv: memoryview | None = None,
) -> int:
    """Encode one record at ``buf[pos:]`` (which must be large enough); return the end.

    Writes with pack_into/slice assignment into the caller's batch buffer: no
    intermediate bytes objects except the UTF-8 topic."""
    tb = topic.encode()
    kl = len(key_bytes)
    tl = len(tb)
    p = pos + HEADER_SIZE
    buf[p : p + kl] = key_bytes
    p += kl
    buf[p : p + tl] = tb
    p += tl
    if headers:
        for name, value in headers:
            nb = name.encode()
            HDR_ENTRY.pack_into(buf, p, len(nb), len(value))
            p += 6
            buf[p : p + len(nb)] = nb
            p += len(nb)
            buf[p : p + len(value)] = value
            p += len(value)
    pl = len(payload)
    buf[p : p + pl] = payload
    end = p + pl
    HEADER.pack_into(
        buf, pos, end - pos - 4, 0, MAGIC, flags, attrs, offset, timestamp_us, kl, tl,
        len(headers),
    )
    if mv is None:
        mv = memoryview(buf)
    U32.pack_into(buf, pos + 4, zlib.crc32(mv[pos + 8 : end]))
    return end


def encode_batch(records: Iterable[Record]) -> bytes:
    """Encode records back to back (the shared batch framing). One buffer, one pass."""
    recs = records if isinstance(records, list) else list(records)
    bound = 0
    for r in recs:
        bound += record_bound(r[2].encode(), r[3], r[5], r[6])
    buf = bytearray(bound)
    mv = memoryview(buf)
    pos = 0
    keycache: dict[str, bytes] = {}
    fast = c_encode_run
    i = 0
    n = len(recs)
    while i < n:
        r = recs[i]
        kb = keycache.get(r[2])
        if kb is None:
            kb = keycache[r[2]] = r[2].encode()
        if fast is not None:
            # C encodes a run of records of one key (the store's flush loop, with no index
            # entry ever due); the line below encodes the one it stopped at, if any.
            key = r[2]
            j = i + 1
            while j < n and recs[j][2] == key:
                j += 1
            run = recs if (i == 0 and j == n) else recs[i:j]
            k, pos, _s, _t, _m, _pb = fast(buf, pos, run, 0, kb, 0, 1 << 62, 0, -(2**63), -1)
            i += k
            if k == len(run):
                continue
            r = recs[i]
        pos = encode_into(buf, pos, r[0], r[1], kb, r[3], r[4], r[5], r[6], 0, mv)
        i += 1
    mv.release()
    del buf[pos:]
    return bytes(buf)


def _decode_headers(buf: bytes, p: int, count: int) -> tuple[list[Header], int]:
    out: list[Header] = []
    for _ in range(count):
        nl, vl = HDR_ENTRY.unpack_from(buf, p)
        p += 6
        name = buf[p : p + nl].decode()
        p += nl
        out.append((name, buf[p : p + vl]))
        p += vl
    return out, p


def decode_one(buf: bytes, pos: int, verify: bool = True) -> tuple[Record, int, int]:
    """Decode the record at ``pos``; return (record, flags, end). Raises CorruptRecordError."""
    avail = len(buf) - pos
    if avail < HEADER_SIZE:
        raise CorruptRecordError("truncated record header", pos)
    (length, crc, magic, flags, attrs, off, ts, kl, tl, hc) = HEADER.unpack_from(buf, pos)
    end = frame_end(length, magic, pos, len(buf))
    if end < 0:
        raise CorruptRecordError("bad record length or magic", pos)
    if verify and zlib.crc32(memoryview(buf)[pos + 8 : end]) != crc:
        raise CorruptRecordError("CRC mismatch", pos)
    p = pos + HEADER_SIZE
    key = buf[p : p + kl].decode()
    p += kl
    topic = buf[p : p + tl].decode()
    p += tl
    headers: Sequence[Header] = ()
    if hc:
        headers, p = _decode_headers(buf, p, hc)
    if p > end:
        raise CorruptRecordError("record fields overrun its length", pos)
    return (
        _new_record(Record, (off, ts, key, topic, attrs, headers, buf[p:end])),
        flags,
        end,
    )


def decode_batch(
    data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None,
    verify: bool = True,
) -> list[Record]:
    """Decode every record in ``data[start:end]``; control records are skipped.

    Fields are sliced straight from one bytes object (one copy per payload); the CRC
    is computed over a memoryview slice so verifying costs no copy."""
    buf = data if isinstance(data, bytes) else bytes(data)
    if end is None:
        end = len(buf)
    mv = memoryview(buf)
    out: list[Record] = []
    append = out.append
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    pos = start
    keys: dict[bytes, str] = {}
    fast = c_decode_run
    while pos < end:
        if fast is not None:
            # C decodes the plain records; the loop below handles the one it stopped at.
            pos = fast(buf, pos, end, verify, out)
            if pos >= end:
                break
        if end - pos < HEADER_SIZE:
            raise CorruptRecordError("truncated record header", pos)
        (length, crc, magic, flags, attrs, off, ts, kl, tl, hc) = unpack(buf, pos)
        rend = frame_end(length, magic, pos, end)
        if rend < 0:
            raise CorruptRecordError("bad record length or magic", pos)
        if verify and crc32(mv[pos + 8 : rend]) != crc:
            raise CorruptRecordError("CRC mismatch", pos)
        p = pos + HEADER_SIZE
        kb = buf[p : p + kl]
        key = keys.get(kb)
        if key is None:
            key = keys[kb] = kb.decode()
        p += kl
        topic = buf[p : p + tl].decode()
        p += tl
        headers: Sequence[Header] = ()
        if hc:
            headers, p = _decode_headers(buf, p, hc)
        if not flags & FLAG_CONTROL:
            append(_new_record(Record, (off, ts, key, topic, attrs, headers, buf[p:rend])))
        pos = rend
    mv.release()
    return out


def encoded_size(r: Record) -> int:
    """Exact encoded size of a record (used for byte accounting of cached records)."""
    n = HEADER_SIZE + len(r[2].encode()) + len(r[3].encode()) + len(r[6])
    for name, value in r[5]:
        n += 6 + len(name.encode()) + len(value)
    return n
