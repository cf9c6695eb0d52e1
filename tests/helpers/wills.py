"""Raw MQTT 5 clients with delayed wills, and when a broker noticed their connection drop
(tests/cluster/test_will_handover.py, tests/broker/test_will_resume.py).

"Dropped" is read from the broker's own log line ("client disconnected ... client_id=..."), so
a test's waits count from when the router started the will delay, not from when the test
closed its socket: on a busy box the two can be far apart.
"""

from __future__ import annotations

import time
from typing import Any

from helpers import raw as R

EXPIRY = 60  # session expiry: longer than every wait in these tests, so only the delay decides


def raw5(node: Any) -> R.RawClient:
    return R.RawClient(node.host, node.port, version=5)


def with_will(node: Any, cid: str, topic: str, delay: int) -> R.RawClient:
    """A persistent session (clean start 0) whose will (payload ``will:<cid>``, QoS 1) waits
    ``delay`` seconds after an abnormal close."""
    c = raw5(node)
    c.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: EXPIRY},
              will=R.Will(topic, f"will:{cid}".encode(), qos=1,
                          properties={R.WILL_DELAY_INTERVAL: delay}))
    return c


def back(node: Any, cid: str, clean: bool) -> R.RawClient:
    """The client again, at ``node``, without a will (in a cluster the CONNACK comes after the
    claim)."""
    c = raw5(node)
    c.connect(cid, clean=clean, properties={R.SESSION_EXPIRY_INTERVAL: EXPIRY})
    return c


def drop_times(node: Any, offset: int, cids: list[str],
               timeout: float = 20.0) -> dict[str, float]:
    """time.monotonic() at which ``node``'s log (from byte ``offset``) first shows each
    client's connection lost: no earlier than the moment its router started the will delay."""
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
            f"the broker never logged these connections lost: {sorted(set(cids) - set(seen))}"
        time.sleep(0.02)
    return seen


def abort_one_by_one(node: Any, conns: dict[str, R.RawClient], gap: float = 0.1
                     ) -> dict[str, float]:
    """Close each connection abruptly (no DISCONNECT: the will stands), reading its drop from
    the log before the next, ``gap`` seconds apart: the will due times then spread over the
    broker's twice-a-second sweep, and each drop time is a tight upper bound."""
    dropped: dict[str, float] = {}
    for cid, conn in conns.items():
        offset = node.log_size()
        conn.abort()
        dropped.update(drop_times(node, offset, [cid]))
        time.sleep(gap)
    return dropped


def collect(sub: R.RawClient, until: bytes, timeout: float = 20.0) -> list[bytes]:
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


def subscriber(node: Any, flt: str, cid: str) -> R.RawClient:
    sub = raw5(node)
    sub.connect(cid)
    assert sub.subscribe(flt, 1).reason_codes == [1]
    return sub
