"""Retained messages: a topic tree walked by a subscription filter.

This is the mirror of the subscription trie: the tree holds concrete topics and a new subscription's
filter (with wildcards) walks it, so a subscribe to ``sensors/+/temp`` visits only matching branches
instead of scanning every retained topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Any = None


def _size(message: Any) -> int:
    """Payload bytes of a stored message (the store holds any object; tests use strings)."""
    payload = getattr(message, "payload", None)
    return len(payload) if payload is not None else 0


class RetainedStore:
    def __init__(self, expired: Callable[[Any, float], bool] | None = None) -> None:
        self._root = _Node()
        self._count = 0
        self._bytes = 0  # payload bytes held (meshmq_retained_bytes)
        # Message expiry (v5) is checked lazily on read: a retained message past its expiry
        # interval is dropped the first time a subscriber would have received it.
        self._expired = expired or (lambda _msg, _now: False)

    def __len__(self) -> int:
        return self._count

    def payload_bytes(self) -> int:
        return self._bytes

    def set(self, topic: str, message: Any) -> None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.message is None:
            self._count += 1
        else:
            self._bytes -= _size(node.message)
        self._bytes += _size(message)
        node.message = message

    def delete(self, topic: str) -> None:
        """[MQTT-3.3.1-6]: a retained PUBLISH with an empty payload removes the retained message."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return
            path.append((node, level))
            node = child
        if node.message is None:
            return
        self._bytes -= _size(node.message)
        node.message = None
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.children or child.message is not None:
                break
            del parent.children[level]

    def items(self) -> list[tuple[str, Any]]:
        """Every retained (topic, message), ``$`` topics included: what a snapshot of the
        retained state log rewrites (broker/retainstore.py)."""
        out: list[tuple[str, Any]] = []
        self._collect_all(self._root, None, out, top=False)
        return out

    def match(self, flt: str) -> list[Any]:
        now = time.monotonic()
        found = self._walk(flt.split("/"))
        out = []
        for topic, msg in found:
            if self._expired(msg, now):
                self.delete(topic)
            else:
                out.append(msg)
        return out

    def _walk(self, levels: list[str]) -> list[tuple[str, Any]]:
        """Every retained (topic, message) the filter ``levels`` matches.

        Iterative with an explicit stack: a retained message on a ~1,000-level topic made the
        recursive walk raise RecursionError for every later ``#`` subscriber, whose SUBSCRIBE
        then got no SUBACK (issue 11). The path is kept as a parent-linked chain and joined only
        for a hit, so a deep branch costs O(depth), not O(depth²) list copies.
        """
        out: list[tuple[str, Any]] = []
        n = len(levels)
        # (node, level index in the filter, path chain); a chain is (name, parent chain) | None
        stack: list[tuple[_Node, int, Any]] = [(self._root, 0, None)]
        while stack:
            node, i, path = stack.pop()
            if i == n:
                if node.message is not None:
                    out.append((_join(path), node.message))
                continue
            level = levels[i]
            if level == "#":
                # '#' matches the parent level too ("a/#" gets "a") [MQTT-4.7.1-2]
                if node.message is not None and i > 0:
                    out.append((_join(path), node.message))
                self._collect_all(node, path, out, top=i == 0)
                continue
            if level == "+":
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):
                        continue  # [MQTT-4.7.2-1]
                    stack.append((child, i + 1, (name, path)))
                continue
            child = node.children.get(level)
            if child is not None:
                stack.append((child, i + 1, (level, path)))
        return out

    @staticmethod
    def _collect_all(node: _Node, path: Any, out: list[tuple[str, Any]], top: bool) -> None:
        """Everything below ``node`` (a ``#`` filter); iterative for the same reason as _walk."""
        stack: list[tuple[_Node, Any, bool]] = [(node, path, top)]
        while stack:
            parent, chain, first = stack.pop()
            for name, child in parent.children.items():
                if first and name.startswith("$"):
                    continue
                sub_path = (name, chain)
                if child.message is not None:
                    out.append((_join(sub_path), child.message))
                if child.children:
                    stack.append((child, sub_path, False))


def _join(chain: Any) -> str:
    """The topic of a parent-linked path chain ``(name, (parent, (...)))``."""
    names: list[str] = []
    while chain is not None:
        names.append(chain[0])
        chain = chain[1]
    names.reverse()
    return "/".join(names)
