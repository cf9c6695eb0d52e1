"""The sending router's plain DELIVERs queued per run (issue 25, cheap crossings;
cluster/sendrun.py): one queue item for many entries, encoded in one C call.

What must hold: the compiled ``encode_run`` writes exactly the bytes of the Python reference
(which writes what the per-entry flush wrote), so a peer of any version reads the same entries;
a run split by the window (``take``) loses and repeats no entry; and ``link_window`` keeps its
meaning with runs: with the link losing everything, at most that many entries are
unacknowledged, the rest wait queued, and after the link flaps every one arrives, once and in
order, with the link's counts back to zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, unique
from helpers.cluster import Cluster
from helpers.tcpproxy import TcpProxy
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import Message
from cluster import frames
from cluster.sendrun import Run, encode_run, entry_items, plain_run_end

text = st.text(max_size=10)
messages = st.lists(st.tuples(text, st.binary(max_size=30), st.booleans(),
                              st.one_of(st.none(), text), st.integers(0, 2**32 - 1)),
                    min_size=1, max_size=12)


def _run(seq: int, qos: int, msgs: list) -> Run:
    run = Run(seq, qos)
    for topic, payload, retain, origin, epoch in msgs:
        flags, tlen, body = frames.entry_body(frames.DELIVER, topic, payload, qos, retain, None,
                                              origin, None, -1, None)
        run.items += ((flags, tlen), body, epoch)
        run.count += 1
        run.size += len(body) + 64
    return run


@pytest.mark.skipif(not frames.SPEEDUPS, reason="cluster._speedups not built")
@settings(max_examples=300, deadline=None)
@given(messages, st.integers(1, 2**63), st.integers(0, 2), st.booleans())
def test_compiled_run_encoding_gives_the_python_bytes(msgs: list, seq: int, qos: int,
                                                      with_epoch: bool) -> None:
    run = _run(seq, qos, msgs)
    assert frames.c_encode_run(seq, frames.DELIVER, run.items, with_epoch) == encode_run(
        seq, frames.DELIVER, run.items, with_epoch)


@settings(max_examples=200, deadline=None)
@given(messages, st.integers(1, 2**40), st.integers(0, 2), st.sampled_from([2, 3, 4]),
       st.integers(1, 12))
def test_a_run_reads_back_as_its_entries_and_splits_without_loss(msgs: list, seq: int,
                                                                 qos: int, version: int,
                                                                 cut: int) -> None:
    run = _run(seq, qos, msgs)
    whole = run.encode(version)
    got = frames.decode_entries(frames.encode_entries_parts([whole], run.count)[5:], version)
    assert [e.seq for e in got] == list(range(seq, seq + len(msgs)))
    for e, (topic, payload, retain, origin, epoch) in zip(got, msgs, strict=True):
        assert (e.kind, e.topic, e.payload, e.qos, e.retain, e.origin) == (
            frames.DELIVER, topic, payload, qos, retain, origin)
        assert e.epoch == (epoch if version >= frames.V_DELIVER_EPOCHS else -1)
    # the window lets only ``cut`` entries go: the two parts are the whole, nothing twice
    cut = min(cut, run.count)
    size, count = run.size, run.count
    first = run.take(cut)
    assert (first.seq, first.count, run.seq, run.count) == (seq, cut, seq + cut, count - cut)
    assert first.size + run.size == size
    assert first.encode(version) + run.encode(version) == whole


@settings(max_examples=300, deadline=None)
@given(text, st.lists(st.binary(max_size=30), max_size=12), st.integers(0, 2),
       st.one_of(st.none(), text), st.integers(0, 2**32 - 1))
def test_a_publishers_run_becomes_the_items_of_one_entry_each(
        topic: str, payloads: list, qos: int, origin: str | None, epoch: int) -> None:
    """``entry_items`` (Mesh.forward_run: one call for a publisher's run, appended to each
    link's queue at once) gives, compiled and in Python, exactly the items and byte count
    that one ``entry_body`` per message gave; a payload that is not bytes is refused whole."""
    want = _run(0, qos, [(topic, p, False, origin, epoch) for p in payloads])
    made = entry_items(topic, payloads, qos, origin, epoch)
    assert made is not None
    assert made == (want.items, want.size - 64 * len(payloads))
    if frames.SPEEDUPS:
        assert frames.c_entry_items(topic, payloads, qos, origin, epoch) == made
    odd = [*payloads, bytearray(b"x")]
    assert entry_items(topic, odd, qos, origin, epoch) is None
    if frames.SPEEDUPS:
        assert frames.c_entry_items(topic, odd, qos, origin, epoch) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "bench/p1"]), st.integers(0, 2),
                          st.booleans(), st.sampled_from([None, "c1", "c2"])),
                min_size=1, max_size=14))
def test_the_end_of_a_peers_run_is_found_alike_compiled_and_in_python(msgs: list) -> None:
    """``plain_run_end`` (Mesh.on_deliveries: a run of plain QoS 0 messages on one topic from
    one origin is routed as one): from every start, Python and the compiled one end each run
    where it ends (another topic, origin, QoS or RETAIN), with equal topics that are distinct
    str objects too (decode_plain shares them only within a frame)."""
    built = [Message("".join(list(topic)), b"x", qos, retain, None, None,
                     None if origin is None else "".join(list(origin)))
             for topic, qos, retain, origin in msgs]
    for i, first in enumerate(built):
        def joins(m: Message, first: Message = first) -> bool:
            return (not m.qos and not m.retain and m.topic == first.topic
                    and m.origin == first.origin)

        want = i + 1
        if joins(first):
            while want < len(built) and joins(built[want]):
                want += 1
        assert plain_run_end(built, i) == want, (i, msgs)
        if frames.SPEEDUPS:
            assert frames.c_plain_run_end(built, i) == want, (i, msgs)


def test_the_window_bounds_runs_and_a_flap_resends_them_once(tmp_path: Path,
                                                             clients: ClientFactory) -> None:
    """1,000 QoS 1 publishes for router 1's subscriber while the link to it loses every byte
    (unlogged: plain DELIVERs, queued in runs): 100 (link_window) go and are lost, 900 wait.
    The link drops and heals: the 100 are sent again, then the rest; each arrives once, in
    order, and the link's counts come back to nothing queued, nothing unacknowledged."""
    n, window = 1000, 100
    mesh = Cluster(tmp_path, n=2, overrides={"mqtt": {"max_queued_messages": 10_000},
                                             "cluster": {"link_window": window}})
    proxy = TcpProxy(mesh.mesh_ports[1])
    mesh.dial_via(0, 1, proxy.port)  # router 0 dials router 1 through the proxy
    pub = None
    try:
        mesh.start()
        topic = f"u/{unique('window')}/t"
        sub = clients.connected(mesh.nodes[1], protocol=V5, clean=True)
        sub.subscribe(topic, 1)
        mesh.wait_routes(1, 1)
        pub = R.RawClient(mesh.nodes[0].host, mesh.nodes[0].port, timeout=30)
        pub.send(R.connect(unique("window-pub")))
        pub.expect(R.CONNACK)
        proxy.blackhole()
        # in one write, so router 0 queues far more than the window in one tick (a client
        # library's publishes could arrive a few at a time, each batch within the window)
        pub.send(b"".join(R.publish(topic, str(i), qos=1, packet_id=i + 1) for i in range(n)))
        assert sorted(pub.expect(R.PUBACK).packet_id for _ in range(n)) == list(range(1, n + 1))
        wait_for(lambda: mesh.link(0, 1)["queued"] == n - window, 30,
                 message="what the window holds back, queued")
        link = mesh.link(0, 1)
        assert link["unacked"] == window and link["msgs_out"] == window, link
        proxy.cut()
        wait_for(lambda: mesh.link(0, 1)["state"] != "up", 30, message="the link seen down")
        proxy.heal()
        got = sub.expect_messages(n, timeout=60)
        assert [m.payload.decode() for m in got] == [str(i) for i in range(n)]
        sub.expect_no_message(1.0)
        wait_for(lambda: mesh.link(0, 1)["unacked"] == 0, 30, message="every entry acked")
        link = mesh.link(0, 1)
        assert link["queued"] == 0 and link["queued_bytes"] == 0, link
        assert link["resent"] >= window and link["reconnects"] >= 1, link
    finally:
        if pub is not None:
            pub.sock.close()
        clients.close_all()
        mesh.stop()
        proxy.close()
