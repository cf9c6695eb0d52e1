"""The mesh link protocol, sans-I/O (as ``broker/protocol`` and h11): bytes in, frames out.

A frame is ``u32 length | u8 type | body`` (length counts type and body), so a reader never
scans for delimiters and a 64 KiB read holds many frames (NATS batches by buffering, VerneMQ by
one ``vmq-send`` frame holding many sub-frames: we do both, one ENTRIES frame per link per loop
tick carrying every entry of the tick).

Frames, in the order a link uses them (the handshake's are encoded in cluster/handshake.py):
- HELLO (dialer): lowest version, cluster name, router id, nonce, incarnation[, highest].
- CHALLENGE (acceptor): the same fields of the acceptor, plus its HMAC proof over both nonces.
- AUTH (dialer): its HMAC proof, and the last entry seq it processed from the acceptor's
  incarnation (so the acceptor resends only what is missing).
- READY (acceptor): the last seq it processed from the dialer's incarnation.
- REFUSE (either side): why, in words, then the socket closes.
- ENTRIES: a batch of entries (below), each with the sender's per-link sequence number.
- ACK: the receiver's cumulative processed seq (entries ≤ it can be forgotten by the sender); it is
  also the send window's credit (the sender keeps at most ``link_window`` entries unacknowledged).
- ROUTES: route changes (full sync on every connect, deltas after): add/remove a filter, with
  its shared-subscription group if any.
- RESULTS: for each APPEND, once its fsync ran (or the write failed): ok and the offset, or
  why not, so the publisher's router acks (with the offset, if the client asked) or refuses.
- CLAIM / CLAIMED: a client id connected at the sender; a router holding its session closes
  the old connection and hands the session over (or ends it, for a clean start).
- ADMIN_REQUEST / ADMIN_RESPONSE: an admin API request about a device log, relayed to the
  log's owner (the fetch API answers for any device on any router).
- PING / PONG: liveness and RTT.
- FETCH / RECORDS: "read device D from offset N" and the stored record bytes, unchanged (an
  offset replay at a router that does not own the log reads it this way; the follower fetch of
  the replication issue uses the same pair).
- RESOLVE / RESOLVED: "where does a subscription asking for offset spec S of device D start"
  (earliest, latest, N, @unix_ms, with its offset-reset), answered by the log's owner: the
  replaying router's SUBACK waits for it, so a bad offset is refused as on one node.

Versions (``VERSION``, ``MIN_VERSION``; cluster/handshake.py negotiates): a link speaks the
lowest common version of its two routers, each capped by ``cluster.protocol_version`` (Kafka's
``inter.broker.protocol.version``: roll the binaries with the cap at the old version, then raise
it), so a cluster is upgraded one node at a time. The bytes that make that work:
- A HELLO's leading ``version`` field is the *lowest* version the sender speaks (2), and when it
  speaks more, one u16 after the incarnation says the *highest*. A build of version 2 reads a
  HELLO up to the incarnation and ignores what follows (its ``decode_hello`` hands the rest to
  the caller as a CHALLENGE's proof, and its acceptor drops it), then checks ``version == 2``:
  so it links with any router whose range includes 2, and a router capped at 2 sends exactly
  the version-2 HELLO (no trailing field). A HELLO may grow further at its end: readers ignore
  what follows the fields they know.
- The CHALLENGE's ``version`` field is the version the acceptor chose: the highest both speak.
  It is 2, byte for byte a version-2 CHALLENGE, whenever the dialer sent no highest version
  (a version-2 build), so such a dialer never sees a field it does not know. From version 3 the
  HMAC proofs of both sides also cover the dialer's range and the choice: a middlebox without the
  secret cannot talk two routers down to an older version. (Down to 2 it still can, by removing
  the HELLO's trailing field: version 2 proofs cover no version; TLS 1.3's answer is a marker
  in the server random, left for when a version below 3 is no longer spoken.)
- After the handshake the link holds the negotiated version (``MeshLink.version``) and every
  encoder and decoder whose bytes depend on it takes it: a peer is never sent a frame kind, an
  entry kind or a field its version lacks. Version 2 frames are unchanged.
- Version 3 (epochs, for replication: issue 24): an APPEND entry's head carries the leader epoch
  the sender believes (placement.leader_of); the receiver refuses, with a RESULT of status
  ``RESULT_FENCED``, an APPEND for a log it does not lead or at an epoch that is not the log's
  current one (Kafka's FENCED_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER). FETCH carries the replica
  id (the asking router) and its last fetched epoch (-1: none, a reader); RECORDS carries the
  leader's log end, high-water mark and leader epoch, and, when the last fetched epoch shows the
  asker's log diverged, the diverging epoch and its end offset instead of records (Kafka >= 2.7,
  KIP-595's fetch-side truncation).
- Version 4 (delivery fencing): every entry head carries an epoch (16 bytes), a DELIVER's the
  leader epoch its sender routed the record at (0: not logged, or not known). A router that
  knows a newer epoch of that log drops the DELIVER: it comes from a deposed leader (frozen,
  or cut off, with entries queued), and what it carried is read from the log instead
  (cluster/deliverfence.py). Kafka's consumers fetch with the leader epoch for the same
  reason (KIP-320: a deposed leader's answer is refused, not consumed).

An entry is one publish on its way: to be *delivered* by the peer's local subscribers
(``DELIVER``), to be *appended* to a device log the peer owns (``APPEND``; the peer acks it only
once its fsync covered it), or a retained-message change (``RETAIN``). The entry body is encoded
once per message and shared by every link it goes to; only the 12-byte head differs (the seq, and
at version 3 an APPEND's 4-byte epoch: an APPEND goes to one link, its log's leader).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import NamedTuple

from broker.message import Message
from broker.protocol.packets import PacketType
from broker.protocol.properties import decode_properties, encode_properties
from cluster.settings import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION

# The mesh protocol. 2: SHARE_ON entries and the ':src' record header (a build of 1 acks a
# SHARE_ON and applies nothing, and shows ':src' to MQTT 5 subscribers, so 1 is refused).
# 3: leader epochs in APPEND, FETCH and RECORDS (above). 4: every entry head carries the epoch
# (a DELIVER's: the one it was routed at, for the receiver's fence, cluster/deliverfence.py).
# Peers negotiate the highest version both speak (cluster/handshake.py); with no common one
# they refuse each other, naming both.
VERSION = 4
MIN_VERSION = 2
V_EPOCHS = 3  # the first version with epochs on the wire
V_DELIVER_EPOCHS = 4  # the first version whose every entry head carries one (see above)
assert (MIN_VERSION, VERSION) == (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)  # the config's range
MAX_FRAME = 64 * 1024 * 1024  # a frame claiming more is a broken or hostile peer

# frame types
HELLO = 1
CHALLENGE = 2
AUTH = 3
READY = 4
REFUSE = 5
ENTRIES = 10
ACK = 11
ROUTES = 12
PING = 13
PONG = 14
FETCH = 15
RECORDS = 16
RESULTS = 17
CLAIM = 18
CLAIMED = 19
ADMIN_REQUEST = 20
ADMIN_RESPONSE = 21
RESOLVE = 22
RESOLVED = 23

FRAME_NAMES = {HELLO: "hello", CHALLENGE: "challenge", AUTH: "auth", READY: "ready",
               REFUSE: "refuse", ENTRIES: "entries", ACK: "ack", ROUTES: "routes", PING: "ping",
               PONG: "pong", FETCH: "fetch", RECORDS: "records", RESULTS: "results",
               CLAIM: "claim", CLAIMED: "claimed", ADMIN_REQUEST: "admin_request",
               ADMIN_RESPONSE: "admin_response", RESOLVE: "resolve", RESOLVED: "resolved"}

# entry kinds
DELIVER = 0
APPEND = 1
RETAIN = 2
RETAIN_SYNC = 3  # on link up: set only where the receiver has no retained message there
SHARE = 4  # one member of the receiver's $share/<group>/<filter> gets it (the group rides along)
# a SHARE handed on by a router that had no connected member left for it (its member moved or
# ended while the share travelled): the receiver delivers it and never hands it on again, so a
# share makes at most two hops however stale the routes are
SHARE_ON = 5

_F_RETAIN = 0x04
_F_PROPS = 0x08
_F_ORIGIN = 0x10
_F_DEVICE = 0x20
_F_EXPIRY = 0x40
_F_GROUP = 0x80
# On an APPEND (which has no group) the same bit carries the client's publisher identity for
# publisher dedupe (broker/pubdedupe.py), in the group's shape (two strings) so that a router
# of the previous build reads it as a group and ignores it (it then stores resends again, as it
# did): the ``:pub`` value as latin-1 text, and "1" when the publish may be a resend.
# On a DELIVER (which has no group either) it marks a record routed again (``AGAIN``): one a
# restarted router found stored by its previous run, which may have routed it before it died
# (broker/delivery.py ``route_again``: no QoS 0 copy). A router of an earlier build reads it
# as a group, ignores it and routes the record as any other (the duplicate this prevents).
AGAIN = ("", "again")


def publisher_fields(publisher: bytes, maybe_stored: bool) -> tuple[str, str]:
    """An APPEND's publisher identity as the two strings of the ``_F_GROUP`` field."""
    return publisher.decode("latin-1"), "1" if maybe_stored else ""


