"""Which peer routers want a topic: the filters each peer's sessions subscribe to.

Peers tell us their filters (cluster/frames.py ROUTES: a full set on every connect, deltas
after), aggregated on their side: one entry per distinct filter however many sessions hold it
(NATS's refcounted ``RS+``/``RS-``). They are kept in the same ``SubscriptionTrie`` the router
matches local subscriptions with, the peer's router id standing where a client id stands, so a
topic's peers come out of one walk, cached until the next route change, exactly like local ones.
"""

from __future__ import annotations

from broker.trie import SharedGroup, SubscriptionTrie

Route = tuple[str, str | None]  # (filter, shared-subscription group or None)
CACHE_MAX = 65_536  # topics a per-topic cache holds before it starts again (distinct topics)


class RouteTable:
    def __init__(self) -> None:
        self.trie = SubscriptionTrie()
        self._by_peer: dict[str, set[Route]] = {}
        self._peers_cache: dict[str, tuple[str, ...]] = {}
        self._caches: list[dict] = [self._peers_cache]  # emptied at every route change
        self._groups = 0
        # whether any peer has shared-subscription members: a plain attribute, read for every
        # routed message (skips the groups' walk); a property was one more call per message
        self.has_groups = False

    def __len__(self) -> int:
        return len(self.trie)

    def count(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def replace(self, peer: str, routes: list[Route]) -> None:
        """A full sync: the peer's set is exactly ``routes`` now."""
        self.drop_peer(peer)
        for flt, group in routes:
            self.add(peer, flt, group)

    def add(self, peer: str, flt: str, group: str | None) -> None:
        held = self._by_peer.setdefault(peer, set())
        if (flt, group) in held:
            return
        held.add((flt, group))
        self._groups += group is not None
        self.has_groups = self._groups > 0
        self.trie.add(flt, peer, True, group)
        self._changed()

    def remove(self, peer: str, flt: str, group: str | None) -> None:
        held = self._by_peer.get(peer)
        if held is None or (flt, group) not in held:
            return
        held.discard((flt, group))
        self._groups -= group is not None
        self.has_groups = self._groups > 0
        self.trie.remove(flt, peer, group)
        self._changed()

    def drop_peer(self, peer: str) -> None:
        for flt, group in self._by_peer.pop(peer, ()):
            self._groups -= group is not None
            self.trie.remove(flt, peer, group)
        self.has_groups = self._groups > 0
        self._changed()

    def cache(self) -> dict:
        """A per-topic cache of the caller's, emptied with this table's own at every route
        change, so what the caller derives from ``peers_for`` (the mesh: the links a topic goes
        to) is never stale. Bounded by its filler (``CACHE_MAX`` entries, as ``peers_for``), which
        asks ``match_peers``: the topic is then cached once, in the caller's form."""
        cache: dict = {}
        self._caches.append(cache)
        return cache

    def _changed(self) -> None:
        for cache in self._caches:
            cache.clear()

    def peers_for(self, topic: str) -> tuple[str, ...]:
        """Each peer with a plain (non-shared) matching filter, once however many match."""
        cached = self._peers_cache.get(topic)
        if cached is not None:
            return cached
        peers = self.match_peers(topic)
        if len(self._peers_cache) >= CACHE_MAX:
            self._peers_cache.clear()
        self._peers_cache[topic] = peers
        return peers

    def match_peers(self, topic: str) -> tuple[str, ...]:
        """``peers_for`` without its cache: for a caller that caches what it derives from the
        answer itself (``cache``), so a topic is not kept twice."""
        subs = self.trie.match(topic).subs
        return tuple(dict.fromkeys(peer for peer, _ in subs)) if subs else ()

    def groups_for(self, topic: str) -> list[SharedGroup]:
        """Shared groups with members on peers (``members``: peer id -> True)."""
        return self.trie.match(topic).groups
