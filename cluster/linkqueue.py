"""A mesh link's send queue (a mixin of ``MeshLink``): entries queued in seq order, an
``Out`` each, or plain DELIVERs back to back in a ``Run`` (cluster/sendrun.py), all counted
against ``cluster.link_max_queued_bytes``; what does not fit is refused (an APPEND: its
publisher hears "not stored") or dropped and counted (a DELIVER), with a rate-limited log line
naming the key. ``MeshLink.flush`` (cluster/link.py) sends what the window lets go.

Kept apart from cluster/link.py (the connection, the window's flush, what arrives) because it
is the sending half of every crossing, and the link module had grown past ~600 lines.
"""

from __future__ import annotations

import time
from typing import Any

from cluster import frames
from cluster.sendrun import ENTRY_OVERHEAD, MAX_RUN_BYTES, Done, Out, Run

_DELIVER = frames.DELIVER


class LinkQueue:
    """Enqueue, deliver, deliver a run (a mixin of ``MeshLink``; see the module docstring)."""

    def enqueue(self, kind: int, qos: int, head: tuple[int, int], body: bytes,
                done: Done | None = None, epoch: int = 0, retry: Any = None) -> bool:
        """Queue an entry; False when the link is full (the caller decides: drop or refuse)."""
        if done is None and kind == _DELIVER:
            return self.deliver(qos, head, body, epoch)
        # (the bound holds for what is counted: the body and the entry's overhead)
        if self.queued_bytes + len(body) + ENTRY_OVERHEAD > self._max_bytes:
            return self._full(kind)
        out = Out(self.next_seq, kind, qos, head, body, done, epoch, retry)
        if done is not None:
            out.at = time.monotonic()
            self.awaiting[out.seq] = out  # its RESULT finds it without a walk of the window
        self.next_seq += 1
        self.unsent.append(out)
        self._open = None  # the next plain DELIVER starts a run after it
        self.queued_bytes += out.size
        if not self.flush_wanted:  # the mesh's flush of this tick is already scheduled
            self.mesh.want_flush(self)
        return True

    def deliver(self, qos: int, head: tuple[int, int], body: bytes, epoch: int) -> bool:
        """A plain DELIVER (no outcome to wait for): onto the open run at the queue's tail
        (cluster/sendrun.py), a new one when there is none, it has another QoS or is full.
        ``enqueue``'s path for them, called directly by ``Mesh.forward``."""
        size = len(body) + ENTRY_OVERHEAD
        if self.queued_bytes + size > self._max_bytes:
            if self._dropping and self.stats["dropped_full"] & 1023:
                self.stats["dropped_full"] += 1
                return False
            return self._full(_DELIVER)  # (and every 1024th drop: a long spell still logs)
        self._dropping = False
        run = self._open
        if (run is None or run.qos != qos or run.size >= MAX_RUN_BYTES
                or run.seq + run.count != self.next_seq):  # (never: a guard for the seqs)
            run = self._open = Run(self.next_seq, qos)
            self.unsent.append(run)
        run.items += (head, body, epoch)
        run.count += 1
        run.size += size
        self.next_seq += 1
        self.queued_bytes += size
        if not self.flush_wanted:
            self.mesh.want_flush(self)
        return True

    def deliver_run(self, qos: int, items: list, count: int, body_bytes: int) -> None:
        """``deliver`` for each of a run's ``count`` entries (``Mesh.forward_run``), in order:
        ``items`` flat, ``(flags, topic length), body, epoch`` each (``sendrun.entry_items``),
        ``body_bytes`` the bodies' total length. When all of it fits under the bound they go
        onto the open run in one step (the same seqs, run and bytes as one ``deliver`` each:
        a call and a Python step per entry were most of what a crossing cost the sending
        router); otherwise entry by entry, so as many as fit are queued, as before. While a
        spell of drops lasts and not even the run's smallest entry fits, its drops are
        counted at once, each 1024th still through ``_full`` as ``deliver`` does (a stalled
        peer cost the healthy links' router a call per dropped message: bench.cluster
        stall)."""
        size = body_bytes + ENTRY_OVERHEAD * count
        if self.queued_bytes + size > self._max_bytes:
            if self._dropping and self.queued_bytes + ENTRY_OVERHEAD + min(
                    map(len, items[1::3])) > self._max_bytes:
                stats = self.stats
                dropped = stats["dropped_full"]
                end = dropped + count
                logged = (dropped + 1023) & ~1023  # the next count whose drop goes through _full
                if logged < end:
                    stats["dropped_full"] = logged
                    self._full(_DELIVER)
                    stats["dropped_full"] += end - logged - 1
                else:
                    stats["dropped_full"] = end
                return
            self._deliver_each(qos, items, count)
            return
        if size > MAX_RUN_BYTES:  # (a frame never splits a run: each entry then, so no run
            self._deliver_each(qos, items, count)  # grows past the bound by more than one)
            return
        self._dropping = False
        run = self._open
        if (run is None or run.qos != qos or run.size + size > MAX_RUN_BYTES
                or run.seq + run.count != self.next_seq):  # (never: a guard for the seqs)
            run = self._open = Run(self.next_seq, qos)
            self.unsent.append(run)
        run.items += items
        run.count += count
        run.size += size
        self.next_seq += count
        self.queued_bytes += size
        if not self.flush_wanted:
            self.mesh.want_flush(self)

    def _deliver_each(self, qos: int, items: list, count: int) -> None:
        """``deliver_run``'s entries one ``deliver`` each (as many as fit the bound)."""
        deliver = self.deliver
        for k in range(0, 3 * count, 3):
            deliver(qos, items[k], items[k + 1], items[k + 2])

    def _full(self, kind: int) -> bool:
        """At link_max_queued_bytes: counted, logged (rate-limited), False."""
        if kind == frames.APPEND:
            self.stats["refused_full"] += 1
        else:
            self.stats["dropped_full"] += 1
            self._dropping = True
        self._full_log("link to %s holds %d bytes (cluster.link_max_queued_bytes); "
                       "%s (counted in meshmq_link_dropped_total)", self.peer,
                       self.queued_bytes, "publish refused as not stored"
                       if kind == frames.APPEND else "delivery dropped")
        return False