def publisher_of(group: tuple[str, str]) -> tuple[bytes, bool]:
    """(``:pub`` value, may be a resend) from an APPEND's ``_F_GROUP`` field."""
    return group[0].encode("latin-1"), group[1] == "1"


_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_ENTRY_HEAD = struct.Struct(">QBBH")  # seq, kind, flags, topic length
_DEVICE_TAIL = struct.Struct(">q")
_PING = struct.Struct(">Q")
_FETCH = struct.Struct(">QqI")  # request id, offset, max records
_EPOCH = struct.Struct(">I")  # a leader epoch (Kafka's is an int32 too)
_I32 = struct.Struct(">i")


class FrameError(Exception):
    """The peer sent bytes that are not this protocol: the link closes (and reconnects)."""


def frame(ftype: int, body: bytes = b"") -> bytes:
    return _HEAD.pack(len(body) + 1, ftype) + body


class FrameReader:
    """Incremental: feed whatever the socket gave, get back whole (type, body) frames."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length, ftype = _HEAD.unpack_from(buf, pos)
            if length < 1 or length > self._max:
                raise FrameError(f"frame length {length} out of range")
            end = pos + 4 + length
            if end > n:
                break
            out.append((ftype, bytes(buf[pos + 5:end])))
            pos = end
        if pos:
            del buf[:pos]
        return out


# -- strings ---------------------------------------------------------------------------------
def _s(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _read_s(body: bytes, p: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(body, p)
    p += 2
    if p + n > len(body):
        raise FrameError("string runs past the frame")
    return body[p:p + n].decode(), p + n


# -- handshake (its HELLO/CHALLENGE/AUTH codecs are in cluster/handshake.py) ------------------
def encode_seq(ftype: int, seq: int) -> bytes:
    return frame(ftype, _U64.pack(seq))


def decode_seq(body: bytes) -> int:
    if len(body) != 8:
        raise FrameError("bad seq frame")
    return _U64.unpack(body)[0]


def encode_refuse(why: str) -> bytes:
    return frame(REFUSE, why.encode()[:4000])


# -- entries ---------------------------------------------------------------------------------
class Entry(NamedTuple):
    """One decoded entry; the receiver turns it into a broker Message. A tuple (it was a
    slots dataclass): the C decoder (``cluster/_speedups.c``) builds it without running any
    Python, and its fields read as fast; nothing changes an entry once decoded."""

    seq: int
    kind: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict | None
    origin: str | None
    device: str | None
    offset: int
    expiry: int | None  # seconds left of the v5 message expiry, None = never
    group: tuple[str, str] | None = None  # SHARE: (share name, filter)
    epoch: int = -1  # APPEND at version 3: the leader epoch the sender believes (-1: not said)


# The compiled entry codec (cluster/_speedups.c, optional like broker/protocol's): the plain
# case of decoding an ENTRIES frame and of encoding an entry body without properties; the
# Python below stays the reference (and raises every FrameError). CLUSTER_PURE_PYTHON=1, or a
# failed build, runs Python only.
_speedups = None
if os.environ.get("CLUSTER_PURE_PYTHON", "").strip() in ("", "0"):
    try:
        from cluster import _speedups
    except ImportError:  # not built (optional extension): pure Python
        _speedups = None
if _speedups is not None and not all(
        hasattr(_speedups, name) for name in ("decode_run", "entry_body", "decode_plain",
                                              "encode_run", "entry_items", "plain_run_end")):
    # Built from an older _speedups.c (a checkout updated without ``pip install -e .``): set
    # aside whole, as broker/protocol/codec.py does, so the router runs the Python codec
    # instead of dying here with an AttributeError
    _speedups = None
if _speedups is not None:
    _speedups.setup(Entry)
    # decode_plain's messages start as copies of one made by Message's own __init__
    _speedups.setup_message(Message, Message("", b"", 0, False, None, None, None))
SPEEDUPS: bool = _speedups is not None
"""True when the compiled entry codec is in use."""
# Looked up at call time, so a test can switch them off with monkeypatch.
c_decode_run = _speedups.decode_run if _speedups else None
c_entry_body = _speedups.entry_body if _speedups else None
# decode_plain(body, pos, count, epochs, received, out) -> (pos, received): the plain fresh
# DELIVERs from ``pos`` straight to broker Messages (the receiving router's fast path,
# MeshLink.on_frame); None without the compiled codec (then every entry is an Entry)
c_decode_plain = _speedups.decode_plain if _speedups else None
# encode_run(seq, kind, items, with_epoch) -> bytes: a run of plain DELIVERs queued on one link
# (cluster/sendrun.py, whose encode_run is the reference)
c_encode_run = _speedups.encode_run if _speedups else None
# entry_items(topic, payloads, qos, origin, epoch) -> (items, body bytes) | None: a
# publisher's run of plain payloads as a link Run's items (Mesh.forward_run); and
# plain_run_end(msgs, i) -> j: where a run of plain QoS 0 messages ends (Mesh.on_deliveries).
# Python references in cluster/sendrun.py, used without the compiled codec.
c_entry_items = _speedups.entry_items if _speedups else None
c_plain_run_end = _speedups.plain_run_end if _speedups else None


def epochs_mode(version: int) -> int:
    """The compiled decoders' ``epochs`` argument: 0 no epoch in any entry head (version 2),
    1 in an APPEND's (version 3), 2 in every entry's (version 4)."""
    return 2 if version >= V_DELIVER_EPOCHS else 1 if version >= V_EPOCHS else 0


def entry_count(body: bytes) -> int:
    """The entry count at the start of an ENTRIES frame's body."""
    try:
        return _U32.unpack_from(body, 0)[0]
    except struct.error as err:
        raise FrameError(f"bad entries frame: {err}") from None


