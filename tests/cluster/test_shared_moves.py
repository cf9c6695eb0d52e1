"""Shared-subscription groups across routers miss no message when members move or a node fails
(issue 28, the chaos finding "a mesh fault never becomes a missed delivery").

Two QoS 1 members of ``$share/g/devices/<d>/#`` on different nodes; a publisher at node 0 (which
owns the device's log, so node 0 routes every message and picks the member router by round
robin). Then:

* **a member's node is killed** (kill -9 of the whole node) and the member reconnects at node 0:
  node 0 still holds the dead node's routes (a down link keeps them, by design), so one share
  in three went to a link that only delivers when the dead node comes back, where no member
  is left. Every message published once both members are subscribed again must arrive.
* **a member moves away from a frozen router** (SIGSTOP): the shares node 0 sends to it while
  it is frozen queue behind the CLAIM that ends the member's session there; once it runs
  again it has no member for them. They must be handed on to a router that has one (MQTT 5
  4.8.2; EMQX re-dispatches), not dropped as "unclaimed".

Real ``meshmq serve`` processes (tests/helpers/cluster.py), paho clients; messages are counted
across both members (which member gets one is the broker's choice; a duplicate is allowed).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, Client, ClientFactory, unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

N = 60  # messages published after the move: one in three went astray before the fix


def _received(*members: Client) -> set[str]:
    got: set[str] = set()
    for member in members:
        got.update(m.payload.decode() for m in member.drain())
    return got


def _wait_all(members: list[Client], want: set[str], timeout: float) -> set[str]:
    got: set[str] = set()

    def done() -> bool:
        got.update(_received(*members))
        return want <= got

    try:
        wait_for(done, timeout, interval=0.2, message="every shared message")
    except AssertionError:
        pass
    return got


def test_a_killed_members_node_gets_no_share_once_the_member_moved(
        tmp_path: Path, clients: ClientFactory) -> None:
    mesh = Cluster(tmp_path, n=3).start()
    try:
        n0, n1, n2 = mesh.nodes
        device = mesh.device_owned_by(0, unique("sh"))
        flt = f"$share/g/devices/{device}/#"
        m1 = clients.connected(n1, unique("m1"), protocol=V5)
        m1.subscribe(flt, 1)
        m2 = clients.connected(n2, unique("m2"), protocol=V5)
        m2.subscribe(flt, 1)
        mesh.wait_routes(1, 1)
        mesh.wait_routes(2, 1)
        # kill -9 of the whole node, a lost machine: the router first (frozen, so its
        # supervisor's death cannot make it drain gracefully), then the supervisor
        router2 = mesh.router_pid(2)
        os.kill(router2, signal.SIGSTOP)
        n2.kill()
        os.kill(router2, signal.SIGKILL)
        m2.stop()  # its client reconnects at node 0
        wait_for(lambda: mesh.link(0, 2)["state"] != "up", 30, message="n0 sees n2 down")
        m2b = clients.connected(n0, m2.client_id, protocol=V5)
        m2b.subscribe(flt, 1)
        pub = clients.connected(n0, protocol=V5)
        want = {f"m{i}" for i in range(N)}
        for payload in sorted(want):
            pub.publish(f"devices/{device}/t", payload, 1)  # waits for its PUBACK: stored
        got = _wait_all([m1, m2b], want, 30)
        missing = sorted(want - got, key=lambda s: int(s[1:]))
        assert not missing, (f"{len(missing)} of {N} stored shared messages never reached a "
                             f"member while n2 was down: {missing[:10]}")
    finally:
        mesh.stop()


def test_shares_reaching_a_router_whose_member_moved_are_handed_on(
        tmp_path: Path, clients: ClientFactory) -> None:
    # a long link timeout: the frozen router's link stays "up", so node 0 keeps sending to it
    # (as in the moment before a link times out, or a route delta still on its way)
    mesh = Cluster(tmp_path, n=3, overrides={"cluster": {"link_timeout": 60.0}}).start()
    try:
        n0, n1, n2 = mesh.nodes
        device = mesh.device_owned_by(0, unique("sh"))
        flt = f"$share/g/devices/{device}/#"
        m1 = clients.connected(n1, unique("m1"), protocol=V5)
        m1.subscribe(flt, 1)
        m2 = clients.connected(n2, unique("m2"), protocol=V5)
        m2.subscribe(flt, 1)
        mesh.wait_routes(1, 1)
        mesh.wait_routes(2, 1)
        router2 = mesh.router_pid(2)
        os.kill(router2, signal.SIGSTOP)
        try:
            m2.abort()  # its connection dies with the frozen router; the client moves to n0
            # (the CLAIM to the frozen router times out: a new session here, its CLAIM
            # queued on the link ahead of every share sent below)
            m2b = clients.connected(n0, m2.client_id, protocol=V5)
            m2b.subscribe(flt, 1)
            pub = clients.connected(n0, protocol=V5)
            want = {f"m{i}" for i in range(N)}
            for payload in sorted(want):
                pub.publish(f"devices/{device}/t", payload, 1)
        finally:
            os.kill(router2, signal.SIGCONT)
        got = _wait_all([m1, m2b], want, 30)
        missing = sorted(want - got, key=lambda s: int(s[1:]))
        unclaimed = n2.metric("meshmq_messages_dropped_total", reason="share_unclaimed")
        assert not missing, (f"{len(missing)} of {N} stored shared messages were lost at the "
                             f"router the member had left: {missing[:10]}; n2 dropped "
                             f"{unclaimed:.0f} as unclaimed")
    finally:
        mesh.stop()


def test_a_departing_members_unacked_shares_go_to_a_member_on_another_router(
        tmp_path: Path, clients: ClientFactory) -> None:
    """A member that never acks (paho manual_ack) holds its shares in flight; its connection
    drops (clean session: it ends). The only other member is on another router: its shares
    must cross to it (MQTT 5 4.8.2), where they used to be dropped for want of a local one."""
    mesh = Cluster(tmp_path, n=2).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(0, unique("sh"))
        flt = f"$share/g/devices/{device}/#"
        slow = clients.connected(n1, unique("slow"), protocol=V5, manual_ack=True)
        slow.subscribe(flt, 1)
        keen = clients.connected(n0, unique("keen"), protocol=V5)
        keen.subscribe(flt, 1)
        mesh.wait_routes(1, 1)
        pub = clients.connected(n0, protocol=V5)
        want = {f"m{i}" for i in range(N)}
        for payload in sorted(want):
            pub.publish(f"devices/{device}/t", payload, 1)
        held = {m.payload.decode() for m in slow.expect_messages(N // 2, timeout=20)}
        slow.abort()  # never acked: every one of them is owed to the group still
        got = _wait_all([keen], want, 30)
        missing = sorted(want - got, key=lambda s: int(s[1:]))
        assert not missing, (f"{len(missing)} of {N} shares the departed member held unacked "
                             f"({len(held)}) never reached the other member: {missing[:10]}")
    finally:
        mesh.stop()
