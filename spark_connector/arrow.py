"""The source's schema, as Spark sees it and as pyarrow batches must carry it.

Why Arrow batches and a pyarrow schema built by hand: ``read()`` yielding ``pyarrow.RecordBatch``
runs ~4.5x faster than yielding tuples (measured, notes/spark-python-datasource.md), Spark checks
the batch schema for exact equality with ``to_arrow_schema(schema, timezone="UTC")``
(``timestamp[us, tz=UTC]``, nullability too), and parsing a DDL string inside ``read()`` needs a
SparkSession that workers do not have. ``tests/spark_connector`` compares the two schemas.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from commitlog.fetch import FetchBuffers, FetchColumns

__all__ = ["spark_schema", "arrow_schema", "to_record_batch", "buffers_to_record_batch",
           "topic_filter_mask", "topic_matches"]

_BASE_FIELDS = [
    ("device", StringType(), pa.string()),
    ("offset", LongType(), pa.int64()),
    ("timestamp", TimestampType(), pa.timestamp("us", tz="UTC")),
    ("topic", StringType(), pa.string()),
    ("qos", IntegerType(), pa.int32()),
    ("retain", BooleanType(), pa.bool_()),
    ("payload", BinaryType(), pa.binary()),
]
_HEADERS_ARROW = pa.map_(pa.string(), pa.string())
#: Record headers internal to the broker (broker/devicelogs.py H_SOURCE, broker/pubdedupe.py
#: H_PUBLISHER; not imported: the connector depends on commitlog/ only, never on the broker)
_INTERNAL = (":src", ":pub")


def spark_schema(include_headers: bool) -> StructType:
    """``device string, offset long, timestamp timestamp, topic string, qos int,
    retain boolean, payload binary[, headers map<string,string>]``."""
    fields = [StructField(name, st, True) for name, st, _ in _BASE_FIELDS]
    if include_headers:
        fields.append(StructField("headers", MapType(StringType(), StringType(), True), True))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [pa.field(name, at, True) for name, _, at in _BASE_FIELDS]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_ARROW, True))
    return pa.schema(fields)


_SCHEMA_NO_HEADERS = arrow_schema(False)


def to_record_batch(cols: FetchColumns, include_headers: bool,
                    keep: list[bool] | None = None) -> pa.RecordBatch:
    """Columns decoded by ``commitlog.fetch.decode_fetch_columns`` -> one RecordBatch.
    ``keep`` (topicFilter) masks records out after the arrays are built (one vectorised pass)."""
    arrays = [
        pa.array(cols.keys, pa.string()),
        pa.array(cols.offsets, pa.int64()),
        pa.array(cols.timestamps_us, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        pa.array(cols.topics, pa.string()),
        pa.array(cols.qos, pa.int32()),
        pa.array(cols.retain, pa.bool_()),
        pa.array(cols.payloads, pa.binary()),
    ]
    if include_headers:
        # Header values are bytes; MQTT user properties are UTF-8 strings by the spec, and the
        # binary correlation data is the only exception (decoded with U+FFFD replacement).
        # Repeated names keep the last value (a map has one value per key). ":src" (which
        # peer's APPEND a record is, for the owner's resend check: cluster/idempotence.py) is
        # the broker's, not the publisher's: left out, as MQTT replay leaves it out.
        arrays.append(pa.array(
            [{n: bytes(v).decode("utf-8", "replace") for n, v in h if n not in _INTERNAL}
             for h in cols.headers],
            _HEADERS_ARROW))
    batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
    if keep is not None:
        batch = batch.filter(pa.array(keep, pa.bool_()))
    return batch


def buffers_to_record_batch(b: FetchBuffers) -> pa.RecordBatch:
    """Column buffers (``commitlog.fetch.decode_fetch_buffers``) -> one RecordBatch without
    headers, zero-copy: ``from_buffers`` wraps the bytes as they are. Why: the list path
    (``to_record_batch``) makes ~8 Python objects per record and converts them back, ~1 µs
    per record, as much as everything else the worker does. No column has nulls (no
    validity buffer); UTF-8 of the string columns was checked while decoding."""
    n = b.count
    buf = pa.py_buffer
    arrays = [
        pa.Array.from_buffers(pa.string(), n, [None, buf(b.key_offsets), buf(b.key_data)]),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(b.offsets)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, buf(b.timestamps_us)]),
        pa.Array.from_buffers(pa.string(), n, [None, buf(b.topic_offsets), buf(b.topic_data)]),
        pa.Array.from_buffers(pa.int32(), n, [None, buf(b.qos)]),
        pa.Array.from_buffers(pa.bool_(), n, [None, buf(b.retain)]),
        pa.Array.from_buffers(pa.binary(), n, [None, buf(b.payload_offsets),
                                               buf(b.payload_data)]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMA_NO_HEADERS)


def topic_filter_mask(topics: pa.Array, filter_levels: list[str],
                      seen: dict[str, bool]) -> pa.Array:
    """Which rows' topics match the MQTT filter, matching each distinct topic once
    (``seen`` caches across batches)."""
    enc = topics.dictionary_encode()
    matches = []
    for t in enc.dictionary.to_pylist():
        m = seen.get(t)
        if m is None:
            m = seen[t] = topic_matches(filter_levels, t)
        matches.append(m)
    return pa.array(matches, pa.bool_()).take(enc.indices)


def topic_matches(filter_levels: list[str], topic: str) -> bool:
    """MQTT filter matching (MQTT 3.1.1 section 4.7). ``$``-topics never match a wildcard first
    level, like a broker subscription."""
    levels = topic.split("/")
    if filter_levels and filter_levels[0] in ("+", "#") and topic.startswith("$"):
        return False
    for i, f in enumerate(filter_levels):
        if f == "#":
            return True
        if i >= len(levels):
            return False
        if f != "+" and f != levels[i]:
            return False
    return len(levels) == len(filter_levels)
