"""Both ends of a read of a device log over the mesh (FETCH / RECORDS), as plain functions.

The leader's side (``serve_fetch``) answers with the stored record bytes unchanged, its log end,
high-water mark and leader epoch (Kafka's fetch response: log start, high-water mark, log end;
the leader epoch of KIP-320), or, for a replica whose last fetched epoch shows that its log took
another turn than this one, the diverging epoch and where it ended (``cluster/fencing.py``).
The reader's side (``fetch_result``) turns the answer into the broker's ``FetchResult``. The mesh
(cluster/mesh.py) keeps the requests and the links; version-dependent bytes are frames.py's.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.forwarding import FetchResult
from cluster import frames
from cluster.fencing import diverging
from commitlog.record import decode_batch
from commitlog.store import OffsetOutOfRangeError

log = logging.getLogger("cluster.mesh")

FETCH_MAX_RECORDS = 1000
FETCH_MAX_BYTES = 1 << 20  # per RECORDS frame: one replay step's worth, far below MAX_FRAME


class RawRecords:
    """A FETCH's ``done`` that wants the RECORDS answer as it came (a follower's fetch,
    cluster/fetcher.py: the bytes are appended unchanged, and the log end, epoch or
    diverging answer matter), not decoded into a ``FetchResult`` for a reader."""

    __slots__ = ("call",)

    def __init__(self, call: Any) -> None:
        self.call = call

    def __call__(self, r: frames.Records) -> None:
        self.call(r)


def serve_fetch(store: Any, f: frames.Fetch, epoch: int) -> frames.Records:
    """The answer of this router, leading ``f.device``'s log at ``epoch``, to a peer's FETCH."""
    req, device, offset = f.request, f.device, f.offset
    start, hw = store.log_range(device)
    end = store.durable_end(device)
    split = diverging(store, device, offset, f.last_epoch)
    if split is not None:
        return frames.Records(req, frames.RECORDS_DIVERGING, start, hw, offset, b"", end,
                              epoch, *split)
    try:
        chunks, count, nxt = store.read_raw(device, offset,
                                            min(f.max_records, FETCH_MAX_RECORDS),
                                            FETCH_MAX_BYTES)
    except OffsetOutOfRangeError:
        return frames.Records(req, frames.RECORDS_OUT_OF_RANGE, start, hw, offset, b"", end,
                              epoch)
    except Exception as err:  # noqa: BLE001 - the reader hears why and retries
        log.warning("serving a peer's log read failed: %s", err,
                    extra={"device": device, "offset": offset})
        return frames.Records(req, frames.RECORDS_FAILED, start, hw, offset,
                              str(err).encode()[:2000], end, epoch)
    if not count:
        nxt = store.past_gap(device, offset)  # quarantined offsets: go on past them
    return frames.Records(req, frames.RECORDS_OK, start, hw, nxt, b"".join(chunks), end, epoch)


def fetch_result(r: frames.Records) -> FetchResult:
    """The reader's view of a RECORDS answer: the records decoded here, from the bytes the
    leader stored, or why there are none (a corrupt answer fails: the reader reads again)."""
    start, hw, nxt, data = r.log_start, r.high_watermark, r.next_offset, r.data
    if r.status == frames.RECORDS_OK:
        try:
            records = decode_batch(data) if data else []
        except Exception as err:  # noqa: BLE001 - a corrupt answer: read again later
            return FetchResult("failed", [], start, hw, nxt, f"bad records: {err}")
        return FetchResult("ok", records, start, hw, nxt, "")
    if r.status == frames.RECORDS_OUT_OF_RANGE:
        return FetchResult("out_of_range", [], start, hw, nxt, "")
    if r.status == frames.RECORDS_DIVERGING:  # only a replica's fetch (issue 24) is answered so
        return FetchResult("failed", [], start, hw, nxt,
                           f"diverged: epoch {r.diverging_epoch} ended at offset "
                           f"{r.diverging_end} at the leader")
    return FetchResult("failed", [], start, hw, nxt,
                       data.decode("utf-8", "replace") or f"status {r.status}")
