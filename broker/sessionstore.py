"""Persistent sessions kept across restarts: a compacted state log keyed by client id.

A session with a session expiry (v5 Session Expiry Interval > 0, 3.1.1 clean session 0) is one
record in the ``#sessions`` state log (``broker/statelog.py``): the newest record of a client id
is its session, an empty one (a tombstone) means it ended. A record holds the whole session:
protocol level, user, expiry interval and when it went offline (wall clock, so expiry counts
the time the broker was down), subscriptions with every option, subscription id, creation time
and offset-replay position, the QoS 2 packet ids received and acknowledged (PUBREC sent), the
outgoing QoS 1/2 window (packet id, state, DUP on resend), and what is queued.

Queued logged messages are kept as *positions in their device logs*, never as copies: the
session's catch-up cursors (``broker/catchup.py``) per device, the lowest offset it still owes
per device. Unlogged queued messages (``log = false`` rules, ``$`` topics) have no log to point
into and are kept as copies in the record. Messages in the window are kept as references
(device, offset) or copies, and resent with DUP=1 and their packet id [MQTT-4.4.0-1]. Every
other device log the session was delivered from is kept as its position there
(``Session.positions``, ``broker/positions.py``): local or another router's, a restored or
moved session reads each from that position, so a delivery its router's link acknowledged after
the last checkpoint, or one that went to the old router during a move, is read again.

When a record is written ("stored before acknowledged"):

- **At once, before the acknowledgement that depends on it**: a SUBACK or UNSUBACK, a PUBREC
  (its packet id is now owned: a resend must not be stored twice) and a PUBCOMP (the id is
  free again: a new message reusing it must not be taken for a resend) are sent only once the
  session's record is durable. Changes are coalesced per loop tick into one record per session,
  appended in the group commit batch of that tick (a ``before_flush`` hook): one fsync covers
  them and the tick's publishes. Connect, going offline and ending also write at once.
- **Delivery progress** (the window, the queue, the cursors) moves with every message, so it is
  checkpointed every ``mqtt.persistence_interval`` for the sessions whose progress changed
  (Kafka's consumer offset auto-commit), and at shutdown. Nothing acknowledged is lost by this:
  a logged message is in its device log before its publisher's PUBACK, and a checkpoint records
  a wall-clock ``resume_us`` that is older than every message not yet routed when it was
  written; at restart the session is behind, on every device log its subscriptions can read,
  from the first record at or after ``resume_us`` (unless the record names an exact position).
  After kill -9 a session may therefore receive again logged messages it acked during the last
  interval (QoS 1 semantics); after SIGTERM nothing is repeated. Unlogged messages queued since
  the last checkpoint are lost on kill -9 (kept on SIGTERM): unlogged topics are live pub/sub.

Not kept: pending delayed wills (Will Delay Interval) and QoS 0 messages for offline sessions
(not queued at all, as on Mosquitto); shared-subscription messages in flight are kept for the
member that had them.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from broker.devicelogs import (
    ReplayCursor,
    headers_from_properties,
    properties_from_headers,
    record_message,
)
from broker.message import Delivery, Message
from broker.protocol.reasons import Reason
from broker.resumepoints import ResumePoints, pending_since
from broker.retainstore import RetainPersistence
from broker.session import NEVER, Session, Subscription
from broker.statelog import Item, StateLog
from commitlog.groupcommit import GroupCommitter
from commitlog.store import LogStore, LogWriteError, OffsetOutOfRangeError

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.port import RouterPort

log = logging.getLogger("broker.sessionstore")

SESSIONS_KEY = "#sessions"
_ALIVE = ""  # name of the liveness record (no session has an empty client id)
_VERSION = 1
# A checkpoint resumes this much before the oldest unrouted append: wall clocks step back a
# little (NTP slews and steps); the price is that much more repeated after kill -9.
CLOCK_MARGIN_US = 1_000_000
# Rewrite an unchanged session this often, so its resume point (what a crash makes it read
# again) stays recent and restart work stays bounded.
REFRESH_S = 300.0
_FAR = 1 << 62


class SessionHooks:
    """What the router tells session persistence. This base does nothing (persistence off):
    the router calls it unconditionally instead of testing for persistence at each site."""

    def connected(self, session: Session) -> None:
        """A client took the session (new or resumed; its expiry may have changed)."""

    def went_offline(self, session: Session) -> None:
        """The session's client left and the session stays (expiry > 0)."""

    def ended(self, session: Session) -> None:
        """The session is gone (expired, clean start, evicted)."""

    def stored(self, session: Session | None, then: Callable[..., object], *args: Any) -> None:
        """Run ``then(*args)`` (an acknowledgement) once ``session``'s changed state is
        durable; at once when there is nothing to store."""
        then(*args)

    def export(self, session: Session) -> bytes | None:
        """The session as a self-contained record another router can adopt (None: not kept)."""
        return None

    def adopt(self, client_id: str, state: bytes) -> None:
        """Install a session another router handed over."""

    def portable(self, session: Session) -> bytes | None:
        """The session as a small record any router can resume from (None: not kept)."""
        return None

    def resume(self, client_id: str, state: bytes) -> bool:
        """Install a session from ``portable``'s record; False when it expired meanwhile."""
        return False


