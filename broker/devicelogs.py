"""The router's view of the commit log: append with group-commit acks, and replay by offset.

A PUBLISH on a logged topic is appended to its device's log and *held*: it is routed to subscribers
and acknowledged to its publisher only when its device's **high-water mark** has passed it (the
visible end, ``LogStore.high_watermark``: the durable end on one node, the replicated mark once a
replication layer sets it; docs/architecture.md). So a PUBACK/PUBREC means "committed", a
subscriber never sees a record above the high-water mark (nothing a crash or a leader change
could take back), and per-device order is the log order.

Batched, not per message (the ack path of every QoS 1 publish): each sealed batch registers one
``when_high_watermark`` waiter per device it touches, at that device's last offset in the batch,
and that device's publishes of the batch settle together when it fires (Kafka's DelayedProduce,
keyed by partition, completed when the partition's high watermark passes the produce's last
offset). Devices settle independently: with replication a device whose followers lag holds its
own acks and deliveries, never another device's. Within a device the order is the log's, which
is what MQTT asks of a server (per-topic order from each publisher [MQTT-4.6.0-6]; a topic maps
to one device log). On one node every device of a batch passes at the same commit, which is the
former per-fsync-batch settle.

Replay (subscriber-held offsets) is a cursor per subscription: it reads committed records from its
offset, paced by the subscriber's window and socket, and hands over to live delivery at the log end.
The seam has no gap and no duplicate because live delivery to a cursor's subscription is accepted
only in order: an offset below the cursor's next offset was already replayed, one above it while
still replaying is left for the cursor to read (``broker/cursors.py``, ``LogCursor``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from broker.cursors import LogCursor
from broker.logrules import LogRules
from broker.protocol.properties import Prop
from broker.pubdedupe import H_PUBLISHER, PublisherDedupe
from commitlog.groupcommit import GroupCommitter
from commitlog.record import ATTR_QOS_MASK, ATTR_RETAIN, Record
from commitlog.store import LogStore

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.message import Message

#: ``DeviceLogs.key_for`` for a retained publish on an unlogged topic while retained messages
#: are persisted: no device record, only the retained state record, but the same held path
#: (routed and acknowledged once durable). "#" alone: no topic maps to it (store.INTERNAL_PREFIX).
RETAIN_ONLY = "#"
_UNCACHED = object()  # a topic LogRules has not resolved yet (None means unlogged)

# MQTT 5 properties kept with a record, as headers. User properties keep their own names; the
# spec-defined ones take reserved names starting with ':' (user property names may not clash
# in practice: MQTT allows any UTF-8, so a user property named ':content-type' would be read back
# as the content type; documented in commitlog/README.md).
_H_CONTENT_TYPE = ":content-type"
_H_RESPONSE_TOPIC = ":response-topic"
_H_CORRELATION = ":correlation-data"
_H_FORMAT = ":payload-format"
_H_EXPIRY = ":message-expiry"  # the interval in seconds, counted from the record timestamp
# The publisher's client id, kept only when that client holds a No Local subscription: a session
# fed from the log (broker/catchup.py) must still not get its own messages back [MQTT-3.8.3-3].
_H_ORIGIN = ":origin"
# Where a record appended for a peer router came from (publisher incarnation, link seq): what
# lets a restarted owner answer a resent APPEND with the offset it was stored at instead of
# storing it twice (cluster/idempotence.py). Internal: never shown to MQTT subscribers.
H_SOURCE = ":src"
_RESERVED = {
    _H_CONTENT_TYPE: (Prop.CONTENT_TYPE, "str"),
    _H_RESPONSE_TOPIC: (Prop.RESPONSE_TOPIC, "str"),
    _H_CORRELATION: (Prop.CORRELATION_DATA, "bytes"),
    _H_FORMAT: (Prop.PAYLOAD_FORMAT_INDICATOR, "int"),
    _H_EXPIRY: (Prop.MESSAGE_EXPIRY_INTERVAL, "int"),
}
_BY_PROP = {prop: (name, kind) for name, (prop, kind) in _RESERVED.items()}


def headers_from_properties(props: dict | None, expiry: int | None) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = []
    if expiry is not None:
        headers.append((_H_EXPIRY, str(expiry).encode()))
    if not props:
        return headers
    for prop, value in props.items():
        if prop == Prop.USER_PROPERTY:
            headers.extend((k, v.encode()) for k, v in value)
            continue
        spec = _BY_PROP.get(prop)
        if spec is None:
            continue
        name, kind = spec
        headers.append((name, value if kind == "bytes" else str(value).encode()))
    return headers


def properties_from_headers(headers: Any) -> tuple[dict | None, int | None]:
    """(forwardable v5 properties, message expiry interval) from a record's headers."""
    if not headers:
        return None, None
    props: dict[int, Any] = {}
    expiry = None
    users: list[tuple[str, str]] = []
    for name, value in headers:
        spec = _RESERVED.get(name)
        if spec is None:
            if name == _H_ORIGIN or name == H_SOURCE:
                continue
            if name == H_PUBLISHER:  # who published it (broker/pubdedupe.py): internal too
                continue
            users.append((name, bytes(value).decode("utf-8", "replace")))
            continue
        prop, kind = spec
        if prop == Prop.MESSAGE_EXPIRY_INTERVAL:
            expiry = int(value)
        elif kind == "bytes":
            props[prop] = bytes(value)
        elif kind == "int":
            props[prop] = int(value)
        else:
            props[prop] = bytes(value).decode()
    if users:
        props[Prop.USER_PROPERTY] = users
    return props or None, expiry


