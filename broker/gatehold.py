"""Publishes held while the write gate is shut for a moment (a Raft election), not refused.

The write gate (broker/writegate.py) shuts when this node's leader lease runs out
(cluster/lease.py): its Raft voter has not heard from a majority for ``leader_lease``. That
happens on the minority side of a partition, and it also happens on *every* node for the
second or so a Raft election takes after the Raft leader's node dies. Refusing at once then
disconnects every MQTT 3.1.1 publisher of the whole cluster (a closed connection is their
only "not stored") and sends every v5 one away with 0x9C, for an election that ends before
most of them have reconnected.

So a refusal may say until when it is worth waiting (``hold_until``: the lease ran out less
than ``cluster.lease_hold`` ago). The publish is then held here, unstored and unacknowledged
(the client's PUBACK simply takes longer, as it does while a disk is slow), and:

- the gate opens (the voter hears a majority again: ``opened``): every held publish goes on
  where it stopped, in the order they came, *before* any later publish (a later one finds
  publishes held and waits behind them), so a device's publishes keep their order. That
  includes a later QoS 0 publish of a connection with publishes held (``holds``): QoS 0 is
  never refused by the gate, but appended at once it would land in the log ahead of the same
  client's earlier QoS 1 ones (review 7 found the log reading b0, a1 for a1 sent first).
  MQTT orders one client's messages per topic [MQTT-4.6.0-6], and the device log keeps one
  order for every reader; Kafka's idempotent producer keeps a partition's batches in order
  across retries for the same reason;
- ``hold_until`` passes with the gate still shut (a real partition): each is refused as it
  would have been at once (v5 DISCONNECT 0x9C with the Server Reference, 3.x closed); a held
  QoS 0 one goes on as it would have at once (the gate never refuses QoS 0), unless its
  connection was closed by an earlier refusal.

Nothing is stored while the gate is shut, so holding changes when the client hears, never
what was committed: the majority's election of new leaders (after ``node_timeout``) finds
nothing acknowledged here. Kafka's producer waits the same way for a partition without a
leader (``request.timeout.ms``), rather than failing each send at the first NOT_LEADER.

Bounded: at most ``limit`` publishes held per router (``cluster.lease_hold_max``); past it a
publish is refused at once, counted, and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.lograte import RateLimitedLog
from broker.writegate import refuse

if TYPE_CHECKING:
    from broker.connection import Connection

log = logging.getLogger("broker.router")


class HeldPublishes:
    """The router's publishes waiting for its write gate (see the module docstring)."""

    def __init__(self, release_held: Callable[[Connection], None], limit: int) -> None:
        self.release_held = release_held  # the router's: packets held behind a settled one
        self.limit = limit
        # (connection, refusal, store step, refusable: False for QoS 0)
        self.items: deque[tuple[Connection, Any, Callable[[], None], bool]] = deque()
        # connection -> its publishes in ``items``: a later QoS 0 one of it waits behind them
        self.per_conn: dict[Connection, int] = {}
        self.held = 0  # publishes ever held (meshmq_publishes_held_total)
        self.released = 0  # ... and stored after the gate opened
        self.refused = 0  # ... and refused when their hold ran out
        self.full = 0  # refused at once: ``limit`` held already
        self._timer: asyncio.TimerHandle | None = None
        self._full_log = RateLimitedLog(log, logging.WARNING, "publishes refused: the hold "
                                        "for the write gate is full", burst=1, window=5.0)

    def holds(self, conn: Connection) -> bool:
        """Whether ``conn`` has publishes held here (its later QoS 0 ones wait behind them)."""
        return conn in self.per_conn

    def hold(self, conn: Connection, refusal: Any, run: Callable[[], None],
             refusable: bool = True) -> bool:
        """Hold a publish whose store step is ``run``; False when it must be refused now (or,
        ``refusable`` False: a QoS 0 one, stored now)."""
        until = getattr(refusal, "hold_until", None)
        if until is None or until <= time.monotonic():
            return False
        if len(self.items) >= self.limit:
            if not refusable:
                return False  # QoS 0: stored now, as when nothing is held
            self.full += 1
            self._full_log("%d QoS>=1 publishes held for the write gate already "
                           "(cluster.lease_hold_max): this one refused", len(self.items))
            return False
        conn.unsettled += 1  # what the client sends after it waits behind it (router)
        self.items.append((conn, refusal, run, refusable))
        self.per_conn[conn] = self.per_conn.get(conn, 0) + 1
        self.held += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(_loop_time(until), self._expire)
        return True

    def opened(self) -> None:
        """The gate is open again: every held publish goes on, in order."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, self.items = self.items, deque()
        self.per_conn.clear()
        for conn, _, run, _ in items:
            conn.unsettled -= 1
            if conn.closing or conn.session is None:
                continue  # not stored, not acknowledged: the client resends after reconnecting
            self.released += 1
            self._go_on(conn, run)

    def _go_on(self, conn: Connection, run: Callable[[], None]) -> None:
        try:
            run()
        except Exception:  # noqa: BLE001 - one publish's failure must not strand the rest
            log.exception("a held publish failed to go on", extra={
                "client_id": conn.client_id})
        self._settled(conn)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        while self.items:
            conn, refusal, run, refusable = self.items[0]
            until = getattr(refusal, "hold_until", None)
            if until is not None and until > now:
                self._timer = asyncio.get_running_loop().call_at(_loop_time(until),
                                                                 self._expire)
                return
            self.items.popleft()
            left = self.per_conn.pop(conn, 1) - 1
            if left:
                self.per_conn[conn] = left
            conn.unsettled -= 1
            if conn.closing or conn.session is None:
                continue
            if not refusable:  # QoS 0: the gate never refuses it; it waited for order only
                self._go_on(conn, run)
                continue
            self.refused += 1
            refuse(conn, refusal)

    def _settled(self, conn: Connection) -> None:
        if not conn.unsettled and conn.pending is not None:
            self.release_held(conn)


def _loop_time(monotonic_at: float) -> float:
    """A ``time.monotonic()`` deadline in the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())
