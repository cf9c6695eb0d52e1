"""The sink: rows become MQTT publishes (commands back to devices), at-least-once.

Each Spark task publishes its rows over its own connection and returns only when the server
has acknowledged every QoS 1 publish (PUBACK = committed to the device log, meshmq's promise);
any failure raises, the task fails and the batch is not committed, so a committed batch never
contains an unacknowledged row. A retried task or a restarted query publishes the batch again:
**at-least-once**, like Spark's Kafka sink without transactions. Consumers that must not act
twice deduplicate on a row id carried in the payload or a user property.

Columns: ``topic`` string (required), ``payload`` binary or string (required), ``qos`` int
(0 or 1, default 1), ``retain`` boolean (default false), ``properties`` map<string,string>
(MQTT 5 user properties). Other columns are refused at start, naming them, rather than dropped.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from spark_connector.mqtt import OutgoingMessage, Publisher, PublishError
from spark_connector.options import OptionError, SinkOptions

__all__ = ["MeshmqBatchWriter", "MeshmqStreamWriter", "PublishedMessage"]

log = logging.getLogger("spark_connector.sink")

_INT_TYPES = (IntegerType, LongType, ShortType, ByteType)


@dataclass
class PublishedMessage(WriterCommitMessage):
    partition_id: int
    rows: int


def check_sink_schema(schema: StructType) -> None:
    """Refuse a DataFrame the sink cannot publish, before any task runs."""
    fields = {f.name: f.dataType for f in schema.fields}
    allowed = {"topic", "payload", "qos", "retain", "properties"}
    extra = sorted(set(fields) - allowed)
    if extra:
        raise OptionError(f"the meshmq sink publishes columns topic, payload, qos, retain, "
                          f"properties; select them (unexpected: {', '.join(extra)})")
    if not isinstance(fields.get("topic"), StringType):
        raise OptionError("the meshmq sink needs a string column 'topic'")
    if not isinstance(fields.get("payload"), BinaryType | StringType):
        raise OptionError("the meshmq sink needs a 'payload' column (binary or string)")
    if "qos" in fields and not isinstance(fields["qos"], _INT_TYPES):
        raise OptionError("the meshmq sink's 'qos' column must be an integer (0 or 1)")
    if "retain" in fields and not isinstance(fields["retain"], BooleanType):
        raise OptionError("the meshmq sink's 'retain' column must be a boolean")
    props = fields.get("properties")
    if props is not None and not (isinstance(props, MapType)
                                  and isinstance(props.keyType, StringType)
                                  and isinstance(props.valueType, StringType)):
        raise OptionError("the meshmq sink's 'properties' column must be map<string,string>")


def _messages(rows: Iterator) -> Iterator[OutgoingMessage]:
    for row in rows:
        d = row.asDict()
        topic = d["topic"]
        payload = d["payload"]
        if topic is None or payload is None:
            raise PublishError("a row with a null topic or payload cannot be published")
        if isinstance(payload, str):
            payload = payload.encode()
        qos = d.get("qos")
        yield (topic, bytes(payload), 1 if qos is None else int(qos), bool(d.get("retain")),
               d.get("properties"))


def publish_rows(opts: SinkOptions, rows: Iterator) -> PublishedMessage:
    """Publish one task's rows; returns after the last PUBACK (or raises)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    client_id = (f"{opts.client_id or 'meshmq-spark'}-{pid}-{os.getpid()}-"
                 f"{uuid.uuid4().hex[:8]}")
    pub = Publisher(opts.servers, client_id, opts.username, opts.password,
                    opts.request_timeout_s, opts.max_inflight, opts.tls)
    try:
        n = pub.publish_all(_messages(rows))
    finally:
        pub.close()
    return PublishedMessage(pid, n)


class MeshmqBatchWriter(DataSourceWriter):
    """``df.write.format("meshmq").save()``."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema)
        self.opts = opts

    def write(self, iterator: Iterator) -> PublishedMessage:
        return publish_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        n = sum(m.rows for m in messages if isinstance(m, PublishedMessage))
        log.info("meshmq sink: %d rows published and acknowledged", n)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("meshmq sink: write aborted; rows of finished tasks stay published "
                    "(at-least-once)")


class MeshmqStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("meshmq")``: a batch commits only after all its tasks returned,
    i.e. after every row was acknowledged."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema)
        self.opts = opts

    def write(self, iterator: Iterator) -> PublishedMessage:
        return publish_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        n = sum(m.rows for m in messages if isinstance(m, PublishedMessage))
        log.info("meshmq sink: batch %d: %d rows published and acknowledged", batchId, n)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("meshmq sink: batch %d aborted; it is published again on retry "
                    "(at-least-once)", batchId)
