"""A run of QoS 1 publishes on one device topic, stored once (broker/loggedrun.py, issue 25):
what every client sees, and what the device log holds, must be what the packet-by-packet path
(``_on_publish`` -> ``_append``) gives. Each publisher sends its whole stream in ONE write, so
the broker reads runs (2..64 plain QoS 1 publishes on one topic); the stream mixes in what ends
a run or must not be taken into one (another topic of the same log, DUP=1, a user property,
RETAIN, QoS 0, QoS 2), and ends with a run (its last message is the one an end off by one
loses).

* every publish is answered once, in the order sent (one device log: its acks settle in log
  order), with its packet id and reason 0; v3.1.1 and v5 subscribers at QoS 1 get every
  message once, in order, topic, QoS, payload and property intact; the log (fetch API, and an
  ``offset`` = ``earliest`` replay) holds each once, in order, with the header the per-packet
  path writes; the metrics count what the per-packet path counts;
* No Local: a publisher subscribed with No Local that has fallen behind on its device log is
  fed from the log (broker/catchup.py) and must not get its own run back: the ``:origin``
  header of each record is what says whose it is;
* publisher dedupe (``publisher_dedupe = "on"``): a message of an acknowledged run resent with
  DUP=1 after a reconnect, first in a would-be run or in the middle of one, is answered from
  the log, not stored twice (the ``:pub`` header of each run record is what it is found by);
* a full volume (a 2 MiB tmpfs, root only, as tests/broker/test_disk_full.py): runs into a
  failing log are refused message by message, never a PUBACK 0 for what the log does not
  hold, the connection's later packets not held for ever, the counts those of the per-packet
  path (a 3.1.1 publisher closed at the first refusal: the rest of its read is not counted);
* a log another node leads (two nodes): a run is not stored here but sent to its leader, a
  message at a time, as packet by packet;
* the write gate (a one-node Raft cluster whose metadata process is frozen: its leader lease
  runs out): a run is refused as its first publish would be (v5 DISCONNECT 0x9C), nothing
  stored.

Every expectation here is the per-packet path's: each test passes unchanged with the run path
off (``_logged_run_plan`` answering None). The planted bugs these catch are
``speed-logged-run-*`` in tests/mutations_speed.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc, wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all, log_list
from helpers.volume import fill_rest, tmpfs_volume

from commitlog.record import ATTR_QOS_MASK, ATTR_RETAIN
from commitlog.store import LogStore

pytestmark = pytest.mark.timeout(120)

N = 150
H_ORIGIN, H_PUB = ":origin", ":pub"  # broker/devicelogs.py, broker/pubdedupe.py
USER = {R.USER_PROPERTY: [("k", "v")]}


@dataclass
class Sent:
    topic: str
    payload: bytes
    qos: int
    packet_id: int | None
    retain: bool = False
    dup: bool = False
    props: bool = False


def _stream(topic: str, other: str, version: int, first_id: int = 1
            ) -> tuple[bytes, list[Sent]]:
    """The publisher's bytes (one write) and what they publish, in order: runs of plain QoS 1
    publishes on ``topic`` broken by one of each kind a run must not take; the last run ends
    the stream."""
    out: list[bytes] = []
    sent: list[Sent] = []
    pid = first_id
    for i in range(N):
        payload = (b"L%03d" % i) * 60 if i % 7 == 3 else b"m%03d" % i  # 240 bytes or 4
        s = Sent(topic, payload, 1, pid)
        if i == 25:
            s.topic = other  # another topic of the same device log
        elif i == 45:
            s.dup = True  # DUP=1, first sent (no earlier copy): stored like any other
        elif i == 65 and version == 5:
            s.props = True
        elif i == 85:
            s.retain = True
        elif i == 105:
            s.qos, s.packet_id = 0, None
        elif i == 125:
            s.qos = 2
        if s.qos:
            pid += 1
        out.append(R.publish(s.topic, s.payload, qos=s.qos, retain=s.retain, dup=s.dup,
                             packet_id=s.packet_id, version=version,
                             properties=USER if s.props else None))
        sent.append(s)
    return b"".join(out), sent


def _answers(pub: R.RawClient, sent: list[Sent], timeout: float = 30) -> list[tuple]:
    """Every answer to ``sent``'s QoS 1/2 publishes, in arrival order: (packet id, reason);
    QoS 2 completed (PUBREL sent on its PUBREC, its PUBCOMP read). PUBLISHes that come
    meanwhile are kept for the client's next reads."""
    want = sum(1 for s in sent if s.qos)
    got: list[tuple] = []
    passed: list[R.Packet] = []
    comps = 0
    deadline = time.monotonic() + timeout
    while len(got) < want or comps < sum(1 for s in sent if s.qos == 2):
        assert time.monotonic() < deadline, f"{len(got)} of {want} answers: {got[-3:]}"
        try:
            p = pub.recv(max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            continue
        if p.type in (R.PUBACK, R.PUBREC):
            got.append((p.packet_id, p.reason_code or 0))
            if p.type == R.PUBREC and not p.reason_code:
                pub.send(R.pubrel(p.packet_id))
        elif p.type == R.PUBCOMP:
            comps += 1
        else:
            assert p.type == R.PUBLISH, p
            passed.append(p)
    pub.pending = passed + pub.pending
    return got


def _publishes(c: R.RawClient, n: int, timeout: float = 30) -> list[R.Packet]:
    """The next ``n`` PUBLISHes ``c`` receives, each QoS 1 one acknowledged as it comes."""
    got: list[R.Packet] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n}: {got[-3:]}"
        try:
            p = c.recv(max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            continue
        if p.type == R.PUBLISH:
            got.append(p)
            if p.qos:
                c.ack(p)
    return got


def _records(b: BrokerProc, device: str) -> list:
    return fetch_all(b, device) if device in log_list(b) else []


def _counts(b: BrokerProc) -> dict[str, float]:
    return {
        "in": b.metric("meshmq_messages_received_total"),
        "in1": b.metric("meshmq_messages_received_qos_total", qos="1"),
        "in0": b.metric("meshmq_messages_received_qos_total", qos="0"),
        "in2": b.metric("meshmq_messages_received_qos_total", qos="2"),
        "pub": b.metric("meshmq_packets_received_total", type="publish"),
        "dropped": b.metric("meshmq_messages_dropped_total"),
        "not_stored": b.metric("meshmq_messages_dropped_total", reason="not_stored"),
    }


def _wait_counts(b: BrokerProc, before: dict[str, float], want: dict[str, float]) -> None:
    """The counters moved by exactly ``want`` (the others not at all); polled, as a node's
    metrics are its routers' counters as last reported."""
    def delta() -> dict[str, float]:
        now = _counts(b)
        return {k: now[k] - before[k] for k in now}

    full = {k: want.get(k, 0) for k in before}
    deadline = time.monotonic() + 15
    while (moved := delta()) != full and time.monotonic() < deadline:
        time.sleep(0.05)
    assert moved == full, f"counters moved by {moved}, the per-packet path's: {full}"
    time.sleep(0.3)  # and no more after
    assert delta() == full


@pytest.mark.parametrize("version", [4, 5], ids=["v311-publisher", "v5-publisher"])
def test_a_logged_run_is_answered_delivered_and_stored_as_one_message_at_a_time(
        start_broker, raw, version: int) -> None:
    b = start_broker()
    device = unique("lr")
    base = f"devices/{device}"
    topic, other = f"{base}/t", f"{base}/u"
    subs: dict[int, R.RawClient] = {}
    for v in (4, 5):
        c = raw(b, version=v)
        c.connect(unique(f"s{v}"))
        c.send(R.subscribe(1, [(f"{base}/#", 1)], version=v))
        c.expect(R.SUBACK)
        subs[v] = c
    pub = raw(b, version=version)
    pub.connect(unique("pub"))
    before = _counts(b)

    data, sent = _stream(topic, other, version)
    pub.send(data)
    answers = _answers(pub, sent)
    assert answers == [(s.packet_id, 0) for s in sent if s.qos], (
        "each QoS 1/2 publish answered once, in the order sent, reason 0")
    pub.expect_none(0.3)

    for v, c in subs.items():
        # the QoS 1 copies in order; the QoS 0 one once, wherever it passed them (it takes no
        # window slot: the per-packet path's delivery too)
        got = _publishes(c, N)
        assert [(p.topic, p.payload, p.qos) for p in got if p.qos] == [
            (s.topic, s.payload, 1) for s in sent if s.qos], v
        assert [(p.topic, p.payload) for p in got if not p.qos] == [
            (s.topic, s.payload) for s in sent if not s.qos], v
        assert not any(p.retain or p.dup for p in got), v  # live copies [MQTT-3.3.1-9]
        if v == 5:
            props = [p.payload for p in got if p.properties]
            assert props == [s.payload for s in sent if s.props], props
            for p in got:
                assert not p.properties or p.properties[R.USER_PROPERTY] in (
                    [("k", "v")], ("k", "v")), p
        c.expect_none(0.3)

    # the log: each once, in order, as the per-packet path stores it (no header for a plain
    # publish: dedupe is off on a single node by default, nobody subscribed with No Local)
    recs = _records(b, device)
    assert [r.offset for r in recs] == list(range(N))
    assert [(r.topic, bytes(r.payload), r.attrs & ATTR_QOS_MASK, bool(r.attrs & ATTR_RETAIN))
            for r in recs] == [(s.topic, s.payload, s.qos, s.retain) for s in sent]
    assert [list(r.headers) for r in recs] == [
        [("k", b"v")] if s.props else [] for s in sent]
    # ... and read back by a client: an offset replay from the earliest record
    rd = raw(b, version=5)
    rd.connect(unique("replay"))
    rd.send(R.subscribe(1, [(f"{base}/#", 1)], version=5,
                        properties={R.USER_PROPERTY: [("offset", "earliest")]}))
    rd.expect(R.SUBACK, skip=(R.PUBLISH,))
    back = {int(dict(p.properties[R.USER_PROPERTY])["offset"]): p for p in _publishes(rd, N)}
    assert sorted(back) == list(range(N)), "an offset replayed twice"
    assert [(back[i].topic, back[i].payload, back[i].qos) for i in range(N)] == [
        (s.topic, s.payload, min(s.qos, 1)) for s in sent]
    rd.expect_none(0.3)
    # the retained one is kept as retained (a run's first message is checked for RETAIN)
    late = raw(b, version=4)
    late.connect(unique("late"))
    late.send(R.subscribe(1, [(topic, 1)]))
    (kept,) = _publishes(late, 1)
    assert (kept.payload, kept.retain) == (sent[85].payload, True), kept

    # the counters: each publish counted once, by its QoS; nothing dropped
    _wait_counts(b, before, {"in": N, "pub": N, "in0": 1, "in2": 1, "in1": N - 2})


def test_no_local_holds_for_a_run_read_back_from_the_log(start_broker, raw) -> None:
    """A v5 publisher subscribed to its device's topics with No Local falls behind on the log
    (window 2, queue 1: another client's messages it does not acknowledge yet), then publishes
    a run. Fed from the log once it acknowledges (broker/catchup.py), it must get the other
    client's messages only, in order, once each: every record of its run carries ``:origin``,
    as the per-packet path writes for a session holding a No Local subscription. Another
    subscriber gets everything."""
    b = start_broker(mqtt={"max_inflight": 2, "max_queued_messages": 1})
    device = unique("nl")
    base = f"devices/{device}"
    topic = f"{base}/t"
    cid = unique("nlpub")
    pub = raw(b, version=5)
    pub.connect(cid, properties={R.SESSION_EXPIRY_INTERVAL: 300})
    pub.send(R.subscribe(1, [(f"{base}/#", R.sub_options(1, no_local=True))], version=5))
    pub.expect(R.SUBACK)
    watcher = raw(b, version=4)
    watcher.connect(unique("watch"))
    watcher.subscribe(f"{base}/#", 1)
    other = raw(b, version=4)
    other.connect(unique("other"))
    lagging = b.metric("meshmq_sessions_lagging")

    theirs = [b"q%02d" % i for i in range(10)]
    other.send(b"".join(R.publish(topic, p, qos=1, packet_id=i + 1)
                        for i, p in enumerate(theirs)))
    assert [a for a, _ in _answers(other, [Sent(topic, p, 1, 0) for p in theirs])] == \
        list(range(1, 11))
    wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagging, timeout=15,
             message="the publisher's session fell behind on its device log (the premise)")

    data, sent = _stream(topic, f"{base}/u", 5)
    pub.send(data)
    # (a persistent session's PUBREC waits for the session's store: QoS 1 acks only, in order)
    got = _answers(pub, sent)
    assert sorted(got) == sorted((s.packet_id, 0) for s in sent if s.qos), got
    assert [a for a in got if a[0] != sent[125].packet_id] == [
        (s.packet_id, 0) for s in sent if s.qos == 1]
    tail = [b"z%02d" % i for i in range(5)]
    other.send(b"".join(R.publish(topic, p, qos=1, packet_id=20 + i)
                        for i, p in enumerate(tail)))
    _answers(other, [Sent(topic, p, 1, 0) for p in tail])

    # now it reads: what it was sent live (2 in flight, 1 queued), then the log
    got = _publishes(pub, len(theirs) + len(tail))
    assert [p.payload for p in got] == theirs + tail, [p.payload for p in got]
    pub.expect_none(0.5)
    seen = _publishes(watcher, len(theirs) + N + len(tail))
    assert [p.payload for p in seen if p.qos] == [
        *theirs, *(s.payload for s in sent if s.qos), *tail]
    assert [p.payload for p in seen if not p.qos] == [s.payload for s in sent if not s.qos]
    recs = _records(b, device)
    mine = [r for r in recs if bytes(r.payload) in {s.payload for s in sent}]
    assert len(mine) == N
    assert all((H_ORIGIN, cid.encode()) in [(k, bytes(v)) for k, v in r.headers]
               for r in mine), "a record of the run without its :origin header"


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_a_resend_of_a_run_message_is_answered_from_the_log_not_stored_twice(
        start_broker, raw, version: int) -> None:
    """Publisher dedupe on: a run of 40 acknowledged; the publisher reconnects (same client
    id, session kept) and, in one write, resends three of them with DUP=1 and their packet
    ids (one where a run would start, one inside a run of new ones, the run's last), among new
    publishes. Each is acknowledged; the log holds every message once."""
    b = start_broker(mqtt={"publisher_dedupe": "on"})
    device = unique("dd")
    topic = f"devices/{device}/t"
    cid = unique("ddpub")
    expiry = {R.SESSION_EXPIRY_INTERVAL: 300} if version == 5 else None
    pub = raw(b, version=version)
    pub.connect(cid, clean=False, properties=expiry)
    first = [Sent(topic, b"a%02d" % i, 1, i + 1) for i in range(40)]
    pub.send(b"".join(R.publish(topic, s.payload, qos=1, packet_id=s.packet_id,
                                version=version) for s in first))
    assert _answers(pub, first) == [(s.packet_id, 0) for s in first]
    assert [bytes(r.payload) for r in _records(b, device)] == [s.payload for s in first]
    pub.abort()

    hits = b.metric("meshmq_publish_dedupe_total", result="hit")
    back = raw(b, version=version)
    assert back.connect(cid, clean=False, properties=expiry).session_present
    new = [Sent(topic, b"n%02d" % i, 1, 1000 + i) for i in range(25)]
    again = [Sent(topic, s.payload, 1, s.packet_id, dup=True) for s in (first[0], first[19],
                                                                      first[39])]
    order = [again[0], *new[:10], again[1], *new[10:20], again[2], *new[20:]]
    back.send(b"".join(R.publish(s.topic, s.payload, qos=1, dup=s.dup, packet_id=s.packet_id,
                                 version=version) for s in order))
    got = _answers(back, order)
    assert sorted(got) == sorted((s.packet_id, 0) for s in order), got
    assert [a for a in got if a[0] >= 1000] == [(s.packet_id, 0) for s in new]
    wait_for(lambda: len(_records(b, device)) >= 65, timeout=15, message="the new ones stored")
    time.sleep(0.3)
    assert [bytes(r.payload) for r in _records(b, device)] == \
        [s.payload for s in first] + [s.payload for s in new], "a resend stored twice"
    wait_for(lambda: b.metric("meshmq_publish_dedupe_total", result="hit") == hits + 3,
             timeout=15, message="three resends found in the log")
    recs = _records(b, device)
    assert all([k for k, _ in r.headers] == [H_PUB] for r in recs), (
        "each record carries its publisher (:pub), and nothing else")


