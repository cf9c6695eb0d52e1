"""Review of f34ef22 (a metadata proposal retried after 3 s without an answer), on a real
3-node Raft cluster: a session claim whose first attempt was only slow, not lost.

A CONNECT's claim is proposed; the two other metadata voters are frozen (SIGSTOP) past one
attempt (3 s), so the same claim is proposed again; then they resume and *both* attempts
commit. ``claim_session`` is no compare-and-set: the second attempt took a second epoch and
answered with this router itself as the previous holder, so the claiming router skipped the
hand-over from the router that really held the session (its queued unlogged messages, which
only the hand-over moves, were lost although their publisher had its PUBACKs); a save
retried the same way landed after a newer save. Main's answer (6f58bb8): a claim or a save
is not proposed again while its first attempt may commit (``Proposer.propose_until``,
``bounded``); review11's branch made both compare-and-sets instead, a Raft command change
left for version gating. Either way: the session is handed over, and the newest save stands.

The claim test catches the defect every run (review11: 3 of 3): one voter resumes first, so
the old leader, its log holding the first attempt, is the only one that can win the election.
The save test depends on timing besides (c's save must still be in its first attempt when
the election commits it, b's already retried): on a loaded box it may miss the defect; it
passes every run with the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

from cluster.metaclient import Proposer
from meshmq.metadata_proc import metadata_socket

pytestmark = pytest.mark.timeout(300)
PERSIST = {R.SESSION_EXPIRY_INTERVAL: 3600}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # append_timeout far past the freeze: a CONNECT refused for want of time would hide the
    # retry this test is about
    cluster = Cluster(tmp_path_factory.mktemp("r11claim"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 60.0,
                                             "session_checkpoint_interval": 0.3,
                                             "node_timeout": 15.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _meta_pid(cluster: Cluster, i: int) -> int:
    return int(cluster.status(i)["metadata"]["pid"])


def test_a_claim_retried_after_its_first_attempt_committed_still_hands_the_session_over(
        trio: Cluster, raw) -> None:
    # the claim is made at the Raft leader's node, so its metadata process holds it (appended,
    # not committed) while the two other voters are frozen, instead of answering "no leader"
    lead = trio.raft_leader()
    held_at, pub_at = (lead + 1) % 3, (lead + 2) % 3
    cid = unique("r11move")
    topic = f"u/{cid}/t"  # not logged: only the hand-over from its holder moves what it queued
    sub = raw(trio.nodes[held_at], version=5)
    sub.connect(cid, clean=False, properties=PERSIST)
    assert sub.subscribe(topic, qos=1).reason_codes == [1]
    trio.wait_routes(held_at, count=1)
    sub.disconnect()
    sub.close()
    queued = trio.nodes[held_at].metric("meshmq_queued_messages")
    pub = raw(trio.nodes[pub_at], version=5)
    pub.connect(unique("r11pub"))
    for k in range(3):
        pub.send(R.publish(topic, f"q{k}".encode(), qos=1, packet_id=k + 1, version=5))
        assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    wait_for(lambda: trio.nodes[held_at].metric("meshmq_queued_messages") >= queued + 3, 30,
             message="the holder queued the 3 unlogged messages for the offline session")

    # the claim cannot commit while the other voters are frozen. The leader appends it, then
    # steps down after 1 s alone (pysyncobj's leaderFallbackTimeout) keeping it in its log;
    # the claim is proposed again after 3 s (answered "no leader" until one is elected). One
    # voter resumes at 4.5 s: its log lacks the claim, so only the old leader can win the
    # election (Raft's up-to-date rule, the other voter still frozen), and its log, the first
    # attempt in it, commits, then the retry: both attempts commit, every run
    later, first = _meta_pid(trio, held_at), _meta_pid(trio, pub_at)
    node = trio.nodes[lead]
    for pid in (later, first):
        os.kill(pid, signal.SIGSTOP)

    def resume(*pids: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    timer = threading.Timer(4.5, resume, (first,))
    timer.start()
    try:
        back = raw(node, version=5, timeout=60)
        ack = back.connect(cid, clean=False, properties=PERSIST)
    finally:
        timer.cancel()
        resume(first, later)
    assert ack.session_present, ack
    got = []
    for _ in range(3):
        pkt = back.expect(R.PUBLISH, timeout=30)
        back.ack(pkt)
        got.append(pkt.payload)
    assert got == [b"q0", b"q1", b"q2"], (
        f"the session must be handed over by its holder (its queued messages with it), got "
        f"{got!r}; handed over {node.metric('meshmq_session_handed_over_total')}, resumed "
        f"from the registry {node.metric('meshmq_session_resumed_from_registry_total')}")
    assert node.metric("meshmq_session_handed_over_total") == 1


def _saved_subscriptions(node_workdir: str, cid: str) -> list[str]:
    """The topic filters in the session state the registry holds for ``cid``, read as a claim
    would read it (a claim by a router id no node runs, through the node's metadata socket:
    the registry answers a claim with the saved state)."""
    async def ask() -> Any:
        proposer = Proposer(metadata_socket(os.path.join(node_workdir, "data")), {"retries": 0})
        try:  # retried while Raft elects (the voters were frozen just before)
            return await proposer.propose_until(["claim_session", cid, "nobody/0", False],
                                                time.monotonic() + 60)
        finally:
            proposer.close_now()
    answer = asyncio.run(ask())
    assert not isinstance(answer, str), answer
    _applied, rec = answer
    state = json.loads(rec["state"])
    return sorted(s[0] for s in state["subs"])


def test_a_save_retried_after_a_newer_one_committed_does_not_put_the_old_state_back(
        trio: Cluster, raw) -> None:
    """SUBSCRIBE b, then c, while the claim's saves cannot commit: the save of b is proposed
    again after 3 s, and without an order between saves it committed after the save of c,
    putting the registry back to a session without c (whose SUBACK was sent): a resume at any
    other router lost c."""
    lead = trio.raft_leader()
    others = [(lead + 1) % 3, (lead + 2) % 3]
    node = trio.nodes[lead]
    cid = unique("r11save")
    sub = raw(node, version=5, timeout=60)
    sub.connect(cid, clean=False, properties=PERSIST)
    assert sub.subscribe(f"u/{cid}/a", qos=1).reason_codes == [1]
    first, later = (_meta_pid(trio, i) for i in others)
    for pid in (first, later):
        os.kill(pid, signal.SIGSTOP)
    try:
        # b's save is appended at 0 s and c's at 0.7 s, both by the leader, which steps down
        # at ~1 s alone; b's attempt times out at 3 s (proposed again, "no leader" until one
        # is elected), c's would at 3.7 s. One voter resumes at 3.05 s: the old leader alone
        # can win (its log is the longer), its log (b, c) commits, answering c, and b's retry
        # comes after: b, c, b-again
        started = time.monotonic()
        sub.send(R.subscribe(2, [(f"u/{cid}/b", 1)], version=5))
        time.sleep(0.7)
        sub.send(R.subscribe(3, [(f"u/{cid}/c", 1)], version=5))
        time.sleep(max(0.0, started + 3.05 - time.monotonic()))
        os.kill(first, signal.SIGCONT)
        acks = sorted(sub.expect(R.SUBACK, timeout=60).packet_id for _ in range(2))
    finally:
        for pid in (first, later):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert acks == [2, 3], acks
    time.sleep(1.0)  # any retry still in flight commits (it would, on the leader)
    saved = _saved_subscriptions(str(node.workdir), cid)
    assert saved == [f"u/{cid}/a", f"u/{cid}/b", f"u/{cid}/c"], (
        f"the registry must hold the newest saved session (every SUBACK sent), got {saved!r}")
