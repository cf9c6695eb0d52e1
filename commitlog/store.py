"""LogStore: one shared, segmented append-only store holding the logs of many devices.

Why one shared store and not a directory per device: a QoS 1 ack needs its record to be
durable, and a busy event-loop tick carries publishes of hundreds of devices. With one
file per device that is one fsync per device per tick; with a shared store it is ONE
write and ONE fsync for the whole tick (group commit). It also keeps the number of open
files constant (1 writer + a small read cache) whatever the number of devices, and
recovery reads one sequential tail instead of opening 100k directories.

What makes per-device reads cheap in a shared store is a per-device in-memory sparse
index (offset -> store position, running max timestamp, cumulative bytes), checkpointed
to disk, a per-segment device position index (where each device's records are, so a
read preads and decodes only that device's records; ``.pidx`` files for sealed segments),
plus a per-device tail cache of the newest records. See README.md.

Names (Kafka's: ``Log.logEndOffset``, ``Partition.highWatermark``), per device log, with
``log_start <= high_watermark <= durable_end <= log_end``:

* ``log_start`` (``DeviceLog.start``): the first offset retention kept.
* ``log_end`` (:meth:`LogStore.log_end`, ``DeviceLog.next``): the next offset to be
  assigned; counts appends not yet durable.
* ``durable_end`` (:meth:`LogStore.durable_end`): one past the last record durable on this
  node; followers fetch up to it (:meth:`LogStore.read_replica`).
* ``high_watermark`` (:meth:`LogStore.high_watermark`, ``DeviceLog.high_watermark``): the
  first offset not yet committed, the **visible end**: every reader (read, read_raw,
  iter_records, offset_for_timestamp, the broker's replay and catch-up, the fetch API and
  the Spark source through it, ``meshmq log``) sees ``[log_start, high_watermark)`` and
  nothing above. Today committed means durable here (``DeviceLog.replicated_hw == -1``);
  with replication it is what the replica manager sets (:meth:`LogStore.set_high_watermark`).
  :meth:`LogStore.when_high_watermark` calls back when it passes an offset.

See docs/architecture.md ("The commit log's ends") for how these move.

Threading: everything runs on one thread (the event loop) except :meth:`sync`, which may
run concurrently on ONE other thread (the group committer's fsync worker). The state the
two share (flushed position, the writer fd and retired fds) is guarded by ``_lock``.
:meth:`rollback`, :meth:`truncate`, :meth:`close` must not overlap a running sync.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import operator
import os
import struct
import threading
import time
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence

from commitlog import epochs as _ep
from commitlog import quarantine as _q
from commitlog import record as _rec
from commitlog import salvage as _salvage
from commitlog.record import (
    FLAG_CONTROL,
    HDR_ENTRY,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    U32,
    CorruptRecordError,
    Header,
    Record,
    _decode_headers,
    decode_one,
    encode_into,
    frame_end,
    headers_size,
)
from commitlog.settings import LogSettings
from commitlog.stats import LogStats
from commitlog.waiters import HighWaterWaiters, WaiterCallback, call_all

log = logging.getLogger("meshmq.commitlog")

SEGMENT_SUFFIX = ".log"
CHECKPOINT_NAME = "index.ckpt"
LOCK_NAME = "LOCK"
READ_CHUNK = 256 * 1024
MIN_TS = -(2**63)
_new_record = tuple.__new__
_EMPTY = array("q")
_NO_FLOOR = 2**63 - 1
#: Keys starting with this are the broker's own state logs (retained messages, sessions:
#: ``broker/statelog.py``), not device logs. A topic name cannot contain ``#``
#: [MQTT-4.7.0-1], so no logging rule can produce one. They are hidden from :meth:`keys`
#: and ``in`` (so the fetch API, metrics and Spark never see them) and retention never
#: deletes them: they are compacted by their owner, which moves their start with
#: :meth:`LogStore.advance_start`.
INTERNAL_PREFIX = "#"


def is_internal(key: str) -> bool:
    """True for a broker state log (see INTERNAL_PREFIX), never for a device log."""
    return key.startswith(INTERNAL_PREFIX)

CKPT_MAGIC = b"MQCK"
CKPT_VERSION = 3  # 3: the reserved i64 holds the high-water mark, epochs follow (v2 read too)
CKPT_HEAD = struct.Struct("<4sIqI")  # magic, version, checkpoint_pos, n_segments
CKPT_SEG = struct.Struct("<qq")  # base, max_ts
CKPT_ACTIVE = struct.Struct("<q")  # base of the segment the device positions belong to, or -1
# key_len start next total since seg max_ts _ n_ent n_mark n_pos
CKPT_DEV = struct.Struct("<Hqqqqqqq III")
# v3: ... hw (was reserved) ... n_ent n_mark n_pos n_epochs; epochs (epoch, start, ts, pos) i64
# each follow the device's positions.
CKPT_DEV3 = struct.Struct("<Hqqqqqqq IIII")
CKPT_EPOCH = struct.Struct("<qqqq")

# Device position index: per segment and device, one int64 per record packing the
# record's position relative to the segment (high 32 bits, < 2**31) and its length
# (low 32 bits). Ordered by position, so ``bisect`` on ``rel << 32`` finds a record.
PIDX_SUFFIX = ".pidx"
PIDX_MAGIC = b"MQPX"
PIDX_VERSION = 1
PIDX_HEAD = struct.Struct("<4sIqIq")  # magic, version, segment size covered, n_dev, n_pos
POS_LIMIT = 1 << 31  # relative positions at or beyond this are not indexed (scan fallback)
LEN_MASK = 0xFFFFFFFF


class LogStoreError(Exception):
    """Base class of the store's own errors."""


class LogWriteError(LogStoreError, OSError):
    """The store could not write; nothing after the last commit is durable. An OSError
    carrying the original errno (ENOSPC, EIO...) so callers can map it to a reason code."""


class OffsetOutOfRangeError(LogStoreError):
    """Requested offset is below the retained start or above the high-water mark."""

    def __init__(self, key: str, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} of {key!r} outside retained range [{start}, {end}]")
        self.key = key
        self.offset = offset
        self.start = start
        self.end = end


class LogTruncatedError(LogStoreError):
    """A commit waiter's record was cut by a key truncation (a leader change)."""

    def __init__(self, key: str, offset: int) -> None:
        super().__init__(f"the log of {key!r} was truncated to {offset}")
        self.key = key
        self.offset = offset


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def _encode_records(kb: bytes, recs: list[Record]) -> bytes:
    """Records of one key in the record framing: the bytes ``flush`` wrote for them
    (same function, C when built), for the replica read path."""
    if not recs:
        return b""
    bound = (HEADER_SIZE + len(kb)) * len(recs) + sum(4 * len(r[3]) + len(r[6]) for r in recs)
    bound += sum(headers_size(r[5]) for r in recs if r[5])
    buf = bytearray(bound)
    mv = memoryview(buf)
    fast = _rec.c_encode_run
    i = p = 0
    n = len(recs)
    while i < n:
        if fast is not None:
            i, p, _s, _t, _m, _pb = fast(buf, p, recs, i, kb, 0, 1 << 62, 0, MIN_TS, -1)
            if i >= n:
                break
        r = recs[i]
        p = encode_into(buf, p, r[0], r[1], kb, r[3], r[4], r[5], r[6], 0, mv)
        i += 1
    mv.release()
    del buf[p:]
    return bytes(buf)


def _raw_run(data: bytes, p: int, kb: bytes, want: int, upto: int, used: int,
             max_bytes: int) -> tuple[int, int, int, bool]:
    """The loop of ``LogStore._raw_disk`` (C ``raw_run`` when built; this is the reference):
    check this device's stored records in ``data`` from ``p`` without decoding them, until
    ``upto`` records or ``max_bytes`` (``done``) or a record that fails a check (framing,
    key, control record, offset != want, key and topic inside the record, CRC): returns
    ``(p, want, used, done)``, ``p`` the end of the records accepted."""
    dn = len(data)
    klen = len(kb)
    done = want >= upto
    mv = memoryview(data)
    while not done and 0 <= p < dn:
        if dn - p < HEADER_SIZE:
            break
        (length, crc, magic, flags, _a, off, _t, kl, tl, _h) = HEADER.unpack_from(data, p)
        rend = frame_end(length, magic, p, dn)
        q = p + HEADER_SIZE
        if (rend < 0 or kl != klen or flags & FLAG_CONTROL or kl + tl > rend - q
                or data[q : q + kl] != kb or off != want):
            break
        if used and used + length + 4 > max_bytes:
            done = True
            break
        if zlib.crc32(mv[p + 8 : rend]) != crc:
            break
        used += length + 4
        want += 1
        p = rend
        if want >= upto or used >= max_bytes:
            done = True
    mv.release()
    return p, want, used, done


def _parse_follower_batch(
    data: bytes, kb: bytes, key: str, nxt: int, table: list[_ep.EpochEntry]
) -> tuple[list[Record], array, list[tuple[int, int, int, int]], int]:
    """Verify a follower batch before anything changes: ``(records, positions, epochs,
    skip)``: the data records (decoded, CRC-checked), their ``rel << 32 | length`` in
    ``data``, the epoch starts ``(rel, epoch, start, ts)`` and how many leading bytes
    are repeated epoch starts to drop. Compiled fast path when built: one C decode pass
    and one C header walk, then two list comparisons; control records or any doubt go
    through the reference loop, record by record."""
    if type(data) is not bytes:
        data = bytes(data)
    c_decode = _rec.c_decode_run
    c_walk = _rec.c_walk_run
    if c_decode is not None and c_walk is not None and len(data) < POS_LIMIT:
        # One C decode pass (CRC) and one C header walk; any doubt: the loop below.
        recs: list[Record] = []
        size = len(data)
        walked: dict[bytes, array] = {}
        posarr = None
        if c_decode(data, 0, size, True, recs) == size and c_walk(
                data, 0, 0, walked, _new_positions) == size and len(walked) == 1:
            posarr = walked.get(kb)
        if (posarr is not None and len(posarr) == len(recs)
                and sum(map(LEN_MASK.__and__, posarr)) == size  # no control record
                and (not recs or (recs[0][0] == nxt and list(map(_first, recs))
                                  == list(range(nxt, nxt + len(recs)))))):
            return recs, posarr, [], 0
    recs = []
    posarr = array("q")
    eps: list[tuple[int, int, int, int]] = []
    skip = 0
    p = 0
    n = len(data)
    want = nxt
    while p < n:
        rec, flags, end = decode_one(data, p)
        if rec[2] != key:
            raise ValueError(f"record of key {rec[2]!r} at byte {p} in a batch for {key!r}")
        if rec[0] != want:
            raise ValueError(f"offset {rec[0]} at byte {p} where {want} was expected "
                             f"(a follower batch must continue the log end)")
        if flags & FLAG_CONTROL:
            if not flags & _ep.FLAG_EPOCH:
                raise ValueError(f"truncation control record at byte {p}: a leader never "
                                 "sends one")
            epoch = _ep.parse_epoch_payload(rec[6])
            if _ep.check_new_epoch(table, epoch, want):
                _ep.assign(table, (epoch, want, rec[1], -1))
                eps.append((p, epoch, want, rec[1]))
            elif p == skip:
                skip = end  # the follower has it: drop it from the head of the batch
            else:
                raise ValueError(f"epoch {epoch} repeated at byte {p}")
        else:
            posarr.append((p << 32) | (end - p))
            recs.append(rec)
            want += 1
        p = end
    if skip:
        posarr = array("q", [v - (skip << 32) for v in posarr])
        eps = [(rel - skip, e, s, t) for rel, e, s, t in eps]
    return recs, posarr, eps, skip


