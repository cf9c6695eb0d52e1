"""What a subscriber got of a stream of numbered payloads, and the promise checked on it:
every committed one delivered, none older after a newer one, none twice (the per-device order
a leader change, a restart or a resend must keep). Shared by the cluster's delivery tests."""

from __future__ import annotations

import time


def collect(sub, want: list[str], timeout: float = 60.0, settle: float = 1.5,
            skip: str = "probe") -> list[str]:
    """The payloads ``sub`` gets (those starting with ``skip`` left out) until it holds all of
    ``want``, then for ``settle`` seconds more (a late copy must show)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not set(want) <= set(got) and time.monotonic() < deadline:
        got.extend(p for p in (m.payload.decode() for m in sub.drain())
                   if not (skip and p.startswith(skip)))
        time.sleep(0.05)
    time.sleep(settle)
    got.extend(p for p in (m.payload.decode() for m in sub.drain())
               if not (skip and p.startswith(skip)))
    return got


def check_stream(want: list[str], got: list[str]) -> None:
    """Every payload of ``want`` in ``got``, and ``got`` in ``want``'s order without repeats."""
    index = {p: i for i, p in enumerate(want)}
    missing = [p for p in want if p not in got]
    assert not missing, f"committed, never delivered: {missing[:12]} (got {got[-12:]})"
    back = [(a, b) for a, b in zip(got, got[1:], strict=False) if index[b] <= index[a]]
    assert not back, (f"an older message after a newer one (or again): {back[:6]}; "
                      f"stream tail {got[-30:]}")


def last_unacked_on_a_peer(cluster, clients, raw, tag: str, sub_qos: int) -> tuple:
    """The start of the "routed again" scenarios: node 0 leads a new device's log (static
    placement), a v5 subscriber on node 1 takes ``devices/<device>/#`` at ``sub_qos``, and a
    persistent publisher on node 0 publishes a0..a4 (each acked) then a5, whose PUBACK it
    never reads (as if node 0's router died between routing a5 and acknowledging it: the
    caller kills it). Returns (topic, sub, pub, client id, ["a0".."a5"])."""
    from helpers import raw as R
    from helpers.clients import V5, unique

    n0, n1 = cluster.nodes
    device = cluster.device_owned_by(0, unique(tag))
    topic = f"devices/{device}/t"
    sub = clients.connected(n1, protocol=V5)
    sub.subscribe(f"devices/{device}/#", sub_qos)
    cluster.wait_routes(1, 1)
    cid = unique(f"{tag}pub")
    pub = raw(n0)
    pub.connect(cid, clean=False)
    want = [f"a{i}" for i in range(6)]
    for i, p in enumerate(want[:-1]):
        assert pub.publish(topic, p, 1, packet_id=1 + i).reason_code in (None, 0)
    pub.send(R.publish(topic, "a5", qos=1, packet_id=6))
    return topic, sub, pub, cid, want
