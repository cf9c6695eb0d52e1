"""Review of the one cursor engine (broker/cursors.py) under a flapping owner, on real nodes.

A slow subscriber (Receive Maximum 4) on node 0 replays a device log that node 1 owns, from
``offset=earliest``, while the link between the two nodes is cut three times mid-replay and the
publisher keeps appending at the owner during each cut. The promise: a slow consumer is a lag,
never a drop, and per-device order holds. So every offset is delivered (a copy more is allowed
after a cut: at least once), and each first delivery comes after every earlier offset's (no
inversion, no gap), whether the cursor was reading from the owner, waiting for a retry, or live
when the link went; and a cut once the cursor is live loses nothing stored meanwhile.
"""

from __future__ import annotations

import time

import pytest
from helpers import raw as R
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(240)

_FIRST = 240  # stored before the replay starts
_PER_CUT = 30  # stored at the owner during each cut
_CUTS_AT = (40, 110, 180)  # first deliveries after which the link is cut


def _publish_n(pub: R.RawClient, topic: str, first: int, count: int) -> None:
    """QoS 1, pipelined, each PUBACK awaited: stored (at the owner, the publisher's node)."""
    for k in range(first, first + count):
        pub.send(R.publish(topic, str(k).encode(), qos=1, packet_id=k % 60000 + 1, version=5))
    for _ in range(count):
        ack = pub.expect(R.PUBACK, timeout=60)
        assert not ack.reason_code, ack


def test_a_slow_replay_across_three_owner_link_cuts_misses_nothing_and_keeps_order(
        pair_via_proxy: tuple[Cluster, TcpProxy], raw) -> None:
    cluster, proxy = pair_via_proxy
    device = cluster.device_owned_by(1, prefix=unique("r4flap"))
    topic = f"devices/{device}/t"
    pub = raw(cluster.nodes[1], version=5)
    pub.connect(unique("r4pub"))
    _publish_n(pub, topic, 0, _FIRST)
    total = _FIRST + _PER_CUT * len(_CUTS_AT)

    sub = raw(cluster.nodes[0], version=5)
    sub.connect(unique("r4sub"), properties={R.RECEIVE_MAXIMUM: 4})
    sub.send(R.subscribe(1, [(f"devices/{device}/#", 1)], version=5,
                         properties={R.USER_PROPERTY: [("offset", "earliest")]}))

    seen: list[int] = []
    firsts: list[int] = []
    got: set[int] = set()
    cuts = list(_CUTS_AT)
    published = _FIRST
    deadline = time.monotonic() + 150
    while len(got) < total:
        left = deadline - time.monotonic()
        assert left > 0, (
            f"timed out: {len(got)} of {total} offsets delivered; missing "
            f"{sorted(set(range(total)) - got)[:20]}... (a slow replay across owner link "
            f"cuts dropped or stalled)")
        pkt = sub.recv(timeout=min(left, 30))
        if pkt.type == R.SUBACK:
            assert pkt.reason_codes == [1], f"the offset subscription was refused: {pkt!r}"
            continue
        if pkt.type != R.PUBLISH:
            continue
        value = int(pkt.payload)
        seen.append(value)
        if value not in got:
            got.add(value)
            firsts.append(value)
        sub.ack(pkt)
        if cuts and len(got) >= cuts[0]:
            cuts.pop(0)
            proxy.cut()
            _publish_n(pub, topic, published, _PER_CUT)  # stored at the owner meanwhile
            published += _PER_CUT
            time.sleep(1.0)
            proxy.heal()
    inversions = [(a, b) for a, b in zip(firsts, firsts[1:], strict=False) if b < a]
    assert not inversions, (
        f"per-device order broken across owner link cuts: first deliveries went back "
        f"{inversions[:10]} (delivered: {seen[:50]}...)")
    assert firsts == list(range(total)), f"gaps or order: {firsts[:60]}..."

    # caught up (live), one more cut with publishes at the owner meanwhile: read back too
    proxy.cut()
    _publish_n(pub, topic, published, _PER_CUT)
    time.sleep(1.0)
    proxy.heal()
    want = set(range(published, published + _PER_CUT))
    later: list[int] = []
    while want - set(later):
        pkt = sub.expect(R.PUBLISH, timeout=60)
        later.append(int(pkt.payload))
        sub.ack(pkt)
    fresh = [v for i, v in enumerate(later) if v not in later[:i] and v >= published]
    assert fresh == sorted(want), f"after a cut while live: {later}"
