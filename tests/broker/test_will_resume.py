"""A delayed will that is due when its client reconnects to the same broker, before the
twice-a-second sweep fired it: published at the reconnect, once [MQTT-3.1.3-9] (the rule the
cross-node hand-over shares, ``Session.resume_will``; tests/cluster/test_will_handover.py).
Drops are read from the broker's own log (tests/helpers/wills.py)."""

from __future__ import annotations

import pytest
from helpers.clients import unique
from helpers.cluster import sleep_until
from helpers.wills import abort_one_by_one, back, collect, raw5, subscriber, with_will

pytestmark = pytest.mark.timeout(90)

WILL_DELAY = 2


def test_due_will_published_when_its_client_reconnects_before_the_sweep(broker) -> None:
    """Five clients, staggered by 0.1 s over the sweep's 0.5 s period, reconnect 0.05 s after
    their will delay ran out: some reconnects land before the sweep that would fire the will,
    and the reconnect must publish it then (a reconnect after the delay does not cancel it).
    Every will arrives exactly once (a sentinel after them)."""
    base = unique("wr")
    sub = subscriber(broker, f"{base}/#", unique("wrsub"))
    cids = [f"{base}-c{k}" for k in range(5)]
    conns = {cid: with_will(broker, cid, f"{base}/{cid}", WILL_DELAY) for cid in cids}
    dropped = abort_one_by_one(broker, conns)
    returned = []
    for cid in cids:
        sleep_until(dropped[cid] + WILL_DELAY + 0.05)
        returned.append(back(broker, cid, clean=False))
    sentinel = b"sentinel"
    sleep_until(max(dropped.values()) + WILL_DELAY + 1.0)  # every will settled by now
    pub = raw5(broker)
    pub.connect(unique("wrpub"))
    pub.publish(f"{base}/x", sentinel, 1)
    got = collect(sub, sentinel)
    wills = sorted(p.decode() for p in got if p != sentinel)
    assert wills == sorted(f"will:{cid}" for cid in cids), \
        f"wills due at the reconnect lost or doubled: {wills}"
    for c in (*returned, sub, pub):
        c.close()
