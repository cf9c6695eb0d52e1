"""A Spark driver run as a subprocess by test_driver_crash.py (so the test can kill -9 it):
streams device logs into Parquet with Trigger.AvailableNow.

usage: driver_job.py SERVERS DEVICE_PATTERN CHECKPOINT OUT MAX_PER_TRIGGER SCRATCH
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from helpers.spark import spark_conf  # noqa: E402


def main() -> None:
    servers, pattern, checkpoint, out, per_trigger, scratch = sys.argv[1:7]
    builder = SparkSession.builder.master("local[2]").appName("meshmq-driver-job")
    for key, value in spark_conf(Path(scratch)).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    query = (spark.readStream.format("meshmq").option("servers", servers)
             .option("devicePattern", pattern).option("startingOffsets", "earliest")
             .option("maxRecordsPerTrigger", per_trigger)
             .option("maxRecordsPerPartition", str(max(1, int(per_trigger) // 4)))
             .load()
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()
    print("DRIVER-JOB-DONE", flush=True)


if __name__ == "__main__":
    main()
