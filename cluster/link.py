"""``MeshLink``: the one link between this router and one peer router, across reconnects.

The link is the logical thing (sequence numbers, the send window, what the peer has not yet
acknowledged, what we processed of the peer's entries); ``LinkConnection``
(``cluster/connection.py``) is one TCP connection carrying it for a while: thin I/O that feeds
bytes to the frame reader and the handshake and hands whole frames to the link (rumqttd's
link/router split). The link knows the mesh only through ``LinkHost``, declared here.

Delivery guarantees across a flap (the issue's "a link flap loses nothing and duplicates nothing
the peer had acknowledged"): every entry gets a per-link sequence number; the peer acknowledges
cumulatively once it processed an entry (for an APPEND: once its fsync covered it), and in the
handshake each side says the last seq it processed from the other's *incarnation* (a random id
per process start). After a reconnect the sender drops what the peer processed and resends the
rest, except QoS 0 deliveries (at most once, as MQTT QoS 0 is); the receiver drops any entry at or
below what it processed, so a resent entry is never applied twice. A peer that restarted has a
new incarnation and has processed nothing: everything QoS>=1 still unacknowledged goes again
(an APPEND stored just before a kill -9 and not yet acknowledged is found in the log by the
restarted owner and answered with its offset, not stored twice: cluster/idempotence.py).

An APPEND's outcome reaches the publisher's router exactly once, whatever the link does, and an
unknown outcome is never a success: see cluster/outcomes.py.

Flow control: at most ``link_window`` entries may be unacknowledged (the ACK is the credit); the
rest wait in the link's queue, bounded by ``link_max_queued_bytes`` (plain DELIVERs wait as
runs, many entries per queue item, counted per entry all the same: cluster/sendrun.py). Past
that bound a delivery is dropped and an APPEND refused (its publisher gets "not stored"),
counted per link and logged: a slow, paused or dead peer costs memory up to the bound and never
blocks the router or the other links (EMQX's unbounded gen_rpc mailbox and VerneMQ's unbounded
per-node buffer are the counter-examples: both grow without limit while a peer is slow).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from broker.forwarding import OwnerNotStored
from broker.lograte import RateLimitedLog
from cluster import frames
from cluster.connection import LinkConnection
from cluster.fencing import Fenced
from cluster.frames import entry_head, entry_head_epoch
from cluster.handshake import Established
from cluster.idempotence import ResendCheck
from cluster.inbound import InboundSequence
from cluster.linkqueue import LinkQueue
from cluster.outcomes import AppendTimeout, Outcomes
from cluster.routes import RouteTable
from cluster.sendrun import Done, Out, Run
from cluster.settings import ClusterSettings

log = logging.getLogger("cluster.link")

_RETAIN = frames.RETAIN
_RETAIN_SYNC = frames.RETAIN_SYNC
_APPEND = frames.APPEND
_DELIVER = frames.DELIVER
_V_EPOCHS = frames.V_EPOCHS
_V_DELIVER_EPOCHS = frames.V_DELIVER_EPOCHS
_MAX_ENTRIES_FRAME = 1 << 20  # bytes of entries per ENTRIES frame (many frames per write is fine)
_REQUEST_FRAMES = frozenset((frames.CLAIM, frames.CLAIMED, frames.ADMIN_REQUEST,
                             frames.ADMIN_RESPONSE, frames.FETCH, frames.RECORDS,
                             frames.RESOLVE, frames.RESOLVED))



def _tell(done: Done, exc: BaseException | None, offset: int) -> None:
    """Give one publish its outcome. A publisher-side failure (its connection, its session)
    must not escape into the link: from ``_on_results`` it would drop the link for every flow
    on it, from ``expire_appends`` it would stop the append_timeout timer for good."""
    try:
        done(exc, offset)
    except Exception:  # noqa: BLE001 - logged; the other outcomes of the batch go on
        log.exception("answering a publisher for its APPEND's outcome failed")


class LinkHost(Protocol):
    """What a link needs of the mesh it is part of (``cluster.mesh.Mesh``), declared here so
    the link does not import the mesh (the mesh imports the link: one way). The ``on_*``
    calls hand the frames the link does not handle itself (entries, routes, requests) up."""

    settings: ClusterSettings
    rid: str  # this router's id (the resend check matches only what it appended)
    loop: asyncio.AbstractEventLoop
    routes: RouteTable
    connections: set[Any]

    @property
    def links(self) -> Any: ...  # peer -> MeshLink (an accepted connection finds its link)

    def handshake_args(self) -> tuple: ...

    def refused(self, peer: str | None, why: str) -> None: ...

    def want_flush(self, link: MeshLink) -> None: ...

    def local_routes(self) -> list[tuple[int, str, str | None]]: ...

    def link_up(self, link: MeshLink) -> None: ...

    def link_down(self, link: MeshLink) -> None: ...

    def fail_requests(self, link: MeshLink, why: str) -> None: ...

    def peer_routes(self, link: MeshLink, full: bool,
                    changes: list[tuple[int, str, str | None]]) -> None: ...

    def on_entries(self, link: MeshLink, entries: list[frames.Entry]) -> None: ...

    def on_deliveries(self, link: MeshLink, msgs: list[Any]) -> None: ...

    def on_request_frame(self, link: MeshLink, ftype: int, body: bytes) -> None: ...


class LinkFull(OwnerNotStored):
    """The link's queue is at link_max_queued_bytes: the publish is refused, not buffered."""