def entry_body(kind: int, topic: str, payload: bytes, qos: int, retain: bool,
               properties: dict | None, origin: str | None, device: str | None, offset: int,
               expiry: int | None, group: tuple[str, str] | None = None
               ) -> tuple[int, int, bytes]:
    """(flags, topic length, the bytes after the entry head): encoded once per message."""
    flags = qos | (_F_RETAIN if retain else 0)
    raw_topic = topic.encode()
    parts = [raw_topic, _U32.pack(len(payload)), payload]
    if properties:
        flags |= _F_PROPS
        parts.append(encode_properties(properties))
    if origin is not None:
        flags |= _F_ORIGIN
        parts.append(_s(origin))
    if device is not None:
        flags |= _F_DEVICE
        parts.append(_s(device))
        parts.append(_DEVICE_TAIL.pack(offset))
    if expiry is not None:
        flags |= _F_EXPIRY
        parts.append(_U32.pack(expiry))
    if group is not None:
        flags |= _F_GROUP
        parts.append(_s(group[0]))
        parts.append(_s(group[1]))
    return flags, len(raw_topic), b"".join(parts)


def entry_bytes(seq: int, kind: int, flags: int, topic_len: int, body: bytes) -> bytes:
    return _ENTRY_HEAD.pack(seq, kind, flags, topic_len) + body