# A stored-but-not-yet-committed publish: (publisher connection or None, packet id, message):
# what to route and whom to acknowledge once its device's high-water mark passes it. A tuple,
# not a class: one is made per logged publish, the cheapest record CPython builds.
PendingPublish = tuple["Connection | None", "int | None", "Message"]


DurableHandler = Callable[[list[PendingPublish], BaseException | None], None]


class _Sealed:
    """One sealed batch: its first append's timestamp and how many of its devices have not
    settled yet (``DeviceLogs.oldest_unrouted_us``)."""

    __slots__ = ("ts", "left")

    def __init__(self, ts: int, left: int) -> None:
        self.ts = ts
        self.left = left


def wants_ack_offsets(props: dict, default: bool) -> bool:
    """The CONNECT user property ``ack-offsets`` (true/false), else the configured default:
    ``device``/``offset`` on PUBACK/PUBREC are opt-in, a 4-byte ack is what clients expect."""
    for name, value in props.get(Prop.USER_PROPERTY, ()):
        if name == "ack-offsets":
            return value.strip().lower() in ("true", "1", "yes", "on")
    return default


def offset_request(props: dict | None) -> tuple[str | None, str]:
    """The SUBSCRIBE user properties ``offset`` and ``offset-reset`` (see README)."""
    offset, reset = None, "error"
    if props:
        for name, value in props.get(Prop.USER_PROPERTY, ()):
            if name == "offset":
                offset = value
            elif name == "offset-reset":
                reset = value
    return offset, reset


class RetainLog(Protocol):
    """What the device logs need of the retained messages' persistence
    (``broker/retainstore.RetainPersistence``, which imports this module: declared here so the
    imports go one way)."""

    def keeps(self, topic: str) -> bool:
        """Whether a retained publish on ``topic`` is persisted (so its ack waits for it)."""

    def write(self, msg: Message) -> None:
        """Append a retained change to the #retained state log (raises LogWriteError)."""


