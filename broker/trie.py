"""Subscription trie: which sessions want a topic, without scanning every filter.

amqtt walks every subscription per message (1k filters → 1k msg/s, measured). Here a
publish walks one trie path per topic level (plus the ``+`` and ``#`` branches), and the result
for a topic is cached until the next subscription change, so steady traffic on a stable topic set
costs one dict lookup. The cache is cleared wholesale on change: subscription churn is rare next
to publishes, and per-entry invalidation would cost more than it saves (Mosquitto walks its tree
on every publish; we add the cache because a Python walk is slower than a C one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

_CACHE_LIMIT = 65_536  # distinct topics kept; beyond that the cache is dropped and rebuilt


class SharedGroup:
    """One shared subscription ``$share/{name}/{filter}``: its members and round-robin cursor.

    The spec identifies a shared subscription by share name *and* filter, so two groups with the
    same name on different filters are independent (each gets every message once).
    """

    __slots__ = ("name", "filter", "members", "cursor")

    def __init__(self, name: str, flt: str) -> None:
        self.name = name
        self.filter = flt
        self.members: dict[str, Any] = {}  # client_id -> subscription, in join order
        self.cursor = 0


class _Node:
    __slots__ = ("children", "subs", "shared")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        # client_id -> subscription value (the router's Subscription object)
        self.subs: dict[str, Any] = {}
        self.shared: dict[str, SharedGroup] = {}  # share name -> group

    def empty(self) -> bool:
        return not (self.children or self.subs or self.shared)


class Match:
    """The result of matching one topic: plain subscribers and shared groups."""

    __slots__ = ("subs", "groups")

    def __init__(self) -> None:
        # (client_id, subscription) for every matching non-shared filter; a client can appear
        # more than once when several of its filters overlap (the router merges them).
        self.subs: list[tuple[str, Any]] = []
        # every matching shared subscription; live objects, so the router's round-robin sees
        # joins and leaves without a cache flush
        self.groups: list[SharedGroup] = []


class SubscriptionTrie:
    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, Match] = {}
        self._count = 0
        # Called with (filter, group, True) when a filter (or a shared group on it) gets its first
        # subscriber and (..., False) when it loses its last: the cluster advertises exactly
        # these changes to peer routers (NATS sends RS+/RS- only on 0->1 and 1->0).
        self.on_route_change: Callable[[str, str | None, bool], None] | None = None

    def __len__(self) -> int:
        return self._count

    def add(self, flt: str, client_id: str, sub: Any, group: str | None = None) -> bool:
        """Insert or replace; returns True when the (filter, client) pair is new."""
        node = self._root
        for level in flt.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if group is None:
            table = node.subs
        else:
            shared = node.shared.get(group)
            if shared is None:
                shared = node.shared[group] = SharedGroup(group, flt)
            table = shared.members
        new = client_id not in table
        table[client_id] = sub
        if new:
            self._count += 1
            if len(table) == 1 and self.on_route_change is not None:
                self.on_route_change(flt, group, True)
        self._cache.clear()
        return new

    def remove(self, flt: str, client_id: str, group: str | None = None) -> bool:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in flt.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if group is None:
            found = node.subs.pop(client_id, None) is not None
            last = not node.subs
        else:
            shared = node.shared.get(group)
            found = shared is not None and shared.members.pop(client_id, None) is not None
            last = shared is not None and not shared.members
            if last:
                del node.shared[group]
        if not found:
            return False
        self._count -= 1
        if last and self.on_route_change is not None:
            self.on_route_change(flt, group, False)
        # Prune empty branches so a churn of unique filters doesn't leak nodes.
        for parent, level in reversed(path):
            child = parent.children[level]
            if not child.empty():
                break
            del parent.children[level]
        self._cache.clear()
        return True

    def match(self, topic: str) -> Match:
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        result = Match()
        self._walk(topic.split("/"), result, topic.startswith("$"))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[topic] = result
        return result

    def _walk(self, levels: list[str], out: Match, dollar: bool) -> None:
        """Visit the exact, ``+`` and ``#`` branches for each level of the topic.

        An explicit stack, not recursion: the depth is the number of levels in a client's topic,
        and a ~1,000-level topic (2 KB) used to raise RecursionError here mid-batch (issue 11).
        The broker refuses topics deeper than ``mqtt.max_topic_levels`` (EMQX's 128), but a walk
        that cannot overflow is what keeps one client's input from reaching another's flow.
        Order: exact branch before ``+``, as the recursive walk visited them.
        """
        n = len(levels)
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        pop = stack.pop
        push = stack.append
        while stack:
            node, i = pop()
            children = node.children
            if not dollar or i > 0:
                hash_node = children.get("#")
                if hash_node is not None:
                    # '#' also matches the parent level ("a/#" matches "a") [MQTT-4.7.1-2]
                    _collect(hash_node, out)
            if i == n:
                _collect(node, out)
                continue
            if not dollar or i > 0:
                plus = children.get("+")
                if plus is not None:
                    push((plus, i + 1))
            child = children.get(levels[i])
            if child is not None:
                push((child, i + 1))

    def group(self, flt: str, name: str) -> SharedGroup | None:
        """The shared group ``$share/{name}/{flt}``, if it has members here."""
        node = self._root
        for level in flt.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.shared.get(name)

    def routes(self) -> list[tuple[str, str | None]]:
        """Each distinct (filter, group) with at least one subscriber: a full route sync."""
        out: list[tuple[str, str | None]] = []
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            if node.subs:
                out.append(("/".join(path), None))
            out.extend(("/".join(path), group) for group in node.shared)
            for level, child in node.children.items():
                stack.append((child, [*path, level]))
        return out

    def filters(self) -> Iterator[tuple[str, str, str | None, Any]]:
        """Every (filter, client_id, group, subscription): for diagnostics and route sync."""
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            flt = "/".join(path)
            for cid, sub in node.subs.items():
                yield flt, cid, None, sub
            for group, shared in node.shared.items():
                for cid, sub in shared.members.items():
                    yield flt, cid, group, sub
            for level, child in node.children.items():
                stack.append((child, [*path, level]))


def _collect(node: _Node, out: Match) -> None:
    if node.subs:
        out.subs.extend(node.subs.items())
    if node.shared:
        out.groups.extend(node.shared.values())
