"""The leader lease, router side (issue 24, docs/replication.md step 4): a router acknowledges
QoS>=1 publishes only while its node's Raft voter heard from a Raft majority within
``cluster.leader_lease``.

Why: when a node is cut off from the majority, the controller on the majority side elects new
leaders for its logs after ``cluster.node_timeout`` (cluster/controller.py). A leader on the
minority side must have stopped acknowledging by then, or two leaders ack writes for one log
in one epoch and the old one's acks are lost when it rejoins and truncates. Kafka fences a
broker whose controller session timed out the same way, and Raft's leader lease (the Raft
thesis, 6.4.1) is this rule for reads. The config requires node_timeout > leader_lease +
LEASE_SLACK (meshmq/config.py).

How: ``Lease.run`` polls this node's metadata process (op ``lease``, every leader_lease / 5,
at most 0.1 s)
for the moment its voter last knew a majority counted it in (cluster/raftcontact.py); that is a
``time.monotonic()`` reading of the same host's clock, so ``valid()`` compares it with its own.
A metadata process that is frozen, dead or unreachable answers nothing, so the last moment it
reported only gets older: the lease runs out on its own, never the other way.

What a refused publish gets (``refusal``): MQTT 5 has no PUBACK code for "use another server"
(0x9C is a CONNACK and DISCONNECT code), so the router sends DISCONNECT 0x9C with a reason
string and, when it knows one, a Server Reference naming the MQTT address of the node whose
voter leads Raft (``[[cluster.nodes]] mqtt``): the majority side; 3.x clients have their
connection closed. Not at once, though: for ``cluster.lease_hold`` after the lease ran out the
refusal says the publish may wait (``hold_until``), and the router holds it, unstored, until
the lease is valid again (``on_valid``) or that time passes (broker/gatehold.py): every
node's lease runs out for the moment a Raft election takes, and that must not disconnect every
3.x publisher of the cluster. The publish is not stored and not acknowledged; the client
resends it after reconnecting (to another node, from its own list or the reference). CONNECT
is accepted on the minority side, as EMQX and HiveMQ nodes accept connections during a
partition: subscribers keep reading what was committed, QoS 0 flows, and only the publishes
that need a commit are turned away.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from cluster.settings import ClusterSettings

log = logging.getLogger("cluster.lease")

_DIAL_TIMEOUT = 1.0


class Refusal(NamedTuple):
    """Why a publish is refused, and where to go instead (v5 Server Reference, or None);
    ``hold_until``: a ``time.monotonic()`` until which the publish may wait for the lease
    instead (``cluster.lease_hold``, broker/gatehold.py), None when it may not;
    ``on_refused``: called once per publish actually refused (meshmq_lease_refused_total)."""

    reason: str
    server_reference: str | None
    hold_until: float | None = None
    on_refused: Callable[[], None] | None = None


class Lease:
    """This router's leader lease (see the module docstring)."""

    def __init__(self, settings: ClusterSettings, socket_path: str) -> None:
        self.settings = settings
        self.socket_path = socket_path
        self.duration = settings.leader_lease
        self.majority_at = -math.inf  # the voter's last majority contact (time.monotonic())
        self.raft_leader: str | None = None  # "host:port" of the Raft leader, last reported
        self.refused = 0  # publishes refused (meshmq_lease_refused_total)
        # the router's held publishes go on (broker/gatehold.py HeldPublishes.opened)
        self.on_valid: Callable[[], None] | None = None
        self._was_valid = True
        self._task: asyncio.Task | None = None
        self._by_raft = {f"{n.host}:{n.raft_port}": n for n in settings.nodes}

    # -- the answer ---------------------------------------------------------------------------
    def valid(self) -> bool:
        """Whether this router may acknowledge now (``fetcher``'s LeaderState ``lease_ok``)."""
        return time.monotonic() - self.majority_at < self.duration

    def refusal(self) -> Refusal | None:
        """None while the lease holds; else why, for the publish path (broker write gate)."""
        if self.valid():
            return None
        age = time.monotonic() - self.majority_at
        since = "never" if math.isinf(age) else f"{age:.1f} s ago"
        if self._was_valid:
            self._was_valid = False
            log.error("leader lease ran out (this node's Raft voter last heard from a majority "
                      "%s, cluster.leader_lease = %.2f s): QoS>=1 publishes are held for "
                      "cluster.lease_hold = %.1f s (a Raft election), then refused here until "
                      "it has a majority again. Check `meshmq cluster status` and the network "
                      "between the nodes' Raft ports", since, self.duration,
                      self.settings.lease_hold)
        hold = self.settings.lease_hold
        until = self.majority_at + self.duration + hold \
            if hold > 0 and math.isfinite(self.majority_at) else None
        return Refusal(f"not stored: this node is cut off from the cluster majority (Raft "
                       f"contact {since}); publish to another node", self._majority_side(),
                       until, self._refused_one)

    def _refused_one(self) -> None:
        self.refused += 1

    def _majority_side(self) -> str | None:
        """The MQTT address of the node whose voter last led Raft (not this node's)."""
        node = self._by_raft.get(self.raft_leader or "")
        if node is None or node.id == self.settings.node_id or not node.mqtt:
            return None
        return node.mqtt

    # -- the poll -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass

    async def _run(self) -> None:
        # at least every 0.1 s: a long lease must not leave a router refusing for a fifth of
        # it after its first answer came before the voter had a majority (start-up)
        interval = min(self.duration / 5, 0.1)
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.socket_path), _DIAL_TIMEOUT)
            except (OSError, TimeoutError):
                await asyncio.sleep(interval)
                continue
            try:
                while True:
                    writer.write(b'{"op":"lease","id":0}\n')
                    line = await asyncio.wait_for(reader.readline(), self.duration)
                    if not line:
                        break
                    self._heard(json.loads(line))
                    await asyncio.sleep(interval)
            except (OSError, TimeoutError, ValueError):
                pass  # frozen or gone: the lease ages on its own; dial again
            finally:
                writer.close()

    def _heard(self, answer: dict) -> None:
        at = answer.get("majority_at")
        self.raft_leader = answer.get("leader") or self.raft_leader
        if isinstance(at, (int, float)) and at > self.majority_at:
            self.majority_at = float(at)
            if not self._was_valid and self.valid():
                self._was_valid = True
                log.warning("leader lease valid again: this node's Raft voter hears a "
                            "majority; publishes are acknowledged again")
                if self.on_valid is not None:
                    self.on_valid()
