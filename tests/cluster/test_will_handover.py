"""Delayed wills across a cross-node hand-over (issue 28, defect 9).

A client with a delayed will drops from node 0 and comes back through node 1 (a load balancer
that picks another node): node 1's CLAIM makes node 0 hand the session over. The will pending at
node 0 is settled there exactly once, as a reconnect at node 0 would settle it: published if its
delay has run out (the twice-a-second sweep may not have fired it yet [MQTT-3.1.3-9]), cancelled
if the client came back in time (v5 3.1.3.2.2), published at once if the new connection starts
clean (the session ends before the delay, v5 3.1.2.5).

Real ``meshmq serve`` processes (tests/helpers/cluster.py), raw MQTT 5 sockets; will topics are
``u/...`` (unlogged). Drops are read from node 0's own log (tests/helpers/wills.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.clients import unique
from helpers.cluster import Cluster, sleep_until
from helpers.wills import (
    abort_one_by_one,
    back,
    collect,
    drop_times,
    raw5,
    subscriber,
    with_will,
)

pytestmark = pytest.mark.timeout(180)

WILL_DELAY = 2  # seconds
EARLY_DELAY = 4  # the client that comes back in time: a margin for a slow CONNECT on a busy box


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("willpair")), n=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_due_will_is_published_and_early_one_cancelled_at_a_cross_node_handover(
        pair: Cluster) -> None:
    """Five clients come back at node 1 just after their will delay ran out (staggered by
    0.1 s, so that some claims reach node 0 between the will's due time and the next sweep,
    the window where the hand-over used to drop it: 4 of 4 lost in the report); one (delay
    4 s) comes back at once, well within its delay. Each due will arrives once; the early one
    never (a sentinel published on its topic after its delay and a sweep passed comes first)."""
    n0, n1 = pair.nodes
    base = unique("wh")
    sub = subscriber(n0, f"u/{base}/#", unique("wsub"))
    due = [f"{base}-due{k}" for k in range(5)]
    early = f"{base}-early"
    early_conn = with_will(n0, early, f"u/{base}/{early}", EARLY_DELAY)
    conns = {cid: with_will(n0, cid, f"u/{base}/{cid}", WILL_DELAY) for cid in due}
    dropped = abort_one_by_one(n0, {early: early_conn})
    returned = [back(n1, early, clean=False)]
    dropped.update(abort_one_by_one(n0, conns))
    for cid in due:  # surely due at node 0 by the time the claim arrives there
        sleep_until(dropped[cid] + WILL_DELAY + 0.05)
        returned.append(back(n1, cid, clean=False))
    sentinel = b"sentinel"
    sleep_until(dropped[early] + EARLY_DELAY + 1.5)  # the early will's delay and a sweep passed
    pub = raw5(n0)
    pub.connect(unique("wpub"))
    pub.publish(f"u/{base}/{early}", sentinel, 1)
    got = collect(sub, sentinel)
    wills = [p.decode() for p in got if p != sentinel]
    missing = [cid for cid in due if f"will:{cid}" not in wills]
    assert not missing, (f"due wills never published after a hand-over to another node: "
                         f"{missing} (got {wills})")
    assert f"will:{early}" not in wills, \
        f"a will published although its client came back within the delay: {wills}"
    assert sorted(wills) == sorted(f"will:{cid}" for cid in due), f"a will twice: {wills}"
    for c in (*returned, sub, pub):
        c.close()


def test_clean_start_at_another_node_publishes_the_pending_will(pair: Cluster) -> None:
    """Clean Start 1 at node 1 ends the session held at node 0 before its 60 s will delay:
    the will is published then (v5 3.1.2.5, as a clean start at node 0 does), not dropped
    as "moved with the session"."""
    n0, n1 = pair.nodes
    base = unique("wc")
    cid = f"{base}-clean"
    sub = subscriber(n0, f"u/{base}/#", unique("wsub"))
    c = with_will(n0, cid, f"u/{base}/w", 60)
    offset = n0.log_size()
    c.abort()
    drop_times(n0, offset, [cid])
    again = back(n1, cid, clean=True)
    got = collect(sub, f"will:{cid}".encode())
    assert got.count(f"will:{cid}".encode()) == 1, got
    for conn in (again, sub):
        conn.close()
