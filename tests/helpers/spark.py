"""Helpers for the Spark connector tests (tests/spark_connector): Spark's environment and
configuration for a driver process, and a paho publisher that returns once every record is
committed."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from helpers.broker import REPO_ROOT, BrokerProc


def spark_env(tmp: Path) -> dict[str, str]:
    """Environment for a process that starts a Spark driver (this one or a subprocess)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["SPARK_LOCAL_DIRS"] = str(tmp)
    return env


def spark_conf(tmp: Path) -> dict[str, str]:
    return {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(tmp),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.python.worker.reuse": "true",
        # idle triggers report progress every 0.5 s (default 10 s): tests wait on progress
        "spark.sql.streaming.noDataProgressEventInterval": "500ms",
    }


def unique_device(prefix: str = "d") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def admin(broker: BrokerProc) -> str:
    return f"{broker.host}:{broker.admin_port}"


def publish(broker: BrokerProc, messages: list[tuple[str, bytes]],
            user_properties: list[tuple[str, str]] | None = None,
            content_type: str | None = None, timeout: float = 60.0) -> None:
    """Publish with QoS 1 (MQTT 5) and return when every PUBACK arrived: each record is then
    committed in its device log."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(16)  # below the broker's Receive Maximum (32)
    client.max_queued_messages_set(0)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        props = None
        if user_properties or content_type:
            props = Properties(PacketTypes.PUBLISH)
            if user_properties:
                props.UserProperty = user_properties
            if content_type:
                props.ContentType = content_type
        infos = [client.publish(t, p, qos=1, properties=props) for t, p in messages]
        for info in infos:
            info.wait_for_publish(timeout)
            assert info.is_published(), "a QoS 1 publish was not acknowledged"
    finally:
        client.loop_stop()
        client.disconnect()


def device_messages(device: str, start: int, n: int) -> list[tuple[str, bytes]]:
    """``n`` messages for ``device`` whose payload names their sequence number."""
    return [(f"devices/{device}/telemetry", f"{device}:{i}".encode())
            for i in range(start, start + n)]
