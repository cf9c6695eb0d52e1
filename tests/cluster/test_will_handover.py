"""Delayed wills across a cross-node hand-over (issue 28, defect 9).

A client with a delayed will drops from node 0 and comes back through node 1 (a load balancer
that picks another node): node 1's CLAIM makes node 0 hand the session over. The will pending at
node 0 is settled there exactly once, as a reconnect at node 0 would settle it: published if its
delay has run out (the twice-a-second sweep may not have fired it yet [MQTT-3.1.3-9]), cancelled
if the client came back in time (v5 3.1.3.2.2), published at once if the new connection starts
clean (the session ends before the delay, v5 3.1.2.5).

Real ``meshmq serve`` processes (tests/helpers/cluster.py), raw MQTT 5 sockets; will topics are
``u/...`` (unlogged). "Dropped" is read from node 0's own log line, so every wait counts from
when the router started the will delay, not from when the test closed its socket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc
from helpers.clients import unique
from helpers.cluster import Cluster, sleep_until

pytestmark = pytest.mark.timeout(180)

WILL_DELAY = 2  # seconds
EARLY_DELAY = 4  # the client that comes back in time: a margin for a slow CONNECT on a busy box
EXPIRY = 60  # session expiry: longer than every wait here, so only the delay decides


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("willpair")), n=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _raw(node: BrokerProc) -> R.RawClient:
    return R.RawClient(node.host, node.port, version=5)


def _with_will(node: BrokerProc, cid: str, topic: str, delay: int) -> R.RawClient:
    c = _raw(node)
    c.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: EXPIRY},
              will=R.Will(topic, f"will:{cid}".encode(), qos=1,
                          properties={R.WILL_DELAY_INTERVAL: delay}))
    return c


def _back(node: BrokerProc, cid: str, clean: bool) -> R.RawClient:
    """The client again, at ``node``, without a will; the CONNACK comes after the claim."""
    c = _raw(node)
    c.connect(cid, clean=clean, properties={R.SESSION_EXPIRY_INTERVAL: EXPIRY})
    return c


def _drop_times(node: BrokerProc, offset: int, cids: list[str],
                timeout: float = 20.0) -> dict[str, float]:
    """time.monotonic() at which ``node``'s log first shows each client's connection lost: no
    earlier than the moment its router started the will delay."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(cids):
        now = time.monotonic()
        for line in node.log_since(offset).splitlines():
            if "client disconnected" not in line:
                continue
            for cid in cids:
                if cid not in seen and f"client_id={cid} " in line + " ":
                    seen[cid] = now
        assert time.monotonic() < deadline, \
            f"node 0 never logged these connections lost: {sorted(set(cids) - set(seen))}"
        time.sleep(0.02)
    return seen


def _collect(sub: R.RawClient, until: bytes, timeout: float = 20.0) -> list[bytes]:
    """Payloads ``sub`` receives (acked) up to and including ``until``."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while until not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"{until!r} never arrived; got {got}"
        try:
            pkt = sub.recv(left)
        except TimeoutError:
            continue
        if pkt.type == R.PUBLISH:
            sub.ack(pkt)
            got.append(pkt.payload)
    return got


def _subscriber(node: BrokerProc, flt: str) -> R.RawClient:
    sub = _raw(node)
    sub.connect(unique("wsub"))
    assert sub.subscribe(flt, 1).reason_codes == [1]
    return sub


def test_due_will_is_published_and_early_one_cancelled_at_a_cross_node_handover(
        pair: Cluster) -> None:
    """Five clients come back at node 1 just after their will delay ran out (staggered by
    0.1 s, so that some claims reach node 0 between the will's due time and the next sweep,
    the window where the hand-over used to drop it: 4 of 4 lost in the report); one (delay
    4 s) comes back at once, well within its delay. Each due will arrives once; the early one
    never (a sentinel published on its topic after its delay and a sweep passed comes first)."""
    n0, n1 = pair.nodes
    base = unique("wh")
    sub = _subscriber(n0, f"u/{base}/#")
    due = [f"{base}-due{k}" for k in range(5)]
    early = f"{base}-early"
    cids = [early, *due]
    conns = {cid: _with_will(n0, cid, f"u/{base}/{cid}",
                             EARLY_DELAY if cid == early else WILL_DELAY) for cid in cids}
    dropped: dict[str, float] = {}
    back: list[R.RawClient] = []
    for cid in cids:
        offset = n0.log_size()
        conns[cid].abort()  # no DISCONNECT: the will stands
        dropped.update(_drop_times(n0, offset, [cid]))  # read at once: a tight upper bound
        if cid == early:
            back.append(_back(n1, early, clean=False))
        time.sleep(0.1)
    for cid in due:  # surely due at node 0 by the time the claim arrives there
        sleep_until(dropped[cid] + WILL_DELAY + 0.05)
        back.append(_back(n1, cid, clean=False))
    sentinel = b"sentinel"
    sleep_until(dropped[early] + EARLY_DELAY + 1.5)  # the early will's delay and a sweep passed
    pub = _raw(n0)
    pub.connect(unique("wpub"))
    pub.publish(f"u/{base}/{early}", sentinel, 1)
    got = _collect(sub, sentinel)
    wills = [p.decode() for p in got if p != sentinel]
    missing = [cid for cid in due if f"will:{cid}" not in wills]
    assert not missing, (f"due wills never published after a hand-over to another node: "
                         f"{missing} (got {wills})")
    assert f"will:{early}" not in wills, \
        f"a will published although its client came back within the delay: {wills}"
    assert sorted(wills) == sorted(f"will:{cid}" for cid in due), f"a will twice: {wills}"
    for c in (*back, sub, pub):
        c.close()


def test_clean_start_at_another_node_publishes_the_pending_will(pair: Cluster) -> None:
    """Clean Start 1 at node 1 ends the session held at node 0 before its 60 s will delay:
    the will is published then (v5 3.1.2.5, as a clean start at node 0 does), not dropped
    as "moved with the session"."""
    n0, n1 = pair.nodes
    base = unique("wc")
    cid = f"{base}-clean"
    sub = _subscriber(n0, f"u/{base}/#")
    c = _with_will(n0, cid, f"u/{base}/w", 60)
    offset = n0.log_size()
    c.abort()
    _drop_times(n0, offset, [cid])
    again = _back(n1, cid, clean=True)
    got = _collect(sub, f"will:{cid}".encode())
    assert got.count(f"will:{cid}".encode()) == 1, got
    for conn in (again, sub):
        conn.close()
