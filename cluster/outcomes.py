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
ends. A restarted owner (a new incarnation) processed nothing of ours: everything is resent and
stored (once more, if the old one had stored it: at least once).

A publisher's router waits at most ``cluster.append_timeout`` for an outcome
(``MeshLink.expire_appends``): past it the publish is refused as not stored (``AppendTimeout``;
Kafka's ``delivery.timeout.ms``: an unknown outcome is an error and the client retries). If the
owner stores it later, the retry makes a duplicate, which "at least once" allows; a PUBACK for
something not stored is never sent.
"""

from __future__ import annotations

from collections import deque

from broker.forwarding import OwnerNotStored

#: APPEND outcomes an owner remembers per peer incarnation, oldest forgotten first: enough for
#: every APPEND a publisher's router may still wait on (at most cluster.append_timeout of them);
#: one forgotten is answered "outcome unknown", a failure, never a success.
OUTCOMES_KEPT = 65_536


class Outcomes:
    """The owner's memory of its recent APPEND outcomes for one peer incarnation: seq -> offset
    (stored) or (status, why) (failed); at most OUTCOMES_KEPT, oldest forgotten first. What
    answers an APPEND the peer sends again because its RESULT was lost (sans-I/O)."""

    __slots__ = ("_by_seq", "_order")

    def __init__(self) -> None:
        self._by_seq: dict[int, int | tuple[int, str]] = {}
        self._order: deque[int] = deque()

    def clear(self) -> None:
        self._by_seq.clear()
        self._order.clear()

    def add(self, seq: int, outcome: int | tuple[int, str]) -> None:
        by_seq = self._by_seq
        if seq not in by_seq:
            self._order.append(seq)
            if len(self._order) > OUTCOMES_KEPT:
                del by_seq[self._order.popleft()]
        by_seq[seq] = outcome

    def result(self, seq: int) -> tuple[int, int, int, str] | None:
        """The RESULT tuple for ``seq``, or None when it is not remembered."""
        outcome = self._by_seq.get(seq)
        if outcome is None:
            return None
        if isinstance(outcome, int):
            return (seq, 0, outcome, "")
        return (seq, outcome[0], -1, outcome[1])


class AppendTimeout(OwnerNotStored):
    """No outcome from the owner within cluster.append_timeout: not stored, as far as anyone
    may say (the client retries; a duplicate is allowed, a false PUBACK is not)."""

    def __init__(self, owner: str, waited: float) -> None:
        super().__init__(f"owner router {owner} did not confirm the write within {waited:g} s "
                         "(cluster.append_timeout): outcome unknown, not acknowledged")
        self.owner = owner
