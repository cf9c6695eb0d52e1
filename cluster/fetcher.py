"""The follower side of replication: Kafka's ReplicaFetcherThread, on the mesh link.

One ``LeaderFetcher`` per leader router this router follows logs of (one per (follower,
leader) pair, as Kafka has one fetcher thread per source broker), holding the
``FollowerState`` (cluster/replica.py) of every device log it follows from that leader. Each
device has at most one FETCH in flight, naming this router as the replica and its last fetched
epoch; the FETCHes of one loop tick leave in one write on the link (the link batches its
requests per flush), and the leader parks a fetch with nothing new up to
``cluster.replica_fetch_wait``, so an idle follower costs one small frame per device per wait.
(A many-device FETCH frame would save the per-device frame heads; not built: measure first.)

An answer with records is appended as received (``append_follower``: framing, CRC, key,
contiguity and epochs checked before anything changes; the bytes stay identical to the
leader's), and the next FETCH of that device leaves only once they are durable here: the fetch
offset is what the leader counts toward its high-water mark, so a follower's log end counts
only what survives its crash. A diverging answer (the leader's log took another turn after
this replica's last fetched epoch) truncates the log where the leader's epoch ended (KIP-279,
answered inside the fetch as in Kafka >= 2.7), never to a locally cached mark. The follower's
visible high-water mark is ``min(leader's, own durable end)``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from broker.lograte import RateLimitedLog
from cluster import frames
from cluster.logserve import FETCH_MAX_RECORDS, RawRecords
from cluster.logverify import LogVerifier
from cluster.replica import Diverging, FollowerState

log = logging.getLogger("cluster.fetcher")

_BACKOFF = 0.2  # seconds before a failed or refused fetch is sent again
_SLACK = 5.0  # seconds a FETCH may take past the leader's parking time before it is failed


@dataclass
class _Follow:
    state: FollowerState
    inflight: bool = False
    leader_end: int = 0  # the leader's durable end at its last answer (lag)


class Fetchers:
    """Every device log this router follows, grouped by leader router (see the module
    docstring). ``mesh`` gives the links and the request registry; ``committer`` the group
    commit the fetched records go through."""

    def __init__(self, mesh: Any, store: Any, committer: Any, fetch_wait: float) -> None:
        self.mesh = mesh
        self.store = store
        self.committer = committer
        self.fetch_wait = fetch_wait
        self.devices: dict[str, _Follow] = {}
        # the role the replica manager asked for last (a start deferred until appends are
        # durable must not revive an older one)
        self._want: dict[str, tuple[str, int]] = {}
        self.stats = {"bytes_in": 0, "truncations": 0, "fetch_failures": 0,
                      "log_start_resets": 0}
        self._log = RateLimitedLog(log, logging.WARNING, "follower fetches failed", burst=3,
                                   window=10.0)
        self.loop: asyncio.AbstractEventLoop = mesh.loop
        # each followed log read end to end once per process before its first FETCH
        self.verifier = LogVerifier(store, self.loop)

    # -- roles (the replica manager's calls) ----------------------------------------------------
    def follow(self, device: str, leader: str, epoch: int) -> None:
        """Fetch ``device``'s log from ``leader`` (at ``epoch``), from this replica's log end."""
        fol = self.devices.get(device)
        self._want[device] = (leader, epoch)
        if fol is not None and fol.state.leader == leader and fol.state.leader_epoch == epoch:
            return
        store = self.store
        # what readers here may see: no more than they saw (a diverged tail is cut below it)
        hw = store.high_watermark(device)
        if hw <= store.durable_end(device):
            store.set_high_watermark(device, hw)
        if store.log_end(device) != store.durable_end(device):
            # appends of its leader days still pending: the log end is known once durable
            self.devices.pop(device, None)
            self.committer.when_durable(lambda _exc: self._start(device, leader, epoch))
            return
        self._start(device, leader, epoch)

    def _start(self, device: str, leader: str, epoch: int) -> None:
        if self._want.get(device) != (leader, epoch):
            return  # unfollowed, or told to follow another leader meanwhile
        store = self.store
        if store.log_end(device) != store.durable_end(device):
            self.loop.call_later(_BACKOFF, self._start, device, leader, epoch)
            return
        if self.verifier.needed(device):  # rot found only when read (cluster/logverify.py)
            self.verifier.verify(device, partial(self._start, device, leader, epoch))
            return
        lost = store.lost_ranges(device, 0, store.durable_end(device))
        if lost:
            self._repair(device, leader, lost[0][0])
        state = FollowerState(leader, epoch, store.durable_end(device),
                              store.latest_epoch(device))
        fol = self.devices[device] = _Follow(state)
        log.info("following device log", extra={"device": device, "leader": leader,
                                                "epoch": epoch, "log_end": state.log_end})
        self._send(device, fol)

    def _repair(self, device: str, leader: str, lost_from: int) -> None:
        """This replica's log has records lost to corruption (quarantined by the store's
        recovery or a reader: a gap readers skip) while its leader holds them. Kept, the hole
        sits below a log end the leader counts as in sync, and electing this replica would
        lose those acknowledged records for good (review5). Truncated to the first lost
        offset, the records are fetched again from the leader; Kafka's log recovery likewise
        cuts a replica at its first corrupt record and lets the fetcher refill it."""
        store = self.store
        to = max(lost_from, store.log_range(device)[0])
        store.truncate(device, to)
        self.stats["truncations"] += 1
        log.warning("device log has records lost to corruption (quarantined) from offset %d: "
                    "truncated there to fetch them again from its leader", to,
                    extra={"device": device, "leader": leader, "truncated_to": to})
        self.committer.request_flush()

    def unfollow(self, device: str) -> None:
        self._want.pop(device, None)
        self.devices.pop(device, None)  # an answer in flight finds it gone and stops

    # -- fetching ---------------------------------------------------------------------------------
    def _send(self, device: str, fol: _Follow) -> None:
        if self.devices.get(device) is not fol or fol.inflight:
            return
        mesh = self.mesh
        link = mesh.links.get(fol.state.leader)
        if link is None or link.state != "up" or link.conn is None:
            self.loop.call_later(_BACKOFF, self._send, device, fol)
            return
        offset, last_epoch = fol.state.fetch_request()
        fol.inflight = True

        def failed(why: str, _late: bool) -> None:
            self._failed(device, fol, why)

        req = mesh.requests.open((link,), self.fetch_wait + _SLACK, failed,
                                 f"no answer from leader {fol.state.leader}")
        req.done = RawRecords(partial(self._answered, device, fol))
        link.send_request(frames.encode_fetch(frames.Fetch(
            req.id, device, offset, FETCH_MAX_RECORDS, mesh.rid, last_epoch), link.version))

    def _failed(self, device: str, fol: _Follow, why: str) -> None:
        fol.inflight = False
        self.stats["fetch_failures"] += 1
        self._log("fetch of device log from leader %s failed: %s; fetching again",
                  fol.state.leader, why, extra={"device": device})
        self.loop.call_later(_BACKOFF, self._send, device, fol)

    def _answered(self, device: str, fol: _Follow, r: frames.Records) -> None:
        fol.inflight = False
        if self.devices.get(device) is not fol:
            return  # the role changed meanwhile
        st = fol.state
        if r.status == frames.RECORDS_DIVERGING:
            self._truncate(device, fol, Diverging(r.diverging_epoch, r.diverging_end))
            return
        if r.status == frames.RECORDS_OUT_OF_RANGE and r.log_start > st.log_end \
                and r.leader_epoch == st.leader_epoch:
            # below the leader's log start (an offset above its end is answered diverging)
            self._restart_at(device, fol, r.log_start)
            return
        if r.status != frames.RECORDS_OK:
            why = r.data.decode("utf-8", "replace") or f"status {r.status}"
            self._failed(device, fol, why)
            return
        if r.leader_epoch != st.leader_epoch:
            # the leader and this router disagree on the epoch: one of them has not heard
            # the latest record yet; fetch again shortly (never append another epoch's data)
            self._failed(device, fol, f"leader at epoch {r.leader_epoch}, this replica "
                                      f"follows epoch {st.leader_epoch}")
            return
        fol.leader_end = r.log_end
        if not r.data:
            self._visible(device, r.high_watermark)
            self._send(device, fol)
            return
        try:
            end = self.committer.append_follower(device, r.data, r.leader_epoch)
        except Exception as err:  # noqa: BLE001 - a corrupt or stale answer: never applied
            self._failed(device, fol, f"records not appended: {err!r}")
            return
        self.stats["bytes_in"] += len(r.data)
        hw = r.high_watermark

        def durable(exc: BaseException | None) -> None:
            if self.devices.get(device) is not fol:
                return
            if exc is not None:
                # the write failed and was rolled back: the log end is the durable one again
                st.log_end = self.store.durable_end(device)
                self._failed(device, fol, f"fetched records not stored: {exc}")
                return
            st.on_records(end, self.store.latest_epoch(device))
            self._visible(device, hw)
            self._send(device, fol)  # the offset tells the leader they are durable here

        self.committer.when_durable(durable)

    def _visible(self, device: str, leader_hw: int) -> None:
        """The follower's mark: the leader's, never past what is durable here (Kafka)."""
        hw = min(leader_hw, self.store.durable_end(device))
        if hw >= 0 and device in self.store:
            self.store.set_high_watermark(device, hw)

    def _truncate(self, device: str, fol: _Follow, div: Diverging) -> None:
        store = self.store
        to = fol.state.on_diverging(div, partial(store.end_offset_for_epoch, device))
        start, _ = store.log_range(device)
        to = max(to, start)
        try:
            store.truncate(device, to)
        except Exception as err:  # noqa: BLE001 - retried from the durable end
            fol.state.log_end = store.durable_end(device)
            self._failed(device, fol, f"truncation to {to} failed: {err!r}")
            return
        self.stats["truncations"] += 1
        log.warning("device log diverged from its leader's: truncated (records past the "
                    "leader's epoch end were never committed)",
                    extra={"device": device, "leader": fol.state.leader, "truncated_to": to,
                           "epoch": div.epoch})
        self.committer.request_flush()
        self._send(device, fol)

    def _restart_at(self, device: str, fol: _Follow, leader_start: int) -> None:
        """This replica's log ends below its leader's log start: retention (or
        ``advance_start``) there deleted the offsets it would fetch next, so asking again
        is refused forever and the replica never catches up (a new replica of a
        reassignment, one that came back with an empty or older disk). What it holds is
        only what the leader itself dropped; the log restarts empty at the leader's start
        (``LogStore.reset_start``) and fetches from there: Kafka's
        ReplicaFetcherThread.handleOffsetOutOfRange, ``truncateFullyAndStartAt(leader log
        start)`` (KIP-107). Never backwards: only a start above this log's end gets here
        (an offset above the leader's end is a diverged tail, answered diverging)."""
        store, st = self.store, fol.state
        old_start = store.log_range(device)[0] if device in store else 0
        old_end = store.durable_end(device)
        try:
            store.reset_start(device, leader_start)
        except Exception as err:  # noqa: BLE001 - appends pending here: fetched again later
            st.log_end = store.durable_end(device)
            self._failed(device, fol, f"restarting the log at its leader's start "
                                      f"{leader_start} failed: {err!r}")
            return
        self.stats["log_start_resets"] += 1
        log.warning("device log [%d, %d) ends below its leader's log start %d (retention or "
                    "record deletion on the leader): its records dropped, the log restarts "
                    "empty at %d and fetches from there. Offsets below %d exist on no replica "
                    "any more; readers there get out-of-range (or offset-reset=earliest)",
                    old_start, old_end, leader_start, leader_start, leader_start,
                    extra={"device": device, "leader": st.leader, "old_end": old_end,
                           "new_start": leader_start})
        st.log_end = leader_start
        st.last_fetched_epoch = -1  # no epoch here now: the leader sends the one at its start
        fol.inflight = True  # nothing leaves before the marker is durable

        def durable(exc: BaseException | None) -> None:
            fol.inflight = False
            if self.devices.get(device) is not fol:
                return
            if exc is not None:
                st.log_end = store.durable_end(device)
                self._failed(device, fol, f"log restart at {leader_start} not stored: {exc}")
                return
            # a fetch offset the leader counts must survive this replica's crash, as for
            # fetched records: the next FETCH leaves once the restart is durable
            self._send(device, fol)

        self.committer.request_flush()
        self.committer.when_durable(durable)

    # -- operations -------------------------------------------------------------------------------
    def lag(self) -> int:
        """Records the followed logs are behind their leaders' durable ends, summed."""
        return sum(max(0, f.leader_end - f.state.log_end) for f in self.devices.values())