class MeshLink(LinkQueue):
    def __init__(self, mesh: LinkHost, peer: str, dial: bool, address: tuple[str, int]) -> None:
        self.mesh = mesh
        self.peer = peer
        self.dial = dial
        self.address = address
        self.conn: LinkConnection | None = None
        self.state = "down"
        # set by the mesh while this link waits in its flush of this tick (Mesh.want_flush):
        # a link never sets it itself, so a host that does not set it is called every time
        self.flush_wanted = False
        self.since = time.time()
        self.reconnects = 0
        # the mesh protocol version negotiated by the current (or last) connection: every
        # frame whose bytes depend on it is encoded and decoded with it (cluster/frames.py)
        self.version = frames.MIN_VERSION
        self.rtt_ms: float | None = None
        self._backoff = mesh.settings.reconnect_min
        self._redial: asyncio.TimerHandle | None = None
        self._closed = False
        # send side
        self.next_seq = 1
        self.sent_upto = 0  # the highest seq ever written: above it, an entry never left here
        # Outs and Runs (cluster/sendrun.py: plain DELIVERs, many entries per item)
        self.inflight: deque[Out | Run] = deque()
        self.unsent: deque[Out | Run] = deque()
        self.unacked = 0  # entries in ``inflight``: what link_window bounds
        # the run at the tail of ``unsent`` that plain DELIVERs go onto, None when there is
        # none (emptied whenever ``unsent`` changes otherwise: a flush, an Out, a reconnect)
        self._open: Run | None = None
        self._max_bytes = mesh.settings.link_max_queued_bytes
        self.queued_bytes = 0
        self.awaiting: dict[int, Out] = {}  # seq -> APPEND waiting for its result
        # receive side: what we processed of the peer's current incarnation
        self.inbound = InboundSequence()
        self.acked_out = 0  # the last ACK we sent
        self.outcomes = Outcomes()  # of the peer's APPENDs, to answer a resent one again
        # ... and, for an incarnation first heard after our own start, what our previous run
        # stored of its APPENDs (cluster/idempotence.py)
        self.resends = ResendCheck(mesh.settings.link_window, owner=mesh.rid)
        self.results: list[tuple[int, int, int, str]] = []
        self.routes_dirty: list[tuple[int, str, str | None]] = []
        # log reads (FETCH/RESOLVE) and their answers: written after the routes of the same
        # flush, so a peer installs a replaying subscription's route before it reads for it
        # (the seam between history and live delivery depends on that order; cluster/mesh.py)
        self.requests: list[bytes] = []
        self.stats: dict[str, int] = dict.fromkeys(
            ("msgs_out", "msgs_in", "retained_out", "retained_in", "bytes_out", "bytes_in",
             "frames_out", "frames_in",
             "resent", "dropped_full", "dropped_reconnect", "refused_full",
             "append_timeouts", "expired_unsent", "outcomes_asked", "appends_fenced",
             "deliveries_fenced", "appends_moved"), 0)
        self._timeout_log = RateLimitedLog(
            log, logging.ERROR, f"link to {peer}: publishes refused (cluster.append_timeout)",
            burst=1, window=5.0)
        self._full_log = RateLimitedLog(
            log, logging.WARNING, f"link to {peer}: queue full (cluster.link_max_queued_bytes)",
            burst=1, window=5.0)
        # A full spell's first dropped DELIVER went through _full (counted, logged); the rest
        # of the spell is only counted, in ``deliver``, every 1024th through _full again for
        # the rate-limited line, until one fits again. A peer that stopped reading meets
        # every message routed to it here, and a log call per drop cost the router of the
        # healthy links 0.7 us a message (bench stall_full, 2026-11-27)
        self._dropping = False

    # -- sending (enqueue, deliver, deliver_run: cluster/linkqueue.py) ----------------------
    def send_routes(self, changes: list[tuple[int, str, str | None]]) -> None:
        self.routes_dirty.extend(changes)
        self.mesh.want_flush(self)

    def want_flush(self) -> None:
        """Write what waits at the mesh's next flush (the connection drained, say)."""
        self.mesh.want_flush(self)

    def send_request(self, data: bytes) -> None:
        """A FETCH/RESOLVE or its answer, in order after the routes (see ``requests``)."""
        self.requests.append(data)
        self.mesh.want_flush(self)

    def flush(self) -> None:
        conn = self.conn
        if conn is None or self.state != "up" or conn.paused:
            return
        parts: list[bytes] = []
        if self.routes_dirty:
            parts.append(frames.encode_routes(False, self.routes_dirty))
            self.routes_dirty = []
        if self.results:
            parts.append(frames.encode_results(self.results))
            self.results = []
        if self.requests:
            parts.extend(self.requests)
            self.requests = []
        unsent = self.unsent
        inflight = self.inflight
        room = self.mesh.settings.link_window - self.unacked
        batch: list[bytes] = []
        size = 0
        sent = 0
        in_batch = 0
        retained = 0  # RETAIN/RETAIN_SYNC: state kept everywhere, not publishes (msgs_out)
        epochs = self.version >= _V_EPOCHS
        all_epochs = self.version >= _V_DELIVER_EPOCHS
        if unsent and room > 0:
            self._open = None  # it goes now (or its first part): later ones start a new run
        # what the window lets go, in queue order: a run (many entries) is one step
        while unsent and room > 0:
            out = unsent[0]
            if out.count > room:  # a run larger than the window's room: the part that fits
                out = out.take(room)  # (an Out's count is 1: never split)
            else:
                unsent.popleft()
            inflight.append(out)
            room -= out.count
            sent += out.count
            if type(out) is Run:
                batch.append(out.encode(self.version))
                in_batch += out.count
            else:
                if out.kind == _RETAIN or out.kind == _RETAIN_SYNC:
                    retained += 1
                flags, tlen = out.head
                # the shared body is not copied into a per-link entry
                if all_epochs or (epochs and out.kind == _APPEND):
                    batch += (entry_head_epoch(out.seq, out.kind, flags, tlen, out.epoch),
                              out.body)
                else:
                    batch += (entry_head(out.seq, out.kind, flags, tlen), out.body)
                in_batch += 1
            size += out.size
            if size >= _MAX_ENTRIES_FRAME:
                parts.append(frames.encode_entries_parts(batch, in_batch))
                batch = []
                size = in_batch = 0
        if batch:
            parts.append(frames.encode_entries_parts(batch, in_batch))
        self.unacked += sent
        # never-sent entries follow the sent ones in the queue, in seq order: the last one
        # written is the highest (unless only resent ones went, all below it)
        if sent:
            last = inflight[-1]
            if last.seq + last.count - 1 > self.sent_upto:
                self.sent_upto = last.seq + last.count - 1
        ack = self.inbound.ack_point()
        if ack > self.acked_out:
            parts.append(frames.encode_seq(frames.ACK, ack))
            self.acked_out = ack
        if parts:
            data = b"".join(parts)
            self.stats["msgs_out"] += sent - retained
            self.stats["retained_out"] += retained
            self.stats["bytes_out"] += len(data)
            self.stats["frames_out"] += len(parts)
            conn.write(data)

    # -- the connection ---------------------------------------------------------------------
    def resume_point(self, incarnation: bytes) -> int:
        return self.inbound.resume_point(incarnation)

    @property
    def peer_incarnation(self) -> bytes:
        return self.inbound.incarnation

    def established(self, conn: LinkConnection, est: Established) -> None:
        old = self.conn
        if old is not None and old is not conn:
            # a duplicate: the newest connection wins (the peer redialled because it saw the
            # old one die; keeping the old one would leave both sides disagreeing)
            old.detach()
            old.close()
        if est.peer_incarnation != self.inbound.incarnation:
            # a restarted peer: its seqs start again; our pending APPENDs of its old
            # incarnation still complete, but their acks mean nothing to the new one
            if not self.inbound.incarnation:
                # the first we hear of it since we started: a previous run of ours may have
                # stored some of what it resends now
                self.resends.adopt(est.peer_incarnation)
            else:  # a later one: nothing of it can be in our log (cluster/idempotence.py)
                self.resends.forget()
            self.inbound.reset(est.peer_incarnation)
            self.outcomes.clear()
            self.results = []
        self.conn = conn
        self.version = est.version
        self.state = "up"
        self.since = time.time()
        self._backoff = self.mesh.settings.reconnect_min
        ask = self._acked(est.resume_from, requeue=False)
        resend: deque[Out | Run] = deque(ask)  # processed, outcome lost: asked again (lowest)
        unacked = len(ask)
        for out in self.inflight:  # a run: all of it (the peer drops the seqs it processed)
            if out.qos == 0 and out.kind == frames.DELIVER:
                self.stats["dropped_reconnect"] += out.count
                self.queued_bytes -= out.size
                continue
            resend.append(out)
            unacked += out.count
        self.stats["resent"] += unacked
        self.inflight = deque()
        self.unacked = 0
        resend.extend(self.unsent)
        self.unsent = resend
        self._open = None
        self.acked_out = 0  # the new connection has not heard our ACK yet
        self.routes_dirty = []
        self.requests = []  # never resent: reads of the old connection fail now, and retry
        self.mesh.fail_requests(self, f"the link to {self.peer} reconnected")
        conn.write(frames.encode_routes(True, self.mesh.local_routes()))
        log.info("mesh link up", extra={"peer": self.peer, "version": est.version,
                                        "resend": unacked,
                                        "queued": len(resend) - unacked,
                                        "peer_processed": est.resume_from})
        self.mesh.link_up(self)
        self.flush()

    def lost(self, conn: LinkConnection, why: str) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        if self.state == "up":
            log.log(logging.INFO if self._closed else logging.WARNING, "mesh link down: %s",
                    why, extra={"peer": self.peer})
        self.state = "down"
        self.since = time.time()
        self.mesh.link_down(self)
        self.schedule_dial()

    def schedule_dial(self) -> None:
        if not self.dial or self._closed or self._redial is not None:
            return
        # full jitter (AWS's backoff study): spreads redials of many links after a restart
        delay = random.uniform(self.mesh.settings.reconnect_min, self._backoff)
        self._backoff = min(self._backoff * 2, self.mesh.settings.reconnect_max)
        self._redial = self.mesh.loop.call_later(delay, self.dial_now)

    def dial_now(self) -> None:
        self._redial = None
        if self._closed or self.conn is not None:
            return
        self.state = "connecting"
        self.reconnects += 1
        self.mesh.loop.create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.address
        try:
            await asyncio.wait_for(self.mesh.loop.create_connection(
                lambda: LinkConnection(self.mesh, self), host, port), timeout=2.0)
        except (TimeoutError, OSError) as err:
            if self.state == "connecting":
                self.state = "down"
            log.debug("mesh dial failed: %s", err, extra={"peer": self.peer})
            self.schedule_dial()

    def close(self) -> None:
        self._closed = True
        if self._redial is not None:
            self._redial.cancel()
        if self.conn is not None:
            self.conn.close()

    # -- receiving --------------------------------------------------------------------------
    def on_frame(self, ftype: int, body: bytes) -> None:
        self.stats["frames_in"] += 1
        self.stats["bytes_in"] += len(body) + 5
        if ftype == frames.ENTRIES:
            if frames.c_decode_plain is not None and type(body) is bytes:
                self._on_entries_frame(body)
            else:  # the pure-Python codec: every entry an Entry
                self._on_entries(frames.decode_entries(body, self.version))
        elif ftype == frames.ACK:
            self._acked(frames.decode_seq(body))
        elif ftype == frames.RESULTS:
            self._on_results(frames.decode_results(body))
        elif ftype == frames.ROUTES:
            full, changes = frames.decode_routes(body)
            self.mesh.peer_routes(self, full, changes)
        elif ftype == frames.PING:
            if self.conn is not None:
                self.conn.write(frames.encode_ping(frames.PONG, frames.decode_seq(body)))
        elif ftype == frames.PONG:
            self.rtt_ms = (time.monotonic_ns() - frames.decode_seq(body)) / 1e6
        elif ftype in _REQUEST_FRAMES:  # claims, admin relays, log reads: the mesh's
            self.mesh.on_request_frame(self, ftype, body)
        else:
            raise frames.FrameError(f"unexpected frame type {ftype} on an established link")

    def _on_entries_frame(self, body: bytes) -> None:
        """An ENTRIES frame, with the compiled codec: its leading plain fresh DELIVERs (almost
        every entry: unlogged publishes) decoded straight to messages and routed in one call
        (no Entry, no per-entry ``fresh``: issue 25's cheap crossings); the rest, from the
        first other entry on, as entries, exactly as without the codec. Entries before a
        malformed one are applied before the FrameError closes the link: they are processed
        (our resume point says so), so the resend after the reconnect skips them."""
        count = frames.entry_count(body)
        msgs: list = []
        inbound = self.inbound
        pos, inbound.received = frames.c_decode_plain(
            body, 4, count, frames.epochs_mode(self.version), inbound.received, msgs)
        if msgs:
            self.stats["msgs_in"] += len(msgs)
            self.mesh.on_deliveries(self, msgs)
        rest = count - len(msgs)
        if rest:
            self._on_entries(frames.decode_entries_at(body, pos, rest, self.version))
            return
        if pos != len(body):
            raise frames.FrameError("trailing bytes after the entries")
        self.mesh.want_flush(self)

    def _on_entries(self, entries: list[frames.Entry]) -> None:
        fresh, resent = self.inbound.fresh_of(entries)
        if resent:  # processed before: an APPEND among them is answered with its outcome
            for entry in resent:
                if entry.kind == frames.APPEND:
                    self._answer_again(entry.seq)
        retained = 0
        for entry in fresh:
            if entry.kind == _RETAIN or entry.kind == _RETAIN_SYNC:
                retained += 1
        self.stats["msgs_in"] += len(fresh) - retained
        self.stats["retained_in"] += retained
        if fresh:
            self.mesh.on_entries(self, fresh)
        self.mesh.want_flush(self)

    def _answer_again(self, seq: int) -> None:
        """An APPEND we processed, sent again: its RESULT died with a connection. Answer with
        the outcome we remember; one still waiting for its fsync (above the ACK point) is
        answered when it is durable; one forgotten is "outcome unknown", never a success."""
        self.stats["outcomes_asked"] += 1
        result = self.outcomes.result(seq)
        if result is None:
            if seq > self.inbound.ack_point():
                return  # still pending here: append_done sends its RESULT
            result = (seq, 1, -1, "outcome unknown: no longer remembered by the owner")
        self.results.append(result)

    def append_pending(self, seq: int) -> list:
        return self.inbound.hold(seq)

    def append_done(self, slot: list, incarnation: bytes, exc: BaseException | None,
                    offset: int) -> None:
        if incarnation != self.inbound.incarnation:
            return  # for a previous incarnation of the peer, which is gone
        self.inbound.release(slot)
        seq = slot[0]
        if exc is None:
            self.outcomes.stored(seq, offset)
            self.results.append((seq, 0, offset, ""))
        else:
            why = str(exc) or type(exc).__name__
            status = (frames.RESULT_FENCED if isinstance(exc, Fenced)
                      else frames.RESULT_NOT_STORED)
            self.outcomes.failed(seq, status, why)
            self.results.append((seq, status, -1, why))
        self.mesh.want_flush(self)

    def _acked(self, upto: int, requeue: bool = True) -> list[Out]:
        """The peer processed every entry up to ``upto``. Processed is not stored: an APPEND
        still waiting for its RESULT (which died with a connection) stays queued and is sent
        again, for the peer to answer with its outcome (``_answer_again``); returned, or put
        first in the queue with ``requeue``."""
        inflight = self.inflight
        ask: list[Out] = []
        # a run goes once the ACK covers its last entry (cluster/sendrun.py)
        while inflight and inflight[0].seq + inflight[0].count <= upto + 1:
            out = inflight.popleft()
            self.unacked -= out.count
            if out.done is not None:
                ask.append(out)
                continue
            self.queued_bytes -= out.size
        if ask and requeue:
            self.unsent.extendleft(reversed(ask))
        if self.unsent:
            self.mesh.want_flush(self)
        return ask

    def expire_appends(self, now: float, timeout: float) -> int:
        """APPENDs with no outcome after ``timeout`` s are refused as not stored. One that was
        sent stays queued (the owner may have it, and may store it yet: a duplicate of the
        client's retry, which at least once allows); one never sent (the link down, or its
        window shut, all along) is dropped: it is known not stored, and the owner must not
        store it later (Kafka expires unsent batches from its accumulator the same way).
        ``awaiting`` is in seq order, so in queueing-time order: stop at the first young one.
        One pass, then the callbacks (a dict's first item after deleting its first items is a
        scan, and a refusal may queue a will's APPEND here)."""
        awaiting = self.awaiting
        old: list[Out] = []
        for out in awaiting.values():
            if now - out.at < timeout:
                break
            old.append(out)
        expired = len(old)
        sent_upto = self.sent_upto
        unsent = {out.seq for out in old if out.seq > sent_upto}
        if unsent:
            self.unsent = deque(o for o in self.unsent if o.seq not in unsent)
            self._open = None
            self.queued_bytes -= sum(out.size for out in old if out.seq in unsent)
            self.stats["expired_unsent"] += len(unsent)
        for out in old:
            del awaiting[out.seq]
            done, out.done = out.done, None
            if done is not None:
                _tell(done, AppendTimeout(self.peer, timeout, out.seq <= sent_upto), -1)
        if expired:
            self.stats["append_timeouts"] += expired
            self._timeout_log("%d publishes to owner router %s had no outcome within %g s "
                              "(cluster.append_timeout): refused as not stored (counted in "
                              "meshmq_link_append_timeouts_total); is the owner down, frozen "
                              "or cut off? (meshmq cluster status)", expired, self.peer,
                              timeout, extra={"peer": self.peer, "link": self.state})
        return expired

    def take_appends(self, device: str, epoch: int,
                     resendable: Callable[[Any], bool]) -> list[tuple[Done, Any, bool]]:
        """The APPENDs to ``device``'s log still waiting for their outcome here, in queueing
        order, as (done, retry, sent), except a sent one whose ``retry`` is not
        ``resendable`` (its outcome stays this link's to give). Taken away: their outcome is
        no longer this link's to give (cluster/appendmove.py sends them to the new leader).
        One never sent leaves the queue; one sent stays in the window (the peer's ACK frees
        it) with ``epoch`` in its head, so a resend after a reconnect is fenced there: the
        peer does not lead at it."""
        sent_upto = self.sent_upto
        taken = [out for out in self.awaiting.values()
                 if out.retry is not None and out.retry[0] == device
                 and (out.seq > sent_upto or resendable(out.retry))]
        if not taken:
            return []
        never_sent = set()
        moved: list[tuple[Done, Any, bool]] = []
        for out in taken:
            del self.awaiting[out.seq]
            moved.append((out.done, out.retry, out.seq <= sent_upto))
            out.done = out.retry = None  # its RESULT or ACK now frees it, nothing more
            out.epoch = epoch
            if out.seq > sent_upto:
                never_sent.add(out.seq)
        if never_sent:
            self.unsent = deque(o for o in self.unsent if o.seq not in never_sent)
            self._open = None
            self.queued_bytes -= sum(out.size for out in taken if out.seq in never_sent)
        self.stats["appends_moved"] += len(moved)
        return moved

    def oldest_awaiting(self, now: float) -> float:
        """Seconds the oldest APPEND waiting for its outcome has waited (0 when none)."""
        for out in self.awaiting.values():
            return now - out.at
        return 0.0

    def _on_results(self, results: list[tuple[int, int, int, str]]) -> None:
        awaiting = self.awaiting
        for seq, status, offset, why in results:
            out = awaiting.pop(seq, None)
            if out is None or out.done is None:
                continue
            done, out.done = out.done, None
            _tell(done, None if status == frames.RESULT_STORED
                  else RemoteAppendError(self.peer, why), offset)

    def fail_pending(self, why: str) -> None:
        """At shutdown: APPENDs still waiting get 'not stored' (their publishers resend)."""
        for out in (*self.inflight, *self.unsent):
            if out.done is not None:
                done, out.done = out.done, None
                done(RemoteAppendError(self.peer, why), -1)
        self.awaiting.clear()

    def status(self, local_routes: int) -> dict[str, Any]:
        """``local_routes``: the filters this router advertises (the same for every link)."""
        return {
            "peer": self.peer, "state": self.state, "since": self.since,
            "protocol_version": self.version,
            "address": f"{self.address[0]}:{self.address[1]}",
            "remote": self.conn.remote if self.conn is not None else None,
            "age_s": round(time.time() - self.since, 1), "dials": self.dial,
            "reconnects": self.reconnects,
            "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3),
            "routes_in": self.mesh.routes.count(self.peer),
            "routes_out": local_routes if self.state == "up" else 0,
            "queued": sum(out.count for out in self.unsent), "queued_bytes": self.queued_bytes,
            "unacked": self.unacked, "window": self.mesh.settings.link_window,
            "awaiting_outcome": len(self.awaiting),
            "oldest_awaiting_s": round(self.oldest_awaiting(time.monotonic()), 3),
            # resent APPENDs a previous run of ours had stored, answered from the log
            "resends_found": self.resends.found, "resend_tails_read": self.resends.scanned,
            **self.stats,
        }


class RemoteAppendError(OwnerNotStored):
    def __init__(self, owner: str, why: str) -> None:
        super().__init__(f"owner router {owner} did not store it: {why}")
