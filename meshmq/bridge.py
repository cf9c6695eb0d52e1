"""The MQTT bridge: this broker connected to another one, topics carried each way (``[[bridge]]``).

Mosquitto's and EMQX's bridges keep outbound messages in memory (Mosquitto: the bridge's
client queue; EMQX: a replayq buffer) and lose or cap them when the remote is away longer. Here
the promise is the broker's own: *a remote outage or a restart is a lag, never a loss*. So a
bridge holds no queue of its own. Each bridge is two MQTT connections:

- **local**: an in-process connection into this router (a socket pair handed to the router's
  own ``Connection``, ``trusted``: no password check), client id ``$bridge/<name>``, MQTT 5, a
  persistent session (clean start 0, session expiry "never") subscribed to every outbound
  topic with QoS 1, No Local and Retain As Published. That session *is* the bridge's stored
  position: while the remote is away the session is offline and falls behind on each device
  log it reads (``broker/catchup.py``, ``broker/cursors.py``): a cursor per device, not a copy
  per message; its delivery positions are checkpointed with the session (``mqtt.persistence``,
  every ``mqtt.persistence_interval``), so after a restart, kill -9 included, it reads every
  log from its checkpoint (``broker/positions.py``): what the remote acknowledged after the last
  checkpoint goes again (QoS 1 is at least once), nothing is skipped. A local QoS 1 delivery is
  acknowledged (PUBACK to the router) only when the remote's PUBACK for it came back; a
  connection lost on either side drops both, and the session resends its window with DUP.
  Unlogged outbound topics (``log = false`` rules) wait in that session's queue, bounded by
  ``mqtt.max_queued_messages`` / ``max_queued_bytes`` (past it ``queue_full_policy``, counted in
  ``meshmq_messages_dropped_total{reason="queue_full"}``), as any offline session's do.
- **remote**: a client of the other broker (TCP or TLS), with its own persistent session (clean
  start 0, so the remote keeps inbound messages while the bridge is away, as Mosquitto's
  ``cleansession false`` bridges do), subscribed to the inbound topics. An inbound QoS 1 message
  is published into the local session at QoS 1 and the remote gets its PUBACK only when this
  broker acknowledged it (stored, when its topic is logged); a local refusal that may pass
  later (a full disk) closes the remote connection unacknowledged, so the remote sends it again;
  one no resend can change (ACL, size: ``_DEFINITE_IN``) is let go, counted and logged, or it
  would come first after every reconnect and hold up everything behind it.

**Loops** (direction ``both``): the local subscription has No Local, so what the bridge
publishes here does not come back to it (the origin is kept in the log record for a lagging
read: ``broker/catchup.py``); on the remote, MQTT 5 subscriptions have No Local, and an MQTT
3.1.1 bridge sets bit 0x80 of the CONNECT protocol level (Mosquitto's ``try_private``), which
makes Mosquitto treat the connection as a bridge and not send its own publishes back.

**Which router runs it** (a cluster): each router process reads the same ``[[bridge]]`` list and
runs a bridge only where the rendezvous hash (highest random weight) of the bridge's name picks
it among the routers it sees alive (itself and each peer whose mesh link is up), re-checked
every second. Every router computes the same answer from the same link states, so one router
runs it; when that router dies its links go down and the next-ranked router takes over: the
CONNECT of ``$bridge/<name>`` there moves the session, with its positions, from a router still
reachable (handed over), or, under Raft placement, resumes it from the Raft session registry
when its router is dead (``broker/registry.py``: held offsets saved every
``cluster.session_checkpoint_interval``; a log with no saved position is read from the saved
resume time, at its leader when this node has no copy: ``broker/resumepoints.py``). Placement
needs no Raft command. The remote client id is one per cluster (``<cluster.name>.<name>`` by
default), so the remote's persistent session, and what it kept while the bridge moved, follows
the bridge. In a partition each side picks among what it sees, so two routers may run one
bridge: both connect with the same remote client id and the remote keeps one at a time (MQTT's
session takeover); deliveries stay at least once, with more duplicates, until the partition
heals.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.auth import topic_matches
from broker.connection import Connection
from broker.lograte import RateLimitedLog
from broker.message import Message
from broker.protocol.packets import Connect, Publish, SubscriptionOptions
from broker.protocol.properties import Prop
from meshmq.bridgeconfig import BridgeConfig, BridgeTopic
from meshmq.mqttclient import ClientClosed, MqttClient, PacketTooLarge, open_client

log = logging.getLogger("meshmq.bridge")

NEVER = 0xFFFFFFFF  # session expiry: the session outlives any outage
PLACEMENT_CHECK_S = 1.0
# Inbound messages the remote may send before the local connection is up (its persistent
# session's backlog, right after CONNACK): the v5 Receive Maximum the bridge announces, and the
# most it keeps on 3.1.1 (Mosquitto sends at most max_inflight_messages, 20, unacknowledged).
EARLY_MAX = 1000
# After a router starts, bridges wait this long for its mesh links (or until all are up) before
# choosing among the routers seen alive: at start every router sees only itself, and choosing
# at once made both routers of a pair run the bridge and take its session from each other.
STARTUP_GRACE_S = 5.0
# This broker's PUBACK reasons for an inbound message that no resend can change: not
# authorised (the ACL of $bridge/<name>), topic name invalid (mqtt.max_topic_levels...), packet
# too large, payload format invalid. Closing the remote unacknowledged (what a transient refusal
# such as a full disk, 0x80, gets) would have the remote send the same message first after every
# reconnect, forever, and nothing behind it would ever arrive: a poison message. These are let
# go instead, counted and logged, as outbound refusals are and as Mosquitto's bridge drops what
# its local ACL denies.
_DEFINITE_IN = frozenset({0x87, 0x90, 0x95, 0x99})
# Properties a bridged PUBLISH carries on (MQTT 5 both ends); topic alias and subscription ids
# are per connection, the expiry is recomputed by each broker.
_CARRIED = (Prop.PAYLOAD_FORMAT_INDICATOR, Prop.CONTENT_TYPE, Prop.RESPONSE_TOPIC,
            Prop.CORRELATION_DATA, Prop.USER_PROPERTY, Prop.MESSAGE_EXPIRY_INTERVAL)


def state_topic(name: str) -> str:
    """Mosquitto's bridge notification topic: retained "1" connected, "0" not."""
    return f"$SYS/broker/connection/{name}/state"


