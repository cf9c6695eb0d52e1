"""What a mesh link's send queue holds: ``Out``, one entry, and ``Run``, plain DELIVERs
queued back to back on the link, kept as one queue item (``MeshLink.unsent``/``inflight``).

Why (issue 25, "cheap crossings"): a DELIVER without an outcome to wait for (a publish routed
to a peer's subscribers, QoS 0 almost always) was one ``Out`` object per entry, appended to
the link's queue, moved to the window and popped again when the peer's ACK came, and one
Python step of the flush's loop per entry: about a quarter of what a crossing cost the sending
router. A run holds the entries that went onto the link's queue one after another with
consecutive seqs (at most ``MAX_RUN_BYTES`` of them): enqueueing an entry is three list items,
the flush encodes the whole run in one C call (``cluster/_speedups.c`` ``encode_run``, Python
below as the reference) and an ACK frees it in one step. Kafka's producer keeps its
accumulator per batch, not per record, for the same reason.

What stays per entry: the seqs (the peer dedupes and acknowledges by seq, cluster/inbound.py),
``link_window`` (a run larger than the window's room is split, ``take``), the bytes counted
against ``link_max_queued_bytes``, and the resend after a reconnect (a QoS 0 run is dropped,
as each of its entries was; any other is sent again whole, and the peer drops the seqs it
already processed). A run is acknowledged as a whole: until the peer's ACK covers its last
seq, all of it still counts in the window and in the queue's bytes (never more than the
window or the bound allows; the ACK a frame later frees the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster import frames

Done = Callable[[BaseException | None, int], None]  # APPEND outcome: (error or None, offset)

# A run stops growing past this many bytes: a flush writes at most about 1 MiB of entries per
# ENTRIES frame (cluster/link.py), and a frame never splits a run.
MAX_RUN_BYTES = 1 << 20
ENTRY_OVERHEAD = 64  # bytes counted per queued entry besides its body (as Out.size counts)


class Out:
    """An entry waiting to be sent or acknowledged (a plain DELIVER waits in a ``Run``)."""

    __slots__ = ("seq", "kind", "qos", "head", "body", "done", "size", "at", "epoch", "retry")
    count = 1  # entries: the queue holds Outs and Runs alike

    def __init__(self, seq: int, kind: int, qos: int, head: tuple[int, int], body: bytes,
                 done: Done | None, epoch: int = 0, retry: Any = None) -> None:
        self.seq = seq
        self.kind = kind
        self.qos = qos
        self.head = head  # (flags, topic length)
        self.body = body
        self.done = done
        self.size = len(body) + 64
        self.at = 0.0  # APPEND: time.monotonic() when queued, for cluster.append_timeout
        # APPEND: the leader epoch the sender believed when it queued it (placement); DELIVER:
        # the one it routed the record at. Written in the entry head on a version-3 connection
        # (APPEND) or version-4 one (every entry), left out on a version-2 one (decided per
        # connection at flush, so a queued entry goes right after a reconnect to either)
        self.epoch = epoch
        # APPEND: (device, message, expiry), to send it to the log's next leader instead
        # when the leadership moves while it waits (cluster/appendmove.py)
        self.retry = retry


class Run:
    """Consecutive plain DELIVERs of one QoS: ``items`` is flat, ``(flags, topic length),
    body, epoch`` per entry, in seq order from ``seq``."""

    __slots__ = ("seq", "qos", "count", "items", "size")
    # read by the link's queue code, which handles Out and Run alike
    kind = frames.DELIVER
    done = None  # no outcome to give
    retry = None

    def __init__(self, seq: int, qos: int) -> None:
        self.seq = seq  # the first entry's
        self.qos = qos
        self.count = 0
        self.items: list = []
        self.size = 0  # bytes counted against cluster.link_max_queued_bytes

    def take(self, n: int) -> Run:
        """The first ``n`` entries, as a run of their own (all the window lets go now); this
        run keeps the rest, from the seq after them."""
        first = Run(self.seq, self.qos)
        cut = 3 * n
        first.items = self.items[:cut]
        first.count = n
        first.size = sum(map(len, first.items[1::3])) + ENTRY_OVERHEAD * n
        del self.items[:cut]
        self.seq += n
        self.count -= n
        self.size -= first.size
        return first

    def encode(self, version: int) -> bytes:
        """The run's entries (heads and bodies) as an ENTRIES frame holds them, for a link of
        mesh protocol ``version`` (from 4 every head carries the entry's epoch)."""
        with_epoch = version >= frames.V_DELIVER_EPOCHS
        compiled = frames.c_encode_run
        if compiled is not None:
            return compiled(self.seq, frames.DELIVER, self.items, with_epoch)
        return encode_run(self.seq, frames.DELIVER, self.items, with_epoch)


def encode_run(seq: int, kind: int, items: list, with_epoch: bool) -> bytes:
    """The reference of ``_speedups.encode_run``: each entry's head (its seq, ``kind``, flags,
    topic length, and with ``with_epoch`` its epoch) then its body, back to back."""
    parts: list[bytes] = []
    for i in range(0, len(items), 3):
        flags, tlen = items[i]
        if with_epoch:
            parts.append(frames.entry_head_epoch(seq, kind, flags, tlen, items[i + 2]))
        else:
            parts.append(frames.entry_head(seq, kind, flags, tlen))
        parts.append(items[i + 1])
        seq += 1
    return b"".join(parts)


def entry_items(topic: str, payloads: list, qos: int, origin: str | None, epoch: int
                ) -> tuple[list, int] | None:
    """The reference of ``_speedups.entry_items``: a publisher's run of plain payloads on one
    topic (no retain, properties, device, expiry or group) as a ``Run``'s flat items
    (``(flags, topic length), body, epoch`` each) and the bodies' total length; None when a
    payload is not bytes (the caller forwards message by message, as ``forward`` would)."""
    items: list = []
    total = 0
    for payload in payloads:
        if type(payload) is not bytes:
            return None
        flags, tlen, body = frames.entry_body(frames.DELIVER, topic, payload, qos, False,
                                              None, origin, None, 0, None)
        items += ((flags, tlen), body, epoch)
        total += len(body)
    return items, total


def plain_run_end(msgs: list, i: int) -> int:
    """The reference of ``_speedups.plain_run_end``: with ``msgs[i]`` a QoS 0 message not
    retained, the index after the last message from ``i`` on that is one too, with its topic
    and origin (``i + 1`` when ``msgs[i]`` is not): a run the receiving router routes as one
    (``Mesh.on_deliveries``)."""
    msg = msgs[i]
    j = i + 1
    if msg.qos or msg.retain:
        return j
    topic, origin = msg.topic, msg.origin
    n = len(msgs)
    while j < n:
        m = msgs[j]
        if m.qos or m.retain or m.topic != topic or m.origin != origin:
            break
        j += 1
    return j
