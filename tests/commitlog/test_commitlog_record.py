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
    body = encode_fetch_response(recs, log_start=3, high_watermark=42)
    assert decode_fetch_meta(body) == (len(recs), 3, 42)
    assert decode_fetch_meta(body).high_water == 42  # the deprecated alias, for one release
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


def _column(offsets: bytes, data: bytes) -> list[bytes]:
    import struct

    o = struct.unpack(f"<{len(offsets) // 4}i", offsets)
    return [data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def test_buffer_decode_matches_records():
    """decode_fetch_buffers (the Spark source's path: Arrow buffers, no Python object per
    record) holds what the records hold, control records skipped, from any start offset."""
    import struct

    from commitlog.fetch import FETCH_HEADER, decode_fetch_buffers

    recs = sample() + [make_record(8, 9, "k", "x/y", 3 | ATTR_RETAIN, (), b"\x00")] * 9
    body = encode_fetch_response(recs)
    b = decode_fetch_buffers(body, FETCH_HEADER.size)
    n = len(recs)
    assert b.count == n
    assert [k.decode() for k in _column(b.key_offsets, b.key_data)] == [r.key for r in recs]
    assert [t.decode() for t in _column(b.topic_offsets, b.topic_data)] == [r.topic
                                                                           for r in recs]
    assert _column(b.payload_offsets, b.payload_data) == [r.payload for r in recs]
    assert list(struct.unpack(f"<{n}q", b.offsets)) == [r.offset for r in recs]
    assert list(struct.unpack(f"<{n}q", b.timestamps_us)) == [r.timestamp_us for r in recs]
    assert list(struct.unpack(f"<{n}i", b.qos)) == [r.attrs & 3 for r in recs]
    bits = [bool(b.retain[i >> 3] >> (i & 7) & 1) for i in range(n)]
    assert bits == [bool(r.attrs & ATTR_RETAIN) for r in recs]
    assert len(b.retain) == (n + 7) // 8
    # a range of the body (one device's section of a many-device fetch), as a memoryview
    one = encode_batch(recs[:2])
    part = decode_fetch_buffers(memoryview(body + one), len(body), len(body) + len(one))
    assert part.count == 2 and _column(part.payload_offsets, part.payload_data) == [
        r.payload for r in recs[:2]]
    with pytest.raises(CorruptRecordError):
        decode_fetch_buffers(body[:-1], FETCH_HEADER.size)