class DeviceLogs:
    """Appends for the router and hands back whole durable batches, in append order."""

    def __init__(self, committer: GroupCommitter, rules: LogRules, on_durable: DurableHandler,
                 loop: Any) -> None:
        self.committer = committer
        self.store: LogStore = committer.store
        self.rules = rules
        self._keys = rules.cache
        self._on_durable = on_durable
        self._loop = loop
        # The open batch: its publishes per device, each list in log order (RETAIN_ONLY: the
        # retained changes with no device record, which wait for their write to be durable).
        self._batch: dict[str, list[PendingPublish]] = {}
        self.held = 0  # publishes appended and not yet settled (backpressure signal)
        # in a cluster: the router owning a device log when it is another one (cluster/mesh.py)
        self.remote_owner: Callable[[str], str | None] | None = None
        # Set by the router: the leader's check of a publish that may be a resend
        # (broker/pubdedupe.py)
        self.dedupe: PublisherDedupe | None = None
        # Set by the node when retained messages are persisted (broker/retainstore.py).
        self.retain_log: RetainLog | None = None
        # Timestamp of the first append of the open batch; the sealed batches not yet settled
        # (so not yet routed), oldest first: a session checkpoint must not claim to have seen
        # them.
        self._batch_ts = 0
        self._sealed: deque[_Sealed] = deque()
        # The batch's waiters are registered right before the committer writes it, never
        # after: a callback registered after a failed write (a later call_soon) would see a
        # durable position that seems to cover it and ack what was never stored.
        committer.before_flush(self._seal)

    def key_for(self, topic: str, retain: bool) -> str | None:
        """The device log of a publish, RETAIN_ONLY for a retained one on an unlogged topic
        when retained messages are persisted, or None (unlogged: routed at once)."""
        key = self._keys.get(topic, _UNCACHED)  # LogRules.key_for's cache, without its call
        if key is _UNCACHED:
            key = self.rules.key_for(topic)
        if key is None and retain and self.retain_log is not None \
                and self.retain_log.keeps(topic):
            # (a change that is not written, a $SYS/ topic, has no record to wait for: held
            # here it joined a batch with nothing to flush, and its ack waited for whatever
            # flushed next, seconds or forever)
            return RETAIN_ONLY
        return key

    def append(self, key: str, msg: Message, conn: Connection | None, packet_id: int | None,
               expiry: int | None, source: bytes | None = None) -> int:
        """Append and hold the publish until its device's high-water mark passes it; raises
        LogWriteError if the log is failing.
        ``source``: a peer's APPEND, kept as the ``:src`` header (cluster/idempotence.py)."""
        ts = time.time_ns() // 1000
        batch = self._batch
        if not batch:
            self._batch_ts = ts
        offset = -1
        if key != RETAIN_ONLY:
            attrs = msg.qos | (ATTR_RETAIN if msg.retain else 0)
            headers = headers_from_properties(msg.properties, expiry) if (
                msg.properties or expiry is not None) else None
            if conn is not None and conn.session is not None and conn.session.has_no_local:
                headers = [*(headers or ()), (_H_ORIGIN, msg.origin.encode())]
            if source is not None:
                headers = [*(headers or ()), (H_SOURCE, source)]
            if msg.publisher is not None:  # who, for a resend's lookup (broker/pubdedupe.py)
                # a tuple: the compiled append takes it as is (commitlog/_speedups.c)
                headers = (*(headers or ()), (H_PUBLISHER, msg.publisher))
            committer = self.committer
            if committer.flush_scheduled and committer.failure is None:
                # this tick's flush is scheduled: the store's append is all the committer's
                # would do (one call less per logged publish; issue 25)
                offset = self.store.append(key, ts, msg.topic, attrs, headers, msg.payload)
            else:
                offset = committer.append(key, ts, msg.topic, attrs, headers, msg.payload)
            msg.device = key
            msg.offset = offset
        if msg.retain and self.retain_log is not None:
            self.retain_log.write(msg)  # same tick, same fsync: acked only once both are stored
        group = batch.get(key)
        if group is None:
            group = batch[key] = []
        group.append((conn, packet_id, msg))
        self.held += 1
        return offset

    def open_cursor(self, real: str, group: str | None, spec: str,
                    reset: str) -> tuple[LogCursor | None, str]:
        """Resolve a held offset ("earliest" | "latest" | N | "@unix_ms") against the log:
        a cursor, or None and the reason string the SUBACK carries. In a cluster, for a log
        another router owns: a ``LogCursor`` not yet resolved (the router asks the
        owner before its SUBACK, ``broker/replay.py``)."""
        if group is not None:
            return None, "offset replay is not available on shared subscriptions"
        key = self.rules.key_for_filter(real)
        if key is None:
            return None, (f"offset replay needs a filter covering one device log "
                          f"(like devices/<id>/#), not {real!r}")
        owner_of = self.remote_owner
        if owner_of is not None and owner_of(key) is not None:
            # a cluster: another router leads this log and resolves it
            return LogCursor(key, -1, owner_of, (spec, reset)), ""
        offset, why = resolve_offset(self.store, key, spec, reset)
        if offset is None:
            return None, why
        return LogCursor(key, offset, owner_of), ""

    def cursor(self, device: str, next_offset: int) -> LogCursor:
        """A replay cursor restored at a known position (a restart, or a session handed over
        by another router): in a cluster it reads from whichever router leads the log at
        each read (here or another)."""
        return LogCursor(device, next_offset, self.remote_owner)

    def append_run(self, key: str, msgs: list[Message], conn: Connection,
                   packet_ids: list[int]) -> None:
        """``append(key, msg, conn, packet_id, None)`` for each of a run of plain messages
        (not retained, no properties, no expiry) from one publisher (broker/loggedrun.py): one
        timestamp, the header and the batch's group made once. Raises LogWriteError at the
        first message the log does not take: those before it are held (their ``offset`` set),
        it and the rest are not."""
        committer = self.committer
        first = 0
        if not committer.flush_scheduled or committer.failure is not None:
            # the first through the committer: it schedules this tick's flush, or refuses
            # while the log is failing
            self.append(key, msgs[0], conn, packet_ids[0], None)
            first = 1
        ts = time.time_ns() // 1000
        batch = self._batch
        if not batch:
            self._batch_ts = ts
        origin = ((_H_ORIGIN, conn.client_id.encode()),) if conn.session.has_no_local else ()
        plain = origin or None  # (no header at all, as append writes a plain record)
        group = batch.get(key)
        if group is None:
            group = batch[key] = []
        append = self.store.append
        held = 0
        try:
            for i in range(first, len(msgs)):
                msg = msgs[i]
                publisher = msg.publisher
                msg.offset = append(key, ts, msg.topic, 1, plain if publisher is None else
                                    (*origin, (H_PUBLISHER, publisher)), msg.payload)
                msg.device = key
                group.append((conn, packet_ids[i], msg))
                held += 1
        finally:
            self.held += held

    def _seal(self) -> None:
        """Before-flush hook: each device's publishes of this write wait for its high-water
        mark to pass the last of them: one waiter per device (see the module docstring)."""
        batch = self._batch
        if not batch:
            return
        self._batch = {}
        sealed = _Sealed(self._batch_ts, len(batch))
        self._sealed.append(sealed)
        committer = self.committer
        for key, group in batch.items():
            passed = partial(self._passed, sealed, group)
            if key == RETAIN_ONLY:  # retained changes alone: their state records' write
                committer.when_durable(passed)
            else:
                committer.when_high_watermark(key, group[-1][2].offset, passed)

    def _passed(self, sealed: _Sealed, group: list[PendingPublish],
                exc: BaseException | None) -> None:
        """One device's publishes of a sealed batch are below its high-water mark (or were
        not stored): route them and answer their publishers, in log order."""
        self.held -= len(group)
        sealed.left -= 1
        queue = self._sealed
        while queue and not queue[0].left:
            queue.popleft()
        if exc is None:
            self._on_durable(group, None)
        else:
            # reported from inside the store's rollback or truncation: settle on the next turn
            # of the loop, with the store whole again (settling may append: a session's
            # state, a held SUBSCRIBE)
            self._loop.call_soon(self._on_durable, group, exc)

    def oldest_unrouted_us(self) -> int | None:
        """Timestamp (µs) of the oldest append not yet routed (not yet settled), or None:
        a session checkpoint resumes from before it (broker/sessionstore.py)."""
        if self._sealed:
            return self._sealed[0].ts
        return self._batch_ts if self._batch else None


