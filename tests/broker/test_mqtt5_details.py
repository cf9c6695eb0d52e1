"""MQTT 5 details third-party suites checked (issue 28, "Also"): subscription identifiers of
overlapping subscriptions, and how the server closes after a Receive Maximum violation.

Raw sockets (tests/helpers/raw.py) so every byte checked is the one the server wrote.
"""

from __future__ import annotations

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
