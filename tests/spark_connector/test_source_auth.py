"""The Spark source reads a secured node (issue 27): bearer token (``tokenFile``) over HTTPS
(``caFile``), HTTP Basic (``username``/``password``), and a refusal reported as an
authentication error naming the user, the node and the options to set, never
``ServerUnavailable``; Kafka's option names work as aliases.

Real Spark local mode (the session-wide fixture), a real node with ``admin.token_file``, a
password file, an ACL and an HTTPS admin port. Spark tests are slow: few cases, one node.
"""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.authfiles import auth_overrides
from helpers.broker import BrokerProc
from helpers.certs import self_signed
from helpers.clients import V5, Client
from helpers.spark import device_messages, publish, unique_device

pytestmark = pytest.mark.timeout(600)

TOKEN = "spark-reader-token-0123456789"
USERS = {"alice": "alice-password"}
ACL = """\
topic readwrite devices/#

user alice
topic read devices/#

user reader
topic read devices/#
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProc, str, str]]:
    base = tmp_path_factory.mktemp("spark-auth")
    cert, key = self_signed(base)
    tokens = base / "admin.tokens"
    tokens.write_text(f"reader:{TOKEN}\n")
    overrides = auth_overrides(base / "auth", USERS, ACL, allow_anonymous=True)
    overrides.update({"admin": {"token_file": str(tokens), "certfile": cert, "keyfile": key},
                      "log": {"level": "info"}})
    broker = BrokerProc(base / "node", overrides, tls=(cert, key))  # + an MQTT TLS listener
    broker.start(wait=False)
    ctx = ssl.create_default_context(cafile=cert)
    deadline = time.monotonic() + 60
    while True:  # the helper's readiness probe speaks plain HTTP: ask over HTTPS here
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{broker.admin_port}/readyz",
                                        timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        assert broker.alive and time.monotonic() < deadline, broker.log_tail()
        time.sleep(0.1)
    try:
        yield broker, cert, str(tokens)
    finally:
        broker.stop()


def _reader(spark: Any, broker: BrokerProc, cert: str, device: str) -> Any:
    return (spark.read.format("meshmq")
            .option("servers", f"127.0.0.1:{broker.admin_port}")
            .option("caFile", cert).option("devices", device))


def test_token_file_over_https_and_basic_auth(spark: Any, secured: Any) -> None:
    broker, cert, tokens = secured
    device = unique_device("sa")
    publish(broker, device_messages(device, 0, 12))
    rows = _reader(spark, broker, cert, device).option("tokenFile", tokens).load().collect()
    assert sorted(r["offset"] for r in rows) == list(range(12))
    rows = _reader(spark, broker, cert, device).option("username", "alice") \
        .option("password", USERS["alice"]).load().collect()
    assert len(rows) == 12
    # a Kafka job's option names: subscribePattern (a device regex here: not the other
    # device) and startingOffsetsByTimestamp (per device; one far in the future: nothing)
    other = unique_device("sx")
    publish(broker, device_messages(other, 0, 3))
    future_ms = int(time.time() * 1000) + 3_600_000
    rows = (spark.read.format("meshmq").option("servers", f"https://127.0.0.1:"
                                                          f"{broker.admin_port}")
            .option("ssl.cafile", cert).option("token", TOKEN)
            .option("subscribePattern", device + "|nothing-else")
            .option("startingOffsetsByTimestamp", f'{{"{device}": {future_ms}}}')
            .load().collect())
    assert rows == []


def test_refusals_are_authentication_errors(spark: Any, secured: Any) -> None:
    broker, cert, _ = secured
    device = unique_device("sb")
    publish(broker, device_messages(device, 0, 2))
    with pytest.raises(Exception) as info:
        _reader(spark, broker, cert, device).load().collect()
    text = str(info.value)
    assert "requires credentials" in text and "username and password" in text, text[-2000:]
    assert "ServerUnavailable" not in text
    with pytest.raises(Exception) as info:
        _reader(spark, broker, cert, device).option("username", "alice") \
            .option("password", "wrong").load().collect()
    text = str(info.value)
    assert "authentication failed for user 'alice'" in text, text[-2000:]
    assert f"127.0.0.1:{broker.admin_port}" in text and "ServerUnavailable" not in text


def test_unknown_option_names_the_closest(spark: Any, secured: Any, tmp_path: Path) -> None:
    broker, cert, tokens = secured
    with pytest.raises(Exception) as info:
        spark.readStream.format("meshmq").option("servers", f"127.0.0.1:{broker.admin_port}") \
            .option("maxOffsetPerTrigger", "10").load()
    text = str(info.value)
    assert "did you mean 'maxOffsetsPerTrigger'?" in text, text[-2000:]


def test_sink_over_tls_and_its_refusal(spark: Any, secured: Any) -> None:
    """The sink publishes to the node's TLS listener with caFile; a wrong password is an
    authentication error naming the user and the options (issue 27)."""
    broker, cert, _ = secured
    topic = f"devices/{unique_device('sk')}/cmd"
    sub = Client(broker, protocol=V5)
    sub.connect()
    sub.subscribe(topic, qos=1)
    try:
        df = spark.createDataFrame([(topic, f"c{i}".encode()) for i in range(5)],
                                   "topic string, payload binary")
        df.write.format("meshmq").option("servers", f"127.0.0.1:{broker.tls_port}") \
            .option("caFile", cert).mode("append").save()
        got = sub.expect_messages(5, timeout=120)
        assert sorted(m.payload for m in got) == [f"c{i}".encode() for i in range(5)]
        with pytest.raises(Exception) as info:
            df.write.format("meshmq").option("servers", f"mqtts://127.0.0.1:{broker.tls_port}") \
                .option("caFile", cert).option("username", "alice") \
                .option("password", "wrong").mode("append").save()
        text = str(info.value)
        assert "authentication failed for user 'alice'" in text, text[-2000:]
    finally:
        sub.disconnect()
