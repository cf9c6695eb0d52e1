"""MQTT 5 details third-party suites checked (issue 28, "Also"): subscription identifiers of
overlapping subscriptions, and how the server closes after a Receive Maximum violation.

Raw sockets (tests/helpers/raw.py) so every byte checked is the one the server wrote.
"""

from __future__ import annotations

import socket
import time

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)


def test_overlapping_subscriptions_with_one_identifier_send_it_once(broker, raw):
    """[MQTT-3.3.4-3]: a message matching several subscriptions of one session is sent once,
    with the Subscription Identifiers of those subscriptions: each identifier once (two
    filters subscribed in one SUBSCRIBE share its identifier; a suite saw [2333, 2333])."""
    base = unique("sid")
    c = raw(broker, version=5)
    c.connect(unique("sidc"))
    ack = c.subscribe([(f"{base}/#", 1), (f"{base}/+/t", 1)], packet_id=1,
                      properties={R.SUBSCRIPTION_IDENTIFIER: 2333})
    assert ack.reason_codes == [1, 1], ack
    # a third overlapping filter with another identifier: both ids, each once
    ack = c.subscribe([(f"{base}/a/+", 1)], packet_id=2,
                      properties={R.SUBSCRIPTION_IDENTIFIER: 7})
    assert ack.reason_codes == [1], ack
    pub = raw(broker, version=5)
    pub.connect(unique("sidp"))
    pub.publish(f"{base}/a/t", b"one", 1, packet_id=1)
    got = c.expect(R.PUBLISH)
    c.ack(got)
    ids = got.properties.get(R.SUBSCRIPTION_IDENTIFIER)
    assert sorted(ids) == [7, 2333], f"subscription identifiers {ids}, want 2333 and 7 once each"
    pub.publish(f"{base}/b/t", b"two", 1, packet_id=2)
    got = c.expect(R.PUBLISH)
    assert got.properties.get(R.SUBSCRIPTION_IDENTIFIER) == [2333], got
    c.expect_none(0.5)


def test_receive_maximum_violation_disconnect_is_not_followed_by_a_reset(start_broker, raw):
    """After DISCONNECT 0x93 (Receive Maximum exceeded, 3.3.4) a client that is still writing
    (acks, the next publishes) must still be able to read the reason: the server half-closes
    and reads what keeps arriving for a moment instead of closing the socket at once, which
    makes the kernel answer the client's next bytes with a TCP RST (a client reset before it
    reads its input loses the DISCONNECT; a suite saw exactly that)."""
    b = start_broker(mqtt={"receive_maximum": 2})
    c = raw(b, version=5)
    c.connect(unique("rmrst"))
    topic = unique("rmrst") + "/t"
    # three QoS 2 publishes without PUBREL: the third is over Receive Maximum 2
    c.send(b"".join(R.publish(topic, b"x", qos=2, packet_id=pid, version=5)
                    for pid in (1, 2, 3)))
    disc = c.expect(R.DISCONNECT, skip=(R.PUBREC,))
    assert disc.reason_code == 0x93, disc
    sock = c.sock
    sock.settimeout(15)
    try:
        for pid in range(1, 11):  # still writing after the server's DISCONNECT
            sock.sendall(R.puback(pid))
            time.sleep(0.005)
        sock.shutdown(socket.SHUT_WR)
        tail = b""
        while chunk := sock.recv(4096):  # the server's FIN: an orderly end, not a reset
            tail += chunk
    except (ConnectionResetError, BrokenPipeError) as err:
        pytest.fail(f"the server reset the connection while the client was still writing "
                    f"after DISCONNECT 0x93 ({err!r}): it closed without draining")
    assert not tail, f"bytes after the DISCONNECT: {tail!r}"