entry_head = _ENTRY_HEAD.pack  # (seq, kind, flags, topic length): 12 bytes before the body
# version 3, an APPEND: (seq, kind, flags, topic length, leader epoch): 16 bytes before the body
entry_head_epoch = struct.Struct(">QBBHI").pack


def encode_entries_parts(parts: list[bytes], count: int) -> bytes:
    """An ENTRIES frame from heads and bodies side by side: one join, no per-entry copy."""
    body_len = 4 + sum(map(len, parts))
    return b"".join((_HEAD.pack(body_len + 1, ENTRIES), _U32.pack(count), *parts))


def encode_entries(entries: list[bytes]) -> bytes:
    body = b"".join((_U32.pack(len(entries)), *entries))
    return _HEAD.pack(len(body) + 1, ENTRIES) + body


def decode_entries(body: bytes, version: int = MIN_VERSION) -> list[Entry]:
    """The entries of an ENTRIES frame, read as the link's negotiated ``version`` writes them
    (from 3 an APPEND's head carries its epoch, from 4 every entry's does)."""
    try:
        return _decode_entries(body, version >= V_EPOCHS, version >= V_DELIVER_EPOCHS)
    except (struct.error, UnicodeDecodeError, IndexError) as err:
        raise FrameError(f"bad entries frame: {err}") from None


