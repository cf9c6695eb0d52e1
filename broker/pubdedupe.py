"""Publisher dedupe: a QoS 1/2 publish resent after a failover is stored once (issue 24).

A client that loses its connection before the PUBACK (or PUBREC) resends the PUBLISH with
DUP=1 and the same packet id, on the same router or, after a failover, on another router or
node. The first copy may already be in the device's log (stored, even replicated, its answer
lost with the connection): appended again, every replica would hold it twice. Kafka's
idempotent producer keeps (producer id, epoch, sequence) with every batch and rebuilds its
producer state from the log tail; MQTT gives no sequence numbers, only packet ids that the
client reuses as soon as one is acknowledged, so the rule here is narrower:

* every QoS 1/2 record a client publishes on a logged topic carries one reserved header,
  ``:pub`` (14 bytes): an 8-byte hash of its client id, its session's epoch (4 bytes,
  ``session_epoch``) and the packet id. The *first* copy must carry it, so that the resend can
  match it; QoS 0 (never resent) and wills carry none;
* the device log's leader (the router appending, for a local publish or a peer's APPEND)
  looks up a publish with DUP=1, or one carrying the MQTT 5 user property
  ``meshmq-message-id``, before appending it. Nothing is kept in memory for the others: the
  lookup reads the device's newest records, at most ``mqtt.dedupe_window`` of them, up to
  what this router holds durably (above the high-water mark too: a copy still waiting for
  its replicas counts), so a router that restarted or just became leader sees what its
  predecessor stored (the window *is* rebuilt from the log tail, every time it is needed);
  per device the index of that scan is cached and extended by later lookups;
* a match is the **latest** record of that client with that packet id among the client's
  last ``mqtt.receive_maximum`` records there (its in-flight window: a packet id is reused
  only after it was acknowledged, and the client has at most that many unacknowledged), with
  the same session epoch (unless the resending session's epoch is 0, unknown here), topic
  and payload. With a message id: the latest record in the window carrying the same id,
  topic and payload (the publisher promises ids unique per device log). A match is answered
  "stored at offset N" (PUBACK/PUBREC once the high-water mark passes N) and not appended.

Where a resend is still stored twice (at least once, as before): the first copy older than
the window or than the client's in-flight window, removed by retention, not yet durable on
the leader when the resend arrives (within one fsync), or on a replica that was truncated
away; a packet id whose previous use was acknowledged, then the next publish with the same
id, topic and payload lost before it was stored and resent (answered with the earlier copy's
offset: an identical message counted once). A publisher that needs exactly once across
everything sets ``meshmq-message-id``.

Where it runs (``mqtt.publisher_dedupe``, ``for_router``): with ``[cluster]`` by default, on a
single node only when set to "on": the header costs about 0.35 us of CPU a record (append +
flush) and ~24 bytes on disk, and a single node's hot path stays as it was unless asked.
Without it (None) no header is written and nothing is looked up.

The session epoch: a random non-zero number for a session created by a clean start; 0 for a
session created by ``clean_start = false`` where none was found (a client whose node died:
its session's epoch died with it), restored after a restart or moved from another router
(not carried over yet). 0 matches any epoch; a non-zero one only its own, so a new clean
session's resend never matches what an earlier session of the same client id published.
``session_epoch`` is the one place the epoch comes from (a Raft session epoch can replace it).
"""

from __future__ import annotations

import hashlib
import logging
import random
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.lograte import RateLimitedLog
from broker.protocol.properties import Prop
from broker.settings import DedupeMode, MqttSettings

if TYPE_CHECKING:
    from broker.message import Message
    from broker.session import Session
    from commitlog.groupcommit import GroupCommitter

log = logging.getLogger("broker.pubdedupe")

