"""format("meshmq") as a sink: rows become QoS 1 publishes, acknowledged before a batch commits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, Client
from helpers.spark import admin, device_messages, publish, unique_device

HANG = 180.0


def mqtt_addr(broker: Any) -> str:
    return f"{broker.host}:{broker.port}"


def test_batch_and_stream_rows_reach_a_subscriber(spark: Any, shared_broker: Any,
                                                  tmp_path: Path) -> None:
    sub = Client(shared_broker, protocol=V5)
    sub.connect()
    sub.subscribe("cmd/#", qos=1)
    try:
        rows = [(f"cmd/dev{i % 3}", f"set {i}".encode(), i % 2, False, {"id": str(i)})
                for i in range(30)]
        df = spark.createDataFrame(
            rows, "topic string, payload binary, qos int, retain boolean, "
                  "properties map<string,string>")
        df.write.format("meshmq").option("servers", mqtt_addr(shared_broker)) \
            .mode("append").save()
        got = sub.expect_messages(30, timeout=HANG)
        assert sorted(m.payload for m in got) == sorted(r[1] for r in rows)
        ids = {m.payload: dict(m.properties.UserProperty) for m in got}
        assert ids[b"set 7"] == {"id": "7"}

        # the command job shape: a meshmq stream in, commands out, one batch
        dev = unique_device("c")
        publish(shared_broker, device_messages(dev, 0, 25))
        src = (spark.readStream.format("meshmq").option("servers", admin(shared_broker))
               .option("devices", dev).option("startingOffsets", "earliest").load()
               .selectExpr("concat('cmd/', device, '/ack') AS topic",
                           "cast(offset AS string) AS payload"))
        q = (src.writeStream.format("meshmq").option("servers", mqtt_addr(shared_broker))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(HANG)
        assert q.exception() is None
        got = sub.expect_messages(25, timeout=HANG)
        assert sorted(int(m.payload) for m in got) == list(range(25))
        assert {m.topic for m in got} == {f"cmd/{dev}/ack"}
    finally:
        sub.disconnect()


def test_sink_refuses_unknown_columns(spark: Any, shared_broker: Any) -> None:
    df = spark.createDataFrame([("cmd/x", b"p", 1)], "topic string, payload binary, prio int")
    with pytest.raises(Exception, match="prio"):
        df.write.format("meshmq").option("servers", mqtt_addr(shared_broker)) \
            .mode("append").save()


def test_broker_restart_mid_write_commits_no_unacknowledged_batch(
        spark: Any, new_broker: Any, tmp_path: Path) -> None:
    """SIGKILL the broker while a streaming batch is being published: the batch must not be
    committed; after the broker restarts, the query restarted from its checkpoint publishes it
    again and every row is in the device log (at-least-once)."""
    broker = new_broker()
    n = 40_000
    spark.range(n).selectExpr("concat('devices/sinkdev/cmd') AS topic",
                              "cast(id AS string) AS payload") \
        .repartition(2).write.parquet(str(tmp_path / "in"))
    schema = "topic string, payload string"
    ck = tmp_path / "ck"

    def start() -> Any:
        return (spark.readStream.schema(schema).parquet(str(tmp_path / "in"))
                .writeStream.format("meshmq").option("servers", mqtt_addr(broker))
                .option("requestTimeout", "20s")
                .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())

    def log_end() -> int:
        status, body = broker.http_get("/api/v1/logs/sinkdev")
        return json.loads(body)["end"] if status == 200 else 0

    q = start()
    try:
        wait_for(lambda: log_end() > 2000, HANG, interval=0.01, message="publishes committed")
        broker.kill()
        with pytest.raises(Exception) as info:
            q.awaitTermination(HANG)
        assert "MQTT" in str(info.value) or "connection" in str(info.value).lower(), \
            str(info.value)[-3000:]
    finally:
        q.stop()
    assert (ck / "offsets" / "0").exists()
    assert not (ck / "commits" / "0").exists(), "a batch with unacknowledged rows committed"
    broker.start()
    kept = log_end()
    assert 0 < kept < n  # acknowledged rows survived the kill; the batch was cut short
    q = start()
    try:
        assert q.awaitTermination(HANG)
        assert q.exception() is None
    finally:
        q.stop()
    assert (ck / "commits" / "0").exists()
    rows = spark.read.format("meshmq").option("servers", admin(broker)) \
        .option("devices", "sinkdev").load().selectExpr("cast(payload AS string) AS p")
    assert rows.distinct().count() == n
    assert rows.count() >= n