# -- a full volume ----------------------------------------------------------------------------
RUN = 64  # RUN_MAX: one run a write
BIG = 700  # bytes: ~2,800 records fill 2 MiB


@pytest.fixture
def tmpfs(tmp_path: Path):
    yield from tmpfs_volume(tmp_path)


def _big(tag: str, i: int) -> bytes:
    head = f"{tag}:{i}:".encode()
    return head + b"x" * (BIG - len(head))


def test_runs_into_a_full_volume_are_refused_one_by_one_never_acked(
        tmpfs: Path, start_broker, raw, tmp_path: Path) -> None:
    """A v5 publisher sends runs of 64 (one write each) until its log's volume is full: each
    publish is answered once, in order, PUBACK 0 or 0x80; then, the volume filled to the last
    byte (the log stays failing), a whole run is refused and a SUBSCRIBE after it answered;
    a 3.1.1 publisher's run is closed at its first publish; space freed, runs are stored
    again. After a clean stop the log holds exactly the acknowledged payloads, in order.

    With real parts the failing append of a run is always its first: the store only buffers
    (a write fails in the flush, a later tick) and refuses every append while the committer
    is failing, so ``append_run`` stores all of a run or none of it, and a stored prefix > 0
    (``_logged_run_failed`` settling part of a run) cannot be made to happen here."""
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (512 * 1024))  # freed later: space comes back
    (tmpfs / "topfill").touch()  # created now: a full tmpfs refuses even a new name
    logdir = tmpfs / "log"
    b = start_broker(tmp_path, commitlog={"dir": str(logdir), "segment_bytes": 1 << 20})
    device = unique("full")
    topic = f"devices/{device}/t"
    pub = raw(b, version=5)
    pub.connect(unique("p5"))
    before = _counts(b)
    acked: list[bytes] = []
    refused: list[bytes] = []
    sent = 0

    def run(tag: str) -> list[tuple]:
        """One run in one write; its answers, checked: one each, in order, 0 or 0x80."""
        nonlocal sent
        batch = [Sent(topic, _big(tag, sent + k), 1, (sent + k) % 60000 + 1)
                 for k in range(RUN)]
        sent += RUN
        pub.send(b"".join(R.publish(topic, s.payload, qos=1, packet_id=s.packet_id,
                                    version=5) for s in batch))
        got = _answers(pub, batch, timeout=20)
        assert [pid for pid, _ in got] == [s.packet_id for s in batch], "answered out of order"
        for s, (_, rc) in zip(batch, got, strict=True):
            assert rc in (0, 0x80), got
            (acked if rc == 0 else refused).append(s.payload)
        return got

    deadline = time.monotonic() + 60
    while len(refused) < 2 * RUN:
        assert time.monotonic() < deadline, f"no refusals after {sent} publishes"
        run("v5")
    # the last bytes taken: the log stays failing (its probe cannot write), a run is refused
    # whole, message by message, and the connection's next packet is not held behind it
    fill_rest(tmpfs / "topfill")
    wait_for(lambda: b.http_get("/readyz")[0] == 503, timeout=30,
             message="/readyz 503 while the log cannot write")
    assert all(rc == 0x80 for _, rc in run("v5")), "acknowledged on a full volume"
    pub.send(R.subscribe(9, [(f"{topic}/none", 1)], version=5))
    assert pub.expect(R.SUBACK, timeout=10).packet_id == 9, "held behind unsettled publishes"
    _wait_counts(b, before, {"in": sent, "in1": sent, "pub": sent,
                             "dropped": len(refused), "not_stored": len(refused)})

    # a 3.1.1 publisher's run: closed at its first refusal, nothing acknowledged; the rest of
    # its read is not processed (the dispatch loop stops at a closing connection), so counted
    # as the per-packet path counts: one message received, one not stored
    before = _counts(b)
    v3 = raw(b, version=4)
    v3.connect(unique("p3"))
    v3.send(b"".join(R.publish(topic, _big("v3", k), qos=1, packet_id=k + 1)
                     for k in range(RUN)))
    assert not [p for p in v3.wait_closed(10) if p.type == R.PUBACK], "a 3.1.1 publish acked"
    _wait_counts(b, before, {"in": 1, "in1": 1, "pub": 1, "dropped": 1, "not_stored": 1})

    # space freed: runs are stored and acknowledged again, without a restart
    filler.unlink()
    (tmpfs / "topfill").unlink()
    wait_for(lambda: b.http_get("/readyz")[0] == 200, timeout=60,
             message="/readyz 200 once space was freed")
    assert all(rc == 0 for _, rc in run("after")), "refused once space was freed"
    assert b.stop() == 0
    copy = tmp_path / "copy"
    shutil.copytree(logdir, copy)
    with LogStore.open(str(copy)) as st:
        stored = [bytes(r.payload) for r in st.read(device, 0, 100_000, 1 << 30)]
    assert stored == acked, (
        f"the log holds {len(stored)} records, {len(acked)} were acknowledged: "
        f"{len(set(stored) - set(acked))} stored unacknowledged, "
        f"{len(set(acked) - set(stored))} acknowledged unstored")


