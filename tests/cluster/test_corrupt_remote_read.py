"""A corrupt record in another router's log: readers on other nodes read around it too
(issue 28, item 7).

Two nodes; 300 QoS 1 records of a device whose log node 1 owns; a clean stop of the cluster (so
node 1's start-up scans nothing), one payload byte of offset 150 (or of the last record, 299)
flipped in node 1's segment,
start again. Read from node 0, whose requests cross the mesh (the cluster FETCH served by the
owner): ``GET /records`` relayed to the owner (the lost offset named in its
``X-Meshmq-Lost-Offsets``), the many-device ``POST /api/v1/fetch`` split by
owner, and an MQTT replay from ``earliest`` on node 0 (a remote replay) each get the 299 intact
records; the owner reports the damage once (ERROR, ``meshmq_log_corrupt_records_total``) and
node 0 counts the skipped offset as dropped, reason ``corrupt``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cluster import Cluster
from helpers.devicelog import Publisher, Subscriber, fetch_all, fetch_records, offsets_of

from commitlog.fetch import decode_multi_records
from commitlog.record import HEADER, HEADER_SIZE

pytestmark = pytest.mark.timeout(240)

N = 300
LOST = 150


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def flip_payload(seg: Path, device: str, offset: int) -> None:
    data = bytearray(seg.read_bytes())
    p = 0
    while p + HEADER_SIZE <= len(data):
        length, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        if data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == device.encode() and off == offset:
            data[p + 4 + length - 1] ^= 0x01
            seg.write_bytes(bytes(data))
            return
        p += 4 + length
    raise AssertionError(f"no record {device}@{offset} in {seg}")


@pytest.mark.parametrize("lost", [LOST, N - 1])
def test_corrupt_record_in_the_owners_log_is_read_around_from_another_node(mesh: Cluster,
                                                                           lost: int):
    n0, n1 = mesh.nodes
    dev = mesh.device_owned_by(1)
    pub = Publisher(n1.host, n1.port, "pub", version=5, window=32)
    acks = pub.publish_all([(f"devices/{dev}/t", f"{dev}:{i}".encode()) for i in range(N)],
                           timeout=120)
    pub.close()
    assert sorted(a.offset for a in acks) == list(range(N))
    mesh.stop()
    (seg,) = sorted((n1.workdir / "data" / "router-0" / "log").glob("*.log"))
    flip_payload(seg, dev, lost)
    mesh.start()
    want = [o for o in range(N) if o != lost]

    got = fetch_all(n0, dev)  # relayed to the owner over the mesh
    assert [r.offset for r in got] == want
    assert all(bytes(r.payload) == f"{dev}:{r.offset}".encode() for r in got)
    resp, _ = fetch_records(n0, dev, offset=lost - 2, max_records=10)
    assert resp.headers.get("x-meshmq-lost-offsets") == f"{lost}-{lost + 1}", resp.headers
    body = json.dumps({"devices": [{"device": dev, "offset": 0}],
                       "max_records_per_device": 1000}).encode()
    req = urllib.request.Request(f"http://{n0.host}:{n0.admin_port}/api/v1/fetch", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        assert [r.offset for r in decode_multi_records(resp.read())[dev]] == want

    sub = Subscriber(n0.host, n0.port, "replayer")
    sub.subscribe(f"devices/{dev}/#", 1, offset="earliest")
    msgs = sub.collect(N - 1, timeout=60)
    assert offsets_of(msgs, dev) == want
    sub.expect_quiet(0.5)
    sub.close()
    assert n0.metric("meshmq_messages_dropped_total", reason="corrupt") == 1
    assert n1.metric("meshmq_log_corrupt_records_total") == 1


@pytest.fixture
def lagging_mesh(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2, overrides={"mqtt": {"max_queued_messages": 20}})
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.mark.parametrize("lost", [LOST, 256])
def test_remote_catch_up_goes_on_past_a_corrupt_record(lagging_mesh: Cluster, lost: int):
    """A persistent session on node 0 lagging on a log node 1 owns (offline while 300 records
    arrive, queue of 20) catches up over the mesh after a clean restart of both nodes, one
    offset damaged in the owner's segment: inside a read, or (256) exactly where a read starts
    (catch-up reads 256 records at a time from 0). The other 299 arrive, in order; nothing
    stalls."""
    mesh = lagging_mesh
    n0, n1 = mesh.nodes
    dev = mesh.device_owned_by(1)
    sub = Subscriber(n0.host, n0.port, "keeper", session_expiry=3600)
    sub.subscribe(f"devices/{dev}/#", 1)
    mesh.wait_routes(0)
    sub.close()
    pub = Publisher(n1.host, n1.port, "pub", version=5, window=32)
    acks = pub.publish_all([(f"devices/{dev}/t", f"{dev}:{i}:".encode()) for i in range(N)],
                           timeout=120)
    pub.close()
    assert sorted(a.offset for a in acks) == list(range(N))
    mesh.stop()
    (seg,) = sorted((n1.workdir / "data" / "router-0" / "log").glob("*.log"))
    flip_payload(seg, dev, lost)
    mesh.start()

    sub = Subscriber(n0.host, n0.port, "keeper", session_expiry=3600)
    assert sub.session_present
    msgs = sub.collect(N - 1, timeout=60)
    assert [int(m.payload.split(b":")[1]) for m in msgs] == [o for o in range(N) if o != lost]
    sub.expect_quiet(0.5)
    sub.close()
    assert n0.metric("meshmq_messages_dropped_total", reason="corrupt") == 1
