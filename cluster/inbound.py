"""What a router processed of one peer incarnation's entries: the receive side of a mesh link.

Split out of ``cluster/link.py`` (``MeshLink.inbound``); sans-I/O. See that module's docstring
for the sequence numbers, the cumulative ACK and the resend after a reconnect this serves.
"""

from __future__ import annotations

from collections import deque

from cluster import frames


class InboundSequence:
    """What this router processed of one peer incarnation's entries (sans-I/O).

    ``fresh`` drops an entry at or below what was processed (a resend after a reconnect);
    ``ack_point`` is the cumulative ACK: every entry up to it is processed, and for an APPEND
    that means durable, so an APPEND appended but not yet fsynced holds the ACK back (``hold``
    / ``release``). After a reconnect the peer resends everything above the ACK point, which
    may include APPENDs already appended and waiting for their fsync: ``fresh`` is what keeps
    them from being stored twice.
    """

    def __init__(self) -> None:
        self.incarnation = b""
        self.received = 0
        self._held: deque[list] = deque()  # [seq, released] in seq order

    def reset(self, incarnation: bytes) -> None:
        """A new incarnation of the peer: its seqs start again from 1."""
        self.incarnation = incarnation
        self.received = 0
        self._held.clear()

    def fresh(self, seq: int) -> bool:
        if seq <= self.received:
            return False
        self.received = seq
        return True

    def fresh_of(self, entries: list[frames.Entry]) -> tuple[list[frames.Entry],
                                                            list[frames.Entry]]:
        """``fresh`` over a frame's entries, in order: (the fresh ones, the resent ones).
        One call per frame instead of one per entry; a frame of new entries in seq order (what
        a sender writes, but after a reconnect) comes back as it is, without a copy."""
        received = self.received
        for entry in entries:
            seq = entry.seq
            if seq <= received:
                break
            received = seq
        else:
            self.received = received
            return entries, []
        fresh: list[frames.Entry] = []
        resent: list[frames.Entry] = []
        for entry in entries:
            (fresh if self.fresh(entry.seq) else resent).append(entry)
        return fresh, resent

    def hold(self, seq: int) -> list:
        slot = [seq, False]
        self._held.append(slot)
        return slot

    def release(self, slot: list) -> None:
        slot[1] = True

    def ack_point(self) -> int:
        held = self._held
        while held and held[0][1]:
            held.popleft()
        return held[0][0] - 1 if held else self.received

    def resume_point(self, incarnation: bytes) -> int:
        """For the handshake: what we processed of this incarnation (0 for another one)."""
        return self.ack_point() if incarnation == self.incarnation else 0
