"""A bridge that moves to another node loses nothing (issue 27's last gap; meshmq/bridge.py,
"Which router runs it"): a 3-node Raft cluster (``cluster.placement = "raft"``: the session
registry keeps ``$bridge/<name>``'s held offsets in Raft) bridged to a real Mosquitto, and the
node running the bridge killed (-9, every process) while QoS 1 streams flow both ways.

- **Outbound**: a publisher at a surviving node streams QoS 1 on four device logs (two led by
  the node that dies, two by survivors). Every message the cluster acknowledged reaches a
  subscriber on Mosquitto once the bridge runs again elsewhere, in per-device order
  (duplicates allowed and counted: at least once).
- **Inbound**: a publisher on Mosquitto streams QoS 1 on ``commands/...`` while the bridge
  moves; every message reaches a persistent subscriber at a surviving node: the bridge's
  session at Mosquitto (clean start 0) is the same one wherever the bridge runs, so what
  Mosquitto kept for it while it moved is sent to the new router.

Counts decide, never timings: numbered streams, sentinels, generous deadlines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, Client, props, unique
from helpers.cluster import Cluster
from helpers.mosquitto import ALL_MOSQUITTOS, MosquittoProc

from meshmq.bridge import pick_router

pytestmark = pytest.mark.timeout(420)

BRIDGE = "up"


class Counter:
    """A paho subscriber (persistent session, reconnecting by itself) that keeps every copy it
    gets, in arrival order, per topic group (the payload's part before ':')."""

    def __init__(self, host: str, port: int, topic: str, v5_expiry: bool = False) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes

        self.got: list[bytes] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        if v5_expiry:
            self.c = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                 client_id=unique("counter"), protocol=mqtt.MQTTv5)
            connect_props = props(PacketTypes.CONNECT, SessionExpiryInterval=3600)
            kwargs: dict[str, Any] = {"clean_start": False, "properties": connect_props}
        else:
            self.c = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                 client_id=unique("counter"), protocol=mqtt.MQTTv311,
                                 clean_session=False)
            kwargs = {}
        self.c.reconnect_delay_set(0.1, 0.5)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect(host, port, keepalive=5, **kwargs)
        self.c.loop_start()
        assert self.subscribed.wait(30), f"the subscriber on port {port} never got its SUBACK"

    def _on_message(self, c: Any, u: Any, m: Any) -> None:
        with self.lock:
            self.got.append(m.payload)

    def missing(self, expected: list[bytes]) -> list[bytes]:
        with self.lock:
            have = set(self.got)
        return [p for p in expected if p not in have]

    def duplicates(self) -> int:
        with self.lock:
            return len(self.got) - len(set(self.got))

    def out_of_order(self) -> list[str]:
        """Per group, a message whose first copy arrived after the first copy of a later one
        (a duplicate run replays older ones: only first copies count)."""
        seen: set[bytes] = set()
        last: dict[bytes, int] = {}
        bad = []
        with self.lock:
            got = list(self.got)
        for p in got:
            if p in seen:
                continue
            seen.add(p)
            group, _, seq = p.rpartition(b":")
            n = int(seq)
            if n < last.get(group, -1):
                bad.append(f"{p!r} after {group!r}:{last[group]}")
            last[group] = max(n, last.get(group, -1))
        return bad

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


class Stream(threading.Thread):
    """QoS 1, one at a time, round robin over ``topics`` (payload ``<topic>:<n>``), until
    stopped; keeps what was acknowledged (reason 0) and counts the rest (refused or not
    answered: may arrive, need not)."""

    def __init__(self, client: Client, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.topics = topics
        self.acked: list[bytes] = []
        self.unacked = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.is_set():
                for topic in self.topics:
                    payload = f"{topic}:{n}".encode()
                    try:
                        info = self.client.publish(topic, payload, qos=1, timeout=60)
                    except AssertionError:
                        self.unacked += 1  # not answered in time: unknown, never expected
                        continue
                    if self.client.puback_code(info) == 0:
                        self.acked.append(payload)
                    else:
                        self.unacked += 1
                n += 1
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(90)
        assert not self.is_alive(), "the publisher did not stop"
        assert self.error is None, f"the publisher failed: {self.error!r}"


def _node_pids(cluster: Cluster, i: int) -> list[int]:
    """Every process of node i: its supervisor, its routers, its metadata process."""
    status = cluster.status(i)
    pids = [cluster.nodes[i].pid, status["metadata"]["pid"]]
    pids += [r["pid"] for r in status["routers"] if r.get("pid")]
    return pids


def _active(cluster: Cluster) -> list[float]:
    out = []
    for n in cluster.nodes:
        try:
            out.append(n.metric("meshmq_bridge_active", bridge=BRIDGE) if n.alive else 0.0)
        except (AssertionError, OSError):
            out.append(0.0)
    return out


def _connected_at(cluster: Cluster, i: int) -> bool:
    try:
        node = cluster.nodes[i]
        return node.metric("meshmq_bridge_active", bridge=BRIDGE) == 1 and \
            node.metric("meshmq_bridge_up", bridge=BRIDGE) == 1
    except (AssertionError, OSError):
        return False


def _all_arrive(counter: Counter, expected: list[bytes], what: str) -> None:
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not counter.missing(expected), timeout=60, message=what)
    missing = counter.missing(expected)
    assert not missing, (f"{len(missing)} of {len(expected)} acknowledged messages never "
                         f"arrived (every acknowledged {what}): {missing[:20]}")


