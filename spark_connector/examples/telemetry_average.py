"""Per-device 1-minute average of JSON telemetry (``{"temp": 21.5}``), written to Parquet.

    python -m spark_connector.examples.telemetry_average --out ./telemetry-avg

Reads ``devices/+/telemetry`` from every device log of a ``meshmq serve`` with defaults (admin
HTTP on 127.0.0.1:9883), from the earliest record, exactly once into Parquet: restart it and it
goes on from its checkpoint. A window is written once the watermark (2 minutes behind the newest
record) passes its end. ``--available-now`` processes what is there and stops.
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
    ap.add_argument("--out", default="telemetry-avg")
    ap.add_argument("--checkpoint", default=None, help="default: OUT/_checkpoint")
    ap.add_argument("--available-now", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.appName("meshmq-telemetry-average")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    # An installed meshmq[spark] is found by Spark's discovery (pyspark_meshmq); a checkout
    # installed with `pip install -e` is not, so register explicitly: harmless either way.
    register(spark)
    readings = (spark.readStream.format("meshmq")
                .option("servers", args.servers)
                .option("topicFilter", "devices/+/telemetry")
                .option("startingOffsets", "earliest")
                .load()
                .select("device", "timestamp",
                        F.get_json_object(F.col("payload").cast("string"), "$.temp")
                        .cast("double").alias("temp"))
                .where(F.col("temp").isNotNull()))
    averages = (readings.withWatermark("timestamp", "2 minutes")
                .groupBy(F.window("timestamp", "1 minute"), "device")
                .agg(F.avg("temp").alias("avg_temp"), F.count("*").alias("readings"))
                .select("device", F.col("window.start").alias("window_start"),
                        F.col("window.end").alias("window_end"), "avg_temp", "readings"))
    writer = (averages.writeStream.format("parquet").outputMode("append")
              .option("path", args.out)
              .option("checkpointLocation", args.checkpoint or os.path.join(args.out,
                                                                           "_checkpoint")))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime="10 seconds")
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
