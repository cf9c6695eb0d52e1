"""meshmq commit log: per-device logs in a shared, group-committed, segmented store.

Knows nothing of MQTT sockets; the broker maps publishes to ``append`` calls.
"""

from commitlog.fetch import (
    FetchColumns,
    FetchMeta,
    decode_fetch_columns,
    decode_fetch_meta,
    decode_fetch_response,
    encode_fetch_response,
)
from commitlog.groupcommit import GroupCommitter
from commitlog.record import ATTR_QOS_MASK, ATTR_RETAIN, CorruptRecordError, Record
from commitlog.settings import LogSettings
from commitlog.stats import LogStats
from commitlog.store import LogStore, LogStoreError, LogWriteError, OffsetOutOfRangeError

__all__ = [
    "ATTR_QOS_MASK",
    "ATTR_RETAIN",
    "CorruptRecordError",
    "FetchColumns",
    "FetchMeta",
    "GroupCommitter",
    "LogSettings",
    "LogStats",
    "LogStore",
    "LogStoreError",
    "LogWriteError",
    "OffsetOutOfRangeError",
    "Record",
    "decode_fetch_columns",
    "decode_fetch_meta",
    "decode_fetch_response",
    "encode_fetch_response",
]
