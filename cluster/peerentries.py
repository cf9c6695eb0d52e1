"""What a router does with the entries a peer's link delivers (a mixin of ``Mesh``): a plain
DELIVER routed inline, a run of them routed as one (``on_deliveries``), a logged DELIVER
checked against the deposed-leader fence, an APPEND fenced, answered from the log when this
router's previous run stored it, or appended; RETAIN, SHARE and RETAIN_SYNC handed on. One bad
entry is counted and skipped, never raised: raising would close the link, and the resend
after the reconnect would fail again, forever.

Kept apart from cluster/mesh.py (the links, routes, forwarding and reads) because it is the
receiving half of every crossing, and the mesh module had grown past ~600 lines.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.message import Message
from cluster import frames
from cluster.fencing import Fenced, append_refusal
from cluster.idempotence import source_value
from cluster.sendrun import plain_run_end
from commitlog.store import LogWriteError

if TYPE_CHECKING:
    from cluster.link import MeshLink

_DELIVER = frames.DELIVER


class PeerEntries:
    """A peer's entries, applied (a mixin of ``Mesh``; see the module docstring)."""

    def on_entries(self, link: MeshLink, entries: list[frames.Entry]) -> None:
        router = self.router
        now = time.monotonic()
        for e in entries:
            try:
                if e.kind == _DELIVER and e.device is None and e.expiry is None:
                    # the plain DELIVER (an unlogged publish, no expiry), inline: ``_apply``
                    # would do exactly this, one call later
                    router.route(Message(e.topic, e.payload, e.qos, e.retain, e.properties,
                                         None, e.origin), False)
                    continue
                self._apply(link, router, e, now)
            except Exception as err:  # noqa: BLE001 - one bad entry must not wedge the link:
                # raising here would close it, and the resend after the reconnect would fail
                # again, forever
                self.entry_failures += 1
                self._entry_log("a mesh entry could not be applied, skipped (counted in "
                                "meshmq_link_entry_failures_total): %r", err,
                                extra={"peer": link.peer, "topic": e.topic})

    def on_deliveries(self, link: MeshLink, msgs: list[Message]) -> None:
        """Plain DELIVERs the compiled codec decoded straight to messages (unlogged, no
        expiry: ``MeshLink._on_entries_frame``), routed as ``on_entries`` routes them; a run
        of QoS 0 ones on one topic from one client (a fast publisher's, forwarded as a run:
        ``forward_run``) routed as one (``route_run``, broker/publishrun.py)."""
        route = self.router.route
        run_end = frames.c_plain_run_end or plain_run_end  # (one call a run, not a step a msg)
        n = len(msgs)
        i = 0
        while i < n:
            msg = msgs[i]
            j = run_end(msgs, i)
            try:
                if j - i > 1 and self.router.route_run(msgs[i:j]):
                    i = j
                    continue
            except Exception as err:  # noqa: BLE001 - as in on_entries: the link goes on
                self._entry_failed(link, msg, err, j - i)
                i = j
                continue
            for msg in msgs[i:j]:
                try:
                    route(msg, False)
                except Exception as err:  # noqa: BLE001 - as in on_entries: the link goes on
                    self._entry_failed(link, msg, err, 1)
            i = j

    def _entry_failed(self, link: MeshLink, msg: Message, err: Exception, n: int) -> None:
        self.entry_failures += n
        self._entry_log("a mesh entry could not be applied, skipped (counted in "
                        "meshmq_link_entry_failures_total): %r", err,
                        extra={"peer": link.peer, "topic": msg.topic})

    def _apply(self, link: MeshLink, router: Any, e: frames.Entry, now: float) -> None:
        expiry_at = None if e.expiry is None else now + e.expiry
        msg = Message(e.topic, e.payload, e.qos, e.retain, e.properties, expiry_at, e.origin)
        kind = e.kind
        if kind == frames.DELIVER:
            if e.device is not None:  # stored in its owner's log, not in ours
                if e.epoch >= 0 and not self.deliver_fence.admit(e.device, e.epoch, link.peer):
                    link.stats["deliveries_fenced"] += 1  # a deposed leader's: read instead
                    return
                msg.device = e.device
                msg.offset = e.offset
                msg.remote = True
            if e.group == frames.AGAIN:  # found stored by the peer's previous run
                router.route_again(msg, False)
            else:
                router.route(msg, forward=False)
        elif kind == frames.APPEND:
            if e.group is not None:  # the client's identity, for a resend's lookup
                msg.publisher, msg.maybe_stored = frames.publisher_of(e.group)
            slot = link.append_pending(e.seq)
            inc = link.peer_incarnation
            placer = self.placer
            if placer is not None and (e.epoch > self.placement.epoch_of(e.device)
                                       or not self.placement.placed(e.device)
                                       or e.device in placer.peers_waiting):
                # Raft placement: the peer heard that this router leads the log (or at which
                # epoch) before this router did (the compare-and-set or the election answered
                # there first): checked once this router's placement has it, or at
                # cluster.append_timeout (cluster/raftplace.py)
                placer.when_placed(e.device, lambda: self._append_from_peer(
                    link, router, e, msg, slot, inc), e.epoch)
                return
            self._append_from_peer(link, router, e, msg, slot, inc)
        elif kind == frames.RETAIN:
            self.retain_sync.on_retain(link, msg, e.seq)
        elif kind == frames.SHARE or kind == frames.SHARE_ON:
            if e.device is not None:
                msg.device = e.device
                msg.offset = e.offset
                msg.remote = True
            router.shared.deliver_share(msg, *e.group, last_hop=kind == frames.SHARE_ON)
        elif kind == frames.RETAIN_SYNC:
            self.retain_sync.on_sync(link, msg, e.seq)

    def _append_from_peer(self, link: MeshLink, router: Any, e: frames.Entry, msg: Message,
                          slot: Any, inc: Any) -> None:
        """A peer's APPEND: fenced unless this router leads the log at its epoch, answered from
        memory when our previous run stored it, else appended (answered once durable)."""
        fenced = append_refusal(self.placement, self.rid, e.device, e.epoch)
        if fenced is not None:  # before the resend check: a non-leader answers nothing
            link.stats["appends_fenced"] += 1
            self._fenced_log("%s (counted in meshmq_link_appends_fenced_total)", fenced,
                             extra={"peer": link.peer, "device": e.device})
            link.append_done(slot, inc, Fenced(fenced), -1)
            return
        try:
            found = link.resends.stored_at(router.logs.store, e.device, e.seq, inc)
            if found is None:
                router.remote.append_for_peer(e.device, msg, e.expiry, (link, slot, inc),
                                              source_value(inc, e.seq, self.rid))
                return
        except Exception as err:  # noqa: BLE001 - LogWriteError or worse: the publisher
            # is refused ("not stored"), and the slot must not hold the link's ACK forever
            link.append_done(slot, inc, err, -1)
            if not isinstance(err, LogWriteError):
                raise
            return
        # our previous run stored it: answer with its offset, store nothing. It may have
        # died between its fsync and routing it (and its DELIVERs to peers died with it):
        # route it again, at least once for subscribers (a replaying one drops an offset
        # it already has), as the second copy was routed before this check existed
        link.resends.found += 1
        link.append_done(slot, inc, None, found)
        msg.device = e.device
        msg.offset = found
        router.route_again(msg)
