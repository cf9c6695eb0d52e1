"""``$SYS/broker/...``: Mosquitto's status topics, so its operators' dashboards and scripts work.

Every ``sys_interval`` seconds the broker publishes, as retained QoS 0 messages, the common set of
Mosquitto's ``$SYS/broker`` tree (see mosquitto.conf(5) ``sys_interval`` and its ``$SYS`` list):
version, uptime, clients (connected, total, maximum, disconnected), messages and bytes received and
sent, publish counts, subscriptions, retained messages, and load averages over 1, 5 and 15 minutes
(exponentially weighted, per minute, as Mosquitto computes them). They go through normal routing,
so the read ACL applies to them like to any topic (``$SYS`` needs a rule that names it,
[MQTT-4.7.2-1]); ``$`` topics are never written to a device log.

In a cluster the same tree is published a second time under ``$SYS/brokers/<node>/<router>/``
(EMQX names its per-node tree ``$SYS/brokers/<node>/``), and that one crosses the mesh: a
subscriber at any router sees every router's status, retained, while ``$SYS/broker/`` stays the
view of the router a client is connected to (what Mosquitto's tools expect of "the broker").
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from broker.message import Message

if TYPE_CHECKING:
    from broker.router import Router
    from broker.stats import BrokerStats

_PREFIX = "$SYS/broker/"
_LOADS = ((1, "1min"), (5, "5min"), (15, "15min"))


class SysTopics:
    """Publishes the ``$SYS/broker`` tree on a timer."""

    def __init__(self, router: Router, stats: BrokerStats, interval: float, version: str,
                 loop: asyncio.AbstractEventLoop, cluster_prefix: str | None = None) -> None:
        self.router = router
        self.prefixes = (_PREFIX,) if cluster_prefix is None else (_PREFIX, cluster_prefix)
        self.stats = stats
        self.interval = interval
        self.version = version
        self.loop = loop
        self.started = time.monotonic()
        self.max_clients = 0
        self._handle: asyncio.TimerHandle | None = None
        self._last: dict[str, float] = {}
        self._load: dict[str, float] = {}
        self._last_t = self.started

    def start(self) -> None:
        if self.interval > 0:
            self._handle = self.loop.call_soon(self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _counters(self) -> dict[str, float]:
        s = self.stats
        listeners = s.listeners.values()
        return {
            "messages/received": s.packets_in[3] + sum(s.packets_in[4:8]),
            "messages/sent": s.packets_out[3] + sum(s.packets_out[4:8]),
            "publish/messages/received": s.packets_in[3],
            "publish/messages/sent": s.packets_out[3],
            "bytes/received": sum(ls.bytes_in for ls in listeners),
            "bytes/sent": sum(ls.bytes_out for ls in listeners),
            "connections": sum(ls.connections_total for ls in listeners),
        }

    def _tick(self) -> None:
        now = time.monotonic()
        r = self.router
        connected = sum(1 for sess in r.sessions.values() if sess.conn is not None)
        self.max_clients = max(self.max_clients, connected)
        counters = self._counters()
        values: dict[str, object] = {
            "version": f"meshmq version {self.version}",
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": connected,
            "clients/active": connected,
            "clients/disconnected": len(r.sessions) - connected,
            "clients/total": len(r.sessions),
            "clients/maximum": self.max_clients,
            "subscriptions/count": len(r.trie),
            "retained messages/count": len(r.retained),
            "messages/stored": len(r.retained),
        }
        for key, value in counters.items():
            if key != "connections":
                values[key] = value
        # Load averages: per-minute rates smoothed over 1/5/15 minutes, as Mosquitto does.
        dt = max(now - self._last_t, 1e-3)
        for key, value in counters.items():
            rate = (value - self._last.get(key, value)) * 60.0 / dt
            for minutes, label in _LOADS:
                name = f"load/{key}/{label}"
                k = math.exp(-dt / (60.0 * minutes))
                prev = self._load.get(name, rate)
                self._load[name] = prev * k + rate * (1 - k)
                values[name] = f"{self._load[name]:.2f}"
        self._last = counters
        self._last_t = now
        for key, value in values.items():
            payload = str(value).encode()
            for prefix in self.prefixes:
                r.publish_internal(Message(prefix + key, payload, 0, True, None, None, None))
        self._handle = self.loop.call_later(self.interval, self._tick)