@contextlib.contextmanager
def _running(tmp_path: Path, cluster_settings: dict[str, Any]
             ) -> Iterator[tuple[Cluster, MosquittoProc, list[Any]]]:
    """A real Mosquitto, and a 3-node Raft cluster bridged to it (devices/# out, commands/#
    in); what the test adds to the list is stopped at the end, then the nodes, then
    Mosquitto."""
    mosq = MosquittoProc(tmp_path / "mosquitto").start()
    made: list[Any] = []
    cluster: Cluster | None = None
    try:
        bridge = {"name": BRIDGE, "address": f"{mosq.host}:{mosq.port}",
                  "reconnect_min": 0.2, "reconnect_max": 1.0, "keepalive": 10,
                  "topics": [{"pattern": "devices/#", "direction": "out", "qos": 1},
                             {"pattern": "commands/#", "direction": "in", "qos": 1}]}
        cluster = Cluster(tmp_path, n=3, raft=True,
                          overrides={"bridge": [bridge],
                                     "cluster": {"append_timeout": 3.0, **cluster_settings}})
        cluster.start()
        yield cluster, mosq, made
    finally:
        for thing in reversed(made):
            with contextlib.suppress(Exception):
                thing.stop()
        if cluster is not None:
            cluster.stop()
        mosq.stop()
        ALL_MOSQUITTOS.remove(mosq)


def _bridge_node(cluster: Cluster) -> int:
    wait_for(lambda: sum(_active(cluster)) == 1 and any(
        _connected_at(cluster, i) for i in range(3)), timeout=60,
        message="exactly one router running a connected bridge")
    return _active(cluster).index(1)


def _connect(made: list[Any], cluster: Cluster, mosq: MosquittoProc,
             node: int | None = None) -> Client:
    """A v5 client of node ``node`` (None: of Mosquitto), stopped at the end."""
    if node is None:
        c = Client(host=mosq.host, port=mosq.port, protocol=V5)
    else:
        c = Client(cluster.nodes[node], protocol=V5)
    c.connect()
    made.append(c)
    return c