def segment_name(base: int) -> str:
    """Segment files are named by the global store position of their first byte."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


class Segment:
    """One file of the store: bytes [base, base + size) of the global position space."""

    __slots__ = ("base", "size", "max_ts", "path")

    def __init__(self, base: int, path: str, size: int = 0, max_ts: int = MIN_TS) -> None:
        self.base = base
        self.path = path
        self.size = size
        self.max_ts = max_ts

    @property
    def end(self) -> int:
        """Global position one past the last byte."""
        return self.base + self.size


class DeviceLog:
    """In-memory state of one device's log.

    Fields without prefix describe everything *flushed* (written); ``c_*`` fields the
    same at the last commit (durable), which is what checkpoints and rollbacks use.
    The index arrays hold one entry per ``index_interval_bytes`` of this device's data
    and one at its first record in each segment (so retention that drops a segment can
    find the device's first surviving record exactly)."""

    __slots__ = (
        "key", "kb", "next", "durable_end", "start",
        "idx_off", "idx_pos", "idx_ts", "idx_cum",
        "total", "since_idx", "seg_base", "max_ts",
        "c_total", "c_since", "c_seg", "c_max",
        "cache", "cache_start", "cache_bytes", "markers", "last_topic", "last_kt",
        "pend", "n_ctl", "apos", "apos_base", "gaps",
        "replicated_hw", "epochs", "raw", "mk",
    )

    def __init__(self, key: str, first_offset: int = 0) -> None:
        self.key = key
        self.kb = key.encode()
        # The names are Kafka's (docs/architecture.md, "The commit log's ends"):
        # start <= high_watermark <= durable_end <= next (the log end).
        self.next = first_offset  # the log end: next offset to assign (includes pending)
        self.durable_end = first_offset  # one past the last record durable on this node
        self.start = first_offset  # first retained offset
        self.idx_off = array("q")
        self.idx_pos = array("q")
        self.idx_ts = array("q")  # max timestamp of all records before idx_off[i]
        self.idx_cum = array("q")  # this device's bytes before idx_off[i]
        self.total = 0
        self.since_idx = 0
        self.seg_base = -1
        self.max_ts = MIN_TS
        self.c_total = 0
        self.c_since = 0
        self.c_seg = -1
        self.c_max = MIN_TS
        self.cache: list[Record] = []
        self.cache_start = first_offset
        self.cache_bytes = 0
        self.markers: list[tuple[int, int]] | None = None  # (boundary_pos, from_offset)
        # Devices publish to the same topic again and again: the encoded key+topic is
        # reused instead of encoding the topic per record.
        self.last_topic: str | None = None
        self.last_kt = b""
        # Records appended since the last flush (control records first, ``n_ctl`` of
        # them); None when the device has nothing pending. Grouping the pending records
        # by device makes a device's records of one batch contiguous on disk.
        self.pend: list[Record] | None = None
        self.n_ctl = 0
        # Positions of this device's records in the active segment (see PIDX_*), or None.
        self.apos: array | None = None
        self.apos_base = -1
        # Replication (see "Two ends per device log" in README.md): the high-water mark a
        # replication layer set (committed cluster-wide), or -1: the high-water mark is
        # the durable end (the single-node rule). Read it through ``high_watermark``.
        self.replicated_hw = -1
        self.epochs: list[_ep.EpochEntry] | None = None  # leader epoch table (epochs.py)
        self.raw: list[tuple] | None = None  # follower appends awaiting flush (bytes, meta)
        self.mk: tuple[list[int], list[int]] | None = None  # markers' boundaries, suffix min
        # Offset ranges [lo, hi) lost to a quarantined corrupt record (see quarantine.py):
        # readers skip them; None for almost every device.
        self.gaps: list[tuple[int, int]] | None = None

    @property
    def high_watermark(self) -> int:
        """The visible end: first offset not yet committed; readers (read, fetch, catch-up,
        replay, the fetch API, Spark and ``meshmq log`` through it) see
        ``[start, high_watermark)``.
        The one place that says what "committed" means: durable here on a single node
        (Kafka's Partition.highWatermark with one replica), the replicated mark once a
        replication layer sets it. Only read paths use it; append and commit do not."""
        hw = self.replicated_hw
        return self.durable_end if hw < 0 else hw

    def in_gap(self, lo: int, hi: int) -> bool:
        """True if every offset in [lo, hi) was lost to quarantined corruption."""
        for g_lo, g_hi in self.gaps or ():
            if g_lo <= lo and hi <= g_hi:
                return True
        return False

    def trim_index_from(self, offset: int) -> None:
        """Drop index entries at or after ``offset`` (rollback, truncation)."""
        j = bisect.bisect_left(self.idx_off, offset)
        if j < len(self.idx_off):
            del self.idx_off[j:], self.idx_pos[j:], self.idx_ts[j:], self.idx_cum[j:]

    def drop_index_before(self, j: int) -> None:
        """Drop the first ``j`` entries (retention)."""
        if j > 0:
            del self.idx_off[:j], self.idx_pos[:j], self.idx_ts[:j], self.idx_cum[:j]

    def is_stale(self, pos: int, offset: int) -> bool:
        """True for a record superseded by a key truncation (written before its marker):
        some marker after ``pos`` cut at or below ``offset``. O(log markers)."""
        return offset >= self.stale_floor(pos)

    def next_boundary(self, pos: int) -> int:
        """Store position of the first truncation marker after ``pos`` (2**63-1: none)."""
        self.stale_floor(pos)  # builds the cached boundaries
        mk = self.mk
        if mk is None:
            return _NO_FLOOR
        i = bisect.bisect_right(mk[0], pos)
        return mk[0][i] if i < len(mk[0]) else _NO_FLOOR

    def stale_floor(self, pos: int) -> int:
        """Lowest offset a record at store position >= ``pos`` can have and still be stale
        (the minimum ``from`` of the markers written after ``pos``); 2**63-1 when no marker
        lies after ``pos``. Why: a record below that offset is live whatever the markers,
        so the compiled reader (which knows nothing of markers) may serve it. Without this,
        one truncation disabled the compiled path of a device until retention dropped its
        marker, and failovers truncate often."""
        markers = self.markers
        if not markers:
            return _NO_FLOOR
        mk = self.mk
        if mk is None or len(mk[0]) != len(markers):
            ordered = sorted(markers)  # by boundary (a rollback can reorder appends)
            bounds = [m[0] for m in ordered]
            sfx = [0] * len(ordered)
            low = _NO_FLOOR
            for i in range(len(ordered) - 1, -1, -1):
                low = min(low, ordered[i][1])
                sfx[i] = low
            mk = self.mk = (bounds, sfx)
        i = bisect.bisect_right(mk[0], pos)
        return mk[1][i] if i < len(mk[1]) else _NO_FLOOR


def _cache_size(r: Record, klen: int) -> int:
    """Bytes a cached record is charged (close to its encoded size, cheap to compute)."""
    n = HEADER_SIZE + klen + len(r[3]) + len(r[6])
    if r[5]:
        n += headers_size(r[5])
    return n


def pidx_path(seg_path: str) -> str:
    """Device position index file of a segment file."""
    return seg_path[: -len(SEGMENT_SUFFIX)] + PIDX_SUFFIX


class PositionIndex:
    """The device position index of one sealed segment, loaded from its ``.pidx`` file.

    File layout (little-endian): PIDX_HEAD (magic ``MQPX``, version, segment size the
    file covers, device count, position count), then per device, ordered by
    (crc32(key), key): ``hashes`` u32 x n_dev, ``key_end`` i64 x n_dev (end of the key in
    the key blob), ``pos_end`` i64 x n_dev (end of the device's run in the positions
    array), the key blob, the positions (i64 x n_pos, ``rel << 32 | length``) and a CRC32
    of everything before it. Only arrays are materialised: no Python object per device,
    so loading the index of a segment holding 100k devices costs a few ``frombytes``."""

    __slots__ = ("hashes", "key_end", "pos_end", "keys", "positions")

    def __init__(self, data: bytes, size: int) -> None:
        if len(data) < PIDX_HEAD.size + 4 or zlib.crc32(memoryview(data)[:-4]) != int.from_bytes(
            data[-4:], "little"
        ):
            raise ValueError("checksum mismatch")
        magic, version, covered, ndev, npos = PIDX_HEAD.unpack_from(data, 0)
        if magic != PIDX_MAGIC or version != PIDX_VERSION:
            raise ValueError("bad magic/version")
        if covered != size:
            raise ValueError(f"covers {covered} bytes, the segment has {size}")
        p = PIDX_HEAD.size
        self.hashes = array("I")
        self.hashes.frombytes(data[p : p + 4 * ndev])
        p += 4 * ndev
        self.key_end = array("q")
        self.key_end.frombytes(data[p : p + 8 * ndev])
        p += 8 * ndev
        self.pos_end = array("q")
        self.pos_end.frombytes(data[p : p + 8 * ndev])
        p += 8 * ndev
        nkeys = self.key_end[-1] if ndev else 0
        self.keys = data[p : p + nkeys]
        p += nkeys
        self.positions = array("q")
        self.positions.frombytes(data[p : p + 8 * npos])
        p += 8 * npos
        if p != len(data) - 4 or self.hashes.itemsize != 4:
            raise ValueError("bad length")

    def get(self, kb: bytes) -> array | None:
        """The positions of key ``kb`` in the segment, or None if it has no record there."""
        h = zlib.crc32(kb)
        hashes = self.hashes
        i = bisect.bisect_left(hashes, h)
        n = len(hashes)
        while i < n and hashes[i] == h:
            ks = self.key_end[i - 1] if i else 0
            if self.keys[ks : self.key_end[i]] == kb:
                return self.positions[self.pos_end[i - 1] if i else 0 : self.pos_end[i]]
            i += 1
        return None


def encode_pidx(size: int, entries: dict[bytes, array]) -> bytes:
    """Serialize a segment's device positions (see :class:`PositionIndex`)."""
    items = sorted((zlib.crc32(kb), kb, arr) for kb, arr in entries.items())
    hashes = array("I", [it[0] for it in items])
    key_end = array("q")
    pos_end = array("q")
    kn = pn = 0
    for _h, kb, arr in items:
        kn += len(kb)
        pn += len(arr)
        key_end.append(kn)
        pos_end.append(pn)
    parts = [PIDX_HEAD.pack(PIDX_MAGIC, PIDX_VERSION, size, len(items), pn), hashes.tobytes(),
             key_end.tobytes(), pos_end.tobytes()]
    parts += [it[1] for it in items]
    parts += [it[2].tobytes() for it in items]
    body = b"".join(parts)
    return body + zlib.crc32(body).to_bytes(4, "little")


def write_file_atomic(path: str, data: bytes) -> None:
    """tmp + rename, no fsync: used for the position index, a cache validated on load."""
    tmp = f"{path}.tmp{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _new_positions() -> array:
    return array("q")


def walk_positions(data: bytes, rel0: int) -> tuple[dict[bytes, array], int]:
    """Header-only walk of segment bytes ``data`` (starting at relative position
    ``rel0``): each key's record positions, and the bytes of whole records walked."""
    out: dict[bytes, array] = {}
    unpack = HEADER.unpack_from
    n = len(data)
    if rel0 + n >= POS_LIMIT:
        raise ValueError("segment too large for the position index")
    p = 0
    fast = _rec.c_walk_run
    if fast is not None and type(data) is bytes:
        p = fast(data, 0, rel0, out, _new_positions)
    while n - p >= HEADER_SIZE:
        (length, _c, magic, flags, _a, _o, _t, kl, _tl, _hc) = unpack(data, p)
        end = frame_end(length, magic, p, n)
        if end < 0:
            break
        if not flags & FLAG_CONTROL:
            kb = data[p + HEADER_SIZE : p + HEADER_SIZE + kl]
            arr = out.get(kb)
            if arr is None:
                arr = out[kb] = array("q")
            arr.append(((rel0 + p) << 32) | (end - p))
        p = end
    return out, p


class _Stale(Exception):
    """A position index entry does not point at the device's record: rebuild it."""


class LogStore:
    """The storage engine. See the module docstring for the design and threading rules."""

    def __init__(self, directory: str, settings: LogSettings) -> None:
        """Use :meth:`open`; this only sets fields."""
        self.directory = directory
        self.settings = settings
        self.stats = LogStats()
        self._devices: dict[str, DeviceLog] = {}
        self._segments: list[Segment] = []
        self._seg_bases: list[int] = []
        self._lock = threading.Lock()
        self._wfd = -1
        self._retired: list[int] = []
        self._dir_dirty = False
        self._flushed_pos = 0
        self._synced_pos = 0
        self._committed_pos = 0
        self._pend_devs: list[DeviceLog] = []  # devices with pending records, first-append order
        self._pend_n = 0
        self._pend_bound = 0
        # Device position index: devices with positions in the active segment; sealed
        # segments' indexes (loaded files, or dicts kb -> positions not yet written) in a
        # small LRU; files to write after the segment's fsync (worker thread).
        self._apos_devs: list[DeviceLog] = []
        self._apos_ok = True  # False once the active segment passes POS_LIMIT
        self._ckpt_abase = -1  # segment whose positions the loaded checkpoint holds
        self._pidx: OrderedDict[int, PositionIndex | dict[bytes, array]] = OrderedDict()
        self._pidx_jobs: list[tuple[str, int, dict[bytes, array]]] = []
        self._inflight: deque[tuple[int, list[tuple]]] = deque()
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        self._lru: OrderedDict[DeviceLog, None] = OrderedDict()
        self._cache_total = 0
        self._broken: BaseException | None = None
        self._cache_on = settings.tail_cache_bytes_per_device > 0
        self._lock_fd = -1
        self._closed = False
        self._waiters = HighWaterWaiters()  # per-device commit waiters (waiters.py)
        # Replication (cluster/replication.py): told, once per commit, the keys whose durable
        # end moved (a leader answers parked follower fetches and moves its high-water mark
        # then, Kafka's delayed fetch completed on append). None on a single node: nothing
        # is collected.
        self.durable_listener: Callable[[list[str]], object] | None = None
        self._ckpt_hw: set[str] = set()  # during recovery: keys whose hw the checkpoint gave
        self._new_gaps: dict[str, list[tuple[int, int]]] = {}  # found by this recovery
        self._gap_hints: list[tuple[str, int]] = []  # (key, offset) read in bad ranges
        # Bad byte ranges readers met (store position -> end; see ``_salvage``): every read
        # path steps over them instead of failing on them again. Not persisted: the lost
        # offsets are (gaps.json), and a restarted store finds the bytes again on first read.
        self._bad: dict[int, int] = {}
        # Bad byte ranges already copied to quarantine/ ([start, end) store positions, file),
        # read from its file names at a reader's first salvage: each byte is copied once.
        self._quarantined: list[tuple[int, int, str]] | None = None

    # ------------------------------------------------------------------ open / recovery

    @classmethod
    def open(cls, directory: str, settings: LogSettings | None = None) -> LogStore:
        """Open (creating if needed) and recover the store in ``directory``.

        Recovery: load the checkpoint (if valid and consistent with the segment files),
        scan every record written after it, verifying CRCs and offsets. A bad record with
        no valid record after it is a torn tail: its segment is truncated there, a WARNING
        names the position and ``stats.recovery_truncations`` counts it. A bad range with
        intact records after it (in its segment or later ones) is corruption, not a crash:
        it is copied to quarantine/, reported at ERROR, counted in ``stats.corrupt_*``,
        and the scan goes on; its offsets become gaps readers skip (see quarantine.py for
        the mode and why). No valid checkpoint: full rescan."""
        st = cls(directory, settings or LogSettings())
        os.makedirs(directory, exist_ok=True)
        st._lock_fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(st._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(st._lock_fd)
            raise LogStoreError(f"{directory} is already open by another process") from exc
        try:
            st._recover()
        except BaseException:
            st._release_fds()
            raise
        return st

    def _list_segments(self) -> list[Segment]:
        segs = []
        for name in os.listdir(self.directory):
            if name.endswith(SEGMENT_SUFFIX) and name[: -len(SEGMENT_SUFFIX)].isdigit():
                path = os.path.join(self.directory, name)
                segs.append(Segment(int(name[: -len(SEGMENT_SUFFIX)]), path, os.path.getsize(path)))
        segs.sort(key=lambda s: s.base)
        return segs

    def _recover(self) -> None:
        segs = self._list_segments()
        # Contiguity: a gap means something removed data in the middle; keep the prefix.
        for i in range(1, len(segs)):
            if segs[i].base != segs[i - 1].end:
                log.warning(
                    "commitlog %s: segment %s does not start where %s ends; setting aside "
                    "it and later segments", self.directory, segs[i].path, segs[i - 1].path)
                self._orphan(segs[i:])
                segs = segs[:i]
                break
        if not segs:
            segs = [Segment(0, os.path.join(self.directory, segment_name(0)))]
            open(segs[0].path, "ab").close()
            self._dir_dirty = True
        self._segments = segs
        self._seg_bases = [s.base for s in segs]
        scan_from = self._load_checkpoint()
        if scan_from is None:
            self.stats.index_rebuilds += 1
            self._devices.clear()
            self._ckpt_hw.clear()
            for s in segs:
                s.max_ts = MIN_TS
            scan_from = segs[0].base
            if scan_from != 0 or segs[-1].end > 0:
                log.info("commitlog %s: rebuilding indexes from %d bytes of segments",
                         self.directory, segs[-1].end - segs[0].base)
        self._scan_tail(scan_from)
        self._apply_gaps()
        self._clean_pidx_files()
        end = self._segments[-1].end
        self._flushed_pos = self._synced_pos = self._committed_pos = end
        for dev in self._devices.values():
            dev.cache_start = dev.next
        active = self._segments[-1]
        self._wfd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.stats.segments = len(self._segments)
        # Make recovery's truncations and the first segment durable before any ack.
        os.fsync(self._wfd)
        self._fsync_dir()

    def _orphan(self, segs: Sequence[Segment]) -> None:
        stamp = int(time.time())
        for s in segs:
            os.rename(s.path, f"{s.path}.orphaned-{stamp}")
            self._pidx.pop(s.base, None)
            try:
                os.unlink(pidx_path(s.path))
            except FileNotFoundError:
                pass

    def _load_checkpoint(self) -> int | None:
        """Load index.ckpt; return the position to scan from, or None to rebuild."""
        path = os.path.join(self.directory, CHECKPOINT_NAME)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if self._segments[-1].end > 0:
                log.warning("commitlog %s: no checkpoint; rebuilding the index", self.directory)
            return None
        try:
            return self._parse_checkpoint(data)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            log.warning("commitlog %s: checkpoint unusable (%s); rebuilding the index",
                        self.directory, exc)
            self._devices.clear()
            return None

    def _parse_checkpoint(self, data: bytes) -> int:
        if len(data) < CKPT_HEAD.size + 4 or zlib.crc32(data[:-4]) != int.from_bytes(
            data[-4:], "little"
        ):
            raise ValueError("checksum mismatch")
        magic, version, ckpt_pos, nseg = CKPT_HEAD.unpack_from(data, 0)
        if magic != CKPT_MAGIC or version not in (2, CKPT_VERSION):
            raise ValueError("bad magic/version")
        # Version 2 (before replication) is read as version 3 without high-water marks
        # or epochs: a v2 store cannot hold epoch records, so nothing is lost.
        dev_struct = CKPT_DEV3 if version == 3 else CKPT_DEV
        segs = self._segments
        if ckpt_pos < segs[0].base or ckpt_pos > segs[-1].end:
            raise ValueError(f"checkpoint position {ckpt_pos} outside the segments on disk")
        p = CKPT_HEAD.size
        seg_ts: dict[int, int] = {}
        for _ in range(nseg):
            base, mts = CKPT_SEG.unpack_from(data, p)
            p += CKPT_SEG.size
            seg_ts[base] = mts
        for s in segs:
            if s.base < ckpt_pos:
                if s.base not in seg_ts:
                    raise ValueError(f"segment {s.base} unknown to the checkpoint")
                s.max_ts = seg_ts[s.base]
        (abase,) = CKPT_ACTIVE.unpack_from(data, p)
        p += CKPT_ACTIVE.size
        (ndev,) = struct.unpack_from("<I", data, p)
        p += 4
        devices: dict[str, DeviceLog] = {}
        apos_devs: list[DeviceLog] = []
        for _ in range(ndev):
            fields = dev_struct.unpack_from(data, p)
            (kl, start, nxt, total, since, segb, mts, hw, nent, nmark, npos) = fields[:11]
            nep = fields[11] if version == 3 else 0
            p += dev_struct.size
            key = data[p : p + kl].decode()
            p += kl
            dev = DeviceLog(key, start)
            dev.next = dev.durable_end = nxt
            dev.total = dev.c_total = total
            dev.since_idx = dev.c_since = since
            dev.seg_base = dev.c_seg = segb
            dev.max_ts = dev.c_max = mts
            for arr in (dev.idx_off, dev.idx_pos, dev.idx_ts, dev.idx_cum):
                arr.frombytes(data[p : p + 8 * nent])
                p += 8 * nent
            if nmark:
                flat = struct.unpack_from(f"<{2 * nmark}q", data, p)
                p += 16 * nmark
                dev.markers = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
            if npos:
                dev.apos = array("q")
                dev.apos.frombytes(data[p : p + 8 * npos])
                dev.apos_base = abase
                apos_devs.append(dev)
                p += 8 * npos
            if version == 3:
                dev.replicated_hw = hw if 0 <= hw <= nxt else -1
                self._ckpt_hw.add(key)
            if nep:
                dev.epochs = [CKPT_EPOCH.unpack_from(data, p + CKPT_EPOCH.size * i)
                              for i in range(nep)]
                p += CKPT_EPOCH.size * nep
            devices[key] = dev
        if p != len(data) - 4:
            raise ValueError("trailing bytes")
        self._devices = devices
        self._apos_devs = apos_devs
        self._ckpt_abase = abase
        # Segments deleted by retention after this checkpoint was written.
        self._advance_devices_past(segs[0].base)
        return ckpt_pos

    def _scan_tail(self, pos: int) -> None:
        """Replay records from ``pos`` to the end into the indexes; cut at the first bad one.

        Also rebuilds the device positions of every segment scanned: the active segment's
        stay in memory, each sealed one's are written as its ``.pidx`` file."""
        by_kb: dict[bytes, DeviceLog] = {d.kb: d for d in self._devices.values()}
        interval = self.settings.index_interval_bytes
        i = bisect.bisect_right(self._seg_bases, pos) - 1
        first = self._segments[i]
        if self._ckpt_abase != first.base:
            for dev in self._apos_devs:
                dev.apos = None
                dev.apos_base = -1
            self._apos_devs = []
            if pos > first.base:  # positions before the checkpoint: header-only walk
                with open(first.path, "rb") as f:
                    head = f.read(pos - first.base)
                try:
                    entries, walked = walk_positions(head, 0)
                    if walked != len(head):
                        # A damaged header below the checkpoint (found by a reader, or not yet):
                        # index the records after it too, or their reads would stop there.
                        entries = _salvage.verified_positions(head, _new_positions)
                except ValueError:
                    entries = {}
                    self._apos_ok = False
                for kb, arr in entries.items():
                    dev = by_kb.get(kb)
                    if dev is not None:
                        dev.apos = arr
                        dev.apos_base = first.base
                        self._apos_devs.append(dev)
        apos_devs = self._apos_devs
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        while i < len(self._segments):
            seg = self._segments[i]
            segb = seg.base
            with open(seg.path, "rb") as f:
                f.seek(pos - segb)
                data = f.read()
            p = 0
            n = len(data)
            rel0 = pos - segb
            track = self._apos_ok = self._apos_ok and rel0 + n < POS_LIMIT
            bad: str | None = None
            mv = memoryview(data)
            smax = seg.max_ts
            fast = _rec.c_scan_run
            skipped = False  # a corrupt range was quarantined: later offsets may jump
            while p < n or bad is not None:
                if bad is not None:
                    # Torn tail, or a corrupt record with intact ones after it?
                    q = _q.next_valid_record(data, p)
                    if q < 0 and i + 1 < len(self._segments):
                        q = n  # later segments hold records: this is not the log's tail
                    if q < 0:
                        break
                    self._quarantine(seg, data, pos, p, q, bad)
                    bad = None
                    skipped = True
                    p = q
                    continue
                if fast is not None:
                    # C applies the plain records; the body below handles the one it
                    # stopped at (new device, control record, index entry, any error).
                    p, smax = fast(data, p, by_kb, segb, interval, rel0 if track else -1, smax)
                    if p >= n:
                        break
                if n - p < HEADER_SIZE:
                    bad = "torn record header"
                    continue
                (length, crc, magic, flags, _a, off, ts, kl, _tl, _hc) = unpack(data, p)
                end = frame_end(length, magic, p, n)
                if end < 0:
                    bad = "bad length or torn record"
                    continue
                if crc32(mv[p + 8 : end]) != crc:
                    bad = "CRC mismatch"
                    continue
                kb = data[p + HEADER_SIZE : p + HEADER_SIZE + kl]
                dev = by_kb.get(kb)
                if dev is None:
                    try:
                        dev = DeviceLog(kb.decode(), off)
                    except UnicodeDecodeError:
                        bad = "undecodable key"
                        continue
                    self._devices[dev.key] = dev
                    by_kb[kb] = dev
                size = 4 + length
                if flags & _ep.FLAG_EPOCH:
                    bad = self._replay_epoch(dev, data, p, end, kl, flags, off, ts, pos + p)
                    if bad is not None:
                        break
                elif flags & FLAG_CONTROL:
                    if off < dev.start:
                        bad = "truncation marker below the log start"
                        continue
                    if off > dev.next:  # only reset_start writes a marker past the end
                        self._reset_state(dev, off, pos + p)
                    else:
                        self._truncate_state(dev, off, pos + p)
                elif off != dev.next and not (skipped and off > dev.next):
                    bad = f"offset {off} of {dev.key!r} where {dev.next} was expected"
                    continue
                else:
                    if off != dev.next:  # offsets lost in the quarantined range
                        self._new_gaps.setdefault(dev.key, []).append((dev.next, off))
                    if dev.since_idx >= interval or dev.seg_base != segb:
                        dev.idx_off.append(off)
                        dev.idx_pos.append(pos + p)
                        dev.idx_ts.append(dev.max_ts)
                        dev.idx_cum.append(dev.total)
                        dev.since_idx = 0
                        dev.seg_base = segb
                    dev.since_idx += size
                    dev.total += size
                    if ts > dev.max_ts:
                        dev.max_ts = ts
                    if ts > smax:
                        smax = ts
                    dev.next = dev.durable_end = off + 1
                    if track:
                        if dev.apos_base != segb:
                            dev.apos = array("q")
                            dev.apos_base = segb
                            apos_devs.append(dev)
                        dev.apos.append(((rel0 + p) << 32) | size)
                p = end
            mv.release()
            seg.max_ts = smax
            if bad is not None:
                cut = pos + p
                lost = seg.end - cut + sum(s.size for s in self._segments[i + 1 :])
                log.warning(
                    "commitlog %s: %s at store position %d (segment %s, byte %d); truncating "
                    "%d bytes there (a write torn by a crash loses only unacknowledged "
                    "records; otherwise check the disk)", self.directory, bad, cut, seg.path,
                    cut - seg.base, lost)
                self.stats.recovery_truncations += 1
                self.stats.recovery_truncated_bytes += lost
                os.truncate(seg.path, cut - seg.base)
                seg.size = cut - seg.base
                if i + 1 < len(self._segments):
                    self._orphan(self._segments[i + 1 :])
                    del self._segments[i + 1 :]
                    del self._seg_bases[i + 1 :]
                break
            i += 1
            if i < len(self._segments):
                sealed = self._seal_positions(seg)
                apos_devs = self._apos_devs
                if sealed is not None:
                    try:
                        write_file_atomic(pidx_path(seg.path), encode_pidx(seg.size, sealed))
                    except OSError as exc:
                        log.warning("commitlog %s: cannot write the position index of %s (%s)",
                                    self.directory, seg.path, exc)
                pos = self._segments[i].base
        for dev in self._devices.values():
            dev.c_total, dev.c_since, dev.c_seg, dev.c_max = (
                dev.total, dev.since_idx, dev.seg_base, dev.max_ts)
            if dev.replicated_hw > dev.durable_end:  # a checkpointed mark above a torn tail
                dev.replicated_hw = dev.durable_end
            elif dev.epochs and dev.key not in self._ckpt_hw:
                # A replicated log (it has leader epochs) whose high-water mark no
                # checkpoint recorded: nothing is known committed; show nothing until the
                # leader says (Kafka starts a replica without its HW checkpoint at 0).
                dev.replicated_hw = dev.start
        self._ckpt_hw = set()

    @staticmethod
    def _replay_epoch(dev: DeviceLog, data: bytes, p: int, end: int, kl: int, flags: int,
                      off: int, ts: int, pos: int) -> str | None:
        """Recovery of an epoch-start record; the reason it is bad, or None."""
        if not flags & FLAG_CONTROL or off != dev.next:
            return f"epoch record at offset {off} of {dev.key!r} where {dev.next} was expected"
        try:
            epoch = _ep.parse_epoch_payload(data[p + HEADER_SIZE + kl : end])
            if _ep.check_new_epoch(dev.epochs, epoch, off):
                if dev.epochs is None:
                    dev.epochs = []
                _ep.assign(dev.epochs, (epoch, off, ts, pos))
        except ValueError as exc:
            return f"bad epoch record of {dev.key!r}: {exc}"
        return None

    def _quarantine(self, seg: Segment, data: bytes, pos: int, p: int, q: int,
                    why: str) -> None:
        """Recovery found ``data[p:q]`` bad with intact records after it: keep the bytes in
        quarantine/, report them, and let the scan go on at ``q`` (see quarantine.py)."""
        at = pos + p
        hints = _q.header_hints(data, p, q)
        devices = sorted({k for k, _ in hints}) or ["unknown"]
        offsets = sorted({o for _, o in hints})
        try:
            path = _q.write_quarantine(self.directory, devices[0], seg.base, at, data[p:q])
        except OSError as exc:
            path = f"(not copied: {exc})"
        self.stats.corrupt_records += 1
        self.stats.corrupt_bytes += q - p
        log.error(
            "commitlog %s: %s at store position %d (segment %s, byte %d): %d corrupt bytes "
            "with intact records after them; quarantined to %s and skipped, later records "
            "kept. Device(s) %s, offset(s) %s as far as the damaged headers tell; readers "
            "skip the lost offsets. Check the disk (SMART, dmesg).",
            self.directory, why, at, seg.path, at - seg.base, q - p, path,
            ", ".join(devices), offsets or "unknown")
        self._gap_hints.extend(hints)

    def _apply_gaps(self) -> None:
        """Merge this recovery's gaps with the stored ones; a device whose last record was
        lost moves past it (never reassigning an offset that may have been acked)."""
        for key, off in self._gap_hints:
            dev = self._devices.get(key)
            if dev is not None and off == dev.next:
                self._new_gaps.setdefault(key, []).append((off, off + 1))
                dev.next = dev.durable_end = off + 1
        self._gap_hints = []
        stored = _q.load_gaps(self.directory)
        if self._new_gaps:
            for key, ranges in self._new_gaps.items():
                stored[key] = _q.merge_ranges(stored.get(key, []) + ranges)
            try:
                _q.save_gaps(self.directory, stored)
            except OSError as exc:
                log.error("commitlog %s: cannot record the quarantined gaps (%s)",
                          self.directory, exc)
        for key, ranges in stored.items():
            dev = self._devices.get(key)
            if dev is not None:
                dev.gaps = ranges

    def _clean_pidx_files(self) -> None:
        """Remove position index files of the active segment (its positions live in
        memory and it will grow) and of segments that no longer exist."""
        sealed = {pidx_path(s.path) for s in self._segments[:-1]}
        for name in os.listdir(self.directory):
            if PIDX_SUFFIX in name:
                path = os.path.join(self.directory, name)
                if path not in sealed:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass

    # ------------------------------------------------------------------ write path

    def append(
        self,
        key: str,
        timestamp_us: int,
        topic: str,
        attrs: int,
        headers: Sequence[Header] | None,
        payload: bytes,
    ) -> int:
        """Assign the next offset of ``key`` and buffer the record; return the offset.

        Nothing is written yet (that is :meth:`flush`) and readers cannot see it until
        :meth:`commit`. Kept minimal: this is the per-publish hot path."""
        if self._broken is not None:
            raise LogWriteError(getattr(self._broken, "errno", None),
                                f"commit log is failing: {self._broken}") from self._broken
        dev = self._devices.get(key)
        if dev is None:
            dev = self._devices[key] = DeviceLog(key)
        off = dev.next
        dev.next = off + 1
        rec = _new_record(Record, (off, timestamp_us, key, topic, attrs, headers or (), payload))
        pend = dev.pend
        if pend is None:
            pend = dev.pend = []
            self._pend_devs.append(dev)
        pend.append(rec)
        self._pend_n += 1
        size = HEADER_SIZE + len(dev.kb) + len(topic) + len(payload)
        if headers:
            size += headers_size(headers)
        self._pend_bound += size + 3 * len(topic)
        if self._cache_on:
            dev.cache.append(rec)
            dev.cache_bytes += size
            self._cache_total += size
        return off

    def pending(self) -> int:
        """Records appended but not yet flushed."""
        return self._pend_n

    def flush(self) -> int:
        """Write every buffered record with ONE write; return the commit token.

        Records are laid out grouped by device (each device's records of the batch are
        contiguous, in offset order), so a later read of one device preads few ranges.
        The token is the global store position after the write: :meth:`sync` makes
        positions durable, :meth:`commit` publishes them to readers. On a write error the
        store refuses further appends until :meth:`rollback` (raises LogWriteError)."""
        if self._broken is not None:
            raise LogWriteError(getattr(self._broken, "errno", None),
                                f"commit log is failing: {self._broken}") from self._broken
        nrec = self._pend_n
        if not nrec:
            return self._flushed_pos
        devs = self._pend_devs
        bound = self._pend_bound
        self._pend_devs = []
        self._pend_n = 0
        self._pend_bound = 0
        seg = self._segments[-1]
        if seg.size and seg.size + bound > self.settings.segment_bytes:
            seg = self._roll()
        base_pos = self._flushed_pos
        segb = seg.base
        rel0 = base_pos - segb  # batch start, relative to the segment
        track = self._apos_ok = self._apos_ok and rel0 + bound < POS_LIMIT
        interval = self.settings.index_interval_bytes
        buf = bytearray(bound)
        mv = memoryview(buf)
        p = 0
        bmax = seg.max_ts
        infos: list[tuple] = []
        hpack = HEADER.pack_into
        u32pack = U32.pack_into
        crc32 = zlib.crc32
        apos_devs = self._apos_devs
        c_encode = _rec.c_encode_run
        for dev in devs:
            recs = dev.pend
            dev.pend = None
            if dev.n_ctl:  # control records (truncation markers, epoch starts) come first
                for rec in recs[: dev.n_ctl]:
                    if rec[6]:  # an epoch start (epochs.py): note where it is
                        self._place_epoch(dev, rec, base_pos + p)
                    p = encode_into(buf, p, rec[0], rec[1], dev.kb, "", 0, (), rec[6],
                                    FLAG_CONTROL | (_ep.FLAG_EPOCH if rec[6] else 0), mv)
                recs = recs[dev.n_ctl :]
                dev.n_ctl = 0
                if not recs and dev.raw is None:
                    continue
            if dev.raw is not None:  # follower appends: their bytes as received
                p, rmax = self._flush_raw(dev, buf, p, base_pos, segb, track, interval)
                if rmax > bmax:
                    bmax = rmax
                if not recs:
                    infos.append((dev, dev.next, dev.total, dev.since_idx, segb, dev.max_ts))
                    continue
            # Inlined record encoding (see record.encode_into; this is the hot path).
            kb = dev.kb
            klen = len(kb)
            last_topic = dev.last_topic
            kt = dev.last_kt
            since = dev.since_idx
            total = dev.total
            dmax = MIN_TS
            if dev.seg_base != segb:
                since = interval  # an index entry at the device's first record of a segment
                dev.seg_base = segb
            if track:
                ap = dev.apos
                if dev.apos_base != segb:
                    ap = dev.apos = array("q")
                    dev.apos_base = segb
                    apos_devs.append(dev)
                ap_append = ap.append
            fast = c_encode
            i = 0
            nrecs = len(recs)
            while i < nrecs:
                if fast is not None and since < interval:
                    # C encodes the plain records up to the next index entry; the body
                    # below encodes the one it stopped at.
                    i, p, since, total, dmax, posb = fast(
                        buf, p, recs, i, kb, since, interval, total, dmax,
                        rel0 if track else -1)
                    if posb:
                        ap.frombytes(posb)
                    if i >= nrecs:
                        break
                rec = recs[i]
                i += 1
                topic = rec[3]
                if topic is not last_topic and topic != last_topic:
                    last_topic = topic
                    kt = kb + topic.encode()
                q = p + HEADER_SIZE
                e = q + len(kt)
                buf[q:e] = kt
                hdrs = rec[5]
                if hdrs:
                    for name, value in hdrs:
                        nb = name.encode()
                        HDR_ENTRY.pack_into(buf, e, len(nb), len(value))
                        e += 6
                        buf[e : e + len(nb)] = nb
                        e += len(nb)
                        buf[e : e + len(value)] = value
                        e += len(value)
                payload = rec[6]
                end = e + len(payload)
                buf[e:end] = payload
                n = end - p
                ts = rec[1]
                hpack(buf, p, n - 4, 0, MAGIC, 0, rec[4], rec[0], ts, klen, len(kt) - klen,
                      len(hdrs))
                u32pack(buf, p + 4, crc32(mv[p + 8 : end]))
                if since >= interval:
                    dev.idx_off.append(rec[0])
                    dev.idx_pos.append(base_pos + p)
                    dev.idx_ts.append(dev.max_ts if dev.max_ts > dmax else dmax)
                    dev.idx_cum.append(total)
                    since = 0
                since += n
                total += n
                if ts > dmax:
                    dmax = ts
                if track:
                    ap_append(((rel0 + p) << 32) | n)
                p = end
            dev.last_topic = last_topic
            dev.last_kt = kt
            dev.since_idx = since
            dev.total = total
            if dmax > dev.max_ts:
                dev.max_ts = dmax
            if dmax > bmax:
                bmax = dmax
            infos.append((dev, dev.next, total, since, segb, dev.max_ts))
        mv.release()
        del buf[p:]
        try:
            self._write_all(buf)
        except OSError as exc:
            self._broken = exc
            self.stats.write_errors += 1
            log.error(
                "commitlog %s: write failed (%s). Nothing after the last commit is "
                "acknowledged; publishes are refused until space/permissions are fixed "
                "(free disk space under %s, or lower retention)",
                self.directory, exc, self.directory)
            raise LogWriteError(exc.errno, f"commit log write failed: {exc.strerror}") from exc
        seg.max_ts = bmax
        with self._lock:
            seg.size += p
            self._flushed_pos = base_pos + p
        self._inflight.append((self._flushed_pos, infos))
        st = self.stats
        st.batches += 1
        st.appends += nrec
        st.batch_records_sum += nrec
        st.append_bytes += p
        return self._flushed_pos

    def _write_all(self, buf: bytearray) -> None:
        mv = memoryview(buf)
        try:
            while mv:
                n = os.write(self._wfd, mv)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                mv = mv[n:]
        finally:
            mv.release()

    def _roll(self) -> Segment:
        """Start a new segment at the current end. The old writer fd is handed to the
        next sync, which fsyncs and closes it (never closed under a running fsync)."""
        base = self._flushed_pos
        old = self._segments[-1]
        seg = Segment(base, os.path.join(self.directory, segment_name(base)))
        fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        sealed = self._seal_positions(old)
        with self._lock:
            if sealed is not None:  # written by the sync that fsyncs the sealed segment
                self._pidx_jobs.append((pidx_path(old.path), old.size, sealed))
            self._retired.append(self._wfd)
            self._wfd = fd
            self._dir_dirty = True
            self._segments.append(seg)
            self._seg_bases.append(base)
        self.stats.segments = len(self._segments)
        self.stats.segments_rolled += 1
        return seg

    def _seal_positions(self, seg: Segment) -> dict[bytes, array] | None:
        """Detach the active segment's device positions (at a roll) and cache them as the
        sealed segment's index; None if the segment was not indexed (past POS_LIMIT)."""
        devs = self._apos_devs
        self._apos_devs = []
        ok = self._apos_ok
        self._apos_ok = True
        entries: dict[bytes, array] = {}
        for dev in devs:
            if dev.apos_base == seg.base and dev.apos:
                entries[dev.kb] = dev.apos
            dev.apos = None
            dev.apos_base = -1
        if not ok:
            return None
        self._cache_pidx(seg.base, entries)
        return entries

    def _cache_pidx(self, base: int, idx: PositionIndex | dict[bytes, array]) -> None:
        cache = self._pidx
        cache[base] = idx
        cache.move_to_end(base)
        while len(cache) > self.settings.read_fd_cache:
            cache.popitem(last=False)

    def _drop_pidx(self, seg: Segment) -> None:
        """Forget a segment's position index (deleted, truncated or reactivated segment)."""
        self._pidx.pop(seg.base, None)
        path = pidx_path(seg.path)
        with self._lock:
            self._pidx_jobs = [j for j in self._pidx_jobs if j[0] != path]
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _sealed_positions(self, seg: Segment) -> PositionIndex | dict[bytes, array] | None:
        """The position index of a sealed segment: cached, else its file, else rebuilt by
        a header-only walk of the segment (and written for next time). None if the
        segment cannot be indexed (too large)."""
        idx = self._pidx.get(seg.base)
        if idx is not None:
            self._pidx.move_to_end(seg.base)
            return idx
        path = pidx_path(seg.path)
        try:
            with open(path, "rb") as f:
                idx = PositionIndex(f.read(), seg.size)
        except FileNotFoundError:
            pass
        except (ValueError, struct.error) as exc:
            log.warning("commitlog %s: position index %s unusable (%s); rebuilding it",
                        self.directory, path, exc)
        if idx is None:
            fd = self._read_fd(seg)
            data = os.pread(fd, seg.size, 0)
            try:
                idx, walked = walk_positions(data, 0)
            except ValueError:
                return None
            if walked != seg.size:
                # A damaged header (quarantined, or met by a reader): index the records after
                # it too, each one checked, or reads of their devices would stop there.
                idx = _salvage.verified_positions(data, _new_positions)
            else:
                try:
                    write_file_atomic(path, encode_pidx(seg.size, idx))
                except OSError as exc:
                    log.warning("commitlog %s: cannot write %s (%s)", self.directory, path, exc)
        self._cache_pidx(seg.base, idx)
        return idx

    def sync(self) -> int:
        """fsync everything flushed so far; return the position now durable.

        Safe to call from one worker thread while the loop thread keeps appending and
        flushing: the token is taken under the lock BEFORE the fsync, so it never claims
        bytes written after the fsync started."""
        with self._lock:
            token = self._flushed_pos
            retired = self._retired
            self._retired = []
            fd = self._wfd
            dirty = self._dir_dirty
            self._dir_dirty = False
            jobs = self._pidx_jobs if retired else []
            if retired:
                self._pidx_jobs = []
        t0 = time.perf_counter()
        try:
            for rfd in retired:
                self._fsync(rfd)
            self._fsync(fd)
            if dirty:
                self._fsync_dir()
        except BaseException:
            with self._lock:
                self._retired[:0] = retired
                self._pidx_jobs[:0] = jobs
                self._dir_dirty = self._dir_dirty or dirty
            self.stats.fsync_errors += 1
            raise
        for rfd in retired:
            os.close(rfd)
        for path, size, entries in jobs:
            # The sealed segment is durable now; its position index is a cache (checked
            # on load, rebuilt by a scan when missing), so it is written without fsync.
            try:
                write_file_atomic(path, encode_pidx(size, entries))
            except OSError as exc:
                log.warning("commitlog %s: cannot write %s (%s)", self.directory, path, exc)
        self.stats.observe_fsync(time.perf_counter() - t0)
        with self._lock:
            if token > self._synced_pos:
                self._synced_pos = token
        return token

    def _fsync(self, fd: int) -> None:
        """The one place data fsyncs happen (a seam for fault-injection tests)."""
        os.fsync(fd)

    def _fsync_dir(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def commit(self, token: int) -> None:
        """Make everything flushed up to ``token`` (a position returned by sync) visible:
        moves each touched device's high-water mark and trims tail caches."""
        infl = self._inflight
        if token > self._synced_pos:
            raise ValueError(f"commit({token}) beyond the synced position {self._synced_pos}")
        per_dev_cap = self.settings.tail_cache_bytes_per_device
        lru = self._lru
        waiting = self._waiters.by_key  # per-device commit waiters: checked only if any
        woke: list[DeviceLog] = []
        moved: list[str] | None = None if self.durable_listener is None else []
        while infl and infl[0][0] <= token:
            _end, infos = infl.popleft()
            for dev, nxt, total, since, segb, mx in infos:
                if waiting and dev.replicated_hw < 0 and dev.key in waiting:
                    woke.append(dev)
                if moved is not None and nxt != dev.durable_end:
                    moved.append(dev.key)
                dev.durable_end = nxt
                dev.c_total = total
                dev.c_since = since
                dev.c_seg = segb
                dev.c_max = mx
                if per_dev_cap:
                    if dev.cache_bytes > per_dev_cap:
                        self._trim_cache_front(dev, per_dev_cap)
                    if dev in lru:
                        lru.move_to_end(dev)
                    else:
                        lru[dev] = None
        if token > self._committed_pos:
            self._committed_pos = token
        if self._cache_total > self.settings.tail_cache_bytes_total:
            self._evict_global()
        self.stats.tail_cache_bytes = self._cache_total
        if woke:
            self._wake(woke)
        if moved:
            self.durable_listener(moved)  # type: ignore[misc]

    def _trim_cache_front(self, dev: DeviceLog, cap: int) -> None:
        klen = len(dev.kb)
        cache = dev.cache
        trim = _rec.c_trim_count
        if trim is not None:
            k, freed = trim(cache, klen, dev.cache_bytes - cap)
        else:
            k = 0
            freed = 0
            while k < len(cache) and dev.cache_bytes - freed > cap:
                freed += _cache_size(cache[k], klen)
                k += 1
        del cache[:k]
        dev.cache_start += k
        dev.cache_bytes -= freed
        self._cache_total -= freed

    def _drop_cache(self, dev: DeviceLog) -> None:
        self._cache_total -= dev.cache_bytes
        dev.cache_start += len(dev.cache)
        dev.cache = []
        dev.cache_bytes = 0

    def _evict_global(self) -> None:
        """Least recently used devices lose their whole cache until under the global cap."""
        cap = self.settings.tail_cache_bytes_total
        lru = self._lru
        while self._cache_total > cap and lru:
            dev, _ = lru.popitem(last=False)
            self._drop_cache(dev)
            self.stats.tail_cache_evictions += 1

    def flush_sync_commit(self) -> int:
        """Synchronous convenience (tests, tools, close): flush, fsync, publish."""
        self.flush()
        token = self.sync()
        self.commit(token)
        return token

    def rollback(self, cause: BaseException | None = None) -> None:
        """Discard everything not committed (pending appends and flushed, unsynced bytes)
        after a write/fsync failure, and truncate the file back to the durable end.
        High-water-mark waiters of the discarded records get ``cause`` (the failed write's
        error, so they see the same ENOSPC or EIO as the committer's callbacks), or a
        LogWriteError when none is given.

        Appends work again afterwards if the truncation succeeded; otherwise the store
        stays failed (every append raises) until it is reopened, where recovery cleans up."""
        self._rollback_replica_state(cause)
        pos = self._committed_pos
        for dev in self._pend_devs:
            dev.pend = None
            dev.n_ctl = 0
        self._pend_devs = []
        self._pend_n = 0
        self._pend_bound = 0
        self._inflight.clear()
        for dev in self._devices.values():
            if dev.next != dev.durable_end or dev.total != dev.c_total:
                dev.next = dev.durable_end
                dev.total, dev.since_idx, dev.seg_base, dev.max_ts = (
                    dev.c_total, dev.c_since, dev.c_seg, dev.c_max)
                dev.trim_index_from(dev.durable_end)
                self._trim_cache_back(dev)
        try:
            reactivated = False
            while len(self._segments) > 1 and self._segments[-1].base >= pos:
                seg = self._segments.pop()
                self._seg_bases.pop()
                self._close_read_fd(seg.base)
                self._drop_pidx(seg)
                reactivated = True
                with self._lock:
                    self._retired.append(self._wfd)
                    self._wfd = -1
                os.unlink(seg.path)
            active = self._segments[-1]
            # fsyncgate (PostgreSQL, 2018): after a failed write/fsync the kernel may have
            # dropped dirty pages and an fd may not report the error again. So the writer
            # descriptor is never reused: the bytes after the committed position are cut
            # through a fresh one, and the file's size is checked after that fsync.
            with self._lock:
                retired, self._retired = self._retired, []
                retired.append(self._wfd)
                self._wfd = -1
            for rfd in retired:
                if rfd >= 0:
                    os.close(rfd)
            self._wfd = os.open(active.path, os.O_WRONLY | os.O_APPEND)
            os.ftruncate(self._wfd, pos - active.base)
            active.size = pos - active.base
            self._reset_active_positions(active, reactivated)
            with self._lock:
                self._flushed_pos = self._synced_pos = pos
            self.stats.segments = len(self._segments)
            os.fsync(self._wfd)
            self._fsync_dir()
            if os.fstat(self._wfd).st_size != pos - active.base:
                raise OSError(errno.EIO, f"{active.path} is not {pos - active.base} bytes "
                                         f"after truncating it")
            self._broken = None
        except OSError as exc:
            self._broken = exc
            log.error("commitlog %s: could not truncate after a failed write (%s); the log "
                      "refuses appends until a later rollback succeeds (retried with the "
                      "committer's probe) or the broker restarts", self.directory, exc)

    def _reset_active_positions(self, active: Segment, reactivated: bool) -> None:
        """After a rollback: drop positions past the active segment's end; if an older
        segment became active again, take its positions back from its index."""
        if not reactivated:
            cut = active.size << 32
            for dev in self._apos_devs:
                ap = dev.apos
                if ap is not None:
                    j = bisect.bisect_left(ap, cut)
                    if j < len(ap):
                        del ap[j:]
            return
        for dev in self._apos_devs:
            dev.apos = None
            dev.apos_base = -1
        self._apos_devs = []
        self._apos_ok = True
        self._pidx.pop(active.base, None)
        try:
            fd = self._read_fd(active)
            entries, _ = walk_positions(os.pread(fd, active.size, 0), 0)
        except ValueError:
            entries = None
        self._drop_pidx(active)
        if entries is None:
            self._apos_ok = False
            return
        by_kb = {d.kb: d for d in self._devices.values()}
        for kb, arr in entries.items():
            dev = by_kb.get(kb)
            if dev is not None:
                dev.apos = arr
                dev.apos_base = active.base
                self._apos_devs.append(dev)

    def _trim_cache_back(self, dev: DeviceLog) -> None:
        keep = dev.durable_end - dev.cache_start
        if keep < 0:
            self._drop_cache(dev)
            dev.cache_start = dev.durable_end
            return
        if keep < len(dev.cache):
            klen = len(dev.kb)
            freed = sum(_cache_size(r, klen) for r in dev.cache[keep:])
            del dev.cache[keep:]
            dev.cache_bytes -= freed
            self._cache_total -= freed

    # ------------------------------------------------------------------ read path

    def keys(self) -> list[str]:
        """Every device key with a log (possibly empty after retention); internal state
        logs (INTERNAL_PREFIX) are not device logs and are left out."""
        return [k for k in self._devices if not k.startswith(INTERNAL_PREFIX)]

    def __contains__(self, key: str) -> bool:
        return key in self._devices and not key.startswith(INTERNAL_PREFIX)

    def internal_keys(self) -> list[str]:
        """The broker's state logs, which :meth:`keys` leaves out: a log replicator must
        list these too (they replicate like device logs; only readers must not see them)."""
        return [k for k in self._devices if k.startswith(INTERNAL_PREFIX)]

    def log_range(self, key: str) -> tuple[int, int]:
        """(log start, high-water mark): the range readers may read; (0, 0) for an unknown
        key. The end is :meth:`high_watermark`, the visible end."""
        dev = self._devices.get(key)
        if dev is None:
            return (0, 0)
        return (dev.start, dev.high_watermark)

    def high_watermark(self, key: str) -> int:
        """The visible end (Kafka's high watermark): the first offset not yet committed;
        every reader sees offsets below it and only those. The durable end on a single
        node; the replicated high-water mark once a replication layer sets it with
        :meth:`set_high_watermark`. Readers use this (or :meth:`log_range`), never
        :meth:`log_end` or :meth:`durable_end`."""
        dev = self._devices.get(key)
        return 0 if dev is None else dev.high_watermark

    def past_gap(self, key: str, offset: int) -> int:
        """``offset``, or the end of the quarantined gap it falls in (see quarantine.py): where
        a reader that got nothing at ``offset`` goes on, instead of asking again forever."""
        dev = self._devices.get(key)
        if dev is None or not dev.gaps:
            return offset
        for lo, hi in dev.gaps:
            if lo <= offset < hi:
                return hi
        return offset

    def lost_ranges(self, key: str, lo: int, hi: int) -> list[tuple[int, int]]:
        """The offset ranges in [lo, hi) lost to quarantined corruption (found by recovery
        or by a reader): what a reader that went from ``lo`` to ``hi`` skipped."""
        dev = self._devices.get(key)
        if dev is None or not dev.gaps:
            return []
        return [(max(a, lo), min(b, hi)) for a, b in dev.gaps if a < hi and b > lo]

    def log_end(self, key: str) -> int:
        """The log end (Kafka's log end offset): the next offset to be assigned, so it
        counts appends not yet durable. Never a reader's bound: see :meth:`high_watermark`."""
        dev = self._devices.get(key)
        return 0 if dev is None else dev.next

    def read(
        self, key: str, offset: int, max_records: int = 1000, max_bytes: int = 1 << 20
    ) -> list[Record]:
        """Committed records of ``key`` from ``offset``: at most ``max_records``, and at
        most ``max_bytes`` (but always at least one record if one exists).

        Served from the tail cache when ``offset`` is inside it; otherwise from disk via
        the sparse index. Raises OffsetOutOfRangeError below the start or above the end."""
        dev = self._devices.get(key)
        if dev is None:
            if offset == 0:
                return []
            raise OffsetOutOfRangeError(key, offset, 0, 0)
        return self._read(dev, offset, dev.high_watermark, max_records,
                          max_bytes)

    def _read(self, dev: DeviceLog, offset: int, end: int, max_records: int,
              max_bytes: int) -> list[Record]:
        """``read`` below ``end`` (the high-water mark; the durable end for followers)."""
        key = dev.key
        if offset < dev.start or offset > end:
            raise OffsetOutOfRangeError(key, offset, dev.start, end)
        upto = min(end, offset + max_records)
        if upto <= offset:
            return []
        cs = dev.cache_start
        cend = cs + len(dev.cache)
        if cs <= offset and upto <= cend:
            self.stats.tail_cache_hits += 1
            if dev in self._lru:
                self._lru.move_to_end(dev)
            out = dev.cache[offset - cs : upto - cs]
            if dev.cache_bytes > max_bytes:
                out = self._cap_bytes(out, len(dev.kb), max_bytes, 0)
            return out
        self.stats.tail_cache_misses += 1
        out: list[Record] = []
        # Disk up to where the cache starts (if the cache holds the rest), else all of it.
        disk_upto = cs if (offset < cs < upto <= cend) else upto
        stale_tried = False
        while True:
            try:
                used = self._read_disk(dev, offset, disk_upto, max_bytes, out)
                break
            except CorruptRecordError as exc:
                # A record recovery never scanned (a clean start trusts its checkpoint) is
                # bad: handle it as recovery would and read again around it. Each round
                # learns a new bad range or gap, so this ends; nothing learned: raise.
                if not self._salvage(dev, getattr(exc, "want", offset), exc):
                    seg = getattr(exc, "stale_seg", None)
                    if seg is None or stale_tried:
                        raise
                    # The device's records are intact where a full walk looks: it was the
                    # position index that pointed at something else. Rebuild it, once.
                    stale_tried = True
                    self._stale_positions(seg)
                out.clear()
        if disk_upto < upto and len(out) == disk_upto - offset and used < max_bytes:
            out.extend(self._cap_bytes(dev.cache[: upto - cs], len(dev.kb), max_bytes, used))
        return out

    def read_raw(
        self, key: str, offset: int, max_records: int = 1000, max_bytes: int = 1 << 20
    ) -> tuple[list[bytes], int, int]:
        """What :meth:`read` returns, as stored bytes: ``(chunks, record count, next
        offset)``, the chunks holding the records back to back in the record framing (join
        them, or send them as they are: the fetch API joins a whole response once). For
        readers that forward records.

        Why: forwarding through ``read`` decodes every record into a ``Record`` and encodes
        it back, ~3 µs per record in Python, which capped the Spark source near 300k
        records/s. Here records are sent as ``pread`` returned them from the segment files
        once their framing, key, offset and CRC are checked (C loop ``raw_run`` when built).
        The tail cache is not used: its records are decoded objects (encoding them again is
        the cost this avoids), and committed records near the head are in the page cache
        anyway. Anything the plain path does not cover (a truncation marker or a quarantine
        gap after the start, a segment without a position index, a record failing a check)
        goes through ``read`` and is encoded back, so errors, warnings and skips stay
        exactly ``read``'s.

        Same range rules and errors as ``read``; ``max_bytes`` counts exact encoded bytes
        (always at least one record if one exists). ``next offset`` is the last returned
        offset + 1, or ``offset`` when nothing was returned."""
        dev = self._devices.get(key)
        if dev is None:
            if offset == 0:
                return [], 0, 0
            raise OffsetOutOfRangeError(key, offset, 0, 0)
        end = dev.high_watermark
        if offset < dev.start or offset > end:
            raise OffsetOutOfRangeError(key, offset, dev.start, end)
        upto = min(end, offset + max_records)
        if upto <= offset:
            return [], 0, offset
        got = self._raw_disk(dev, offset, upto, max_bytes)
        if got is None:
            recs = self._read(dev, offset, end, max_records, max_bytes)
            return ([_encode_records(dev.kb, recs)] if recs else [], len(recs),
                    recs[-1][0] + 1 if recs else offset)
        self.stats.tail_cache_misses += 1  # served from the files (see above)
        parts, want, _used = got
        return parts, want - offset, want

    def _raw_disk(
        self, dev: DeviceLog, offset: int, upto: int, max_bytes: int
    ) -> tuple[list[bytes], int, int] | None:
        """Stored bytes of this device's records [offset, upto) on disk (at most
        ``max_bytes``): ``(chunks, next offset, bytes)``, or None when the plain path does
        not apply (the caller then uses ``read``). The plain path: no truncation marker
        and no quarantine gap after the start (offsets are then consecutive in position
        order, so the reader jumps from the index entry straight to ``offset``, across
        segments too) and a position index for every segment on the way."""
        if dev.gaps:
            return None
        i = bisect.bisect_right(dev.idx_off, offset) - 1
        if i < 0:
            return None
        pos = dev.idx_pos[i]
        if dev.stale_floor(pos) != _NO_FLOOR:
            return None
        self.stats.disk_reads += 1
        skip = offset - dev.idx_off[i]
        limit = self._committed_pos
        kb = dev.kb
        run = _rec.c_raw_run or _raw_run
        coalesce = _rec.c_coalesce
        parts: list[bytes] = []
        want = offset
        used = 0
        while want < upto and pos < limit:
            si = bisect.bisect_right(self._seg_bases, pos) - 1
            seg = self._segments[si]
            seg_limit = min(seg.end, limit)
            if pos >= seg_limit:
                break
            if si == len(self._segments) - 1:
                if not self._apos_ok:
                    return None
                plist = dev.apos if dev.apos_base == seg.base and dev.apos is not None \
                    else _EMPTY
            else:
                idx = self._sealed_positions(seg)
                if idx is None:
                    return None
                plist = idx.get(kb) or _EMPTY
            base = seg.base
            rel_limit = seg_limit - base
            n = len(plist)
            j = bisect.bisect_left(plist, (pos - base) << 32)
            if skip:
                if j + skip >= n:  # the offset is in a later segment
                    skip -= n - j
                    pos = seg.end
                    continue
                j += skip
                skip = 0
            fd = self._read_fd(seg)
            while j < n and want < upto:
                v = plist[j]
                s = v >> 32
                e = s + (v & LEN_MASK)
                if e > rel_limit:
                    return parts, want, used  # not committed yet
                k = j + 1
                kmax = j + (upto - want)
                if coalesce is not None:
                    k, e = coalesce(plist, k, kmax, s, e, rel_limit, READ_CHUNK)
                while k < n and k < kmax:
                    v = plist[k]
                    if v >> 32 != e:
                        break
                    e2 = e + (v & LEN_MASK)
                    if e2 > rel_limit or e2 - s > READ_CHUNK:
                        break
                    e = e2
                    k += 1
                data = os.pread(fd, e - s, s)
                if len(data) != e - s:
                    return None
                p, want, used, done = run(data, 0, kb, want, upto, used, max_bytes)
                if p:
                    parts.append(data if p == len(data) else data[:p])
                if done:
                    return parts, want, used
                if p < len(data):
                    return None  # a record the plain path does not take: read() decides
                j = k
            pos = seg.end
        return parts, want, used

    @staticmethod
    def _cap_bytes(recs: list[Record], klen: int, max_bytes: int, used: int) -> list[Record]:
        """Cut ``recs`` where ``max_bytes`` would be exceeded; keep one if none came before."""
        for i, r in enumerate(recs):
            used += _cache_size(r, klen)
            if used > max_bytes:
                return recs[: i if (i or used > _cache_size(r, klen)) else 1]
        return recs

    def _read_fd(self, seg: Segment) -> int:
        fds = self._read_fds
        fd = fds.get(seg.base)
        if fd is not None:
            fds.move_to_end(seg.base)
            return fd
        fd = os.open(seg.path, os.O_RDONLY)
        fds[seg.base] = fd
        while len(fds) > self.settings.read_fd_cache:
            _, old = fds.popitem(last=False)
            os.close(old)
        return fd

    def _close_read_fd(self, base: int) -> None:
        fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)

    def _read_disk(
        self, dev: DeviceLog, offset: int, upto: int, max_bytes: int, out: list[Record]
    ) -> int:
        """Read this device's records [offset, upto) from disk, at most ``max_bytes``.

        Starts at the sparse index entry at or before ``offset``; in each segment the
        device position index gives where this device's records are, so only they are
        read (adjacent ones coalesced into one pread) and decoded, never other devices'
        records. A segment without a usable position index falls back to scanning it and
        skipping other devices' records by header. Every record returned is CRC-checked.
        Returns the bytes read into ``out``."""
        if upto <= offset:
            return 0
        self.stats.disk_reads += 1
        i = bisect.bisect_right(dev.idx_off, offset) - 1
        if i < 0:
            raise CorruptRecordError(f"no index entry for {dev.key!r} offset {offset}", 0)
        pos = dev.idx_pos[i]
        # Without truncation markers after ``pos`` a device's records have consecutive
        # offsets, so the reader can jump straight from the index entry to ``offset``.
        skip = (offset - dev.idx_off[i]
                if dev.stale_floor(pos) == _NO_FLOOR and not dev.gaps else 0)
        limit = self._committed_pos
        state = [offset, 0]  # next wanted offset, bytes used
        while state[0] < upto and pos < limit:
            si = bisect.bisect_right(self._seg_bases, pos) - 1
            seg = self._segments[si]
            seg_limit = min(seg.end, limit)
            if pos >= seg_limit:
                break
            if si == len(self._segments) - 1:
                plist = (dev.apos if dev.apos_base == seg.base else _EMPTY) if self._apos_ok \
                    else None
            else:
                idx = self._sealed_positions(seg)
                plist = None if idx is None else (idx.get(dev.kb) or _EMPTY)
            done = None
            try:
                if plist is not None:
                    try:
                        done = self._read_positions(dev, seg, plist, pos, skip, seg_limit,
                                                    upto, max_bytes, state, out)
                    except _Stale:
                        self._stale_positions(seg)
                if done is None:
                    done = self._scan_segment(dev, seg, pos, seg_limit, upto, max_bytes, state,
                                              out)
            except CorruptRecordError as exc:
                exc.want = state[0]  # where the reader stood: ``_salvage`` starts there
                raise
            if done:
                break
            skip = 0
            pos = seg.end
        return state[1]

    def _stale_positions(self, seg: Segment) -> None:
        """A position index entry of ``seg`` does not point at the device's record."""
        log.warning("commitlog %s: position index of %s does not match the segment; "
                    "rebuilding it", self.directory, seg.path)
        self._drop_pidx(seg)
        if seg is self._segments[-1]:
            self._apos_ok = False  # the scan fallback serves the active segment

    def _salvage(self, dev: DeviceLog, want: int, exc: CorruptRecordError) -> bool:
        """A read of ``dev`` at offset ``want`` met ``exc``: do what recovery does with a
        corrupt record that has intact ones after it (quarantine.py), from the reader's side.

        Walks the log from the device's index entry at or before ``want`` checking every
        record (commitlog/salvage.py: framing, CRC, resynchronising over bad bytes), and
        remembers what it finds: the bad byte ranges (every read path steps over them) and
        the device's offsets from ``want`` to its next intact record (or to the committed end)
        as a gap (``quarantine/gaps.json``, which readers skip and the fetch API names). A
        new loss is reported as recovery reports one: ERROR, the bad bytes copied to
        quarantine/, ``stats.corrupt_*``. Offsets are never renumbered.

        True when something new was learned (the read is worth trying again); False when
        the walk finds the device's records intact (the caller raises, or rebuilds a stale
        position index)."""
        i = bisect.bisect_right(dev.idx_off, want) - 1
        if i < 0:
            return False
        hw = dev.high_watermark
        start = dev.idx_pos[i]
        limit = self._committed_pos
        stale = dev.is_stale if dev.markers else None
        found = -1
        bad: list[tuple[int, int, bool]] = []
        mine = 0  # bad[mine:] lie after the device's last intact record below ``want``

        def is_other(kb: bytes, off: int) -> bool:
            """A damaged header that still names another device's existing offset."""
            try:
                other = self._devices.get(kb.decode())
            except UnicodeDecodeError:
                return False
            return other is not None and other is not dev and other.start <= off < other.next

        # The walk runs on the caller's thread (a router's event loop) and checks every
        # record's CRC: about 0.25 s per 64 MiB segment. A quiet device's next record may be
        # gigabytes on, so segments that hold none of the device's records (its sparse
        # index says which: ``_holds_device``) are skipped, as the read path skips them
        # (Kafka's readers go by the offset index, never a log scan). Where that walk finds no
        # bad byte at all (an index that disagrees with the bytes), the whole stretch is
        # walked as before: the safety net costs nothing where the index is right.
        for skip in (True, False):
            pos = start
            found = -1
            bad = []
            mine = 0
            while pos < limit:
                seg = self._segments[bisect.bisect_right(self._seg_bases, pos) - 1]
                seg_limit = min(seg.end, limit)
                if pos >= seg_limit:
                    break
                if skip and pos != start and not self._holds_device(seg, dev):
                    pos = seg.end
                    continue
                data = os.pread(self._read_fd(seg), seg_limit - pos, pos - seg.base)
                walk = _salvage.walk_device(data, pos, dev.kb, want, stale, is_other)
                if walk.mine >= 0:
                    mine = len(bad) + walk.mine
                bad.extend(walk.bad)
                if walk.found >= 0:
                    found = walk.found
                    break
                pos = seg.end
            if bad:
                break
        new_bad = [(a, b) for a, b, _o in bad if self._bad.get(a) != b]
        for a, b in new_bad:
            self._bad[a] = b
        lost_hi = found if found >= 0 else hw
        after = bad[mine:]
        # Offsets missing without a bad byte before them are not corruption: never a gap.
        lost = (want, lost_hi) if lost_hi > want and after else None
        # What to report as this device's: not a range whose header names another device
        # (that one's reader reports it), unless nothing else could have held the loss.
        ours = [(a, b) for a, b, other in after if not other] or [(a, b) for a, b, _ in after]
        if lost is not None and dev.in_gap(*lost):
            lost = None  # known (gaps.json, e.g. found before a restart)
        if lost is None:
            if new_bad:
                log.warning("commitlog %s: stepping over %d bad byte range(s) at store "
                            "position(s) %s met while reading %r (already reported, or other "
                            "devices' records: their readers report what they lost)",
                            self.directory, len(new_bad), [a for a, _ in new_bad], dev.key)
            return bool(new_bad)
        dev.gaps = _q.merge_ranges([*(dev.gaps or ()), lost])
        stored = _q.load_gaps(self.directory)
        stored[dev.key] = _q.merge_ranges([*stored.get(dev.key, ()), lost])
        try:
            _q.save_gaps(self.directory, stored)
        except OSError as err:
            log.error("commitlog %s: cannot record the gap (%s); it is skipped until a "
                      "restart, then found again", self.directory, err)
        paths: list[str] = []
        nbytes = 0
        copied = 0
        # Each bad byte copied once, however many devices lost records in it: a zeroed run
        # of sectors holds records of thousands, and each device's walk starts at its own
        # index entry, so their ranges overlap (nested, one end). A copy per device filled
        # the disk the log needs (and counted the same bytes again); only what no copy in
        # quarantine/ covers yet is written (across a restart too: the files' names).
        if self._quarantined is None:
            self._quarantined = _q.quarantined_ranges(self.directory)
        for a, b in ours:
            nbytes += b - a
            pieces, covering = _q.uncovered(self._quarantined, a, b)
            paths.extend(covering)
            for pa, pb in pieces:
                s_ = self._segments[bisect.bisect_right(self._seg_bases, pa) - 1]
                try:
                    raw = os.pread(self._read_fd(s_), min(pb - pa, 1 << 24), pa - s_.base)
                    path = _q.write_quarantine(self.directory, dev.key, s_.base, pa, raw)
                except OSError as err:
                    paths.append(f"(not copied: {err})")
                    continue
                self._quarantined.append((pa, pb, path))
                paths.append(path)
                copied += pb - pa
        self.stats.corrupt_records += 1
        self.stats.corrupt_bytes += copied
        log.error(
            "commitlog %s: a read of %r at offset %d met a corrupt record (%s): offsets "
            "[%d, %d) of %r are lost; %d corrupt bytes at store position(s) %s quarantined "
            "to %s and skipped, later records kept. Readers skip the lost offsets (the "
            "fetch API names them; a Spark query fails on them unless failOnDataLoss=false). "
            "Check the disk (SMART, dmesg).",
            self.directory, dev.key, want, exc, lost[0], lost[1], dev.key, nbytes,
            [a for a, _ in ours], ", ".join(paths) or "(nothing to copy)")
        return True

    def _holds_device(self, seg: Segment, dev: DeviceLog) -> bool:
        """False for a segment where ``dev``'s sparse index has no entry: a device's first
        record in each segment gets one (``seg_base``) when the batch holding it is laid out,
        before it commits, and in recovery, so such a segment holds none of its committed
        records. In memory: no segment or .pidx is read."""
        j = bisect.bisect_left(dev.idx_pos, seg.base)
        return j < len(dev.idx_pos) and dev.idx_pos[j] < seg.end

    @staticmethod
    def _past_bad(plist: array, base: int, s: int, p: int, bad_end: int) -> int:
        """Where a position read goes on from a known bad range at buffer byte ``p`` (the
        buffer starts at segment byte ``s``): past the record the position index lists
        there (its size is known without the damaged header), else past the bad range."""
        rel = s + p
        j = bisect.bisect_left(plist, rel << 32)
        if j < len(plist) and plist[j] >> 32 == rel:
            return p + (plist[j] & LEN_MASK)
        return bad_end - base - s

    def _read_positions(
        self, dev: DeviceLog, seg: Segment, plist: array, pos: int, skip: int, seg_limit: int,
        upto: int, max_bytes: int, state: list[int], out: list[Record],
    ) -> bool:
        """Read this device's records of ``seg`` from its positions; True when done."""
        base = seg.base
        rel_limit = seg_limit - base
        n = len(plist)
        j = bisect.bisect_left(plist, (pos - base) << 32)
        if skip and j + skip < n:
            j += skip
        want, used = state
        kb = dev.kb
        klen = len(kb)
        key = dev.key
        markers = dev.markers
        gaps = dev.gaps
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        append = out.append
        fd = self._read_fd(seg)
        last_tb = b""
        last_topic = ""
        # Quarantine gaps are handled by the Python body only (the C run does not know them).
        c_read = None if gaps else _rec.c_read_run
        bad = self._bad  # bad ranges readers met: stepped over (see ``_salvage``)
        floor = _NO_FLOOR
        jump = -1
        coalesce = _rec.c_coalesce
        try:
            while j < n and want < upto:
                v = plist[j]
                s = v >> 32
                e = s + (v & LEN_MASK)
                if e > rel_limit:
                    return True  # not committed yet
                k = j + 1
                kmax = j + (upto - want)
                if coalesce is not None:
                    k, e = coalesce(plist, k, kmax, s, e, rel_limit, READ_CHUNK)
                while k < n and k < kmax:
                    v = plist[k]
                    if v >> 32 != e:
                        break
                    e2 = e + (v & LEN_MASK)
                    if e2 > rel_limit or e2 - s > READ_CHUNK:
                        break
                    e = e2
                    k += 1
                data = os.pread(fd, e - s, s)
                if len(data) != e - s:
                    raise _Stale()
                mv = memoryview(data)
                p = 0
                dn = len(data)
                if markers:
                    # Records below the floor cannot be stale: C may serve them.
                    floor = dev.stale_floor(base + s)
                while p < dn:
                    if c_read is not None and want < floor:
                        # C decodes the plain records; the body below handles the one it
                        # stopped at (any failed check, the byte cap, the floor, anything
                        # odd).
                        cupto = upto if upto <= floor else floor
                        p, want, used, done = c_read(data, p, kb, key, want, cupto, used,
                                                     max_bytes, out)
                        if done and (want >= upto or used >= max_bytes):
                            return True
                        if p >= dn:
                            break
                    if bad and base + s + p in bad:
                        p = self._past_bad(plist, base, s, p, bad[base + s + p])
                        continue
                    (length, crc, magic, flags, attrs, off, ts, kl, tl, hc) = unpack(data, p)
                    rend = frame_end(length, magic, p, dn)
                    q = p + HEADER_SIZE
                    if (rend < 0 or kl != klen or flags & FLAG_CONTROL
                            or data[q : q + kl] != kb):
                        if rend > 0 and crc32(mv[p + 8 : rend]) == crc:
                            raise _Stale()  # an intact record of another key: index is stale
                        # A damaged record (its length, magic or key) where the index says
                        # one of ours is; ``_salvage`` tells it from a stale index.
                        err = CorruptRecordError("bad record framing or key", base + s + p)
                        err.stale_seg = seg
                        try:
                            raise err
                        finally:
                            # a raised local is a cycle (err -> traceback -> this frame ->
                            # err) holding the segment's bytes until the cyclic collector
                            # runs, which meshmq/node.py makes rarer: broken here
                            del err
                    if off != want or markers:
                        if off < want:
                            p = rend
                            continue
                        if markers and dev.is_stale(base + s + p, off):
                            # This device's later records up to the next truncation's
                            # boundary are stale too (consecutive offsets, no cut between):
                            # jump there instead of reading them one by one.
                            nb = dev.next_boundary(base + s + p) - base
                            if nb >= e:
                                jump = nb
                                break
                            p = rend
                            continue
                        if off > want and gaps and dev.in_gap(want, off):
                            want = off  # lost to quarantined corruption: skip the gap
                        if off != want:
                            if crc32(mv[p + 8 : rend]) != crc:  # its offset field is damaged
                                raise CorruptRecordError("CRC mismatch", base + s + p)
                            raise CorruptRecordError(
                                f"{key!r}: found offset {off} while reading {want}",
                                base + s + p)
                    if out and used + length + 4 > max_bytes:
                        return True
                    if crc32(mv[p + 8 : rend]) != crc:
                        if gaps and dev.in_gap(off, off + 1):
                            p = rend  # the quarantined record (a rebuilt .pidx lists it)
                            continue
                        raise CorruptRecordError("CRC mismatch", base + s + p)
                    q += kl
                    tb = data[q : q + tl]
                    if tb != last_tb:
                        last_tb = tb
                        last_topic = tb.decode()
                    q += tl
                    headers: Sequence[Header] = ()
                    if hc:
                        headers, q = _decode_headers(data, q, hc)
                        if q > rend:
                            raise CorruptRecordError("record fields overrun its length",
                                                     base + s + p)
                    append(_new_record(Record, (off, ts, key, last_topic, attrs, headers,
                                                data[q:rend])))
                    used += length + 4
                    want += 1
                    if want >= upto or used >= max_bytes:
                        return True
                    p = rend
                mv.release()
                j = k
                if jump >= 0:
                    j = max(k, bisect.bisect_left(plist, jump << 32))
                    jump = -1
            return want >= upto
        finally:
            state[0] = want
            state[1] = used

    def _scan_segment(
        self, dev: DeviceLog, seg: Segment, pos: int, seg_limit: int, upto: int,
        max_bytes: int, state: list[int], out: list[Record],
    ) -> bool:
        """Fallback without position index: scan ``seg`` from ``pos`` picking this
        device's records out of the interleaved stream (others skipped by header only,
        no CRC, no decode). True when done."""
        kb = dev.kb
        klen = len(kb)
        markers = dev.markers
        want, used = state
        unpack = HEADER.unpack_from
        size = READ_CHUNK
        retried = False
        bad = self._bad  # bad ranges readers met: stepped over (see ``_salvage``)
        fd = self._read_fd(seg)
        try:
            while want < upto and pos < seg_limit:
                data = os.pread(fd, min(size, seg_limit - pos), pos - seg.base)
                n = len(data)
                p = 0
                while p + HEADER_SIZE <= n:
                    if bad and pos + p in bad:
                        p = bad[pos + p] - pos
                        continue
                    (length, _c, magic, flags, _a, off, _t, kl, _tl, _hc) = unpack(data, p)
                    end = p + 4 + length
                    if magic != MAGIC or length < HEADER_SIZE - 4:
                        # A damaged header: walking on by its length would read garbage.
                        raise CorruptRecordError("bad record length or magic", pos + p)
                    if end > n:
                        break
                    if kl == klen and data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == kb and not (
                        flags & FLAG_CONTROL
                    ):
                        if off >= want and not (markers and dev.is_stale(pos + p, off)):
                            if off > want and dev.gaps and dev.in_gap(want, off):
                                want = off  # lost to quarantined corruption: skip the gap
                            if off != want:
                                raise CorruptRecordError(
                                    f"{dev.key!r}: found offset {off} while reading {want}",
                                    pos + p)
                            if out and used + length + 4 > max_bytes:
                                return True
                            try:
                                rec, _f, _e = decode_one(data, p)
                            except CorruptRecordError:
                                if not (dev.gaps and dev.in_gap(off, off + 1)):
                                    raise
                                p = end  # the quarantined record itself: skip it
                                continue
                            out.append(rec)
                            used += length + 4
                            want += 1
                            if want >= upto or used >= max_bytes:
                                return True
                    p = end
                if p == 0:
                    # One record larger than the chunk: re-read exactly it.
                    if n < HEADER_SIZE or retried:
                        raise CorruptRecordError("truncated record in a committed segment", pos)
                    (length,) = struct.unpack_from("<I", data, 0)
                    size = 4 + length
                    retried = True
                    continue
                size = READ_CHUNK
                retried = False
                pos += p
            return want >= upto
        finally:
            state[0] = want
            state[1] = used

    def offset_for_timestamp(self, key: str, timestamp_us: int) -> int:
        """First committed offset whose timestamp is >= ``timestamp_us``; the end offset
        if none. Uses the time index (running max) to start the scan close to it."""
        dev = self._devices.get(key)
        if dev is None:
            return 0
        hw = dev.high_watermark
        n = bisect.bisect_left(dev.idx_off, hw)
        i = bisect.bisect_left(dev.idx_ts, timestamp_us, 0, n) - 1
        off = dev.idx_off[i] if i >= 0 else dev.start
        off = max(off, dev.start)
        while off < hw:
            recs = self.read(key, off, 512, 1 << 22)
            if not recs:
                break
            for r in recs:
                if r[1] >= timestamp_us:
                    return r[0]
            off = recs[-1][0] + 1
        return hw

    def iter_records(self, key: str, offset: int | None = None) -> Iterator[Record]:
        """All committed records of ``key`` from ``offset`` (default: start)."""
        dev = self._devices.get(key)
        if dev is None:
            return
        off = dev.start if offset is None else offset
        while off < dev.high_watermark:
            recs = self.read(key, off, 4096, 1 << 24)
            if not recs:
                return
            yield from recs
            off = recs[-1][0] + 1

    # ------------------------------------------------------------------ truncation

    def truncate(self, key: str, offset: int, timestamp_us: int | None = None) -> None:
        """Cut ``key``'s log to end at ``offset`` (leader-epoch truncation of a diverged
        tail). Writes a control record so recovery replays the cut; it becomes durable
        with the next sync. The key must have no uncommitted appends."""
        dev = self._devices.get(key)
        if dev is None:
            if offset == 0:
                return
            raise OffsetOutOfRangeError(key, offset, 0, 0)
        if dev.next != dev.durable_end:
            raise LogStoreError(f"{key!r} has uncommitted appends; commit before truncating")
        if not dev.start <= offset <= dev.durable_end:
            raise OffsetOutOfRangeError(key, offset, dev.start, dev.durable_end)
        if offset == dev.durable_end:
            return
        old_end = dev.durable_end
        self._truncate_state(dev, offset, self._flushed_pos)
        if dev.gaps and dev.gaps[-1][1] > offset:
            self._drop_gaps_from(dev, offset)
        self._fail_waiters(dev, offset, old_end, LogTruncatedError(key, offset))
        dev.c_total, dev.c_since, dev.c_seg, dev.c_max = (
            dev.total, dev.since_idx, dev.seg_base, dev.max_ts)
        self._trim_cache_back(dev)
        ts = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        pend = dev.pend
        if pend is None:
            pend = dev.pend = []
            self._pend_devs.append(dev)
        # No appends of this key can be pending (next == durable_end), so control records are
        # always the first ``n_ctl`` pending records of the device.
        pend.append(_new_record(Record, (offset, ts, key, "", 0, (), b"")))
        dev.n_ctl += 1
        self._pend_n += 1
        self._pend_bound += HEADER_SIZE + len(dev.kb)

    def reset_start(self, key: str, offset: int, timestamp_us: int | None = None) -> None:
        """Drop every record of ``key`` and restart its log **empty at** ``offset``: log
        start = durable end = log end = ``offset``, no leader epochs (Kafka's
        ``Log.truncateFullyAndStartAt``). What a follower does when its fetch offset fell
        below its leader's log start (retention or ``advance_start`` on the leader, KIP-107):
        the records it holds are ones the leader itself no longer has, and the offsets
        between its end and ``offset`` exist nowhere any more; keeping the old records
        would leave a hole no fetch can fill, and fetching from its own end is refused
        forever (cluster/fetcher.py).

        Only forward: ``offset`` must be past the durable end (a start never moves back and
        an offset is never reused; a log that must *shrink* is :meth:`truncate`'s). Like a
        truncation it writes a control record (a marker at ``offset`` above the log's end,
        which recovery replays as this reset: see ``_scan_tail``); it becomes durable with
        the next sync. A crash before that recovers the old log whole (a fetch then finds
        it below the leader's start again and resets again); after it, the reset log. The
        checkpoint records the new start and end directly. Commit waiters of the dropped
        records fail with LogTruncatedError. Raises LogStoreError while the key has
        uncommitted appends, ValueError for an offset not past the durable end."""
        if self._broken is not None:
            raise LogWriteError(getattr(self._broken, "errno", None),
                                f"commit log is failing: {self._broken}") from self._broken
        dev = self._devices.get(key)
        if dev is None:
            if offset <= 0:
                return
            # a new log: recovery meets the marker first and starts the log at its offset
            dev = self._devices[key] = DeviceLog(key, offset)
        else:
            if dev.next != dev.durable_end or dev.raw is not None \
                    or (dev.pend is not None and len(dev.pend) > dev.n_ctl):
                raise LogStoreError(f"{key!r} has uncommitted appends; commit before resetting")
            if offset <= dev.durable_end:
                raise ValueError(f"cannot restart {key!r} at offset {offset}: not past its "
                                 f"durable end {dev.durable_end} (a start never moves back)")
            old_end, old_hw = dev.durable_end, dev.high_watermark
            self._reset_state(dev, offset, self._flushed_pos)
            if dev.key in self._waiters.by_key:
                # every waiter above the old mark waits for a dropped record, or for one
                # never written here: a success from the mark at the new start would be false
                call_all(self._waiters.take_between(key, old_hw, 1 << 62),
                         LogTruncatedError(key, old_end))
            if dev.gaps:
                self._drop_gaps_from(dev, 0)
        ts = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        pend = dev.pend
        if pend is None:
            pend = dev.pend = []
            self._pend_devs.append(dev)
        # only control records can be pending here: the marker follows them, in order
        pend.append(_new_record(Record, (offset, ts, key, "", 0, (), b"")))
        dev.n_ctl += 1
        self._pend_n += 1
        self._pend_bound += HEADER_SIZE + len(dev.kb)

    def _reset_state(self, dev: DeviceLog, offset: int, boundary: int) -> None:
        """In-memory side of :meth:`reset_start` (and of its marker, in recovery): empty at
        ``offset``. The marker ``(boundary, offset)`` makes any record written before it at
        an offset >= ``offset`` stale (an older truncation may have left such records on
        disk, which a reader of the new records' segment must not take for them)."""
        dev.drop_index_before(len(dev.idx_off))
        dev.markers = [(boundary, offset)]
        dev.mk = None
        dev.epochs = None  # Kafka's truncateFullyAndStartAt clears the epoch cache too
        if dev.replicated_hw >= 0:
            dev.replicated_hw = offset
        dev.next = dev.durable_end = dev.start = offset
        dev.since_idx = 0
        dev.seg_base = -1  # the next record gets an index entry past the marker
        dev.c_total, dev.c_since, dev.c_seg, dev.c_max = (
            dev.total, dev.since_idx, dev.seg_base, dev.max_ts)
        self._drop_cache(dev)
        dev.cache_start = offset

    def _drop_gaps_from(self, dev: DeviceLog, offset: int) -> None:
        """A truncation to ``offset`` gives the offsets from there to new records (a replica
        fetching them again from its leader): quarantine gaps there named records that are
        gone, and left in place they would hide the new ones from every reader (review5)."""
        kept = [(a, min(b, offset)) for a, b in dev.gaps or () if a < offset]
        dev.gaps = kept or None
        stored = _q.load_gaps(self.directory)
        if kept:
            stored[dev.key] = kept
        else:
            stored.pop(dev.key, None)
        try:
            _q.save_gaps(self.directory, stored)
        except OSError as err:
            log.error("commitlog %s: gaps.json not rewritten after truncating %r to %d (%s): "
                      "after a restart those offsets are reported lost and fetched again",
                      self.directory, dev.key, offset, err)

    def _truncate_state(self, dev: DeviceLog, offset: int, boundary: int) -> None:
        j = bisect.bisect_left(dev.idx_off, offset)
        if j < len(dev.idx_cum):
            dev.total = dev.idx_cum[j]
        dev.trim_index_from(offset)
        if dev.markers is None:
            dev.markers = []
        dev.markers.append((boundary, offset))
        dev.mk = None
        _ep.truncate_from(dev.epochs, offset)
        if dev.replicated_hw > offset:
            dev.replicated_hw = offset
        dev.next = dev.durable_end = offset
        dev.since_idx = 0
        dev.seg_base = -1  # the next record gets an index entry past the marker
        if dev.start > offset:
            dev.start = offset

    # ------------------------------------------------------------------ replication
    # Storage primitives for replicas (README.md, "Replication primitives"): two ends per
    # device log, leader epochs, follower append, the replica read path, per-device
    # commit waiters. Kafka's replica manager is the precedent for each (KIP-101/279).

    def durable_end(self, key: str) -> int:
        """One past the last record durable on this node (``high_watermark <= durable_end
        <= log_end``). Followers fetch up to it; readers stop at :meth:`high_watermark`,
        which is never above it; :meth:`log_end` also counts appends not yet durable."""
        dev = self._devices.get(key)
        return 0 if dev is None else dev.durable_end

    def set_high_watermark(self, key: str, hw: int | None) -> None:
        """Set the replicated high-water mark of ``key`` (committed cluster-wide: readers
        see offsets below it); ``None`` returns the device to the single-node rule (the
        high-water mark is the durable end). Must not exceed the durable end here (a
        follower takes ``min(leader's hw, its durable end)``, as Kafka does). Wakes the
        device's commit waiters it satisfies. Kept in the checkpoint; after a crash it may
        come back lower (re-learned from the leader), never above the durable end."""
        dev = self._devices.get(key)
        if dev is None:
            if not hw:
                return
            raise ValueError(f"high-water mark {hw} of {key!r} beyond its durable end 0")
        if hw is not None and not 0 <= hw <= dev.durable_end:
            raise ValueError(f"high-water mark {hw} of {key!r} outside "
                             f"[0, durable end {dev.durable_end}]")
        dev.replicated_hw = -1 if hw is None else hw
        if self._waiters.count:
            self._wake([dev])

    def when_high_watermark(self, key: str, target: int,
                            callback: WaiterCallback) -> tuple[str, int, int] | None:
        """Call ``callback(None)`` once the high-water mark of ``key`` is >= ``target``
        (acks=all of the record at offset N: target N + 1), or ``callback(exc)`` if the
        records it waits for are truncated or rolled back. Already satisfied: called now,
        returns None; else returns a handle for :meth:`cancel_high_watermark_wait`."""
        if self.high_watermark(key) >= target:
            call_all([callback], None)
            return None
        return self._waiters.add(key, target, callback)

    def cancel_high_watermark_wait(self, handle: tuple[str, int, int] | None) -> bool:
        """Forget a waiter (a long poll that timed out); False if it already ran."""
        return handle is not None and self._waiters.cancel(handle)

    def fail_high_watermark_waiters(self, key: str, exc: BaseException) -> int:
        """Fail every commit waiter of ``key`` still waiting (``callback(exc)``): a leader
        that cannot move the mark in time (the ISR below ``min_insync_replicas``, followers
        unreachable) refuses the acks instead of leaving them hanging. Their records stay in
        the log and may become visible later (at least once, as with Kafka's
        NOT_ENOUGH_REPLICAS_AFTER_APPEND). Returns how many were failed. A ``Watch`` is no
        ack and keeps waiting (commitlog/waiters.py)."""
        dev = self._devices.get(key)
        if dev is None or not self._waiters.count or key not in self._waiters.by_key:
            return 0
        gone = self._waiters.take_acks_after(key, dev.high_watermark)
        call_all(gone, exc)
        return len(gone)

    @property
    def device_count(self) -> int:
        """Keys with a log (devices are never removed: the count only grows)."""
        return len(self._devices)

    @property
    def high_watermark_waiters(self) -> int:
        """Registered per-device commit waiters (for metrics and tests)."""
        return self._waiters.count

    def _wake(self, devs: list[DeviceLog]) -> None:
        by_key = self._waiters.by_key
        for dev in devs:
            if dev.key in by_key:
                call_all(self._waiters.take_ready(dev.key, dev.high_watermark),
                         None)

    def _fail_waiters(self, dev: DeviceLog, end: int, old_end: int, exc: BaseException) -> None:
        if self._waiters.count and dev.key in self._waiters.by_key:
            call_all(self._waiters.take_between(dev.key, end, old_end), exc)

    def epochs(self, key: str) -> list[tuple[int, int]]:
        """The leader epoch table of ``key``: ``[(epoch, start offset)]``, oldest first, from
        the log start (epochs that ended before it are left out, and the one it falls in
        starts there: Kafka's truncateFromStart, ``epochs.from_start``)."""
        dev = self._devices.get(key)
        if dev is None or not dev.epochs:
            return []
        return [(e[0], e[1]) for e in _ep.from_start(dev.epochs, dev.start)]

    def latest_epoch(self, key: str) -> int:
        """The latest leader epoch of ``key``; -1 if it never had one."""
        dev = self._devices.get(key)
        return _ep.latest_epoch(dev.epochs if dev is not None else None)

    def end_offset_for_epoch(self, key: str, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch for one device log, answered by the leader to a
        returning replica whose latest epoch is ``epoch``: ``(E', end)`` with E' the
        largest epoch <= ``epoch`` here and ``end`` where it ended (the start of the next
        epoch, or the durable end). The replica truncates to ``min(end, its durable end)``
        (and repeats with E' if E' < its epoch: KIP-279). ``(-1, -1)``: no such epoch."""
        dev = self._devices.get(key)
        if dev is None:
            return (_ep.UNDEFINED, _ep.UNDEFINED)
        return _ep.end_offset_for(dev.epochs, epoch, dev.durable_end)

    def start_epoch(self, key: str, epoch: int, timestamp_us: int | None = None) -> bool:
        """A leader takes over ``key``'s log at ``epoch``: write an epoch-start record at
        the log end (durable with the next sync, like an append). False if the log's
        latest epoch already is ``epoch``. Raises StaleEpochError for an older
        epoch and LogStoreError while the key has appends not yet committed."""
        if self._broken is not None:
            raise LogWriteError(getattr(self._broken, "errno", None),
                                f"commit log is failing: {self._broken}") from self._broken
        dev = self._devices.get(key)
        if dev is None:
            dev = self._devices[key] = DeviceLog(key)
        if dev.next != dev.durable_end or dev.raw is not None:
            raise LogStoreError(f"{key!r} has uncommitted appends; commit before an epoch")
        if epoch == _ep.latest_epoch(dev.epochs) or not _ep.check_new_epoch(
                dev.epochs, epoch, dev.next):
            return False  # already leading at this epoch
        ts = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        if dev.epochs is None:
            dev.epochs = []
        _ep.assign(dev.epochs, (epoch, dev.next, ts, -1))
        pend = dev.pend
        if pend is None:
            pend = dev.pend = []
            self._pend_devs.append(dev)
        pend.append(_new_record(Record, (dev.next, ts, key, "", 0, (), _ep.epoch_payload(epoch))))
        dev.n_ctl += 1
        self._pend_n += 1
        self._pend_bound += HEADER_SIZE + len(dev.kb) + _ep.EPOCH_PAYLOAD.size
        return True

    @staticmethod
    def _place_epoch(dev: DeviceLog, rec: Record, pos: int) -> None:
        """At flush: give the pending epoch entry of ``rec`` its store position."""
        table = dev.epochs or ()
        epoch = _ep.parse_epoch_payload(rec[6])
        for i in range(len(table) - 1, -1, -1):
            e = table[i]
            if e[3] < 0 and e[0] == epoch and e[1] == rec[0]:
                table[i] = (e[0], e[1], e[2], pos)
                return

    def append_follower(self, key: str, data: bytes, leader_epoch: int | None = None) -> int:
        """Append records a leader sent (its :meth:`read_replica` bytes) at the offsets it
        gave them; return the new log end (not durable until the next sync/commit, exactly
        like :meth:`append`: same group commit, same fsync).

        Verified before anything changes: every record framed and CRC-checked, of this
        key, the first at the local log end and the rest contiguous, epoch records not
        older than the log's latest epoch (nor ``leader_epoch``, the epoch of the leader
        that sent them, if given: a fenced leader is refused with StaleEpochError). The
        bytes are written as received, never re-encoded, so replicas hold identical
        records. A repeated epoch-start at the head of the batch (the follower already has
        it) is dropped. An empty log may start at the leader's first offset (retention
        on the leader). Raises CorruptRecordError / ValueError / LogStoreError."""
        if self._broken is not None:
            raise LogWriteError(getattr(self._broken, "errno", None),
                                f"commit log is failing: {self._broken}") from self._broken
        dev = self._devices.get(key)
        kb = dev.kb if dev is not None else key.encode()
        if dev is not None and dev.pend is not None and len(dev.pend) > dev.n_ctl:
            raise LogStoreError(f"{key!r} has leader appends pending; a log takes one kind")
        last = _ep.latest_epoch(dev.epochs if dev is not None else None)
        if leader_epoch is not None and leader_epoch < last:
            raise _ep.StaleEpochError(
                f"leader epoch {leader_epoch} of {key!r} is older than the log's epoch {last}")
        if not data:
            return dev.next if dev is not None else 0
        if dev is not None:
            nxt = dev.next
        else:  # a new log starts where the leader's does (retention may have moved it)
            nxt = HEADER.unpack_from(data, 0)[5] if len(data) >= HEADER_SIZE else 0
            nxt = max(nxt, 0)
        recs, posarr, eps, skip = _parse_follower_batch(
            data, kb, key, nxt, list(dev.epochs) if dev is not None and dev.epochs else [])
        if skip:
            data = data[skip:]
            if not data:
                return nxt
        if dev is None:
            dev = self._devices[key] = DeviceLog(key, nxt)
        for _rel, epoch, start, ts in eps:
            if dev.epochs is None:
                dev.epochs = []
            _ep.assign(dev.epochs, (epoch, start, ts, -1))
        n = len(recs)
        dev.next = nxt + n
        pend = dev.pend
        if pend is None:
            dev.pend = []
            self._pend_devs.append(dev)
        if dev.raw is None:
            dev.raw = []
        dev.raw.append((data, posarr, recs, eps))
        self._pend_n += n + len(eps)
        self._pend_bound += len(data)
        if self._cache_on and n:
            klen = len(dev.kb)
            trim = _rec.c_trim_count
            size = trim(recs, klen, 1 << 62)[1] if trim is not None else sum(
                _cache_size(r, klen) for r in recs)
            if dev.cache_start + len(dev.cache) == nxt:
                dev.cache.extend(recs)
                dev.cache_bytes += size
                self._cache_total += size
            else:
                self._drop_cache(dev)
                dev.cache_start = nxt + n
        return dev.next

    def _flush_raw(self, dev: DeviceLog, buf: bytearray, p: int, base_pos: int, segb: int,
                   track: bool, interval: int) -> tuple[int, int]:
        """Lay out a device's follower appends at batch position ``p`` (bytes copied as
        received) and index them as ``flush`` indexes encoded records."""
        raws = dev.raw
        dev.raw = None
        rel0 = base_pos - segb
        since = dev.since_idx
        total = dev.total
        dmax = MIN_TS
        if dev.seg_base != segb:
            since = interval
            dev.seg_base = segb
        ap = None
        if track:
            ap = dev.apos
            if dev.apos_base != segb:
                ap = dev.apos = array("q")
                dev.apos_base = segb
                self._apos_devs.append(dev)
        idx_off, idx_pos, idx_ts, idx_cum = dev.idx_off, dev.idx_pos, dev.idx_ts, dev.idx_cum
        for data, posarr, recs, eps in raws or ():
            buf[p : p + len(data)] = data
            for rel, epoch, start, _ts in eps:
                table = dev.epochs or ()
                for i in range(len(table) - 1, -1, -1):
                    e = table[i]
                    if e[3] < 0 and e[0] == epoch and e[1] == start:
                        table[i] = (e[0], e[1], e[2], base_pos + p + rel)
                        break
            if since + len(data) < interval:  # no index entry due in this chunk
                n = sum(map(LEN_MASK.__and__, posarr))
                since += n
                total += n
            else:
                rm = dev.max_ts if dev.max_ts > dmax else dmax  # max ts of earlier records
                for k, v in enumerate(posarr):
                    r = recs[k]
                    if since >= interval:
                        idx_off.append(r[0])
                        idx_pos.append(base_pos + p + (v >> 32))
                        idx_ts.append(rm)
                        idx_cum.append(total)
                        since = 0
                    n = v & LEN_MASK
                    since += n
                    total += n
                    if r[1] > rm:
                        rm = r[1]
            if recs:
                m = max(map(_second, recs))
                if m > dmax:
                    dmax = m
            if ap is not None:
                shift = (rel0 + p) << 32
                ap.extend([v + shift for v in posarr])
            p += len(data)
        dev.since_idx = since
        dev.total = total
        if dmax > dev.max_ts:
            dev.max_ts = dmax
        return p, dmax

    def read_durable(self, key: str, offset: int, max_records: int = 1000,
                     max_bytes: int = 1 << 20) -> list[Record]:
        """Records of ``key`` from ``offset`` up to the **durable end**: what this node has
        accepted, possibly above the high-water mark (not yet committed cluster-wide). Only
        for a leader checking what it already holds before it appends again (a publisher's
        resend: broker/pubdedupe.py), never for readers, which stop at the high-water mark
        (:meth:`read`). Empty for an unknown key; raises OffsetOutOfRangeError outside
        ``[start, durable end]``."""
        dev = self._devices.get(key)
        if dev is None:
            return []
        return self._read(dev, offset, dev.durable_end, max_records, max_bytes)

    def read_replica(self, key: str, offset: int, max_records: int = 1000,
                     max_bytes: int = 1 << 20, last_epoch: int = -1) -> tuple[bytes, int]:
        """The follower-fetch read path: records of ``key`` from ``offset`` up to the
        **durable end** (durable here, possibly above the high-water mark), with the
        epoch-start records of that range in place, as ``(bytes, next_offset)`` in the
        record framing, ready for :meth:`append_follower` on a replica. ``last_epoch`` is
        the follower's latest epoch (Kafka's LastFetchedEpoch): epoch starts it already
        has are left out, so a caught-up follower gets an empty answer. Served from the
        tail cache while it holds the range, else from disk (same path as :meth:`read`).
        Raises OffsetOutOfRangeError outside ``[start, durable end]``."""
        dev = self._devices.get(key)
        if dev is None:
            if offset == 0:
                return b"", 0
            raise OffsetOutOfRangeError(key, offset, 0, 0)
        end = dev.durable_end
        recs = self._read(dev, offset, end, max_records, max_bytes)
        nxt = recs[-1][0] + 1 if recs else offset
        committed = self._committed_pos
        table = dev.epochs or ()
        if offset == dev.start and table and table[0][1] < offset:
            # Read from the log start that retention moved into an epoch: that epoch starts
            # here for the reader (epochs.from_start), so a follower restarting its log at
            # this start (reset_start) gets the epoch its records belong to, as Kafka's
            # truncated-from-start epoch cache would give it.
            table = _ep.from_start(table, offset)
        eps = [e for e in table if 0 <= e[3] < committed and e[0] > last_epoch
               and offset <= e[1] <= nxt and (e[1] < nxt or nxt == end)]
        kb = dev.kb
        if not eps:
            return _encode_records(kb, recs), nxt
        parts: list[bytes] = []
        i = 0
        for epoch, start, ts, _pos in eps:
            j = start - offset
            if j > i:
                parts.append(_encode_records(kb, recs[i:j]))
                i = j
            parts.append(_ep.encode_epoch_record(kb, epoch, start, ts))
        parts.append(_encode_records(kb, recs[i:]))
        return b"".join(parts), nxt

    def _rollback_replica_state(self, cause: BaseException | None) -> None:
        """Part of :meth:`rollback`: forget follower appends and epoch entries that were
        not committed, and fail commit waiters whose records are being discarded."""
        committed = self._committed_pos
        for dev in self._pend_devs:
            dev.raw = None
        exc = cause if cause is not None else LogWriteError(
            errno.EIO, "the write holding these records failed; rolled back")
        for dev in self._devices.values():
            if dev.epochs and not 0 <= dev.epochs[-1][3] < committed:
                dev.epochs = [e for e in dev.epochs if 0 <= e[3] < committed] or None
            if dev.next != dev.durable_end:
                self._fail_waiters(dev, dev.durable_end, dev.next, exc)

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now_us: int) -> int:
        """Enforce retention; return the number of segment files deleted.

        Byte limit: each device's start advances to the first index entry leaving at most
        ``retention_bytes_per_device`` bytes. Age: the oldest sealed segments whose newest
        record is older than ``retention_ms`` are dropped, moving every device's start
        past them. A sealed, committed segment no device still needs is deleted.

        Neither moves a start past the device's **high-water mark** (Kafka: the log start
        offset never passes the HW; retention deletes only below it): records not committed
        yet (a follower has not fetched them) must not vanish before any reader or replica
        saw them, and a follower below the start would restart there (``reset_start``) and
        let the mark jump over them. A log whose mark is held keeps those segments until it
        moves (counted in ``stats.retention_held_by_hwm``). On a single node the mark is the
        durable end: nothing changes there."""
        s = self.settings
        if s.retention_bytes_per_device:
            limit = s.retention_bytes_per_device
            for dev in self._devices.values():
                if not dev.idx_cum or dev.c_total - dev.idx_cum[0] <= limit \
                        or dev.key.startswith(INTERNAL_PREFIX):
                    continue
                ndurable = bisect.bisect_left(dev.idx_off, dev.durable_end)
                want = min(bisect.bisect_left(dev.idx_cum, dev.c_total - limit, 0, ndurable),
                           ndurable - 1)
                j = min(want, bisect.bisect_left(dev.idx_off, dev.high_watermark) - 1)
                if j < want:
                    self.stats.retention_held_by_hwm += 1
                if j > 0:
                    self._set_start(dev, dev.idx_off[j], j)
        segs = self._segments
        cut = segs[0].base
        if s.retention_ms:
            horizon = now_us - s.retention_ms * 1000
            for seg in segs[:-1]:
                if seg.max_ts < horizon and seg.end <= self._committed_pos:
                    cut = seg.end
                else:
                    break
            if cut > segs[0].base:
                self._advance_devices_past(cut, below_hwm=True)
        min_live = self._committed_pos
        for dev in self._devices.values():
            if dev.idx_pos and dev.idx_pos[0] < min_live:
                min_live = dev.idx_pos[0]
        deleted = 0
        while len(segs) > 1 and segs[0].end <= min_live:
            seg = segs.pop(0)
            self._seg_bases.pop(0)
            self._close_read_fd(seg.base)
            self._drop_pidx(seg)
            try:
                os.unlink(seg.path)
            except FileNotFoundError:
                pass
            deleted += 1
            self.stats.retention_segments_deleted += 1
            self.stats.retention_bytes_deleted += seg.size
        self.stats.segments = len(segs)
        return deleted

    def _advance_devices_past(self, pos: int, below_hwm: bool = False) -> None:
        """Move every device's start to its first record at or after store ``pos``.
        Internal state logs keep theirs (their owner compacts them): the segments they
        still need stay until it moves their start (``advance_start``). ``below_hwm``
        (age retention): never past a device's high-water mark; its index entries from the
        mark on stay, and so do their segments (see :meth:`apply_retention`). Recovery
        passes False: the segments before ``pos`` are gone already."""
        for dev in self._devices.values():
            if dev.idx_pos and dev.idx_pos[0] < pos and not dev.key.startswith(INTERNAL_PREFIX):
                j = bisect.bisect_left(dev.idx_pos, pos)
                if below_hwm and (dev.idx_off[j] if j < len(dev.idx_pos)
                                  else dev.durable_end) > dev.high_watermark:
                    self.stats.retention_held_by_hwm += 1
                    self.advance_start(dev.key, dev.high_watermark)
                    continue
                if j < len(dev.idx_pos):
                    self._set_start(dev, dev.idx_off[j], j)
                else:
                    dev.drop_index_before(j)
                    self._set_start(dev, dev.durable_end, 0)

    def advance_start(self, key: str, offset: int) -> None:
        """Forget the records of ``key`` below ``offset`` (Kafka's DeleteRecords): reads
        below it fail as after retention, and the segments no log needs any more are
        deleted by the next retention pass. How a compacted state log drops what its
        latest snapshot supersedes. Never moves the start backwards or past the end."""
        dev = self._devices.get(key)
        if dev is None:
            return
        offset = min(offset, dev.durable_end)
        if offset <= dev.start:
            return
        # keep the index entry at or before ``offset``: reads from it start there
        j = bisect.bisect_right(dev.idx_off, offset) - 1
        self._set_start(dev, offset, max(j, 0))

    def _set_start(self, dev: DeviceLog, offset: int, drop_entries: int) -> None:
        dev.drop_index_before(drop_entries)
        dev.start = offset
        if dev.markers:
            first = dev.idx_pos[0] if dev.idx_pos else self._flushed_pos
            dev.markers = [m for m in dev.markers if m[0] > first] or None
            dev.mk = None
        k = offset - dev.cache_start
        if k > 0:
            if k >= len(dev.cache):
                self._drop_cache(dev)
                dev.cache_start = offset
            else:
                klen = len(dev.kb)
                freed = sum(_cache_size(r, klen) for r in dev.cache[:k])
                del dev.cache[:k]
                dev.cache_start = offset
                dev.cache_bytes -= freed
                self._cache_total -= freed

    # ------------------------------------------------------------------ checkpoint / close

    def snapshot_checkpoint(self) -> bytes:
        """Serialize the committed index state (on the loop thread: it reads live state).
        Writing it (:meth:`write_checkpoint`) may happen on the fsync worker."""
        pos = self._committed_pos
        parts: list[bytes] = [CKPT_HEAD.pack(CKPT_MAGIC, CKPT_VERSION, pos, 0)]
        nseg = 0
        for seg in self._segments:
            if seg.base < pos or seg.base == self._segments[0].base:
                parts.append(CKPT_SEG.pack(seg.base, seg.max_ts))
                nseg += 1
        parts[0] = CKPT_HEAD.pack(CKPT_MAGIC, CKPT_VERSION, pos, nseg)
        # Device positions of the segment holding the checkpoint position, if it is the
        # active one (else recovery rebuilds them with a header walk up to ``pos``).
        active = self._segments[-1]
        abase = active.base if active.base <= pos and self._apos_ok else -1
        acut = (pos - active.base) << 32
        parts.append(CKPT_ACTIVE.pack(abase))
        parts.append(struct.pack("<I", len(self._devices)))
        pack = CKPT_DEV3.pack
        for dev in self._devices.values():
            n = bisect.bisect_left(dev.idx_off, dev.durable_end)
            marks = dev.markers or ()
            ap = dev.apos if abase >= 0 and dev.apos_base == abase else None
            npos = bisect.bisect_left(ap, acut) if ap else 0
            eps = [e for e in dev.epochs if 0 <= e[3] < pos] if dev.epochs else ()
            parts.append(pack(len(dev.kb), dev.start, dev.durable_end, dev.c_total, dev.c_since,
                              dev.c_seg, dev.c_max, min(dev.replicated_hw, dev.durable_end), n,
                              len(marks), npos, len(eps)))
            parts.append(dev.kb)
            if n == len(dev.idx_off):
                parts += (dev.idx_off.tobytes(), dev.idx_pos.tobytes(), dev.idx_ts.tobytes(),
                          dev.idx_cum.tobytes())
            else:
                parts += (dev.idx_off[:n].tobytes(), dev.idx_pos[:n].tobytes(),
                          dev.idx_ts[:n].tobytes(), dev.idx_cum[:n].tobytes())
            for m in marks:
                parts.append(struct.pack("<qq", m[0], m[1]))
            if npos:
                parts.append(ap[:npos].tobytes())
            for e in eps:
                parts.append(CKPT_EPOCH.pack(*e))
        body = b"".join(parts)
        return body + zlib.crc32(body).to_bytes(4, "little")

    def write_checkpoint(self, data: bytes) -> None:
        """Atomically replace index.ckpt (tmp file, fsync, rename, fsync dir)."""
        path = os.path.join(self.directory, CHECKPOINT_NAME)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(data)
            while mv:  # a short write is not a checkpoint (a full disk takes part of it)
                mv = mv[os.write(fd, mv):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)  # a full disk must not keep a half checkpoint's space
            except OSError:
                pass
            raise
        os.close(fd)
        os.replace(tmp, path)
        self._fsync_dir()
        self.stats.checkpoints += 1

    def checkpoint(self) -> None:
        """Snapshot and write the index checkpoint now (synchronous)."""
        self.write_checkpoint(self.snapshot_checkpoint())

    def close(self) -> None:
        """Flush, fsync, commit, checkpoint and release every file."""
        if self._closed:
            return
        try:
            if self._broken is None:
                self.flush_sync_commit()
                self.checkpoint()
        finally:
            self._closed = True
            self._release_fds()

    def _release_fds(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        for fd in [self._wfd, *self._retired]:
            if fd >= 0:
                os.close(fd)
        self._wfd = -1
        self._retired = []
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def broken(self) -> BaseException | None:
        """The error that makes the store refuse appends (a write failed and the rollback
        has not yet succeeded), or None."""
        return self._broken

    @property
    def committed_position(self) -> int:
        """Global store position that is durable and visible."""
        return self._committed_pos

    @property
    def flushed_position(self) -> int:
        """Global store position written (maybe not yet durable)."""
        return self._flushed_pos

    @property
    def segments(self) -> list[Segment]:
        """The segment files, oldest first (read-only view for tools and tests)."""
        return list(self._segments)

    @property
    def open_fd_count(self) -> int:
        """File descriptors this store holds now (bounded, independent of device count)."""
        return (1 if self._wfd >= 0 else 0) + len(self._retired) + len(self._read_fds) + (
            1 if self._lock_fd >= 0 else 0)


# The compiled plain path of ``append`` (commitlog._speedups, see record.py): a known
# device, a str topic, a bytes payload, no headers, a healthy store. Everything else it
# hands, untouched, to the Python method above, which stays the reference.
_py_append = LogStore.append
if _rec.c_make_append is not None:
    LogStore.append = _rec.c_make_append(_py_append)
