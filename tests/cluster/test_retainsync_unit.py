"""cluster/retainsync.py without processes: the link ACK held until a peer's retained change
is stored, and which RETAIN_SYNC offers are taken. The real-node tests are in
test_retained_from_peers.py; these pin the bookkeeping a restart test cannot see."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from broker.forwarding import RemotePublishes
from broker.message import Message
from broker.retained import RetainedStore
from cluster import frames
from cluster.link import InboundSequence
from cluster.retainsync import RetainSync


class _Link:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.inbound = InboundSequence()
        self.sent: list[tuple[int, bytes]] = []

    def enqueue(self, kind: int, qos: int, head: tuple[int, int], body: bytes) -> bool:
        self.sent.append((kind, body))
        return True


def _mesh(remote: Any = None) -> tuple[RetainSync, _Link, Any]:
    router = SimpleNamespace(retained=RetainedStore(), logs=None)
    router.remote = remote if remote is not None else RemotePublishes(router)
    link = _Link("n1/0")

    def encode(msg: Message, kind: int) -> tuple[tuple[int, int], bytes]:
        flags, tlen, body = frames.entry_body(kind, msg.topic, msg.payload, msg.qos, msg.retain,
                                              None, None, None, -1, None)
        return (flags, tlen), body

    mesh = SimpleNamespace(links={link.peer: link}, router=router, want_flush=lambda lk: None,
                           encode=encode)
    return RetainSync(mesh), link, router


def _msg(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, 1, True, None, None, None)


def test_the_link_ack_waits_until_the_change_is_stored() -> None:
    pending: list[Any] = []
    remote = SimpleNamespace(retain_from_peer=lambda msg, stored: pending.append(stored))
    sync, link, _ = _mesh(remote)
    assert link.inbound.fresh(1)
    sync.on_retain(link, _msg("a/b", b"on"), 1)
    assert link.inbound.ack_point() == 0, "acknowledged before the state record is durable"
    pending[0]()
    assert link.inbound.ack_point() == 1


def test_a_change_that_fails_to_apply_does_not_pin_the_ack() -> None:
    def boom(msg: Message, stored: Any) -> None:
        raise ValueError("bad entry")

    sync, link, _ = _mesh(SimpleNamespace(retain_from_peer=boom))
    assert link.inbound.fresh(1)
    with pytest.raises(ValueError):
        sync.on_retain(link, _msg("a/b", b"on"), 1)
    assert link.inbound.ack_point() == 1


def test_a_resync_offer_is_refused_only_for_a_clear_made_while_apart() -> None:
    sync, link, router = _mesh()
    remote = router.remote
    remote.keep_retained(_msg("before/down", b""))  # cleared while the link was up
    time.sleep(0.001)
    sync.link_down(link)
    remote.keep_retained(_msg("while/down", b""))  # cleared while apart
    remote.keep_retained(_msg("set/again", b""))
    remote.keep_retained(_msg("set/again", b"newer"))  # ... then set again here
    for topic in ("before/down", "while/down", "set/again"):
        assert link.inbound.fresh(link.inbound.received + 1)
        sync.on_sync(link, _msg(topic, b"old"), link.inbound.received)

    assert [m.payload for m in router.retained.match("before/down")] == [b"old"]
    assert router.retained.match("while/down") == []
    assert [m.payload for m in router.retained.match("set/again")] == [b"newer"]
    assert sync.refused_syncs == 1
    # the clear goes back to the peer that offered the stale message
    assert [(kind, body[:len("while/down")]) for kind, body in link.sent] == \
        [(frames.RETAIN, b"while/down")]
    assert link.inbound.ack_point() == link.inbound.received  # nothing left held


def test_clears_older_than_every_link_s_last_down_are_forgotten() -> None:
    sync, link, router = _mesh()
    router.remote.keep_retained(_msg("old/clear", b""))
    time.sleep(0.001)
    sync.link_down(link)
    assert "old/clear" not in router.remote.clears