def resolve_offset(store: LogStore, key: str, spec: str, reset: str) -> tuple[int | None, str]:
    """Where an offset subscription of ``key`` starts (spec "earliest" | "latest" | N |
    "@unix_ms", with its ``offset-reset``), or None and why, in words for the SUBACK. Run
    where the log is: here, or at its owner for a peer router (cluster RESOLVE frame)."""
    start, end = store.log_range(key)
    if spec == "earliest":
        return start, ""
    if spec == "latest":
        return end, ""
    try:
        if spec.startswith("@"):
            offset = store.offset_for_timestamp(key, int(spec[1:]) * 1000)
            return max(offset, start), ""
        offset = int(spec)
    except ValueError:
        return None, (f"offset {spec!r} is not earliest, latest, an integer offset "
                      f"or @<unix ms>")
    if start <= offset <= end:
        return offset, ""
    if reset == "earliest":
        return start, ""
    if reset == "latest":
        return end, ""
    why = ("retention removed older records" if offset < start
           else "it is beyond the committed end")
    return None, (f"offset {offset} of {key!r} is outside the log [{start}, {end}]"
                  f" ({why}); subscribe from {start if offset < start else end}, or add"
                  f" offset-reset=earliest")


# The cursor of an offset subscription is the one cursor type (broker/cursors.py); these names
# stay for the code and tests that spell it by its old role.
ReplayCursor = LogCursor
RemoteReplayCursor = LogCursor


def record_message(rec: Record, message_cls: type) -> Message:
    """Rebuild a broker message from a stored record (for replay, and for every record a
    lagging session reads: broker/catchup.py, so a record without headers, the common one,
    takes no further call)."""
    headers = rec.headers
    props = expiry_at = origin = None
    if headers:
        props, expiry = properties_from_headers(headers)
        if expiry is not None:
            age = time.time() - rec.timestamp_us / 1e6
            expiry_at = time.monotonic() + expiry - age
        for name, value in headers:
            if name == _H_ORIGIN:
                origin = bytes(value).decode("utf-8", "replace")
    attrs = rec.attrs
    msg = message_cls(rec.topic, bytes(rec.payload), attrs & ATTR_QOS_MASK,
                      bool(attrs & ATTR_RETAIN), props, expiry_at, origin)
    msg.device = rec.key
    msg.offset = rec.offset
    return msg
