"""``format("meshmq")``: the data source, its stream and batch readers.

Exactly once, the way Spark's Kafka source does it: the source only *names* ranges of committed,
immutable records (``{device: next_offset}``), Spark writes those offsets to the checkpoint before
a micro-batch runs, and a restarted query re-plans the same ranges from them. The records behind
an offset never change (the fetch API serves only committed records; offsets are dense per
device), so a replayed batch reads the same rows and an idempotent or transactional sink (file
sink, Delta) sees each record once.

Where code runs (notes/spark-python-datasource.md): ``initialOffset``/``latestOffset``/
``partitions``/``commit`` run in one long-lived Python process on the driver; ``read`` runs in
executor workers on an unpickled copy of the reader built at planning. So ``read`` only uses the
options and the partition it is given, and opens its own HTTP connection.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from commitlog.fetch import (
    STATUS_ABOVE_END,
    STATUS_BELOW_START,
    STATUS_OK,
    STATUS_UNKNOWN_DEVICE,
    DeviceFetch,
    decode_fetch_buffers,
    decode_records_columns,
)
from commitlog.record import CorruptRecordError
from spark_connector.arrow import (
    buffers_to_record_batch,
    spark_schema,
    to_record_batch,
    topic_filter_mask,
)
from spark_connector.client import MAX_DEVICES_PER_REQUEST, LogClient, LogRange
from spark_connector.options import (
    EARLIEST,
    LATEST,
    OptionError,
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from spark_connector.planning import DeviceRange, admit, group_ranges

__all__ = ["MeshmqDataSource", "MeshmqStreamReader", "MeshmqBatchReader", "DataLossError"]

log = logging.getLogger("spark_connector")


class DataLossError(RuntimeError):
    """Records the query still had to read are gone (retention, a deleted device log)."""


def _data_loss(device: str, lo: int, hi: int, why: str) -> DataLossError:
    return DataLossError(
        f"meshmq: records [{lo}, {hi}) of device {device!r} are gone ({why}). Set option "
        "failOnDataLoss=false to skip them and go on (logged), or restart the query from "
        "new startingOffsets.")


@dataclass
class MeshmqPartition(InputPartition):
    """Device ranges one Spark task reads: what ``read`` needs and nothing it must not carry."""

    ranges: list[DeviceRange]

    def __init__(self, ranges: list[DeviceRange]) -> None:
        super().__init__(None)
        self.ranges = ranges


def _sorted(offsets: dict[str, int]) -> dict[str, int]:
    """Spark compares offsets as JSON text: keys must be sorted or an unchanged offset looks
    new and an empty micro-batch runs forever (pitfall 4)."""
    return {d: int(offsets[d]) for d in sorted(offsets)}


class _Planner:
    """What the stream and batch readers share on the driver: the client and offset rules."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.client = LogClient(opts.servers, opts.request_timeout_s, opts.auth)

    def logs(self) -> dict[str, LogRange]:
        return {d: r for d, r in self.client.list_logs().items() if self.opts.wants(d)}

    def resolve(self, logs: dict[str, LogRange], default: str) -> dict[str, int]:
        """startingOffsets/startingTimestamp -> concrete {device: offset}."""
        spec = self.opts.starting_offsets
        if self.opts.starting_timestamp_ms is not None:
            ts_us = self.opts.starting_timestamp_ms * 1000
            return {d: self.client.offset_for_timestamp(d, ts_us) for d in logs}
        by_ts = self.opts.starting_timestamps_ms
        if by_ts is not None:  # Kafka's startingOffsetsByTimestamp, per device
            return {d: (self.client.offset_for_timestamp(d, by_ts[d] * 1000) if d in by_ts
                        else r.start) for d, r in logs.items()}
        spec = default if spec is None else spec
        if spec == "earliest":
            return {d: r.start for d, r in logs.items()}
        if spec == "latest":
            return {d: r.end for d, r in logs.items()}
        assert isinstance(spec, dict)
        out: dict[str, int] = {}
        for d, r in logs.items():  # devices the JSON does not name start at their earliest
            v = spec.get(d, EARLIEST)
            out[d] = r.start if v == EARLIEST else r.end if v == LATEST else v
        for d, v in spec.items():
            if d not in logs and self.opts.wants(d):  # not there yet: read it when it comes
                out[d] = 0 if v in (EARLIEST, LATEST) else v
        for d, v in out.items():
            r = logs.get(d)
            if r is not None and v > r.end:
                raise OptionError(f"option startingOffsets: offset {v} of device {d!r} is past "
                                  f"the end of its log ({r.end})")
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[MeshmqPartition]:
        ranges: list[DeviceRange] = []
        for d, hi in end.items():
            lo = start.get(d)
            is_new = lo is None
            lo = 0 if lo is None else int(lo)
            if int(hi) > lo:
                ranges.append((d, lo, int(hi), is_new))
        groups = group_ranges(ranges, self.opts.max_records_per_partition)
        return [MeshmqPartition(g) for g in groups]


