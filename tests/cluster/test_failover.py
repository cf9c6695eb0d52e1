"""Failover on real nodes (issue 24 step 4: cluster/controller.py, cluster/lease.py,
cluster/routerreg.py), ``placement = "raft"``, 3 nodes, RF 3:

* kill -9 of the node leading a device's log: Raft names a new leader on another node at a
  higher epoch with the dead router out of the ISR, and a publisher connected to another node
  has its QoS 1 publishes acknowledged again (time printed, no timing assertion); the node
  restarted with its data directory deleted registers a new incarnation and leads nothing;
* the same when the killed node was the Raft leader too (the controller moves with it);
* a restarted router never resumes leading with what it has: a log whose only in-sync replica
  restarted with its logs kept is re-elected at a new epoch (offsets continue); restarted with
  its disk lost, the log stays offline and a publish is refused, never acked at offset 0;
* a router whose node's voter is frozen (SIGSTOP: cut off from the Raft majority) refuses QoS 1
  publishes once its lease ran out: v5 DISCONNECT 0x9C with a Server Reference naming the
  majority side, 3.1.1 a closed connection; and it refuses before the majority elects a new
  leader for its logs (never two leaders acking); a new CONNECT there is still accepted.

Run: ``PYTHONPATH=$PWD python -m pytest -s tests/cluster/test_failover.py`` (``-s`` shows the
measured failover times).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import to_toml, wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

from cluster.metaclient import MetadataClient, MetadataUnavailable
from meshmq.metadata_proc import metadata_socket

pytestmark = pytest.mark.timeout(400)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


def _cluster(base, overrides: dict) -> Cluster:
    """Three Raft nodes whose config names every node's MQTT address (the Server Reference)."""
    cluster = Cluster(base, n=3, raft=True, overrides={"cluster": overrides})
    for node in cluster.nodes:
        for j, entry in enumerate(node.config["cluster"]["nodes"]):
            entry["mqtt"] = f"127.0.0.1:{cluster.nodes[j].port}"
        node.config_path.write_text(to_toml(node.config))
    return cluster


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # default lease and node timeout (0.5 s, 1.0 s): the times printed are the product's
    cluster = _cluster(tmp_path_factory.mktemp("failover"), {"append_timeout": 1.0})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# -- observation ------------------------------------------------------------------------------
def _snapshot(cluster: Cluster, i: int) -> dict:
    """The metadata state as node i's voter has applied it (its watch stream's snapshot)."""
    path = metadata_socket(cluster.nodes[i].config["node"]["data_dir"])
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b'{"op":"watch"}\n')
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf.split(b"\n")[0])["snapshot"]


def _record(cluster: Cluster, i: int, device: str) -> dict | None:
    try:
        return _snapshot(cluster, i)["logs"].get(device)
    except (OSError, ValueError, KeyError):
        return None


def _registration(cluster: Cluster, i: int, router: str) -> dict | None:
    try:
        return _snapshot(cluster, i)["routers"].get(router)
    except (OSError, ValueError, KeyError):
        return None