#: The record header naming a client's publish: client hash (8), session epoch (4), packet id
#: (2). Internal: never shown to subscribers (devicelogs.properties_from_headers).
H_PUBLISHER = ":pub"
#: The MQTT 5 user property a publisher may set to have a publish deduplicated by its value
#: (unique per device log) rather than by client id and packet id.
MESSAGE_ID = "meshmq-message-id"
_PUB = struct.Struct(">8sIH")
_PREFIX = 12  # client hash + session epoch
_UNKNOWN = bytes(4)  # session epoch 0: not known where the session was made (matches any)
#: Device logs whose scanned tail is kept between lookups (least recently used dropped): a
#: failover's resends come in a burst per device; memory is this times mqtt.dedupe_window
#: entries at most.
TAILS_KEPT = 64
_SCAN_BATCH = 1024


def new_session_epoch() -> int:
    """The epoch of a session created by a clean start: random, never 0 (0: not known)."""
    return random.getrandbits(32) or 1


def session_epoch(session: Session) -> int:
    """The session identity kept in its records: the one place it comes from."""
    return session.epoch


def publisher_id(session: Session, packet_id: int) -> bytes:
    """The ``:pub`` value of this session's publish with ``packet_id``."""
    prefix = session.publisher_key
    if not prefix:
        prefix = session.publisher_key = _PUB.pack(
            hashlib.blake2b(session.client_id.encode(), digest_size=8).digest(),
            session_epoch(session), 0)[:_PREFIX]
    return prefix + packet_id.to_bytes(2, "big")


def message_id(props: dict | None) -> str | None:
    """The ``meshmq-message-id`` user property of a publish, if it set one."""
    if props:
        for name, value in props.get(Prop.USER_PROPERTY, ()):
            if name == MESSAGE_ID:
                return value
    return None


def _client(pub: bytes) -> bytes:
    """The client part of a ``:pub`` value (its id's hash): whose in-flight window it is."""
    return pub[:8]


def _names(rec: Any, pub: bytes | None, mid: str | None) -> bool:
    """Whether ``rec`` is the one the index pointed at: its message id, or its client and
    packet id (the epoch was compared by the index)."""
    for name, value in rec.headers or ():
        if mid is not None:
            if name == MESSAGE_ID and bytes(value) == mid.encode():
                return True
        elif name == H_PUBLISHER and pub is not None:
            value = bytes(value)
            if value[:8] == pub[:8] and value[12:] == pub[12:]:
                return True
    return False


class _Tail:
    """What one scan of a device's newest records found, extended by later lookups."""

    __slots__ = ("end", "by_client", "by_id")

    def __init__(self, end: int) -> None:
        self.end = end  # scanned up to here (exclusive)
        # client hash -> (epoch + packet id bytes, offset) of its newest records, oldest first
        self.by_client: dict[bytes, deque[tuple[bytes, int]]] = {}
        self.by_id: dict[bytes, int] = {}  # message id -> offset of its latest record


def for_router(committer: GroupCommitter, mqtt: MqttSettings,
               clustered: bool) -> PublisherDedupe | None:
    """The router's dedupe per ``mqtt.publisher_dedupe``, or None: no header, no lookup."""
    mode = mqtt.publisher_dedupe
    if mode == DedupeMode.OFF or (mode == DedupeMode.CLUSTER and not clustered):
        return None
    return PublisherDedupe(committer, mqtt.dedupe_window, mqtt.receive_maximum)