def decode_entries_at(body: bytes, pos: int, count: int, version: int) -> list[Entry]:
    """The last ``count`` entries of an ENTRIES frame, from ``pos`` to its end (what follows
    the plain DELIVERs ``c_decode_plain`` took), as ``decode_entries`` reads them."""
    try:
        return _decode_entries(body, version >= V_EPOCHS, version >= V_DELIVER_EPOCHS,
                               pos, count)
    except (struct.error, UnicodeDecodeError, IndexError) as err:
        raise FrameError(f"bad entries frame: {err}") from None


def _decode_entries(body: bytes, epochs: bool, all_epochs: bool = False, start: int = 0,
                    rest: int = -1) -> list[Entry]:
    if rest < 0:  # the whole frame
        (count,) = _U32.unpack_from(body, 0)
        p = 4
    else:  # its last ``rest`` entries, from ``start``
        count, p = rest, start
    out: list[Entry] = []
    n = len(body)
    # the plain entries in C (cluster/_speedups.c); from the first other one on, Python
    if c_decode_run is not None and type(body) is bytes:
        p = c_decode_run(body, p, count, 2 if all_epochs else 1 if epochs else 0, out)
    for _ in range(count - len(out)):
        seq, kind, flags, tlen = _ENTRY_HEAD.unpack_from(body, p)
        p += _ENTRY_HEAD.size
        epoch = -1
        if all_epochs or (epochs and kind == APPEND):
            (epoch,) = _EPOCH.unpack_from(body, p)
            p += 4
        topic = body[p:p + tlen].decode()
        p += tlen
        (plen,) = _U32.unpack_from(body, p)
        p += 4
        payload = body[p:p + plen]
        p += plen
        props = None
        if flags & _F_PROPS:
            props, p = _props(body, p)
        origin = None
        if flags & _F_ORIGIN:
            origin, p = _read_s(body, p)
        device = None
        offset = -1
        if flags & _F_DEVICE:
            device, p = _read_s(body, p)
            (offset,) = _DEVICE_TAIL.unpack_from(body, p)
            p += 8
        expiry = None
        if flags & _F_EXPIRY:
            (expiry,) = _U32.unpack_from(body, p)
            p += 4
        group = None
        if flags & _F_GROUP:
            name, p = _read_s(body, p)
            flt, p = _read_s(body, p)
            group = (name, flt)
        if p > n:
            raise FrameError("entry runs past the frame")
        out.append(Entry(seq, kind, topic, payload, flags & 0x03, bool(flags & _F_RETAIN),
                         props, origin, device, offset, expiry, group, epoch))
    if p != n:
        raise FrameError("trailing bytes after the entries")
    return out


def _props(body: bytes, p: int) -> tuple[dict | None, int]:
    # the block starts with its variable-byte length; decode_properties reads it
    n = len(body)
    try:
        props, end = decode_properties(body, p, n, PacketType.PUBLISH)
    except Exception as err:  # noqa: BLE001 - any malformed block is a broken peer
        raise FrameError(f"bad properties: {err}") from None
    return props, end


# -- routes ----------------------------------------------------------------------------------
ROUTE_ADD = 1
ROUTE_DEL = 2
ROUTES_FULL = 1  # the first ROUTES frame on a connection: replaces whatever the peer had


def encode_routes(full: bool, changes: list[tuple[int, str, str | None]]) -> bytes:
    parts = [bytes((ROUTES_FULL if full else 0,)), _U32.pack(len(changes))]
    for op, flt, group in changes:
        parts.append(bytes((op,)))
        parts.append(_s(flt))
        parts.append(_s(group or ""))
    return frame(ROUTES, b"".join(parts))


def decode_routes(body: bytes) -> tuple[bool, list[tuple[int, str, str | None]]]:
    try:
        full = body[0] == ROUTES_FULL
        (count,) = _U32.unpack_from(body, 1)
        p = 5
        out = []
        for _ in range(count):
            op = body[p]
            flt, p = _read_s(body, p + 1)
            group, p = _read_s(body, p)
            out.append((op, flt, group or None))
    except (struct.error, UnicodeDecodeError, IndexError) as err:
        raise FrameError(f"bad routes frame: {err}") from None
    if p != len(body):
        raise FrameError("trailing bytes after the routes")
    return full, out