def read_partition(opts: SourceOptions, partition: MeshmqPartition) -> Iterator[pa.RecordBatch]:
    """Fetch every range of ``partition`` and yield Arrow batches (runs on executors).

    One many-device fetch (``POST /api/v1/fetch``) serves all the partition's device ranges at
    once, up to ``fetchMaxBytes``; devices the budget did not reach are asked again with the
    rest. Each section's records are turned into Arrow columns in bulk (C loop when built, no
    Python object per record) and cut at the range's planned end: the server may hold more,
    the checkpointed offsets decide what this batch reads."""
    client = LogClient(opts.servers, opts.request_timeout_s, opts.auth)
    flt = opts.topic_filter.split("/") if opts.topic_filter is not None else None
    seen: dict[str, bool] = {}
    # device -> [next offset, planned end, is_new]; a device appears once per partition
    todo: dict[str, list] = {d: [lo, hi, is_new] for d, lo, hi, is_new in partition.ranges
                             if hi > lo}
    try:
        while todo:
            ask = list(todo.items())[:MAX_DEVICES_PER_REQUEST]
            most = max(st[1] - st[0] for _, st in ask)
            sections = client.fetch_many([(d, st[0]) for d, st in ask], most,
                                         opts.fetch_max_bytes)
            for sec in sections:
                batch = _section_batch(opts, sec, todo)
                if batch is None:
                    continue
                if flt is not None:
                    batch = batch.filter(topic_filter_mask(batch.column(3), flt, seen))
                yield batch
    finally:
        client.close()


def _section_batch(opts: SourceOptions, sec: DeviceFetch, todo: dict[str, list],
                   ) -> pa.RecordBatch | None:
    """One device's section: its records as a batch cut at the planned end (None if it has
    none this time), with ``todo`` moved on; data loss handled per ``failOnDataLoss``."""
    device = sec.device
    off, hi, is_new = todo[device]
    if sec.status == STATUS_BELOW_START:
        start = sec.log_start
        if not (is_new or not opts.fail_on_data_loss):
            raise _data_loss(device, off, min(start, hi), "deleted by retention")
        if not is_new:
            log.warning("meshmq: skipping records [%d, %d) of %r: deleted by retention "
                        "(failOnDataLoss=false)", off, min(start, hi), device)
        _advance(todo, device, start)
        return None
    if sec.status == STATUS_ABOVE_END:
        raise RuntimeError(
            f"meshmq: device {device!r} ends at {sec.high_watermark} on the server, but the "
            f"query's offsets reach {hi}: the log was truncated or this server is behind "
            "the one that planned the batch")
    if sec.status == STATUS_UNKNOWN_DEVICE:
        if opts.fail_on_data_loss:
            raise _data_loss(device, off, hi, "the device log is gone")
        log.warning("meshmq: device %r is gone; skipping [%d, %d) (failOnDataLoss=false)",
                    device, off, hi)
        del todo[device]
        return None
    if sec.status != STATUS_OK:
        raise RuntimeError(f"meshmq: unknown fetch status {sec.status} for {device!r}")
    if sec.record_count == 0:
        if sec.high_watermark <= off:
            raise RuntimeError(f"meshmq: no record at offset {off} of {device!r} although "
                               f"its end was {hi} when planned (server high-water mark now "
                               f"{sec.high_watermark}): truncated log or a lagging server")
        if sec.next_offset > off:  # records lost to quarantined corruption: past the gap
            _corrupt_loss(opts, device, off, min(sec.next_offset, hi))
            _advance(todo, device, sec.next_offset)
        return None  # the response's byte budget ran out before this device: ask again
    if opts.include_headers:
        cols = decode_records_columns(bytes(sec.records), 0, len(sec.records), True, True)
        batch = to_record_batch(cols, True)
    else:
        batch = buffers_to_record_batch(decode_fetch_buffers(sec.records, verify=True))
    if batch.num_rows != sec.record_count:
        raise CorruptRecordError(f"section of {device!r} says {sec.record_count} records, "
                                 f"holds {batch.num_rows}", 0)
    offsets = batch.column(1)
    first = offsets[0].as_py()
    if first < off:  # the server's contract; serving it would repeat records
        raise RuntimeError(f"meshmq: asked {device!r} from offset {off}, got {first}")
    if first > off:
        # The node skipped records lost to a corrupt record (it quarantined them and reported
        # them at ERROR; issues 11 and 28): data loss, as Kafka's source treats it.
        _corrupt_loss(opts, device, off, min(first, hi))
    take = batch.num_rows
    if offsets[take - 1].as_py() >= hi:  # more than planned: cut at the planned end
        take = bisect.bisect_left(_Offsets(offsets), hi)
        batch = batch.slice(0, take)
    if take and offsets[take - 1].as_py() - first + 1 != take:
        # Offsets are dense and never reused: a hole among the records is a lost range.
        prev = first
        for o in batch.column(1).to_pylist():
            if o > prev:
                _corrupt_loss(opts, device, prev, o)
            prev = o + 1
    nxt = offsets[take - 1].as_py() + 1 if take else hi
    if take == sec.record_count and sec.next_offset > nxt:  # a lost range ends this section
        _corrupt_loss(opts, device, nxt, min(sec.next_offset, hi))
    _advance(todo, device, max(nxt, sec.next_offset) if take == sec.record_count else nxt)
    return batch if take else None


