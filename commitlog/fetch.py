"""The fetch response format served by the admin HTTP fetch API and decoded by Spark.

Pure Python, no imports from the rest of meshmq except the record framing, so the
Spark connector (and any other client) can vendor or import just this module and
``commitlog.record`` (which uses the optional compiled loops of ``commitlog._speedups``
when they are built, and pure Python otherwise).

Layout (little-endian)::

    off  size  field
    0    4     magic         b"MQF1"
    4    4     record_count  u32
    8    8     log_start     i64   first offset still retained (-1: not given)
    16   8     high_watermark i64  the high-water mark at response time: the first offset
                                   not yet committed (-1: not given)
    24   ...   record_count records in the record framing of commitlog.record

The response reuses the store's record framing byte for byte, so the server sends stored
bytes without re-encoding them (``LogStore.read_raw``), and every record keeps its CRC end
to end.
``log_start`` and ``high_watermark`` let a reader detect data loss to retention
(requested offset < log_start) and compute lag without a second request.

Names (issue 26, Kafka's, as in ``commitlog/store.py``): ``high_watermark`` was called
``high_water`` and a section's ``durable_end`` ``log_end`` (it never counted appends not
yet durable, which the log end does). The old attribute names stay as deprecated aliases
of the decoded tuples for one release (``FetchMeta.high_water``,
``DeviceFetch.high_water``, ``DeviceFetch.log_end``); the bytes on the wire are unchanged.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from commitlog import record
from commitlog.record import (
    ATTR_QOS_MASK,
    ATTR_RETAIN,
    FLAG_CONTROL,
    HDR_ENTRY,
    HEADER,
    HEADER_SIZE,
    CorruptRecordError,
    Record,
    decode_batch,
    encode_batch,
    frame_end,
)

FETCH_MAGIC = b"MQF1"
FETCH_HEADER = struct.Struct("<4sIqq")


class FetchMeta(NamedTuple):
    """The response header: how many records follow and where the log stands."""

    record_count: int
    log_start: int
    high_watermark: int

    @property
    def high_water(self) -> int:
        """Deprecated alias of ``high_watermark`` (removed in the next release)."""
        return self.high_watermark


def encode_fetch_response(
    records: Sequence[Record], log_start: int = -1, high_watermark: int = -1
) -> bytes:
    """Encode records (any keys) into one response body."""
    return FETCH_HEADER.pack(FETCH_MAGIC, len(records), log_start, high_watermark) + encode_batch(
        list(records)
    )


def encode_fetch_raw(records: Sequence[bytes], record_count: int, log_start: int = -1,
                     high_watermark: int = -1) -> bytes:
    """A response body around records already in the record framing, given as chunks
    (``LogStore.read_raw``: stored bytes, sent without decoding and encoding them again)."""
    return b"".join([FETCH_HEADER.pack(FETCH_MAGIC, record_count, log_start, high_watermark),
                     *records])


def decode_fetch_meta(data: bytes | bytearray | memoryview) -> FetchMeta:
    """Read only the header (cheap: used to plan the next request)."""
    if len(data) < FETCH_HEADER.size:
        raise CorruptRecordError("fetch response shorter than its header", 0)
    magic, count, start, hw = FETCH_HEADER.unpack_from(data, 0)
    if magic != FETCH_MAGIC:
        raise CorruptRecordError("not a meshmq fetch response (bad magic)", 0)
    return FetchMeta(count, start, hw)


def decode_fetch_response(
    data: bytes | bytearray | memoryview, verify: bool = True
) -> list[Record]:
    """Decode a whole response into Records; checks the count and every CRC."""
    meta = decode_fetch_meta(data)
    recs = decode_batch(data, FETCH_HEADER.size, verify=verify)
    if len(recs) != meta.record_count:
        raise CorruptRecordError(
            f"fetch response says {meta.record_count} records, holds {len(recs)}", 0
        )
    return recs


class FetchColumns(NamedTuple):
    """Column lists, ready for ``pyarrow.array`` / ``RecordBatch.from_arrays``."""

    keys: list[str]
    offsets: list[int]
    timestamps_us: list[int]
    topics: list[str]
    qos: list[int]
    retain: list[bool]
    payloads: list[bytes]
    headers: list[list[tuple[str, bytes]]]


def decode_fetch_columns(
    data: bytes | bytearray | memoryview, verify: bool = True, with_headers: bool = False
) -> FetchColumns:
    """Decode straight into per-column lists (no Record objects): the Arrow path.

    QoS and retain come from the broker's attrs convention (``ATTR_*`` in record.py).
    Keys repeat across records, so each distinct key is decoded once."""
    meta = decode_fetch_meta(data)
    buf = data if isinstance(data, bytes) else bytes(data)
    cols = decode_records_columns(buf, FETCH_HEADER.size, len(buf), verify, with_headers)
    if len(cols.offsets) != meta.record_count:
        raise CorruptRecordError(
            f"fetch response says {meta.record_count} records, holds {len(cols.offsets)}", 0
        )
    return cols


def decode_records_columns(buf: bytes, pos: int, end: int, verify: bool = True,
                           with_headers: bool = False) -> FetchColumns:
    """The records of ``buf[pos:end]`` (record framing, e.g. one section of a many-device
    fetch) as column lists: the loop of ``decode_fetch_columns``."""
    mv = memoryview(buf)
    keys: list[str] = []
    offsets: list[int] = []
    tss: list[int] = []
    topics: list[str] = []
    qos: list[int] = []
    retain: list[bool] = []
    payloads: list[bytes] = []
    hdrs: list[list[tuple[str, bytes]]] = []
    kcache: dict[bytes, str] = {}
    tcache: dict[bytes, str] = {}
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    fast = record.c_columns_run
    columns = (keys, offsets, tss, topics, qos, retain, payloads, hdrs)
    while pos < end:
        if fast is not None:
            # C decodes the plain records; the body below handles the one it stopped at.
            pos = fast(buf, pos, end, verify, with_headers, columns)
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
        if flags & FLAG_CONTROL:
            pos = rend
            continue
        p = pos + HEADER_SIZE
        kb = buf[p : p + kl]
        k = kcache.get(kb)
        if k is None:
            k = kcache[kb] = kb.decode()
        p += kl
        tb = buf[p : p + tl]
        t = tcache.get(tb)
        if t is None:
            t = tcache[tb] = tb.decode()
        p += tl
        hl: list[tuple[str, bytes]] = []
        for _ in range(hc):
            nl, vl = HDR_ENTRY.unpack_from(buf, p)
            p += 6
            name = buf[p : p + nl].decode()
            p += nl
            hl.append((name, buf[p : p + vl]))
            p += vl
        keys.append(k)
        offsets.append(off)
        tss.append(ts)
        topics.append(t)
        qos.append(attrs & ATTR_QOS_MASK)
        retain.append(bool(attrs & ATTR_RETAIN))
        payloads.append(buf[p:rend])
        if with_headers:
            hdrs.append(hl)
        pos = rend
    mv.release()
    return FetchColumns(keys, offsets, tss, topics, qos, retain, payloads, hdrs)


class FetchBuffers(NamedTuple):
    """Records as Arrow column buffers (little-endian, Arrow's layout): hand them to
    ``pyarrow.Array.from_buffers`` and no Python object is made per record.

    Why: building Arrow arrays from per-record Python lists (``decode_fetch_columns`` then
    ``pa.array``) cost ~1 µs per record on the Spark worker, as much as the rest of the read.
    String and binary columns are (int32 offsets of count + 1 entries from 0, data); ``qos``
    is int32, ``retain`` a validity-style bitmap (bit i of byte i // 8), ``offsets`` and
    ``timestamps_us`` int64. Control records are skipped."""

    count: int
    key_offsets: bytes
    key_data: bytes
    offsets: bytes
    timestamps_us: bytes
    topic_offsets: bytes
    topic_data: bytes
    qos: bytes
    retain: bytes
    payload_offsets: bytes
    payload_data: bytes


def decode_fetch_buffers(data: bytes | bytearray | memoryview, start: int = 0,
                         end: int | None = None, verify: bool = True) -> FetchBuffers:
    """The records in ``data[start:end]`` (record framing: a section of a many-device fetch,
    or a fetch response from ``FETCH_HEADER.size``) as Arrow column buffers.

    The C path (``arrow_run``) does the whole range or nothing; on anything it does not take
    (a failed check, undecodable UTF-8, fields overrunning a record) or without the compiled
    module, the pure-Python reference below decodes the range through the same loop as
    ``decode_fetch_columns`` and raises its errors. Both give identical bytes (tested)."""
    if end is None:
        end = len(data)
    fast = record.c_arrow_run
    if fast is not None:
        got = fast(data, start, end, verify)  # any buffer: a section's memoryview, no copy
        if got is not None:
            return FetchBuffers(*got)
    buf = data if isinstance(data, bytes) else bytes(data)
    cols = decode_records_columns(buf, start, end, verify, False)
    n = len(cols.offsets)
    key_offsets, key_data = _string_buffers(cols.keys)
    topic_offsets, topic_data = _string_buffers(cols.topics)
    payload_offsets, payload_data = _binary_buffers(cols.payloads)
    retain = bytearray((n + 7) // 8)
    for i, r in enumerate(cols.retain):
        if r:
            retain[i >> 3] |= 1 << (i & 7)
    return FetchBuffers(n, key_offsets, key_data, _le("q", cols.offsets),
                        _le("q", cols.timestamps_us), topic_offsets, topic_data,
                        _le("i", cols.qos), bytes(retain), payload_offsets, payload_data)


def _le(code: str, values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}{code}", *values)


def _binary_buffers(values: list[bytes]) -> tuple[bytes, bytes]:
    offsets = [0]
    acc = 0
    for v in values:
        acc += len(v)
        offsets.append(acc)
    if acc > 0x7FFFFFFF:
        raise ValueError("more than 2 GiB in one column (Arrow int32 offsets)")
    return _le("i", offsets), b"".join(values)


def _string_buffers(values: list[str]) -> tuple[bytes, bytes]:
    cache: dict[str, bytes] = {}
    enc = []
    for v in values:
        b = cache.get(v)
        if b is None:
            b = cache[v] = v.encode()
        enc.append(b)
    return _binary_buffers(enc)


# ---------------------------------------------------------------------- many-device fetch
#
# One response for many device logs (``POST /api/v1/fetch``; Kafka's Fetch carries many
# partitions the same way, so a reader of 100k small logs does not pay one round trip per
# log). Layout (little-endian)::
#
#     off  size  field
#     0    4     magic          b"MQFM"
#     4    4     device_count   u32
#     8    ...   device_count sections, in request order:
#                0   2  key_len        u16
#                2   2  status         u16   STATUS_* below
#                4   8  offset         i64   the offset asked for (after resolving defaults)
#                12  8  log_start      i64   first offset still retained
#                20  8  high_watermark i64   end of what readers may see (committed)
#                28  8  durable_end    i64   end of what is stored here (>= high_watermark)
#                36  8  next_offset    i64   what to ask for next
#                44  4  record_count   u32
#                48  4  records_bytes  u32
#                52  .. key (UTF-8), then records_bytes of records in the record framing
#
# ``status`` tells "no data yet" (OK with 0 records: offset == high_watermark) from "retention
# deleted what you asked for" (BELOW_START: restart from log_start, data lost for this
# reader) and from an offset past the high-water mark (ABOVE_END: truncated by a leader
# change, or from the future) or a device the node does not know (UNKNOWN_DEVICE).
# Offsets are dense per device and never reused, so an offset in [offset, next_offset) that no
# record in the section carries was lost to a corrupt record (quarantined by the node and
# logged at ERROR): a reader applies its data-loss rule to it (the Spark source's
# failOnDataLoss).

MULTI_MAGIC = b"MQFM"
MULTI_HEADER = struct.Struct("<4sI")
SECTION = struct.Struct("<HHqqqqqII")
STATUS_OK = 0
STATUS_BELOW_START = 1
STATUS_ABOVE_END = 2
STATUS_UNKNOWN_DEVICE = 3
STATUS_NAMES = {STATUS_OK: "ok", STATUS_BELOW_START: "offset_below_log_start",
                STATUS_ABOVE_END: "offset_above_high_water",
                STATUS_UNKNOWN_DEVICE: "unknown_device"}


class DeviceFetch(NamedTuple):
    """One device's part of a many-device fetch response."""

    device: str
    status: int
    offset: int
    log_start: int
    high_watermark: int
    durable_end: int
    next_offset: int
    record_count: int
    records: memoryview  # the records, in the record framing (decode with decode_batch)

    @property
    def high_water(self) -> int:
        """Deprecated alias of ``high_watermark`` (removed in the next release)."""
        return self.high_watermark

    @property
    def log_end(self) -> int:
        """Deprecated alias of ``durable_end`` (removed in the next release): the value
        was always the durable end, not the log end (which counts unflushed appends)."""
        return self.durable_end


def encode_section(device: str, status: int, offset: int, log_start: int, high_watermark: int,
                   durable_end: int, next_offset: int, record_count: int,
                   records: bytes = b"") -> bytes:
    """One device's section (header, key, records)."""
    return section_head(device, status, offset, log_start, high_watermark, durable_end, next_offset,
                        record_count, len(records)) + records


def section_head(device: str, status: int, offset: int, log_start: int, high_watermark: int,
                 durable_end: int, next_offset: int, record_count: int,
                 records_bytes: int) -> bytes:
    """A section's header and key, for a writer that sends the records' bytes after it
    without concatenating them first (``encode_multi_fetch_parts``)."""
    kb = device.encode()
    return SECTION.pack(len(kb), status, offset, log_start, high_watermark, durable_end,
                        next_offset, record_count, records_bytes) + kb


def encode_multi_fetch(sections: Sequence[bytes]) -> bytes:
    """A many-device fetch response from encoded sections."""
    return MULTI_HEADER.pack(MULTI_MAGIC, len(sections)) + b"".join(sections)


def encode_multi_fetch_parts(sections: Sequence[Sequence[bytes]]) -> bytes:
    """``encode_multi_fetch`` of sections given as parts (``section_head`` then record
    chunks): one copy of every byte into the response, however many chunks. Why: a 16 MiB
    response joined per slice, per section and per response cost ~20 ms a copy."""
    parts = [MULTI_HEADER.pack(MULTI_MAGIC, len(sections))]
    for sec in sections:
        parts.extend(sec)
    return b"".join(parts)


def _sections(mv: memoryview) -> list[tuple]:
    """(key, status, offset, start, hw, durable, next, count, rec_start, rec_end) per section."""
    if len(mv) < MULTI_HEADER.size:
        raise CorruptRecordError("many-device fetch response shorter than its header", 0)
    magic, count = MULTI_HEADER.unpack_from(mv, 0)
    if magic != MULTI_MAGIC:
        raise CorruptRecordError("not a meshmq many-device fetch response (bad magic)", 0)
    out: list[tuple] = []
    p = MULTI_HEADER.size
    for _ in range(count):
        if len(mv) - p < SECTION.size:
            raise CorruptRecordError("truncated device section", p)
        kl, status, off, start, hw, end, nxt, nrec, nbytes = SECTION.unpack_from(mv, p)
        q = p + SECTION.size
        if q + kl + nbytes > len(mv):
            raise CorruptRecordError("device section overruns the response", p)
        key = bytes(mv[q : q + kl]).decode()
        q += kl
        out.append((key, status, off, start, hw, end, nxt, nrec, q, q + nbytes))
        p = q + nbytes
    if p != len(mv):
        raise CorruptRecordError("bytes after the last device section", p)
    return out


def decode_multi_fetch(data: bytes | bytearray | memoryview) -> list[DeviceFetch]:
    """Split a many-device response into per-device parts (records left encoded)."""
    mv = memoryview(data)
    return [DeviceFetch(*t[:8], mv[t[8] : t[9]]) for t in _sections(mv)]


def decode_multi_records(data: bytes | bytearray | memoryview,
                         verify: bool = True) -> dict[str, list[Record]]:
    """Decode every device's records (CRC-checked unless ``verify=False``):
    ``{device: [Record]}``. One pass over one buffer, no copies per device."""
    buf = data if isinstance(data, bytes) else bytes(data)
    out: dict[str, list[Record]] = {}
    for t in _sections(memoryview(buf)):
        recs = decode_batch(buf, t[8], t[9], verify=verify) if t[7] else []
        if len(recs) != t[7]:
            raise CorruptRecordError(
                f"section of {t[0]!r} says {t[7]} records, holds {len(recs)}", t[8])
        out[t[0]] = recs
    return out
