"""Record framing and fetch format: round trips, corruption detection, columnar decode."""

import pytest

from commitlog.fetch import (
    decode_fetch_columns,
    decode_fetch_meta,
    decode_fetch_response,
    encode_fetch_response,
)
from commitlog.record import (
    ATTR_RETAIN,
    HEADER_SIZE,
    CorruptRecordError,
    decode_batch,
    encode_batch,
    encoded_size,
    make_record,
)


def sample():
    return [
        make_record(0, 1_700_000_000_000_000, "dev-1", "sensors/dev-1/temp", 1, (), b"21.5"),
        make_record(1, 1_700_000_000_000_001, "dev-1", "sensors/dev-1/temp", 1 | ATTR_RETAIN,
                    [("content-type", b"json"), ("ünï", b"\x00\xff")], b'{"t": 22}'),
        make_record(0, -5, "dév-2", "a/ü/b", 2, (), b""),
        make_record(7, 3, "k", "", 0, (), b"x" * 100_000),
    ]


def test_batch_round_trip_and_sizes():
    recs = sample()
    data = encode_batch(recs)
    assert len(data) == sum(encoded_size(r) for r in recs)
    assert decode_batch(data) == recs


def test_every_single_byte_flip_is_detected():
    rec = sample()[1]
    data = bytearray(encode_batch([rec]))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(CorruptRecordError):
            decode_batch(bytes(bad))


def test_truncated_batch_is_detected():
    data = encode_batch(sample()[:2])
    for cut in range(1, HEADER_SIZE + 3):
        with pytest.raises(CorruptRecordError):
            decode_batch(data[:-cut])


def test_fetch_round_trip_and_meta():
    recs = sample()
    body = encode_fetch_response(recs, log_start=3, high_water=42)
    assert decode_fetch_meta(body) == (len(recs), 3, 42)
    assert decode_fetch_response(body) == recs
    assert decode_fetch_response(encode_fetch_response([])) == []


def test_fetch_count_mismatch_and_bad_magic():
    body = bytearray(encode_fetch_response(sample()))
    body[4] += 1
    with pytest.raises(CorruptRecordError):
        decode_fetch_response(bytes(body))
    with pytest.raises(CorruptRecordError):
        decode_fetch_response(b"XXXX" + bytes(body[4:]))


def test_columnar_decode_matches_records():
    recs = sample()
    cols = decode_fetch_columns(encode_fetch_response(recs), with_headers=True)
    assert cols.keys == [r.key for r in recs]
    assert cols.offsets == [r.offset for r in recs]
    assert cols.timestamps_us == [r.timestamp_us for r in recs]
    assert cols.topics == [r.topic for r in recs]
    assert cols.qos == [1, 1, 2, 0]
    assert cols.retain == [False, True, False, False]
    assert cols.payloads == [r.payload for r in recs]
    assert cols.headers == [list(r.headers) for r in recs]
