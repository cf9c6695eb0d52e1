"""Leader epochs of a device log: the epoch-start control record and the epoch table.

Why: a replicated log needs to know where a returning old leader's log *diverged* from
the new leader's, and a locally cached high-water mark is not that point. Kafka learned
it the hard way (KIP-101, KAFKA-1211: truncating to the HW lost acknowledged data and
let replicas diverge; KIP-279 fixed the back-to-back failover case). The fix, kept here:
every leader change writes an *epoch-start* record into the log (epoch E begins at offset
S), each replica keeps the table ``[(epoch, start offset)]``, and "end offset of epoch E"
on the leader (the start of the first later epoch, or the log end) is where a follower
whose last epoch is E must truncate to.

Format: an epoch-start record is a control record (``flags = FLAG_CONTROL |
FLAG_EPOCH``) in the ordinary record framing: ``offset`` = first offset of the epoch (the
log end when it was written), ``timestamp_us`` = when, no topic, no headers, and the
payload is the epoch as an 8-byte little-endian signed integer. Every reader that skips
control records (fetch decoding, position index, device reads) skips it unchanged;
recovery replays it into the table. Epoch records are *in-band*, so a follower fed the
leader's replica stream writes the very same bytes and ends with the same table.

Table rules (Kafka's ``LeaderEpochFileCache.assign`` / ``truncateFromEnd``): epochs only
grow; a new epoch starting at or before the start of the latest one supersedes the
entries at or after its start (they are empty epochs); truncating the log to ``offset``
drops entries starting at or after ``offset``. Entries are ``(epoch, start, ts, pos)``,
``pos`` being the store position of the record (so a rolled-back write can drop them and
a checkpoint holds only durable ones).
"""

from __future__ import annotations

import bisect
import struct

FLAG_EPOCH = 0x02
EPOCH_PAYLOAD = struct.Struct("<q")
UNDEFINED = -1

EpochEntry = tuple[int, int, int, int]  # epoch, start offset, timestamp_us, store position


class StaleEpochError(ValueError):
    """An epoch older than the log's latest one (a fenced leader's write or stream)."""


def epoch_payload(epoch: int) -> bytes:
    """The payload of an epoch-start record."""
    return EPOCH_PAYLOAD.pack(epoch)


def parse_epoch_payload(payload: bytes | memoryview) -> int:
    """Epoch number of an epoch-start record's payload (ValueError if malformed)."""
    if len(payload) != EPOCH_PAYLOAD.size:
        raise ValueError(f"epoch record payload of {len(payload)} bytes, expected 8")
    epoch = EPOCH_PAYLOAD.unpack(payload)[0]
    if epoch < 0:
        raise ValueError(f"negative epoch {epoch}")
    return epoch


def latest_epoch(table: list[EpochEntry] | None) -> int:
    """The latest epoch of a table, or UNDEFINED (-1) for a log that never had one."""
    return table[-1][0] if table else UNDEFINED


def check_new_epoch(table: list[EpochEntry] | None, epoch: int, start: int) -> bool:
    """Validate epoch ``epoch`` starting at ``start``; False when it is already the latest
    entry with the same start (a repeated record: nothing to do). Raises StaleEpochError
    for an older epoch, ValueError for the same epoch restarting elsewhere."""
    if epoch < 0:
        raise ValueError(f"negative epoch {epoch}")
    if not table:
        return True
    last, last_start = table[-1][0], table[-1][1]
    if epoch < last:
        raise StaleEpochError(f"epoch {epoch} is older than the log's latest epoch {last}")
    if epoch == last:
        if start == last_start:
            return False
        raise ValueError(f"epoch {epoch} already started at offset {last_start}, not {start}")
    return True


def assign(table: list[EpochEntry], entry: EpochEntry) -> None:
    """Add a (validated) entry; entries starting at or after its start are superseded."""
    start = entry[1]
    while table and table[-1][1] >= start:
        table.pop()
    table.append(entry)


def truncate_from(table: list[EpochEntry] | None, offset: int) -> None:
    """The log now ends at ``offset``: drop epochs that started at or after it."""
    while table and table[-1][1] >= offset:
        table.pop()


def from_start(table: list[EpochEntry] | None, log_start: int) -> list[EpochEntry]:
    """The table as seen from a log that starts at ``log_start`` (Kafka's
    ``LeaderEpochFileCache.truncateFromStart``, as a view): epochs that ended before the
    start are gone, and the one the start falls in starts there. A follower that restarted
    its log at the leader's start (``LogStore.reset_start``) holds exactly this, so the
    leader's and the follower's lookups agree on every offset they both hold."""
    if not table:
        return []
    i = bisect.bisect_right([e[1] for e in table], log_start) - 1
    if i < 0:
        return list(table)
    out = list(table[i:])
    e = out[0]
    if e[1] < log_start:
        out[0] = (e[0], log_start, e[2], e[3])
    return out


def end_offset_for(table: list[EpochEntry] | None, epoch: int, log_end: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch on one log: ``(E', end)`` where E' is the largest
    epoch <= ``epoch`` in the table and ``end`` the start offset of the next epoch after
    it, or ``log_end`` if E' is the latest. ``(UNDEFINED, UNDEFINED)`` when the table has no
    epoch <= ``epoch`` (the caller then falls back to its high-water mark)."""
    if not table:
        return (UNDEFINED, UNDEFINED)
    i = bisect.bisect_right([e[0] for e in table], epoch) - 1
    if i < 0:
        return (UNDEFINED, UNDEFINED)
    end = table[i + 1][1] if i + 1 < len(table) else log_end
    return (table[i][0], end)


def encode_epoch_record(key_bytes: bytes, epoch: int, start: int, timestamp_us: int) -> bytes:
    """The bytes of an epoch-start record (as the store writes it and replicas receive it)."""
    from commitlog.record import FLAG_CONTROL, HEADER_SIZE, encode_into

    buf = bytearray(HEADER_SIZE + len(key_bytes) + EPOCH_PAYLOAD.size)
    encode_into(buf, 0, start, timestamp_us, key_bytes, "", 0, (), epoch_payload(epoch),
                FLAG_CONTROL | FLAG_EPOCH)
    return bytes(buf)
