"""Publish a command back to every device whose telemetry runs hot.

    python -m spark_connector.examples.command_job --threshold 30

Reads ``devices/+/telemetry`` JSON (``{"temp": 31.2}``) from a ``meshmq serve`` with defaults
and, for each reading above ``--threshold``, publishes ``{"cmd": "cool", "offset": N}`` to
``devices/<device>/cmd`` over MQTT (127.0.0.1:1883) with QoS 1. Every row's PUBACK arrives
before Spark commits the batch; after a crash the batch is published again (at-least-once:
the ``offset`` in the command lets a device drop a repeat). The reader's ``topicFilter`` keeps
the job from reading its own commands back from the device log.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_connector import register


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="127.0.0.1:9883", help="admin HTTP of meshmq nodes")
    ap.add_argument("--mqtt", default="127.0.0.1:1883", help="MQTT listener to publish to")
    ap.add_argument("--threshold", type=float, default=30.0)
    ap.add_argument("--checkpoint", default="command-job-checkpoint")
    ap.add_argument("--available-now", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.appName("meshmq-command-job")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    # An installed meshmq[spark] is found by Spark's discovery (pyspark_meshmq); a checkout
    # installed with `pip install -e` is not, so register explicitly: harmless either way.
    register(spark)
    temp = F.get_json_object(F.col("payload").cast("string"), "$.temp").cast("double")
    commands = (spark.readStream.format("meshmq")
                .option("servers", args.servers)
                .option("topicFilter", "devices/+/telemetry")
                .load()  # startingOffsets defaults to latest: react to new readings only
                .where(temp > args.threshold)
                .select(F.concat(F.lit("devices/"), "device", F.lit("/cmd")).alias("topic"),
                        F.to_json(F.struct(F.lit("cool").alias("cmd"),
                                           F.col("offset"))).alias("payload"),
                        F.lit(1).alias("qos")))
    writer = (commands.writeStream.format("meshmq").option("servers", args.mqtt)
              .option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime="2 seconds")
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
