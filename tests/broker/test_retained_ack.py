"""A retained publish is acknowledged once what it changes is stored, and never waits for a
write it does not need (issue 28, defect 11: retained clears acknowledged seconds late).

With ``mqtt.persistence`` a retained publish on an unlogged topic is acknowledged after its
``#retained`` state record is fsynced (broker/retainstore.py, ``devicelogs.RETAIN_ONLY``). The
broker's own ``$SYS/`` topics are never written there (they are republished), so a client's
retained publish on one has nothing to store: it used to join the group commit's batch anyway,
with no record to write and so no flush scheduled, and its PUBACK waited for whatever else
flushed next (a persistent session's 5 s checkpoint, another publish), or forever on an idle
broker. A dedicated broker, so nothing else flushes while the test waits.
"""

from __future__ import annotations

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("payload", [b"on", b""], ids=["set", "clear"])
def test_retained_publish_with_nothing_to_store_is_acknowledged(start_broker, raw,
                                                                 payload: bytes) -> None:
    """QoS 1 retained set and clear on a ``$SYS/`` topic of a client's own: PUBACK 0x00 (the
    change is made in memory, which is all this broker ever keeps of such a topic), and a
    QoS 1 retained publish on an ordinary unlogged topic after it still waits for its own
    fsync and is acknowledged (nothing else changes)."""
    b = start_broker(commitlog={"rules": [{"filter": "u/#", "log": False}]})
    c = raw(b, version=5)
    c.connect(unique("rsys"))
    topic = f"$SYS/{unique('app')}/state"
    c.send(R.publish(topic, payload, qos=1, retain=True, packet_id=1, version=5))
    try:
        ack = c.expect(R.PUBACK, timeout=20)
    except AssertionError as err:
        raise AssertionError(f"no PUBACK for a QoS 1 retained publish on {topic} in 20 s on "
                             f"an idle broker: it waits for a flush nothing schedules "
                             f"({err})") from None
    assert ack.packet_id == 1 and not ack.reason_code, ack
    ack = c.publish(f"u/{unique('r')}/x", payload, 1, retain=True, packet_id=2)
    assert ack.packet_id == 2 and not ack.reason_code, ack
    if payload:  # the set is retained (in memory) for a new subscriber
        s = raw(b, version=5)
        s.connect(unique("rsyss"))
        s.send(R.subscribe(1, [(topic, 1)], version=5))
        got = s.expect(R.PUBLISH, skip=(R.SUBACK,))
        assert (got.topic, got.payload, got.retain) == (topic, payload, True), got
