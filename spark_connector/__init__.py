"""meshmq's Spark connector: ``format("meshmq")`` reads device logs (stream and batch) through a
node's admin HTTP fetch API and publishes rows back over MQTT. Install with ``meshmq[spark]``.

Depends only on ``commitlog``'s record format (decoding) and HTTP/MQTT, never on the broker.
Spark finds the source with no call in user code through the ``pyspark_meshmq`` module
(PySpark's data-source discovery imports every top-level ``pyspark_*`` module exposing a
``DefaultSource``); ``register(spark)`` is the explicit way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register", "MeshmqDataSource"]


def register(spark: SparkSession) -> None:
    """Register ``format("meshmq")`` on ``spark`` (only needed where discovery cannot see the
    ``pyspark_meshmq`` module, e.g. a package shipped with ``--py-files``)."""
    from spark_connector.source import MeshmqDataSource

    spark.dataSource.register(MeshmqDataSource)


def __getattr__(name: str) -> Any:
    # Lazy, so importing spark_connector.options or .planning needs no pyspark.
    if name == "MeshmqDataSource":
        from spark_connector.source import MeshmqDataSource

        return MeshmqDataSource
    raise AttributeError(name)
