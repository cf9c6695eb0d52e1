"""A link to an owner coming back makes every session with a position in its logs read them back
(``broker/positions.py`` owner_back): one catch-up read per (session, device), all at once. The
owner answers at most 64 reads waiting on one link and refuses the rest as "busy" (each retried
a second later, all together again), so on a router with many sessions a link flap turned into
rounds of refused reads while every one of those sessions waited in lag mode (review3). The
reads to one owner are now paced (``broker/catchup.py``): none is refused.
"""

from __future__ import annotations

import time

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(180)

_SESSIONS = 12
_DEVICES = 20  # 240 positions in node 0's logs: well past the 64 reads an owner answers at once


def test_a_link_flap_with_many_positions_has_no_read_refused_and_misses_nothing(
        pair_via_proxy: tuple[Cluster, TcpProxy], clients: ClientFactory) -> None:
    cluster, proxy = pair_via_proxy
    n0, n1 = cluster.nodes
    prefix = unique("flap")
    devices = [cluster.device_owned_by(0, f"{prefix}{i}-") for i in range(_DEVICES)]
    subs = []
    for _ in range(_SESSIONS):
        sub = clients.connected(n1, unique("sub"), protocol=V5, clean=False, connect={
            "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600)})
        sub.subscribe("devices/+/t", 1)
        subs.append(sub)
    cluster.wait_routes(1, 1)
    pub = clients.connected(n0, protocol=V5)
    for d in devices:  # every session gets a position in each device log
        pub.publish(f"devices/{d}/t", f"{d}:a", 1)
    first = {f"{d}:a" for d in devices}
    got: list[list[str]] = [[] for _ in subs]

    def have(want: set[str]) -> bool:
        for i, sub in enumerate(subs):
            got[i].extend(m.payload.decode() for m in sub.drain())
        return all(want <= set(g) for g in got)

    wait_for(lambda: have(first), 60, message="the first message of every device everywhere")
    log_from = len(n1.log_text())

    proxy.cut()
    wait_for(lambda: cluster.link(1, 0)["state"] != "up", 60, message="the link seen down")
    proxy.heal()
    cluster.wait_links_up(60)
    for d in devices:
        pub.publish(f"devices/{d}/t", f"{d}:b", 1)
    want = first | {f"{d}:b" for d in devices}
    wait_for(lambda: have(want), 90, message="the second message of every device everywhere")
    time.sleep(1.0)  # a refusal is logged as its answer arrives
    refused = [line for line in n1.log_text()[log_from:].splitlines() if "is busy" in line]
    assert not refused, (f"{len(refused)} catch-up reads refused by the owner after one link "
                         f"flap, e.g. {refused[0][:300]}")
