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

    def match(self, flt: str) -> list[Any]:
        now = time.monotonic()
        found: list[tuple[str, Any]] = []
        self._walk(self._root, flt.split("/"), 0, [], found)
        out = []
        for topic, msg in found:
            if self._expired(msg, now):
                self.delete(topic)
            else:
                out.append(msg)
        return out

    def _walk(
        self, node: _Node, levels: list[str], i: int, path: list[str], out: list[tuple[str, Any]]
    ) -> None:
        if i == len(levels):
            if node.message is not None:
                out.append(("/".join(path), node.message))
            return
        level = levels[i]
        if level == "#":
            # '#' matches the parent level too ("a/#" gets "a") [MQTT-4.7.1-2]
            if node.message is not None and i > 0:
                out.append(("/".join(path), node.message))
            self._collect_all(node, path, out, top=i == 0)
            return
        if level == "+":
            for name, child in node.children.items():
                if i == 0 and name.startswith("$"):
                    continue  # [MQTT-4.7.2-1]
                self._walk(child, levels, i + 1, [*path, name], out)
            return
        child = node.children.get(level)
        if child is not None:
            self._walk(child, levels, i + 1, [*path, level], out)

    def _collect_all(
        self, node: _Node, path: list[str], out: list[tuple[str, Any]], top: bool
    ) -> None:
        for name, child in node.children.items():
            if top and name.startswith("$"):
                continue
            sub_path = [*path, name]
            if child.message is not None:
                out.append(("/".join(sub_path), child.message))
            self._collect_all(child, sub_path, out, top=False)
