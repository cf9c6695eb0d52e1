"""Spark's ``headers`` column shows what publishers sent, not the broker's internal ``:src``
header (which peer's APPEND a record is: cluster/idempotence.py). No Spark session needed."""

from __future__ import annotations

from commitlog.fetch import decode_fetch_columns, encode_fetch_response
from commitlog.record import make_record
from spark_connector.arrow import to_record_batch


def test_the_internal_source_header_is_not_a_spark_header() -> None:
    recs = [make_record(0, 1_700_000_000_000_000, "d", "devices/d/t", 1,
                        [("h", b"v"), (":src", b"A" * 8 + bytes(8))], b"p")]
    batch = to_record_batch(decode_fetch_columns(encode_fetch_response(recs),
                                                 with_headers=True), True)
    assert batch.column("headers").to_pylist() == [[("h", "v")]]


def test_the_internal_publisher_header_is_not_a_spark_header() -> None:
    """``:pub`` (who published a record, for publisher dedupe: broker/pubdedupe.py) neither."""
    recs = [make_record(0, 1_700_000_000_000_000, "d", "devices/d/t", 1,
                        [("h", b"v"), (":pub", bytes(14))], b"p")]
    batch = to_record_batch(decode_fetch_columns(encode_fetch_response(recs),
                                                 with_headers=True), True)
    assert batch.column("headers").to_pylist() == [[("h", "v")]]
