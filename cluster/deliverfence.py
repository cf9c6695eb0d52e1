"""Delivery across a leader change: a deposed leader's DELIVERs are fenced, the log fills in.

A device log's leader routes each record to the routers with matching subscribers once the
high-water mark passes it (a DELIVER on each link). When leadership moves (the controller
elects another in-sync replica: the old leader died, froze, or was cut off), two things go
wrong on a subscriber's router if it only takes what arrives:

- **order**: the old leader's DELIVERs still queued on its link (a frozen process, a cut link,
  the link's resend after a reconnect) arrive *after* the new leader's, and the subscriber gets
  a device's older messages behind newer ones (the chaos suite's seed 4242: a frozen leader's
  resent copies behind the new leader's);
- **loss**: the old leader routed a record and died with the DELIVER in its socket buffer. The
  new leader routes only what it inherited above its own high-water mark (it knew the rest was
  committed, hence routed by the old one), so nobody sends that record again.

Kafka has neither problem because consumers *read* by offset, and a fetch carries the leader
epoch the consumer believes (KIP-320): an answer from a deposed leader is refused, and the
consumer resumes from its own position at the new leader. meshmq pushes, but every session
already keeps a position per device log (``broker/positions.py``) and can read a log from it
(``broker/catchup.py``), so it does the same:

- every DELIVER carries the epoch its sender routed the record at (mesh protocol 4);
- a DELIVER whose epoch is below the log's epoch known here (Raft's record, or a newer
  DELIVER seen first) is dropped, counted in ``meshmq_link_deliveries_fenced_total``;
- when the epoch known here rises, every session with a position in that log reads it back
  from there (the catch-up cursor's seam hands each record once, and live DELIVERs of that
  device wait behind the read, so order holds), before the DELIVER that raised it is handed
  on. Raft's record raises it for many logs at once (a failover moves all of a node's logs in
  one proposal): one pass over the sessions per batch.

Not covered: a session with no position in that log (it never got a QoS>0 message of it: a
new subscription, or QoS 0 only) gets the new leader's DELIVERs but not what the old leader
lost; QoS 0 is at most once anyway. A DELIVER from a peer speaking protocol 2 or 3 carries no
epoch and is never fenced (a rolling upgrade delivers as before).

Until Raft's record of the new epoch reaches this router, the router that sent the newer
DELIVER is taken as the log's leader (``leader_ahead``, through ``Mesh.owner_of``): reads go
there, and publishes too (fenced there if this router's epoch is stale: the client retries).

Memory: ``ahead`` holds a log's epoch only between a DELIVER that carried it and Raft's record
of it reaching this router (milliseconds), bounded by ``AHEAD_MAX`` (cleared past it: a stale
DELIVER may then be handed on, as before this module).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("cluster.deliverfence")

AHEAD_MAX = 100_000


class DeliverFence:
    """Decides, per DELIVER, deliver or drop; starts the sessions' reads when an epoch rises."""

    def __init__(self, epoch_of: Callable[[str], int],
                 moved: Callable[[Iterable[str]], int],
                 call_soon: Callable[[Callable[[], None]], Any]) -> None:
        self._epoch_of = epoch_of  # the placement's epoch of a log (-1: no record here yet)
        self._moved = moved  # devices -> sessions' position reads started (broker/positions)
        self._call_soon = call_soon
        # device -> (epoch, router) of a DELIVER seen before Raft's record of that epoch
        self.ahead: dict[str, tuple[int, str]] = {}
        self._pending: set[str] = set()  # raised by Raft's records, read back at the next turn
        self.fenced = 0  # DELIVERs dropped (meshmq_link_deliveries_fenced_total)
        self.reads = 0  # session position reads started by epoch rises

    def admit(self, device: str, epoch: int, sender: str) -> bool:
        """Whether a DELIVER of ``device``'s record routed at ``epoch`` by router ``sender``
        is handed on (-1: a peer of protocol 2 or 3, no epoch on the wire)."""
        if epoch < 0:
            return True
        known = self._epoch_of(device)  # -1: no record of this log here yet
        ahead = self.ahead.get(device)
        if ahead is not None and ahead[0] > known:
            known = ahead[0]
        if epoch == known:
            return True
        if epoch < known:
            self.fenced += 1
            return False
        # newer than anything known here: its leader routed before Raft's record reached us.
        # Read back first, from each session's position, so nothing the old leader lost is
        # missed and this one (routed behind the read) keeps the device's order.
        if known >= 0:
            self._raise(device, epoch, sender)
        elif len(self.ahead) < AHEAD_MAX:
            # new here: no earlier leader routed to us, and Raft places it (no leader known)
            self.ahead[device] = (epoch, "")
        return True

    def leader_ahead(self, device: str) -> str | None:
        """The router that routed ``device``'s records at an epoch newer than this router's
        placement knows (only leaders route), or None. Until Raft's record arrives, reads of
        that log go there: this router may still believe it leads (a deposed leader that was
        frozen or cut off), and a read of its own log would end short of the new leader's
        records while the DELIVERs of those records wait behind the read (chaos seed 3285:
        a persistent session's catch-up went live at its own log end and skipped one)."""
        ahead = self.ahead.get(device)
        if ahead is None or not ahead[1] or ahead[0] <= self._epoch_of(device):
            return None
        return ahead[1]

    def _raise(self, device: str, epoch: int, sender: str) -> None:
        ahead = self.ahead
        if len(ahead) >= AHEAD_MAX:
            log.warning("%d device logs' epochs seen ahead of Raft's records: forgotten "
                        "(is this router's metadata feed stuck?)", len(ahead))
            ahead.clear()
        ahead[device] = (epoch, sender)
        self._pending.discard(device)
        self.reads += self._moved((device,))

    def on_record(self, device: str, rec: dict) -> None:
        """A newer Raft record of ``device`` (the feed's listener, called before the
        placement takes it): when its epoch rises past the one this router knew, the sessions
        read back once the placement names the new leader (batched: ``flush``). A log new
        here (no epoch known: its creation, or the feed's first snapshot) reads nothing:
        there is no earlier leader whose DELIVERs could be missing, and a read per new log
        would walk every session for each device's first publish."""
        epoch = int(rec.get("epoch", 0))
        ahead = self.ahead.get(device)
        if ahead is not None:
            if epoch < ahead[0]:
                return  # a DELIVER brought a newer epoch already, and its read
            del self.ahead[device]
            if epoch == ahead[0]:
                return
        old = self._epoch_of(device)
        if old < 0 or epoch <= old:
            return  # new here, or an ISR change at the same epoch
        if not self._pending:
            self._call_soon(self.flush)
        self._pending.add(device)

    def flush(self) -> None:
        """Read back every log whose epoch rose since the last flush, in one pass."""
        if self._pending:
            devices, self._pending = self._pending, set()
            self.reads += self._moved(devices)