# -- ping, fetch -----------------------------------------------------------------------------
def encode_ping(ftype: int, t_ns: int) -> bytes:
    return frame(ftype, _PING.pack(t_ns))


@dataclass(frozen=True, slots=True)
class Fetch:
    """FETCH: "read device D from offset N". From version 3 it says who asks (``replica``: the
    asking router's id) and the leader epoch of the last record it fetched (``last_epoch``, -1:
    none, e.g. an offset replay), as Kafka's fetch request does (replica id, last fetched
    epoch: KIP-320/595); at version 2 they are not on the wire ("" and -1 when read)."""

    request: int
    device: str
    offset: int
    max_records: int
    replica: str = ""
    last_epoch: int = -1


def encode_fetch(f: Fetch, version: int) -> bytes:
    """Version 3 appends the replica id and last fetched epoch to the version-2 body."""
    body = _FETCH.pack(f.request, f.offset, f.max_records) + _s(f.device)
    if version >= V_EPOCHS:
        body += _s(f.replica) + _I32.pack(f.last_epoch)
    return frame(FETCH, body)


def decode_fetch(body: bytes, version: int) -> Fetch:
    try:
        request, offset, max_records = _FETCH.unpack_from(body, 0)
        device, p = _read_s(body, _FETCH.size)
        if version < V_EPOCHS:
            return Fetch(request, device, offset, max_records)
        replica, p = _read_s(body, p)
        (last_epoch,) = _I32.unpack_from(body, p)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad fetch frame: {err}") from None
    return Fetch(request, device, offset, max_records, replica, last_epoch)


_RECORDS = struct.Struct(">QBqqq")  # request id, status, log start, high-water mark, next
_RECORDS_V3 = struct.Struct(">qiiq")  # log end, leader epoch, diverging epoch, its end offset

RECORDS_OK = 0
RECORDS_OUT_OF_RANGE = 1  # the offset is outside [log start, high-water mark]
RECORDS_FAILED = 2  # the owner could not read (the body says why, in words)
RECORDS_NOT_OWNER = 3  # the receiver does not own this device log
# version 3: the asker's last fetched epoch ended before its fetch offset here (or is not one
# of this log's epochs): no records; it truncates to ``diverging_end`` (Kafka >= 2.7)
RECORDS_DIVERGING = 4


@dataclass(frozen=True, slots=True)
class Records:
    """RECORDS: the stored record bytes as the log holds them (commitlog/record.py framing),
    and where the reader goes on: ``next_offset`` is past the last record sent, or past a
    quarantined gap when none could be (Kafka's fetch response carries log start and high-water
    mark too). From version 3 also the leader's log end and leader epoch, and the diverging
    epoch and its end offset (-1 when the asker's log did not diverge)."""

    request: int
    status: int
    log_start: int
    high_watermark: int
    next_offset: int
    data: bytes  # the record bytes, or why (status not OK)
    log_end: int = -1
    leader_epoch: int = -1
    diverging_epoch: int = -1
    diverging_end: int = -1


def encode_records(r: Records, version: int) -> bytes:
    head = _RECORDS.pack(r.request, r.status, r.log_start, r.high_watermark, r.next_offset)
    if version >= V_EPOCHS:
        head += _RECORDS_V3.pack(r.log_end, r.leader_epoch, r.diverging_epoch, r.diverging_end)
    elif r.status == RECORDS_DIVERGING:  # a version-2 reader never sends an epoch to diverge
        raise ValueError("RECORDS_DIVERGING is not in mesh protocol 2")
    return frame(RECORDS, head + r.data)


def decode_records(body: bytes, version: int) -> Records:
    try:
        request, status, start, hw, next_offset = _RECORDS.unpack_from(body, 0)
        if version < V_EPOCHS:
            return Records(request, status, start, hw, next_offset, body[_RECORDS.size:])
        log_end, epoch, div_epoch, div_end = _RECORDS_V3.unpack_from(body, _RECORDS.size)
    except struct.error as err:
        raise FrameError(f"bad records frame: {err}") from None
    return Records(request, status, start, hw, next_offset,
                   body[_RECORDS.size + _RECORDS_V3.size:], log_end, epoch, div_epoch, div_end)


def encode_resolve(request: int, device: str, spec: str, reset: str) -> bytes:
    return frame(RESOLVE, _U64.pack(request) + _s(device) + _s(spec) + _s(reset))