def _kill_and_check(cluster: Cluster, mosq: MosquittoProc, made: list[Any], victim: int,
                    devices: list[str], survivor_a: int) -> None:
    """The streams, the kill -9 of every process of node ``victim``, the counts."""
    outbound = Counter(mosq.host, mosq.port, "devices/#")
    made.append(outbound)
    inbound = Counter(cluster.nodes[survivor_a].host, cluster.nodes[survivor_a].port,
                      "commands/#", v5_expiry=True)
    made.append(inbound)
    # the bridge's subscription at Mosquitto is there once a sentinel comes in
    rpub = _connect(made, cluster, mosq)
    wait_for(lambda: rpub.puback_code(rpub.publish("commands/x", b"hello:0", qos=1)) == 0
             and not inbound.missing([b"hello:0"]), timeout=60,
             message="the bridge's inbound subscription at Mosquitto")
    out = Stream(_connect(made, cluster, mosq, survivor_a),
                 [f"devices/{d}/seq" for d in devices])
    into = Stream(rpub, ["commands/x"])
    out.start()
    into.start()
    made.extend([out, into])
    wait_for(lambda: len(out.acked) >= 120 and len(into.acked) >= 30, timeout=120,
             message="both streams flowing before the kill")
    wait_for(lambda: not outbound.missing(out.acked[:100]), timeout=60,
             message="the bridge carrying the stream out before the kill")
    # Mosquitto frozen a moment: what is stored meanwhile waits in the bridge's session on
    # the node that dies (a backlog the new node must read from the logs, not lose)
    assert mosq.proc is not None
    os.kill(mosq.proc.pid, signal.SIGSTOP)
    try:
        frozen_at = len(out.acked)
        wait_for(lambda: len(out.acked) >= frozen_at + 60, timeout=120,
                 message="a backlog stored while Mosquitto is frozen")
        for pid in _node_pids(cluster, victim):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(mosq.proc.pid, signal.SIGCONT)
    at_kill = (len(out.acked), len(into.acked))
    survivors = [i for i in range(3) if i != victim]
    wait_for(lambda: any(_connected_at(cluster, i) for i in survivors), timeout=90,
             message="a surviving node running the bridge, connected")
    # both streams go on after the move: the new router carries them
    wait_for(lambda: len(out.acked) >= at_kill[0] + 100 and len(into.acked) >= at_kill[1] + 30,
             timeout=120, message="both streams flowing after the move")
    out.stop()
    into.stop()
    _all_arrive(outbound, out.acked, "outbound message at the Mosquitto subscriber")
    _all_arrive(inbound, into.acked, "inbound message at the subscriber here")
    assert not outbound.out_of_order(), f"outbound per-device order: {outbound.out_of_order()}"
    assert not inbound.out_of_order(), f"inbound order: {inbound.out_of_order()}"
    print(f"bridge moved off n{victim} by kill -9: out {len(out.acked)} acked "
          f"({out.unacked} refused or unanswered), {outbound.duplicates()} duplicates; in "
          f"{len(into.acked)} acked, {inbound.duplicates()} duplicates")


def test_kill9_of_the_bridge_node_loses_nothing_either_way(tmp_path: Path) -> None:
    """Replication factor 3 (every node holds every log), the session checkpoint at its
    default (1 s): two device logs led by the node that dies, two by survivors."""
    with _running(tmp_path, {}) as (cluster, mosq, made):
        victim = _bridge_node(cluster)
        a, b = [i for i in range(3) if i != victim]
        # Raft places a log where its first publisher is; the inbound log (commands) on a
        # survivor (its failover is not the bridge's business)
        first = {victim: ["devices/v0/seq", "devices/v1/seq"], a: ["devices/s0/seq"],
                 b: ["devices/s1/seq", "commands/seed"]}
        for node, topics in first.items():
            seeder = _connect(made, cluster, mosq, node)
            for t in topics:
                assert seeder.puback_code(seeder.publish(t, b"seed:-1", qos=1,
                                                         timeout=60)) == 0
        _kill_and_check(cluster, mosq, made, victim, ["v0", "v1", "s0", "s1"], a)


def test_kill9_resumes_logs_the_new_node_holds_no_copy_of(tmp_path: Path) -> None:
    """Replication factor 2 (a log is on two of the three nodes) and a session checkpoint far
    apart (30 s: only the SUBSCRIBE saved the bridge's session in the registry, with no
    position yet): the node the bridge moves to holds no copy of two of the streamed logs
    (one led by the node that dies, one by the other survivor), so it must read them at
    their leaders from the saved resume point, never start them at their end."""
    with _running(tmp_path, {"replication_factor": 2, "min_insync_replicas": 1,
                             "session_checkpoint_interval": 30.0}) as (cluster, mosq, made):
        victim = _bridge_node(cluster)
        rids = [f"n{i}/0" for i in range(3)]
        heir = rids.index(pick_router(BRIDGE, [r for i, r in enumerate(rids) if i != victim]))
        other = 3 - victim - heir
        seeders = {i: _connect(made, cluster, mosq, i) for i in range(3)}
        assert seeders[heir].puback_code(seeders[heir].publish(
            "commands/seed", b"seed:-1", qos=1, timeout=60)) == 0
        chosen: dict[int, str] = {}
        for k in range(40):  # logs led by the victim, and by the other survivor, not on heir
            for node in (victim, other):
                if node in chosen:
                    continue
                device = f"x{node}k{k}"
                assert seeders[node].puback_code(seeders[node].publish(
                    f"devices/{device}/seq", b"seed:-1", qos=1, timeout=60)) == 0
                owner = cluster.status(heir, device)["owner"]
                if f"n{heir}/0" not in owner["replicas"]:
                    chosen[node] = device
            if len(chosen) == 2:
                break
        assert len(chosen) == 2, f"no log placed off n{heir}: {chosen}"
        assert seeders[heir].puback_code(seeders[heir].publish(
            "devices/h0/seq", b"seed:-1", qos=1, timeout=60)) == 0
        _kill_and_check(cluster, mosq, made, victim, [chosen[victim], chosen[other], "h0"],
                        other)