NO_PERSISTENCE = SessionHooks()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _msg_ref(msg: Message, copy: bool = False) -> list:
    """A logged message by position; an unlogged one (or any, ``copy``) as a copy. A copy
    keeps the log position it has (a subscriber holding offsets needs it, wherever the
    session goes next), after the 7 fields of the first version."""
    if msg.device is not None and not msg.remote and not copy:
        return ["L", msg.device, msg.offset]
    expiry = (None if msg.expiry_at is None
              else max(1, math.ceil(msg.expiry_at - time.monotonic())))
    headers = headers_from_properties(msg.properties, None)
    ref = ["M", msg.topic, _b64(msg.payload), msg.qos, int(msg.retain),
           [[name, _b64(value)] for name, value in headers], expiry]
    if msg.device is not None:
        ref += [msg.device, msg.offset]
    return ref


def _message(ref: list, store: LogStore, age_s: float) -> Message | None:
    """The message a reference names; None if retention deleted it meanwhile."""
    if ref[0] == "L":
        try:
            recs = store.read(ref[1], ref[2], 1)
        except OffsetOutOfRangeError:
            return None
        if not recs or recs[0].offset != ref[2]:
            return None
        return record_message(recs[0], Message)
    _, topic, payload, qos, retain, headers, expiry = ref[:7]
    props, _ = properties_from_headers([(n, base64.b64decode(v)) for n, v in headers])
    expiry_at = None if expiry is None else time.monotonic() + expiry - age_s
    msg = Message(topic, base64.b64decode(payload), qos, bool(retain), props, expiry_at, None)
    if len(ref) > 8 and ref[7] is not None:
        # a copy with its position: delivered with it, never read back from a log (remote)
        msg.device, msg.offset, msg.remote = ref[7], ref[8], True
    return msg


def _fingerprint(s: Session) -> tuple:
    """Changes whenever delivery progress moved (a send allocates a packet id, an ack shrinks
    the window): cheap enough to take for every session at every checkpoint tick."""
    return (s.conn is None, s.next_pid, len(s.inflight), len(s.queue), s.queue.nbytes,
            len(s.lag), s.lag_behind, len(s.incoming_qos2))