def decode_resolve(body: bytes) -> tuple[int, str, str, str]:
    try:
        (request,) = _U64.unpack_from(body, 0)
        device, p = _read_s(body, 8)
        spec, p = _read_s(body, p)
        reset, p = _read_s(body, p)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad resolve frame: {err}") from None
    return request, device, spec, reset


_RESOLVED = struct.Struct(">Qq")  # request id, offset (-1: refused, the text says why)


def encode_resolved(request: int, offset: int | None, why: str) -> bytes:
    return frame(RESOLVED, _RESOLVED.pack(request, -1 if offset is None else offset)
                 + _s(why[:2000]))


def decode_resolved(body: bytes) -> tuple[int, int | None, str]:
    try:
        request, offset = _RESOLVED.unpack_from(body, 0)
        why, _ = _read_s(body, _RESOLVED.size)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad resolved frame: {err}") from None
    return request, (None if offset < 0 else offset), why


_RESULT = struct.Struct(">QBq")  # seq, status (0 = stored), offset

RESULT_STORED = 0
RESULT_NOT_STORED = 1
# refused unapplied: the receiver does not lead the log, or not at the epoch the APPEND carried
# (fencing). A version-2 receiver reads any status but 0 as "not stored", so 2 is safe to send.
RESULT_FENCED = 2


def encode_results(results: list[tuple[int, int, int, str]]) -> bytes:
    """(seq, status, offset, why) per APPEND; ``why`` only when status is not 0."""
    parts = [_U32.pack(len(results))]
    for seq, status, offset, why in results:
        parts.append(_RESULT.pack(seq, status, offset))
        parts.append(_s(why[:1000]))
    return frame(RESULTS, b"".join(parts))


def decode_results(body: bytes) -> list[tuple[int, int, int, str]]:
    try:
        (count,) = _U32.unpack_from(body, 0)
        p = 4
        out = []
        for _ in range(count):
            seq, status, offset = _RESULT.unpack_from(body, p)
            why, p = _read_s(body, p + _RESULT.size)
            out.append((seq, status, offset, why))
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad results frame: {err}") from None
    return out


_CLAIM = struct.Struct(">QB")  # request id, clean start


def encode_claim(request: int, client_id: str, clean: bool) -> bytes:
    return frame(CLAIM, _CLAIM.pack(request, int(clean)) + _s(client_id))


def decode_claim(body: bytes) -> tuple[int, str, bool]:
    try:
        request, clean = _CLAIM.unpack_from(body, 0)
        client_id, _ = _read_s(body, _CLAIM.size)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad claim frame: {err}") from None
    return request, client_id, bool(clean)


def encode_claimed(request: int, state: bytes | None) -> bytes:
    """The session handed over (its record, see broker/sessionstore.py export), or none."""
    return frame(CLAIMED, _U64.pack(request) + (b"\x01" + state if state is not None else b"\x00"))


def decode_claimed(body: bytes) -> tuple[int, bytes | None]:
    if len(body) < 9:
        raise FrameError("bad claimed frame")
    return _U64.unpack_from(body, 0)[0], (body[9:] if body[8] == 1 else None)


def encode_admin(ftype: int, request: int, first: str, second: str,
                 headers: list[tuple[str, str]], body: bytes) -> bytes:
    """ADMIN_REQUEST (method, path) or ADMIN_RESPONSE (status, content type)."""
    parts = [_U64.pack(request), _s(first), _s(second), _U16.pack(len(headers))]
    for name, value in headers:
        parts.append(_s(name))
        parts.append(_s(value))
    parts.append(_U32.pack(len(body)))
    parts.append(body)
    return frame(ftype, b"".join(parts))


def decode_admin(body: bytes) -> tuple[int, str, str, list[tuple[str, str]], bytes]:
    try:
        (request,) = _U64.unpack_from(body, 0)
        first, p = _read_s(body, 8)
        second, p = _read_s(body, p)
        (count,) = _U16.unpack_from(body, p)
        p += 2
        headers = []
        for _ in range(count):
            name, p = _read_s(body, p)
            value, p = _read_s(body, p)
            headers.append((name, value))
        (n,) = _U32.unpack_from(body, p)
        p += 4
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad admin frame: {err}") from None
    if p + n != len(body):
        raise FrameError("bad admin frame: body length")
    return request, first, second, headers, body[p:]