# -- a cluster --------------------------------------------------------------------------------
def test_a_run_on_a_log_another_node_leads_goes_to_its_leader(tmp_path, raw) -> None:
    """Two nodes (static placement): a run published at n0 on a log n1 leads is not stored at
    n0: each message goes to n1 (an APPEND each, as packet by packet), acknowledged in order
    once n1 has it; n1's log holds each once, in order, and a subscriber at n1 gets them."""
    cluster = Cluster(tmp_path, n=2)
    cluster.start()
    try:
        device = cluster.device_owned_by(1, unique("far"))
        topic = f"devices/{device}/t"
        sub = raw(cluster.nodes[1], version=4)
        sub.connect(unique("far-sub"))
        sub.subscribe(topic, 1)
        cluster.wait_routes(1)
        pub = raw(cluster.nodes[0], version=5)
        pub.connect(unique("far-pub"))
        sent = [Sent(topic, b"f%02d" % i, 1, i + 1) for i in range(40)]
        pub.send(b"".join(R.publish(topic, s.payload, qos=1, packet_id=s.packet_id,
                                    version=5) for s in sent))
        assert _answers(pub, sent) == [(s.packet_id, 0) for s in sent]
        assert [p.payload for p in _publishes(sub, len(sent))] == [s.payload for s in sent]
        assert [bytes(r.payload) for r in _records(cluster.nodes[1], device)] == [
            s.payload for s in sent]
    finally:
        cluster.stop()


