"""Who owns a device log: rendezvous (highest-random-weight) hashing over the configured routers.

Static for now: every router computes the same owner from the same config with no coordination,
and adding or removing a router moves only the logs whose highest weight changes (about 1/N of
them), unlike ``hash % N``, which moves nearly all (Thaler and Ravishankar's HRW, used for the
same reason by Kafka's sticky assignors and by Ceph's CRUSH "straw" buckets). The next issue
replaces ``owner_of`` with the leader Raft holds for the log; callers use only this one function.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache


class Ownership:
    """The owner lookup for one cluster layout."""

    def __init__(self, routers: list[str]) -> None:
        if not routers:
            raise ValueError("no routers configured")
        self.routers = list(routers)
        self._seeds = [r.encode() + b"\0" for r in self.routers]
        self.owner_of = lru_cache(maxsize=65_536)(self._owner_of)

    def _owner_of(self, device: str) -> str:
        key = device.encode()
        best = -1
        owner = self.routers[0]
        for rid, seed in zip(self.routers, self._seeds, strict=True):
            # blake2b is in hashlib (C); router id, NUL, device: 8 bytes of weight is plenty.
            weight = int.from_bytes(hashlib.blake2b(seed + key, digest_size=8).digest(), "big")
            if weight > best:
                best, owner = weight, rid
        return owner
