"""The mesh link protocol, sans-I/O (as ``broker/protocol`` and h11): bytes in, frames out.

A frame is ``u32 length | u8 type | body`` (length counts type and body), so a reader never
scans for delimiters and a 64 KiB read holds many frames (NATS batches by buffering, VerneMQ by
one ``vmq-send`` frame holding many sub-frames: we do both, one ENTRIES frame per link per loop
tick carrying every entry of the tick).

Frames, in the order a link uses them:
- HELLO (dialer): version, cluster name, router id, nonce, incarnation.
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

An entry is one publish on its way: to be *delivered* by the peer's local subscribers
(``DELIVER``), to be *appended* to a device log the peer owns (``APPEND``; the peer acks it only
once its fsync covered it), or a retained-message change (``RETAIN``). The entry body is encoded
once per message and shared by every link it goes to; only the 8-byte seq differs.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from broker.protocol.packets import PacketType
from broker.protocol.properties import decode_properties, encode_properties

# The mesh protocol. 2: SHARE_ON entries and the ':src' record header (a build of 1 acks a
# SHARE_ON and applies nothing, and shows ':src' to MQTT 5 subscribers): peers of different
# versions refuse each other at the handshake (cluster/handshake.py), naming both.
VERSION = 2
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

_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_ENTRY_HEAD = struct.Struct(">QBBH")  # seq, kind, flags, topic length
_DEVICE_TAIL = struct.Struct(">q")
_PING = struct.Struct(">Q")
_FETCH = struct.Struct(">QqI")  # request id, offset, max records


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


# -- handshake -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    version: int
    cluster: str
    router: str
    nonce: bytes
    incarnation: bytes


def encode_hello(h: Hello, ftype: int = HELLO, proof: bytes = b"") -> bytes:
    return frame(ftype, _U16.pack(h.version) + _s(h.cluster) + _s(h.router) + h.nonce
                 + h.incarnation + proof)


def decode_hello(body: bytes) -> tuple[Hello, bytes]:
    """HELLO or CHALLENGE: (fields, the proof that follows them in a CHALLENGE)."""
    try:
        (version,) = _U16.unpack_from(body, 0)
        cluster, p = _read_s(body, 2)
        router, p = _read_s(body, p)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad hello: {err}") from None
    if p + 32 > len(body):
        raise FrameError("bad hello: short nonce")
    return Hello(version, cluster, router, body[p:p + 16], body[p + 16:p + 32]), body[p + 32:]


def proof(secret: bytes, role: bytes, dialer: Hello, acceptor_nonce: bytes,
          acceptor_router: str) -> bytes:
    """HMAC-SHA256 over both nonces and both ids: each side proves it holds the secret without
    sending it, and a proof cannot be replayed on another link or another handshake."""
    msg = b"|".join((role, dialer.cluster.encode(), dialer.router.encode(),
                     acceptor_router.encode(), dialer.nonce, acceptor_nonce))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def encode_auth(mac: bytes, last_seq: int) -> bytes:
    return frame(AUTH, mac + _U64.pack(last_seq))


def decode_auth(body: bytes) -> tuple[bytes, int]:
    if len(body) != 40:
        raise FrameError("bad auth frame")
    return body[:32], _U64.unpack_from(body, 32)[0]


def encode_seq(ftype: int, seq: int) -> bytes:
    return frame(ftype, _U64.pack(seq))


def decode_seq(body: bytes) -> int:
    if len(body) != 8:
        raise FrameError("bad seq frame")
    return _U64.unpack(body)[0]


def encode_refuse(why: str) -> bytes:
    return frame(REFUSE, why.encode()[:4000])


# -- entries ---------------------------------------------------------------------------------
@dataclass(slots=True)
class Entry:
    """One decoded entry; the receiver turns it into a broker Message."""

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


def encode_entries_parts(parts: list[bytes], count: int) -> bytes:
    """An ENTRIES frame from heads and bodies side by side: one join, no per-entry copy."""
    body_len = 4 + sum(map(len, parts))
    return b"".join((_HEAD.pack(body_len + 1, ENTRIES), _U32.pack(count), *parts))


def encode_entries(entries: list[bytes]) -> bytes:
    body = b"".join((_U32.pack(len(entries)), *entries))
    return _HEAD.pack(len(body) + 1, ENTRIES) + body


def decode_entries(body: bytes) -> list[Entry]:
    try:
        return _decode_entries(body)
    except (struct.error, UnicodeDecodeError, IndexError) as err:
        raise FrameError(f"bad entries frame: {err}") from None


def _decode_entries(body: bytes) -> list[Entry]:
    (count,) = _U32.unpack_from(body, 0)
    p = 4
    out: list[Entry] = []
    n = len(body)
    for _ in range(count):
        seq, kind, flags, tlen = _ENTRY_HEAD.unpack_from(body, p)
        p += _ENTRY_HEAD.size
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
                         props, origin, device, offset, expiry, group))
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


def encode_fetch(request: int, device: str, offset: int, max_records: int) -> bytes:
    return frame(FETCH, _FETCH.pack(request, offset, max_records) + _s(device))


def decode_fetch(body: bytes) -> tuple[int, str, int, int]:
    try:
        request, offset, max_records = _FETCH.unpack_from(body, 0)
        device, p = _read_s(body, _FETCH.size)
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"bad fetch frame: {err}") from None
    return request, device, offset, max_records


_RECORDS = struct.Struct(">QBqqq")  # request id, status, log start, high-water mark, next

RECORDS_OK = 0
RECORDS_OUT_OF_RANGE = 1  # the offset is outside [log start, high-water mark]
RECORDS_FAILED = 2  # the owner could not read (the body says why, in words)
RECORDS_NOT_OWNER = 3  # the receiver does not own this device log


def encode_records(request: int, status: int, start: int, hw: int, next_offset: int,
                   records: bytes) -> bytes:
    """The stored record bytes as the log holds them (commitlog/record.py framing), and where
    the reader goes on: ``next_offset`` is past the last record sent, or past a quarantined gap
    when none could be (Kafka's fetch response carries log start and high-water mark too)."""
    return frame(RECORDS, _RECORDS.pack(request, status, start, hw, next_offset) + records)


def decode_records(body: bytes) -> tuple[int, int, int, int, int, bytes]:
    """(request, status, log start, high-water mark, next offset, record bytes or why)."""
    try:
        request, status, start, hw, next_offset = _RECORDS.unpack_from(body, 0)
    except struct.error as err:
        raise FrameError(f"bad records frame: {err}") from None
    return request, status, start, hw, next_offset, body[_RECORDS.size:]


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
