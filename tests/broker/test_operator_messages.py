"""Messages that tell an operator or a client the right thing (issue 13): the port a listener
really got with port 0, and why a replay offset was refused."""

from __future__ import annotations

import re

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)


def test_port_zero_logs_the_port_picked(tmp_path):
    b = BrokerProc(tmp_path / "p0", {"listener": {"tcp": {"bind": "127.0.0.1:0"},
                                                  "ws": {"bind": "127.0.0.1:0"}}})
    b.start()
    try:
        text = b.log_text()
        tcp = re.search(r"listening listener=tcp bind=127\.0\.0\.1:(\d+)", text)
        ws = re.search(r"listening listener=ws bind=127\.0\.0\.1:(\d+)", text)
        ready = re.search(r"meshmq node ready .*mqtt=127\.0\.0\.1:(\d+)", text)
        assert tcp and ws and ready, text
        assert int(tcp.group(1)) > 0 and int(ws.group(1)) > 0
        assert ready.group(1) == tcp.group(1)
        c = R.RawClient("127.0.0.1", int(tcp.group(1)), version=4)
        c.connect(unique("p0"))
        c.close()
    finally:
        b.stop()


def test_replay_past_the_end_says_so(broker, raw):
    """An offset beyond the committed end is not blamed on retention (the fetch API already said
    "beyond the committed end")."""
    device = unique("pe")
    topic = f"devices/{device}/t"
    c = raw(broker, version=5)
    c.connect(unique("pe"))
    c.send(R.publish(topic, b"x", qos=1, packet_id=1, version=5))
    c.expect(R.PUBACK)
    ack = c.subscribe([(f"devices/{device}/#", 1)], packet_id=2,
                      properties={R.USER_PROPERTY: [("offset", "500")]})
    why = ack.properties.get(R.REASON_STRING, "")
    assert ack.reason_codes[0] >= 0x80, ack
    assert "beyond the committed end" in why and "retention" not in why, why