# -- the write gate ---------------------------------------------------------------------------
def test_a_run_is_refused_by_the_shut_write_gate_as_its_first_publish_is(tmp_path, raw
                                                                          ) -> None:
    """A one-node Raft cluster (lease_hold 0: refused at once, not held) whose metadata
    process is frozen: its leader lease runs out, and a v5 publisher's run on a log it leads
    gets DISCONNECT 0x9C at its first publish, as packet by packet; nothing of it is stored.
    (Before: a run while the gate is open is stored and acknowledged, as on a single node.)"""
    cluster = Cluster(tmp_path, n=1, raft=True, overrides={"cluster": {"lease_hold": 0.0}})
    cluster.start()
    try:
        node = cluster.nodes[0]
        device = unique("gate")
        topic = f"devices/{device}/t"
        pub = raw(node, version=5)
        pub.connect(unique("gp"))
        ok = [Sent(topic, b"ok%02d" % i, 1, i + 1) for i in range(30)]
        pub.send(b"".join(R.publish(topic, s.payload, qos=1, packet_id=s.packet_id,
                                    version=5) for s in ok))
        assert _answers(pub, ok) == [(s.packet_id, 0) for s in ok]
        meta = cluster.status(0)["metadata"]["pid"]
        os.kill(meta, signal.SIGSTOP)
        try:
            time.sleep(3 * node.config["cluster"].get("leader_lease", 0.5))  # lease out
            pub.send(b"".join(R.publish(topic, b"no%02d" % i, qos=1, packet_id=100 + i,
                                        version=5) for i in range(30)))
            got = pub.wait_closed(15)
        finally:
            os.kill(meta, signal.SIGCONT)
        assert [(p.type, p.reason_code) for p in got] == [(R.DISCONNECT, 0x9C)], got
        wait_for(lambda: _records(node, device) and len(_records(node, device)) >= 30,
                 timeout=30, message="the log readable")

        def stored_again() -> bool:
            c = raw(node, version=5)
            c.connect(unique("gp2"))
            c.send(R.publish(topic, b"end", qos=1, packet_id=1, version=5))
            try:
                p = c.recv(15)
            except (ConnectionError, TimeoutError):
                return False
            finally:
                c.close()
            return p.type == R.PUBACK and not p.reason_code

        wait_for(stored_again, timeout=30, interval=0.3,
                 message="acknowledged again once the lease is back")
        wait_for(lambda: bytes(_records(node, device)[-1].payload) == b"end", timeout=30,
                 message="the last publish readable")
        assert [bytes(r.payload) for r in _records(node, device)] == \
            [s.payload for s in ok] + [b"end"], "a refused run was stored"
    finally:
        cluster.stop()