def test_rolling_restart_of_the_bridge_node_loses_nothing(tmp_path: Path) -> None:
    """A rolling restart's step on the node running the bridge: stopped (SIGTERM: its bridge
    stops, its session is saved), the bridge moves to another node; started again, the bridge
    moves back to it (it ranks first again), its session handed over by the node that ran it
    meanwhile. Streams both ways throughout, from and to a node that stays up."""
    with _running(tmp_path, {}) as (cluster, mosq, made):
        victim = _bridge_node(cluster)
        rids = [f"n{i}/0" for i in range(3)]
        heir = rids.index(pick_router(BRIDGE, [r for i, r in enumerate(rids) if i != victim]))
        other = 3 - victim - heir
        first = {victim: ["devices/v0/seq"], heir: ["devices/h0/seq"],
                 other: ["devices/o0/seq", "commands/seed"]}
        for node, topics in first.items():
            seeder = _connect(made, cluster, mosq, node)
            for t in topics:
                assert seeder.puback_code(seeder.publish(t, b"seed:-1", qos=1,
                                                         timeout=60)) == 0
        outbound = Counter(mosq.host, mosq.port, "devices/#")
        made.append(outbound)
        inbound = Counter(cluster.nodes[other].host, cluster.nodes[other].port, "commands/#",
                          v5_expiry=True)
        made.append(inbound)
        rpub = _connect(made, cluster, mosq)
        wait_for(lambda: rpub.puback_code(rpub.publish("commands/x", b"hello:0", qos=1)) == 0
                 and not inbound.missing([b"hello:0"]), timeout=60,
                 message="the bridge's inbound subscription at Mosquitto")
        out = Stream(_connect(made, cluster, mosq, other),
                     ["devices/v0/seq", "devices/h0/seq", "devices/o0/seq"])
        into = Stream(rpub, ["commands/x"])
        out.start()
        into.start()
        made.extend([out, into])

        def flowing(n_out: int, n_in: int, what: str) -> None:
            at = (len(out.acked), len(into.acked))
            wait_for(lambda: len(out.acked) >= at[0] + n_out and len(into.acked) >= at[1] + n_in,
                     timeout=120, message=f"both streams flowing {what}")

        flowing(60, 20, "before the restart")
        cluster.nodes[victim].stop(timeout=30)
        wait_for(lambda: _connected_at(cluster, heir), timeout=90,
                 message=f"the bridge running on n{heir} while n{victim} is down")
        flowing(60, 20, "while the bridge runs on the heir")
        cluster.nodes[victim].start()
        cluster.wait_links_up(timeout=60)
        wait_for(lambda: _connected_at(cluster, victim) and _active(cluster)[heir] == 0,
                 timeout=90, message=f"the bridge back on n{victim}, and only there")
        # the session moved back from the node that ran it meanwhile (handed over by it, or
        # resumed from the registry), never resumed from the copy n{victim} restored from
        # its own disk at its start (older: it re-sent everything bridged meanwhile)
        back = cluster.nodes[victim]
        assert back.metric("meshmq_session_handed_over_total") \
            + back.metric("meshmq_session_resumed_from_registry_total") >= 1, \
            "the bridge's session moved back to its restarted node from that node's own " \
            "older copy, not from the node that ran it meanwhile"
        flowing(60, 20, "after the bridge moved back")
        out.stop()
        into.stop()
        _all_arrive(outbound, out.acked, "outbound message at the Mosquitto subscriber")
        _all_arrive(inbound, into.acked, "inbound message at the subscriber here")
        assert not outbound.out_of_order(), \
            f"outbound per-device order: {outbound.out_of_order()}"
        assert not inbound.out_of_order(), f"inbound order: {inbound.out_of_order()}"
        print(f"bridge moved off n{victim} (SIGTERM) and back: out {len(out.acked)} acked "
              f"({out.unacked} refused or unanswered), {outbound.duplicates()} duplicates; in "
              f"{len(into.acked)} acked, {inbound.duplicates()} duplicates")