class PublisherDedupe:
    """The leader's check of a publish that may already be stored (see the module docstring).
    One per router; counts ``hits`` and ``misses`` (meshmq_publish_dedupe_total)."""

    def __init__(self, committer: GroupCommitter, window: int, in_flight: int) -> None:
        self.committer = committer
        self.store = committer.store
        self.window = window
        self.in_flight = in_flight
        self.started_us = time.time_ns() // 1000
        self._tails: OrderedDict[str, _Tail] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._log_err = RateLimitedLog(log, logging.WARNING, "dedupe tail reads failed",
                                       burst=1, window=10.0)

    def stored_at(self, device: str, msg: Message) -> tuple[int, bool] | None:
        """(offset, stored before this router started) of the record ``msg`` resends, or
        None: append it. Never raises: an unreadable tail stores again (at least once)."""
        pub = msg.publisher
        mid = message_id(msg.properties)
        if pub is None and mid is None:
            return None
        try:
            found = self._lookup(device, pub, mid, msg)
        except Exception as err:  # noqa: BLE001 - a read failing must not refuse a write
            self._log_err("could not read the tail of device log %s to look for a resent "
                          "publish (%r): it is stored again (a duplicate in the log; check "
                          "the store: meshmq log verify)", device, err,
                          extra={"device": device})
            self._tails.pop(device, None)
            found = None
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        return found

    def when_committed(self, device: str, offset: int,
                       callback: Callable[[BaseException | None], Any]) -> None:
        """``callback(None)`` once the high-water mark passes the found record (a copy still
        waiting for its replicas is acknowledged only when committed, as the first would
        have been), ``callback(exc)`` if it is truncated away."""
        self.committer.when_high_watermark(device, offset, callback)

    def _lookup(self, device: str, pub: bytes | None, mid: str | None,
                msg: Message) -> tuple[int, bool] | None:
        store = self.store
        end = store.durable_end(device)
        start = store.log_range(device)[0]
        low = max(start, end - self.window)
        if end <= low:
            return None
        tails = self._tails
        tail = tails.get(device)
        if tail is None or tail.end > end or tail.end < low:
            # first lookup, a truncated log (a leader change) or a window since passed
            tail = _Tail(low)
        tails[device] = tail
        tails.move_to_end(device)
        if len(tails) > TAILS_KEPT:
            tails.popitem(last=False)
        self._extend(device, tail, end)
        if mid is not None:
            offset = tail.by_id.get(mid.encode())
        else:
            assert pub is not None
            offset = self._latest(tail, pub)
        if offset is None or offset < low:
            return None
        recs = store.read_durable(device, offset, 1)
        if not recs or recs[0].offset != offset:
            return None
        rec = recs[0]
        if rec.topic != msg.topic or bytes(rec.payload) != msg.payload:
            return None  # the same ids, another message: not a resend of it
        if not _names(rec, pub, mid):
            return None  # an index entry gone stale (the log truncated and grown back)
        return offset, rec.timestamp_us < self.started_us

    def _latest(self, tail: _Tail, pub: bytes) -> int | None:
        """The client's latest record with this packet id in its in-flight window, if its
        session epoch matches (0 on either side: not known, any)."""
        mine = tail.by_client.get(_client(pub))
        if not mine:
            return None
        epoch, pid = pub[8:12], pub[12:]
        for rest, offset in reversed(mine):
            if rest[4:] == pid:
                if rest[:4] == epoch or _UNKNOWN in (epoch, rest[:4]):
                    return offset
                return None  # the latest use of this packet id is another session's
        return None

    def _extend(self, device: str, tail: _Tail, end: int) -> None:
        """Index the records from where the tail was scanned to ``end``."""
        off = tail.end
        in_flight = self.in_flight
        by_client = tail.by_client
        by_id = tail.by_id
        read = self.store.read_durable
        while off < end:
            recs = read(device, off, min(_SCAN_BATCH, end - off), 1 << 22)
            if not recs:
                past = self.store.past_gap(device, off)  # a quarantined range: go on after it
                if past <= off:
                    break
                off = past
                continue
            for rec in recs:
                headers = rec.headers
                if not headers:
                    continue
                for name, value in headers:
                    if name == H_PUBLISHER and len(value) == _PUB.size:
                        value = bytes(value)
                        client = _client(value)
                        mine = by_client.get(client)
                        if mine is None:
                            mine = by_client[client] = deque(maxlen=in_flight)
                        mine.append((value[8:], rec.offset))
                    elif name == MESSAGE_ID:
                        by_id[bytes(value)] = rec.offset
            off = recs[-1].offset + 1
        tail.end = max(off, tail.end)
        if len(by_id) > 2 * self.window:  # ids that left the window
            low = end - self.window
            tail.by_id = {k: v for k, v in by_id.items() if v >= low}