def _corrupt_loss(opts: SourceOptions, device: str, lo: int, hi: int) -> None:
    """Offsets [lo, hi) the node lost to a corrupt record: fail the query, or (with
    failOnDataLoss=false) skip them with a WARNING, Kafka's meaning of the option."""
    if hi <= lo:
        return
    why = "lost to a corrupt record on the server, which quarantined it (see its ERROR log)"
    if opts.fail_on_data_loss:
        raise _data_loss(device, lo, hi, why)
    log.warning("meshmq: skipping records [%d, %d) of %r: %s (failOnDataLoss=false)",
                lo, hi, device, why)


class _Offsets:
    """An int64 Arrow array as a sorted sequence for ``bisect`` (O(log n) scalar reads)."""

    def __init__(self, arr: pa.Array) -> None:
        self.arr = arr

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, i: int) -> int:
        return self.arr[i].as_py()


def _advance(todo: dict[str, list], device: str, offset: int) -> None:
    st = todo[device]
    st[0] = offset
    if offset >= st[1]:
        del todo[device]


class MeshmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over device logs. Offsets: ``{device: next_offset}`` with sorted keys."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._planner = _Planner(opts)
        self._last_trigger = time.monotonic()
        self._available_now: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        logs = self._planner.logs()
        return _sorted(self._planner.resolve(logs, "latest"))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        # Spark has no composite max+min limit for Python sources: the max is Spark's limit,
        # the min (with its delay) is applied in latestOffset.
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Fix the target at what is committed now (Kafka does the same); batches split by
        maxRecordsPerTrigger until it is reached. minRecordsPerTrigger is ignored from here on,
        or the last, small batch would wait forever."""
        self._available_now = {d: r.end for d, r in self._planner.logs().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        start = {str(d): int(v) for d, v in start.items()}
        logs = self._planner.logs()
        frm: dict[str, int] = {}
        avail: dict[str, int] = {}
        for d, r in logs.items():
            end = r.end
            if self._available_now is not None:
                end = min(end, self._available_now.get(d, 0))
            lo = start.get(d)
            if lo is None:
                lo = r.start  # a new device: from its earliest retained record
            elif lo < r.start:
                if self.opts.fail_on_data_loss:
                    raise _data_loss(d, lo, r.start, "deleted by retention")
                log.warning("meshmq: records [%d, %d) of %r were deleted by retention before "
                            "they were read; skipping (failOnDataLoss=false)", lo, r.start, d)
                lo = r.start
            frm[d] = lo
            avail[d] = max(0, end - lo)
        for d, lo in start.items():
            if d not in logs and self.opts.wants(d):
                if self.opts.fail_on_data_loss and lo > 0:
                    raise _data_loss(d, lo, lo, "the device log is gone from the server")
        self._latest = _sorted({d: r.end for d, r in logs.items()})
        total = sum(avail.values())
        min_rows = self.opts.min_records_per_trigger
        if (min_rows is not None and self._available_now is None and total < min_rows
                and time.monotonic() - self._last_trigger < self.opts.max_trigger_delay_s):
            return _sorted(start)
        if isinstance(limit, ReadMaxRows):
            admitted = admit(avail, limit.max_rows)
        else:
            admitted = {d: n for d, n in avail.items() if n > 0}
        end_offsets = dict(start)
        for d, lo in frm.items():
            n = admitted.get(d, 0)
            if d in start or n > 0:
                end_offsets[d] = lo + n
        end_offsets = _sorted(end_offsets)
        if end_offsets != _sorted(start):
            self._last_trigger = time.monotonic()
        return end_offsets

    def reportLatestOffset(self) -> dict | None:  # noqa: N802
        return self._latest

    def partitions(self, start: dict, end: dict) -> list[MeshmqPartition]:
        return self._planner.partitions({str(k): int(v) for k, v in start.items()},
                                        {str(k): int(v) for k, v in end.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MeshmqPartition)
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        # Nothing to release: the node keeps no per-reader state (pull semantics).
        pass

    def stop(self) -> None:
        self._planner.client.close()

    def __getstate__(self) -> dict[str, object]:
        return {"opts": self.opts, "_planner": self._planner, "_last_trigger": 0.0,
                "_available_now": None, "_latest": None}


class MeshmqBatchReader(DataSourceReader):
    """``spark.read.format("meshmq")``: startingOffsets (default earliest) to endingOffsets
    (default latest), resolved once when the query is planned."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[MeshmqPartition]:
        planner = _Planner(self.opts)
        try:
            logs = planner.logs()
            start = planner.resolve(logs, "earliest")
            ending = self.opts.ending_offsets
            end: dict[str, int] = {}
            for d, r in logs.items():
                v = ending.get(d, LATEST) if isinstance(ending, dict) else LATEST
                end[d] = r.end if v == LATEST else min(v, r.end)
            for d, lo in start.items():
                r = logs.get(d)
                if r is not None and lo < r.start:
                    if self.opts.fail_on_data_loss:
                        raise _data_loss(d, lo, r.start, "deleted by retention")
                    start[d] = r.start
            return planner.partitions(start, end) or [MeshmqPartition([])]
        finally:
            planner.client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MeshmqPartition)
        return read_partition(self.opts, partition)