def pick_router(name: str, routers: Iterable[str]) -> str | None:
    """The router that runs bridge ``name`` among ``routers``: rendezvous (highest random
    weight) hashing, so every router agrees without talking, and a router leaving moves only
    the bridges it ran."""
    best = None
    best_w = b""
    for r in routers:
        w = hashlib.sha256(f"{name}\0{r}".encode()).digest()
        if best is None or w > best_w:
            best, best_w = r, w
    return best


def _carried(props: dict | None) -> dict | None:
    if not props:
        return None
    out = {k: props[k] for k in _CARRIED if k in props}
    return out or None


def _map(topic: str, topics: tuple[BridgeTopic, ...], outbound: bool) -> tuple[str, int] | None:
    """(the other side's topic, the entry's QoS) for ``topic``, by the first matching entry."""
    for t in topics:
        if outbound and t.outbound and topic_matches(t.local_filter, topic):
            return t.remote_prefix + topic[len(t.local_prefix):], t.qos
        if not outbound and t.inbound and topic_matches(t.remote_filter, topic):
            return t.local_prefix + topic[len(t.remote_prefix):], t.qos
    return None


class Bridge:
    """One ``[[bridge]]``: connects, carries, reconnects with backoff until stopped."""

    def __init__(self, cfg: BridgeConfig, router: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.router = router  # broker.router.Router (its public port, plus Connection's owner)
        self.loop = loop
        self.connected = False
        self.messages = {"out": 0, "in": 0}
        self.bytes = {"out": 0, "in": 0}
        self.refused = {"out": 0, "in": 0}
        self.reconnects = 0
        self._task: asyncio.Task | None = None
        self._local: MqttClient | None = None
        self._remote: MqttClient | None = None
        self._held: deque[Publish] = deque()  # local deliveries waiting for the remote's window
        self._early: list[Publish] | None = None  # inbound before the local side was up
        self._refused_log = RateLimitedLog(log, logging.WARNING,
                                           "bridged messages refused by the remote broker",
                                           burst=3, window=10.0)
        self._let_go_log = RateLimitedLog(log, logging.ERROR, "inbound messages this broker "
                                          "can never store, let go", burst=3, window=10.0)

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = self.loop.create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    def lag(self) -> int:
        """Outbound messages stored here and not yet handed to the remote: the local session's
        lag behind its device logs, its queue and what waits for the remote's window."""
        session = self.router.sessions.get(self.cfg.local_client_id)
        if session is None:
            return 0
        behind = 0
        catchup = self.router.catchup
        if catchup is not None:
            behind = sum(catchup.lag_of(session).values())
        return behind + len(session.queue) + len(self._held)

    # -- the connection cycle -------------------------------------------------------------------
    async def _run(self) -> None:
        cfg = self.cfg
        delay = cfg.reconnect_min
        while True:
            started = self.loop.time()
            try:
                await self._connected_once()
            except asyncio.CancelledError:
                self._down("bridge stopped", stopping=True)
                raise
            except (OSError, ClientClosed, TimeoutError, ssl.SSLError) as exc:
                self._down(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the bridge for good
                log.exception("bridge %s failed", cfg.name, extra={"bridge": cfg.name})
                self._down(f"{type(exc).__name__}: {exc}")
            if self.loop.time() - started > cfg.reconnect_max:
                delay = cfg.reconnect_min  # it was up a while: a new outage starts fresh
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.reconnect_max)

    async def _connected_once(self) -> None:
        cfg = self.cfg
        remote = await open_client(cfg.host, cfg.port, self._ssl() if cfg.tls else None,
                                   cfg.level, self._inbound, f"bridge {cfg.name} remote")
        self._remote = remote
        # The remote's session is persistent: right after its CONNACK it sends what it kept
        # for the bridge, before the local side is up. Those wait in ``_early`` (bounded by
        # the Receive Maximum announced here on v5, and by EARLY_MAX on 3.1.1) and are
        # published once the local connection is; dropping them unacknowledged would leave
        # them in the remote's window until the next reconnect (seen in the first run of
        # test_inbound_published_while_meshmq_is_down_arrives).
        self._early = []
        props = ({Prop.SESSION_EXPIRY_INTERVAL: NEVER, Prop.RECEIVE_MAXIMUM: EARLY_MAX}
                 if cfg.level == 5 else None)
        await remote.connect(Connect(cfg.client_id, cfg.level, clean_start=False,
                                     keepalive=cfg.keepalive, username=cfg.username,
                                     password=cfg.password, properties=props),
                             bridge_bit=cfg.level != 5)
        local = await self._open_local()
        self._local = local
        await local.connect(Connect(cfg.local_client_id, 5, clean_start=False, keepalive=0,
                                    properties={Prop.SESSION_EXPIRY_INTERVAL: NEVER}))
        early, self._early = self._early or [], None
        for pkt in early:
            self._inbound(pkt)
        # Local first: its No Local subscription makes this broker keep the origin of what the
        # bridge publishes here (for a lagging read), before the first inbound message comes.
        outbound = [(t.local_filter, SubscriptionOptions(t.qos, no_local=True,
                                                         retain_as_published=True,
                                                         retain_handling=1))
                    for t in cfg.topics if t.outbound]
        if outbound:
            self._check_suback("local", outbound, await local.subscribe(outbound))
        inbound = [(t.remote_filter, SubscriptionOptions(t.qos, no_local=cfg.level == 5,
                                                         retain_as_published=cfg.level == 5))
                   for t in cfg.topics if t.inbound]
        if inbound:
            self._check_suback("remote", inbound, await remote.subscribe(inbound))
        self._up()
        await self._watch(remote, local)

    async def _watch(self, remote: MqttClient, local: MqttClient) -> None:
        """Until either side closes: keepalive pings to the remote (and its silence ends it)."""
        keepalive = self.cfg.keepalive
        ends = [remote.closed, local.closed]
        while True:
            done, _ = await asyncio.wait(ends, timeout=keepalive / 2 if keepalive else None,
                                         return_when=asyncio.FIRST_COMPLETED)
            if done:
                side = "remote" if remote.closed.done() else "local"
                raise ClientClosed(f"{side} connection ended: {next(iter(done)).result()}")
            if self.loop.time() - remote.last_rx > keepalive * 1.5:
                raise ClientClosed(f"remote silent for {keepalive * 1.5:.0f} s (keepalive)")
            remote.ping()

    def _check_suback(self, side: str, subs: list, codes: list[int]) -> None:
        bad = [f"{flt} (0x{code:02X})" for (flt, _), code in zip(subs, codes, strict=False)
               if code >= 0x80]
        if bad:
            hint = ("the remote broker's ACL must allow client " + repr(self.cfg.client_id)
                    if side == "remote" else
                    "this broker's ACL must allow client " + repr(self.cfg.local_client_id))
            raise ClientClosed(f"{side} SUBSCRIBE refused for {', '.join(bad)}: {hint}")

    async def _open_local(self) -> MqttClient:
        """An in-process MQTT connection into this router: a socket pair, the router's own
        ``Connection`` on one end (marked trusted), this client on the other."""
        router = self.router
        ours, theirs = socket.socketpair()
        lstats = router.stats.listener("bridge")
        name = self.cfg.name

        def connection() -> Connection:
            conn = Connection(router, lstats, router.stats)
            conn.trusted = True
            conn.peer = conn.peer_host = f"bridge:{name}"
            return conn

        await self.loop.connect_accepted_socket(connection, sock=theirs)
        reader, writer = await asyncio.open_connection(sock=ours)
        return MqttClient(reader, writer, 5, self._outbound, f"bridge {name} local")

    def _ssl(self) -> ssl.SSLContext:
        cfg = self.cfg
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.cafile)
        if cfg.certfile:
            ctx.load_cert_chain(cfg.certfile, cfg.keyfile)
        if cfg.insecure:
            # Mosquitto's bridge_insecure: the chain is still verified, the host name is not
            ctx.check_hostname = False
        return ctx

    def _up(self) -> None:
        self.connected = True
        log.info("bridge connected", extra={"bridge": self.cfg.name,
                                            "remote": f"{self.cfg.host}:{self.cfg.port}"})
        self._notify(b"1")

    def _down(self, why: str, stopping: bool = False) -> None:
        was = self.connected
        self.connected = False
        for client in (self._remote, self._local):
            if client is not None:
                client.disconnect() if client is self._local else client.close(why)
        self._remote = self._local = None
        self._early = None  # unacknowledged: the remote sends them again
        self._held.clear()  # the local session sends them again (its window, with DUP)
        if stopping:
            # the node is draining, or the bridge moves to another router (which says "1"
            # when it connects: a "0" from here could overwrite it, retained, after it)
            log.info("bridge %s stopped on this router", self.cfg.name,
                     extra={"bridge": self.cfg.name, "was_connected": was})
            return
        log.warning("bridge %s to %s:%d is down: %s; reconnecting with backoff (outbound "
                    "messages wait in the device logs, nothing is dropped)", self.cfg.name,
                    self.cfg.host, self.cfg.port, why,
                    extra={"bridge": self.cfg.name, "was_connected": was})
        if was:
            self._notify(b"0")

    def _notify(self, state: bytes) -> None:
        try:
            self.router.publish_internal(Message(state_topic(self.cfg.name), state, 0, True,
                                                 None, None, None))
        except Exception:  # noqa: BLE001 - a status topic never stops the bridge
            log.exception("bridge state topic not published")

    # -- messages ---------------------------------------------------------------------------------
    def _outbound(self, pkt: Publish) -> None:
        """A delivery from this broker's session: to the remote, acked here once it acks."""
        mapped = _map(pkt.topic, self.cfg.topics, outbound=True)
        local = self._local
        if mapped is None:
            # a subscription an earlier config left in the persistent session: not bridged
            if pkt.qos and local is not None:
                local.puback(pkt.packet_id)
            return
        remote = self._remote
        if remote is None or local is None:
            return  # going down: the session resends it
        if self._held or (pkt.qos and remote.inflight >= remote.receive_maximum):
            self._held.append(pkt)  # (behind what already waits: the log's order is kept)
            return
        self._send_out(remote, local, pkt, mapped[0])

    def _send_out(self, remote: MqttClient, local: MqttClient, pkt: Publish, topic: str) -> None:
        try:
            fut = remote.publish(topic, pkt.payload, pkt.qos, pkt.retain,
                                 _carried(pkt.properties))
        except PacketTooLarge as exc:
            # sent, the remote would close the connection, and the session would send it
            # first again after every reconnect: nothing behind it would ever pass
            self.refused["out"] += 1
            self._refused_log("bridge %s: a message on %r can never be sent to the remote (%s); "
                              "let go (meshmq_bridge_refused_total{direction=\"out\"}): raise "
                              "the remote's maximum packet size to carry such messages",
                              self.cfg.name, topic, exc, extra={"bridge": self.cfg.name})
            if pkt.qos:
                local.puback(pkt.packet_id)
            return
        except ClientClosed:
            return
        self.messages["out"] += 1
        self.bytes["out"] += len(pkt.payload)
        if fut is not None:
            pid = pkt.packet_id
            fut.add_done_callback(lambda f: self._out_acked(remote, local, pid, topic, f))

    def _out_acked(self, remote: MqttClient, local: MqttClient, pid: int, topic: str,
                   fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the remote went away: unacknowledged here, the session sends it again
        reason = fut.result()
        if reason >= 0x80:
            # a definite answer (not authorised, quota...): sending it again would be refused
            # again and hold up every later message; counted and logged, then let go
            self.refused["out"] += 1
            self._refused_log("bridge %s: the remote broker refused a message on %r with "
                              "reason 0x%02X; check its ACL for client %r", self.cfg.name,
                              topic, reason, self.cfg.client_id,
                              extra={"bridge": self.cfg.name})
        local.puback(pid)
        while self._held and remote.inflight < remote.receive_maximum and \
                self._remote is remote:
            held = self._held.popleft()
            mapped = _map(held.topic, self.cfg.topics, outbound=True)
            if mapped is not None:
                self._send_out(remote, local, held, mapped[0])

    def _inbound(self, pkt: Publish) -> None:
        """A message from the remote: published here; its PUBACK waits for this broker's."""
        remote = self._remote
        local = self._local
        # also while the local CONNECT waits for its CONNACK (a claim in the session
        # registry; after a move, up to HANDOVER_WAIT for the dead router): published now,
        # these would go ahead of the ones buffered before, out of the remote's order
        if remote is not None and self._early is not None:
            self._early.append(pkt)  # the local side is not up yet (see _connected_once)
            if len(self._early) > EARLY_MAX:
                remote.close(f"more than {EARLY_MAX} messages before the local side was up")
            return
        mapped = _map(pkt.topic, self.cfg.topics, outbound=False)
        if mapped is None or local is None or remote is None:
            if mapped is None and pkt.qos and remote is not None:
                remote.puback(pkt.packet_id)  # a stale remote subscription: not bridged
            return  # (not connected here yet: unacknowledged, the remote sends it again)
        topic, qos = mapped
        qos = min(pkt.qos, qos)
        try:
            fut = local.publish(topic, pkt.payload, qos, pkt.retain, _carried(pkt.properties))
        except PacketTooLarge as exc:
            # sent, this broker would close the local connection (0x95); the bridge would
            # close the remote, and the remote would send it first again after every reconnect
            self._let_go_in(remote, pkt, topic, f"{exc}: raise mqtt.max_packet_size here to "
                            "carry such messages")
            return
        except ClientClosed:
            return
        self.messages["in"] += 1
        self.bytes["in"] += len(pkt.payload)
        if fut is None:
            if pkt.qos:
                remote.puback(pkt.packet_id)
            return
        pid = pkt.packet_id

        def stored(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                remote.close("local connection lost before the message was stored")
                return
            if f.result() in _DEFINITE_IN:
                self._let_go_in(remote, pkt, topic, f"this broker refused it with reason "
                                f"0x{f.result():02X}; check its ACL and limits for client "
                                f"{self.cfg.local_client_id!r}")
                return
            if f.result() >= 0x80:
                # not stored here (a full disk...): never acknowledged to the remote, which
                # sends it again
                self.refused["in"] += 1
                log.error("bridge %s: this broker refused an inbound message on %r (reason "
                          "0x%02X); closing the remote connection unacknowledged so it is sent "
                          "again", self.cfg.name, topic, f.result(),
                          extra={"bridge": self.cfg.name})
                remote.close("local refusal")
                return
            remote.puback(pid)

        fut.add_done_callback(stored)

    def _let_go_in(self, remote: MqttClient, pkt: Publish, topic: str, why: str) -> None:
        """An inbound message this broker can never store: acknowledged to the remote (so it
        is not sent again ahead of everything behind it), counted and logged."""
        self.refused["in"] += 1
        self._let_go_log("bridge %s: an inbound message on %r was let go: %s "
                          "(meshmq_bridge_refused_total{direction=\"in\"})", self.cfg.name,
                          topic, why, extra={"bridge": self.cfg.name})
        if pkt.qos:
            remote.puback(pkt.packet_id)


class Bridges:
    """Every ``[[bridge]]`` of this router process: which run here, metrics, stop."""

    def __init__(self, configs: tuple[BridgeConfig, ...], router: Any,
                 loop: asyncio.AbstractEventLoop,
                 placement: Callable[[], tuple[str, list[str], int]] | None = None) -> None:
        self.bridges = [Bridge(cfg, router, loop) for cfg in configs]
        self.loop = loop
        # () -> (this router's id, the routers alive as seen from here, how many routers the
        # cluster has); None: one node
        self._placement = placement
        self._timer: asyncio.TimerHandle | None = None
        self._grace_until = 0.0

    def start(self) -> None:
        self._grace_until = self.loop.time() + STARTUP_GRACE_S
        self._place()

    def _place(self) -> None:
        self._timer = self.loop.call_later(PLACEMENT_CHECK_S, self._place)
        if self._placement is None:
            for b in self.bridges:
                b.start()
            self._timer.cancel()
            self._timer = None
            return
        me, alive, everyone = self._placement()
        if len(alive) < everyone and self.loop.time() < self._grace_until:
            return  # links still coming up: a partial view now would run a bridge twice
        for b in self.bridges:
            chosen = pick_router(b.cfg.name, alive)
            if chosen == me and not b.running:
                log.info("bridge %s runs on this router (rendezvous choice among %d live "
                         "routers)", b.cfg.name, len(alive), extra={"bridge": b.cfg.name})
                b.start()
            elif chosen != me and b.running:
                log.info("bridge %s moves to router %s (it is alive and ranks first)",
                         b.cfg.name, chosen, extra={"bridge": b.cfg.name, "to_router": chosen})
                self.loop.create_task(b.stop())

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for b in self.bridges:
            await b.stop()

    def metrics(self) -> list:
        up = GaugeMetricFamily("meshmq_bridge_up", "1 while the bridge is connected to its "
                               "remote broker (Mosquitto's $SYS/broker/connection/<name>/state)",
                               labels=["bridge"])
        active = GaugeMetricFamily("meshmq_bridge_active", "1 on the router that runs the "
                                   "bridge (one per cluster)", labels=["bridge"])
        msgs = CounterMetricFamily("meshmq_bridge_messages", "Messages carried by the bridge "
                                   "(out: to the remote; in: from it)",
                                   labels=["bridge", "direction"])
        nbytes = CounterMetricFamily("meshmq_bridge_bytes", "Payload bytes carried by the bridge",
                                     labels=["bridge", "direction"])
        refused = CounterMetricFamily("meshmq_bridge_refused", "Messages refused by the other "
                                      "side (out: the remote's PUBACK >= 0x80, let go; in: not "
                                      "stored here, sent again by the remote; let go when no "
                                      "resend can change it: ACL, size, topic)",
                                      labels=["bridge", "direction"])
        reconnects = CounterMetricFamily("meshmq_bridge_reconnects", "Bridge connection attempts "
                                         "after a failure or a lost connection",
                                         labels=["bridge"])
        lag = GaugeMetricFamily("meshmq_bridge_lag_messages", "Outbound messages stored here "
                                "and not yet sent to the remote", labels=["bridge"])
        for b in self.bridges:
            name = b.cfg.name
            up.add_metric([name], 1 if b.connected else 0)
            active.add_metric([name], 1 if b.running else 0)
            for d in ("out", "in"):
                msgs.add_metric([name, d], b.messages[d])
                nbytes.add_metric([name, d], b.bytes[d])
                refused.add_metric([name, d], b.refused[d])
            reconnects.add_metric([name], b.reconnects)
            lag.add_metric([name], b.lag() if b.running else 0)
        return [up, active, msgs, nbytes, refused, reconnects, lag]


def attach_bridges(node: Any) -> Bridges | None:
    """Build the node's bridges (None without ``[[bridge]]``) and register their metrics."""
    configs = node.config.bridges
    if not configs:
        return None
    placement = None
    mesh = node.mesh
    if mesh is not None:
        def placement() -> tuple[str, list[str], int]:
            alive = [mesh.rid] + [peer for peer, link in mesh.links.items()
                                  if link.state == "up"]
            return mesh.rid, alive, len(mesh.links) + 1
    bridges = Bridges(configs, node.router, asyncio.get_running_loop(), placement)
    node.metrics.add_collector(bridges.metrics, "bridges")
    return bridges