class SessionPersistence(SessionHooks):
    """Writes session records, restores them at start-up, checkpoints and compacts."""

    def __init__(self, router: RouterPort, committer: GroupCommitter, retain: RetainPersistence,
                 interval: float) -> None:
        self.router = router
        self.committer = committer
        self.store = committer.store
        self.log = StateLog(committer, SESSIONS_KEY)
        self.retain = retain
        self.interval = interval
        self._dirty: dict[str, None] = {}  # client ids to write (insertion-ordered set)
        # acknowledgements waiting for the records of this tick: (connection, then, args)
        self._waiters: list[tuple[Connection | None, Callable[..., object], tuple]] = []
        # client ids with a live record -> (fingerprint at the last write, monotonic time)
        self._stored: dict[str, tuple[tuple | None, float]] = {}
        self._offline_at: dict[str, float] = {}  # client id -> wall time it went offline
        self._timer: Any = None
        self.resume_points = ResumePoints(router)
        self.restored = 0
        self.expired = 0
        self.lost = 0  # window/queue entries whose log record retention had deleted
        self.corrupt = 0
        committer.before_flush(self._write_dirty)

    # -- the router's hooks ------------------------------------------------------------
    def connected(self, session: Session) -> None:
        cid = session.client_id
        self._offline_at.pop(cid, None)
        if session.expiry_interval or cid in self._stored:
            self._mark(cid)

    def went_offline(self, session: Session) -> None:
        if session.expiry_interval:
            self._offline_at[session.client_id] = time.time()
            self._mark(session.client_id)

    def ended(self, session: Session) -> None:
        cid = session.client_id
        self._offline_at.pop(cid, None)
        if cid in self._stored:
            self._mark(cid)

    def stored(self, session: Session | None, then: Callable[..., object], *args: Any) -> None:
        if session is None or not session.expiry_interval:
            then(*args)
            return
        self._mark(session.client_id)
        self._waiters.append((session.conn, then, args))

    # -- writing ---------------------------------------------------------------------------
    def _mark(self, cid: str) -> None:
        self._dirty[cid] = None
        self.committer.request_flush()

    def _write_dirty(self) -> None:
        """Before-flush hook: one record per changed session, in this tick's batch, and the
        acknowledgements that waited for them released once it is durable."""
        if not self._dirty and not self._waiters:
            return
        dirty, self._dirty = self._dirty, {}
        waiters, self._waiters = self._waiters, []
        try:
            for cid in dirty:
                self._write(cid)
        except LogWriteError as err:
            # written again with the next batch (not re-requested: no spin on a failing disk)
            self._dirty.update(dict.fromkeys(c for c in dirty if c not in self._dirty))
            self._release(waiters, err)
            return
        if waiters:
            self.committer.when_durable(lambda exc: self._release(waiters, exc))

    def _write(self, cid: str) -> None:
        session = self.router.sessions.get(cid)
        if session is not None and session.expiry_interval:
            self.log.append(cid, self._encode(session))
            self._stored[cid] = (_fingerprint(session), time.monotonic())
        elif cid in self._stored:
            self.log.append(cid, b"")  # tombstone
            del self._stored[cid]

    def _release(self, waiters: list[tuple[Connection | None, Callable[..., object], tuple]],
                 exc: BaseException | None) -> None:
        for conn, then, args in waiters:
            if conn is not None and conn.closing:
                continue
            if exc is None:
                then(*args)
            elif conn is not None:
                # never acknowledge what was not stored: the client retries after reconnecting
                log.error("session state not stored (%s): closing the client unacknowledged",
                          exc, extra={"client_id": conn.client_id})
                conn.close_reason = f"session state not stored: {exc}"
                conn.close(Reason.UNSPECIFIED_ERROR)

    def export(self, s: Session) -> bytes:
        """For another router (a takeover across the mesh): every queued or in-flight message
        a copy, and the positions of the session's log cursors (what it still has to read
        from the logs): the new router reads those logs where they are, from their owners."""
        return self._encode(s, copies=True)

    def adopt(self, client_id: str, state: bytes) -> None:
        """A session another router handed over: installed as if restored, then written."""
        data = json.loads(state)
        if data.get("v") != _VERSION:
            raise ValueError(f"unknown session record version {data.get('v')!r}")
        now = time.time()
        self._restore_one(client_id, data, now, now, now)
        self._mark(client_id)

    def portable(self, s: Session) -> bytes:
        """For the session registry in Raft (cluster/sessionreg.py), read by whichever router
        the client comes back to when this one is gone with its disk: positions, never copies
        (a Raft entry must stay small). Every logged message in the window or the queue
        becomes the lowest offset still owed in its device log, so the next router reads it
        again from the log (at least once, in order; a QoS 2 message the client had received
        comes again as a new message, as Kafka's consumers re-read after a rebalance). Unlogged
        messages are dropped (live pub/sub: lost with a node, as they are on kill -9). What is
        left is bounded by the session's own limits: its subscriptions, one position per
        device (``mqtt.max_lagging_devices``) and its QoS 2 packet ids (receive maximum)."""
        data = json.loads(self._encode(s))
        behind: dict[str, int] = data["behind"]
        for ref in [entry[-1] for entry in data["inflight"]] + [e[-1] for e in data["queue"]]:
            if ref[0] == "L":
                device, offset = ref[1], ref[2]
            elif len(ref) > 7 and ref[7] is not None:  # a copy of another router's record
                device, offset = ref[7], ref[8]
            else:
                continue
            if offset < behind.get(device, _FAR):
                behind[device] = offset
        data["inflight"], data["queue"] = [], []
        return json.dumps(data, separators=(",", ":")).encode()

    def resume(self, client_id: str, state: bytes) -> bool:
        """A session from the registry (``portable``), its old router gone: installed as if
        restored here, its expiry counted from when it went offline there (wall clock)."""
        data = json.loads(state)
        if data.get("v") != _VERSION:
            raise ValueError(f"unknown session record version {data.get('v')!r}")
        now = time.time()
        since = data["offline_at"] if data.get("offline_at") is not None else now
        if not self._restore_one(client_id, data, since, now, now):
            return False
        self._mark(client_id)
        return True

    def _encode(self, s: Session, copies: bool = False) -> bytes:
        now_us = time.time_ns() // 1000
        logs = self.router.logs
        oldest = logs.oldest_unrouted_us() if logs is not None else None
        resume = min(now_us, oldest if oldest is not None else now_us) - CLOCK_MARGIN_US
        top: dict[str, int] = {}  # highest logged offset in the window, per device
        behind: dict[str, int] = {}  # lowest logged offset still owed, per device
        inflight = []
        for pid, d in s.inflight.items():
            m = d.msg
            if m.device is not None and not m.remote and d.group is None \
                    and m.offset > top.get(m.device, -1):
                top[m.device] = m.offset
            inflight.append([pid, d.qos, d.state, int(d.retain), list(d.sub_ids or ()),
                             int(d.position), _msg_ref(m, copies)])
        queue = []
        for d in s.queue:
            m = d.msg
            if m.device is not None and not m.remote and d.group is None and not copies:
                if m.offset < behind.get(m.device, _FAR):
                    behind[m.device] = m.offset  # the log holds it: a position, not a copy
                continue
            queue.append([d.qos, int(d.retain), list(d.sub_ids or ()), int(d.position),
                          _msg_ref(m, copies)])
        for device, c in s.lag.items():
            if c.pending_spec is None and c.next < behind.get(device, _FAR):
                behind[device] = c.next
        for device, offset in top.items():
            behind.setdefault(device, offset + 1)  # everything below was acked or is in flight
        if copies:  # another router: copies, and only the cursors' positions (below)
            behind = {device: c.next for device, c in s.lag.items()
                      if not c.live and c.pending_spec is None}
            resume = now_us + CLOCK_MARGIN_US
        pending = pending_since(s)
        if pending is not None:
            # a log whose start its leader has not resolved yet (broker/resumepoints.py) has
            # no position: it resumes from the time it was to be read from, or earlier
            resume = min(resume, pending)
        for device, offset in s.positions.items():
            # where delivery got to in every other log (broker/positions.py): a restart reads
            # again what came after this checkpoint, a move what went to the old router
            behind.setdefault(device, offset)
        subs = []
        for key, sub in s.subscriptions.items():
            r = sub.replay
            if r is not None and r.next < 0:
                continue  # its owner has not said where it starts: not acknowledged yet
            replay = None if r is None else [r.device, min(r.next, behind.get(r.device, _FAR))]
            subs.append([key, sub.filter, sub.qos, int(sub.no_local),
                         int(sub.retain_as_published), sub.retain_handling, sub.sub_id,
                         sub.group, sub.since_us, replay])
        record = {
            "v": _VERSION, "level": s.level, "expiry": s.expiry_interval, "user": s.username,
            "offline_at": self._offline_at.get(s.client_id) if s.conn is None else None,
            "resume_us": resume, "subs": subs,
            "qos2": [pid for pid, acked in s.incoming_qos2.items() if acked],
            "inflight": inflight, "queue": queue, "behind": behind,
        }
        return json.dumps(record, separators=(",", ":")).encode()

    # -- periodic checkpoint, compaction, shutdown ------------------------------------------
    def start(self) -> None:
        self._timer = self.router.loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        self._timer = self.router.loop.call_later(self.interval, self._tick)
        try:
            self.checkpoint()
            self.retain.maintain()
            if self.log.needs_compaction():
                self.log.compact(self._snapshot())
        except Exception:
            log.exception("session checkpoint failed")

    def checkpoint(self) -> None:
        """Mark the sessions whose delivery progress moved (or that are due a refresh)."""
        now = time.monotonic()
        online = False
        stored = self._stored
        for cid, s in self.router.sessions.items():
            if not s.expiry_interval:
                continue
            online = online or s.conn is not None
            st = stored.get(cid)
            if st is None or st[0] != _fingerprint(s) or now - st[1] > REFRESH_S:
                self._dirty[cid] = None
        if online:
            try:
                # when the broker was last alive: a session online at a crash counts its
                # expiry from here
                self.log.append(_ALIVE, b"1")
            except LogWriteError:
                pass
        if self._dirty:
            self.committer.request_flush()

    def _snapshot(self) -> Iterator[Item]:
        for cid, s in list(self.router.sessions.items()):
            if s.expiry_interval:
                self._stored[cid] = (_fingerprint(s), time.monotonic())
                yield cid, 0, None, self._encode(s)

    def close(self) -> None:
        """Shutdown, after the router drained: every persistent session's state, exactly as
        it is, into the last batch (the committer's close makes it durable)."""
        if self._timer is not None:
            self._timer.cancel()
        for cid, s in self.router.sessions.items():
            if s.expiry_interval:
                self._dirty[cid] = None
        try:
            self._write_dirty()
        except Exception:
            log.exception("session state could not be written at shutdown")

    # -- restore ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Rebuild the sessions at start-up, before any client connects."""
        latest, newest_us = self.log.replay()
        self.corrupt = self.log.corrupt
        now = time.time()
        last_alive = newest_us / 1e6 if newest_us else now
        parsed: list[tuple[float, str, dict, float]] = []
        for cid, rec in latest.items():
            if cid == _ALIVE:
                continue
            self._stored[cid] = (None, time.monotonic())
            try:
                data = json.loads(bytes(rec.payload))
                if data.get("v") != _VERSION:
                    raise ValueError(f"unknown session record version {data.get('v')!r}")
                offline = data["offline_at"]
                since = offline if offline is not None else last_alive
                parsed.append((since, cid, data, rec.timestamp_us / 1e6))
            except Exception as err:  # noqa: BLE001 - one bad record costs one session only
                self._unreadable(cid, err)
        parsed.sort(key=lambda p: p[0])  # offline the longest first, as max_offline_sessions
        for since, cid, data, written in parsed:
            try:
                if not self._restore_one(cid, data, since, written, now):
                    self.expired += 1
                    self._dirty[cid] = None  # a tombstone with the first batch
            except Exception as err:  # noqa: BLE001 - one bad record costs one session only
                self._unreadable(cid, err)
        if self._dirty:
            self.committer.request_flush()

    def _unreadable(self, cid: str, err: Exception) -> None:
        self.corrupt += 1
        log.error("session record of %r unreadable (%r): that session is not restored, the "
                  "others are", cid, err, extra={"client_id": cid})

    def _restore_one(self, cid: str, data: dict, since: float, written: float,
                     now: float) -> bool:
        """``since``: when it went offline (wall clock; the broker's last sign of life for a
        session that was online at a crash)."""
        router = self.router
        expiry = data["expiry"]
        if expiry != NEVER and since + expiry <= now:
            return False  # expired while the broker was down (wall clock)
        s = Session(cid, data["level"])
        s.expiry_interval = expiry
        s.username = data["user"]
        replaying = False
        for key, flt, qos, nl, rap, rh, sub_id, group, since_us, replay in data["subs"]:
            sub = Subscription(flt, qos, bool(nl), bool(rap), rh, sub_id, group)
            sub.since_us = since_us
            if replay is not None:
                sub.replay = (router.logs.cursor(replay[0], replay[1])
                              if router.logs is not None else ReplayCursor(*replay))
                replaying = True
            s.own_subscriptions()[key] = sub
            s.has_no_local = s.has_no_local or bool(nl)
        if data["qos2"]:  # (none: the shared empty map, broker/session.py NO_ENTRIES)
            s.incoming_qos2 = dict.fromkeys(data["qos2"], True)
        age = now - written
        for pid, qos, state, retain, ids, position, ref in data["inflight"]:
            d = self._delivery(ref, qos, retain, ids, position, age)
            if d is not None:
                d.pid, d.state = pid, state
                s.own_inflight()[pid] = d
        for qos, retain, ids, position, ref in data["queue"]:
            d = self._delivery(ref, qos, retain, ids, position, age)
            if d is not None:
                s.own_queue().append(d)
        if s.inflight:
            s.next_pid = max(s.inflight) % 65535 + 1
        router.sessions[cid] = s
        for sub in s.subscriptions.values():
            router.trie.add(sub.filter, cid, sub, sub.group)
        if replaying:
            router.replays.replaying.add(s)
        self._restore_cursors(s, data["behind"], data["resume_us"])
        self._offline_at[cid] = since
        if expiry != NEVER:
            s.expires_at = time.monotonic() + since + expiry - now
            router.schedule(s.expires_at, "expiry", s)
        for old in router.limits.went_offline(s):
            router.end_session(old)
        self.restored += 1
        return True

    def _delivery(self, ref: list, qos: int, retain: int, ids: list[int], position: int,
                  age: float) -> Delivery | None:
        msg = _message(ref, self.store, age)
        if msg is None:
            self.lost += 1
            return None
        return Delivery(msg, qos, bool(retain), tuple(ids) or None, None, bool(position))

    def _restore_cursors(self, s: Session, behind: dict[str, int], resume_us: int) -> None:
        """The session is behind on every device log its subscriptions can read: from the
        exact position the record names, else from its resume point. A device read only by
        offset subscriptions gets no cursor: their replay cursors (restored at the lowest
        position still owed) read it, and a second reader would deliver it twice."""
        catchup = self.router.catchup
        if catchup is None:
            return
        store = self.store
        logs = self.router.logs
        remote = logs.remote_owner if logs is not None else None
        forwarder = self.router.forwarder
        # every log Raft placed, a view (None: the static hash, or no mesh yet: a start-up
        # restore)
        placed = forwarder.devices() if forwarder is not None else None
        devices, replay_only = self._devices_for(s, placed)
        for device, offset in behind.items():
            if device in replay_only:
                continue
            s.own_positions()[device] = offset  # read from here again if its owner comes back
            if remote is not None and remote(device) is not None:
                catchup.restore(s, device, offset)  # read from its owner; nothing new: live
            elif offset < store.high_watermark(device):
                catchup.restore(s, device, offset)
        for device in devices:
            if device in behind:
                continue
            offset = store.offset_for_timestamp(device, resume_us)
            if offset < store.high_watermark(device):
                catchup.restore(s, device, offset)
            elif placed is not None and device in placed and remote is not None \
                    and remote(device) is not None:
                # led by another router, no copy here that reaches the resume time: its
                # leader says where that is (broker/resumepoints.py)
                self.resume_points.start(s, device, resume_us)

    def _devices_for(self, s: Session, placed: Iterable[str] | None = None
                     ) -> tuple[Iterable[str], set[str]]:
        """Device logs a session's QoS>0 subscriptions may read (the one a filter names, like
        ``devices/d1/#``, or all of them for a filter that spans logs, like ``+/temp``), and
        the devices only its offset subscriptions read."""
        logs = self.router.logs
        if logs is None:
            return (), set()
        devices: set[str] = set()
        replayed: set[str] = set()
        spans_all = False
        for sub in s.subscriptions.values():
            if sub.replay is not None:
                replayed.add(sub.replay.device)
                continue
            if sub.group is not None or not sub.qos or sub.filter.startswith("$"):
                continue  # shares are chosen at routing time; QoS 0 is not kept; $ never logged
            device = logs.rules.key_for_filter(sub.filter)
            if device is None:
                spans_all = True
            else:
                devices.add(device)
        if spans_all:
            # every log of the cluster (those Raft placed, ``placed``: a session resumed from
            # the registry reads the logs this router holds no copy of too), or of this store
            if placed is not None:
                return set(placed).union(self.store.keys()), set()
            return self.store.keys(), set()
        return devices, replayed - devices

    def gauges(self) -> dict[str, int]:
        return {"sessions": self.restored, "retained": self.retain.restored,
                "expired_sessions": self.expired, "expired_retained": self.retain.expired,
                "lost_messages": self.lost,
                "corrupt_records": self.corrupt + self.retain.log.corrupt}


def attach(router: RouterPort, committer: GroupCommitter, interval: float) -> SessionPersistence:
    """Restore retained messages and sessions into ``router`` and persist from now on; the
    node calls this before any listener opens."""
    retain = RetainPersistence(committer, router.retained)
    persistence = SessionPersistence(router, committer, retain, interval)
    router.persist = persistence
    t0 = time.monotonic()
    retain.restore()
    persistence.restore()
    if router.logs is not None:
        router.logs.retain_log = retain
    log.info("restored %d persistent sessions and %d retained messages", persistence.restored,
             retain.restored, extra={**persistence.gauges(),
                                     "seconds": round(time.monotonic() - t0, 3)})
    persistence.start()
    return persistence