class MeshmqDataSource(DataSource):
    """``format("meshmq")``: a streaming and batch source over device logs, and a sink that
    publishes rows. Options: see the README's "Spark" section."""

    @classmethod
    def name(cls) -> str:
        return "meshmq"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.options = options
        # Fail load() on a key neither the source nor the sink knows (schema() validates the
        # reader's values; writer() the sink's).
        from spark_connector.options import KNOWN_KEYS, OPTION_KEYS, unknown_option
        for key in options:
            if key.lower() not in KNOWN_KEYS:
                raise unknown_option(key, OPTION_KEYS, "format('meshmq')")

    def _source_options(self) -> SourceOptions:
        return parse_source_options(self.options)

    def schema(self) -> StructType:
        return spark_schema(self._source_options().include_headers)

    def streamReader(self, schema: StructType) -> MeshmqStreamReader:  # noqa: N802
        opts = self._source_options()
        if opts.ending_offsets_given:
            raise OptionError("option endingOffsets is for batch reads (spark.read); a "
                              "streaming query runs until it is stopped")
        return MeshmqStreamReader(opts)

    def reader(self, schema: StructType) -> MeshmqBatchReader:
        opts = self._source_options()
        if opts.max_records_per_trigger or opts.min_records_per_trigger:
            raise OptionError("options maxRecordsPerTrigger/minRecordsPerTrigger are for "
                              "streaming queries (spark.readStream)")
        return MeshmqBatchReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_connector.sink import MeshmqBatchWriter
        return MeshmqBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool  # noqa: N802
                     ) -> DataSourceStreamWriter:
        from spark_connector.sink import MeshmqStreamWriter
        return MeshmqStreamWriter(parse_sink_options(self.options), schema)


def offsets_json(offsets: dict[str, int]) -> str:
    """An offsets dict as the JSON Spark keeps in the checkpoint (sorted keys)."""
    return json.dumps(_sorted(offsets))