def _kill_node(cluster: Cluster, i: int) -> float:
    """kill -9 every process of node i (supervisor, routers, metadata process) at once; the
    monotonic time of the kill."""
    status = cluster.status(i)
    pids = [r["pid"] for r in status["routers"] if r.get("pid")]
    pids.append(status["metadata"]["pid"])
    at = time.monotonic()
    os.kill(cluster.nodes[i].pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.nodes[i].kill()  # reaps the supervisor
    return at


def _publisher(raw, cluster: Cluster, i: int, version: int = 5) -> R.RawClient:
    pub = raw(cluster.nodes[i], version=version)
    pub.connect(unique(f"pub{i}"), properties=ACK_OFFSETS if version == 5 else None)
    return pub


def _publish(client: R.RawClient, device: str, payload: bytes, pid: int,
             timeout: float = 60) -> R.Packet:
    client.send(R.publish(f"devices/{device}/t", payload, qos=1, packet_id=pid,
                          version=client.version))
    return client.expect(R.PUBACK, timeout=timeout)


def _offset(ack: R.Packet) -> int:
    return int(dict(ack.properties.get(R.USER_PROPERTY, []))["offset"])


def _until_acked(raw, cluster: Cluster, i: int, device: str, deadline: float) -> float:
    """Publish at node i until one is acknowledged (a refused one, or a connection closed by
    a refusal, is retried with a new connection); the monotonic time of the ack."""
    pub = _publisher(raw, cluster, i)
    pid = 100
    while time.monotonic() < deadline:
        pid += 1
        try:
            ack = _publish(pub, device, b"after-%d" % pid, pid, timeout=30)
        except AssertionError:  # closed (a refusal) or no answer: a fresh connection
            pub.close()
            time.sleep(0.05)
            pub = _publisher(raw, cluster, i)
            continue
        if ack.reason_code == 0:
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no publish of {device} acknowledged at n{i} in time")


def _place(raw, cluster: Cluster, at: int, device: str) -> None:
    """The device's log placed with its leader on node ``at`` (its publisher's router)."""
    ack = _publish(_publisher(raw, cluster, at), device, b"first", 1)
    assert ack.reason_code == 0, ack
    wait_for(lambda: (_record(cluster, (at + 1) % 3, device) or {}).get("leader") == f"n{at}/0",
             30, message=f"Raft names n{at}/0 the leader of {device}")


def _failover(raw, cluster: Cluster, victim: int, label: str) -> tuple[str, dict]:
    """Kill -9 node ``victim``, which leads a new device's log; a publisher on another node
    gets acks again. Returns the device and its Raft record after."""
    other = (victim + 1) % 3
    device = unique("fo")
    _place(raw, cluster, victim, device)
    before = _record(cluster, other, device)
    assert before is not None and before["epoch"] == 0 and f"n{victim}/0" in before["isr"]
    ack = _publish(_publisher(raw, cluster, other), device, b"forwarded", 1)
    assert ack.reason_code == 0, ack  # forwarded to the leader before the kill
    killed = _kill_node(cluster, victim)
    moved: list[float] = []
    first: list[dict] = []

    def elected() -> bool:
        rec = _record(cluster, other, device)
        if rec and rec["leader"] != f"n{victim}/0":
            moved.append(time.monotonic())
            first.append(rec)
            return True
        return False
    wait_for(elected, 60, interval=0.01, message=f"{device}'s leadership moved off n{victim}")
    # the election itself leaves the dead router out of the ISR: kept there, the new leader's
    # high-water mark (and every PUBACK) would wait for the ISR shrink's lag time
    assert f"n{victim}/0" not in first[0]["isr"], f"elected with the dead router in the ISR: " \
        f"{first[0]}"
    acked = _until_acked(raw, cluster, other, device, time.monotonic() + 60)
    rec = _record(cluster, other, device)
    assert rec is not None
    print(f"\n[failover] {label}: kill -9 of n{victim} -> new leader {rec['leader']} in Raft "
          f"after {moved[0] - killed:.2f} s, first QoS 1 PUBACK at n{other} after "
          f"{acked - killed:.2f} s (target <= 2 s)")
    return device, rec


def _restart(cluster: Cluster, i: int, wipe: bool) -> None:
    node = cluster.nodes[i]
    if wipe:
        shutil.rmtree(node.config["node"]["data_dir"])
    node.start()
    cluster.wait_links_up(60)


# -- the tests ----------------------------------------------------------------------------------
def test_kill9_of_a_log_leader_moves_its_logs_and_the_node_returns_empty_leading_nothing(
        trio: Cluster, raw) -> None:
    raft = trio.raft_leader()
    victim = next(i for i in range(3) if i != raft)  # the Raft leader survives here
    old = _registration(trio, raft, f"n{victim}/0")
    assert old is not None, "the router registered at start"
    device, rec = _failover(raw, trio, victim, "log leader, not the Raft leader")
    assert rec["leader"] != f"n{victim}/0" and rec["epoch"] >= 1, rec
    assert f"n{victim}/0" not in rec["isr"], f"the dead router stayed in the ISR: {rec}"
    assert rec["leader"] in rec["isr"]
    # back with its data directory deleted: a new incarnation, no logs kept, leads nothing
    _restart(trio, victim, wipe=True)
    wait_for(lambda: (_registration(trio, raft, f"n{victim}/0") or {}).get("incarnation")
             not in (None, old["incarnation"]), 60,
             message=f"n{victim}/0 registered a new incarnation")
    reg = _registration(trio, raft, f"n{victim}/0")
    assert reg is not None and reg["kept_logs"] is False, reg
    logs = _snapshot(trio, raft)["logs"]
    led = [d for d, r in logs.items() if r["leader"] == f"n{victim}/0"
           and r.get("leader_incarnation") == reg["incarnation"]]
    assert led == [], f"the returning router leads logs it was not elected for: {led}"
    # the returning node learns the record from its metadata process's watch stream: it
    # names the new leader once that snapshot is in (None until then, under load)
    wait_for(lambda: trio.status(victim, device)["owner"]["router"] == rec["leader"], 30,
             message=f"n{victim} names the new leader {rec['leader']}")


def test_the_controller_moves_with_the_raft_leader(trio: Cluster, raw) -> None:
    victim = trio.raft_leader()
    device, rec = _failover(raw, trio, victim, "log leader and Raft leader")
    assert rec["leader"] != f"n{victim}/0" and rec["epoch"] >= 1
    assert f"n{victim}/0" not in rec["isr"], rec
    new = trio.raft_leader()
    assert new != victim
    controller = trio.status(new)["metadata"].get("controller")
    assert controller and controller["elections"] >= 1, controller
    _restart(trio, victim, wipe=False)


def test_a_restarted_router_never_resumes_leading_with_what_it_has(trio: Cluster, raw) -> None:
    v = next(i for i in range(3) if i != trio.raft_leader())
    router = f"n{v}/0"
    inc = _registration(trio, v, router)["incarnation"]
    device = unique("sole")
    sock = metadata_socket(trio.nodes[v].config["node"]["data_dir"])

    async def create() -> list:  # a log whose only replica (and ISR member) is n{v}/0
        client = MetadataClient(sock)
        await client.connect()
        try:
            for _ in range(100):
                try:
                    return list(await client.propose(["create_log", device, router, [router],
                                                      inc]))
                except MetadataUnavailable:
                    await asyncio.sleep(0.2)
            raise AssertionError("create_log not committed")
        finally:
            await client.close()
    applied, rec = asyncio.run(create())
    assert applied and rec["leader_incarnation"] == inc, rec
    wait_for(lambda: trio.status(v, device)["owner"]["router"] == router, 30,
             message="the router heard of its log")
    pub = _publisher(raw, trio, v)
    assert [_offset(_publish(pub, device, b"m%d" % k, k + 1)) for k in range(2)] == [0, 1]

    # kill -9 of the router alone (its disk kept): re-elected at a new epoch, offsets continue
    old_pid = trio.router_pid(v)
    os.kill(old_pid, signal.SIGKILL)
    trio.wait_router_restarted(v, old_pid)
    wait_for(lambda: (_record(trio, v, device) or {}).get("epoch") == 1, 60,
             message="the sole ISR member, restarted with its logs, re-elected at epoch 1")
    kept = _registration(trio, v, router)
    rec = _record(trio, v, device)
    assert kept["incarnation"] != inc and kept["kept_logs"] is True, kept
    assert rec["leader_incarnation"] == kept["incarnation"], rec
    pub = _publisher(raw, trio, v)
    ack = _until_acked(raw, trio, v, device, time.monotonic() + 60)
    assert ack
    ack = _publish(pub, device, b"m-next", 50)
    assert ack.reason_code == 0 and _offset(ack) >= 3, ack  # continued, not restarted

    # kill -9 of the whole node, its disk lost: the log stays offline, nothing acked at 0
    _kill_node(trio, v)
    _restart(trio, v, wipe=True)
    wait_for(lambda: (_registration(trio, v, router) or {}).get("incarnation")
             not in (None, kept["incarnation"]), 60, message="registered again")
    time.sleep(1.5)  # node_timeout: time for a (wrong) election to happen
    rec = _record(trio, v, device)
    assert rec["leader_incarnation"] == kept["incarnation"], f"re-elected with no data: {rec}"
    for pid in (1, 2):
        pub = _publisher(raw, trio, v)
        try:
            ack = _publish(pub, device, b"lost-disk", pid, timeout=30)
        except AssertionError:
            continue  # the connection closed: refused
        assert ack.reason_code != 0, (
            f"a router restarted with an empty disk acknowledged a publish of a log it led "
            f"before (offset {_offset(ack) if ack.reason_code == 0 else '-'}): {ack!r}")


def test_a_router_cut_off_from_raft_refuses_publishes_before_the_majority_elects(
        tmp_path, raw) -> None:
    # a wide lease (2 s) and node timeout (3 s): an election before the lease ran out would
    # leave the frozen node acking for long enough to be seen
    cluster = _cluster(tmp_path, {"append_timeout": 2.0, "leader_lease": 2.0,
                                  "node_timeout": 3.0})
    try:
        cluster.start()
        raft = cluster.raft_leader()
        victim = next(i for i in range(3) if i != raft)
        device = unique("cut")
        _place(raw, cluster, victim, device)
        pub = _publisher(raw, cluster, victim)
        old = _publisher(raw, cluster, victim, version=4)
        voter = cluster.status(victim)["metadata"]["pid"]
        os.kill(voter, signal.SIGSTOP)
        try:
            frozen = time.monotonic()
            wait_for(lambda: (_record(cluster, raft, device) or {}).get("leader")
                     != f"n{victim}/0", 60, interval=0.01,
                     message="the majority elected a new leader")
            elected = time.monotonic()
            # at once: the cut-off router must already refuse (its lease ran out first)
            pub.send(R.publish(f"devices/{device}/t", b"cut", qos=1, packet_id=7, version=5))
            got = pub.wait_closed(30)
            acks = [p for p in got if p.type == R.PUBACK]
            assert not acks, f"the cut-off router acknowledged after the election: {got!r}"
            disc = [p for p in got if p.type == R.DISCONNECT]
            assert disc and disc[0].reason_code == 0x9C, got
            props = disc[0].properties
            assert props.get(R.SERVER_REFERENCE) == f"127.0.0.1:{cluster.nodes[raft].port}", \
                props
            assert "majority" in props.get(R.REASON_STRING, ""), props
            old.send(R.publish(f"devices/{device}/t", b"cut311", qos=1, packet_id=1))
            got = old.wait_closed(30)
            assert not [p for p in got if p.type == R.PUBACK], got
            # a new CONNECT on the minority side: its claim cannot commit in the session
            # registry (cluster/sessionreg.py), so a v5 client is sent to the majority side
            fresh = raw(cluster.nodes[victim], version=5)
            connack = fresh.connect(unique("minority"), expect_rc=None)
            assert connack.reason_code == 0x9C, connack
            assert connack.properties.get(R.SERVER_REFERENCE) == \
                f"127.0.0.1:{cluster.nodes[raft].port}", connack
            print(f"\n[failover] voter of n{victim} frozen: new leader elected after "
                  f"{elected - frozen:.2f} s (node_timeout 3 s); its router refused with 0x9C")
        finally:
            os.kill(voter, signal.SIGCONT)
        # contact back: the lease is valid again, and publishes go to the new leader
        _until_acked(raw, cluster, victim, device, time.monotonic() + 60)
        assert cluster.nodes[victim].metric("meshmq_lease_refused_total") >= 2
    finally:
        cluster.stop()
