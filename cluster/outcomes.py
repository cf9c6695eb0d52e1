"""What happened to the APPENDs a link carries: the owner's memory of their outcomes, and the
publisher side's time limit (issue 28: "an APPEND's outcome reaches the publisher's router
exactly once, whatever the link does; an unknown outcome is never a success").

The link's ACK says only "processed": a failed APPEND is processed too, so an ACK never
completes an APPEND (it did once, and a disk-full owner whose RESULTs were lost on a one-way
cut had its failed writes acknowledged as stored). The owner remembers the outcome of its recent
APPENDs per peer incarnation (``Outcomes``). An APPEND whose RESULT died with a connection (the
ACK, or the handshake's resume point, covers it while its publisher still waits) is sent again;
the owner, which drops it as already processed (``InboundSequence.fresh``), answers with the
outcome it remembers: the RESULT again, never a second append. One it no longer remembers is
answered "outcome unknown", a failure; one still waiting for its fsync is answered when that
ends. A restarted owner (a new incarnation) processed nothing of ours: everything is resent, and it
looks for each in its log before storing it (cluster/idempotence.py: stored once).

A publisher's router waits at most ``cluster.append_timeout`` for an outcome
(``MeshLink.expire_appends``): past it the publish is refused as not stored (``AppendTimeout``;
Kafka's ``delivery.timeout.ms``: an unknown outcome is an error and the client retries). One that
was never sent (the link down all along) is dropped from the queue, so it is never stored later;
one that was sent may still be stored by the owner, and the client's retry then makes a
duplicate, which "at least once" allows. A PUBACK for something not stored is never sent.
"""

from __future__ import annotations

from array import array
from collections import deque

from broker.forwarding import OwnerNotStored

#: APPEND outcomes an owner remembers per peer incarnation (a ring indexed by seq: a newer seq
#: takes an older one's slot). Enough for what a publisher's router may still wait on, at most
#: cluster.append_timeout of its APPENDs: 131,072 covers 26 k APPENDs/s per link over 5 s. One
#: forgotten is answered "outcome unknown", a failure, never a success. 16 bytes a slot, 2 MiB
#: per link, allocated on the link's first APPEND (most links carry none: fixed, where a dict of
#: the same reach cost about 100 bytes an entry).
OUTCOMES_KEPT = 1 << 17
_MASK = OUTCOMES_KEPT - 1
#: Failure reasons kept (failures are rare; one forgotten is answered with a generic reason).
_REASONS_KEPT = 4096


class Outcomes:
    """The owner's memory of its recent APPEND outcomes for one peer incarnation: per seq the
    offset it was stored at, or its failure (status and reason). What answers an APPEND the
    peer sends again because its RESULT was lost (sans-I/O)."""

    __slots__ = ("_seqs", "_offsets", "_why", "_why_order")

    def __init__(self) -> None:
        self._seqs: array[int] | None = None  # slot -> seq it holds (seqs start at 1)
        self._offsets: array[int] | None = None  # slot -> offset, or -status when failed
        self._why: dict[int, str] = {}
        self._why_order: deque[int] = deque()

    def clear(self) -> None:
        self._seqs = self._offsets = None
        self._why.clear()
        self._why_order.clear()

    def _slot(self, seq: int) -> int:
        if self._seqs is None:
            self._seqs = array("q", bytes(8 * OUTCOMES_KEPT))
            self._offsets = array("q", bytes(8 * OUTCOMES_KEPT))
        i = seq & _MASK
        self._seqs[i] = seq
        return i

    def stored(self, seq: int, offset: int) -> None:
        i = self._slot(seq)  # first: it allocates the arrays
        self._offsets[i] = offset  # type: ignore[index]

    def failed(self, seq: int, status: int, why: str) -> None:
        i = self._slot(seq)
        self._offsets[i] = -status  # type: ignore[index]
        self._why[seq] = why
        self._why_order.append(seq)
        if len(self._why_order) > _REASONS_KEPT:
            self._why.pop(self._why_order.popleft(), None)

    def result(self, seq: int) -> tuple[int, int, int, str] | None:
        """The RESULT tuple for ``seq``, or None when it is not remembered."""
        seqs = self._seqs
        if seqs is None or seqs[seq & _MASK] != seq:
            return None
        offset = self._offsets[seq & _MASK]  # type: ignore[index]
        if offset >= 0:
            return (seq, 0, offset, "")
        return (seq, -offset, -1, self._why.get(seq, "the owner could not store it"))


class AppendTimeout(OwnerNotStored):
    """No outcome from the owner within cluster.append_timeout: not stored, as far as anyone
    may say (the client retries; a duplicate is allowed, a false PUBACK is not)."""

    def __init__(self, owner: str, waited: float, sent: bool = True) -> None:
        if sent:
            text = (f"owner router {owner} did not confirm the write within {waited:g} s "
                    "(cluster.append_timeout): outcome unknown, not acknowledged")
        else:
            text = (f"the write never reached owner router {owner} within {waited:g} s "
                    "(cluster.append_timeout; its link down or backlogged): not stored")
        super().__init__(text)
        self.owner = owner
