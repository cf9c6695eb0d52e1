"""meshmq commit log: per-device logs in a shared, group-committed, segmented store.

Knows nothing of MQTT sockets; the broker maps publishes to ``append`` calls.
"""

from commitlog.epochs import StaleEpochError
from commitlog.fetch import (
    DeviceFetch,
    FetchBuffers,
    FetchColumns,
    FetchMeta,
    decode_fetch_buffers,
    decode_fetch_columns,
    decode_fetch_meta,
    decode_fetch_response,
    decode_multi_fetch,
    decode_multi_records,
    encode_fetch_raw,
    encode_fetch_response,
)
from commitlog.groupcommit import GroupCommitter
from commitlog.record import ATTR_QOS_MASK, ATTR_RETAIN, CorruptRecordError, Record
from commitlog.settings import LogSettings
from commitlog.stats import LogStats
from commitlog.store import (
    LogStore,
    LogStoreError,
    LogTruncatedError,
    LogWriteError,
    OffsetOutOfRangeError,
)

__all__ = [
    "ATTR_QOS_MASK",
    "ATTR_RETAIN",
    "CorruptRecordError",
    "DeviceFetch",
    "FetchBuffers",
    "FetchColumns",
    "FetchMeta",
    "GroupCommitter",
    "LogSettings",
    "LogStats",
    "LogStore",
    "LogStoreError",
    "LogTruncatedError",
    "LogWriteError",
    "OffsetOutOfRangeError",
    "Record",
    "StaleEpochError",
    "decode_fetch_buffers",
    "decode_fetch_columns",
    "decode_fetch_meta",
    "decode_fetch_response",
    "decode_multi_fetch",
    "decode_multi_records",
    "encode_fetch_raw",
    "encode_fetch_response",
]
