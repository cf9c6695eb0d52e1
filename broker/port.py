"""The router's public port: what the engines beside it may call on it, and nothing more.

The router (``broker/router.py`` and its rooms) owns sessions, subscriptions, retained messages
and wills. The engines that work for it from other modules (``forwarding.py``: the cluster
seam; ``shared.py``: shared subscriptions; ``replay.py``: offset replay; ``sessionstore.py``:
persistent sessions; ``catchup.py``) hold a router and reach it only through the names declared
here, so a reader of one of them knows the whole of what it may do to the router, and the
router may change anything else. rumqttd keeps the same wall between its router and its link
and log modules (they exchange messages through a small set of calls).

``RouterPort`` is a ``typing.Protocol``: ``Router`` satisfies it structurally, without
inheriting it, and this module imports nothing above it (its types only under TYPE_CHECKING,
from modules that import nothing of the router), so any module may type against it without
an import circle. ``tests/test_lint.py`` fails when a module outside the router's own files
touches a ``_name`` of a router.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.devicelogs import DeviceLogs
    from broker.limits import RouterLimits
    from broker.message import Message
    from broker.protocol.packets import Connect, Packet, Will
    from broker.retained import RetainedStore
    from broker.session import Session
    from broker.settings import BrokerSettings
    from broker.stats import BrokerStats
    from broker.trie import SharedGroup, SubscriptionTrie


class ReplayState(Protocol):
    """The offset replay engine as the router holds it (``broker/replay.py``, ``Replays``)."""

    replaying: set[Session]  # sessions with a cursor still reading history

    def pump(self, session: Session) -> None:
        """Advance ``session``'s replay cursors while its window and socket have room."""


class RouterPort(Protocol):
    """The names of the router that modules beside it use (see the module docstring)."""

    settings: BrokerSettings
    stats: BrokerStats
    loop: asyncio.AbstractEventLoop
    sessions: dict[str, Session]
    trie: SubscriptionTrie
    retained: RetainedStore
    limits: RouterLimits
    logs: DeviceLogs | None
    catchup: Any  # broker.catchup.LogCatchUp, or None without a commit log
    forwarder: Any  # broker.forwarding.Forwarder, or None on a single node
    # broker.registry.RegisteredSessions: the cluster-wide session registry (Raft placement;
    # the node wiring sets it), or None: a single node, or the mesh's CLAIM asks the peers
    registry: Any
    persist: Any  # broker.sessionstore.SessionHooks
    replays: ReplayState

    # -- packets and writes -------------------------------------------------------------------
    def handle_packets(self, conn: Connection, packets: list[Packet]) -> None:
        """Process a batch of a client's packets, in order (the listener's entry point)."""

    def release_held(self, conn: Connection) -> None:
        """``conn``'s publishes are all settled: process the packets held behind them."""

    def flush_writes(self) -> None:
        """Write every connection's queued bytes now (outside a packet batch: timers, links)."""

    # -- sessions ------------------------------------------------------------------------------
    def finish_connect(self, conn: Connection, pkt: Connect, auth_code: int) -> None:
        """Complete a CONNECT (takeover, session resume, CONNACK) once authenticated and
        claimed from the other routers."""

    def end_session(self, session: Session) -> None:
        """End ``session`` for good: subscriptions, queue and cursors gone, will published."""

    def schedule(self, due: float, kind: str, session: Session) -> None:
        """Run the sweep's ``kind`` ("will" or "expiry") for ``session`` at ``due``
        (time.monotonic())."""

    # -- publishes -------------------------------------------------------------------------------
    def ack_publish(self, conn: Connection, qos: int, packet_id: int | None, reason: int,
                    props: dict | None = None) -> None:
        """Answer a client's QoS 1/2 PUBLISH (PUBACK/PUBREC), success or refusal."""

    def not_stored(self, conn: Connection | None, packet_id: int | None, qos: int,
                   err: BaseException) -> None:
        """A publish was not stored: never acknowledged; v5 hears why, 3.x is closed."""

    def retain(self, msg: Message) -> None:
        """Keep (or clear) ``msg`` as the retained message of its topic, here and on peers."""

    def route(self, msg: Message, forward: bool = True) -> None:
        """Deliver ``msg`` to every matching session (and peers, when ``forward``)."""

    def route_again(self, msg: Message, forward: bool = True) -> None:
        """``route`` for a record found stored by this router's previous run: no QoS 0 copy
        (it may have been routed before that run died)."""

    def route_run(self, msgs: list[Message]) -> bool:
        """Route a peer's run of plain QoS 0 messages (one topic, one origin) as one; False
        when it cannot be, with nothing done (broker/publishrun.py)."""

    def deliver(self, session: Session, msg: Message, granted: int, retain: bool,
                sub_ids: tuple[int, ...] | None, group: SharedGroup | None = None,
                position: bool = False, live: bool = False) -> None:
        """Deliver ``msg`` to one session (ACL, QoS, window or queue)."""

    def publish_will(self, will: Will) -> None:
        """Publish a will: stored first when its topic is logged, like any publish."""
